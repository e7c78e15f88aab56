// YAML config, validated at load: an unknown or mistyped key is an error naming the key, the file and the line.
import { readFileSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { LineCounter, isMap, isScalar, parseDocument, type Document } from 'yaml';
import { z } from 'zod';
import { UsageError } from './errors.ts';

export interface LoadedConfig<T> {
  file: string;
  /** Relative paths inside the config are resolved against this folder. */
  dir: string;
  value: T;
}

/** The key node of `key` in the map at `path` of the document, if there is one. */
function keyNode(doc: Document, path: string[], key: string): unknown {
  const map = path.length === 0 ? doc.contents : doc.getIn(path, true);
  if (!isMap(map)) return undefined;
  return map.items.find((pair) => isScalar(pair.key) && String(pair.key.value) === key)?.key;
}

/** The largest config read: the bundled ones are a few KB; `--config /dev/zero` must not fill the memory. */
export const MAX_CONFIG_BYTES = 1 << 20;

export function loadConfig<S extends z.ZodType>(file: string, schema: S): LoadedConfig<z.infer<S>> {
  const path = resolve(file);
  let text: string;
  try {
    const stat = statSync(path);
    if (!stat.isFile())
      throw new UsageError(
        `config ${file}: not a regular file (a device, pipe or folder). Pass a YAML file with --config.`,
      );
    if (stat.size > MAX_CONFIG_BYTES)
      throw new UsageError(
        `config ${file}: ${stat.size} bytes, more than a config's ${MAX_CONFIG_BYTES} (1 MiB): is it the right file?`,
      );
    text = readFileSync(path, 'utf8');
  } catch (error) {
    if (error instanceof UsageError) throw error;
    throw new UsageError(
      `config ${file}: cannot read it. Pass an existing file with --config (the ready ones are in configs/).`,
    );
  }
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: true });
  if (doc.errors.length > 0) {
    const e = doc.errors[0]!;
    throw new UsageError(`config ${file}:${e.linePos?.[0].line ?? '?'}: not valid YAML: ${e.message.split('\n')[0]}`);
  }
  const raw = doc.toJS() ?? {};
  const parsed = schema.safeParse(raw, { jitless: true });
  if (parsed.success) return { file: path, dir: dirname(path), value: parsed.data };

  const problems = parsed.error.issues.map((issue) => {
    const keys = issue.code === 'unrecognized_keys' ? issue.keys : [];
    const at = [...issue.path, ...(keys.length === 1 ? keys : [])].map(String);
    // An unknown key is named at the key itself; any other problem where its value starts.
    const node = (keys.length === 1 ? keyNode(doc, issue.path.map(String), keys[0]!) : doc.getIn(at, true)) as
      { range?: [number, number, number] } | undefined;
    const line = node?.range ? `:${lines.linePos(node.range[0]).line}` : '';
    const where = at.length > 0 ? at.join('.') : '(top level)';
    if (issue.code === 'unrecognized_keys') {
      const names = keys.map((k) => [...issue.path, k].join('.')).join(', ');
      return `${file}${line}: unknown key ${names}; check its spelling against docs/config.md (or prefab config-reference)`;
    }
    return `${file}${line}: ${where}: ${issue.message}`;
  });
  throw new UsageError(`config is not valid:\n  ${problems.join('\n  ')}`);
}
