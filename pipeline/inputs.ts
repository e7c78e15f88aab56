// The input files the config names: files, folders (read recursively for the readable extensions) and
// globs, relative to the config file; each is an external input of the stage, hashed into its fingerprint.
import { existsSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { UsageError } from './errors.ts';

const INPUT_EXTENSIONS = /\.(jsonl|ndjson|json|parquet)(\.gz)?$/i;

/** The files `inputs` names, absolute and sorted; a name that matches nothing is a usage error naming `key`. */
export async function resolveInputs(inputs: string[], configDir: string, key = 'ingest.inputs'): Promise<string[]> {
  const files = new Set<string>();
  // tinyglobby only where a folder or a pattern is named: every command's start would pay for loading it.
  const glob = async (pattern: string, cwd: string) =>
    (await import('tinyglobby')).glob(pattern, { cwd, absolute: true, onlyFiles: true });
  for (const input of inputs) {
    const path = resolve(configDir, input);
    let matched: string[];
    if (existsSync(path) && statSync(path).isDirectory()) {
      matched = (await glob('**/*', path)).filter((f) => INPUT_EXTENSIONS.test(f));
    } else if (existsSync(path)) {
      matched = [path];
    } else {
      matched = await glob(input, configDir);
      if (matched.length === 0)
        throw new UsageError(
          `${key}: '${input}' matches no file (paths are relative to the config file's folder, ${configDir})`,
        );
    }
    for (const f of matched) files.add(f);
  }
  return [...files].sort();
}
