// The data stages on worker threads (`--workers N`) write what they write on one thread, byte for byte:
// ingest on every kind of record a night may bring, in files damaged and whole, through the sources (tsx
// in each thread) and through the executable's bundle; pairs bucket by bucket; the judge's pairs and
// best-of-N bucket by bucket, a shard's chunks included; export's tables, each on a thread of its own.
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { DuckDBInstance } from '@duckdb/node-api';
import { describe, expect, it } from 'vitest';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { prefab } from '../fixtures/cli.ts';
import { engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';

/** Each output file of ingest with its hash; index.json without the times files were ingested or their paths (relative to the working folder). */
function ingested(dir: string): Record<string, string> {
  const root = join(dir, 'workspace', 'ingest');
  const hash = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');
  const out: Record<string, string> = {
    'quarantine.jsonl': hash(join(root, 'quarantine.jsonl')),
    'ids.bin': hash(join(root, 'ids.bin')),
  };
  for (const f of readdirSync(join(root, 'sessions'))) out[f] = hash(join(root, 'sessions', f));
  for (const f of readdirSync(join(root, 'tasks'))) out[`tasks/${f}`] = hash(join(root, 'tasks', f));
  const index = JSON.parse(readFileSync(join(root, 'index.json'), 'utf8')) as {
    files: { ingested_at?: string; name?: string }[];
  };
  out['index.json'] = JSON.stringify(index.files.map(({ ingested_at: _, name: __, ...f }) => f));
  return out;
}

/**
 * A night's inputs: good and bad records mixed, duplicates within and across files, a cut .gz, a JSON array,
 * Parquet (read on a thread of its own and mapped on the main thread, between files read on ingest's threads),
 * and small files one after another.
 */
async function inputs(dir: string): Promise<void> {
  const records: unknown[] = [];
  for (let i = 0; i < 3000; i++) {
    const kind = i % 50;
    if (kind === 7)
      records.push(`{"session_id": "broken-${i}", "messages": [`); // not JSON
    else if (kind === 13) records.push({ session_id: `no-reward-${i}`, messages: [{ role: 'user', content: 'hi' }] });
    else if (kind === 21)
      records.push(session(`s-${i - 1}`, `T${i % 97}`, 1)); // a duplicate id
    else if (kind === 29) records.push(session(undefined, null, 0.5, `untasked ${i}`));
    else if (kind === 33) records.push('');
    else records.push(session(`s-${i}`, `T${i % 97}`, i % 3 === 0 ? 1 : 0, `answer ${i} ✓ — ünïcode`));
  }
  writeFileSync(join(dir, 'a.jsonl'), jsonl(records));
  const raw = Buffer.from(jsonl([session('bad-bytes', 'F', 1), session('s-5', 'F', 1)]));
  raw[raw.indexOf('done')] = 0xff;
  writeFileSync(join(dir, 'b.jsonl'), raw);
  const gz = gzipSync(
    jsonl(
      Array.from({ length: 2000 }, (_, i) => session(`gz-${i}`, `G${i % 50}`, i % 2, `reply ${(i * 7919) % 10007}`)),
    ),
  );
  writeFileSync(join(dir, 'c.jsonl.gz'), gz.subarray(0, Math.floor(gz.length * 0.7)));
  writeFileSync(join(dir, 'd.json'), jsonArray().text);
  // Written on Windows: a byte order mark, "\r\n" and, once, a lone "\r".
  const crlf = Array.from({ length: 1500 }, (_, i) =>
    JSON.stringify(session(`w-${i}`, `W${i % 30}`, i % 2, `réponse ${i}`)),
  );
  writeFileSync(
    join(dir, 'e.jsonl'),
    '\uFEFF' + crlf.slice(0, 700).join('\r\n') + '\r' + crlf.slice(700).join('\r\n') + '\r\n',
  );
  writeFileSync(
    join(dir, 'f.jsonl.src'),
    jsonl(Array.from({ length: 300 }, (_, i) => session(i % 20 === 0 ? `s-${i}` : `pq-${i}`, `P${i % 11}`, i % 2))),
  );
  const db = await DuckDBInstance.create(':memory:');
  await (
    await db.connect()
  ).run(
    `COPY (SELECT * FROM read_json('${join(dir, 'f.jsonl.src')}', format = 'newline_delimited')) TO '${join(dir, 'f.parquet')}' (FORMAT parquet)`,
  );
  for (let f = 0; f < 12; f++) {
    const small = Array.from({ length: 40 }, (_, i) =>
      session(i % 13 === 0 ? `s-${f * 40 + i}` : `g${f}-${i}`, `G${(f * 40 + i) % 37}`, i % 2, `small ${f} ${i}`),
    );
    writeFileSync(join(dir, `g-${String(f).padStart(2, '0')}.jsonl`), jsonl(small));
  }
}

/**
 * A JSON array, some of it pretty-printed, with blank elements (every seventh element is followed by one)
 * and blank around them; and the line each of its sessions starts on (every tenth element is not one).
 */
function jsonArray(): { text: string; sessionLines: number[] } {
  let text = '[';
  const sessionLines: number[] = [];
  for (let i = 0; i < 500; i++) {
    if (i > 0) text += ',';
    if (i % 7 === 0) text += '\n ';
    if (i % 10 !== 3) sessionLines.push(text.split('\n').length);
    text += JSON.stringify(
      i % 10 === 3 ? { oops: i } : session(`arr-${i}`, `A${i % 20}`, 1),
      null,
      i % 4 === 0 ? 2 : undefined,
    );
    if (i % 7 === 0) text += '\u00a0, ';
  }
  return { text: text + ']', sessionLines };
}

/** The config reading `inputs`' files from `root` ('' for the working folder). */
const configFor = (root: string) =>
  `ingest:\n  inputs: [${['a.jsonl', 'b.jsonl', 'c.jsonl.gz', 'd.json', 'e.jsonl', 'f.parquet', 'g-*.jsonl'].map((f) => JSON.stringify(root ? join(root, f) : f)).join(', ')}]\n  max_quarantined: 0.9\n`;

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');

describe('the data stages on worker threads', () => {
  it('writes the same segments, quarantine and id set on 3 threads as on one', async () => {
    // One set of inputs: a session's source names its file.
    const [data, one, three] = [tempDir(), tempDir(), tempDir()];
    await inputs(data);
    const config = configFor(data);
    await engineFor(one, config, { workers: 1 }).run({ until: 'ingest' });
    await engineFor(three, config, { workers: 3 }).run({ until: 'ingest' });
    const counts = manifest(one, 'ingest').counts;
    expect(counts).toMatchObject({ files: 18, files_damaged: 1, invalid_utf8: 1 });
    // Every record of the Windows file is a session, the first one too, numbered by its line.
    const windows = readdirSync(join(one, 'workspace', 'ingest', 'sessions')).find((f) => f.startsWith('00004-'))!;
    const sources = readFileSync(join(one, 'workspace', 'ingest', 'sessions', windows), 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { source: string }).source);
    expect(sources.length).toBe(1500);
    expect([sources[0], sources[700], sources[1499]].map((s) => s.replace(/^.*\//, ''))).toEqual([
      'e.jsonl line 1',
      'e.jsonl line 701',
      'e.jsonl line 1500',
    ]);
    const array = readdirSync(join(one, 'workspace', 'ingest', 'sessions')).find((f) => f.startsWith('00003-'))!;
    const elements = readFileSync(join(one, 'workspace', 'ingest', 'sessions', array), 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { source: string }).source.replace(/^.*\//, ''));
    const { sessionLines } = jsonArray();
    const numbers = Array.from({ length: 500 }, (_, i) => i + 1).filter((n) => n % 10 !== 4);
    expect(elements).toEqual(numbers.map((n, k) => `d.json element ${n} (line ${sessionLines[k]})`));
    expect(counts.quarantined).toBeGreaterThan(100);
    expect(counts.duplicates).toBeGreaterThan(50);
    expect(manifest(three, 'ingest').counts).toEqual(counts);
    expect(ingested(three)).toEqual(ingested(one));
  });

  it('pairs the buckets on 3 threads as on one', async () => {
    const data = tempDir();
    const sessions: unknown[] = [];
    for await (const s of readJsonl(SAMPLE)) if (sessions.push(s) === 400) break;
    writeFileSync(join(data, 'logs.jsonl'), jsonl(sessions));
    const config = `ingest:\n  inputs: [${join(data, 'logs.jsonl')}]\nsplit:\n  bucket_size: 16\npairs:\n  must_decline: ['cancel']\n`;
    const [one, three] = [tempDir(), tempDir()];
    await engineFor(one, config, { workers: 1 }).run({ until: 'pairs' });
    await engineFor(three, config, { workers: 3 }).run({ until: 'pairs' });
    expect(manifest(one, 'split').counts.buckets).toBeGreaterThan(20);
    expect(manifest(three, 'pairs').counts).toEqual(manifest(one, 'pairs').counts);
    expect(manifest(one, 'pairs').counts.hard_negative).toBeGreaterThan(100);
    for (const f of ['train.jsonl', 'test.jsonl', 'dropped.jsonl'])
      expect(
        readFileSync(join(three, 'workspace', 'pairs', f)).equals(readFileSync(join(one, 'workspace', 'pairs', f))),
        f,
      ).toBe(true);
  });

  it('judges the pairs and best-of-N on 3 threads as on one, on a shard too', async () => {
    const data = tempDir();
    const sessions: unknown[] = [];
    for await (const s of readJsonl(SAMPLE)) if (sessions.push(s) === 400) break;
    writeFileSync(join(data, 'logs.jsonl'), jsonl(sessions));
    const config = `ingest:\n  inputs: [${join(data, 'logs.jsonl')}]\nsplit:\n  bucket_size: 16\n`;
    for (const shard of [null, { index: 1, count: 2 }]) {
      const [one, three] = [tempDir(), tempDir()];
      await engineFor(one, config, { workers: 1 }).run({ until: 'judge', shard });
      await engineFor(three, config, { workers: 3 }).run({ until: 'judge', shard });
      const counts = manifest(one, 'judge').counts;
      expect(counts.best_of_n_groups).toBeGreaterThan(10);
      expect(counts.best_of_n_same_as_outcome).toBeGreaterThan(10);
      expect(counts.judged_train).toBeGreaterThan(200);
      expect(manifest(three, 'judge').counts).toEqual(counts);
      const files = ['train.jsonl', 'test.jsonl', 'report.json', ...(shard ? ['shard.json'] : [])];
      for (const f of files)
        expect(
          readFileSync(join(three, 'workspace', 'judge', f)).equals(readFileSync(join(one, 'workspace', 'judge', f))),
          f,
        ).toBe(true);
    }
  });

  it('exports the same Parquet files on 3 threads as on one, masked too', async () => {
    const data = tempDir();
    const sessions: unknown[] = [];
    for await (const s of readJsonl(SAMPLE)) if (sessions.push(s) === 300) break;
    writeFileSync(join(data, 'logs.jsonl'), jsonl(sessions));
    const config = `ingest:\n  inputs: [${join(data, 'logs.jsonl')}]\nsplit:\n  bucket_size: 16\nexport:\n  row_group_size: 50\n  redaction:\n    enabled: true\n`;
    const [one, three] = [tempDir(), tempDir()];
    await engineFor(one, config, { workers: 1 }).run({ until: 'export' });
    await engineFor(three, config, { workers: 3 }).run({ until: 'export' });
    const counts = manifest(one, 'export').counts;
    expect(counts.sessions_train! + counts.sessions_test!).toBe(300);
    expect(counts.pairs_train).toBeGreaterThan(100);
    expect(manifest(three, 'export').counts).toEqual(counts);
    for (const table of ['sessions', 'sft', 'pairs', 'kto']) {
      for (const side of ['train', 'test']) {
        const f = join(table, `${side}.parquet`);
        expect(
          readFileSync(join(three, 'workspace', 'export', f)).equals(readFileSync(join(one, 'workspace', 'export', f))),
          f,
        ).toBe(true);
      }
    }
  });

  it('does the same from the executable, whose threads start from its bundle', async () => {
    const [one, two] = [tempDir(), tempDir()];
    for (const dir of [one, two]) {
      await inputs(dir);
      writeFileSync(join(dir, 'config.yaml'), configFor(''));
    }
    for (const [dir, n] of [
      [one, '1'],
      [two, '2'],
    ] as const) {
      const r = prefab(['-c', 'config.yaml', '-q', '--workers', n, 'run', '--until', 'ingest'], dir);
      expect(r.code, r.stderr).toBe(0);
    }
    expect(ingested(two)).toEqual(ingested(one));
    expect(prefab(['--workers', '0', 'status'], one)).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('at least 1'),
    });
  });
});
