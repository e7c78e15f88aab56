// The model registry: every trained model is a version (a copy of its Hugging Face folder, its parent, what
// it was trained on, its config and eval table), `production` and `candidate` are aliases, and every decision
// is a line of an append-only history a person can read (history.jsonl). The history is the truth: a
// decision is one appended line, so a kill -9 leaves the line or nothing (a torn last line is ignored when
// read and cut off before the next append), and the aliases are what replaying it gives.
import {
  appendFileSync,
  closeSync,
  cpSync,
  existsSync,
  fstatSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  renameSync,
  rmSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
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

export class Registry {
  constructor(readonly dir: string) {}

  private get historyPath(): string {
    return join(this.dir, 'history.jsonl');
  }

  /** Every decision in order; a line torn by a kill is not one. */
  history(): RegistryEvent[] {
    if (!existsSync(this.historyPath)) return [];
    const events: RegistryEvent[] = [];
    for (const line of readFileSync(this.historyPath, 'utf8').split('\n')) {
      if (!line) continue;
      try {
        events.push(JSON.parse(line) as RegistryEvent);
      } catch {
        // torn by a kill mid-append: the decision was not made
      }
    }
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

  /** Makes `id` production (one history line), saying why and, when given, who decided (`by`: a command, a refresh night). */
  promote(id: string, reason: string, by?: string): RegistryEvent {
    this.version(id);
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
  }

  /** The last decision `by` made (a promotion, rejection or rollback), if any: what a resumed refresh finds instead of deciding twice. */
  decidedBy(by: string): RegistryEvent | undefined {
    return this.history().findLast((e) => 'by' in e && e.by === by);
  }

  /** Puts back the production before the current one (rolling back twice goes back two promotions). */
  rollback(reason: string, by?: string): RegistryEvent {
    const stack = this.replay().productions;
    if (stack.length < 2)
      throw new PipelineError(
        `model registry ${this.dir}: nothing to roll back to (production ${stack[0] ?? 'none'} has no predecessor)`,
      );
    return this.append({
      at: new Date().toISOString(),
      event: 'rolled_back',
      version: stack.at(-2)!,
      from: stack.at(-1)!,
      reason,
      ...(by ? { by } : {}),
    });
  }

  /** Records that the candidate `id` was not promoted, and why; it stops being the candidate. */
  reject(id: string, reason: string, by?: string): RegistryEvent {
    this.version(id);
    return this.append({ at: new Date().toISOString(), event: 'rejected', version: id, reason, ...(by ? { by } : {}) });
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
