// `prefab merge`: shard workspaces (`prefab run --shard i/N`) joined into this one, stage by stage, as if one
// run had made them on all the data; `prefab run` here then goes on from the first stage that needs all of it.
import { existsSync } from 'node:fs';
import { appendFile, mkdir, readFile, readdir, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { Engine, Manifest, StageOutcome } from './engine.ts';
import { PipelineError, UsageError } from './errors.ts';
import type { Logger } from './log.ts';
import { linkTree } from './shards.ts';
import type { Shard, ShardPart, Stage } from './stage.ts';
import { Workspace, liveRun } from './workspace.ts';

/** The shard workspaces' folders of `stage`, checked to be one complete set made by this code and config. */
async function partsOf(
  engine: Engine,
  stage: Stage,
  shards: Workspace[],
): Promise<{ parts: ShardPart[]; manifests: Manifest[] } | null> {
  const manifests = await Promise.all(shards.map((ws) => ws.readJson<Manifest>(ws.manifestPath(stage.name))));
  const missing = shards.filter((_, i) => !manifests[i]);
  if (missing.length === shards.length) return null;
  if (missing.length > 0)
    throw new PipelineError(
      `${missing[0]!.root}: stage ${stage.name} has not run there, but has in other shards; run \`prefab run --shard i/N\` in it first`,
    );
  const parts: ShardPart[] = [];
  manifests.forEach((m, i) => {
    const where = `${shards[i]!.root}: ${stage.name}`;
    if (m!.code_version !== engine.codeVersion(stage))
      throw new PipelineError(
        `${where} was made by ${m!.code_version}, and this prefab is ${engine.codeVersion(stage)}: run the shards and the merge with the same version`,
      );
    if (m!.config_hash !== engine.configHash(stage))
      throw new PipelineError(
        `${where} was made with another config section '${stage.name}' than --config gives here: merge with the config the shards ran with`,
      );
    if (m!.invalidated_by)
      throw new PipelineError(
        `${where} is stale (upstream ${m!.invalidated_by.stage} was forced since): run \`prefab run --shard i/N\` there again`,
      );
    const shard: Shard = m!.shard ?? { index: 0, count: 1 };
    parts.push({ shard, dir: shards[i]!.stageDir(stage.name), counts: m!.counts, summary: m!.summary });
  });
  if (typeof stage.shard === 'function') {
    if (!manifests.some((m) => m!.shard))
      throw new PipelineError(`${stage.name}: none of these workspaces was run with --shard`);
    const count = Math.max(shards.length, ...parts.map((p) => p.shard.count));
    parts.sort((a, b) => a.shard.index - b.shard.index);
    parts.forEach((p, i) => {
      if (p.shard.count !== count || p.shard.index !== i || parts.length !== count) {
        const have = parts.map((q) => `${q.shard.index}/${q.shard.count}`).join(', ');
        throw new PipelineError(
          `${stage.name}: the workspaces hold shards ${have}; a merge needs each of 0/${count} … ${count - 1}/${count} once`,
        );
      }
    });
  } else {
    // The same code and config on the same input files make the same output (up to the times it records).
    const read = (m: Manifest) => JSON.stringify({ external: m.external.map((f) => f.xxh64).sort(), counts: m.counts });
    const other = manifests.findIndex((m) => read(m!) !== read(manifests[0]!));
    if (other >= 0)
      throw new PipelineError(
        `${stage.name} read other input files in ${shards[other]!.root} than in ${shards[0]!.root}: the shards must all read the same inputs`,
      );
  }
  return { parts, manifests: manifests as Manifest[] };
}

/**
 * Appends the lines of every shard's answer caches (JSONL) of `stage` that this workspace's do not hold yet,
 * so a rerun here asks nothing again, and a merge every night does not copy the shards' caches again.
 */
async function joinCaches(engine: Engine, stage: Stage, shards: Workspace[]): Promise<void> {
  const walk = async (dir: string, rel: string): Promise<string[]> => {
    if (!existsSync(join(dir, rel))) return [];
    if (!(await stat(join(dir, rel))).isDirectory()) return rel.endsWith('.jsonl') ? [rel] : [];
    return (await Promise.all((await readdir(join(dir, rel))).map((e) => walk(dir, join(rel, e))))).flat();
  };
  const held = new Map<string, Set<string>>();
  for (const ws of shards) {
    const from = ws.cacheDir(stage.name);
    for (const rel of await walk(from, '')) {
      const to = join(engine.ws.cacheDir(stage.name), rel);
      let lines = held.get(to);
      if (!lines) held.set(to, (lines = new Set(existsSync(to) ? (await readFile(to, 'utf8')).split('\n') : [])));
      const fresh = (await readFile(join(from, rel), 'utf8'))
        .split('\n')
        .filter((line) => line.length > 0 && !lines.has(line));
      if (fresh.length === 0) continue;
      for (const line of fresh) lines.add(line);
      await mkdir(dirname(to), { recursive: true });
      await appendFile(to, fresh.join('\n') + '\n');
    }
  }
}

/**
 * Joins the shard workspaces `dirs` into the engine's, one stage at a time from the first, up to the last
 * stage every shard made (or the first that needs all the data). Returns what each stage did.
 */
export async function mergeShards(engine: Engine, dirs: string[], log: Logger): Promise<StageOutcome[]> {
  if (dirs.length === 0)
    throw new UsageError(
      'prefab merge: name the shard workspaces to join, e.g. prefab merge shards/0 shards/1 shards/2',
    );
  const shards = dirs.map((d) => new Workspace(resolve(d)));
  for (const ws of shards) {
    if (!existsSync(ws.root)) throw new UsageError(`prefab merge: no workspace ${ws.root}`);
    if (ws.root === engine.ws.root)
      throw new UsageError(
        `prefab merge: ${ws.root} is both a shard and the workspace merged into; merge into another --workdir`,
      );
    const live = liveRun(ws);
    if (live)
      throw new PipelineError(
        `prefab merge: ${ws.root} is still being written (pid ${live.pid} on ${live.host}, \`${live.command}\`); merge when every shard has finished`,
      );
  }
  await engine.ws.recover(log);
  const outcomes: StageOutcome[] = [];
  for (const stage of engine.shardable) {
    const started = new Date();
    const found = await partsOf(engine, stage, shards);
    if (!found) break;
    const { parts, manifests } = found;
    const inputs: Record<string, string> = {};
    for (const input of stage.inputs) {
      const upstream = await engine.manifest(input);
      if (!upstream) throw new PipelineError(`${stage.name} reads ${input}, which the shards did not make`);
      inputs[input] = upstream.fingerprint;
    }
    const out = await engine.ws.newTmpDir(stage.name);
    const report =
      typeof stage.shard === 'function'
        ? await stage.shard(parts, out)
        : await linkTree(parts[0]!.dir, out).then(() => ({
            counts: manifests[0]!.counts,
            summary: manifests[0]!.summary,
          }));
    const manifest = await engine.commit(stage, out, {
      inputs,
      external: manifests[0]!.external,
      report,
      started,
      shard: null,
    });
    if (typeof stage.shard === 'function') await joinCaches(engine, stage, shards);
    log.info('merged', { stage: stage.name, shards: parts.length, summary: report.summary });
    outcomes.push({
      stage: stage.name,
      action: 'ran',
      reasons: [typeof stage.shard === 'function' ? `joined ${parts.length} shards` : `the same on every shard`],
      summary: report.summary,
      counts: report.counts,
      seconds: manifest.seconds,
    });
  }
  if (outcomes.length === 0)
    throw new PipelineError(
      `prefab merge: the shard workspaces hold no stage output; run \`prefab run --shard i/N\` in each first`,
    );
  return outcomes;
}
