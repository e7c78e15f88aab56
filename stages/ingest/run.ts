// The ingest stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { copyFile, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { hashJson, sha256File } from '../../pipeline/hash.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import type { QuarantineRecord } from '../../pipeline/records.ts';
import { readIngestIndex, type IngestIndex, type IngestedFile } from '../layout.ts';
import { SessionIdSet } from './id-set.ts';
import { copyHead, dropKeptWork, keepWork, keptWork, linkSegment } from './kept-work.ts';
import { DUPLICATES_LISTED, ingestFiles, readSegmentIds, type FinishedFile, type ReadingOptions } from './segment.ts';

import type { ExternalFile, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

const INDEX_FORMAT = 2;

async function writeJson(path: string, value: unknown): Promise<void> {
  await writeFile(path, JSON.stringify(value, null, 2) + '\n');
}

export async function run({
  config: cfg,
  configDir,
  out,
  previous,
  external: given,
  cache,
  log,
  signal,
  options,
}: StageContext<Config>): Promise<StageReport> {
  const toolsPath = cfg.tools === null ? null : resolve(configDir, cfg.tools);
  const toolsFile = given.find((f) => f.path === toolsPath) ?? null;
  const external = given.filter((f) => f !== toolsFile);
  const tools = toolsFile ? await readTools(toolsFile.path, toolsFile.name) : null;
  // The index format is part of it: an index written by an older ingest is not reused.
  const readingHash = hashJson({
    tools: toolsFile?.xxh64 ?? null,
    index: INDEX_FORMAT,
    format: cfg.format,
    mapping: cfg.mapping,
    message: cfg.message,
    reward: cfg.out_of_range_reward,
  });
  const stored = previous ? await readIngestIndex(previous) : null;
  const prior = stored && (await knownByXxh64(stored, external));
  const reuse = prior?.reading_hash === readingHash;
  if (prior && !reuse)
    log.warn(
      'the way records are read changed (mapping, format or reward policy): every present file is ingested again',
    );

  await mkdir(join(out, 'sessions'), { recursive: true });
  await mkdir(join(out, 'tasks'), { recursive: true });
  const files: IngestedFile[] = [];
  let ids = new SessionIdSet();
  const quarantinePath = join(out, 'quarantine.jsonl');
  if (reuse && previous) {
    // Earlier segments are immutable: hard links cost nothing. The quarantine is appended to, so it is copied.
    for (const f of prior.files) {
      await linkSegment(previous, out, f.segment);
      files.push(f);
    }
    await copyFile(join(previous, 'quarantine.jsonl'), quarantinePath);
    ids = await SessionIdSet.load(join(previous, 'ids.bin'));
  } else if (prior && previous) {
    const present = new Set(external.map((f) => f.xxh64));
    const orphans = prior.files.filter((f) => !present.has(f.xxh64));
    for (const f of orphans) {
      // Its source file is gone, so it cannot be read again: keep the sessions as they were made.
      log.warn('kept a segment whose source file is gone, as read with the earlier settings', {
        file: f.name,
        sessions: f.sessions,
      });
      await linkSegment(previous, out, f.segment);
      files.push(f);
      for await (const s of readSegmentIds(join(previous, 'sessions', f.segment))) ids.add(s);
    }
  }

  // A file whose content was ingested before, or comes earlier in this run, is skipped.
  const known = new Map(files.map((f) => [f.xxh64, f.name]));
  const reasons = new Map<string, number>();
  let skipped = 0;
  const toRead: { file: ExternalFile; seq: number }[] = [];
  for (const file of external) {
    const seen = known.get(file.xxh64);
    if (seen === undefined) {
      known.set(file.xxh64, file.name);
      toRead.push({ file, seq: files.length + toRead.length });
      continue;
    }
    skipped++;
    if (seen !== file.name)
      log.info('skipped a file with the same content as one already ingested', { file: file.name, same_as: seen });
  }
  // The files a run that failed had read (kept-work.ts) are linked, not read again, where this run would make
  // them the same: the same reading, the same earlier ingest and files before them, the same first files.
  const keptKey = hashJson({ reading: readingHash, previous: stored, before: files.map((f) => f.segment) });
  const kept = await keptWork(cache, keptKey, toRead);
  const finished: FinishedFile[] = [];
  if (kept) {
    for (const f of kept.files) {
      await linkSegment(kept.dir, out, f.file.segment);
      for await (const s of readSegmentIds(join(out, 'sessions', f.file.segment))) ids.add(s);
      for (const [kind, n] of f.reasons ?? []) reasons.set(kind, (reasons.get(kind) ?? 0) + n);
      finished.push(f);
    }
    await copyHead(join(kept.dir, 'quarantine.jsonl'), quarantinePath, kept.files.at(-1)!.quarantineBytes);
    log.info('went on from a run that failed: its files read before the failure are linked, not read again', {
      files: kept.files.length,
      sessions: kept.files.reduce((n, f) => n + f.file.sessions, 0),
    });
  }
  const quarantineStart = await stat(quarantinePath).then(
    (s) => s.size,
    () => 0,
  );
  const quarantine = new JsonlWriter(quarantinePath, 'a');
  const keep = async () => {
    try {
      await keepWork({ cache, key: keptKey, out, quarantinePath, finished, log });
    } catch (error) {
      log.warn('could not keep the work of the files read before the failure: the next run reads them again', {
        error: (error as Error).message,
      });
    }
  };

  const reading = readingOptionsOf(cfg, tools);
  let added = 0;
  let quarantined = 0;
  let duplicates = 0;
  const broken: string[] = [];
  // A test's smaller heap for the thread that reads a Parquet file.
  const parquetHeapMb = typeof options.parquetHeapMb === 'number' ? options.parquetHeapMb : undefined;
  let results: IngestedFile[];
  try {
    // The kept files first; ingestFiles adds the files it finishes to `finished` (kept should a later one fail).
    const resumed = finished.map((f) => f.file);
    const { workers } = options;
    const target = { out, ids, quarantine, quarantineStart, reasons, log, signal, finished, workers, parquetHeapMb };
    results = [...resumed, ...(await ingestFiles(toRead.slice(resumed.length), reading, target))];
  } catch (error) {
    // The stage failed: its folder is discarded, the files it finished kept for the next run. The quarantine
    // is closed whole first (what is kept of it is read from disk); failing that (a full disk), nothing is kept.
    await quarantine.close().then(keep, () => quarantine.abort());
    throw error;
  }
  for (const result of results) {
    if (result.duplicates > DUPLICATES_LISTED)
      await quarantine.write({
        file: result.name,
        where: 'after the duplicates listed',
        reason: `${result.duplicates - DUPLICATES_LISTED} more duplicate session ids (dropped; counted, not listed: a file's first ${DUPLICATES_LISTED} are)`,
        raw: '',
      } satisfies QuarantineRecord);
    files.push(result);
    added += result.sessions;
    quarantined += result.quarantined;
    duplicates += result.duplicates;
    if (result.damaged) broken.push(`${result.name}: ${result.damaged}`);
  }
  await quarantine.close();
  // Duplicates are not counted: a file delivered twice is a normal night.
  const read = added + quarantined;
  if (read > 0 && quarantined / read > cfg.max_quarantined) {
    await keep(); // a rerun with the limit raised reads nothing again
    const common = [...reasons]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 3)
      .map(([r, n]) => `${n} × ${r}`)
      .join('; ');
    // A damaged file's reason is its own (a .gz cut short, a Parquet row group too large for memory), told
    // whole and not among the common ones.
    const told = [
      common && ` the most common reasons: ${common}.`,
      broken.length > 0 && ` Damaged: ${broken.join('; ')}.`,
    ]
      .filter(Boolean)
      .join('');
    throw new PipelineError(
      `ingest: ${quarantined} of ${read} new records (${Math.round((100 * quarantined) / read)}%) were quarantined, more than ingest.max_quarantined (${cfg.max_quarantined});${told} Check ingest.mapping against the input, or raise ingest.max_quarantined`,
    );
  }
  await ids.save(join(out, 'ids.bin'));
  const index: IngestIndex = { reading_hash: readingHash, files };
  await writeJson(join(out, 'index.json'), index);
  await dropKeptWork(cache);

  const total = files.reduce((n, f) => n + f.sessions, 0);
  const newFiles = files.length - (reuse ? prior!.files.length : 0);
  const fresh = files.slice(files.length - newFiles);
  const damaged = fresh.filter((f) => f.damaged).length;
  const invalidUtf8 = fresh.reduce((n, f) => n + (f.invalid_utf8 ?? 0), 0);
  return {
    counts: {
      sessions: total,
      new_sessions: added,
      quarantined,
      duplicates,
      files: files.length,
      files_skipped: skipped,
      files_damaged: damaged,
      invalid_utf8: invalidUtf8,
    },
    summary:
      `${added} new sessions from ${newFiles} file(s) (${skipped} already ingested), ` +
      `${quarantined} quarantined, ${duplicates} duplicates dropped; ${total} sessions in all` +
      (damaged ? `; ${damaged} damaged file(s) read up to the damage (quarantine.jsonl says where)` : '') +
      (invalidUtf8 ? `; ${invalidUtf8} record(s) with bytes that are not UTF-8` : ''),
  };
}

/**
 * An index written before ingest knew files by XXH64 holds their SHA-256: each such entry takes the XXH64 of
 * the present input file with that SHA-256 (so a file ingested before is still skipped), or, its file gone,
 * `sha256:<hex>`, which no file's XXH64 matches (its segment is kept, as every segment whose file is gone).
 * Only such an index has the input files read for their SHA-256, once.
 */
/** How records are read and mapped under `cfg`, with ingest.tools's list (readTools). */
function readingOptionsOf(cfg: Config, tools: unknown[] | null): ReadingOptions {
  return {
    format: cfg.format,
    mapping: { fields: cfg.mapping, message: cfg.message, outOfRangeReward: cfg.out_of_range_reward, tools },
    maxRecordBytes: cfg.max_record_bytes,
  };
}

/** How records are read under `cfg` (a config in `configDir`), its tools file read: what `prefab preview inputs` maps with. */
export async function readingOptions(cfg: Config, configDir: string): Promise<ReadingOptions> {
  return readingOptionsOf(cfg, cfg.tools === null ? null : await readTools(resolve(configDir, cfg.tools), cfg.tools));
}

/** ingest.tools's file: an OpenAI `tools` list, each a function with a name; an error names the file and the tool. */
async function readTools(path: string, name: string): Promise<unknown[]> {
  let tools: unknown;
  try {
    tools = JSON.parse(await readFile(path, 'utf8'));
  } catch (error) {
    throw new PipelineError(`${name} (ingest.tools): not JSON (${(error as Error).message})`);
  }
  const bad = Array.isArray(tools)
    ? tools.findIndex((t) => typeof (t as { function?: { name?: unknown } })?.function?.name !== 'string')
    : -1;
  if (!Array.isArray(tools) || bad >= 0)
    throw new PipelineError(
      `${name} (ingest.tools): expected an OpenAI tools list, [{"type": "function", "function": {"name": ..., "parameters": {...}}}, ...]${bad >= 0 ? `; tool ${bad + 1} has no function.name` : ''}`,
    );
  return tools;
}

async function knownByXxh64(index: IngestIndex, external: ExternalFile[]): Promise<IngestIndex> {
  if (index.files.every((f) => f.xxh64)) return index;
  const bySha256 = new Map<string, ExternalFile>();
  for (const file of external) bySha256.set(await sha256File(file.path, file.bytes), file);
  const files: IngestedFile[] = [];
  for (const { sha256, ...f } of index.files) {
    const file = f.xxh64 ? null : bySha256.get(sha256!);
    files.push({ ...f, xxh64: f.xxh64 || (file ? file.xxh64 : `sha256:${sha256}`) });
  }
  return { ...index, files };
}
