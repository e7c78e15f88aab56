// Orders stages, decides which are stale, runs them into temporary folders and commits them with a manifest.
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { mkdir, readdir, rm, stat } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { checksumFile, hashJson, outputChecksum } from './hash.ts';
import { collectAfterStage, holdHeapGrowth } from './memory.ts';
import { UsageError, errorMessage } from './errors.ts';
import { Interrupted, NEVER } from './interrupt.ts';
import type { Logger } from './log.ts';
import { shardName } from './shards.ts';
import type { ExternalFile, Lineage, Shard, Stage, StageOptions, StageReport } from './stage.ts';
import { Workspace, hashFilesCached, writeFileAtomic, writeFileAtomicNow } from './workspace.ts';

interface OutputFile {
  path: string;
  bytes: number;
  /** Its content's XXH64 (pipeline/hash.ts `checksum`). */
  xxh64: string;
  /** Modification time when written: a file whose size or mtime has changed since is checksummed again. */
  mtime_ms?: number;
}

export interface Manifest {
  stage: string;
  status: 'ok';
  code_version: string;
  config_hash: string;
  /** Upstream stage → the fingerprint of its outputs this run read. */
  inputs: Record<string, string>;
  external: { name: string; xxh64: string; bytes: number }[];
  outputs: OutputFile[];
  /** Hash of all output files' hashes: what downstream stages record as their input. */
  fingerprint: string;
  counts: Record<string, number>;
  summary: string;
  run_id: string;
  started_at: string;
  finished_at: string;
  seconds: number;
  /** The part of the data a sharded stage made (`prefab run --shard`); absent: all of it. */
  shard?: Shard;
  /** Set when an upstream stage was forced with `prefab stage`: this stage is stale until it reruns. */
  invalidated_by?: { stage: string; at: string };
}

type StageState = 'fresh' | 'stale' | 'never run';

export interface Assessment {
  stage: string;
  state: StageState;
  reasons: string[];
  manifest: Manifest | null;
  /** The last attempt, when it failed or was interrupted after the stage last finished. */
  lastFailure: { status: 'failed' | 'interrupted'; at: string; error: string } | null;
}

export interface StageOutcome {
  stage: string;
  action: 'ran' | 'fresh' | 'failed' | 'interrupted' | 'not reached';
  reasons: string[];
  summary: string;
  counts: Record<string, number>;
  seconds: number;
  error?: string;
}

interface Attempt {
  status: 'ok' | 'failed' | 'interrupted';
  at: string;
  error?: string;
}

/** The whole config's schema: one section per stage, under its name; unknown sections are errors. */
export function configSchema(stages: Stage[]) {
  return z.strictObject(Object.fromEntries(stages.map((s) => [s.name, s.config.prefault({})])));
}

export class Engine {
  readonly ws: Workspace;
  private readonly byName: Map<string, Stage>;

  constructor(
    readonly stages: Stage[],
    workdir: string,
    readonly config: Record<string, unknown>,
    readonly configDir: string,
    readonly log: Logger,
    readonly appVersion: string,
    /** The command line's global options, handed to every stage as they are. */
    readonly options: StageOptions = {},
  ) {
    this.ws = new Workspace(workdir);
    this.byName = new Map(stages.map((s) => [s.name, s]));
    stages.forEach((stage, i) => {
      for (const input of stage.inputs) {
        const at = stages.findIndex((s) => s.name === input);
        if (at < 0 || at >= i) throw new Error(`stage ${stage.name} reads ${input}, which is not an earlier stage`);
      }
    });
  }

  stage(name: string): Stage {
    const stage = this.byName.get(name);
    if (!stage)
      throw new UsageError(`unknown stage '${name}'; the stages are: ${this.stages.map((s) => s.name).join(', ')}`);
    return stage;
  }

  /** Stages downstream of `name`, transitively, in run order. */
  downstream(name: string): Stage[] {
    const reached = new Set([name]);
    return this.stages.filter((s) => {
      if (!s.inputs.some((i) => reached.has(i))) return false;
      reached.add(s.name);
      return true;
    });
  }

  codeVersion(stage: Stage): string {
    return `${this.appVersion}/${stage.name}@${stage.version}`;
  }

  /** The stage's config section, and the environment variables it takes settings from (hashed, never stored). */
  configHash(stage: Stage): string {
    const section = this.config[stage.name] ?? {};
    const names = stage.environment?.(section) ?? [];
    if (names.length === 0) return hashJson(section);
    return hashJson({ section, environment: Object.fromEntries(names.map((n) => [n, process.env[n] ?? null])) });
  }

  private async externalFiles(stage: Stage): Promise<ExternalFile[]> {
    if (!stage.external) return [];
    const paths = await stage.external(this.config[stage.name], this.configDir, this.log.child({ stage: stage.name }));
    const hashes = await hashFilesCached(this.ws, paths);
    return paths.map((path) => ({ path, name: relative(process.cwd(), path) || path, ...hashes.get(path)! }));
  }

  async manifest(stage: string): Promise<Manifest | null> {
    return this.ws.readJson<Manifest>(this.ws.manifestPath(stage));
  }

  /**
   * Fresh, stale (and why) or never run. An output whose size or mtime differs from what the manifest
   * recorded is hashed again and is stale when its content changed; `verify` hashes every output.
   */
  async assess(
    stage: Stage,
    external?: ExternalFile[],
    verify = false,
    shard: Shard | null = null,
  ): Promise<Assessment> {
    const manifest = await this.manifest(stage.name);
    const attempt = await this.ws.readJson<Attempt>(this.ws.attemptPath(stage.name));
    const lastFailure =
      attempt && attempt.status !== 'ok' && (!manifest || attempt.at > manifest.finished_at)
        ? { status: attempt.status, at: attempt.at, error: attempt.error ?? '' }
        : null;
    if (!manifest) return { stage: stage.name, state: 'never run', reasons: [], manifest, lastFailure };

    const reasons: string[] = [];
    if (manifest.invalidated_by)
      reasons.push(
        `upstream ${manifest.invalidated_by.stage} was rerun by \`prefab stage\` at ${manifest.invalidated_by.at}`,
      );
    if (manifest.code_version !== this.codeVersion(stage))
      reasons.push(`code changed (${manifest.code_version} → ${this.codeVersion(stage)})`);
    const made = manifest.shard ?? null;
    const wanted = shardOf(stage, shard);
    if (shardName(made) !== shardName(wanted))
      reasons.push(`made for ${shardName(made)}, wanted for ${shardName(wanted)}`);
    if (manifest.config_hash !== this.configHash(stage))
      reasons.push(
        `config section '${stage.name}'${stage.environment ? ' (or an environment variable it reads)' : ''} changed`,
      );
    for (const input of stage.inputs) {
      const upstream = await this.manifest(input);
      if (!upstream) reasons.push(`upstream ${input} has no output`);
      else if (upstream.fingerprint !== manifest.inputs[input]) reasons.push(`upstream ${input} changed`);
    }
    try {
      reasons.push(...describeExternalChange(manifest.external, external ?? (await this.externalFiles(stage))));
    } catch (error) {
      reasons.push(`input files: ${errorMessage(error)}`);
    }
    for (const out of manifest.outputs) {
      const path = join(this.ws.stageDir(stage.name), out.path);
      const s = existsSync(path) ? statSync(path) : null;
      if (!s || s.size !== out.bytes) {
        reasons.push(`output ${out.path} is ${s ? 'altered (its size changed)' : 'missing'}`);
        break;
      }
      if (
        (verify || Math.floor(s.mtimeMs) !== Math.floor(out.mtime_ms ?? -1)) &&
        (await checksumFile(path, s.size)) !== out.xxh64
      ) {
        reasons.push(`output ${out.path} is altered (its content is not what the stage wrote)`);
        break;
      }
    }
    return { stage: stage.name, state: reasons.length ? 'stale' : 'fresh', reasons, manifest, lastFailure };
  }

  /** Every stage's assessment, in run order; `verify` hashes every output (`prefab status --verify`). */
  async status(verify = false, shard: Shard | null = null): Promise<Assessment[]> {
    const out: Assessment[] = [];
    const notFresh = new Set<string>();
    for (const stage of this.stages) {
      const a = await this.assess(stage, undefined, verify, shard);
      for (const input of stage.inputs) {
        if (notFresh.has(input) && !a.reasons.some((r) => r.startsWith(`upstream ${input}`)))
          a.reasons.push(`upstream ${input} is not fresh`);
      }
      if (a.state === 'fresh' && a.reasons.length) a.state = 'stale';
      if (a.state !== 'fresh') notFresh.add(stage.name);
      out.push(a);
    }
    return out;
  }

  /** The stage running now, if any: what an interruption interrupts. */
  running: string | null = null;

  /** The stages that can run on a shard: the leading ones that declare how (pipeline/shards.ts). */
  get shardable(): Stage[] {
    const end = this.stages.findIndex((s) => !s.shard);
    return end < 0 ? this.stages : this.stages.slice(0, end);
  }

  /**
   * Runs the stale stages between `from` and `until` (inclusive), or exactly `force` and marks its downstream
   * stale. When `signal` is aborted, the running stage stops at its next safe point and no other starts.
   * With `shard`, the stages make that shard's part of the data, and stop before the first that needs all of it.
   */
  async run(
    options: { from?: string; until?: string; force?: string; signal?: AbortSignal; shard?: Shard | null } = {},
  ): Promise<StageOutcome[]> {
    const signal = options.signal ?? NEVER;
    const shard = options.shard ?? null;
    await this.ws.recover(this.log);
    let selected = this.stages;
    if (options.force) selected = [this.stage(options.force)];
    else {
      const last = shard ? this.shardable.length - 1 : this.stages.length - 1;
      const from = options.from ? this.stages.indexOf(this.stage(options.from)) : 0;
      const until = options.until ? this.stages.indexOf(this.stage(options.until)) : last;
      if (from > until) throw new UsageError(`--from ${options.from} comes after --until ${options.until}`);
      selected = this.stages.slice(from, until + 1);
    }
    const whole = shard ? selected.find((s) => !s.shard) : undefined;
    if (whole)
      throw new UsageError(
        `${whole.name} needs all the data, so it cannot run on a shard: run the shards up to ${this.shardable.at(-1)?.name ?? 'nothing'} (the default with --shard), join them with \`prefab merge\`, then run the rest there`,
      );

    const outcomes: StageOutcome[] = [];
    let failed = false;
    for (const stage of selected) {
      if (failed || signal.aborted) {
        outcomes.push({ stage: stage.name, action: 'not reached', reasons: [], summary: '', counts: {}, seconds: 0 });
        continue;
      }
      const log = this.log.child({ stage: stage.name });
      const external = await this.externalFiles(stage);
      const a = await this.assess(stage, external, false, shard);
      if (a.state === 'fresh' && !options.force) {
        log.info('fresh, skipped', { made: a.manifest!.finished_at });
        outcomes.push({
          stage: stage.name,
          action: 'fresh',
          reasons: [],
          summary: a.manifest!.summary,
          counts: a.manifest!.counts,
          seconds: 0,
        });
        continue;
      }
      for (const input of stage.inputs) {
        const upstream = await this.manifest(input);
        if (!upstream)
          throw new UsageError(
            `stage ${stage.name} reads ${input}, which has never run; run \`prefab run\` (or include ${input} in --from)`,
          );
        const made = upstream.shard ?? null;
        const wanted = shardOf(this.stage(input), shard);
        if (shardName(made) !== shardName(wanted))
          throw new UsageError(
            `stage ${stage.name} reads ${input}, which was made for ${shardName(made)}, not ${shardName(wanted)}; run \`prefab run${shard ? ` --shard ${shard.index}/${shard.count}` : ''}\` (or include ${input} in --from)`,
          );
      }
      const why = options.force ? ['forced by `prefab stage`'] : a.state === 'never run' ? ['never run'] : a.reasons;
      if (signal.aborted) {
        outcomes.push({ stage: stage.name, action: 'not reached', reasons: why, summary: '', counts: {}, seconds: 0 });
        continue;
      }
      log.info('running', { why: why.join('; ') });
      this.running = stage.name;
      try {
        const outcome = await this.execute(stage, external, a.manifest, log, signal, shardOf(stage, shard));
        outcomes.push({ ...outcome, reasons: why });
      } catch (error) {
        failed = true;
        if (error instanceof Interrupted) {
          // Recorded here, with what the stage said: an exit forced meanwhile must not overwrite it.
          this.running = null;
          log.warn('interrupted', { what: error.message });
          await this.recordAttempt(stage.name, {
            status: 'interrupted',
            at: new Date().toISOString(),
            error: error.message,
          });
          outcomes.push({
            stage: stage.name,
            action: 'interrupted',
            reasons: why,
            summary: '',
            counts: {},
            seconds: 0,
            error: error.message,
          });
          continue;
        }
        const message = errorMessage(error);
        log.error('failed', {
          error: message,
          ...(this.options.verbose && error instanceof Error ? { stack: error.stack } : {}),
        });
        await this.recordAttempt(stage.name, { status: 'failed', at: new Date().toISOString(), error: message });
        outcomes.push({
          stage: stage.name,
          action: 'failed',
          reasons: why,
          summary: '',
          counts: {},
          seconds: 0,
          error: message,
        });
      } finally {
        this.running = null;
      }
    }
    if (options.force && outcomes.some((o) => o.stage === options.force && o.action === 'ran'))
      await this.invalidateDownstream(options.force);
    return outcomes;
  }

  private async execute(
    stage: Stage,
    external: ExternalFile[],
    previous: Manifest | null,
    log: Logger,
    signal: AbortSignal,
    shard: Shard | null,
  ): Promise<StageOutcome> {
    const started = new Date();
    const out = await this.ws.newTmpDir(stage.name);
    const cache = this.ws.cacheDir(stage.name);
    await mkdir(cache, { recursive: true });
    const inputs: Record<string, string> = {};
    for (const input of stage.inputs) inputs[input] = (await this.manifest(input))!.fingerprint;

    holdHeapGrowth(); // a stage's memory follows what it keeps, not four times it
    try {
      return await this.runIn(stage, out, { external, previous, log, signal, shard, inputs, started, cache });
    } catch (error) {
      // What a failed stage wrote goes at once (the next run would discard it anyway): a disk it filled has
      // room again to record the failure.
      await rm(out, { recursive: true, force: true }).catch(() => {});
      throw error;
    }
  }

  private async runIn(
    stage: Stage,
    out: string,
    o: {
      external: ExternalFile[];
      previous: Manifest | null;
      log: Logger;
      signal: AbortSignal;
      shard: Shard | null;
      inputs: Record<string, string>;
      started: Date;
      cache: string;
    },
  ): Promise<StageOutcome> {
    const { external, previous, log, signal, shard, inputs, started, cache } = o;
    const report: StageReport = await stage.run({
      config: this.config[stage.name],
      configDir: this.configDir,
      out,
      previous: previous ? this.ws.stageDir(stage.name) : null,
      input: (name) => {
        if (!stage.inputs.includes(name)) throw new Error(`stage ${stage.name} did not declare ${name} as an input`);
        return this.ws.stageDir(name);
      },
      lineage: await this.lineage(stage),
      external,
      cache,
      key: hashJson({
        code: this.codeVersion(stage),
        config: this.configHash(stage),
        inputs,
        external: external.map((f) => f.xxh64),
        ...(shard ? { shard } : {}),
      }),
      signal,
      options: this.options,
      shard,
      log,
    });
    collectAfterStage(); // what the stage held goes back before the next one runs
    const manifest = await this.commit(stage, out, { inputs, external, report, started, shard });
    log.info('done', { summary: report.summary, seconds: manifest.seconds });
    return {
      stage: stage.name,
      action: 'ran',
      reasons: [],
      summary: report.summary,
      counts: report.counts,
      seconds: manifest.seconds,
    };
  }

  /** Hashes what a stage wrote into `out`, writes its manifest there and puts the folder in place. */
  async commit(
    stage: Stage,
    out: string,
    made: {
      inputs: Record<string, string>;
      external: Manifest['external'];
      report: StageReport;
      started: Date;
      shard: Shard | null;
    },
  ): Promise<Manifest> {
    for (const name of stage.outputs) {
      if (!existsSync(join(out, name)))
        throw new Error(`stage ${stage.name} did not write its declared output ${name}`);
    }
    const outputs = await checksumOutputs(out, stage.outputs);
    const finished = new Date();
    const manifest: Manifest = {
      stage: stage.name,
      status: 'ok',
      code_version: this.codeVersion(stage),
      config_hash: this.configHash(stage),
      inputs: made.inputs,
      external: made.external.map(({ name, xxh64, bytes }) => ({ name, xxh64, bytes })),
      outputs,
      // The content alone: where and when the files were written does not change what downstream reads.
      fingerprint: hashJson(outputs.map(({ path, bytes, xxh64 }) => ({ path, bytes, xxh64 }))),
      counts: made.report.counts,
      summary: made.report.summary,
      ...(made.shard ? { shard: made.shard } : {}),
      run_id: randomBytes(6).toString('hex'),
      started_at: made.started.toISOString(),
      finished_at: finished.toISOString(),
      seconds: (finished.getTime() - made.started.getTime()) / 1000,
    };
    await writeFileAtomic(join(out, 'manifest.json'), JSON.stringify(manifest, null, 2) + '\n');
    await this.ws.commitStageDir(stage.name, out);
    await this.recordAttempt(stage.name, { status: 'ok', at: manifest.finished_at });
    return manifest;
  }

  /** The manifests of every stage upstream of `stage`, in run order. */
  private async lineage(stage: Stage): Promise<Lineage[]> {
    const needed = new Set(stage.inputs);
    for (const s of [...this.stages].reverse()) if (needed.has(s.name)) s.inputs.forEach((i) => needed.add(i));
    const out: Lineage[] = [];
    for (const s of this.stages) {
      const m = needed.has(s.name) ? await this.manifest(s.name) : null;
      if (m)
        out.push({
          stage: m.stage,
          code_version: m.code_version,
          config_hash: m.config_hash,
          fingerprint: m.fingerprint,
          finished_at: m.finished_at,
          counts: m.counts,
        });
    }
    return out;
  }

  /**
   * Records that the running stage was interrupted before it reached a safe point, for a process about to exit
   * (synchronous: no promise would finish). Its temporary output is discarded by the next run.
   */
  recordInterruptionNow(signal: string): string | null {
    if (!this.running) return null;
    const message = `${this.running} interrupted by ${signal} before its next safe point: what it made is discarded, and the next run starts it again (a training stage resumes from its last checkpoint)`;
    mkdirSync(join(this.ws.root, '.runs'), { recursive: true });
    writeFileAtomicNow(
      this.ws.attemptPath(this.running),
      JSON.stringify({ status: 'interrupted', at: new Date().toISOString(), error: message } satisfies Attempt) + '\n',
    );
    return message;
  }

  private async recordAttempt(stage: string, attempt: Attempt): Promise<void> {
    try {
      await mkdir(join(this.ws.root, '.runs'), { recursive: true });
      await writeFileAtomic(this.ws.attemptPath(stage), JSON.stringify(attempt) + '\n');
    } catch (error) {
      if (attempt.status === 'ok') throw error;
      // A failure that cannot be recorded (the disk that failed the stage is full): the last record must not
      // go on saying ok, and the failure itself is what the user needs to read, not this one's stack.
      await rm(this.ws.attemptPath(stage), { force: true });
      this.log.warn('could not record the attempt for `prefab status`', {
        stage,
        file: this.ws.attemptPath(stage),
        error: errorMessage(error),
      });
    }
  }

  private async invalidateDownstream(name: string): Promise<void> {
    const at = new Date().toISOString();
    for (const stage of this.downstream(name)) {
      const manifest = await this.manifest(stage.name);
      if (!manifest) continue;
      manifest.invalidated_by = { stage: name, at };
      await writeFileAtomic(this.ws.manifestPath(stage.name), JSON.stringify(manifest, null, 2) + '\n');
      this.log.info('marked stale', { stage: stage.name, because: `${name} was forced` });
    }
  }
}

/** The shard a stage makes: only a stage that makes parts (a merge function) has one. */
const shardOf = (stage: Stage, shard: Shard | null): Shard | null => (typeof stage.shard === 'function' ? shard : null);

function describeExternalChange(before: Manifest['external'], now: ExternalFile[]): string[] {
  // A manifest written before files were known by XXH64 names none (its entries hold `sha256`): every file is new to it.
  const old = new Map(before.map((f) => [f.name, f.xxh64]));
  let added = 0;
  let changed = 0;
  for (const f of now) {
    const h = old.get(f.name);
    if (h === undefined) added++;
    else if (h !== f.xxh64) changed++;
    old.delete(f.name);
  }
  const removed = old.size;
  if (!added && !changed && !removed) return [];
  const parts = [added && `${added} new`, changed && `${changed} changed`, removed && `${removed} gone`].filter(
    Boolean,
  );
  return [`input files: ${parts.join(', ')}`];
}

async function checksumOutputs(dir: string, names: string[]): Promise<OutputFile[]> {
  const files: OutputFile[] = [];
  const walk = async (rel: string): Promise<void> => {
    const path = join(dir, rel);
    const s = await stat(path);
    if (s.isDirectory()) {
      for (const entry of (await readdir(path)).sort()) await walk(join(rel, entry));
    } else {
      files.push({ path: rel, bytes: s.size, xxh64: await outputChecksum(path, s), mtime_ms: s.mtimeMs });
    }
  };
  for (const name of names) await walk(name);
  return files;
}
