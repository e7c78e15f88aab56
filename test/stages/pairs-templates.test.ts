// pairs.hard_negatives.templates: the texts of a file the config names, on every thread, and a change to the
// file makes the pairs stale.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import type { Pair } from '../../core/records.ts';
import type { PairSide } from '../../store/messages.ts';
import { engineFor, tempDir, wholePairs } from '../fixtures/pipeline.ts';
import { REPO } from '../fixtures/cli.ts';

const templates = (refusal: string) => ({
  refusal: [refusal],
  off_topic: ['Tides follow the moon.'],
  verbose_openers: ['Happy to help!'],
  verbose_fillers: ['That is all there is to it.'],
  terse: ['Booked.'],
});

describe('pairs.hard_negatives.templates', () => {
  it("writes the file's texts, on threads as on one, and a change to the file makes the pairs stale", async () => {
    const dir = tempDir();
    const file = join(dir, 'negatives.yaml');
    writeFileSync(file, stringify(templates("I'm sorry, but I can't help with that.")));
    const config = `ingest:\n  inputs: [${join(REPO, 'data', 'sample')}]\npairs:\n  hard_negatives:\n    templates: negatives.yaml\n`;
    for (const workers of [1, 2]) {
      const run = join(dir, `w${workers}`);
      const engine = engineFor(run, config.replace('negatives.yaml', file), { workers });
      await engine.run({ until: 'pairs' });
      const written = new Set(['refusal', 'off_topic', 'verbose', 'under_explained']);
      const negatives = (await wholePairs<Pair<PairSide>>(run, 'pairs')).filter((p) => written.has(p.negative_type!));
      const texts = new Set(negatives.map((p) => p.rejected[0]!.content));
      expect(texts).toContain("I'm sorry, but I can't help with that.");
      expect(texts).toContain('Booked.');
      for (const t of texts) expect(t).not.toMatch(/phone|call that company/i);
    }
    const engine = engineFor(join(dir, 'w1'), config.replace('negatives.yaml', file));
    expect((await engine.status()).find((a) => a.stage === 'pairs')!.state).toBe('fresh');
    writeFileSync(file, stringify(templates('I cannot assist with this.')));
    const pairs = (await engine.status()).find((a) => a.stage === 'pairs')!;
    expect(pairs.state).toBe('stale');
  });
});
