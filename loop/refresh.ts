// `prefab refresh`: one night of the online loop (seed 000). In order, each step written down before the next,
// so a night killed at any point resumes where it was or leaves production as it was:
//  1. live traffic: production's success on the sessions it served; below its baseline (what the production
//     it replaced did) × rollback.ratio, it is rolled back before anything is trained;
//  2. the data stages (ingest → … → export) take in the inbox's new sessions incrementally;
//  3. a replay buffer: every pair new tonight, then older pairs drawn by recency, up to buffer.size;
//  4. the candidate: DPO continued from production (also its reference) at a learning rate well below the
//     offline run's, one epoch;
//  5. candidate and production play the same validation tasks with the same seeds (paired, loop/paired.ts);
//  6. the candidate becomes a registry version and is promoted only if it is better with confidence and no
//     guard regressed; otherwise production stays, and the history and the report say why, with the numbers.
// The workspace's lock is held throughout: two refreshes (or a refresh and a run) never share a workspace.
import { existsSync, mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { join, resolve, sep } from 'node:path';
import type { Engine, Manifest } from '../pipeline/engine.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { hashJson } from '../pipeline/hash.ts';
import { readJsonl } from '../pipeline/jsonl.ts';
import type { Logger } from '../pipeline/log.ts';
import { readJsonFile, writeFileAtomic } from '../pipeline/workspace.ts';
import type { Pair, Session } from '../core/records.ts';
import { seeded } from '../core/random.ts';
import { TOOLS } from '../env/env.ts';
import { validationEpisodes, type EpisodeRecord } from '../env/evaluate.ts';
import type { Device } from '../runtime/device.ts';
import { withScorer } from '../runtime/engines.ts';
import { openChat } from '../model/chat.ts';
import { decodingEngine } from '../runtime/placement.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { nonFiniteWeight } from '../model/hf.ts';
import { readPreferencePairs } from '../trainers/data.ts';
import { dpoTrainer, lossOf, pairExamples, referenceScores } from '../trainers/dpo.ts';
import { EpisodePlayers } from '../runtime/policy.ts';
import { Diverged, finalMetrics, trainingRun } from '../trainers/run.ts';
import { runDapo } from '../rl/dapo.ts';
import { compare, type Comparison } from './paired.ts';
import { Registry } from './registry.ts';
import type { RefreshConfig } from './settings.ts';

/** A version's live figures on the sessions it served. */
export interface Live {
  version: string;
  sessions: number;
  success: number | null;
}

export interface NightReport {
  night: number;
  started_at: string;
  finished_at: string;
  production_before: string;
  /** The production the candidate was trained from and compared with: production_before, or what a rollback put back. */
  production: string;
  production_after: string;
  rollback: { rolled_back: boolean; live: Live | null; baseline: Live | null; reason: string };
  /** Every version's live success on the traffic it served (the arms of an A/B split side by side). */
  live: Live[];
  data: {
    sessions: number | null;
    new_sessions: number | null;
    pairs: number;
    new_pairs: number;
    buffer: { new: number; old: number };
  };
  candidate: string | null;
  training: Record<string, number>;
  comparison: Comparison | null;
  decision: 'promoted' | 'rejected' | 'nothing to train on';
  reason: string;
}

/** The session files in the inbox. */
const inboxFiles = (inbox: string) =>
  existsSync(inbox)
    ? readdirSync(inbox)
        .sort()
        .filter((f) => /\.jsonl(\.gz)?$/.test(f))
        .map((f) => join(inbox, f))
    : [];

/** Each version's live success on the sessions of `files` it served (a session's `model`). */
export async function liveFigures(files: string[], successReward: number): Promise<Map<string, Live>> {
  const out = new Map<string, Live>();
  const counts = new Map<string, [number, number]>();
  for (const file of files)
    for await (const s of readJsonl<Session>(file)) {
      if (!s.model) continue;
      let success = s.reward >= successReward;
      try {
        const meta = JSON.parse(s.metadata ?? '{}') as { success?: unknown };
        if (typeof meta.success === 'boolean') success = meta.success;
      } catch {
        // metadata that is not JSON: the reward decides
      }
      const c = counts.get(s.model) ?? [0, 0];
      counts.set(s.model, [c[0] + 1, c[1] + (success ? 1 : 0)]);
    }
  for (const [version, [n, k]] of counts) out.set(version, { version, sessions: n, success: n ? k / n : null });
  return out;
}

/**
 * Seed 000's safety rule: production's live success against its baseline, the live success of the production
 * it was promoted over. Either with fewer than min_sessions sessions, there is nothing to compare.
 */
function rollbackCheck(
  registry: Registry,
  live: Map<string, Live>,
  cfg: RefreshConfig['rollback'],
): { rollback: boolean; live: Live | null; baseline: Live | null; reason: string } {
  const { production } = registry.aliases();
  const made = registry
    .history()
    .findLast((e) => (e.event === 'promoted' || e.event === 'rolled_back') && e.version === production);
  const mine = production ? (live.get(production) ?? { version: production, sessions: 0, success: null }) : null;
  const from = made?.event === 'promoted' ? made.from : null;
  if (!mine || from === null)
    return {
      rollback: false,
      live: mine,
      baseline: null,
      reason: `${production ?? 'no production'} has no baseline (it replaced no production by promotion)`,
    };
  const base = live.get(from) ?? { version: from, sessions: 0, success: null };
  if (
    mine.sessions < cfg.min_sessions ||
    base.sessions < cfg.min_sessions ||
    mine.success === null ||
    base.success === null
  )
    return {
      rollback: false,
      live: mine,
      baseline: base,
      reason: `too little traffic to judge: ${production} served ${mine.sessions} sessions, its baseline ${from} ${base.sessions} (at least ${cfg.min_sessions} each)`,
    };
  const floor = base.success * cfg.ratio;
  const f = (x: number) => x.toFixed(3);
  return mine.success < floor
    ? {
        rollback: true,
        live: mine,
        baseline: base,
        reason: `live success ${f(mine.success)} over ${mine.sessions} sessions fell below ${cfg.ratio} × ${from}'s ${f(base.success)} (${mine.sessions}/${base.sessions} sessions)`,
      }
    : {
        rollback: false,
        live: mine,
        baseline: base,
        reason: `live success ${f(mine.success)} over ${mine.sessions} sessions, at least ${cfg.ratio} × ${from}'s ${f(base.success)}`,
      };
}

/**
 * The replay buffer: all new pairs (a seeded sample of them when there are more than `size`), then older ones
 * drawn without replacement with weight ½^(age / half-life) (Efraimidis–Spirakis keys), up to `size`.
 */
export function replayBuffer(
  pairs: Pair[],
  firstSeen: Record<string, number>,
  night: number,
  o: RefreshConfig['buffer'],
  seed: string,
): { chosen: Pair[]; fresh: number; old: number } {
  const rand = seeded(seed, 'buffer', night);
  const keyed = pairs.map((p) => {
    const age = night - (firstSeen[p.pair_id] ?? night);
    const weight = 0.5 ** (age / o.half_life_nights);
    return { p, fresh: age === 0, key: Math.log(rand() || Number.MIN_VALUE) / weight };
  });
  const fresh = keyed
    .filter((k) => k.fresh)
    .sort((a, b) => b.key - a.key)
    .slice(0, o.size);
  const old = keyed
    .filter((k) => !k.fresh)
    .sort((a, b) => b.key - a.key)
    .slice(0, o.size - fresh.length);
  return { chosen: [...fresh, ...old].map((k) => k.p), fresh: fresh.length, old: old.length };
}

interface NightState {
  night: number;
  started_at: string;
  production_before: string;
  rollback?: NightReport['rollback'];
  live?: Live[];
  /** The production the candidate is trained from and compared with (after any rollback). */
  production?: string;
  data?: NightReport['data'];
  /** Why the candidate is no model (its loss or weights not numbers), null once it trained whole; unset before. */
  diverged?: string | null;
}

/** Where the loop keeps its nights: refresh/nights/NNNN/ (state.json, buffer.json, candidate/, eval.json, report.json) and seen-pairs.json. */
const refreshDir = (engine: Engine) => join(engine.ws.root, 'refresh');

/** The inbox folder, checked to be read by ingest: one of its inputs, or inside a folder that is (read whole). */
export function inboxOf(engine: Engine, cfg: RefreshConfig): string {
  const inbox = resolve(engine.configDir, cfg.inbox);
  const inputs = ((engine.config.ingest as { inputs?: string[] } | undefined)?.inputs ?? []).map((i) =>
    resolve(engine.configDir, i),
  );
  if (!inputs.some((i) => inbox === i || inbox.startsWith(i + sep)))
    throw new PipelineError(
      `refresh.inbox ${inbox} is not among ingest.inputs nor inside a folder among them (${inputs.join(', ') || 'none'}; a pattern does not count): the night would not read its sessions. Pass the loop's config (--config configs/refresh.yaml), or add the inbox to ingest.inputs in yours.`,
    );
  return inbox;
}

/** Whether the last night began and did not finish (a kill): the next refresh resumes it. */
export function unfinishedNight(engine: Engine): boolean {
  const nightsDir = join(refreshDir(engine), 'nights');
  const last = existsSync(nightsDir)
    ? readdirSync(nightsDir)
        .filter((f) => /^\d{4}$/.test(f))
        .sort()
        .at(-1)
    : undefined;
  return last !== undefined && !existsSync(join(nightsDir, last, 'report.json'));
}

/** What a night runs on: the workspace's pipeline, the loop's settings, and the device it trains and plays on. */
export interface NightOptions {
  engine: Engine;
  cfg: RefreshConfig;
  device: Device;
  signal: AbortSignal;
  log: Logger;
}

/** Runs one night (resuming the last one if it did not finish). */
export async function refreshNight(o: NightOptions): Promise<NightReport> {
  const { engine, cfg, device, signal, log } = o;
  const registry = new Registry(join(engine.ws.root, 'registry'), (m) => log.warn(m));
  const inbox = inboxOf(engine, cfg);
  const start = registry.aliases().production;
  if (!start)
    throw new PipelineError(
      `no production model in ${registry.dir}: run \`prefab run\` first (its model becomes production)`,
    );
  const root = refreshDir(engine);
  const nightsDir = join(root, 'nights');
  mkdirSync(nightsDir, { recursive: true });

  const numbers = readdirSync(nightsDir)
    .filter((f) => /^\d{4}$/.test(f))
    .map(Number)
    .sort((a, b) => a - b);
  const last = numbers.at(-1);
  const resuming = last !== undefined && !existsSync(join(nightsDir, String(last).padStart(4, '0'), 'report.json'));
  const night = resuming ? last! : (last ?? 0) + 1;
  const dir = join(nightsDir, String(night).padStart(4, '0'));
  mkdirSync(dir, { recursive: true });
  const statePath = join(dir, 'state.json');
  const state: NightState = (await readJsonFile<NightState>(statePath)) ?? {
    night,
    started_at: new Date().toISOString(),
    production_before: start,
  };
  const save = () => writeFileAtomic(statePath, JSON.stringify(state, null, 2) + '\n');
  log.info(resuming ? `refresh: resuming night ${night}` : `refresh: night ${night}`, { production: start });
  const tag = `night ${night}`;

  // 1. Live traffic, and the rollback rule. A rollback this night already made (killed before it was written down) is not made twice.
  if (!state.rollback) {
    const live = await liveFigures(inboxFiles(inbox), cfg.rollback.success_reward);
    const versions = new Set(registry.history().flatMap((e) => (e.event === 'registered' ? [e.version] : [])));
    state.live = [...live.values()].filter((l) => versions.has(l.version));
    const check = rollbackCheck(registry, live, cfg.rollback);
    const by = `prefab refresh, ${tag}`;
    if (check.rollback && registry.decidedBy(by)?.event !== 'rolled_back') {
      const e = registry.rollback(`${tag}: ${check.reason}`, by);
      log.warn(`rolled back: ${e.version} is production again`, { reason: check.reason });
    }
    state.rollback = { rolled_back: check.rollback, live: check.live, baseline: check.baseline, reason: check.reason };
    state.production = registry.aliases().production!;
    await save();
  }
  const production = state.production!;

  // 2. The data stages take in the inbox (incrementally). The pairs the export held before the loop's first night are night 0's.
  const seenPath = join(root, 'seen-pairs.json');
  const exportDir = engine.ws.stageDir('export');
  if (!existsSync(seenPath) && existsSync(join(exportDir, 'pairs', 'train.parquet')))
    await writeFileAtomic(
      seenPath,
      JSON.stringify(
        Object.fromEntries((await readPreferencePairs<Pair>(exportDir, 'train')).map((p) => [p.pair_id, 0])),
      ) + '\n',
    );
  const outcomes = await engine.run({ until: 'export', signal });
  const failed = outcomes.find((o) => o.action === 'failed' || o.action === 'interrupted');
  if (failed)
    throw new PipelineError(`refresh ${tag}: the ${failed.stage} stage ${failed.action}: ${failed.error ?? ''}`);
  const ingest = outcomes.find((o) => o.stage === 'ingest');

  // 3. The replay buffer, kept so a resumed night trains on the same pairs.
  const bufferPath = join(dir, 'buffer.json');
  let buffer = await readJsonFile<{ pair_ids: string[]; fresh: number; old: number; pairs: number }>(bufferPath);
  const pairs = await readPreferencePairs<Pair>(exportDir, 'train');
  const firstSeen = (await readJsonFile<Record<string, number>>(seenPath)) ?? {};
  const fresh = pairs.filter((p) => firstSeen[p.pair_id] === undefined);
  if (!buffer) {
    const b = replayBuffer(pairs, firstSeen, night, cfg.buffer, cfg.seed);
    buffer = { pair_ids: b.chosen.map((p) => p.pair_id), fresh: b.fresh, old: b.old, pairs: pairs.length };
    await writeFileAtomic(bufferPath, JSON.stringify(buffer) + '\n');
  }
  state.data ??= {
    sessions: ingest?.counts.sessions ?? null,
    new_sessions: ingest?.action === 'ran' ? (ingest.counts.new_sessions ?? null) : 0,
    pairs: pairs.length,
    new_pairs: fresh.length,
    buffer: { new: buffer.fresh, old: buffer.old },
  };
  await save();
  const report = (
    r: Omit<
      NightReport,
      'night' | 'started_at' | 'finished_at' | 'production_before' | 'production' | 'rollback' | 'live' | 'data'
    >,
  ) =>
    finish(
      dir,
      root,
      {
        night,
        started_at: state.started_at,
        finished_at: new Date().toISOString(),
        production_before: state.production_before,
        production,
        rollback: state.rollback!,
        live: state.live ?? [],
        data: state.data!,
        ...r,
      },
      fresh.map((p) => p.pair_id),
    );
  /** DPO from production into `dpoFolder`, then DAPO into `candidateFolder` when configured; each once. */
  const trainChain = async (from: string, dpoFolder: string, candidateFolder: string, ids: string[], all: Pair[]) => {
    if (!existsSync(dpoFolder)) {
      const byId = new Map(all.map((p) => [p.pair_id, p]));
      const chosen = ids.map((id) => byId.get(id)!);
      const info = { night, production };
      await trainCandidate({
        from,
        pairs: chosen,
        out: join(dir, 'candidate'),
        cache: join(dir, '.cache'),
        cfg,
        info,
        device,
        signal,
        log,
      });
    }
    if (!cfg.dapo.enabled || existsSync(candidateFolder)) return;
    const { enabled: _, ...knobs } = cfg.dapo;
    const key = hashJson({ night, production, knobs });
    const info = { night, parent: production };
    await runDapo({
      from: dpoFolder,
      out: join(dir, 'candidate-dapo'),
      cache: join(dir, '.cache-dapo'),
      key,
      knobs,
      info,
      device,
      signal,
      log,
    });
  };
  if (buffer.fresh === 0)
    return report({
      production_after: production,
      candidate: null,
      training: {},
      comparison: null,
      decision: 'nothing to train on',
      reason: 'no new pairs tonight: production stays',
    });

  // 4. The candidate: DPO from production, then DAPO when configured. One whose loss or weights stopped being
  // numbers is no model: the night rejects it and ends, rather than fail in the paired evaluation every night.
  const productionFolder = join(registry.folder(production), 'model');
  const dpoFolder = join(dir, 'candidate', 'model');
  const candidateFolder = cfg.dapo.enabled ? join(dir, 'candidate-dapo', 'model') : dpoFolder;
  if (state.diverged === undefined) {
    try {
      await trainChain(productionFolder, dpoFolder, candidateFolder, buffer.pair_ids, pairs);
      state.diverged = null;
    } catch (error) {
      if (!(error instanceof Diverged)) throw error;
      state.diverged = error.message;
    }
    await save();
  }
  // Read on every attempt of the night, a resumed one too: the weights about to be played are the ones checked.
  if (!state.diverged) {
    const bad = nonFiniteWeight(candidateFolder);
    if (bad) {
      state.diverged = `its weight ${bad} holds a value that is not a finite number`;
      await save();
    }
  }
  const training = await trainingFigures(dpoFolder, cfg.dapo.enabled ? candidateFolder : null);
  if (state.diverged) {
    log.warn(`the candidate diverged: ${production} stays`, { reason: state.diverged });
    return report({
      production_after: production,
      candidate: null,
      training,
      comparison: null,
      decision: 'rejected',
      reason: `the candidate is no model (${state.diverged}): ${production} stays; lower refresh.dpo.lr or max_grad_norm`,
    });
  }

  // 5. The paired evaluation.
  const evalPath = join(dir, 'eval.json');
  let episodes = await readJsonFile<{ production: EpisodeRecord[]; candidate: EpisodeRecord[] }>(evalPath);
  if (!episodes) {
    // Production's side is the same every night it stays production (same weights, tasks and seeds): played once, kept by version.
    const keptPath = join(
      root,
      'paired',
      `${production}-${hashJson({ eval: cfg.eval, seed: cfg.seed }).slice(0, 12)}.json`,
    );
    let productionSide = await readJsonFile<EpisodeRecord[]>(keptPath);
    if (!productionSide) {
      productionSide = await play('production', productionFolder, o);
      mkdirSync(join(root, 'paired'), { recursive: true });
      await writeFileAtomic(keptPath, JSON.stringify(productionSide) + '\n');
    }
    episodes = {
      production: productionSide,
      candidate: await play('candidate', candidateFolder, o),
    };
    await writeFileAtomic(evalPath, JSON.stringify(episodes) + '\n');
  }
  const comparison = compare(episodes.production, episodes.candidate, cfg.gate, `${cfg.seed}:${night}`);

  // 6. The decision, in the registry: the candidate a version whatever happens, then promoted or rejected, each once.
  const candidate =
    registry.versions().find((v) => v.source.night === night && v.source.run === 'prefab refresh')?.id ??
    registry.register(candidateFolder, {
      source: {
        stage: 'refresh',
        run: 'prefab refresh',
        night,
        parent: production,
        fingerprints: await dataFingerprints(engine),
        chain: cfg.dapo.enabled ? 'dpo, dapo' : 'dpo',
        sessions: state.data.sessions,
        new_sessions: state.data.new_sessions,
        pairs: pairs.length,
        new_pairs: fresh.length,
        buffer: state.data.buffer,
      },
      config: { refresh: cfg },
      eval: { paired: comparison },
    });
  const by = `prefab refresh, ${tag}`;
  const decided = registry.decidedBy(by);
  if (!(decided && decided.event !== 'rolled_back' && decided.version === candidate)) {
    if (comparison.promote) registry.promote(candidate, `${tag}: ${comparison.reason}`, by);
    else registry.reject(candidate, `${tag}: ${comparison.reason}`, by);
  }
  const promoted = registry.aliases().production === candidate;
  log.info(promoted ? `${candidate} promoted` : `${candidate} not promoted: ${production} stays`, {
    reason: comparison.reason,
  });
  return report({
    production_after: registry.aliases().production!,
    candidate,
    training,
    comparison,
    decision: promoted ? 'promoted' : 'rejected',
    reason: comparison.reason,
  });
}

/** The candidate's training figures: its DPO's last steps, and its DAPO's (prefixed dapo/) when it had one. */
async function trainingFigures(dpoFolder: string, dapoFolder: string | null): Promise<Record<string, number>> {
  const last = async (folder: string) =>
    ((await readJsonFile<{ info?: { last?: Record<string, number> } }>(join(folder, 'trainer_state.json')))?.info
      ?.last ?? {}) as Record<string, number>;
  const training = await last(dpoFolder);
  if (dapoFolder) for (const [k, v] of Object.entries(await last(dapoFolder))) training[`dapo/${k}`] = v;
  return training;
}

/** The data stages' fingerprints (what the candidate's pairs were made from), by stage. */
async function dataFingerprints(engine: Engine): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const stage of engine.stages) {
    const m = await readJsonFile<Manifest>(engine.ws.manifestPath(stage.name));
    if (m) out[stage.name] = m.fingerprint;
    if (stage.name === 'export') break;
  }
  return out;
}

/** The candidate: `pairs` trained from production's folder `from` (its reference too), into `out/model`. */
async function trainCandidate(
  o: Omit<NightOptions, 'engine'> & {
    from: string;
    pairs: Pair[];
    out: string;
    cache: string;
    info: { night: number; production: string };
  },
): Promise<void> {
  const { from: productionFolder, pairs, out, cache, cfg, info, device, signal, log } = o;
  const prod = loadCheckpoint(productionFolder);
  const chat = openChat(prod.tokenizer, prod.model.config.eosTokenId, productionFolder);
  const d = cfg.dpo;
  const length = Math.min(prod.context, d.max_length ?? Infinity) + 1;
  const loss = lossOf(d.loss as Parameters<typeof lossOf>[0], d.beta);
  const made = await pairExamples(chat, pairs, length, prod.placeholders);
  if (made.examples.length === 0)
    throw new PipelineError(
      `refresh: none of the ${pairs.length} pairs in the buffer fits in ${length - 1} tokens; raise refresh.dpo.max_length`,
    );
  const settings = { ...d, desirable_weight: 1, undesirable_weight: 1 };
  mkdirSync(cache, { recursive: true });
  const reference = loss.reference
    ? await withScorer(device, prod.model, log, (score) =>
        referenceScores(
          score,
          made.examples,
          chat.pad,
          d.micro_batch_tokens,
          join(cache, 'reference.json'),
          signal,
          log,
        ),
      )
    : null;
  const trainer = dpoTrainer(
    made.examples,
    reference,
    loss,
    settings,
    chat.pad,
    () => loadCheckpoint(productionFolder).model,
  );
  log.info('training the candidate', {
    from: info.production,
    pairs: made.examples.length,
    steps: trainer.steps,
    lr: d.lr,
    loss: loss.name,
  });
  const key = hashJson({ production: info.production, pairs: pairs.map((p) => p.pair_id), cfg: d, night: info.night });
  const result = await trainingRun(
    {
      config: d,
      cache,
      key,
      tokenizer: prod.tokenizer,
      context: prod.context,
      placeholders: prod.placeholders,
      signal,
      log,
      device,
    },
    trainer,
  );
  prod.model.dispose();
  await result.save(out, {
    stage: 'refresh',
    loss: loss.name,
    beta: loss.beta,
    max_length: length - 1,
    night: info.night,
    parent: info.production,
    last: finalMetrics(result.metrics),
  });
}

/** One side of the paired evaluation: the model in `folder` on the validation tasks, each episode seeded by (seed, task, try) alone. */
async function play(name: string, folder: string, o: NightOptions): Promise<EpisodeRecord[]> {
  const { cfg, device, signal, log } = o;
  const e = cfg.eval;
  const ck = loadCheckpoint(folder);
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const sampling = {
    maxTokens: e.max_tokens,
    temperature: e.temperature,
    topP: e.top_p,
    tools: TOOLS,
    signal,
    engine: await decodingEngine(device, ck.model, e.tasks * e.k, log), // every episode side by side
  };
  const { model, context, placeholders } = ck;
  const players = new EpisodePlayers({ name, model, context, chat, placeholders, sampling });
  const progress = log.progress(`paired evaluation: ${name}`, e.tasks * e.k);
  const records = await validationEpisodes(
    (task, trial) => players.player(seeded(cfg.seed, 'paired', task, trial)),
    {
      worldSeed: e.world_seed,
      companies: e.companies,
      tasks: e.tasks,
      k: e.k,
      maxTurns: e.max_turns,
      maxCalls: e.max_calls,
      together: true,
    },
    () => progress.tick(),
  ).finally(() => {
    progress.done();
    players.dispose();
  });
  ck.model.dispose();
  return records;
}

/** Writes the night's report (report.json, and a line of refresh/nights.jsonl) and marks tonight's new pairs as seen. */
async function finish(dir: string, root: string, r: NightReport, freshIds: string[]): Promise<NightReport> {
  const seenPath = join(root, 'seen-pairs.json');
  const seen = (await readJsonFile<Record<string, number>>(seenPath)) ?? {};
  for (const id of freshIds) seen[id] ??= r.night;
  await writeFileAtomic(seenPath, JSON.stringify(seen) + '\n');
  const lines = existsSync(join(root, 'nights.jsonl')) ? readFileSync(join(root, 'nights.jsonl'), 'utf8') : '';
  await writeFileAtomic(join(root, 'nights.jsonl'), lines + JSON.stringify(r) + '\n');
  await writeFileAtomic(join(dir, 'report.json'), JSON.stringify(r, null, 2) + '\n');
  return r;
}

/** A night as the daily table's row and a few lines of explanation. */
export function formatNight(r: NightReport, traffic?: Live | null): string {
  const f = (x: number | null | undefined) => (x === null || x === undefined ? '—' : x.toFixed(3));
  const c = r.comparison;
  const lines = [
    `night ${r.night}: production ${r.production_before}${r.rollback.rolled_back ? `, rolled back to ${r.production}` : ''}` +
      (traffic ? `, live success ${f(traffic.success)} on ${traffic.sessions} sessions` : ''),
    `  rollback check: ${r.rollback.reason}`,
    ...(r.live.length
      ? [`  live traffic: ${r.live.map((l) => `${l.version} ${f(l.success)} on ${l.sessions} sessions`).join(', ')}`]
      : []),
    `  data: ${r.data.new_sessions ?? '?'} new sessions, ${r.data.new_pairs} new pairs of ${r.data.pairs}; buffer ${r.data.buffer.new} new + ${r.data.buffer.old} older`,
  ];
  if (r.candidate && c)
    lines.push(
      `  candidate ${r.candidate}: success ${f(c.success.candidate)} vs ${f(c.success.production)}, difference ${f(c.success.difference)} [${f(c.success.interval[0])}, ${f(c.success.interval[1])}], p = ${c.success.p.toPrecision(3)}`,
    );
  lines.push(`  decision: ${r.decision}: ${r.reason}`, `  production now: ${r.production_after}`);
  return lines.join('\n');
}
