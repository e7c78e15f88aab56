// Imported preference data: HH-RLHF transcripts, TRL's explicit-prompt formats (conversations and text) and
// UltraFeedback's rated completions read as pairs with source imported, the prompt the longest common prefix,
// kept as given or rechecked by the judges, exported with the other pairs (not to SFT), and bad records
// quarantined with their reason.
import { copyFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { describe, expect, it } from 'vitest';
import type { Pair } from '../../core/records.ts';
import { hhMessages, readPairs } from '../../stages/import/formats.ts';
import { REPO } from '../fixtures/cli.ts';
import { collect, engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';

const SAMPLE = join(REPO, 'data', 'sample-pairs');
const mapping = {
  prompt: 'prompt',
  chosen: 'chosen',
  rejected: 'rejected',
  completions: 'completions',
  response: 'response',
  rating: 'overall_score',
};

const query = async (sql: string) => {
  const db = await DuckDBInstance.create(':memory:');
  const c = await db.connect();
  return (await c.runAndReadAll(sql)).getRowObjectsJson() as Record<string, unknown>[];
};

describe('import formats', () => {
  it('reads an HH-RLHF pair: the shared turns are the prompt, the last replies the sides', () => {
    const [p] = readPairs(
      {
        chosen: '\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Cancel my plan.\n\nAssistant: Done, it is cancelled.',
        rejected: '\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Cancel my plan.\n\nAssistant: No.',
      },
      'hh',
      mapping,
    );
    expect(p!.prompt).toEqual([
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: 'Hello!' },
      { role: 'user', content: 'Cancel my plan.' },
    ]);
    expect(p!.chosen).toEqual([{ role: 'assistant', content: 'Done, it is cancelled.' }]);
    expect(p!.rejected).toEqual([{ role: 'assistant', content: 'No.' }]);
    expect(() => hhMessages('no turns here')).toThrow(/text before the first "Human:" turn/);
  });

  it('reads TRL’s explicit prompt as text or conversations, and its implicit prompt by the common prefix', () => {
    const [text] = readPairs({ prompt: 'Cancel my plan.', chosen: 'Done.', rejected: 'No.' }, 'trl', mapping);
    expect(text).toMatchObject({
      prompt: [{ role: 'user', content: 'Cancel my plan.' }],
      chosen: [{ role: 'assistant', content: 'Done.' }],
    });
    const convo = [{ role: 'user', content: 'Cancel my plan.' }];
    const [implicit] = readPairs(
      {
        chosen: [...convo, { role: 'assistant', content: 'Done.' }],
        rejected: [...convo, { role: 'assistant', content: 'No.' }],
      },
      'trl',
      mapping,
    );
    expect(implicit!.prompt).toEqual(convo);
    expect(() => readPairs({ chosen: convo, rejected: convo }, 'trl', mapping)).toThrow(/the same conversation/);
  });

  it('reads UltraFeedback’s rated completions as the best against each rated lower, with ratings as rewards', () => {
    const pairs = readPairs(
      {
        prompt: 'Q',
        completions: [
          { response: 'a', overall_score: 4 },
          { response: 'b', overall_score: 8 },
          { response: 'c', overall_score: 8 },
          { response: 'd', overall_score: 1 },
        ],
      },
      'ultrafeedback',
      mapping,
    );
    expect(pairs.map((p) => [p.chosen[0]!.content, p.rejected[0]!.content, p.chosenRating, p.rejectedRating])).toEqual([
      ['b', 'a', 1, 0.5],
      ['b', 'd', 1, 0.125],
    ]);
    expect(() =>
      readPairs(
        {
          prompt: 'Q',
          completions: [
            { response: 'a', overall_score: 3 },
            { response: 'b', overall_score: 3 },
          ],
        },
        'ultrafeedback',
        mapping,
      ),
    ).toThrow(/same rating/);
  });
});

describe('the import stage', () => {
  it('imports the bundled sample in three shapes, keeps the pairs as given, and exports them with the pairs, not to SFT', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session('s1', 'A', 1), session('s2', 'A', 0)]));
    const bad = join(dir, 'bad.jsonl');
    writeFileSync(
      bad,
      jsonl([
        { prompt: 'Q', chosen: 'same', rejected: [{ role: 'robot', content: 'x' }] },
        'not json',
        { chosen: '\n\nHuman: Hi\n\nAssistant: A', rejected: '\n\nHuman: Hi\n\nAssistant: A' },
      ]),
    );
    // The same file under another name: its pairs are duplicates, counted and not written twice.
    copyFileSync(join(SAMPLE, 'trl.jsonl'), join(dir, 'again.jsonl'));
    const outcomes = await engineFor(
      dir,
      `ingest:\n  inputs: [logs.jsonl]\nimport:\n  inputs: [${SAMPLE}, bad.jsonl, again.jsonl]\n  test_ratio: 0.2\n`,
    ).run({ until: 'export' });
    expect(
      outcomes.every((o) => o.action === 'ran'),
      JSON.stringify(outcomes.map((o) => [o.stage, o.action, o.error])),
    ).toBe(true);

    const m = manifest(dir, 'import');
    // 6 HH-RLHF, 6 TRL (and their copy), 6 UltraFeedback records of two lower-rated completions each: 30 pairs read, 21 distinct.
    // Duplicates: the copy's 6, and 3 UltraFeedback best-against-worst pairs that say what 3 TRL text records say.
    expect(m.counts).toMatchObject({ hh: 6, trl: 12, ultrafeedback: 6, quarantined: 3, duplicates: 9 });
    expect(m.counts.train! + m.counts.test!).toBe(21);
    expect(m.counts.test).toBeGreaterThan(0);
    const quarantined = await collect<{ where: string; reason: string }>(
      join(dir, 'workspace', 'import', 'quarantine.jsonl'),
    );
    expect(quarantined.map((q) => q.reason)).toEqual([
      expect.stringMatching(/role "robot" is none of/),
      expect.stringMatching(/not valid JSON/),
      expect.stringMatching(/hh: chosen and rejected are the same conversation/),
    ]);

    const pairs = join(dir, 'workspace', 'export', 'pairs');
    const rows = await query(
      `SELECT source, judge, confidence, prompt, chosen, rejected, chosen_reward FROM read_parquet(['${pairs}/train.parquet', '${pairs}/test.parquet']) WHERE source = 'imported'`,
    );
    expect(rows).toHaveLength(21);
    expect(rows.every((r) => r.judge === 'imported' && r.confidence === 1)).toBe(true);
    const hh = rows.find((r) => JSON.stringify(r.prompt).includes('you have it on file'))!;
    expect((hh.prompt as unknown[]).length).toBe(3);
    expect(JSON.stringify(hh.chosen)).toContain('dispute the duplicate charge');
    expect(rows.filter((r) => r.chosen_reward === 1).length).toBe(9); // UltraFeedback's best, rated 9 of 9
    const sft = await query(
      `SELECT count(*) AS n FROM read_parquet('${join(dir, 'workspace', 'export', 'sft')}/*.parquet') WHERE session_id LIKE '%#%'`,
    );
    expect(Number(sft[0]!.n)).toBe(0);
  });

  it('quarantines a line past import.max_record_bytes as soon as it passes, and reads on at its newline', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session('s1', 'A', 1), session('s2', 'A', 0)]));
    const pair = (q: string) => JSON.stringify({ prompt: q, chosen: 'Done.', rejected: 'No.' });
    writeFileSync(
      join(dir, 'long.jsonl'),
      Buffer.concat([
        Buffer.from(pair('first') + '\n'),
        Buffer.alloc(3_000_000, 'x'),
        Buffer.from('\n' + pair('second') + '\n'),
        Buffer.alloc(2_000_000, 0), // the file ends inside it
      ]),
    );
    const outcomes = await engineFor(
      dir,
      'ingest:\n  inputs: [logs.jsonl]\nimport:\n  inputs: [long.jsonl]\n  max_record_bytes: 30000\n',
    ).run({ until: 'import' });
    expect(outcomes.at(-1)!.action, outcomes.at(-1)!.error).toBe('ran');
    expect(manifest(dir, 'import').counts).toMatchObject({ trl: 2, quarantined: 2 });
    const quarantined = await collect<{ where: string; reason: string; raw: string }>(
      join(dir, 'workspace', 'import', 'quarantine.jsonl'),
    );
    expect(quarantined.map((q) => [q.where, q.reason.split(':')[0]])).toEqual([
      ['line 2', 'the record is 3,000,000 bytes, more than import.max_record_bytes (30,000)'],
      ['line 4', 'the record is 2,000,000 bytes, more than import.max_record_bytes (30,000)'],
    ]);
    for (const q of quarantined) expect(q.raw.length).toBeLessThanOrEqual(65536);
  });

  it('has the judges recheck imported pairs when asked', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session('s1', 'A', 1), session('s2', 'A', 0)]));
    await engineFor(
      dir,
      `ingest:\n  inputs: [logs.jsonl]\nimport:\n  inputs: [${join(SAMPLE, 'trl.jsonl')}]\njudge:\n  imported: recheck\n`,
    ).run({ until: 'judge' });
    const judged = await collect<Pair & { verdicts: Record<string, unknown> }>(
      join(dir, 'workspace', 'judge', 'train.jsonl'),
    );
    const imported = judged.filter((p) => p.source === 'imported');
    expect(imported.length).toBeGreaterThan(0);
    expect(imported.every((p) => 'rules' in p.verdicts && p.judge !== 'imported')).toBe(true);
  });
  it('reads the same pairs from a Parquet file, on a thread of its own, as from the JSONL it was written from', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session('s1', 'A', 1), session('s2', 'A', 0)]));
    const db = await DuckDBInstance.create(':memory:');
    await (
      await db.connect()
    ).run(
      `COPY (SELECT * FROM read_json('${join(SAMPLE, 'trl.jsonl')}', format = 'newline_delimited')) TO '${join(dir, 'trl.parquet')}' (FORMAT parquet)`,
    );
    const imported = async (input: string) => {
      const at = tempDir();
      await engineFor(at, `ingest:\n  inputs: [${join(dir, 'logs.jsonl')}]\nimport:\n  inputs: [${input}]\n`).run({
        until: 'import',
      });
      const pairs = [
        ...(await collect<Pair>(join(at, 'workspace', 'import', 'train.jsonl'))),
        ...(await collect<Pair>(join(at, 'workspace', 'import', 'test.jsonl'))),
      ];
      return {
        counts: manifest(at, 'import').counts,
        pairs: pairs.map((p) => JSON.stringify([p.prompt, p.chosen, p.rejected])).sort(),
      };
    };
    const [fromJsonl, fromParquet] = [
      await imported(join(SAMPLE, 'trl.jsonl')),
      await imported(join(dir, 'trl.parquet')),
    ];
    expect(fromParquet.pairs.length).toBe(fromJsonl.counts.train! + fromJsonl.counts.test!);
    expect(fromParquet.pairs.length).toBeGreaterThan(3);
    expect(fromParquet).toEqual(fromJsonl);
  });
});
