// The work of an ingest that failed or was stopped after some of its files were read (a later file's fault,
// a full disk, Ctrl+C, ingest.max_quarantined): those files' segments, tasks files and the quarantine up to
// them, kept in the stage's cache so that the next run links them instead of reading the files again. They
// are used only where they are exactly what the next run would make: the same way of reading, the same
// earlier ingest, and the same files first in the same order.
import { existsSync } from 'node:fs';
import { copyFile, link, mkdir, open, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../pipeline/log.ts';
import type { ExternalFile } from '../../pipeline/stage.ts';
import { taskRunsFile } from '../layout.ts';
import type { FinishedFile } from './segment.ts';

interface KeptState {
  /** What the work is valid for (run.ts: the reading hash, the earlier ingest, the files before these). */
  key: string;
  files: FinishedFile[];
}

/** Work kept from a failed run that the next run takes as its first files' (`files`, in order), from `dir`. */
export interface KeptWork {
  dir: string;
  files: FinishedFile[];
}

const folder = (cache: string) => join(cache, 'kept');

/** File `from` linked as `to` (copied where a link cannot be made: another file system). */
async function linkOrCopy(from: string, to: string): Promise<void> {
  try {
    await link(from, to);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EXDEV') throw error;
    await copyFile(from, to);
  }
}

/** A segment and its tasks file (none where an ingest from before them wrote none), from one ingest-shaped folder to another. */
export async function linkSegment(from: string, to: string, segment: string): Promise<void> {
  await linkOrCopy(join(from, 'sessions', segment), join(to, 'sessions', segment));
  if (existsSync(taskRunsFile(from, segment))) await linkOrCopy(taskRunsFile(from, segment), taskRunsFile(to, segment));
}

/** The first `bytes` of file `from`, written as file `to`. */
export async function copyHead(from: string, to: string, bytes: number): Promise<void> {
  const source = await open(from, 'r');
  const target = await open(to, 'w');
  try {
    const buffer = Buffer.allocUnsafe(1 << 20);
    for (let at = 0; at < bytes;) {
      const { bytesRead } = await source.read(buffer, 0, Math.min(buffer.length, bytes - at), at);
      if (bytesRead === 0) throw new Error(`${from} is shorter than the ${bytes} bytes kept of it`);
      await target.write(buffer, 0, bytesRead);
      at += bytesRead;
    }
  } finally {
    await source.close();
    await target.close();
  }
}

/**
 * Keeps `finished` (files read into the ingest folder `out`, in order) in `cache` for a next run under `key`,
 * with the quarantine (`quarantinePath`, whole on disk) up to the last of them. Replaces what was kept before.
 */
export async function keepWork(o: {
  cache: string;
  key: string;
  out: string;
  quarantinePath: string;
  finished: FinishedFile[];
  log: Logger;
}): Promise<void> {
  const { cache, key, out, quarantinePath, finished, log } = o;
  if (finished.length === 0) return;
  const dir = folder(cache);
  const making = `${dir}.new`;
  await rm(making, { recursive: true, force: true });
  await mkdir(join(making, 'sessions'), { recursive: true });
  await mkdir(join(making, 'tasks'), { recursive: true });
  for (const { file } of finished) await linkSegment(out, making, file.segment);
  await copyHead(quarantinePath, join(making, 'quarantine.jsonl'), finished.at(-1)!.quarantineBytes);
  await writeFile(join(making, 'state.json'), JSON.stringify({ key, files: finished } satisfies KeptState));
  await rm(dir, { recursive: true, force: true });
  await rename(making, dir);
  log.info('kept the work of the files read before the failure: the next run links them instead of reading them', {
    files: finished.length,
    sessions: finished.reduce((n, f) => n + f.file.sessions, 0),
  });
}

/**
 * The work kept under `key` that is the start of this run's: the kept files that are `toRead`'s first, each
 * the same content at the same place in the order; null where none is.
 */
export async function keptWork(
  cache: string,
  key: string,
  toRead: { file: ExternalFile; seq: number }[],
): Promise<KeptWork | null> {
  const dir = folder(cache);
  let state: KeptState;
  try {
    state = JSON.parse(await readFile(join(dir, 'state.json'), 'utf8')) as KeptState;
  } catch {
    return null; // none kept, or left half made by a run that died while keeping it
  }
  if (state.key !== key) return null;
  let n = 0;
  while (
    n < state.files.length &&
    n < toRead.length &&
    state.files[n]!.file.xxh64 === toRead[n]!.file.xxh64 &&
    state.files[n]!.file.segment.startsWith(`${String(toRead[n]!.seq).padStart(5, '0')}-`)
  )
    n++;
  return n === 0 ? null : { dir, files: state.files.slice(0, n) };
}

/** Forgets the kept work (the stage succeeded: it is in the stage's folder now). */
export async function dropKeptWork(cache: string): Promise<void> {
  await rm(folder(cache), { recursive: true, force: true });
}
