import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { configReference, undocumentedKeys } from '../../pipeline/config-reference.ts';
import { refreshConfig } from '../../loop/settings.ts';
import { STAGES } from '../../stages/index.ts';
import { prefab } from '../fixtures/cli.ts';

const DOC = join(import.meta.dirname, '..', '..', 'docs', 'config.md');

describe('the config reference', () => {
  it('docs/config.md is what the schemas say now (run `npm run docs:config` after changing a schema)', () => {
    const printed = prefab(['config-reference']);
    expect(printed.code, printed.stderr).toBe(0);
    expect(readFileSync(DOC, 'utf8')).toBe(printed.stdout);
    // The stages' sections, then the commands' own (refresh).
    expect(printed.stdout.startsWith(configReference(STAGES).trimEnd())).toBe(true);
    expect(printed.stdout).toContain('## refresh\n');
  });

  it('lists every stage and its keys with type, default and meaning', () => {
    const doc = configReference(STAGES);
    for (const stage of STAGES) expect(doc).toContain(`## ${stage.name}\n`);
    expect(doc).toContain(
      '| `split.test_ratio` | number ≥ 0, ≤ 1 | `0.1` | Share of tasks (not sessions) that go to the test side. |',
    );
    expect(doc).toContain(
      '| `dpo.loss` | "dpo" | "sigmoid" | "robust" | "hinge" | "ipo" | "simpo" | "orpo" | "kto" |'.replace(
        /" \| "/g,
        '" \\| "',
      ),
    );
  });

  it('says what every key does', () => {
    expect(undocumentedKeys([...STAGES, { name: 'refresh', description: '', config: refreshConfig }])).toEqual([]);
  });
});
