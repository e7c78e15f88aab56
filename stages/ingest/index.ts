// ingest: logged sessions (JSONL, JSON array, Parquet; files, folders, globs) → validated Session segments.
// Incremental: a file whose content was ingested before is skipped, a new one becomes a new segment.
import { existsSync, statSync } from 'node:fs';
import { copyFile, link, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { glob } from 'tinyglobby';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import type { Logger } from '../../pipeline/log.ts';
import { defineStage, type ExternalFile } from '../../pipeline/stage.ts';
import { UsageError } from '../../pipeline/errors.ts';
import { readIngestIndex, type IngestIndex, type IngestedFile } from '../layout.ts';
import { SessionIdSet } from './id-set.ts';
import { RecordError, toSession, type MappingOptions } from './mapping.ts';
import { detectFormat, readRecords, type InputFormat } from './readers.ts';

const roleSchema = z.enum(['system', 'user', 'assistant', 'tool']);

const config = z.strictObject({
  inputs: z.array(z.string()).min(1).default(['../data/sample']).describe('Files, folders (read recursively) or globs, relative to the config file.'),
  format: z.enum(['auto', 'jsonl', 'json', 'parquet']).default('auto').describe('auto: each file by its extension (.jsonl or .ndjson, .json, .parquet); otherwise every file is read as this format (json: one array of records).'),
  mapping: z
    .strictObject({
      session_id: z.string().optional().describe('Dotted path of the session id, or a template of input fields such as "{task_id}-{trial}"; unset: the field session_id. A record without one gets an id hashed from its content.'),
      task_id: z.string().optional().describe('Dotted path of the task id; unset: the field task_id. A session without one is grouped with similar sessions by the split stage.'),
      messages: z.string().default('messages').describe('Dotted path of the messages (traj, data.turns).'),
      reward: z.string().default('reward').describe('Dotted path of the reward: a number in [0, 1], or a boolean. A record without one is quarantined.'),
      feedback: z.string().default('feedback').describe("Dotted path of the session's feedback text, if any."),
      model: z.string().default('model').describe("Dotted path of the agent's model name, if any."),
      created_at: z.string().default('created_at').describe('Dotted path of the creation time: an ISO date, or epoch seconds or milliseconds.'),
    })
    .prefault({}).describe('Where each field of a session is found in an input record; fields not mapped stay in the metadata.'),
  message: z
    .strictObject({
      role: z.string().default('role').describe("The key of a message's role (from for ShareGPT)."),
      content: z.string().default('content').describe("The key of a message's text (value for ShareGPT)."),
      roles: z.record(z.string(), roleSchema).default({}).describe("Role names mapped to OpenAI's, e.g. {human: user, gpt: assistant}; a role left unmapped must already be one of OpenAI's."),
    })
    .prefault({}).describe("How the messages of an input record are read into OpenAI's chat format."),
  out_of_range_reward: z.enum(['reject', 'clamp']).default('reject').describe('What to do with a reward outside [0, 1]: reject quarantines the record, clamp moves the reward to the nearer bound.'),
});
type IngestConfig = z.infer<typeof config>;

export interface QuarantineRecord {
  file: string;
  where: string;
  reason: string;
  raw: string;
}

const INDEX_FORMAT = 2;

const INPUT_EXTENSIONS = /\.(jsonl|ndjson|json|parquet)(\.gz)?$/i;

async function resolveInputs(cfg: IngestConfig, configDir: string): Promise<string[]> {
  const files = new Set<string>();
  for (const input of cfg.inputs) {
    const path = resolve(configDir, input);
    let matched: string[];
    if (existsSync(path) && statSync(path).isDirectory()) {
      matched = (await glob('**/*', { cwd: path, absolute: true, onlyFiles: true })).filter((f) => INPUT_EXTENSIONS.test(f));
    } else if (existsSync(path)) {
      matched = [path];
    } else {
      matched = await glob(input, { cwd: configDir, absolute: true, onlyFiles: true });
      if (matched.length === 0) throw new UsageError(`ingest.inputs: '${input}' matches no file (paths are relative to the config file's folder, ${configDir})`);
    }
    for (const f of matched) files.add(f);
  }
  return [...files].sort();
}

function mappingOptions(cfg: IngestConfig): MappingOptions {
  return { fields: cfg.mapping, message: cfg.message, outOfRangeReward: cfg.out_of_range_reward };
}

export const ingest = defineStage({
  name: 'ingest',
  description: 'read logged sessions, validate them, quarantine bad records, drop duplicates',
  version: 2,
  inputs: [],
  outputs: ['sessions', 'quarantine.jsonl', 'index.json', 'ids.bin'],
  config,
  external: resolveInputs,

  async run({ config: cfg, out, previous, external, log }) {
    // The index format is part of it: an index written by an older ingest is not reused.
    const readingHash = hashJson({ index: INDEX_FORMAT, format: cfg.format, mapping: cfg.mapping, message: cfg.message, reward: cfg.out_of_range_reward });
    const prior = previous ? await readIngestIndex(previous) : null;
    const reuse = prior?.reading_hash === readingHash;
    if (prior && !reuse) log.warn('the way records are read changed (mapping, format or reward policy): every present file is ingested again');

    await mkdir(join(out, 'sessions'), { recursive: true });
    const files: IngestedFile[] = [];
    let ids = new SessionIdSet();
    const quarantinePath = join(out, 'quarantine.jsonl');
    if (reuse && previous) {
      // Earlier segments are immutable: hard links cost nothing. The quarantine is appended to, so it is copied.
      for (const f of prior.files) {
        await link(join(previous, 'sessions', f.segment), join(out, 'sessions', f.segment));
        files.push(f);
      }
      await copyFile(join(previous, 'quarantine.jsonl'), quarantinePath);
      ids = await SessionIdSet.load(join(previous, 'ids.bin'));
    } else if (prior && previous) {
      const present = new Set(external.map((f) => f.sha256));
      const orphans = prior.files.filter((f) => !present.has(f.sha256));
      for (const f of orphans) {
        // Its source file is gone, so it cannot be read again: keep the sessions as they were made.
        log.warn('kept a segment whose source file is gone, as read with the earlier settings', { file: f.name, sessions: f.sessions });
        await link(join(previous, 'sessions', f.segment), join(out, 'sessions', f.segment));
        files.push(f);
        for await (const s of readSegmentIds(join(previous, 'sessions', f.segment))) ids.add(s);
      }
    }
    const quarantine = new JsonlWriter(quarantinePath, 'a');

    const known = new Map(files.map((f) => [f.sha256, f]));
    let added = 0;
    let quarantined = 0;
    let duplicates = 0;
    let skipped = 0;
    for (const file of external) {
      const seen = known.get(file.sha256);
      if (seen) {
        skipped++;
        if (seen.name !== file.name) log.info('skipped a file with the same content as one already ingested', { file: file.name, same_as: seen.name });
        continue;
      }
      const result = await ingestFile(file, cfg, out, files.length, ids, quarantine, log);
      files.push(result);
      known.set(file.sha256, result);
      added += result.sessions;
      quarantined += result.quarantined;
      duplicates += result.duplicates;
    }
    await quarantine.close();
    await ids.save(join(out, 'ids.bin'));
    const index: IngestIndex = { reading_hash: readingHash, files };
    await writeJson(join(out, 'index.json'), index);

    const total = files.reduce((n, f) => n + f.sessions, 0);
    const newFiles = files.length - (reuse ? prior!.files.length : 0);
    return {
      counts: { sessions: total, new_sessions: added, quarantined, duplicates, files: files.length, files_skipped: skipped },
      summary:
        `${added} new sessions from ${newFiles} file(s) (${skipped} already ingested), ` +
        `${quarantined} quarantined, ${duplicates} duplicates dropped; ${total} sessions in all`,
    };
  },
});

async function ingestFile(
  file: ExternalFile,
  cfg: IngestConfig,
  out: string,
  seq: number,
  ids: SessionIdSet,
  quarantine: JsonlWriter,
  log: Logger,
): Promise<IngestedFile> {
  const format: InputFormat | null = cfg.format === 'auto' ? detectFormat(file.path) : cfg.format;
  if (!format) throw new UsageError(`${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set ingest.format`);
  const segment = `${String(seq).padStart(5, '0')}-${file.sha256.slice(0, 12)}.jsonl`;
  const writer = new JsonlWriter(join(out, 'sessions', segment));
  const options = mappingOptions(cfg);
  const progress = log.progress(`ingest ${file.name}`);
  let quarantined = 0;
  let duplicates = 0;
  let untasked = 0;
  for await (const record of readRecords(file.path, format)) {
    progress.tick();
    const source = `${file.name} ${record.where}`;
    if (record.error !== undefined) {
      quarantined++;
      await quarantine.write({ file: file.name, where: record.where, reason: record.error, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    let session;
    try {
      session = toSession(record.value, source, options);
    } catch (error) {
      if (!(error instanceof RecordError)) throw error;
      quarantined++;
      await quarantine.write({ file: file.name, where: record.where, reason: error.message, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    if (!ids.add(session.session_id)) {
      duplicates++;
      await quarantine.write({ file: file.name, where: record.where, reason: `duplicate session_id '${session.session_id}' (dropped; the first one is kept)`, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    if (session.task_id === null) untasked++;
    await writer.write(session);
  }
  progress.done();
  await writer.close();
  log.info('ingested', { file: file.name, sessions: writer.count, quarantined, duplicates });
  return { name: file.name, sha256: file.sha256, segment, sessions: writer.count, untasked, quarantined, duplicates, ingested_at: new Date().toISOString() };
}

async function* readSegmentIds(path: string): AsyncGenerator<string> {
  for await (const s of readJsonl<{ session_id: string }>(path)) yield s.session_id;
}

async function writeJson(path: string, value: unknown): Promise<void> {
  await writeFile(path, JSON.stringify(value, null, 2) + '\n');
}
