// Copy augmentation for SFT: the values an agent copies from the conversation into its tool calls (a company
// name from the user's request, a phone number from a directory, an account number from a form) are replaced,
// consistently across the whole session, by fresh random strings of the same shape. A small model trained on
// a few dozen companies otherwise learns their names and numbers by heart instead of learning to copy, and
// fails on every company it has not seen.
import type { Message } from '../core/records.ts';
import { seeded, type Random } from '../core/random.ts';

/** Leaf string values of a JSON value (object keys excluded). */
function leafStrings(value: unknown, out: string[] = []): string[] {
  if (typeof value === 'string') out.push(value);
  else if (Array.isArray(value)) for (const v of value) leafStrings(v, out);
  else if (value !== null && typeof value === 'object') for (const v of Object.values(value)) leafStrings(v, out);
  return out;
}

function parsed(json: string): unknown {
  try {
    return JSON.parse(json) as unknown;
  } catch {
    return null;
  }
}

/** Values the assistant copied: argument strings that appear verbatim in an earlier user or tool message, and never in a system message (field names, tool names). */
export function copiedValues(messages: Message[]): string[] {
  const system = messages
    .filter((m) => m.role === 'system')
    .map((m) => m.content ?? '')
    .join('\n');
  const seen: string[] = [];
  const copied = new Set<string>();
  for (const m of messages) {
    if (m.role === 'assistant') {
      for (const call of m.tool_calls ?? []) {
        for (const v of leafStrings(parsed(call.function.arguments))) {
          if (v.trim().length >= 3 && !system.includes(v) && seen.some((text) => text.includes(v))) copied.add(v);
        }
      }
    } else if (m.role === 'user' || m.role === 'tool') seen.push(m.content ?? '');
  }
  return [...copied];
}

/** A random string of the same shape: digits for digits, letters of the same case for letters, everything else kept. */
export function reshape(value: string, rand: Random): string {
  const pick = (alphabet: string) => alphabet[Math.floor(rand() * alphabet.length)]!;
  return value.replace(/[0-9a-zA-Z]/g, (c) =>
    c >= '0' && c <= '9'
      ? pick('0123456789')
      : c >= 'a' && c <= 'z'
        ? pick('abcdefghijklmnopqrstuvwxyz')
        : pick('ABCDEFGHIJKLMNOPQRSTUVWXYZ'),
  );
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * The session with every copied value replaced by a random one of its shape, everywhere it occurs (also inside
 * longer strings: a company name inside its departments' names). Longer values are matched first, so a value
 * inside another is not replaced twice. A session that copies nothing comes back unchanged.
 */
export function resampleCopies(messages: Message[], rand: Random): Message[] {
  const values = copiedValues(messages).sort((a, b) => b.length - a.length);
  if (values.length === 0) return messages;
  const fresh = new Map(values.map((v) => [v, reshape(v, rand)]));
  const pattern = new RegExp(values.map(escape).join('|'), 'g');
  const swap = (text: string) => text.replace(pattern, (v) => fresh.get(v)!);
  return messages.map((m) => {
    if (m.role === 'system') return m;
    const out: Message = { ...m, content: m.content === null || m.content === undefined ? m.content : swap(m.content) };
    if (m.tool_calls)
      out.tool_calls = m.tool_calls.map((c) => ({
        ...c,
        function: { ...c.function, arguments: swap(c.function.arguments) },
      }));
    return out;
  });
}

/** A `share` of the sessions with their copies resampled (each drawn by the seed and its index), and how many. */
export function resampledSessions(
  sessions: Message[][],
  share: number,
  seed: string,
): { conversations: Message[][]; resampled: number } {
  let resampled = 0;
  const conversations = sessions.map((messages, i) => {
    const rand = seeded(seed, 'resample-copies', i);
    if (rand() >= share) return messages;
    resampled++;
    return resampleCopies(messages, rand);
  });
  return { conversations, resampled };
}
