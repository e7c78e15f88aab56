// What the report shows, read from the workspace as the stages and the loop left it: each stage's manifest,
// ingest's quarantine, the gate's report, the trainers' metrics, the eval table, the registry's history and
// the refresh nights. A file that is not there leaves its part out (a run stopped early, a workspace the
// loop never ran in); nothing here changes the workspace.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Assessment, Engine } from '../pipeline/engine.ts';
import { readLines } from '../pipeline/jsonl.ts';
import { reasonKind, type QuarantineRecord } from '../pipeline/records.ts';
import { readJsonFile } from '../pipeline/workspace.ts';
import type { NightReport } from '../loop/refresh.ts';
import { Registry, type RegistryEvent } from '../loop/registry.ts';
import type { EvalReport } from '../stages/eval/run.ts';
import type { GateReportFile } from '../stages/gate/report.ts';

/** A metrics.jsonl line: a step's figures. */
export type Metrics = Record<string, number>;

interface QuarantineKind {
  reason: string;
  count: number;
  /** The first few records of the kind: file and place. */
  examples: { file: string; where: string; reason: string }[];
}

export interface Gathered {
  root: string;
  /** Every stage in run order: its state and, where it ran, its manifest. */
  stages: Assessment[];
  quarantine: { file: string; records: number; kinds: QuarantineKind[] }[];
  /** The gate's dropped pairs, counted by reason. */
  dropped: { reason: string; count: number }[];
  gate: GateReportFile | null;
  metrics: Record<'sft' | 'dpo' | 'dapo', Metrics[] | null>;
  eval: EvalReport | null;
  history: RegistryEvent[] | null;
  nights: NightReport[] | null;
}

/** Reasons told apart at most; the rest are counted together. */
const KINDS = 40;
const EXAMPLES = 3;

export async function gather(engine: Engine): Promise<Gathered> {
  const root = engine.ws.root;
  const dir = (stage: string) => engine.ws.stageDir(stage);
  const stages = (await engine.status()).filter((a) => a.manifest !== null || a.lastFailure !== null);
  const quarantine = [];
  for (const stage of ['ingest', 'import']) {
    const file = join(dir(stage), 'quarantine.jsonl');
    if (existsSync(file)) quarantine.push({ file: `${stage}/quarantine.jsonl`, ...(await quarantineKinds(file)) });
  }
  const metrics = async (stage: string) => {
    const file = join(dir(stage), 'metrics.jsonl');
    return existsSync(file) ? metricsOf(file) : null;
  };
  return {
    root,
    stages,
    quarantine,
    dropped: await droppedReasons(join(dir('gate'), 'dropped.jsonl')),
    gate: await readJsonFile<GateReportFile>(join(dir('gate'), 'report.json')),
    metrics: { sft: await metrics('sft'), dpo: await metrics('dpo'), dapo: await metrics('dapo') },
    eval: await readJsonFile<EvalReport>(join(dir('eval'), 'eval.json')),
    history: existsSync(join(root, 'registry')) ? new Registry(join(root, 'registry')).history() : null,
    nights: await jsonLines<NightReport>(join(root, 'refresh', 'nights.jsonl')),
  };
}

/**
 * A trainer's metrics, a line a step. A step logged twice (a run resumed from a checkpoint before it) keeps
 * its last line; a line cut short by a kill is passed over.
 */
export function metricsOf(file: string): Metrics[] {
  const byStep = new Map<number, Metrics>();
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const m = parsed<Metrics>(line);
    if (m && typeof m.step === 'number') byStep.set(m.step, m);
  }
  return [...byStep.values()].sort((a, b) => a.step! - b.step!);
}

/** The records of a JSONL file, lines that do not parse passed over; null when there is no file. */
async function jsonLines<T>(file: string): Promise<T[] | null> {
  if (!existsSync(file)) return null;
  const out: T[] = [];
  for await (const { text } of readLines(file)) {
    const r = parsed<T>(text);
    if (r) out.push(r);
  }
  return out;
}

function parsed<T>(line: string): T | null {
  if (line.trim() === '') return null;
  try {
    return JSON.parse(line) as T;
  } catch {
    return null;
  }
}

/** Why records were quarantined: alike reasons counted together (numbers and quoted values blanked), with examples. */
async function quarantineKinds(file: string): Promise<{ records: number; kinds: QuarantineKind[] }> {
  const kinds = new Map<string, QuarantineKind>();
  const other: QuarantineKind = { reason: 'other reasons', count: 0, examples: [] };
  let records = 0;
  for await (const { text } of readLines(file)) {
    const r = parsed<QuarantineRecord>(text);
    if (!r) continue;
    records++;
    const key = reasonKind(r.reason);
    let kind = kinds.get(key);
    if (!kind && kinds.size < KINDS) kinds.set(key, (kind = { reason: key, count: 0, examples: [] }));
    kind ??= other;
    kind.count++;
    if (kind.examples.length < EXAMPLES) kind.examples.push({ file: r.file, where: r.where, reason: r.reason });
  }
  const list = [...kinds.values()].sort((a, b) => b.count - a.count);
  return { records, kinds: other.count ? [...list, other] : list };
}

async function droppedReasons(file: string): Promise<{ reason: string; count: number }[]> {
  const counts = new Map<string, number>();
  for (const r of (await jsonLines<{ reason: string }>(file)) ?? [])
    counts.set(r.reason, (counts.get(r.reason) ?? 0) + 1);
  return [...counts].map(([reason, count]) => ({ reason, count })).sort((a, b) => b.count - a.count);
}
