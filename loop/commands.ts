// `prefab models list|show|export|promote|rollback`: the model registry (loop/registry.ts) by hand. Every promotion
// and rollback is a line of the registry's history, with who asked and why.
import { InvalidArgumentError, Option, type Command } from 'commander';
import type { GgufType } from '../model/gguf.ts';
import { join } from 'node:path';
import { wholeNumber, type CommandContext } from '../pipeline/commands.ts';
import type { Engine, Manifest, StageOutcome } from '../pipeline/engine.ts';
import type { Logger } from '../pipeline/log.ts';
import { UsageError } from '../pipeline/errors.ts';
import { STOP_SIGNALS, signalExitCode } from '../pipeline/interrupt.ts';
import { readJsonFile } from '../pipeline/workspace.ts';
import { commandOptions, deviceFor } from '../runtime/device.ts';
import type { Day } from './days.ts';
import { Registry, type VersionInfo } from './registry.ts';
import { SERVE_DEFAULTS, parseSplit, refreshConfig, serveApiKey, type Arm, type RefreshConfig } from './settings.ts';

/** The workspace's registry; a history line that is not a decision is reported in the log. */
const registryOf = (program: Command, log: Logger) =>
  new Registry(join(program.opts<{ workdir: string }>().workdir, 'registry'), (m) => log.warn(m));

/** A version's validation success as its eval table gives it (the column of the stage that trained it; a refresh's paired evaluation). */
function success(v: VersionInfo): string {
  const paired = (v.eval as { paired?: { success: { candidate: number; production: number } } } | null)?.paired;
  if (paired) return `paired ${paired.success.candidate.toFixed(3)} vs ${paired.success.production.toFixed(3)}`;
  const models = (v.eval as { models?: Record<string, Record<string, number | null>> } | null)?.models ?? {};
  const column = models[String(v.source.stage ?? '')] ?? {};
  const key = Object.keys(column).find((k) => k.startsWith('success/mean@'));
  return key && typeof column[key] === 'number' ? `${key} ${column[key].toFixed(3)}` : '—';
}

export function addRegistryCommands(program: Command, ctx: CommandContext): void {
  ctx.afterRun(registerRunModel);
  const models = program
    .command('models')
    .description(
      'the model registry: every trained model a version; production and candidate aliases; promote and roll back',
    );
  models
    .command('list')
    .description('every version: when, its parent, its aliases, what trained it and its validation success')
    .option('--json', 'one JSON object: aliases, versions and history')
    .action((opts: { json?: boolean }) => {
      const registry = registryOf(program, ctx.logger());
      const aliases = registry.aliases();
      const versions = registry.versions();
      if (opts.json) {
        process.stdout.write(JSON.stringify({ aliases, versions, history: registry.history() }, null, 2) + '\n');
        return;
      }
      if (versions.length === 0) {
        process.stdout.write(`no versions in ${registry.dir}\n`);
        return;
      }
      const rows = versions.map((v) => [
        v.id,
        v.created_at.slice(0, 19).replace('T', ' '),
        v.parent ?? '—',
        [aliases.production === v.id ? 'production' : '', aliases.candidate === v.id ? 'candidate' : '']
          .filter(Boolean)
          .join(', ') || '—',
        String(v.source.stage ?? '—'),
        success(v),
      ]);
      const head = ['version', 'created', 'parent', 'aliases', 'trained by', 'validation'];
      const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
      for (const r of [head, ...rows])
        process.stdout.write(
          r
            .map((c, i) => c.padEnd(widths[i]!))
            .join('  ')
            .trimEnd() + '\n',
        );
    });
  models
    .command('show')
    .argument('<version>', 'a version id, production or candidate')
    .description("a version's info (version.json: parent, source, config, eval) and its folder, as JSON")
    .action((name: string) => {
      const registry = registryOf(program, ctx.logger());
      const aliases = registry.aliases();
      const id = name === 'production' || name === 'candidate' ? aliases[name] : name;
      if (id === null) {
        process.stderr.write(`the registry has no ${name}\n`);
        ctx.setExit(1);
        return;
      }
      process.stdout.write(
        JSON.stringify({ ...registry.version(id), folder: join(registry.folder(id), 'model') }, null, 2) + '\n',
      );
    });
  models
    .command('export')
    .argument('<version>', 'a version id, production or candidate')
    .requiredOption('--out <path>', 'the GGUF file, or the folder, to write')
    .addOption(new Option('--format <format>', 'what to write').choices(['gguf', 'hf']).default('gguf'))
    .addOption(new Option('--type <type>', "GGUF's weights").choices(['f32', 'f16', 'q8_0']).default('f16'))
    .description(
      "a version's model as GGUF (llama.cpp, Ollama) or one Hugging Face folder: `prefab model export` on its folder",
    )
    .action(async (name: string, opts: { out: string; format: 'gguf' | 'hf'; type: GgufType }) => {
      const registry = registryOf(program, ctx.logger());
      const aliases = registry.aliases();
      const id = name === 'production' || name === 'candidate' ? aliases[name] : name;
      if (id === null) throw new UsageError(`the registry has no ${name}`);
      registry.version(id); // names a version that does not exist
      await deviceFor(commandOptions(program), ctx.logger());
      const { exportModel } = await import('../model/export.ts');
      const from = join(registry.folder(id), 'model');
      process.stdout.write(
        JSON.stringify({ version: id, ...exportModel({ from, name: `prefab ${id}`, ...opts }) }) + '\n',
      );
      ctx.setExit(0);
    });
  models
    .command('promote')
    .argument('<version>', 'the version to make production')
    .option('--reason <text>', 'why, for the history', 'promoted by hand')
    .description('make a version production (recorded in the history)')
    .action((id: string, opts: { reason: string }) => {
      const e = registryOf(program, ctx.logger()).promote(id, opts.reason, 'prefab models promote');
      process.stdout.write(`${e.version} is production (was ${'from' in e ? (e.from ?? 'none') : 'none'})\n`);
    });
  models
    .command('rollback')
    .option('--reason <text>', 'why, for the history', 'rolled back by hand')
    .description('put back the production before the current one (recorded in the history)')
    .action((opts: { reason: string }) => {
      const e = registryOf(program, ctx.logger()).rollback(opts.reason, 'prefab models rollback');
      process.stdout.write(`${e.version} is production again (was ${'from' in e ? e.from : '?'})\n`);
    });
}

/** `prefab serve`: registry versions behind an OpenAI-compatible API until SIGTERM, SIGINT or SIGHUP, which let the requests in flight finish. */
export function addServeCommand(program: Command, ctx: CommandContext): void {
  program
    .command('serve')
    .description(
      'serve registry versions over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/models); requests in flight are decoded together. PREFAB_SERVE_API_KEY set: clients must send it as a bearer token',
    )
    .option(
      '--model <name>',
      'the version a request for the model `prefab` gets (a version id, production or candidate)',
      'production',
    )
    .option(
      '--split <arms>',
      'share conversations asking for production among versions by a stable hash, e.g. production=0.8,candidate=0.2',
      (v) => {
        try {
          return parseSplit(v);
        } catch (error) {
          throw new InvalidArgumentError((error as Error).message);
        }
      },
    )
    .option(
      '--host <host>',
      'address to listen on (beyond 127.0.0.1: PREFAB_SERVE_API_KEY or --no-auth)',
      SERVE_DEFAULTS.host,
    )
    .option('--no-auth', 'serve without a key on an address other machines reach (PREFAB_SERVE_API_KEY unset)')
    .option('--port <n>', 'port (0: any free one)', wholeNumber, SERVE_DEFAULTS.port)
    .option('--max-batch <n>', 'requests decoded together per version', wholeNumber, SERVE_DEFAULTS.maxBatch)
    .option(
      '--max-queue <n>',
      'requests waiting beyond those, per version (one more is answered 429)',
      wholeNumber,
      SERVE_DEFAULTS.maxQueue,
    )
    .option(
      '--max-tokens <n>',
      'tokens in a reply when the request does not say, and the most it may ask for',
      wholeNumber,
      SERVE_DEFAULTS.maxTokens,
    )
    .option('--max-body-bytes <n>', 'largest request body (413 past it)', wholeNumber, SERVE_DEFAULTS.maxBodyBytes)
    .option(
      '--follow-ms <n>',
      'how often the registry is read for promotions and rollbacks, which move production and candidate (0: never)',
      wholeNumber,
      5000,
    )
    .action(
      async (opts: {
        model: string;
        split?: Arm[];
        host: string;
        port: number;
        maxBatch: number;
        maxQueue: number;
        maxTokens: number;
        maxBodyBytes: number;
        followMs: number;
        auth: boolean;
      }) => {
        const log = ctx.logger();
        let apiKey: string | null;
        try {
          apiKey = serveApiKey(process.env.PREFAB_SERVE_API_KEY, { host: opts.host, noAuth: !opts.auth });
        } catch (error) {
          throw new UsageError((error as Error).message);
        }
        if (apiKey === null)
          log.warn('no API key: every client that reaches the server may call it', { host: opts.host });
        const device = await deviceFor(commandOptions(program), log);
        const [{ followAliases, loadCatalog }, { startServer }] = await Promise.all([
          import('./serve/batcher.ts'),
          import('./serve/http.ts'),
        ]);
        const registry = registryOf(program, ctx.logger());
        const names = [...new Set([opts.model, ...(opts.split ?? []).map((a) => a.name)])];
        const settings = {
          ...opts,
          defaultModel: opts.model,
          maxBatch: Math.max(1, opts.maxBatch),
          apiKey,
          split: opts.split ?? null,
          device,
          log,
        };
        const catalog = loadCatalog(registry, names, settings);
        const running = await startServer(catalog, settings, log);
        const served = names.map((n) => `${n} = ${catalog.get(n)!.version}`).join(', ');
        process.stdout.write(
          `serving ${served} at ${running.url}${settings.split ? ` (split: ${settings.split.map((a) => `${a.name} ${a.share}`).join(', ')})` : ''}${settings.apiKey ? ' (API key required)' : ''}\n`,
        );
        // A promotion or rollback made while serving (a nightly refresh) moves the aliases.
        const follow = opts.followMs
          ? setInterval(() => {
              try {
                for (const move of followAliases(catalog, registry, settings)) log.info(`now serving ${move}`);
              } catch (error) {
                log.warn('could not follow the registry', { error: (error as Error).message });
              }
            }, opts.followMs)
          : null;
        // SIGHUP too (a closed terminal): the streams in flight finish rather than die with the process.
        const signal = await new Promise<NodeJS.Signals>((resolve) => {
          for (const s of STOP_SIGNALS) process.once(s, () => resolve(s));
        });
        if (follow) clearInterval(follow);
        log.info('shutting down: no new requests, those in flight finish', { signal });
        await running.close();
        for (const m of new Set(catalog.values()))
          log.info('served', { version: m.version, generated_tokens: m.generated });
        ctx.setExit(0);
      },
    );
}

/**
 * After a run: the model of the last stage that makes one among those the run reached (the pipeline's final
 * model, or SFT's after `--until sft`) becomes a registry version unless one already holds those weights (the
 * same stage fingerprint). The first is production.
 */
async function registerRunModel(engine: Engine, log: Logger, outcomes: StageOutcome[]): Promise<void> {
  // The last model the run reached: the dapo stage's after a whole run, SFT's after `--until sft`.
  const reached = new Set(outcomes.filter((o) => o.action === 'ran' || o.action === 'fresh').map((o) => o.stage));
  const stage = [...engine.stages].reverse().find((s) => s.outputs.includes('model') && reached.has(s.name));
  const manifestOf = (name: string) => readJsonFile<Manifest>(engine.ws.manifestPath(name));
  const made = stage && (await manifestOf(stage.name));
  if (!stage || !made) return;
  const registry = new Registry(join(engine.ws.root, 'registry'), (m) => log.warn(m));
  if (registry.versions().some((v) => v.source.fingerprint === made.fingerprint)) return;
  const folder = join(engine.ws.stageDir(stage.name), 'model');
  const state = await readJsonFile<{ info?: { stage?: string } }>(join(folder, 'trainer_state.json'));
  const manifests = (await Promise.all(engine.stages.map((s) => manifestOf(s.name)))).filter((m) => m !== null);
  // Its eval table: a stage that read this very model and wrote eval.json.
  const evaluator = engine.stages.find(
    (s) =>
      s.inputs.includes(stage.name) &&
      s.outputs.includes('eval.json') &&
      manifests.find((m) => m.stage === s.name)?.inputs[stage.name] === made.fingerprint,
  );
  const source = {
    stage: state?.info?.stage ?? stage.name,
    run: 'prefab run',
    folder: stage.name,
    fingerprint: made.fingerprint,
    fingerprints: Object.fromEntries(manifests.map((m) => [m.stage, m.fingerprint])),
    sessions: manifests.find((m) => m.stage === 'ingest')?.counts.sessions ?? null,
    pairs: manifests.find((m) => m.stage === 'export')?.counts.pairs_train ?? null,
  };
  const evalTable = evaluator ? await readJsonFile(join(engine.ws.stageDir(evaluator.name), 'eval.json')) : null;
  const id = registry.register(folder, { source, config: engine.config, eval: evalTable });
  const { production } = registry.aliases();
  log.info(
    production === id
      ? `registered the model as ${id}: production (there was none)`
      : `registered the model as ${id}: the candidate (production is ${production}; \`prefab models promote ${id}\` to serve it)`,
    { registry: registry.dir },
  );
}

/** `prefab refresh [--days N]`: a night of the online loop, or N simulated days of it, holding the workspace's lock. */
export function addRefreshCommand(program: Command, ctx: CommandContext): void {
  ctx.configSections({ refresh: refreshConfig });
  program
    .command('refresh')
    .description(
      "one night of the online loop: take in the inbox's sessions, train a candidate from production, evaluate both on the same tasks and seeds, promote only when better with confidence, roll back a production whose live success fell",
    )
    .option(
      '--days <n>',
      "N simulated days end to end: serve production, the simulator's users talk to it, refresh; prints a table",
      wholeNumber,
    )
    .action(async (opts: { days?: number }) => {
      const log = ctx.logger();
      const device = await deviceFor(commandOptions(program), log);
      const { engine, own } = ctx.pipeline(log);
      const cfg = own.refresh as RefreshConfig;
      const [{ formatNight, refreshNight }, { formatDays, simulatedDays }] = await Promise.all([
        import('./refresh.ts'),
        import('./days.ts'),
      ]);
      const { signal } = await ctx.locked(engine, `prefab ${process.argv.slice(2).join(' ')}`, log, async (abort) => {
        if (opts.days === undefined) {
          process.stdout.write(formatNight(await refreshNight({ engine, cfg, device, signal: abort, log })) + '\n');
          await ctx.resultsChanged(engine, log);
          return;
        }
        const onDay = async (d: Day) => {
          process.stdout.write(formatNight(d.night, d.traffic) + '\n\n');
          await ctx.resultsChanged(engine, log);
        };
        const days = await simulatedDays({ engine, cfg, device, signal: abort, log, days: opts.days, onDay });
        process.stdout.write(formatDays(days) + '\n');
      });
      ctx.setExit(signal ? signalExitCode(signal) : 0);
    });
}
