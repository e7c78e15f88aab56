// Readers of input records (logged sessions, imported pairs): JSONL, a JSON array, or Parquet, each streamed record by record.
import { readLines, openText } from './jsonl.ts';

export type InputFormat = 'jsonl' | 'json' | 'parquet';

/** One input record, or the reason it could not be read; `where` names its line, element or row. */
export interface RawRecord {
  where: string;
  value?: unknown;
  raw: string;
  error?: string;
  /** The file broke off here (a truncated .gz, a corrupt Parquet, an array cut short): this is its last record, and `error` says why. */
  damaged?: boolean;
}

/** The value at a dotted path of a record ("data.turns"), or undefined where the path leaves the objects. */
export function getPath(record: unknown, path: string): unknown {
  let value: unknown = record;
  for (const key of path.split('.')) {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) return undefined;
    value = (value as Record<string, unknown>)[key];
  }
  return value;
}

export function detectFormat(path: string): InputFormat | null {
  const name = path.toLowerCase().replace(/\.gz$/, '');
  if (name.endsWith('.jsonl') || name.endsWith('.ndjson')) return 'jsonl';
  if (name.endsWith('.json')) return 'json';
  if (name.endsWith('.parquet')) return 'parquet';
  return null;
}

/** A raw record's text as a quarantine keeps it: at most 64 KB of it, so one huge record cannot swell the file. */
export const quarantineText = (raw: string) => (raw.length > 65536 ? `${raw.slice(0, 65536)}… (${raw.length} characters in all)` : raw);

/**
 * The records of a file, one at a time. A file that cannot be read to its end yields what came before the
 * damage, then one last record (`damaged`) that says where reading stopped and why, instead of throwing:
 * one bad file never stops the others.
 */
export async function* readRecords(path: string, format: InputFormat, parse = true): AsyncGenerator<RawRecord> {
  const records = format === 'jsonl' ? readJsonlRecords(path, parse) : format === 'json' ? readJsonArray(path, parse) : parquetRecords(path);
  let reached = 'before the first record';
  try {
    for await (const record of records) {
      reached = `after ${record.where}`;
      yield record;
    }
  } catch (error) {
    yield { where: reached, raw: '', error: `${(error as Error).message} (the rest of the file is unread)`, damaged: true };
  }
}

/** A record's value, or why its text is not JSON. */
export function parseRecord(where: string, raw: string): RawRecord {
  try {
    return { where, value: JSON.parse(raw), raw };
  } catch (error) {
    return { where, raw, error: `not valid JSON (${(error as Error).message})` };
  }
}

/** With `parse` false, records of text formats come unparsed (no value): parseRecord, elsewhere, reads them. */
async function* readJsonlRecords(path: string, parse: boolean): AsyncGenerator<RawRecord> {
  for await (const { line, text } of readLines(path)) {
    if (text.trim() === '') continue;
    yield parse ? parseRecord(`line ${line}`, text) : { where: `line ${line}`, raw: text };
  }
}

/**
 * The elements of a top-level JSON array, cut out one at a time by a small scanner that tracks
 * strings and nesting, so a file larger than memory still streams.
 */
export async function* readJsonArray(path: string, parse = true): AsyncGenerator<RawRecord> {
  let line = 1;
  let started = false;
  let ended = false;
  let depth = 0; // nesting inside the current element
  let inString = false;
  let escaped = false;
  let parts: string[] = [];
  let from = -1; // start of the current element in this chunk, or -1
  let element = 0;
  let elementLine = 1;
  let awaitingElement = true; // after '[' or ',', until the element's first character

  const emit = (text: string): RawRecord | null => {
    const trimmed = text.trim();
    if (trimmed === '') return null;
    element++;
    const where = `element ${element} (line ${elementLine})`;
    return parse ? parseRecord(where, trimmed) : { where, raw: trimmed };
  };

  for await (const chunk of openText(path).setEncoding('utf8') as AsyncIterable<string>) {
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk[i]!;
      if (c === '\n') line++;
      if (!started) {
        if (c === '[') {
          started = true;
          from = i + 1;
        } else if (!/\s/.test(c) && c !== '\uFEFF') {
          throw new Error(`${path}: line ${line}: expected a JSON array of records ('[' first), found '${c}'; use .jsonl for one record a line`);
        }
        continue;
      }
      if (ended) {
        if (!/\s/.test(c)) throw new Error(`${path}: line ${line}: unexpected '${c}' after the closing ']' of the array`);
        continue;
      }
      if (inString) {
        if (escaped) escaped = false;
        else if (c === '\\') escaped = true;
        else if (c === '"') inString = false;
        continue;
      }
      if (awaitingElement && !/\s/.test(c)) {
        awaitingElement = false;
        elementLine = line;
      }
      if (c === '"') inString = true;
      else if (c === '{' || c === '[') depth++;
      else if ((c === '}' || c === ']') && depth > 0) depth--;
      else if (depth === 0 && (c === ',' || c === ']')) {
        parts.push(chunk.slice(from, i));
        const record = emit(parts.join(''));
        if (record) yield record;
        parts = [];
        from = i + 1;
        awaitingElement = true;
        if (c === ']') ended = true;
      }
    }
    if (started && !ended) parts.push(chunk.slice(Math.max(from, 0)));
    from = 0;
  }
  if (!started) throw new Error(`${path}: empty file; expected a JSON array of records`);
  if (!ended) throw new Error(`${path}: line ${line}: the JSON array is not closed (the file ends inside element ${element + 1})`);
}

async function* parquetRecords(path: string): AsyncGenerator<RawRecord> {
  const { readParquetRows } = await import('./parquet.ts'); // the Parquet libraries only when a file is Parquet
  for await (const { row, value } of readParquetRows(path)) yield { where: `row ${row}`, value, raw: JSON.stringify(value) };
}
