// One bad file never stops the night: damaged files (a truncated .gz, a corrupt Parquet, a JSON array cut
// short, an empty .json), records nested 10,000 levels deep or larger than ingest.max_record_bytes, and bytes
// that are not UTF-8 are quarantined with their file, place and reason while every good record is kept; and
// a run whose records are mostly bad fails, saying why.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { DuckDBInstance } from '@duckdb/node-api';
import { describe, expect, it } from 'vitest';
import type { QuarantineRecord } from '../../pipeline/records.ts';
import { sessionSegments } from '../../store/runs.ts';
import type { Session } from '../../core/records.ts';
import { REPO, prefab } from '../fixtures/cli.ts';
import { DATA_STAGES, collect, engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';

const ingestOnly = { until: 'ingest' };

async function ingestedIds(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const seg of await sessionSegments(join(dir, 'workspace', 'ingest')))
    out.push(...(await collect<Session>(seg)).map((s) => s.session_id));
  return out.sort();
}

/** A value nested `depth` levels deep, as JSON text (built without recursion). */
const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);

describe('ingest on damaged inputs', () => {
  it('keeps every good record, quarantines each damaged file from where it broke, and goes on', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'good.jsonl'), jsonl([session('good-1', 'A', 1), session('good-2', 'A', 0)]));
    const gz = gzipSync(
      jsonl(Array.from({ length: 3000 }, (_, i) => session(`gz-${i}`, `B${i}`, i % 2, `answer ${(i * 7919) % 10007}`))),
    );
    writeFileSync(join(dir, 'cut.jsonl.gz'), gz.subarray(0, Math.floor(gz.length * 0.6)));
    writeFileSync(
      join(dir, 'corrupt.parquet'),
      Buffer.concat([Buffer.from('PAR1'), Buffer.alloc(200, 7), Buffer.from('PAR1')]),
    );
    writeFileSync(
      join(dir, 'cut.json'),
      `[${JSON.stringify(session('arr-1', 'C', 1))},${JSON.stringify(session('arr-2', 'C', 0))},{"session_id": "arr-3", "mess`,
    );
    writeFileSync(join(dir, 'empty.json'), '');
    writeFileSync(
      join(dir, 'deep.jsonl'),
      jsonl([`{"session_id": "deep", "reward": 1, "messages": ${nested(10_000)}}`, session('after-deep', 'D', 1)]),
    );
    writeFileSync(
      join(dir, 'big.jsonl'),
      jsonl([{ ...session('big', 'E', 1), feedback: 'x'.repeat(40_000) }, session('small', 'E', 1)]),
    );
    // A byte that is not UTF-8 inside a string: the record is kept, and counted.
    const raw = Buffer.from(JSON.stringify(session('bad-bytes', 'F', 1)) + '\n');
    const at = raw.indexOf('done');
    raw[at] = 0xff;
    writeFileSync(join(dir, 'bytes.jsonl'), raw);

    const outcomes = await engineFor(
      dir,
      'ingest:\n  inputs: [.]\n  max_record_bytes: 30000\n  max_quarantined: 0.9\n',
    ).run(ingestOnly);
    expect(outcomes[0]!.action, outcomes[0]!.error).toBe('ran');
    const ids = await ingestedIds(dir);
    // Everything before the damage is kept: the good file, the first elements of the cut array, the gz lines read before the cut.
    expect(ids).toEqual(
      expect.arrayContaining(['good-1', 'good-2', 'arr-1', 'arr-2', 'after-deep', 'small', 'bad-bytes', 'gz-0']),
    );
    expect(ids.filter((id) => id.startsWith('gz-')).length).toBeGreaterThan(100);
    expect(ids).not.toContain('big');
    expect(ids).not.toContain('deep');

    const q = await collect<QuarantineRecord>(join(dir, 'workspace', 'ingest', 'quarantine.jsonl'));
    const about = (file: string) => q.filter((r) => r.file.endsWith(file));
    expect(about('cut.jsonl.gz')).toEqual([
      expect.objectContaining({
        where: expect.stringMatching(/^after line \d+$/),
        reason: expect.stringMatching(/unexpected end of file.*the rest of the file is unread/),
      }),
    ]);
    expect(about('corrupt.parquet')).toEqual([
      expect.objectContaining({
        where: 'before the first record',
        reason: expect.stringMatching(/the rest of the file is unread/),
      }),
    ]);
    // A reason does not repeat the file's path: the record names the file.
    expect(about('cut.json')).toEqual([
      expect.objectContaining({
        where: 'after element 2 (line 1)',
        reason: expect.stringMatching(/^line 1: .*not closed/),
      }),
    ]);
    expect(about('empty.json')).toEqual([expect.objectContaining({ reason: expect.stringMatching(/^empty file/) })]);
    expect(about('deep.jsonl')).toEqual([
      expect.objectContaining({ where: 'line 1', reason: 'the record nests more than 200 levels deep' }),
    ]);
    expect(about('big.jsonl')).toEqual([
      expect.objectContaining({
        where: 'line 1',
        reason: expect.stringMatching(/^the record is 40,\d{3} bytes, more than ingest\.max_record_bytes \(30,000\)$/),
      }),
    ]);

    const m = manifest(dir, 'ingest');
    expect(m.counts.files_damaged).toBe(4);
    expect(m.counts.invalid_utf8).toBe(1);
    expect(m.summary).toMatch(/4 damaged file\(s\) read up to the damage/);
  });

  it('reports a Parquet file whose row group takes more memory than its thread may have, and goes on', async () => {
    const dir = tempDir();
    writeFileSync(
      join(dir, 'good.jsonl'),
      jsonl(Array.from({ length: 40 }, (_, i) => session(`good-${i}`, 'A', i % 2))),
    );
    // 20,000 sessions in one row group (as pyarrow writes up to a million rows), read by a thread given 64 MB,
    // where hyparquet holds some twenty times a row group's 40 MB uncompressed; and a small file after it.
    const db = await DuckDBInstance.create(':memory:');
    const sql = (rows: number, name: string) =>
      `COPY (SELECT 'pq-' || i AS session_id, 'T' || (i % 50) AS task_id, (i % 2)::DOUBLE AS reward, [{'role': 'user', 'content': repeat('x', 2000) || i}, {'role': 'assistant', 'content': 'done ' || i}] AS messages FROM range(${rows}) t(i)) TO '${join(dir, name)}' (FORMAT parquet, ROW_GROUP_SIZE ${rows})`;
    await (await db.connect()).run(sql(20_000, 'large.parquet'));
    await (await db.connect()).run(sql(30, 'small.parquet'));
    const outcomes = await engineFor(dir, 'ingest:\n  inputs: [.]\n  max_quarantined: 0.9\n', {
      parquetHeapMb: 64,
    }).run(ingestOnly);
    expect(outcomes[0]!.action, outcomes[0]!.error).toBe('ran');
    const q = await collect<QuarantineRecord>(join(dir, 'workspace', 'ingest', 'quarantine.jsonl'));
    expect(q).toEqual([
      expect.objectContaining({
        file: expect.stringMatching(/large\.parquet$/),
        where: 'before the first record',
        reason: expect.stringMatching(
          /^reading it ran out of memory: a row group is read whole, and its largest holds 20000 rows, 4\d MB uncompressed; write the file with smaller row groups \(DuckDB: .*ROW_GROUP_SIZE.*\(the rest of the file is unread\)$/,
        ),
      }),
    ]);
    const ids = await ingestedIds(dir);
    expect(ids.filter((id) => id.startsWith('good-'))).toHaveLength(40);
    expect(ids.filter((id) => id.startsWith('pq-'))).toHaveLength(30);
    expect(manifest(dir, 'ingest').counts).toMatchObject({ files_damaged: 1, sessions: 70 });
    // Where that is too much to lose, the run fails and tells the damage whole.
    const strict = tempDir();
    writeFileSync(join(strict, 'large.parquet'), readFileSync(join(dir, 'large.parquet')));
    const [failed] = await engineFor(strict, 'ingest:\n  inputs: [.]\n', { parquetHeapMb: 64 }).run(ingestOnly);
    expect(failed!.action).toBe('failed');
    // Told once, whole, with the file named once (not also among the most common reasons).
    expect(failed!.error).toMatch(
      /1 of 1 new records \(100%\) were quarantined, more than ingest\.max_quarantined \(0\.5\); Damaged: \S*large\.parquet: reading it ran out of memory: .* give Node more memory \(NODE_OPTIONS=--max-old-space-size=MB\) \(the rest of the file is unread\)\. Check ingest\.mapping/,
    );
    expect(failed!.error!.match(/ran out of memory/g)).toHaveLength(1);
    // With the memory it needs, the same file is read whole.
    const again = tempDir();
    writeFileSync(join(again, 'large.parquet'), readFileSync(join(dir, 'large.parquet')));
    await engineFor(again, 'ingest:\n  inputs: [.]\n').run(ingestOnly);
    expect(manifest(again, 'ingest').counts).toMatchObject({ files_damaged: 0, sessions: 20_000 });
  });

  it('fails the run, saying why, when more of the new records are quarantined than ingest.max_quarantined allows', async () => {
    const dir = tempDir();
    writeFileSync(
      join(dir, 'logs.jsonl'),
      jsonl([
        session('ok', 'A', 1),
        ...Array.from({ length: 9 }, (_, i) => ({ ...session(`bad-${i}`, 'A', 1), reward: 'high' })),
      ]),
    );
    writeFileSync(join(dir, 'config.yaml'), 'ingest:\n  inputs: [logs.jsonl]\n');
    const r = prefab([
      '--workdir',
      join(dir, 'workspace'),
      '--config',
      join(dir, 'config.yaml'),
      'run',
      '--until',
      'ingest',
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /9 of 10 new records \(90%\) were quarantined, more than ingest\.max_quarantined \(0\.5\); the most common reasons: 9 × reward must be a number in \[#, #\], got the string/,
    );
    // Allowed, the same input ingests.
    writeFileSync(join(dir, 'config.yaml'), 'ingest:\n  inputs: [logs.jsonl]\n  max_quarantined: 1\n');
    expect(
      prefab(['--workdir', join(dir, 'workspace'), '--config', join(dir, 'config.yaml'), 'run', '--until', 'ingest'])
        .code,
    ).toBe(0);
  });

  it('says NaN and Infinity rewards are what they are', async () => {
    const { toSession } = await import('../../stages/ingest/mapping.ts');
    const options = {
      fields: {
        messages: 'messages',
        reward: 'reward',
        feedback: 'feedback',
        model: 'model',
        created_at: 'created_at',
      },
      message: { role: 'role', content: 'content', roles: {} },
      outOfRangeReward: 'reject' as const,
      tools: null,
    };
    expect(() => toSession({ ...session('n', 'A', 1), reward: NaN }, 'x', options)).toThrow(
      'reward must be a number in [0, 1], got NaN',
    );
    expect(() => toSession({ ...session('n', 'A', 1), reward: -Infinity }, 'x', options)).toThrow('got -Infinity');
  });
});

describe('ingest on files that go or cannot be named', () => {
  it('skips a file whose name is not UTF-8, naming it escaped, and reads the others', async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'in'));
    writeFileSync(join(dir, 'in', 'good.jsonl'), jsonl([session('good-1', 'A', 1)]));
    writeFileSync(Buffer.from(`${join(dir, 'in')}/a\xff.jsonl`, 'latin1'), jsonl([session('odd-1', 'A', 1)]));
    const lines: string[] = [];
    const outcomes = await engineFor(dir, 'ingest:\n  inputs: [in]\n', {}, lines).run(ingestOnly);
    expect(outcomes[0]!.action).toBe('ran');
    expect(await ingestedIds(dir)).toEqual(['good-1']);
    expect(lines.join('')).toContain(
      `${join(dir, 'in')}/a\\\\xff.jsonl has a name that is not UTF-8: rename it to read it`,
    );
  });

  it('holds a bounded number of files open however many arrive: 400 files under ulimit -n 256', () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'in'));
    for (let i = 0; i < 400; i++) writeFileSync(join(dir, 'in', `f${i}.jsonl`), jsonl([session(`m-${i}`, 't', 1)]));
    writeFileSync(join(dir, 'c.yaml'), 'ingest:\n  inputs: [in]\n');
    const bin = join(REPO, 'bin', 'prefab.js');
    const r = spawnSync(
      'sh',
      ['-c', `ulimit -n 256 && exec "${process.execPath}" "${bin}" --config c.yaml --workdir ws run --until ingest`],
      { cwd: dir, encoding: 'utf8' },
    );
    expect(r.stderr).not.toMatch(/EMFILE/);
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).stages[0].counts).toMatchObject({ sessions: 400, files: 400 });
  });

  it('skips a file gone between listing and reading (a rotated log), saying so, and keeps the others’ work', async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'in'));
    // f7 gzipped: the .gz reader takes an unreadable file for a damaged one, so the file is looked at first.
    for (let i = 0; i < 30; i++) {
      const text = jsonl([session(`s-${i}`, 'A', i % 2)]);
      if (i === 7) writeFileSync(join(dir, 'in', 'f7.jsonl.gz'), gzipSync(text));
      else writeFileSync(join(dir, 'in', `f${i}.jsonl`), text);
    }
    const ingest = DATA_STAGES[0]!;
    // Removed once the files are listed and hashed, as the stage begins to read them.
    const rotating = {
      ...ingest,
      run: (ctx: Parameters<typeof ingest.run>[0]) => (rmSync(join(dir, 'in', 'f7.jsonl.gz')), ingest.run(ctx)),
    };
    const lines: string[] = [];
    const outcomes = await engineFor(dir, 'ingest:\n  inputs: [in]\n', {}, lines, [rotating]).run();
    expect(outcomes[0]!.action).toBe('ran');
    expect((await ingestedIds(dir)).length).toBe(29);
    expect(await ingestedIds(dir)).not.toContain('s-7');
    expect(lines.join('')).toMatch(/skipped an input file that could not be opened.*"file":"[^"]*f7\.jsonl\.gz"/);
    expect(manifest(dir, 'ingest').counts).toMatchObject({ files_damaged: 0, quarantined: 0 });
  });
});

/**
 * `count` input files in `dir/in`, three sessions each; every file repeats an id of the one before (a
 * duplicate) and every fifth holds a line that is not JSON (quarantined).
 */
function manyFiles(dir: string, count: number): void {
  mkdirSync(join(dir, 'in'), { recursive: true });
  for (let i = 0; i < count; i++) {
    const records: unknown[] = [0, 1, 2].map((k) => session(`f${i}-${k}`, `T${i % 7}`, k % 2));
    if (i > 0) records.push(session(`f${i - 1}-0`, 'T0', 1));
    if (i % 5 === 0) records.push('{"session_id": "broken", ');
    writeFileSync(join(dir, 'in', `f${String(i).padStart(4, '0')}.jsonl`), jsonl(records));
  }
}

/**
 * An ingest folder's files and what they hold (index.json without its times, the test folder's name, which
 * sessions' sources hold, blanked), to compare two runs' byte for byte.
 */
function ingestFolder(dir: string): Record<string, string> {
  const root = join(dir, 'workspace', 'ingest');
  const out: Record<string, string> = {};
  for (const sub of ['', 'sessions', 'tasks'])
    for (const name of readdirSync(join(root, sub))) {
      if (name === 'manifest.json' || statSync(join(root, sub, name)).isDirectory()) continue;
      const text = readFileSync(join(root, sub, name), name === 'ids.bin' ? 'base64' : 'utf8');
      const same = text.replaceAll(basename(dir), 'DIR');
      out[join(sub, name)] = name === 'index.json' ? same.replace(/"ingested_at": "[^"]*"/g, '') : same;
    }
  return out;
}

/** `lines` (a logger's) counting its events named `event`. */
const eventCount = (lines: string[], event: string) => lines.filter((l) => l.includes(`"event":"${event}"`)).length;

describe('ingest after a failure', () => {
  const config = 'ingest:\n  inputs: [in]\n  max_quarantined: 0.2\n';

  it('keeps the work of the files read before it was stopped: the next run reads only the rest, and ends as one run would', async () => {
    const whole = tempDir();
    manyFiles(whole, 150);
    expect((await engineFor(whole, config).run(ingestOnly))[0]!.action).toBe('ran');

    const dir = tempDir();
    manyFiles(dir, 150);
    const stop = new AbortController();
    const lines: string[] = [];
    // Stopped as the 40th file is done, as Ctrl+C would (the CLI aborts the run's signal).
    lines.push = (...more: string[]) => {
      const n = Array.prototype.push.apply(lines, more);
      if (eventCount(lines, 'ingested') >= 40) stop.abort();
      return n;
    };
    const first = await engineFor(dir, config, {}, lines).run({ ...ingestOnly, signal: stop.signal });
    expect(first[0]!.action).toBe('interrupted');
    expect(first[0]!.error).toMatch(
      /stopped before reading .*f00\d\d\.jsonl; the \d+ file\(s\) read before it are kept/,
    );
    const readFirst = eventCount(lines, 'ingested');
    expect(readFirst).toBeGreaterThanOrEqual(40);
    expect(readFirst).toBeLessThan(150);

    const again: string[] = [];
    expect((await engineFor(dir, config, {}, again).run(ingestOnly))[0]!.action).toBe('ran');
    // Only the files the first run had not finished are read; the ones it had are linked.
    expect(again.join('')).toMatch(new RegExp(`went on from a run that failed.*"files":${readFirst}\\b`));
    expect(eventCount(again, 'ingested')).toBe(150 - readFirst);
    expect(ingestFolder(dir)).toEqual(ingestFolder(whole));
    expect(manifest(dir, 'ingest').counts).toEqual(manifest(whole, 'ingest').counts);
    // The kept work is gone once the stage has it.
    expect(existsSync(join(dir, 'workspace', '.cache', 'ingest', 'kept'))).toBe(false);
  });

  it('reads no file again when a run failed on ingest.max_quarantined and the limit is raised', async () => {
    const strict = 'ingest:\n  inputs: [in]\n  max_quarantined: 0.01\n';
    const dir = tempDir();
    manyFiles(dir, 30);
    const first = await engineFor(dir, strict).run(ingestOnly);
    expect(first[0]!.error).toMatch(/more than ingest.max_quarantined/);
    const lines: string[] = [];
    expect((await engineFor(dir, config, {}, lines).run(ingestOnly))[0]!.action).toBe('ran');
    expect(eventCount(lines, 'ingested')).toBe(0);
    const whole = tempDir();
    manyFiles(whole, 30);
    await engineFor(whole, config).run(ingestOnly);
    expect(ingestFolder(dir)).toEqual(ingestFolder(whole));
  });

  it('reads every file again where the kept work is not the start of this run: a file added before them', async () => {
    const dir = tempDir();
    manyFiles(dir, 30);
    await engineFor(dir, 'ingest:\n  inputs: [in]\n  max_quarantined: 0.01\n').run(ingestOnly);
    // A name that sorts first: every kept segment's place in the order moves.
    writeFileSync(join(dir, 'in', 'a-first.jsonl'), jsonl([session('first', 'A', 1)]));
    const lines: string[] = [];
    expect((await engineFor(dir, config, {}, lines).run(ingestOnly))[0]!.action).toBe('ran');
    expect(eventCount(lines, 'ingested')).toBe(31);
    const whole = tempDir();
    manyFiles(whole, 30);
    writeFileSync(join(whole, 'in', 'a-first.jsonl'), jsonl([session('first', 'A', 1)]));
    await engineFor(whole, config).run(ingestOnly);
    expect(ingestFolder(dir)).toEqual(ingestFolder(whole));
  });
});

describe('ingest on lines without end', () => {
  it('quarantines a line as soon as it passes ingest.max_record_bytes and reads on at the next newline, plain or gzip', async () => {
    const dir = tempDir();
    const lines = (prefix: string) =>
      Buffer.concat([
        Buffer.from(JSON.stringify(session(`${prefix}-1`, 'A', 1)) + '\n'),
        Buffer.alloc(3_000_000, 'x'),
        Buffer.from('\n' + JSON.stringify(session(`${prefix}-2`, 'A', 0)) + '\n'),
        Buffer.alloc(2_000_000, 0), // the file ends inside it
      ]);
    writeFileSync(join(dir, 'plain.jsonl'), lines('plain'));
    // A JSON array's element has no newline to read on at: the file ends there, as a damaged one does.
    writeFileSync(
      join(dir, 'array.json'),
      `[${JSON.stringify(session('arr-1', 'B', 1))},"${'y'.repeat(3_000_000)}",${JSON.stringify(session('arr-2', 'B', 1))}]`,
    );
    writeFileSync(join(dir, 'zipped.jsonl.gz'), gzipSync(lines('gz')));
    const outcomes = await engineFor(
      dir,
      'ingest:\n  inputs: [.]\n  max_record_bytes: 30000\n  max_quarantined: 0.9\n',
    ).run(ingestOnly);
    expect(outcomes[0]!.action, outcomes[0]!.error).toBe('ran');
    expect(await ingestedIds(dir)).toEqual(['arr-1', 'gz-1', 'gz-2', 'plain-1', 'plain-2']);
    const q = await collect<QuarantineRecord>(join(dir, 'workspace', 'ingest', 'quarantine.jsonl'));
    for (const file of ['plain.jsonl', 'zipped.jsonl.gz']) {
      const mine = q.filter((r) => r.file.endsWith(file));
      expect(mine.map((r) => [r.where, r.reason.split(':')[0]])).toEqual([
        ['line 2', 'the record is 3,000,000 bytes, more than ingest.max_record_bytes (30,000)'],
        ['line 4', 'the record is 2,000,000 bytes, more than ingest.max_record_bytes (30,000)'],
      ]);
      for (const r of mine) expect(r.raw.length).toBeLessThanOrEqual(65536);
    }
    expect(q.filter((r) => r.file.endsWith('array.json')).map((r) => r.reason)).toEqual([
      expect.stringMatching(/an element of more than 30000 bytes, longer than a record may be .*not read/),
    ]);
  });

  it('holds no more than the limit and a block of a line that never ends', async () => {
    const { readLineBlocks } = await import('../../pipeline/records.ts');
    const { BufferShelf } = await import('../../pipeline/buffers.ts');
    const file = join(tempDir(), 'zeros.jsonl');
    writeFileSync(file, Buffer.concat([Buffer.alloc(96 << 20, 0x30), Buffer.from('\n{}\n')]));
    const before = process.memoryUsage().arrayBuffers;
    let most = 0;
    const seen: string[] = [];
    const limit = { bytes: 1 << 20, reason: (n: number) => `${n} bytes` };
    for await (const block of readLineBlocks(file, 1 << 20, new BufferShelf(), limit)) {
      most = Math.max(most, process.memoryUsage().arrayBuffers - before);
      if ('records' in block) seen.push(`${block.records[0].where}: ${block.records[0].error}`);
      else if ('bytes' in block) seen.push(Buffer.from(block.bytes).toString().trim());
    }
    expect(seen).toEqual([`line 1: ${96 << 20} bytes`, '{}']);
    // The 96 MiB line was never held: what the reader held stayed within a few MiB.
    expect(most).toBeLessThan(16 << 20);
  });
});

describe('ingest on inputs that are not files', () => {
  it('refuses a FIFO, a device or a socket by name, before opening it (a FIFO without a writer would wait for ever)', () => {
    const dir = tempDir();
    const fifo = join(dir, 'stream.jsonl');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    for (const [input, kind] of [
      [fifo, 'a FIFO'],
      ['/dev/zero', 'a character device'],
    ] as const) {
      const config = join(dir, 'c.yaml');
      writeFileSync(config, `ingest:\n  inputs: [${input}]\n`);
      const started = Date.now();
      const r = prefab(['--workdir', join(dir, `w${kind.length}`), '--config', config, 'run', '--until', 'ingest']);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`'${input}' is ${kind}`);
      expect(Date.now() - started).toBeLessThan(30_000);
    }
  });
});
