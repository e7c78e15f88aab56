// The model registry: every trained model is a version (a copy of its Hugging Face folder, its parent, what
// it was trained on, its config and eval table), `production` and `candidate` are aliases, and every decision
// is a line of an append-only history a person can read (history.jsonl). The history is the truth: a
// decision is one appended line, so a kill -9 leaves the line or nothing (a torn last line is ignored when
// read and cut off before the next append), and the aliases are what replaying it gives. Every decision
// takes the registry's lock and reads the history again under it, so that two made at once (four `prefab
// models promote` in parallel, a night and a person) are made one after the other, each from what the other
// left.
import {
  appendFileSync,
  closeSync,
  cpSync,
  existsSync,
  fstatSync,
  fsyncSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { PipelineError } from '../pipeline/errors.ts';

/** What a version was trained on and how it did: written once, when it is registered. */
export interface VersionInfo {
  id: string;
  created_at: string;
  /** The production version when it was registered (what it was trained to replace), or null. */
  parent: string | null;
  /** Where it came from: the stage that trained it, the stages' fingerprints, session and pair counts. */
  source: Record<string, unknown>;
  /** The config it was trained with. */
  config: unknown;
  /** Its eval table (model → metric → value), when it was evaluated. */
  eval: unknown;
  /** Each file of model/ as registered (its path there → size and SHA-256), so that a damaged copy is never promoted. Absent in versions registered before. */
  files?: Record<string, FileDigest>;
}

interface FileDigest {
  bytes: number;
  sha256: string;
}

/** Every file under `dir` (paths relative to it, sorted) with its size and SHA-256, read a MiB at a time. */
function digests(dir: string): Record<string, FileDigest> {
  const out: Record<string, FileDigest> = {};
  const buffer = Buffer.allocUnsafe(1 << 20);
  const walk = (rel: string) => {
    const path = join(dir, rel);
    if (statSync(path).isDirectory()) {
      for (const f of readdirSync(path).sort()) walk(rel ? join(rel, f) : f);
      return;
    }
    const hash = createHash('sha256');
    const fd = openSync(path, 'r');
    let bytes = 0;
    try {
      for (let n; (n = readSync(fd, buffer, 0, buffer.length, null)) > 0; bytes += n)
        hash.update(buffer.subarray(0, n));
    } finally {
      closeSync(fd);
    }
    out[rel] = { bytes, sha256: hash.digest('hex') };
  };
  walk('');
  return out;
}

export type RegistryEvent =
  | { at: string; event: 'registered'; version: string; parent: string | null }
  | { at: string; event: 'candidate'; version: string }
  | { at: string; event: 'promoted' | 'rolled_back'; version: string; from: string | null; reason: string; by?: string }
  | { at: string; event: 'rejected'; version: string; reason: string; by?: string };

export interface Aliases {
  production: string | null;
  candidate: string | null;
}

const VERSION = /^v(\d{4,})$/;

const EVENTS = new Set(['registered', 'candidate', 'promoted', 'rolled_back', 'rejected']);

/** Whether a parsed history line is a decision: its event one of EVENTS, with the version it is about. */
const isDecision = (e: unknown): e is RegistryEvent =>
  e !== null &&
  typeof e === 'object' &&
  !Array.isArray(e) &&
  EVENTS.has((e as { event?: unknown }).event as string) &&
  typeof (e as { version?: unknown }).version === 'string';

/** How long a decision waits for another one's lock before it gives up, saying who holds it. */
const LOCK_WAIT_MS = 30_000;

export class Registry {
  /** `warn` hears of history lines that are not decisions (skipped). */
  constructor(
    readonly dir: string,
    private readonly warn: (message: string) => void = () => {},
  ) {}

  private get historyPath(): string {
    return join(this.dir, 'history.jsonl');
  }

  /**
   * Every decision in order. The last line, torn by a kill mid-append, was no decision; any other line that is
   * not one (not JSON, null, an object without an event and a version) is skipped and reported by line number.
   */
  history(): RegistryEvent[] {
    if (!existsSync(this.historyPath)) return [];
    const events: RegistryEvent[] = [];
    const text = readFileSync(this.historyPath, 'utf8');
    const lines = text.split('\n');
    lines.forEach((line, i) => {
      if (!line) return;
      const torn = i === lines.length - 1; // no newline after it: the append did not finish
      let e: unknown;
      try {
        e = JSON.parse(line);
      } catch {
        if (!torn) this.warn(`${this.historyPath} line ${i + 1}: not JSON, so not a decision; skipped`);
        return;
      }
      if (isDecision(e)) events.push(e);
      else
        this.warn(
          `${this.historyPath} line ${i + 1}: ${JSON.stringify(e).slice(0, 80)} is not a decision (an object with an event and a version); skipped`,
        );
    });
    return events;
  }

  /** The aliases the history gives. */
  aliases(): Aliases {
    const { productions, candidate } = this.replay();
    return { production: productions.at(-1) ?? null, candidate };
  }

  /** The history replayed: the productions in force, oldest first (a promotion stacks one, a rollback takes the top one off), and the candidate. */
  private replay(): { productions: string[]; candidate: string | null } {
    const productions: string[] = [];
    let candidate: string | null = null;
    for (const e of this.history()) {
      if (e.event === 'promoted') productions.push(e.version);
      if (e.event === 'rolled_back') productions.pop();
      if (e.event === 'candidate') candidate = e.version;
      if ((e.event === 'promoted' || e.event === 'rejected') && candidate === e.version) candidate = null;
    }
    return { productions, candidate };
  }

  /** The registered versions, oldest first. */
  versions(): VersionInfo[] {
    return this.history().flatMap((e) => (e.event === 'registered' ? [this.info(e.version)] : []));
  }

  private info(id: string): VersionInfo {
    return JSON.parse(readFileSync(join(this.folder(id), 'version.json'), 'utf8')) as VersionInfo;
  }

  /** A registered version's info. */
  version(id: string): VersionInfo {
    if (!this.history().some((e) => e.event === 'registered' && e.version === id))
      throw new PipelineError(
        `model registry ${this.dir}: no version ${id}; \`prefab models list\` shows the versions`,
      );
    return this.info(id);
  }

  /** A version's folder: version.json beside model/ (the Hugging Face folder). */
  folder(id: string): string {
    return join(this.dir, 'versions', id);
  }

  /**
   * Registers the model in `modelDir` as a new version (its folder copied aside, then renamed into place, then
   * the history line): production when there is none, else the candidate. Returns its id.
   */
  register(modelDir: string, info: Pick<VersionInfo, 'source' | 'config' | 'eval'>, now = new Date()): string {
    return this.locked(() => this.registerLocked(modelDir, info, now));
  }

  private registerLocked(modelDir: string, info: Pick<VersionInfo, 'source' | 'config' | 'eval'>, now: Date): string {
    const versions = join(this.dir, 'versions');
    mkdirSync(versions, { recursive: true });
    // A copy a kill left half-made, or renamed but never recorded, is not a version: its number is taken anew.
    for (const f of readdirSync(versions))
      if (f.startsWith('.tmp-')) rmSync(join(versions, f), { recursive: true, force: true });
    const taken = readdirSync(versions).flatMap((f) => (VERSION.test(f) ? [Number(VERSION.exec(f)![1])] : []));
    const id = `v${String(Math.max(0, ...taken) + 1).padStart(4, '0')}`;
    const { production } = this.aliases();
    const version: VersionInfo = { id, created_at: now.toISOString(), parent: production, ...info };
    const tmp = join(versions, `.tmp-${id}`);
    cpSync(modelDir, join(tmp, 'model'), { recursive: true });
    version.files = digests(join(tmp, 'model'));
    writeFileSync(join(tmp, 'version.json'), JSON.stringify(version, null, 2) + '\n');
    renameSync(tmp, this.folder(id));
    this.append({ at: version.created_at, event: 'registered', version: id, parent: production });
    if (production === null)
      this.append({
        at: version.created_at,
        event: 'promoted',
        version: id,
        from: null,
        reason: 'the first model: there was no production',
      });
    else this.append({ at: version.created_at, event: 'candidate', version: id });
    return id;
  }

  /**
   * What is wrong with version `id`'s files against what was registered (a file missing, another size, another
   * SHA-256), or null where they are whole, or where the version predates the record.
   */
  damage(id: string): string | null {
    const registered = this.version(id).files;
    if (!registered) return null;
    const model = join(this.folder(id), 'model');
    if (!existsSync(model)) return 'its model/ folder is gone';
    // Hashing a model is slow: the answer is kept while its files' sizes and times stay as they were (a
    // server following the registry asks every few seconds).
    const stamp = JSON.stringify(
      Object.keys(registered).map((f) => {
        const st = statSync(join(model, f), { throwIfNoEntry: false });
        return st ? [st.size, st.mtimeMs, st.ino] : null;
      }),
    );
    const known = this.checked.get(id);
    if (known?.stamp === stamp) return known.damage;
    const damage = this.compare(model, registered);
    this.checked.set(id, { stamp, damage });
    return damage;
  }

  private readonly checked = new Map<string, { stamp: string; damage: string | null }>();

  private compare(model: string, registered: Record<string, FileDigest>): string | null {
    const now = digests(model);
    for (const [file, was] of Object.entries(registered)) {
      const is = now[file];
      if (!is) return `model/${file} is gone`;
      if (is.bytes !== was.bytes) return `model/${file} is ${is.bytes} bytes, registered ${was.bytes}`;
      if (is.sha256 !== was.sha256) return `model/${file} has another SHA-256 than the file registered`;
    }
    return null;
  }

  /** Refuses a decision that would serve version `id` when its files are damaged. */
  private mustBeWhole(id: string, decision: string): void {
    const damage = this.damage(id);
    if (damage)
      throw new PipelineError(
        `${id} is damaged (${damage}): not ${decision}. Register its model again from where it was trained.`,
      );
  }

  /** Makes `id` production (one history line), saying why and, when given, who decided (`by`: a command, a refresh night). */
  promote(id: string, reason: string, by?: string): RegistryEvent {
    return this.locked(() => {
      this.mustBeWhole(id, 'promoted');
      const { production } = this.aliases();
      if (production === id) throw new PipelineError(`${id} is already production`);
      return this.append({
        at: new Date().toISOString(),
        event: 'promoted',
        version: id,
        from: production,
        reason,
        ...(by ? { by } : {}),
      });
    });
  }

  /** The last decision `by` made (a promotion, rejection or rollback), if any: what a resumed refresh finds instead of deciding twice. */
  decidedBy(by: string): RegistryEvent | undefined {
    return this.history().findLast((e) => 'by' in e && e.by === by);
  }

  /** Puts back the production before the current one (rolling back twice goes back two promotions). */
  rollback(reason: string, by?: string): RegistryEvent {
    return this.locked(() => {
      const stack = this.replay().productions;
      if (stack.length < 2)
        throw new PipelineError(
          `model registry ${this.dir}: nothing to roll back to (production ${stack[0] ?? 'none'} has no predecessor)`,
        );
      this.mustBeWhole(stack.at(-2)!, 'rolled back to');
      return this.append({
        at: new Date().toISOString(),
        event: 'rolled_back',
        version: stack.at(-2)!,
        from: stack.at(-1)!,
        reason,
        ...(by ? { by } : {}),
      });
    });
  }

  /** Records that the candidate `id` was not promoted, and why; it stops being the candidate. */
  reject(id: string, reason: string, by?: string): RegistryEvent {
    return this.locked(() => {
      this.version(id);
      return this.append({
        at: new Date().toISOString(),
        event: 'rejected',
        version: id,
        reason,
        ...(by ? { by } : {}),
      });
    });
  }

  /**
   * Runs a decision holding the registry's lock (registry/.lock, holding the holder's pid): waits for another
   * decision's to go, takes over one whose process is gone, and gives up after LOCK_WAIT_MS saying who holds
   * it. The decision reads the history again inside, so it decides from what is there now. The lock is taken
   * as the workspace's is (pipeline/workspace.ts): a hard link to a file already holding the pid, so a kill
   * never leaves a lock without its holder; its inode says whose it is, so a lock is only ever removed by
   * the process that saw it stale, or the one that made it.
   */
  private locked<T>(decide: () => T): T {
    mkdirSync(this.dir, { recursive: true });
    const path = join(this.dir, '.lock');
    const mine = `${path}.${process.pid}.tmp`;
    writeFileSync(mine, `${process.pid}\n`);
    const until = Date.now() + LOCK_WAIT_MS;
    let held: number;
    try {
      for (;;) {
        try {
          linkSync(mine, path);
          held = statSync(path).ino;
          break;
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== 'EEXIST')
            throw new PipelineError(`cannot take the registry's lock ${path}: ${(error as Error).message}`);
        }
        const seen = inodeOf(path);
        const holder = Number(readFileSyncOrEmpty(path).trim());
        // Gone, or this very process (whose decisions never nest): a pid reused since, as pid 1 in a container.
        if (holder > 0 && (holder === process.pid || !alive(holder))) {
          if (inodeOf(path) === seen) rmSync(path, { force: true }); // not a lock another process took meanwhile
          continue;
        }
        if (Date.now() > until)
          throw new PipelineError(
            `model registry ${this.dir} is locked by process ${holder || '?'} making a decision; try again once it has finished (or remove ${path} if no such process runs)`,
          );
        Atomics.wait(SLEEP, 0, 0, 10);
      }
    } finally {
      rmSync(mine, { force: true });
    }
    this.sweepLockFiles();
    try {
      return decide();
    } finally {
      if (inodeOf(path) === held) rmSync(path, { force: true });
    }
  }

  /** Removes the files of processes killed while taking the lock (`.lock.PID.tmp`, their pid gone). */
  private sweepLockFiles(): void {
    for (const name of readdirSync(this.dir)) {
      const pid = /^\.lock\.(\d+)\.tmp$/.exec(name)?.[1];
      if (pid && !alive(Number(pid))) rmSync(join(this.dir, name), { force: true });
    }
  }

  /** Appends one decision, durably; a torn last line a kill left is cut off first, so it never swallows this one. */
  private append(e: RegistryEvent): RegistryEvent {
    mkdirSync(this.dir, { recursive: true });
    if (existsSync(this.historyPath) && !endsWithNewline(this.historyPath)) {
      const text = readFileSync(this.historyPath, 'utf8');
      truncateSync(this.historyPath, Buffer.byteLength(text.slice(0, text.lastIndexOf('\n') + 1)));
    }
    appendFileSync(this.historyPath, JSON.stringify(e) + '\n');
    const fd = openSync(this.historyPath, 'r');
    fsyncSync(fd);
    closeSync(fd);
    return e;
  }
}

/** A buffer to wait on: a decision waits for another's lock without returning to the event loop. */
const SLEEP = new Int32Array(new SharedArrayBuffer(4));

/** A file's text, or '' when it is gone (a lock released meanwhile). */
function readFileSyncOrEmpty(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** The inode of the file at `path`, or null where there is none. */
function inodeOf(path: string): number | null {
  try {
    return statSync(path).ino;
  } catch {
    return null;
  }
}

/** Whether a process of this machine is running. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether the file is empty or ends with a newline (reads its last byte only). */
function endsWithNewline(path: string): boolean {
  const fd = openSync(path, 'r');
  try {
    const size = fstatSync(fd).size;
    if (size === 0) return true;
    const last = Buffer.alloc(1);
    readSync(fd, last, 0, 1, size - 1);
    return last[0] === 0x0a;
  } finally {
    closeSync(fd);
  }
}
