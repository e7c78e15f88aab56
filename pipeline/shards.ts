// `prefab run --shard i/N` and `prefab merge`: the data stages on N machines, joined into what one run makes.
//
// A stage's output is a sequence of chunks in a fixed order (a bucket of tasks at a time, a section at a
// time). On a shard, a stage writes only the chunks it owns and records in `shard.json` where each one
// starts; `prefab merge` puts every shard's chunks back in key order. Since a chunk is made from its own
// data alone, the joined file is byte for byte the one a single run writes. Folders of per-bucket files
// are joined by taking each file from the shard that wrote it.
import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { copyFile, link, mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import { dirname, join, relative } from 'node:path';
import { PipelineError, UsageError } from './errors.ts';
import type { JsonlWriter } from './jsonl.ts';
import type { Shard, ShardPart } from './stage.ts';

/** `i/N` as the command line gives it: shards are numbered from 0, as Slurm array and Kubernetes indexes are. */
export function parseShard(text: string): Shard {
  const m = /^(\d+)\/(\d+)$/.exec(text.trim());
  if (!m) throw new UsageError(`--shard ${text}: expected i/N, the i-th (from 0) of N shards, e.g. --shard 0/3`);
  const [index, count] = [Number(m[1]), Number(m[2])];
  if (count < 1) throw new UsageError(`--shard ${text}: N must be at least 1`);
  if (index >= count)
    throw new UsageError(
      `--shard ${text}: shards are numbered from 0, so the last of ${count} is ${count - 1}/${count}`,
    );
  return { index, count };
}

export const shardName = (s: Shard | null | undefined) => (s ? `shard ${s.index}/${s.count}` : 'all the data');

/** Whether `shard` makes bucket `b` (every bucket when there is no shard): buckets go round the shards. */
export const ownsBucket = (shard: Shard | null, b: number) => shard === null || b % shard.count === shard.index;

/** A chunk's place in its file's order: keys compare element by element. */
export type ChunkKey = number[];

function compareKeys(a: ChunkKey, b: ChunkKey): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? -1) - (b[i] ?? -1);
    if (d !== 0) return d;
  }
  return 0;
}

const CHUNKS_FILE = 'shard.json';

interface ChunkRecord {
  shard: Shard;
  /** Per output file (relative to the stage folder): where each of its chunks starts, in the order written. */
  files: Record<string, { key: ChunkKey; start: number }[]>;
}

/**
 * Where a shard's chunks start in the files it writes. Off the shard (all the data), it records nothing
 * and writes nothing: a single run's folder has no shard.json.
 */
export class ChunkIndex {
  private readonly files: ChunkRecord['files'] = {};

  constructor(
    private readonly out: string,
    private readonly shard: Shard | null,
  ) {}

  /** The records `writer` writes from now on, up to the next mark, are the chunk `key`. */
  mark(writer: JsonlWriter, key: ChunkKey): void {
    if (!this.shard) return;
    const chunks = (this.files[relative(this.out, writer.path)] ??= []);
    const last = chunks.at(-1);
    if (last && compareKeys(last.key, key) >= 0)
      throw new Error(
        `chunk ${JSON.stringify(key)} of ${writer.path} comes after ${JSON.stringify(last.key)}: chunks must be written in key order`,
      );
    chunks.push({ key, start: writer.bytes });
  }

  async save(): Promise<void> {
    if (this.shard)
      await writeFile(
        join(this.out, CHUNKS_FILE),
        JSON.stringify({ shard: this.shard, files: this.files } satisfies ChunkRecord) + '\n',
      );
  }
}

async function readChunks(part: ShardPart): Promise<ChunkRecord> {
  const path = join(part.dir, CHUNKS_FILE);
  if (!existsSync(path))
    throw new PipelineError(`${part.dir}: no ${CHUNKS_FILE}; it was not made by \`prefab run --shard\``);
  return JSON.parse(await readFile(path, 'utf8')) as ChunkRecord;
}

async function copyRange(from: string, start: number, end: number, to: NodeJS.WritableStream): Promise<void> {
  if (end <= start) return;
  for await (const piece of createReadStream(from, { start, end: end - 1 })) {
    if (!to.write(piece)) await once(to, 'drain');
  }
}

/** Joins `file` of every shard's folder into `out`, its chunks in key order. */
export async function joinChunks(parts: ShardPart[], file: string, out: string): Promise<void> {
  const chunks: { key: ChunkKey; path: string; start: number; end: number; shard: Shard }[] = [];
  for (const part of parts) {
    const path = join(part.dir, file);
    const list = (await readChunks(part)).files[file] ?? [];
    const size = existsSync(path) ? (await stat(path)).size : 0;
    if (list.length === 0 && size > 0)
      throw new PipelineError(`${path}: ${size} bytes that no chunk of ${CHUNKS_FILE} accounts for`);
    if (list.length > 0 && list[0]!.start !== 0)
      throw new PipelineError(`${path}: its first chunk starts at byte ${list[0]!.start}, not 0`);
    list.forEach((c, i) =>
      chunks.push({ key: c.key, path, start: c.start, end: list[i + 1]?.start ?? size, shard: part.shard }),
    );
  }
  chunks.sort((a, b) => compareKeys(a.key, b.key));
  for (let i = 1; i < chunks.length; i++) {
    const [a, b] = [chunks[i - 1]!, chunks[i]!];
    if (compareKeys(a.key, b.key) === 0)
      throw new PipelineError(
        `${file}: chunk ${JSON.stringify(a.key)} was made by both ${shardName(a.shard)} and ${shardName(b.shard)}; were the shards run with different N?`,
      );
  }
  await mkdir(dirname(join(out, file)), { recursive: true });
  const to = createWriteStream(join(out, file));
  for (const c of chunks) await copyRange(c.path, c.start, c.end, to);
  to.end();
  await once(to, 'finish');
}

/** Copies `file`, which every shard wrote the same, into `out`; shards that disagree are an error. */
export async function sameInEvery(parts: ShardPart[], file: string, out: string): Promise<void> {
  const first = await readFile(join(parts[0]!.dir, file));
  for (const part of parts.slice(1)) {
    if (!first.equals(await readFile(join(part.dir, file))))
      throw new PipelineError(
        `${file} differs between ${shardName(parts[0]!.shard)} and ${shardName(part.shard)}: the shards did not run on the same data and config`,
      );
  }
  await mkdir(dirname(join(out, file)), { recursive: true });
  await writeFile(join(out, file), first);
}

/** Links (or copies) a file, or a folder's files, from `from` to `to`: stage outputs are never written again. */
export async function linkTree(from: string, to: string): Promise<void> {
  if ((await stat(from)).isDirectory()) {
    await mkdir(to, { recursive: true });
    for (const entry of await readdir(from)) await linkTree(join(from, entry), join(to, entry));
    return;
  }
  await link(from, to).catch(() => copyFile(from, to));
}

/** Joins `folder` of every shard into `out`: each file comes from the one shard that wrote it. */
export async function joinFolders(parts: ShardPart[], folder: string, out: string): Promise<void> {
  const owner = new Map<string, Shard>();
  await mkdir(join(out, folder), { recursive: true });
  for (const part of parts) {
    const dir = join(part.dir, folder);
    for (const entry of existsSync(dir) ? await readdir(dir) : []) {
      const other = owner.get(entry);
      if (other)
        throw new PipelineError(
          `${folder}/${entry} was made by both ${shardName(other)} and ${shardName(part.shard)}; were the shards run with different N?`,
        );
      owner.set(entry, part.shard);
      await linkTree(join(dir, entry), join(out, folder, entry));
    }
  }
}

/** The shards' counts added up, except `same`: counts of all the data that every shard counted alike. */
export function sumCounts(counts: Record<string, number>[], same: readonly string[] = []): Record<string, number> {
  const total: Record<string, number> = {};
  for (const one of counts) {
    for (const [k, v] of Object.entries(one)) {
      if (!same.includes(k)) total[k] = (total[k] ?? 0) + v;
      else if (k in total && total[k] !== v)
        throw new PipelineError(
          `the shards counted ${k} differently (${total[k]} and ${v}): they did not run on the same data and config`,
        );
      else total[k] = v;
    }
  }
  return total;
}
