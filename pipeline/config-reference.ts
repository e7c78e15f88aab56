// The config reference (docs/config.md), made from the stages' own schemas: every key with its type, its
// default and the doc string its schema gives it (`.describe()`), so the reference cannot drift from the code.
// `prefab config-reference` prints it; a test checks that the committed file is current.
import { z } from 'zod';
import type { Stage } from './stage.ts';

type Schema = {
  type?: string | string[];
  description?: string;
  default?: unknown;
  enum?: unknown[];
  const?: unknown;
  anyOf?: Schema[];
  items?: Schema;
  properties?: Record<string, Schema>;
  additionalProperties?: Schema | boolean;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  required?: string[];
};

interface Row {
  key: string;
  type: string;
  default: string;
  doc: string;
}

/** Number bounds as a reader writes them; zod's integer bounds (±2⁵³ − 1) say nothing and are left out. */
function bounds(s: Schema): string {
  const b: string[] = [];
  const safe = (x: number | undefined) => x !== undefined && Math.abs(x) < Number.MAX_SAFE_INTEGER;
  if (safe(s.minimum)) b.push(`≥ ${s.minimum}`);
  if (safe(s.exclusiveMinimum)) b.push(`> ${s.exclusiveMinimum}`);
  if (safe(s.maximum)) b.push(`≤ ${s.maximum}`);
  if (safe(s.exclusiveMaximum)) b.push(`< ${s.exclusiveMaximum}`);
  return b.length ? ` ${b.join(', ')}` : '';
}

function typeOf(s: Schema): string {
  if (Array.isArray(s.type)) return s.type.map((type) => typeOf({ ...s, type })).join(' or ');
  if (s.anyOf) return s.anyOf.map(typeOf).join(' or ');
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(' | ');
  if (s.const !== undefined) return JSON.stringify(s.const);
  switch (s.type) {
    case 'integer':
      return `integer${bounds(s)}`;
    case 'number':
      return `number${bounds(s)}`;
    case 'array':
      return `list of ${s.items ? typeOf(s.items) : 'values'}`;
    case 'object':
      if (s.properties) return 'section';
      return typeof s.additionalProperties === 'object' ? `map of name → ${typeOf(s.additionalProperties)}` : 'map';
    default:
      return String(s.type ?? 'any');
  }
}

const isSection = (s: Schema) => s.type === 'object' && s.properties !== undefined;

/** A key's default as the table shows it: none for a section (its keys have theirs), `(required)` or `—` for a key with none. */
function defaultOf(s: Schema, required: boolean): string {
  if (isSection(s)) return '';
  if (s.default === undefined) return required ? '(required)' : '—';
  return '`' + JSON.stringify(s.default) + '`';
}

function collect(schema: Schema, prefix: string, out: Row[]): void {
  for (const [name, s] of Object.entries(schema.properties ?? {})) {
    const key = prefix + name;
    out.push({
      key,
      type: typeOf(s),
      default: defaultOf(s, schema.required?.includes(name) ?? false),
      doc: s.description ?? '',
    });
    if (isSection(s)) collect(s, `${key}.`, out);
  }
}

const cell = (text: string) => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** A section of the config: a stage's, or a command's own (`refresh`). */
type Section = Pick<Stage, 'name' | 'description' | 'config'>;

/** Every section's config keys, with type, default and meaning, as Markdown. */
export function configReference(stages: Section[]): string {
  const lines = [
    '# Config reference',
    '',
    'Every key of a prefab config, section by section (a section is named after its stage, or after the command',
    "that reads it: `refresh`). Made by `npm run docs:config` from the schemas, where each key's meaning is",
    'written beside it: edit the schema, not this file. A key left out takes its default; an unknown key is an',
    'error that names its line.',
    '',
  ];
  for (const stage of stages) {
    const schema = z.toJSONSchema(stage.config, { io: 'input', unrepresentable: 'any' }) as Schema;
    const rows: Row[] = [];
    collect(schema, `${stage.name}.`, rows);
    lines.push(`## ${stage.name}`, '', stage.description[0]!.toUpperCase() + stage.description.slice(1) + '.', '');
    if (rows.length === 0) {
      lines.push('No settings.', '');
      continue;
    }
    lines.push('| key | type | default | meaning |', '|---|---|---|---|');
    for (const r of rows) lines.push(`| \`${r.key}\` | ${cell(r.type)} | ${cell(r.default)} | ${cell(r.doc)} |`);
    lines.push('');
  }
  return lines.join('\n');
}

/** The keys (dotted paths) that have no doc string: each should say what it does. */
export function undocumentedKeys(stages: Section[]): string[] {
  return stages.flatMap((stage) => {
    const rows: Row[] = [];
    collect(z.toJSONSchema(stage.config, { io: 'input', unrepresentable: 'any' }) as Schema, `${stage.name}.`, rows);
    return rows.filter((r) => r.doc === '').map((r) => r.key);
  });
}
