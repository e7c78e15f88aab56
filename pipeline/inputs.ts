// The input files the config names: files, folders (read recursively for the readable extensions) and
// globs, relative to the config file; each is an external input of the stage, hashed into its fingerprint.
import { existsSync, readdirSync, statSync, type Stats } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { UsageError } from './errors.ts';
import type { Logger } from './log.ts';

const INPUT_EXTENSIONS = /\.(jsonl|ndjson|json|parquet)(\.gz)?$/i;

/** What a file that is not a regular one is, in words; null for a regular file. */
function specialKind(s: Stats): string | null {
  if (s.isFile()) return null;
  if (s.isFIFO()) return 'a FIFO (a named pipe)';
  if (s.isCharacterDevice()) return 'a character device';
  if (s.isBlockDevice()) return 'a block device';
  if (s.isSocket()) return 'a socket';
  return 'not a file';
}

/** The files `inputs` names, absolute and sorted; a name that matches nothing is a usage error naming `key`. */
export async function resolveInputs(
  inputs: string[],
  configDir: string,
  o: { key?: string; log?: Logger } = {},
): Promise<string[]> {
  const key = o.key ?? 'ingest.inputs';
  const files = new Set<string>();
  // tinyglobby only where a folder or a pattern is named: every command's start would pay for loading it.
  const glob = async (pattern: string, cwd: string) =>
    (await import('tinyglobby')).glob(pattern, { cwd, absolute: true, onlyFiles: true });
  for (const input of inputs) {
    const path = resolve(configDir, input);
    let matched: string[];
    if (existsSync(path) && statSync(path).isDirectory()) {
      matched = (await glob('**/*', path)).filter((f) => INPUT_EXTENSIONS.test(f));
      // A name that is not UTF-8 is listed as a string no call can open (its bytes became U+FFFD); one gone
      // since the listing likewise. Passed over, saying so: the other files are read.
      matched = matched.filter((f) => {
        if (existsSync(f)) return true;
        o.log?.warn(`skipped an input file that cannot be opened by its name: ${unopenedName(f)}`);
        return false;
      });
    } else if (existsSync(path)) {
      const kind = specialKind(statSync(path));
      if (kind)
        throw new UsageError(
          `${key}: '${input}' is ${kind}, not a regular file. prefab reads an input twice (its content hashed for the fingerprint, then read), which a stream cannot give, and opening one with no writer waits for ever: write it to a file and name that`,
        );
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

/**
 * Why `path` could not be opened, in words: a name in its folder that is not UTF-8 (shown with its bytes
 * escaped, \xff; a path string cannot name it), or a file gone since it was listed.
 */
function unopenedName(path: string): string {
  const dir = dirname(path);
  let names: Buffer[] = [];
  try {
    names = readdirSync(dir, { encoding: 'buffer' });
  } catch {
    // the folder went too
  }
  const raw = names.find((b) => b.toString('utf8') === basename(path) && !Buffer.from(b.toString('utf8')).equals(b));
  if (!raw) return `${path} is gone since the inputs were listed`;
  // Printable ASCII as it is, every other byte as \xNN.
  const escaped = [...raw]
    .map((byte) =>
      byte >= 0x20 && byte < 0x7f ? String.fromCharCode(byte) : `\\x${byte.toString(16).padStart(2, '0')}`,
    )
    .join('');
  return `${join(dir, escaped)} has a name that is not UTF-8: rename it to read it`;
}
