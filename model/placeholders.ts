// What the model reads in place of the values it would otherwise have to copy. An agent's calls repeat
// values from the conversation: the phone number the directory gave, the account number and PIN the user
// filled in. A small model learns that structure long before it learns to copy a 13-character number token
// by token, so the model sees each such value as a placeholder ([PHONE_3], [ACCOUNT_1]), one per distinct
// value in order of appearance, and what it writes is put back before the environment reads it. This is the
// Redactor that masks exports and judge requests, applied to every conversation the model trains on, is
// scored on or acts in; the options are saved with the model (config.json) so it is always read the same way.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { DEFAULT_REDACTION, PII_KINDS, Redactor, type PiiKind, type RedactionOptions } from '../core/redact.ts';
import type { Message } from '../core/records.ts';

/** The masking a model was trained with; null: it reads values as they are. */
export type Placeholders = RedactionOptions | null;

/** Beyond personal data, the form's other fields: values the agent copies from the form into its calls. */
const FORM_KEYS = ['zip_code', 'order_id', 'policy_number', 'member_id'];

/** What the saved options hold (placeholders.json, config.json's prefab_placeholders). */
export const savedPlaceholders = z.strictObject({
  kinds: z
    .array(z.enum(PII_KINDS as [PiiKind, ...PiiKind[]]))
    .default(['ssn', 'account', 'phone', 'email', 'dob'])
    .describe(
      "Kinds found in free text (the directory's phone numbers, e-mails, ...); `date` is left out by default: a model reads and writes dates as they are.",
    ),
  keys: z
    .array(z.string().min(1))
    .default([...DEFAULT_REDACTION.keys, ...FORM_KEYS])
    .describe('JSON keys whose values are replaced whatever they look like.'),
  terms: z
    .record(z.string(), z.array(z.string()))
    .default({})
    .describe("Named phrases: label → phrases ({COMPANY: [...]} reads a company's name as [COMPANY_1])."),
  patterns: z
    .record(z.string(), z.string())
    .default({})
    .describe(
      "Values of a shape of one's own: label → regular expression ({REF: 'REF-\\\\d+'}, the environment's reference numbers).",
    ),
});

/** The file in the tokenizer stage's folder that says how the model reads values: the options, or null. */
export const PLACEHOLDERS_FILE = 'placeholders.json';

/** The tokenizer stage's placeholders.json in `dir`. */
export async function readPlaceholdersFile(dir: string): Promise<Placeholders> {
  const path = join(dir, PLACEHOLDERS_FILE);
  return parsePlaceholders(JSON.parse(await readFile(path, 'utf8')), path);
}

/** Parses a saved `Placeholders` (config.json's prefab_placeholders), naming `source` when it is malformed. */
export function parsePlaceholders(value: unknown, source: string): Placeholders {
  if (value === undefined || value === null) return null;
  const parsed = savedPlaceholders.safeParse(value);
  if (!parsed.success)
    throw new Error(
      `${source}: prefab_placeholders is not {kinds, keys, terms, patterns}: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
    );
  return parsed.data;
}

/** A conversation as the model sees it, and `restore`, which puts the values back into what it writes after it. */
export function modelView(
  messages: Message[],
  placeholders: Placeholders,
): { messages: Message[]; restore: (m: Message) => Message } {
  if (placeholders === null) return { messages, restore: (m) => m };
  const r = new Redactor(placeholders);
  return { messages: r.messages(messages), restore: (m) => r.restoreMessage(m) };
}

/** Conversations as the model sees them (one masking per conversation: placeholders say nothing across them). */
export const viewAll = (conversations: Message[][], placeholders: Placeholders): Message[][] =>
  conversations.map((c) => modelView(c, placeholders).messages);
