// What a command the domain adds to the CLI (`simulate`, `serve`, an option such as `--backend`) gets from it.
import { InvalidArgumentError, type Command } from 'commander';
import type { z } from 'zod';
import type { Engine, StageOutcome } from './engine.ts';
import type { Logger } from './log.ts';

/** What runs after a `prefab run` or `prefab stage` that ended well: the pipeline, and each selected stage's outcome. */
export type AfterRun = (engine: Engine, log: Logger, outcomes: StageOutcome[]) => Promise<void> | void;

/** What a command added by the domain (e.g. `simulate`, or an option such as `--backend`) gets from the CLI. */
export interface CommandContext {
  logger(): Logger;
  setExit(code: number): void;
  /** Sections of a command's own that a config file may hold beside the stages' (every command then checks them). */
  configSections(sections: Record<string, z.ZodType>): void;
  /** The pipeline over the global --workdir and --config, and the values of the commands' own sections (apart from the stages'). */
  pipeline(log: Logger): { engine: Engine; own: Record<string, unknown> };
  /** Runs `body` holding the workspace's lock, as `prefab run` does: SIGINT or SIGTERM aborts its signal, and the next safe point stops it. */
  locked<T>(
    engine: Engine,
    command: string,
    log: Logger,
    body: (signal: AbortSignal) => Promise<T>,
  ): Promise<{ result: T; signal: NodeJS.Signals | null }>;
  /** `hook` runs after every `prefab run` or `prefab stage` that ended without a failure or an interruption. */
  afterRun(hook: AfterRun): void;
  /** `hook` runs whenever a command has left new results in the workspace: after the afterRun hooks, and when a command calls resultsChanged. */
  afterResults(hook: (engine: Engine, log: Logger) => Promise<void> | void): void;
  /** Runs the afterResults hooks: a command that changed the workspace's results outside a run (a refresh night) calls it. */
  resultsChanged(engine: Engine, log: Logger): Promise<void>;
}

export type CommandFactory = (program: Command, ctx: CommandContext) => void;

/** An option's value as a whole number ≥ 0, or commander's usage error. */
export function wholeNumber(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError('expected a whole number');
  return n;
}
