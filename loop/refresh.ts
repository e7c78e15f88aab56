// `prefab refresh`: one night of the online loop, offline training brought online: the deployed model's own
// new sessions become pairs, and a candidate trained on them replaces it only when measured better. In order,
// each step a function below, written down in the night's journal before the next (refreshNight), so a night
// killed at any point resumes where it was or leaves production as it was:
//  1. live traffic: production's success on the sessions it served; below its baseline (what the production
//     it replaced did) × rollback.ratio, it is rolled back before anything is trained;
//  2. the data stages (ingest → … → export) take in the inbox's new sessions incrementally;
//  3. a replay buffer: every pair new tonight, then older pairs drawn by recency, up to buffer.size;
//  4. the candidate: DPO continued from production (also its reference) at a learning rate well below the
//     offline run's, one epoch (trainers/preference.ts, the dpo stage's run), then DAPO where configured;
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
import { openChat } from '../model/chat.ts';
import { decodingEngine } from '../runtime/placement.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { nonFiniteWeight } from '../model/hf.ts';
import { readPreferencePairs } from '../trainers/data.ts';
import { runPreference } from '../trainers/preference.ts';
import { EpisodePlayers } from '../runtime/policy.ts';
import { Diverged } from '../trainers/run.ts';
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
  /** The production the candidate was compared with (and trained from, unless refresh.compound built it on the last night's): production_before, or what a rollback put back. */
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
 * The safety rule: production's live success against its baseline, the live success of the production
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

/**
 * A night being run: its number and folders, the registry, and its journal (state.json), in which each step
 * writes down what it decided before the next begins, so that a resumed night does nothing twice.
 */
interface Night extends NightOptions {
  number: number;
  /** `night N`, in the registry's reasons and the log. */
  tag: string;
  dir: string;
  root: string;
  registry: Registry;
  inbox: string;
  state: NightState;
  save(): Promise<void>;
}

/** What the data step gives the steps after it: every pair, tonight's new ones, and the buffer drawn from them. */
interface NightData {
  pairs: Pair[];
  fresh: Pair[];
  buffer: { pair_ids: string[]; fresh: number; old: number; pairs: number };
}

/** The candidate as the training step left it: its model folders, its figures, and why it is no model, if it is not. */
interface Candidate {
  /** The version it was trained from: production, or (refresh.compound) the last night's candidate. */
  start: string;
  dpoFolder: string;
  folder: string;
  training: Record<string, number>;
  diverged: string | null;
}

/** Runs one night (resuming the last one if it did not finish), step by step. */
export async function refreshNight(o: NightOptions): Promise<NightReport> {
  const night = await openNight(o);
  await checkLiveTraffic(night);
  const data = await takeInData(night);
  const report = (r: Decision) => finish(night, r, data.fresh);
  if (data.buffer.fresh === 0)
    return report({
      production_after: night.state.production!,
      candidate: null,
      training: {},
      comparison: null,
      decision: 'nothing to train on',
      reason: 'no new pairs tonight: production stays',
    });
  const candidate = await trainCandidate(night, data);
  if (candidate.diverged) {
    const production = night.state.production!;
    o.log.warn(`the candidate diverged: ${production} stays`, { reason: candidate.diverged });
    return report({
      production_after: production,
      candidate: null,
      training: candidate.training,
      comparison: null,
      decision: 'rejected',
      reason: `the candidate is no model (${candidate.diverged}): ${production} stays; lower refresh.dpo.lr or max_grad_norm`,
    });
  }
  const comparison = await pairedEvaluation(night, candidate);
  return report(await decide(night, data, candidate, comparison));
}

/** The night to run: the last one where it did not finish (its journal read back), else the next. */
async function openNight(o: NightOptions): Promise<Night> {
  const { engine, cfg, log } = o;
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
  const number = resuming ? last! : (last ?? 0) + 1;
  const dir = join(nightsDir, String(number).padStart(4, '0'));
  mkdirSync(dir, { recursive: true });
  const statePath = join(dir, 'state.json');
  const state: NightState = (await readJsonFile<NightState>(statePath)) ?? {
    night: number,
    started_at: new Date().toISOString(),
    production_before: start,
  };
  log.info(resuming ? `refresh: resuming night ${number}` : `refresh: night ${number}`, { production: start });
  return {
    ...o,
    number,
    tag: `night ${number}`,
    dir,
    root,
    registry,
    inbox,
    state,
    save: () => writeFileAtomic(statePath, JSON.stringify(state, null, 2) + '\n'),
  };
}

/**
 * 1. Live traffic, and the rollback rule: production's live success against its baseline's. A rollback this
 * night already made (killed before it was written down) is not made twice.
 */
async function checkLiveTraffic(night: Night): Promise<void> {
  const { registry, state, cfg, tag, log } = night;
  if (state.rollback) return;
  const live = await liveFigures(inboxFiles(night.inbox), cfg.rollback.success_reward);
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
  await night.save();
}

/**
 * 2. The data stages take in the inbox (incrementally; the pairs the export held before the loop's first night
 * are night 0's), then 3. the replay buffer, kept so a resumed night trains on the same pairs.
 */
async function takeInData(night: Night): Promise<NightData> {
  const { engine, cfg, signal, state, root, dir, tag } = night;
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
  const bufferPath = join(dir, 'buffer.json');
  let buffer = await readJsonFile<NightData['buffer']>(bufferPath);
  const pairs = await readPreferencePairs<Pair>(exportDir, 'train');
  const firstSeen = (await readJsonFile<Record<string, number>>(seenPath)) ?? {};
  const fresh = pairs.filter((p) => firstSeen[p.pair_id] === undefined);
  if (!buffer) {
    const b = replayBuffer(pairs, firstSeen, night.number, cfg.buffer, cfg.seed);
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
  await night.save();
  return { pairs, fresh, buffer };
}

/**
 * The version tonight's candidate starts from: production, or with refresh.compound the last night's
 * candidate, where that night kept this same production and did not promote it (nor found it no model).
 */
function startOf(night: Night): string {
  const production = night.state.production!;
  if (!night.cfg.compound) return production;
  const path = join(night.root, 'nights.jsonl');
  const reports = existsSync(path)
    ? readFileSync(path, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as NightReport)
    : [];
  const last = reports.filter((r) => r.night < night.number).at(-1);
  const kept = last && last.production === production && last.production_after === production;
  return kept && last.decision === 'rejected' && last.candidate ? last.candidate : production;
}

/**
 * 4. The candidate: DPO from production on the buffer (trainers/preference.ts, its starting model its reference
 * too), then DAPO when configured; each once. With refresh.compound it starts from the last night's candidate
 * (startOf). One whose loss or weights stopped being numbers is no model: the night rejects it rather than
 * fail in the paired evaluation every night.
 */
async function trainCandidate(night: Night, data: NightData): Promise<Candidate> {
  const { cfg, state, dir, registry, device, signal, log } = night;
  const production = state.production!;
  const start = startOf(night);
  const productionFolder = join(registry.folder(start), 'model');
  const dpoFolder = join(dir, 'candidate', 'model');
  const folder = cfg.dapo.enabled ? join(dir, 'candidate-dapo', 'model') : dpoFolder;
  const chain = async () => {
    if (!existsSync(dpoFolder)) {
      const byId = new Map(data.pairs.map((p) => [p.pair_id, p]));
      const pairs = data.buffer.pair_ids.map((id) => byId.get(id)!);
      log.info('training the candidate', { from: start, production, pairs: pairs.length, lr: cfg.dpo.lr });
      await runPreference({
        from: productionFolder,
        rows: pairs,
        source: `refresh ${night.tag}: the buffer's ${pairs.length} pairs`,
        knobs: cfg.dpo,
        remedy: 'raise refresh.dpo.max_length',
        cache: join(dir, '.cache'),
        key: hashJson({ production, start, pairs: data.buffer.pair_ids, cfg: cfg.dpo, night: night.number }),
        referenceKey: { start },
        out: join(dir, 'candidate'),
        stage: 'refresh',
        info: { night: night.number, parent: production, from: start },
        device,
        signal,
        log,
      });
    }
    if (!cfg.dapo.enabled || existsSync(folder)) return;
    const { enabled: _, ...knobs } = cfg.dapo;
    await runDapo({
      from: dpoFolder,
      out: join(dir, 'candidate-dapo'),
      cache: join(dir, '.cache-dapo'),
      key: hashJson({ night: night.number, production, knobs }),
      knobs,
      info: { night: night.number, parent: production },
      device,
      signal,
      log,
    });
  };
  if (state.diverged === undefined) {
    try {
      await chain();
      state.diverged = null;
    } catch (error) {
      if (!(error instanceof Diverged)) throw error;
      state.diverged = error.message;
    }
    await night.save();
  }
  // Read on every attempt of the night, a resumed one too: the weights about to be played are the ones checked.
  if (!state.diverged) {
    const bad = nonFiniteWeight(folder);
    if (bad) {
      state.diverged = `its weight ${bad} holds a value that is not a finite number`;
      await night.save();
    }
  }
  const training = await trainingFigures(dpoFolder, cfg.dapo.enabled ? folder : null);
  return { start, dpoFolder, folder, training, diverged: state.diverged };
}

/**
 * 5. The paired evaluation: candidate and production on the same validation tasks and draws. Production's
 * side is the same every night it stays production (same weights, tasks and seeds): played once, kept by version.
 */
async function pairedEvaluation(night: Night, candidate: Candidate): Promise<Comparison> {
  const { cfg, state, root, dir, registry } = night;
  const production = state.production!;
  const evalPath = join(dir, 'eval.json');
  const playing = { eval: cfg.eval, seed: cfg.seed, device: night.device, signal: night.signal, log: night.log };
  let episodes = await readJsonFile<{ production: EpisodeRecord[]; candidate: EpisodeRecord[] }>(evalPath);
  if (!episodes) {
    const keptPath = join(
      root,
      'paired',
      `${production}-${hashJson({ eval: cfg.eval, seed: cfg.seed }).slice(0, 12)}.json`,
    );
    let productionSide = await readJsonFile<EpisodeRecord[]>(keptPath);
    if (!productionSide) {
      productionSide = await playEpisodes('production', join(registry.folder(production), 'model'), playing);
      mkdirSync(join(root, 'paired'), { recursive: true });
      await writeFileAtomic(keptPath, JSON.stringify(productionSide) + '\n');
    }
    episodes = { production: productionSide, candidate: await playEpisodes('candidate', candidate.folder, playing) };
    await writeFileAtomic(evalPath, JSON.stringify(episodes) + '\n');
  }
  return compare(episodes.production, episodes.candidate, cfg.gate, `${cfg.seed}:${night.number}`);
}

/** What the night decided, and on what: the report's own part (finish adds the rest from the journal). */
type Decision = Pick<NightReport, 'production_after' | 'candidate' | 'training' | 'comparison' | 'decision' | 'reason'>;

/**
 * 6. The decision, in the registry: the candidate a version whatever happens, then promoted or rejected, each
 * once.
 */
async function decide(night: Night, data: NightData, candidate: Candidate, comparison: Comparison): Promise<Decision> {
  const { registry, state, cfg, tag, log } = night;
  const production = state.production!;
  const version =
    registry.versions().find((v) => v.source.night === night.number && v.source.run === 'prefab refresh')?.id ??
    registry.register(candidate.folder, {
      source: {
        stage: 'refresh',
        run: 'prefab refresh',
        night: night.number,
        parent: production,
        ...(candidate.start !== production ? { built_on: candidate.start } : {}),
        fingerprints: await dataFingerprints(night.engine),
        chain: cfg.dapo.enabled ? 'dpo, dapo' : 'dpo',
        sessions: state.data!.sessions,
        new_sessions: state.data!.new_sessions,
        pairs: data.pairs.length,
        new_pairs: data.fresh.length,
        buffer: state.data!.buffer,
      },
      config: { refresh: cfg },
      eval: { paired: comparison },
    });
  const by = `prefab refresh, ${tag}`;
  const decided = registry.decidedBy(by);
  if (!(decided && decided.event !== 'rolled_back' && decided.version === version)) {
    if (comparison.promote) registry.promote(version, `${tag}: ${comparison.reason}`, by);
    else registry.reject(version, `${tag}: ${comparison.reason}`, by);
  }
  const promoted = registry.aliases().production === version;
  log.info(promoted ? `${version} promoted` : `${version} not promoted: ${production} stays`, {
    reason: comparison.reason,
  });
  return {
    production_after: registry.aliases().production!,
    candidate: version,
    training: candidate.training,
    comparison,
    decision: promoted ? 'promoted' : 'rejected',
    reason: comparison.reason,
  };
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

/** What a side of the paired evaluation is played with: the eval's settings, the sampler's seed, and where. */
export interface PlayOptions {
  eval: RefreshConfig['eval'];
  seed: string;
  /** Eligible validation tasks passed over first: fresh draws (bench/nights.ts replays nights on them). */
  skip?: number;
  device: Device;
  signal: AbortSignal;
  log: Logger;
}

/**
 * One side of the paired evaluation: the model in `folder` on the validation tasks, each episode seeded by
 * (seed, task, try) alone.
 */
export async function playEpisodes(name: string, folder: string, o: PlayOptions): Promise<EpisodeRecord[]> {
  const { device, signal, log } = o;
  const e = o.eval;
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
    (task, trial) => players.player(seeded(o.seed, 'paired', task, trial)),
    {
      skip: o.skip,
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
async function finish(night: Night, decision: Decision, fresh: Pair[]): Promise<NightReport> {
  const { state, root, dir } = night;
  const r: NightReport = {
    night: night.number,
    started_at: state.started_at,
    finished_at: new Date().toISOString(),
    production_before: state.production_before,
    production: state.production!,
    rollback: state.rollback!,
    live: state.live ?? [],
    data: state.data!,
    ...decision,
  };
  const seenPath = join(root, 'seen-pairs.json');
  const seen = (await readJsonFile<Record<string, number>>(seenPath)) ?? {};
  for (const p of fresh) seen[p.pair_id] ??= r.night;
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
