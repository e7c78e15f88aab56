import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { MAX_CONFIG_BYTES, loadConfig } from '../../pipeline/config.ts';
import { configSchema } from '../../pipeline/engine.ts';
import { UsageError } from '../../pipeline/errors.ts';
import { STAGES } from '../../stages/index.ts';

const schema = configSchema(STAGES);
const write = (text: string) => {
  const file = join(mkdtempSync(join(tmpdir(), 'prefab-config-')), 'c.yaml');
  writeFileSync(file, text);
  return file;
};

describe('config', () => {
  it('loads the shipped default config with every section filled in', () => {
    const { value } = loadConfig('configs/default.yaml', schema);
    expect(value).toMatchObject({
      pairs: { outcome: { success_min: 0.7, failure_max: 0.3 } },
      split: { test_ratio: 0.1 },
    });
  });

  it('names a misspelt key with its file and line', () => {
    const file = write('split:\n  test_ratio: 0.2\npairs:\n  outcome:\n    sucess_min: 0.8\n');
    expect(() => loadConfig(file, schema)).toThrow(UsageError);
    expect(() => loadConfig(file, schema)).toThrow(new RegExp(`${file}:5: unknown key pairs\\.outcome\\.sucess_min`));
  });

  it('names a key of the wrong type with its line and what was expected', () => {
    const file = write('split:\n  test_ratio: lots\n');
    expect(() => loadConfig(file, schema)).toThrow(/c\.yaml:2: split\.test_ratio: .*expected number/i);
  });

  it('rejects an unknown top-level section', () => {
    const file = write('judge:\n  model: x\n');
    expect(() => loadConfig(file, schema)).toThrow(/unknown key judge/);
  });

  it('rejects thresholds that leave no room between failure and success', () => {
    const file = write('pairs:\n  outcome:\n    success_min: 0.5\n    failure_max: 0.6\n');
    expect(() => loadConfig(file, schema)).toThrow(/failure_max must be below success_min/);
  });

  it('says so when the file is missing', () => {
    expect(() => loadConfig('configs/nope.yaml', schema)).toThrow(/configs\/nope\.yaml: cannot read it/);
  });

  it('reads only a regular file of a config’s size: not /dev/zero, a folder, or megabytes', () => {
    expect(() => loadConfig('/dev/zero', schema)).toThrow(/config \/dev\/zero: not a regular file/);
    expect(() => loadConfig(tmpdir(), schema)).toThrow(/not a regular file/);
    const big = write(`# ${'x'.repeat(MAX_CONFIG_BYTES)}\n`);
    expect(() => loadConfig(big, schema)).toThrow(/bytes, more than a config's 1048576 \(1 MiB\)/);
    expect(loadConfig(write(`# ${'x'.repeat(1000)}\nsplit:\n  test_ratio: 0.2\n`), schema).value.split).toMatchObject({
      test_ratio: 0.2,
    });
  });
});
