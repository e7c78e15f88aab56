// Ready-made preference data read as pairs, in the shapes public datasets come in:
//   HH-RLHF: `chosen` and `rejected` full transcripts ("\n\nHuman: …\n\nAssistant: …"), the prompt implicit;
//   TRL: an explicit `prompt` with `chosen`/`rejected` completions, as text or as conversations, or implicit
//        (`chosen`/`rejected` whole conversations);
//   UltraFeedback: a `prompt` and rated `completions` (each `response` with a `rating`): the best-rated
//        against each one rated lower.
// The prompt is the longest common prefix of the two conversations; what follows it is each side.
import { getPath } from '../../pipeline/records.ts';
import { commonPrefixLength, type Message } from '../../core/records.ts';

export type ImportFormat = 'hh' | 'trl' | 'ultrafeedback';

export interface ImportMapping {
  prompt: string;
  chosen: string;
  rejected: string;
  completions: string;
  response: string;
  rating: string;
}

/** A pair as read: the conversation before the sides, the two sides, and the ratings where the data has them. */
export interface ReadPair {
  prompt: Message[];
  chosen: Message[];
  rejected: Message[];
  /** The ratings scaled to [0, 1] by the record's scale (the highest rating any completion could get, taken as the record's best when unknown); null without ratings. */
  chosenRating: number | null;
  rejectedRating: number | null;
}

/** Why a record cannot be read as a pair: quarantined with this reason. */
export class ImportError extends Error {}

const ROLE_NAMES: Record<string, Message['role']> = {
  human: 'user',
  user: 'user',
  assistant: 'assistant',
  gpt: 'assistant',
  bot: 'assistant',
  system: 'system',
  tool: 'tool',
};

/** "\n\nHuman: …\n\nAssistant: …" as messages. */
export function hhMessages(text: string): Message[] {
  const parts = text.split(/\n\n(Human|Assistant):\s?/);
  const out: Message[] = [];
  if (parts[0]!.trim())
    throw new ImportError(`text before the first "Human:" turn: "${parts[0]!.trim().slice(0, 40)}"`);
  for (let i = 1; i < parts.length; i += 2)
    out.push({ role: parts[i] === 'Human' ? 'user' : 'assistant', content: parts[i + 1]!.trim() });
  if (out.length === 0) throw new ImportError('no "\\n\\nHuman:" / "\\n\\nAssistant:" turns');
  return out;
}

/** A conversation given as a list of {role, content} (also {from, value}), or as text: a user's turn for a prompt, an assistant's for a completion. */
function messagesOf(value: unknown, field: string, textRole: Message['role']): Message[] {
  if (typeof value === 'string') return [{ role: textRole, content: value }];
  if (!Array.isArray(value))
    throw new ImportError(
      `${field} must be text or a list of messages, got ${value === undefined ? 'nothing' : typeof value}`,
    );
  return value.map((m, i) => {
    if (m === null || typeof m !== 'object') throw new ImportError(`${field}[${i}] must be a message object`);
    const o = m as Record<string, unknown>;
    const rawRole = String(o.role ?? o.from ?? '');
    const role = ROLE_NAMES[rawRole.toLowerCase()];
    if (!role) throw new ImportError(`${field}[${i}].role "${rawRole}" is none of user, assistant, system, tool`);
    const content = o.content ?? o.value;
    if (typeof content !== 'string' && content !== null) throw new ImportError(`${field}[${i}].content must be text`);
    return { role, content: content as string | null };
  });
}

/** Two whole conversations split at their longest common prefix: the prompt, then each side (from its first assistant turn). */
function splitAtPrefix(chosen: Message[], rejected: Message[]): Pick<ReadPair, 'prompt' | 'chosen' | 'rejected'> {
  const n = commonPrefixLength(chosen, rejected);
  if (n === chosen.length || n === rejected.length)
    throw new ImportError(
      n === chosen.length && n === rejected.length
        ? 'chosen and rejected are the same conversation'
        : 'one side is the other cut short: no reply to compare',
    );
  for (const [name, side] of [
    ['chosen', chosen],
    ['rejected', rejected],
  ] as const) {
    if (side[n]!.role !== 'assistant')
      throw new ImportError(`the sides part at a ${side[n]!.role} turn of ${name}, not at a reply`);
  }
  return { prompt: chosen.slice(0, n), chosen: chosen.slice(n), rejected: rejected.slice(n) };
}

/** Which shape a record has, by its fields. */
export function detectImport(record: unknown, m: ImportMapping): ImportFormat {
  if (Array.isArray(getPath(record, m.completions))) return 'ultrafeedback';
  const chosen = getPath(record, m.chosen);
  if (typeof chosen === 'string' && getPath(record, m.prompt) === undefined && /\n\nHuman:/.test(chosen)) return 'hh';
  return 'trl';
}

const rating = (value: unknown, field: string): number => {
  const r = typeof value === 'string' ? Number(value) : value;
  if (typeof r !== 'number' || !Number.isFinite(r))
    throw new ImportError(`${field} must be a number, got ${JSON.stringify(value)}`);
  return r;
};

/** The pairs one record holds (UltraFeedback: several). */
export function readPairs(record: unknown, format: ImportFormat, m: ImportMapping): ReadPair[] {
  if (record === null || typeof record !== 'object' || Array.isArray(record))
    throw new ImportError('a record must be a JSON object');
  if (format === 'hh') {
    const [c, r] = [m.chosen, m.rejected].map((f) => {
      const v = getPath(record, f);
      if (typeof v !== 'string')
        throw new ImportError(`${f} must be an HH-RLHF transcript ("\\n\\nHuman: …\\n\\nAssistant: …")`);
      return hhMessages(v);
    });
    return [{ ...splitAtPrefix(c!, r!), chosenRating: null, rejectedRating: null }];
  }
  if (format === 'trl') {
    const promptValue = getPath(record, m.prompt);
    const chosen = messagesOf(getPath(record, m.chosen), m.chosen, 'assistant');
    const rejected = messagesOf(getPath(record, m.rejected), m.rejected, 'assistant');
    const scores = [getPath(record, 'score_chosen'), getPath(record, 'score_rejected')];
    const rated = scores.every((s) => s !== undefined && s !== null)
      ? scores.map((s, i) => rating(s, i ? 'score_rejected' : 'score_chosen'))
      : null;
    const scale = rated ? Math.max(...rated, 1) : 1;
    const ratings = {
      chosenRating: rated ? rated[0]! / scale : null,
      rejectedRating: rated ? rated[1]! / scale : null,
    };
    if (promptValue === undefined) return [{ ...splitAtPrefix(chosen, rejected), ...ratings }];
    return [{ prompt: messagesOf(promptValue, m.prompt, 'user'), chosen, rejected, ...ratings }];
  }
  // UltraFeedback: the best-rated completion against each rated lower.
  const prompt = messagesOf(getPath(record, m.prompt), m.prompt, 'user');
  const completions = (getPath(record, m.completions) as unknown[]).map((c, i) => {
    const response = getPath(c, m.response);
    if (typeof response !== 'string') throw new ImportError(`${m.completions}[${i}].${m.response} must be text`);
    return { response, rating: rating(getPath(c, m.rating), `${m.completions}[${i}].${m.rating}`) };
  });
  if (completions.length < 2) throw new ImportError(`${m.completions} needs at least two rated completions`);
  const best = completions.reduce((a, b) => (b.rating > a.rating ? b : a));
  const scale = Math.max(...completions.map((c) => c.rating), 1);
  const lower = completions.filter((c) => c.rating < best.rating);
  if (lower.length === 0) throw new ImportError('every completion has the same rating: no preference to read');
  return lower.map((c) => ({
    prompt,
    chosen: [{ role: 'assistant', content: best.response }],
    rejected: [{ role: 'assistant', content: c.response }],
    chosenRating: best.rating / scale,
    rejectedRating: c.rating / scale,
  }));
}
