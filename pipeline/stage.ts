// What a stage declares and what the engine hands it.
// The engine knows nothing of what stages compute.
import type { z } from 'zod';
import type { Logger } from './log.ts';

export interface ExternalFile {
  /** Absolute path. */
  path: string;
  /** Path as the user will recognise it (relative to the working directory). */
  name: string;
  /** The content's XXH64 (pipeline/hash.ts `checksum`). */
  xxh64: string;
  bytes: number;
}

export interface StageContext<C> {
  config: C;
  /** Folder of the config file: relative paths in the config are resolved against it. */
  configDir: string;
  /** Empty temporary folder: the stage writes its outputs here; the engine moves them into place on success. */
  out: string;
  /** The stage's last committed folder, or null: for stages that add to what they made before. */
  previous: string | null;
  /** The committed folder of an upstream stage named in `inputs`. */
  input(stage: string): string;
  /** Every stage this one reads from, directly or not, as its manifest recorded it: for provenance. */
  lineage: Lineage[];
  /** The external files named by `external`, with their content hashes. */
  external: ExternalFile[];
  /** A folder that outlives runs, for per-item caches: an interrupted stage resumes from it. */
  cache: string;
  /**
   * A hash of everything this run's output depends on: the stage's code version, its config (and the
   * environment settings it names), its inputs' fingerprints and its external files. Work kept in `cache`
   * under this key (a training run's checkpoints) belongs to this run and no other.
   */
  key: string;
  /**
   * Aborted when the user interrupts the run (SIGINT, SIGTERM): long loops stop at their next safe point
   * (pipeline/interrupt.ts), keeping what a rerun can resume from, and throw Interrupted.
   */
  signal: AbortSignal;
  /** The command line's global options (e.g. `--backend`): how to run, never what to make, so no fingerprint holds them. */
  options: StageOptions;
  /**
   * `prefab run --shard i/N`: the part of the data this run makes (pipeline/shards.ts), or null for all of it.
   * Only a stage that declares a `shard` merge gets one.
   */
  shard: Shard | null;
  log: Logger;
}

/**
 * The command line's global options as the stages get them. A module that adds an option to the CLI declares
 * its type here (TypeScript's declaration merging: runtime/device.ts's `backend`), so the option travels typed.
 */
export interface StageOptions {
  readonly [option: string]: unknown;
}

/** The i-th (from 0) of `count` deterministic parts of the data: `prefab run --shard index/count`. */
export interface Shard {
  index: number;
  count: number;
}

/** One shard's committed folder of a stage, and what its manifest says it made. */
export interface ShardPart {
  shard: Shard;
  dir: string;
  counts: Record<string, number>;
  summary: string;
}

export interface Lineage {
  stage: string;
  code_version: string;
  config_hash: string;
  fingerprint: string;
  finished_at: string;
  counts: Record<string, number>;
}

export interface StageReport {
  /** Rows per output, and whatever else the stage counted (dropped, quarantined, ...). */
  counts: Record<string, number>;
  /** One line saying what the stage did, for the run summary. */
  summary: string;
}

export interface Stage<S extends z.ZodType = z.ZodType> {
  name: string;
  description: string;
  /** Bumped when the stage's output for the same inputs changes: part of its fingerprint. */
  version: number;
  /** Upstream stages whose outputs this stage reads. */
  inputs: string[];
  /** Files and folders the stage writes into its folder. */
  outputs: string[];
  /** Its section of the config, under the key `name`. */
  config: S;
  /** External input files (resolved, existing), if the stage reads any; `log` hears of files passed over. */
  external?(config: z.infer<S>, configDir: string, log: Logger): Promise<string[]>;
  /**
   * Environment variables that are settings of the stage with this config (a model name, a base URL; never
   * a secret): their values are part of its fingerprint, so changing one makes the stage stale.
   */
  environment?(config: z.infer<S>): string[];
  run(ctx: StageContext<z.infer<S>>): Promise<StageReport>;
  /**
   * How the stage runs under `prefab run --shard i/N` (pipeline/shards.ts). 'whole': it reads all the data
   * on every shard, so every shard's output is the same and `prefab merge` keeps one. A function: it makes
   * only its shard's part, and this joins the parts (in shard order) into `out`, byte for byte what one run
   * on all the data writes. Absent: the stage needs all the data, and runs after `prefab merge`.
   */
  shard?: 'whole' | ((parts: ShardPart[], out: string) => Promise<StageReport>);
}

export function defineStage<S extends z.ZodType>(stage: Stage<S>): Stage<S> {
  return stage;
}
