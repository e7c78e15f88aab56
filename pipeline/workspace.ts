// The workspace on disk: a folder per stage, a lock, atomic writes, and the cache of input file hashes.
import { existsSync, linkSync, readFileSync, renameSync, rmSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { mkdir, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { checksumFile } from './hash.ts';
import { PipelineError, UsageError } from './errors.ts';
import type { Logger } from './log.ts';

export class Workspace {
  constructor(readonly root: string) {}

  stageDir(stage: string): string {
    return join(this.root, stage);
  }
  manifestPath(stage: string): string {
    return join(this.root, stage, 'manifest.json');
  }
  get tmpDir(): string {
    return join(this.root, '.tmp');
  }
  cacheDir(stage: string): string {
    return join(this.root, '.cache', stage);
  }
  attemptPath(stage: string): string {
    return join(this.root, '.runs', `${stage}.json`);
  }
  get lockPath(): string {
    return join(this.root, '.lock');
  }

  readJson<T>(path: string): Promise<T | null> {
    return readJsonFile<T>(path);
  }

  /**
   * Replaces a stage's folder with a finished one in two renames. A crash between them leaves no
   * folder (the stage then reads as never run) and the old one parked in .tmp, which `recover` puts back.
   */
  async commitStageDir(stage: string, finished: string): Promise<void> {
    const current = this.stageDir(stage);
    const parked = join(this.tmpDir, `${stage}.old-${randomBytes(4).toString('hex')}`);
    if (existsSync(current)) await rename(current, parked);
    await rename(finished, current);
    await rm(parked, { recursive: true, force: true });
  }

  /** Clears what an interrupted run left in .tmp; a parked folder whose replacement never arrived is restored. */
  async recover(log: Logger): Promise<void> {
    await mkdir(this.tmpDir, { recursive: true });
    for (const entry of await readdir(this.tmpDir)) {
      const path = join(this.tmpDir, entry);
      const parked = /^(.+)\.old-[0-9a-f]+$/.exec(entry);
      if (parked && !existsSync(this.stageDir(parked[1]!))) {
        await rename(path, this.stageDir(parked[1]!));
        log.warn('restored a stage folder parked by an interrupted run', { stage: parked[1] });
      } else {
        await rm(path, { recursive: true, force: true });
      }
    }
  }

  async newTmpDir(stage: string): Promise<string> {
    const dir = join(this.tmpDir, `${stage}-${Date.now()}-${randomBytes(4).toString('hex')}`);
    await mkdir(dir, { recursive: true });
    return dir;
  }
}

/** Where a workspace remembers the config file it was made with (rememberConfig). */
const CONFIG_RECORD = '.config.json';

/**
 * Checks that `config` (a config file's absolute path) is the one the workspace at `root` was made with, and
 * remembers it where the workspace has none yet, or (`adopt`, `--switch-config`) from now on: a run that forgot
 * its --config would otherwise read the default config's inputs into the user's data. Returns the config the
 * workspace had, where it changed.
 */
export function rememberConfig(root: string, config: string, adopt: boolean): string | null {
  const path = join(root, CONFIG_RECORD);
  let known: string | undefined;
  try {
    known = (JSON.parse(readFileSync(path, 'utf8')) as { config?: string }).config;
  } catch {
    known = undefined; // none yet (or unreadable): this config becomes the workspace's
  }
  if (known === config) return null;
  if (known !== undefined && !adopt)
    throw new UsageError(
      `workspace ${root} was made with --config ${known}, and this command reads ${config}. Leave --config out to go on with the workspace's; or, to make ${config} this workspace's config from now on, add --switch-config.`,
    );
  writeFileAtomicNow(path, JSON.stringify({ config, since: new Date().toISOString() }) + '\n');
  return known ?? null;
}

/** The config file a workspace was made with, or null where it does not say (rememberConfig). */
export function rememberedConfig(root: string): string | null {
  try {
    return (JSON.parse(readFileSync(join(root, CONFIG_RECORD), 'utf8')) as { config?: string }).config ?? null;
  } catch {
    return null;
  }
}

/** A JSON file this program wrote, or null when it is missing or unreadable (e.g. from a run that died). */
export async function readJsonFile<T>(path: string): Promise<T | null> {
  try {
    return JSON.parse(await readFile(path, 'utf8')) as T;
  } catch {
    return null;
  }
}

/** Writes a file whole or not at all: a temporary sibling, then a rename. */
export async function writeFileAtomic(path: string, data: string): Promise<void> {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  await writeFile(tmp, data);
  await rename(tmp, path);
}

/** The same, for a process about to exit, where no promise would finish. */
export function writeFileAtomicNow(path: string, data: string): void {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, path);
}

export interface LockInfo {
  pid: number;
  host: string;
  started_at: string;
  command: string;
  /** The process's start time in clock ticks since boot (Linux), so a reused pid is not mistaken for the holder. */
  pid_start?: string;
}

function processStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

function isAlive(info: LockInfo): boolean {
  try {
    process.kill(info.pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ESRCH') return false;
  }
  const start = processStart(info.pid);
  return !(info.pid_start && start && start !== info.pid_start);
}

/** The run holding the workspace now, when its process is alive (or on another host, where it cannot be checked). */
export function liveRun(ws: Workspace): LockInfo | null {
  const holder = readLock(ws.lockPath);
  if (!holder) return null;
  return holder.host !== hostname() || isAlive(holder) ? holder : null;
}

/**
 * Takes the workspace lock, or explains who holds it. A lock left by a dead process on this host is
 * reported and taken over; one from another host cannot be checked and must be removed by hand.
 */
export async function acquireLock(ws: Workspace, command: string, log: Logger): Promise<() => void> {
  await mkdir(ws.root, { recursive: true });
  const mine: LockInfo = {
    pid: process.pid,
    host: hostname(),
    started_at: new Date().toISOString(),
    command,
    pid_start: processStart(process.pid),
  };
  const tmp = `${ws.lockPath}.${process.pid}.tmp`;
  try {
    writeFileSync(tmp, JSON.stringify(mine) + '\n');
  } catch (error) {
    rmSync(tmp, { force: true });
    const e = error as NodeJS.ErrnoException;
    throw new PipelineError(
      `cannot take the workspace's lock: ${tmp} could not be written (${e.code ?? e.message})${e.code === 'ENOSPC' ? ': the disk is full' : ''}`,
    );
  }
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        linkSync(tmp, ws.lockPath); // atomic: fails if a lock exists
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST' || attempt > 0) throw lockError(ws, error);
        const holder = readLock(ws.lockPath);
        if (holder && holder.host !== mine.host) {
          throw new PipelineError(
            `workspace ${ws.root} is locked by pid ${holder.pid} on host ${holder.host} (since ${holder.started_at}, \`${holder.command}\`). ` +
              `If that run is gone, delete ${ws.lockPath} and try again.`,
          );
        }
        if (holder && isAlive(holder)) {
          throw new PipelineError(
            `workspace ${ws.root} is in use by another run: pid ${holder.pid} since ${holder.started_at} (\`${holder.command}\`). ` +
              `Wait for it to finish; two runs never write one workspace.`,
          );
        }
        log.warn('stale lock removed', {
          reason: holder
            ? `pid ${holder.pid} (\`${holder.command}\`, since ${holder.started_at}) is no longer running: it was killed or crashed; its unfinished output is discarded`
            : 'the lock file was unreadable (written by a run that died while taking it)',
        });
        unlinkSync(ws.lockPath);
      }
    }
  } finally {
    unlinkSync(tmp);
  }
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    const holder = readLock(ws.lockPath);
    if (holder?.pid === process.pid) unlinkSync(ws.lockPath);
  };
  process.once('exit', release);
  return release;
}

function readLock(path: string): LockInfo | null {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as LockInfo;
  } catch {
    return null;
  }
}

function lockError(ws: Workspace, error: unknown): Error {
  return new PipelineError(`cannot take the lock ${ws.lockPath}: ${(error as Error).message}`);
}

interface HashCacheEntry {
  size: number;
  mtimeMs: number;
  ino: number;
  /** Absent in an entry written before files were known by XXH64 (it held `sha256`): hashed again. */
  xxh64?: string;
}

/** Content hashes of input files (XXH64), recomputed only when a file's size, mtime or inode changed. */
export async function hashFilesCached(
  ws: Workspace,
  paths: string[],
): Promise<Map<string, { xxh64: string; bytes: number }>> {
  const cachePath = join(ws.root, '.cache', 'file-hashes.json');
  const cache = (await ws.readJson<Record<string, HashCacheEntry>>(cachePath)) ?? {};
  const out = new Map<string, { xxh64: string; bytes: number }>();
  let changed = false;
  for (const path of paths) {
    const s = statSync(path); // hundreds of small files: a round trip each to the thread pool added up
    let entry = cache[path];
    if (!entry?.xxh64 || entry.size !== s.size || entry.mtimeMs !== s.mtimeMs || entry.ino !== s.ino) {
      entry = { size: s.size, mtimeMs: s.mtimeMs, ino: s.ino, xxh64: await checksumFile(path, s.size) };
      cache[path] = entry;
      changed = true;
    }
    out.set(path, { xxh64: entry.xxh64!, bytes: s.size });
  }
  if (changed) {
    await mkdir(join(ws.root, '.cache'), { recursive: true });
    await writeFileAtomic(cachePath, JSON.stringify(cache));
  }
  return out;
}
