// The dataset card (README.md) written beside each exported dataset: what it is for, how it was made, its
// counts, schema and lineage.
import { describeColumn, type Column } from '../../pipeline/parquet.ts';
import type { Lineage } from '../../pipeline/stage.ts';
import { DATASETS, KTO_COLUMNS, PAIR_COLUMNS, SESSION_COLUMNS, SFT_COLUMNS } from './schema.ts';

type Dataset = (typeof DATASETS)[number];

/** What a dataset's card says of it beyond its counts and lineage. */
interface CardText {
  title: string;
  purpose: string;
  howMade: string[];
  columns: Record<string, Column>;
}

/** What each dataset is for and how it was made, with the thresholds it was made with. */
export function cardTexts(cfg: {
  sft_min_reward: number;
  kto_desirable_min: number;
  kto_undesirable_max: number;
}): Record<Dataset, CardText> {
  return {
    sessions: {
      title: 'sessions',
      purpose: 'Every ingested session, validated, with the side of the split its task is on.',
      howMade: [
        'ingest: records mapped to the Session contract; bad records quarantined; duplicates by session_id dropped.',
        'split: tasks held out by a stable hash of task_id; sessions without task_id grouped by request similarity (`task_match`).',
      ],
      columns: SESSION_COLUMNS,
    },
    sft: {
      title: 'SFT',
      purpose:
        'Successful sessions for supervised fine-tuning (TRL SFTTrainer, conversational `messages`). Train on assistant turns only.',
      howMade: [`Sessions with reward ≥ ${cfg.sft_min_reward}.`],
      columns: SFT_COLUMNS,
    },
    pairs: {
      title: 'preference pairs',
      purpose: [
        "Preference pairs in TRL's conversational explicit-prompt format (`prompt`, `chosen`, `rejected`) for DPOTrainer and friends, with `tools` (the agent's tool schemas as JSON, which TRL renders into the chat template) and provenance columns.",
        "Every row is one TRL trains right as it is: `prompt` ends on a user or tool turn, and `chosen` and `rejected` each start with an assistant turn. A side may go on past that turn (an outcome pair holds the rest of each episode), and TRL trains on every token of a side, the user and tool turns inside it too; to train on assistant turns alone, use prefab's trainer, which masks them.",
        'Pairs whose trajectories part before any assistant turn are in `trajectories`, beside this folder.',
      ].join('\n\n'),
      howMade: [
        "outcome: within a task, successes against failures; `prompt` is the longest common prefix of the two sessions' messages (where it does not end on a user or tool turn before an assistant turn on both sides, cut back to the last place it does), `chosen`/`rejected` the rest of each; margin = reward gap.",
        "best_of_n: among a task's candidates (logged trials, and sampled ones when the sample stage is on) the judges pick the best; best against each other candidate.",
        'hard_negative: one assistant turn of a successful session (`chosen`) against a worse version of it (`rejected`, of type `negative_type`: refusal, hallucination, off_topic, format, verbose, under_explained); `prompt` is everything before that turn.',
        `Every pair was judged (verifier, rules, and an LLM judge when configured; column \`judge\` says which decided) and kept by the gate only when the judges confirm the chosen side; \`confidence\` is theirs.`,
      ],
      columns: PAIR_COLUMNS,
    },
    trajectories: {
      title: 'trajectory-level preference pairs',
      purpose: [
        'Two attempts at one task that part before any assistant turn (a user, or a user simulator, words the request differently in each trial): they share no context an assistant turn could be compared in. `prompt` is what they share (a system message, or nothing); `chosen` and `rejected` are the whole rest of the successful and the failed attempt, user and tool turns included.',
        "TRL's DPOTrainer does not read these right: it renders `prompt` with a generation prompt (a prompt ending on a system message fails), and trains on the user and tool turns inside each side. Train on them with prefab's trainer (the dpo stage reads this table beside `pairs`, and only assistant tokens count), or take `chosen` as demonstrations for TRL's SFTTrainer with `assistant_only_loss`.",
      ].join('\n\n'),
      howMade: [
        "outcome pairs (and any other) whose sides, as the pairs table would cut them, cannot start with an assistant turn after a user or tool turn they share; the columns are the pairs table's.",
      ],
      columns: PAIR_COLUMNS,
    },
    kto: {
      title: 'KTO',
      purpose: "Unpaired labelled completions for TRL's KTOTrainer (`prompt`, `completion`, `label`).",
      howMade: [
        `prompt: the messages before the first assistant turn; completion: the rest. label true at reward ≥ ${cfg.kto_desirable_min}, false at reward ≤ ${cfg.kto_undesirable_max}; sessions between are left out.`,
      ],
      columns: KTO_COLUMNS,
    },
  };
}

export interface CardInput {
  name: string;
  title: string;
  purpose: string;
  howMade: string[];
  counts: Record<string, number>;
  columns: Record<string, Column>;
  configHash: string;
  lineage: Lineage[];
  madeAt: string;
}

export function datasetCard(c: CardInput): string {
  const rows = Object.entries(c.counts).map(([k, v]) => `| ${k} | ${v} |`);
  const schema = Object.entries(c.columns).map(
    ([k, col]) => `| \`${k}\` | \`${describeColumn(col).replace(/\|/g, '\\|')}\` |`,
  );
  const lineage = c.lineage.map(
    (l) =>
      `| ${l.stage} | ${l.code_version} | \`${l.config_hash.slice(0, 16)}\` | \`${l.fingerprint.slice(0, 16)}\` | ${l.finished_at} |`,
  );
  return `# prefab dataset: ${c.title}

${c.purpose}

## Counts

| split | rows |
|---|---|
${rows.join('\n')}

## Schema

\`?\` marks a nullable column. Messages are OpenAI chat messages, kept losslessly.

| column | type |
|---|---|
${schema.join('\n')}

## How it was made

${c.howMade.map((l) => `- ${l}`).join('\n')}

Config hash (every stage that led here): \`${c.configHash}\`. Made ${c.madeAt}.

| stage | code | config hash | output fingerprint | finished |
|---|---|---|---|---|
${lineage.join('\n')}

## Loading it

\`\`\`python
from datasets import load_dataset
ds = load_dataset("parquet", data_files={"train": "train.parquet", "test": "test.parquet"})
\`\`\`

\`\`\`sql
-- DuckDB
SELECT * FROM 'train.parquet' LIMIT 5;
\`\`\`
`;
}
