// The tokenizer stage's `placeholders` section: which values the model reads as placeholders ([PHONE_3]),
// with the simulator's company directory as terms when asked.
import { z } from 'zod';
import { savedPlaceholders, type Placeholders } from '../../model/placeholders.ts';
import { Redactor, type RedactionOptions } from '../../core/redact.ts';
import { DEFAULT_WORLD, generateWorld } from '../../env/world.ts';

/** The `placeholders` section: what the model reads as placeholders. */
export const placeholdersConfig = savedPlaceholders.extend({
  enabled: z
    .boolean()
    .default(true)
    .describe('false: the model reads and writes every value as it is, with no placeholders.'),
  directory: z
    .strictObject({
      world_seed: z.number().int().default(DEFAULT_WORLD.seed),
      companies: z.number().int().min(1).default(DEFAULT_WORLD.companies),
    })
    .nullable()
    .default(null)
    .describe(
      `The simulator's company directory (the world the sessions came from) as \`terms.COMPANY\`: the model reads "call Globex Insurance" as "call [COMPANY_1]", so looking a company up is one copied token, as in task-oriented dialogue's delexicalisation. null: company names are read as text.`,
    ),
});

/** The masking the section describes, with the directory's company names as terms; null when off. */
export function placeholdersOf(cfg: z.infer<typeof placeholdersConfig>): Placeholders {
  if (!cfg.enabled) return null;
  const terms = { ...cfg.terms };
  if (cfg.directory) {
    const world = generateWorld({
      ...DEFAULT_WORLD,
      seed: cfg.directory.world_seed,
      companies: cfg.directory.companies,
    });
    terms.COMPANY = [...(terms.COMPANY ?? []), ...world.companies.map((c) => c.name)];
  }
  const options: RedactionOptions = { kinds: cfg.kinds, keys: cfg.keys, terms, patterns: cfg.patterns };
  new Redactor(options); // bad labels and expressions fail here, naming the setting, not at the first conversation
  return options;
}
