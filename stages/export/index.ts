// export: the sessions table and the SFT, preference-pair and KTO datasets as Parquet, each with a card.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { ParquetTableWriter, type Column, type Compression } from '../../pipeline/parquet.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { KtoRow, Pair, SftRow, Split, SplitSession } from '../../core/records.ts';
import { SPLITS, bucketFile, readSplitInfo } from '../layout.ts';
import { Redactor, redactionConfig } from '../../core/redact.ts';
import { datasetCard } from './card.ts';
import { KTO_COLUMNS, PAIR_COLUMNS, SESSION_COLUMNS, SFT_COLUMNS } from './schema.ts';

const config = z.strictObject({
  sft_min_reward: z.number().min(0).max(1).default(0.7).describe('Sessions with at least this reward are SFT examples.'),
  kto_desirable_min: z.number().min(0).max(1).default(0.7).describe('KTO: a session with at least this reward is a desirable row; sessions between the two thresholds are left out.'),
  kto_undesirable_max: z.number().min(0).max(1).default(0.3).describe('KTO: a session with at most this reward is an undesirable row; sessions between the two thresholds are left out.'),
  row_group_size: z.number().int().min(1).default(1000).describe('Parquet rows per row group: the unit a reader loads at once.'),
  redaction: redactionConfig.extend({ enabled: z.boolean().default(false).describe('Off by default: the datasets keep the values as logged.') }).prefault({}).describe("Mask personal data in every exported text (messages, feedback, metadata), as before a judge's request; off by default."),
  compression: z.enum(['snappy', 'gzip', 'uncompressed']).default('snappy').describe('Parquet compression: snappy is fast, gzip smaller.'),
});
type ExportConfig = z.infer<typeof config>;

const DATASETS = ['sessions', 'sft', 'pairs', 'kto'] as const;

/** KTO's unpaired form: the messages before the first assistant turn are the prompt, the rest the completion. */
function ktoRow(s: SplitSession, label: boolean): KtoRow | null {
  const first = s.messages.findIndex((m) => m.role === 'assistant');
  if (first < 0) return null;
  return { prompt: s.messages.slice(0, first), completion: s.messages.slice(first), label, session_id: s.session_id, task_id: s.task_id, reward: s.reward };
}

type Writers = Record<Split, ParquetTableWriter<object>>;

function maskSession(s: SplitSession, r: Redactor): SplitSession {
  return { ...s, messages: r.messages(s.messages), feedback: s.feedback === null ? null : r.text(s.feedback), metadata: r.text(s.metadata) };
}

function maskPair(p: Pair, r: Redactor): Pair {
  return { ...p, prompt: r.messages(p.prompt), chosen: r.messages(p.chosen), rejected: r.messages(p.rejected) };
}

async function openPair(dir: string, columns: Record<string, Column>, cfg: ExportConfig): Promise<Writers> {
  await mkdir(dir, { recursive: true });
  const options = { rowGroupSize: cfg.row_group_size, compression: cfg.compression as Compression };
  return {
    train: await ParquetTableWriter.open(join(dir, 'train.parquet'), columns, options),
    test: await ParquetTableWriter.open(join(dir, 'test.parquet'), columns, options),
  };
}

export const exportStage = defineStage({
  name: 'export',
  description: 'write sessions, SFT, pairs and KTO datasets as Parquet with dataset cards',
  version: 2,
  inputs: ['split', 'gate'],
  outputs: [...DATASETS],
  config,

  async run({ config: cfg, out, input, lineage, log }) {
    const splitDir = input('split');
    const info = await readSplitInfo(splitDir);
    const r = cfg.redaction;
    // One Redactor per row: placeholders are consistent within a row and say nothing across rows.
    const mask = r.enabled ? () => new Redactor({ kinds: r.kinds, keys: r.keys }) : null;
    const w = {
      sessions: await openPair(join(out, 'sessions'), SESSION_COLUMNS, cfg),
      sft: await openPair(join(out, 'sft'), SFT_COLUMNS, cfg),
      pairs: await openPair(join(out, 'pairs'), PAIR_COLUMNS, cfg),
      kto: await openPair(join(out, 'kto'), KTO_COLUMNS, cfg),
    };
    let ktoSkipped = 0;
    for (const side of SPLITS) {
      const progress = log.progress(`export ${side} sessions`, info.buckets);
      for (let b = 0; b < info.buckets; b++) {
        for await (const logged of readJsonl<SplitSession>(bucketFile(splitDir, side, b))) {
          const s = mask ? maskSession(logged, mask()) : logged;
          await w.sessions[side].append(s);
          if (s.reward >= cfg.sft_min_reward) {
            await w.sft[side].append({ messages: s.messages, session_id: s.session_id, task_id: s.task_id, reward: s.reward } satisfies SftRow);
          }
          const label = s.reward >= cfg.kto_desirable_min ? true : s.reward <= cfg.kto_undesirable_max ? false : null;
          if (label !== null) {
            const row = ktoRow(s, label);
            if (row) await w.kto[side].append(row);
            else ktoSkipped++;
          }
        }
        progress.tick();
      }
      progress.done();
      for await (const pair of readJsonl<Pair>(join(input('gate'), `${side}.jsonl`))) await w.pairs[side].append(mask ? maskPair(pair, mask()) : pair);
    }
    const counts: Record<string, number> = {};
    for (const name of DATASETS) {
      for (const side of SPLITS) {
        await w[name][side].close();
        counts[`${name}_${side}`] = w[name][side].rows;
      }
    }

    const configHash = hashJson([...lineage.map((l) => l.config_hash), hashJson(cfg)]);
    const madeAt = new Date().toISOString();
    const cards: Record<(typeof DATASETS)[number], { title: string; purpose: string; howMade: string[]; columns: Record<string, Column> }> = {
      sessions: {
        title: 'sessions',
        purpose: 'Every ingested session, validated, with the side of the split its task is on.',
        howMade: ['ingest: records mapped to the Session contract; bad records quarantined; duplicates by session_id dropped.', 'split: tasks held out by a stable hash of task_id; sessions without task_id grouped by request similarity (`task_match`).'],
        columns: SESSION_COLUMNS,
      },
      sft: {
        title: 'SFT',
        purpose: 'Successful sessions for supervised fine-tuning (TRL SFTTrainer, conversational `messages`). Train on assistant turns only.',
        howMade: [`Sessions with reward ≥ ${cfg.sft_min_reward}.`],
        columns: SFT_COLUMNS,
      },
      pairs: {
        title: 'preference pairs',
        purpose: "Preference pairs in TRL's conversational explicit-prompt format (`prompt`, `chosen`, `rejected`) for DPOTrainer and friends, with provenance columns.",
        howMade: [
          'outcome: within a task, successes against failures; `prompt` is the longest common prefix of the two sessions\' messages, `chosen`/`rejected` the rest of each; margin = reward gap.',
          'best_of_n: among a task\'s candidates (logged trials, and sampled ones when the sample stage is on) the judges pick the best; best against each other candidate.',
          'hard_negative: one assistant turn of a successful session (`chosen`) against a worse version of it (`rejected`, of type `negative_type`: refusal, hallucination, off_topic, format, verbose, under_explained); `prompt` is everything before that turn.',
          `Every pair was judged (verifier, rules, and an LLM judge when configured; column \`judge\` says which decided) and kept by the gate only when the judges confirm the chosen side; \`confidence\` is theirs.`,
        ],
        columns: PAIR_COLUMNS,
      },
      kto: {
        title: 'KTO',
        purpose: "Unpaired labelled completions for TRL's KTOTrainer (`prompt`, `completion`, `label`).",
        howMade: [`prompt: the messages before the first assistant turn; completion: the rest. label true at reward ≥ ${cfg.kto_desirable_min}, false at reward ≤ ${cfg.kto_undesirable_max}; sessions between are left out.`],
        columns: KTO_COLUMNS,
      },
    };
    if (r.enabled) for (const c of Object.values(cards)) c.howMade.push(`Personal data (${r.kinds.join(', ')}; keys ${r.keys.join(', ')}) masked with per-row placeholders such as [PHONE_1].`);
    for (const name of DATASETS) {
      const c = cards[name];
      const card = datasetCard({ name, ...c, counts: { train: counts[`${name}_train`]!, test: counts[`${name}_test`]! }, configHash, lineage, madeAt });
      await writeFile(join(out, name, 'README.md'), card);
    }
    return {
      counts: { ...counts, kto_without_assistant: ktoSkipped },
      summary: DATASETS.map((d) => `${d} ${counts[`${d}_train`]}/${counts[`${d}_test`]}`).join(', ') + ' rows (train/test)',
    };
  },
});
