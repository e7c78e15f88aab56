// The Parquet schemas of the exported datasets: messages as list<struct> in TRL's layout.
import type { Column } from '../../pipeline/parquet.ts';

/** The datasets the export writes, each a folder of Parquet files and a card. */
export const DATASETS = ['sessions', 'sft', 'pairs', 'trajectories', 'kto'] as const;

const str: Column = { kind: 'string' };
const optStr: Column = { kind: 'string', optional: true };
const double: Column = { kind: 'double' };
const optDouble: Column = { kind: 'double', optional: true };
/** Free text: no min/max statistics (pipeline/parquet.ts). */
const text: Column = { kind: 'string', statistics: false };
const optText: Column = { kind: 'string', optional: true, statistics: false };

const MESSAGE: Column = {
  kind: 'struct',
  fields: {
    role: str,
    content: optStr,
    name: optStr,
    tool_calls: {
      kind: 'list',
      optional: true,
      of: {
        kind: 'struct',
        fields: { id: str, type: str, function: { kind: 'struct', fields: { name: str, arguments: str } } },
      },
    },
    tool_call_id: optStr,
  },
};

const MESSAGES: Column = { kind: 'list', of: MESSAGE };

export const SESSION_COLUMNS: Record<string, Column> = {
  session_id: str,
  task_id: optStr,
  messages: MESSAGES,
  reward: double,
  feedback: optText,
  model: optStr,
  source: str,
  created_at: optStr,
  metadata: text,
  split: str,
  task_match: { kind: 'struct', optional: true, fields: { score: double, kind: str } },
};

export const PAIR_COLUMNS: Record<string, Column> = {
  prompt: MESSAGES,
  chosen: MESSAGES,
  rejected: MESSAGES,
  chosen_reward: optDouble,
  rejected_reward: optDouble,
  margin: optDouble,
  confidence: double,
  source: str,
  negative_type: optStr,
  judge: str,
  task_id: optStr,
  chosen_session_id: str,
  rejected_session_id: str,
  pair_id: str,
  split: str,
  tools: optText,
};

export const SFT_COLUMNS: Record<string, Column> = {
  messages: MESSAGES,
  session_id: str,
  task_id: optStr,
  reward: double,
  tools: optText,
};

export const KTO_COLUMNS: Record<string, Column> = {
  prompt: MESSAGES,
  completion: MESSAGES,
  label: { kind: 'bool' },
  session_id: str,
  task_id: optStr,
  reward: double,
  tools: optText,
};
