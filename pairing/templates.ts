// The texts hard negatives are written with: prefab's own (negatives.yaml beside this file, written to fit any
// agent), or a file of the user's (pairs.hard_negatives.templates), checked for what the transforms need.
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { z } from 'zod';
import { PipelineError } from '../pipeline/errors.ts';
import { REFUSAL_PATTERN } from '../core/refusal.ts';

/** prefab's templates. */
export const PREFAB_TEMPLATES = resolve(dirname(fileURLToPath(import.meta.url)), 'negatives.yaml');

const texts = z.array(z.string().min(1)).min(1);
const templatesSchema = z.strictObject({
  refusal: texts,
  off_topic: texts,
  verbose_openers: texts,
  verbose_fillers: texts,
  terse: texts,
});

/** Per kind of text a transform writes, the texts it draws from. */
export type NegativeTemplates = z.infer<typeof templatesSchema>;

/**
 * The templates of the YAML file at `path`: every refusal must read as one to the rules judge (REFUSAL_PATTERN),
 * and padding and terse lines must hold no digit (they add no facts). An error names the file and the text.
 */
export function readTemplates(path: string): NegativeTemplates {
  const fail = (what: string) =>
    new PipelineError(
      `${path} (pairs.hard_negatives.templates): ${what}. It holds lists of texts under refusal, off_topic, verbose_openers, verbose_fillers and terse (${PREFAB_TEMPLATES} is prefab's)`,
    );
  let value: unknown;
  try {
    value = parse(readFileSync(path, 'utf8'));
  } catch (error) {
    throw fail(`cannot be read as YAML (${(error as Error).message.split('\n')[0]})`);
  }
  const parsed = templatesSchema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw fail(`${issue.path.join('.') || 'the file'}: ${issue.message}`);
  }
  const t = parsed.data;
  const notRefusal = t.refusal.find((r) => !REFUSAL_PATTERN.test(r));
  if (notRefusal !== undefined)
    throw fail(
      `the refusal "${notRefusal}" does not read as a refusal to the rules judge (core/refusal.ts); word it as one, e.g. "I'm sorry, but I can't help with that"`,
    );
  const digit = [...t.verbose_openers, ...t.verbose_fillers, ...t.terse].find((x) => /\d/.test(x));
  if (digit !== undefined) throw fail(`"${digit}" holds a digit: padding and terse lines must add no facts`);
  return t;
}
