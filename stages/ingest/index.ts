// ingest: logged sessions (JSONL, JSON array, Parquet; files, folders, globs) → validated Session segments.
// Incremental: a file whose content was ingested before is skipped, a new one becomes a new segment.
import { resolve } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { resolveInputs } from '../../pipeline/inputs.ts';

const roleSchema = z.enum(['system', 'user', 'assistant', 'tool']);

const config = z.strictObject({
  inputs: z
    .array(z.string())
    .default(['../data/sample'])
    .describe(
      'Files, folders (read recursively) or globs, relative to the config file. Empty: no sessions (a run of imported pairs only).',
    ),
  format: z
    .enum(['auto', 'jsonl', 'json', 'parquet'])
    .default('auto')
    .describe(
      'auto: each file by its extension (.jsonl or .ndjson, .json, .parquet); otherwise every file is read as this format (json: one array of records).',
    ),
  mapping: z
    .strictObject({
      session_id: z
        .string()
        .optional()
        .describe(
          'Dotted path of the session id, or a template of input fields such as "{task_id}-{trial}"; unset: the field session_id. A record without one gets an id hashed from its content.',
        ),
      task_id: z
        .string()
        .optional()
        .describe(
          'Dotted path of the task id; unset: the field task_id. A session without one is grouped with similar sessions by the split stage.',
        ),
      messages: z.string().default('messages').describe('Dotted path of the messages (traj, data.turns).'),
      reward: z
        .string()
        .default('reward')
        .describe('Dotted path of the reward: a number in [0, 1], or a boolean. A record without one is quarantined.'),
      feedback: z.string().default('feedback').describe("Dotted path of the session's feedback text, if any."),
      model: z.string().default('model').describe("Dotted path of the agent's model name, if any."),
      created_at: z
        .string()
        .default('created_at')
        .describe('Dotted path of the creation time: an ISO date, or epoch seconds or milliseconds.'),
    })
    .prefault({})
    .describe('Where each field of a session is found in an input record; fields not mapped stay in the metadata.'),
  message: z
    .strictObject({
      role: z.string().default('role').describe("The key of a message's role (from for ShareGPT)."),
      content: z.string().default('content').describe("The key of a message's text (value for ShareGPT)."),
      roles: z
        .record(z.string(), roleSchema)
        .default({})
        .describe(
          "Role names mapped to OpenAI's, e.g. {human: user, gpt: assistant}; a role left unmapped must already be one of OpenAI's.",
        ),
    })
    .prefault({})
    .describe("How the messages of an input record are read into OpenAI's chat format."),
  tools: z
    .string()
    .nullable()
    .default(null)
    .describe(
      "A JSON file (relative to this file) of the agent's tools as an OpenAI `tools` list, for logs that do not carry them (tau-bench's, most trace exports): every session whose record has no `tools` of its own gets these in its metadata, where the export's `tools` column, the hard negatives and the rules judge find them. null: each record's own, if any.",
    ),
  max_record_bytes: z
    .number()
    .int()
    .min(1024)
    .default(16_000_000)
    .describe(
      "A record longer than this (its text, in bytes) is quarantined with its size instead of read. A JSONL line is cut off as soon as it passes the limit (its first 64 KiB kept in the quarantine) and reading goes on at its newline, so a line without end cannot grow ingest's memory; a JSON array's element that long ends the file there, as damage does.",
    ),
  max_quarantined: z
    .number()
    .min(0)
    .max(1)
    .default(0.5)
    .describe(
      "The share of a run's new records that may be quarantined: above it the stage fails (exit 1) and says why, so a scheduler sees that the input went wrong instead of getting empty exports.",
    ),
  out_of_range_reward: z
    .enum(['reject', 'clamp'])
    .default('reject')
    .describe(
      'What to do with a reward outside [0, 1]: reject quarantines the record, clamp moves the reward to the nearer bound.',
    ),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const ingest = defineStage({
  name: 'ingest',
  description: 'read logged sessions, validate them, quarantine bad records, drop duplicates',
  version: 3,
  inputs: [],
  outputs: ['sessions', 'tasks', 'quarantine.jsonl', 'index.json', 'ids.bin'],
  config,
  // The tools file is read beside the inputs, so that a change to it makes the stage stale.
  external: async (cfg, configDir, log) => [
    ...(await resolveInputs(cfg.inputs, configDir, { log })),
    ...(cfg.tools === null ? [] : [resolve(configDir, cfg.tools)]),
  ],

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  // Every shard reads every input: which records are duplicates is decided over all of them.
  shard: 'whole',
});
