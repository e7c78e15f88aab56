// ingest: logged sessions (JSONL, JSON array, Parquet; files, folders, globs) → validated Session segments.
// Incremental: a file whose content was ingested before is skipped, a new one becomes a new segment.
import { copyFile, link, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { readIngestIndex, type IngestIndex, type IngestedFile } from '../layout.ts';
import { SessionIdSet } from './id-set.ts';
import { resolveInputs } from '../../pipeline/inputs.ts';
import { ingestFile, readSegmentIds } from './segment.ts';

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
  max_record_bytes: z.number().int().min(1024).default(16_000_000).describe('A record longer than this (its text, in bytes) is quarantined with its size instead of read.'),
  max_quarantined: z.number().min(0).max(1).default(0.5).describe("The share of a run's new records that may be quarantined: above it the stage fails (exit 1) and says why, so a scheduler sees that the input went wrong instead of getting empty exports."),
  out_of_range_reward: z.enum(['reject', 'clamp']).default('reject').describe('What to do with a reward outside [0, 1]: reject quarantines the record, clamp moves the reward to the nearer bound.'),
});

const INDEX_FORMAT = 2;

export const ingest = defineStage({
  name: 'ingest',
  description: 'read logged sessions, validate them, quarantine bad records, drop duplicates',
  version: 2,
  inputs: [],
  outputs: ['sessions', 'quarantine.jsonl', 'index.json', 'ids.bin'],
  config,
  external: (cfg, configDir) => resolveInputs(cfg.inputs, configDir),

  async run({ config: cfg, out, previous, external, log, signal }) {
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
    const reasons = new Map<string, number>();
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
      const result = await ingestFile(file, { format: cfg.format, mapping: { fields: cfg.mapping, message: cfg.message, outOfRangeReward: cfg.out_of_range_reward }, maxRecordBytes: cfg.max_record_bytes }, join(out, 'sessions'), files.length, ids, quarantine, reasons, log, signal);
      files.push(result);
      known.set(file.sha256, result);
      added += result.sessions;
      quarantined += result.quarantined;
      duplicates += result.duplicates;
    }
    await quarantine.close();
    // Duplicates are not counted: a file delivered twice is a normal night.
    const read = added + quarantined;
    if (read > 0 && quarantined / read > cfg.max_quarantined) {
      const common = [...reasons].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([r, n]) => `${n} × ${r}`).join('; ');
      throw new PipelineError(`ingest: ${quarantined} of ${read} new records (${Math.round((100 * quarantined) / read)}%) were quarantined, more than ingest.max_quarantined (${cfg.max_quarantined}); the most common reasons: ${common}. Check ingest.mapping against the input, or raise ingest.max_quarantined`);
    }
    await ids.save(join(out, 'ids.bin'));
    const index: IngestIndex = { reading_hash: readingHash, files };
    await writeJson(join(out, 'index.json'), index);

    const total = files.reduce((n, f) => n + f.sessions, 0);
    const newFiles = files.length - (reuse ? prior!.files.length : 0);
    const fresh = files.slice(files.length - newFiles);
    const damaged = fresh.filter((f) => f.damaged).length;
    const invalidUtf8 = fresh.reduce((n, f) => n + (f.invalid_utf8 ?? 0), 0);
    return {
      counts: { sessions: total, new_sessions: added, quarantined, duplicates, files: files.length, files_skipped: skipped, files_damaged: damaged, invalid_utf8: invalidUtf8 },
      summary:
        `${added} new sessions from ${newFiles} file(s) (${skipped} already ingested), ` +
        `${quarantined} quarantined, ${duplicates} duplicates dropped; ${total} sessions in all` +
        (damaged ? `; ${damaged} damaged file(s) read up to the damage (quarantine.jsonl says where)` : '') +
        (invalidUtf8 ? `; ${invalidUtf8} record(s) with bytes that are not UTF-8` : ''),
    };
  },
});

async function writeJson(path: string, value: unknown): Promise<void> {
  await writeFile(path, JSON.stringify(value, null, 2) + '\n');
}
