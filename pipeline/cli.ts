// The `prefab` command line: run, stage, status. Exit codes: 0 ok, 1 a stage or the run failed, 2 usage,
// 130, 143 and 129 interrupted by SIGINT, SIGTERM and SIGHUP.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import type { z } from 'zod';
import { loadConfig } from './config.ts';
import { configReference } from './config-reference.ts';
import { Engine, configSchema, type Assessment, type StageOutcome } from './engine.ts';
import { PipelineError, UsageError, errorMessage } from './errors.ts';
import { Logger, type LogFormat } from './log.ts';
import type { AfterRun, CommandFactory } from './commands.ts';
import type { Shard, Stage } from './stage.ts';
import { Workspace, acquireLock, liveRun, rememberConfig, rememberedConfig, type LockInfo } from './workspace.ts';
import { parseShard } from './shards.ts';
import { STOP_SIGNALS, signalExitCode } from './interrupt.ts';

const DEFAULT_CONFIG = 'configs/default.yaml';

function threads(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('expected a whole number of threads, at least 1');
  return n;
}

const APP_VERSION: string = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

/** The program's own global options, and any a command factory added (the stages get them all). */
interface GlobalOptions {
  workdir: string;
  config: string;
  logFormat?: LogFormat;
  quiet?: boolean;
  [option: string]: unknown;
}

/**
 * The global options, --config filled in: without it a command reads the config the workspace was made with
 * (`prefab run --config X` once, then `prefab refresh`, `prefab status`… read X), else configs/default.yaml.
 */
function globalOptions(program: Command): GlobalOptions {
  const opts = program.opts<GlobalOptions>();
  if (program.getOptionValueSource('config') !== 'default') return opts;
  return { ...opts, config: rememberedConfig(resolve(opts.workdir)) ?? opts.config };
}

/** Config sections commands added (`refresh`): a config file may hold them beside the stages'. */
const commandSections: Record<string, z.ZodType> = {};

function makeEngine(stages: Stage[], opts: GlobalOptions, log: Logger): Engine {
  return withSections(stages, opts, log).engine;
}

/** The engine, its config validated with the stages' sections and the commands' own, those returned apart. */
function withSections(
  stages: Stage[],
  opts: GlobalOptions,
  log: Logger,
): { engine: Engine; own: Record<string, unknown> } {
  const loaded = loadConfig(opts.config, configSchema(stages).extend(commandSections));
  const value = loaded.value as Record<string, unknown>;
  const own = Object.fromEntries(Object.keys(commandSections).map((k) => [k, value[k]]));
  const config = Object.fromEntries(Object.entries(value).filter(([k]) => !(k in commandSections)));
  return { engine: new Engine(stages, resolve(opts.workdir), config, loaded.dir, log, APP_VERSION, opts), own };
}

function pad(s: string, n: number): string {
  return s.length >= n ? s : s + ' '.repeat(n - s.length);
}

function printOutcomes(outcomes: StageOutcome[], format: LogFormat, interrupted = false): void {
  const ok = !interrupted && outcomes.every((o) => o.action !== 'failed' && o.action !== 'interrupted');
  const upToDate = outcomes.every((o) => o.action === 'fresh');
  if (format === 'json') {
    const message = upToDate ? 'Everything is up to date: nothing to do.' : undefined;
    process.stdout.write(JSON.stringify({ ok, up_to_date: upToDate, message, stages: outcomes }) + '\n');
    return;
  }
  if (upToDate) {
    process.stdout.write('Everything is up to date: nothing to do.\n');
    return;
  }
  for (const o of outcomes) {
    const time = o.action === 'ran' ? `${o.seconds.toFixed(1)}s` : '';
    const what =
      o.action === 'failed' || o.action === 'interrupted'
        ? o.error!
        : o.action === 'fresh'
          ? `up to date (${o.summary})`
          : o.summary;
    process.stdout.write(`${pad(o.stage, 8)} ${pad(o.action, 11)} ${pad(time, 7)} ${what}\n`);
  }
}

function printStatus(rows: Assessment[], live: LockInfo | null, json: boolean): void {
  if (json) {
    const stages = rows.map((a) => ({
      stage: a.stage,
      state: a.state,
      reasons: a.reasons,
      counts: a.manifest?.counts ?? null,
      finished_at: a.manifest?.finished_at ?? null,
      last_failure: a.lastFailure,
    }));
    process.stdout.write(JSON.stringify({ live_run: live, stages }, null, 2) + '\n');
    return;
  }
  if (live)
    process.stdout.write(
      `a run is live: pid ${live.pid} on ${live.host} since ${live.started_at} (\`${live.command}\`); what it is running shows as stale or never run until it finishes\n`,
    );
  for (const a of rows) {
    const detail = a.state === 'stale' ? `(${a.reasons.join('; ')})` : a.state === 'fresh' ? a.manifest!.summary : '';
    process.stdout.write(`${pad(a.stage, 8)} ${pad(a.state, 10)} ${detail}\n`);
    if (a.lastFailure)
      process.stdout.write(
        `${pad('', 8)} last attempt ${a.lastFailure.status} at ${a.lastFailure.at}: ${a.lastFailure.error}\n`,
      );
  }
}

/** How long an interrupted stage has to reach its next safe point before the process exits anyway. */
const GRACE_MS = 1500;

/**
 * Runs `body` holding the workspace's lock. The first SIGINT, SIGTERM or SIGHUP aborts the run's signal: the running
 * stage stops at its next safe point (a training stage writes a checkpoint there) and no other stage starts;
 * one that has not stopped after GRACE_MS, or a second signal, exits at once. Either way the attempt is
 * recorded for `prefab status`, the lock is released, and the exit code is 128 + the signal's number.
 */
async function withLock<T>(
  engine: Engine,
  command: string,
  log: Logger,
  body: (signal: AbortSignal) => Promise<T>,
): Promise<{ result: T; signal: NodeJS.Signals | null }> {
  const release = await acquireLock(new Workspace(engine.ws.root), command, log);
  try {
    const config = resolve(String(engine.options.config ?? DEFAULT_CONFIG));
    const was = rememberConfig(engine.ws.root, config, engine.options.switchConfig === true);
    if (was) log.warn('this workspace reads another config from now on (--switch-config)', { config, was });
  } catch (error) {
    release();
    throw error;
  }
  const controller = new AbortController();
  let received: NodeJS.Signals | null = null;
  let grace: NodeJS.Timeout | undefined;
  const exitNow = (signal: NodeJS.Signals) => {
    const message = engine.recordInterruptionNow(signal);
    log.warn('stopped at once', { signal, ...(message ? { what: message } : {}) });
    release();
    process.exit(signalExitCode(signal));
  };
  const onSignal = (signal: NodeJS.Signals) => {
    if (received) return exitNow(signal);
    received = signal;
    log.warn('interrupted: stopping at the next safe point; a second signal stops at once', {
      signal,
      stage: engine.running,
    });
    controller.abort(signal);
    grace = setTimeout(() => exitNow(signal), GRACE_MS);
  };
  for (const s of STOP_SIGNALS) process.on(s, onSignal);
  try {
    return { result: await body(controller.signal), signal: received };
  } finally {
    clearTimeout(grace);
    for (const s of STOP_SIGNALS) process.off(s, onSignal);
    release();
  }
}

function buildProgram(stages: Stage[], setExit: (code: number) => void, commands: CommandFactory[] = []): Command {
  const program = new Command('prefab')
    .description('Turn logged LLM-agent sessions into preference datasets (Parquet) and train on them.')
    .version(APP_VERSION)
    .addOption(
      new Option('-w, --workdir <dir>', 'workspace folder: one folder per stage, with manifests').default('workspace'),
    )
    .addOption(
      new Option('-c, --config <file>', 'YAML config').default(
        DEFAULT_CONFIG,
        'the one the workspace was made with, else configs/default.yaml',
      ),
    )
    .addOption(
      new Option('--log-format <format>', 'log lines on stderr (default: text on a terminal, json otherwise)').choices([
        'text',
        'json',
      ]),
    )
    .option('-q, --quiet', 'only warnings and errors on stderr')
    .option(
      '--switch-config',
      'make --config this workspace’s config from now on (a workspace refuses another config than the one it was made with)',
    )
    .option('--verbose', "a failed stage's stack trace in its error line")
    .addOption(
      new Option(
        '--workers <n>',
        'threads for the data stages (1: the main thread only; default: one per core, up to 4, for large input files)',
      ).argParser(threads),
    )
    .showHelpAfterError()
    .exitOverride();
  const logger = () => {
    const o = program.opts<GlobalOptions>();
    return new Logger(o.logFormat ?? Logger.defaultFormat(), process.stderr, {}, o.quiet ?? false);
  };
  const afterRun: AfterRun[] = [];
  const afterResults: ((engine: Engine, log: Logger) => Promise<void> | void)[] = [];
  const resultsChanged = async (engine: Engine, log: Logger) => {
    for (const hook of afterResults) await hook(engine, log);
  };
  /** After a run without failures or interruptions, the hooks commands added (the registry's, then the report's). */
  const finished = async (engine: Engine, log: Logger, outcomes: StageOutcome[], signal: NodeJS.Signals | null) => {
    if (signal || outcomes.some((o) => o.action === 'failed' || o.action === 'interrupted')) return;
    for (const hook of afterRun) await hook(engine, log, outcomes);
    await resultsChanged(engine, log);
  };

  program
    .command('run')
    .description('run every stale stage in order; with nothing changed, does nothing and says so')
    .option('--from <stage>', 'start at this stage (earlier stages are taken as they are)')
    .option('--until <stage>', 'stop after this stage')
    .option(
      '--shard <i/N>',
      'make only the i-th (from 0) of N parts of the data, by task, up to the last stage that can (then `prefab merge` the N workspaces)',
      parseShard,
    )
    .action(async (opts: { from?: string; until?: string; shard?: Shard }) => {
      const log = logger();
      const engine = makeEngine(stages, globalOptions(program), log);
      const { result: outcomes, signal } = await withLock(
        engine,
        `prefab ${process.argv.slice(2).join(' ')}`,
        log,
        (abort) => engine.run({ ...opts, signal: abort }),
      );
      printOutcomes(outcomes, log.format, signal !== null);
      await finished(engine, log, outcomes, signal);
      setExit(signal ? signalExitCode(signal) : outcomes.some((o) => o.action === 'failed') ? 1 : 0);
    });

  program
    .command('stage')
    .description('force one stage to run now, even if fresh; the stages downstream of it become stale')
    .argument('<name>', `one of: ${stages.map((s) => s.name).join(', ')}`)
    .option(
      '--shard <i/N>',
      'in a shard workspace: make the stage for this shard, as `prefab run --shard` did',
      parseShard,
    )
    .action(async (name: string, opts: { shard?: Shard }) => {
      const log = logger();
      const engine = makeEngine(stages, globalOptions(program), log);
      engine.stage(name);
      const { result: outcomes, signal } = await withLock(engine, `prefab stage ${name}`, log, (abort) =>
        engine.run({ force: name, signal: abort, shard: opts.shard }),
      );
      printOutcomes(outcomes, log.format, signal !== null);
      await finished(engine, log, outcomes, signal);
      setExit(signal ? signalExitCode(signal) : outcomes.some((o) => o.action === 'failed') ? 1 : 0);
    });

  program
    .command('status')
    .description('show every stage: fresh, stale (and why) or never run, with what it made')
    .option('--json', 'machine-readable output')
    .option(
      '--verify',
      'hash every output and compare it with its manifest (otherwise only outputs whose size or mtime changed are hashed)',
    )
    .option('--shard <i/N>', 'in a shard workspace: fresh or stale for this shard', parseShard)
    .action(async (opts: { json?: boolean; verify?: boolean; shard?: Shard }) => {
      const log = logger();
      const engine = makeEngine(stages, globalOptions(program), log);
      const made = rememberedConfig(engine.ws.root);
      const config = resolve(globalOptions(program).config);
      if (made !== null && made !== config)
        log.warn(`this workspace was made with --config ${made}: what follows is as ${config} would have it`);
      printStatus(
        await engine.status(opts.verify ?? false, opts.shard ?? null),
        liveRun(engine.ws),
        opts.json ?? false,
      );
      setExit(0);
    });

  program
    .command('merge')
    .description(
      'join shard workspaces (`prefab run --shard i/N`) into --workdir, byte for byte what one run on all the data makes; then `prefab run` there goes on',
    )
    .argument('<shards...>', 'the N shard workspaces, in any order')
    .action(async (dirs: string[]) => {
      const log = logger();
      const engine = makeEngine(stages, globalOptions(program), log);
      const { mergeShards } = await import('./merge.ts');
      const { result: outcomes } = await withLock(engine, `prefab merge ${dirs.join(' ')}`, log, () =>
        mergeShards(engine, dirs, log),
      );
      printOutcomes(outcomes, log.format);
      setExit(0);
    });

  program
    .command('stages')
    .description('list the stages in run order with what each reads and writes')
    .action(() => {
      for (const s of stages)
        process.stdout.write(
          `${pad(s.name, 8)} ${s.description}\n${pad('', 8)} reads: ${s.inputs.join(', ') || '(input files)'}; writes: ${s.outputs.join(', ')}\n`,
        );
      setExit(0);
    });
  program
    .command('config-reference')
    .description('print every config key with its type, default and meaning, as Markdown (docs/config.md is this)')
    .action(() => {
      const sections = Object.entries(commandSections).map(([name, config]) => ({
        name,
        description: config.description ?? `the ${name} command's settings`,
        config,
      }));
      process.stdout.write(configReference([...stages, ...sections]));
      setExit(0);
    });
  const ctx = {
    logger,
    setExit,
    configSections: (sections: Record<string, z.ZodType>) => void Object.assign(commandSections, sections),
    pipeline: (log: Logger) => withSections(stages, globalOptions(program), log),
    locked: withLock,
    afterRun: (hook: AfterRun) => void afterRun.push(hook),
    afterResults: (hook: (engine: Engine, log: Logger) => Promise<void> | void) => void afterResults.push(hook),
    resultsChanged,
  };
  for (const add of commands) add(program, ctx);
  return program;
}

/** Runs the command line and returns the exit code. */
export async function main(argv: string[], stages: Stage[], commands: CommandFactory[] = []): Promise<number> {
  // A reader that stops early (`prefab preview pairs | head -3`), or a terminal that hung up (EIO after
  // SIGHUP): what no one reads is dropped, and the command goes on to its end, as a run must (its work is not
  // lost to a closed pipe). Other write errors still throw.
  for (const stream of [process.stdout, process.stderr])
    stream.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code !== 'EPIPE' && error.code !== 'EIO') throw error;
    });
  let code = 0;
  const program = buildProgram(stages, (c) => (code = c), commands);
  try {
    await program.parseAsync(argv);
    return code;
  } catch (error) {
    const json = (program.opts<GlobalOptions>().logFormat ?? Logger.defaultFormat()) === 'json';
    if (error instanceof CommanderError) {
      const exit = error.exitCode === 0 ? 0 : 2;
      // Commander has said what was wrong on stderr; a scheduler reading stdout still gets its object.
      if (json && exit !== 0) process.stdout.write(JSON.stringify({ ok: false, exit, error: error.message }) + '\n');
      return exit;
    }
    const usage = error instanceof UsageError;
    const known = usage || error instanceof PipelineError;
    const message = known ? errorMessage(error) : ((error as Error).stack ?? String(error));
    const exit = usage ? 2 : 1;
    if (json) {
      new Logger('json', process.stderr).error(usage ? 'usage' : 'failed', { error: message });
      process.stdout.write(JSON.stringify({ ok: false, exit, error: message }) + '\n');
    } else process.stderr.write(`prefab: ${message}\n`);
    return exit;
  }
}
