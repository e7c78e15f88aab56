// `prefab simulate`: logged sessions from scripted agents in the customer-service world, or from a model
// behind an OpenAI-compatible endpoint (`--agent http://…/v1`: the simulator's users talking to a deployed
// model, as real traffic would); `prefab replay`: the replay verifier over a file of sessions.
import { createWriteStream, existsSync, mkdirSync, renameSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { once } from 'node:events';
import { createGzip } from 'node:zlib';
import { InvalidArgumentError, Option, type Command } from 'commander';
import pLimit from 'p-limit';
import { wholeNumber, type CommandContext } from '../pipeline/commands.ts';
import { UsageError } from '../pipeline/errors.ts';
import { readJsonl } from '../pipeline/jsonl.ts';
import type { Session } from '../core/records.ts';
import { AGENTS, ScriptedAgent, type AgentName } from './agents.ts';
import { seeded } from '../core/random.ts';
import { WorldCache, replaySession } from './replay.ts';
import { addNotes, emptyNotes, feedbackBlock, type Notes } from './feedback.ts';
import { episodeSession, runEpisode } from './rollout.ts';
import { DEFAULT_WORLD, generateTask, generateWorld } from './world.ts';

/** The mix of skills behind the bundled sample: about 70% of sessions succeed. */
const MIX: readonly [AgentName, number][] = [
  ['oracle', 0.55],
  ['prior', 0.3],
  ['noisy', 0.1],
  ['random', 0.05],
];

const EPOCH = '2026-01-01';

/** A model behind an endpoint as the agent. */
interface RemoteAgent {
  url: string;
  /** The model asked for: a version, production, candidate. */
  model: string;
  apiKey: string;
  temperature: number;
  maxTokens: number;
  maxTurns: number;
  /** Episodes played at once (a batching server decodes them together). */
  concurrency: number;
}

export interface SimulateOptions {
  tasks: number;
  trials: number;
  /** A scripted agent, their mix, or a model behind an endpoint. */
  agent: AgentName | 'mix' | RemoteAgent;
  noise: number;
  split: 'train' | 'val';
  seed: number;
  companies: number;
  offset: number;
  /** The day the sessions are dated from (one a minute), YYYY-MM-DD. */
  date?: string;
  /**
   * Each trial after a failed one reads notes of what the representatives said in the failed trials before
   * it, in the user's request (as feedback-guided DAPO's episodes do): sessions that show reading them.
   */
  notes?: boolean;
}

interface SimulationStats {
  byAgent: Record<string, { sessions: number; successes: number; reward: number; turns: number }>;
  byDifficulty: Record<string, Record<number, { sessions: number; successes: number }>>;
}

/** The mix's agent for a draw `r` in [0, 1): each with its share of the logs. */
export function mixAgent(r: number): AgentName {
  let acc = 0;
  for (const [name, weight] of MIX) if (r < (acc += weight)) return name;
  return MIX.at(-1)![0];
}

function chooseAgent(o: SimulateOptions & { agent: AgentName | 'mix' }, taskIndex: number, trial: number): AgentName {
  if (o.agent !== 'mix') return o.agent;
  return mixAgent(seeded(o.seed, 'mix', o.split, taskIndex, trial)());
}

/**
 * Sessions of `trials` attempts at each of `tasks` tasks, in a deterministic order. A remote agent plays
 * `concurrency` episodes at once; the sessions still come in task and trial order.
 */
export async function* simulate(o: SimulateOptions): AsyncGenerator<Session> {
  const world = generateWorld({ ...DEFAULT_WORLD, seed: o.seed, companies: o.companies });
  const start = Date.parse(`${o.date ?? EPOCH}T00:00:00Z`);
  const remote = typeof o.agent === 'object' ? o.agent : null;
  // The openai package only when a model is the agent: scripted simulations do not load it.
  const RemotePolicy = remote ? (await import('./remote.ts')).RemotePolicy : null;
  const client = remote ? RemotePolicy!.client(remote.url, remote.apiKey) : null;
  // A task's notes so far, from its failed trials (with `notes`; a remote agent's trials still run in order).
  const taskNotes = new Map<number, Notes>();
  const play = async (i: number, trial: number): Promise<Session> => {
    const task = generateTask(world, o.split, i);
    const notes = o.notes ? (taskNotes.get(i) ?? emptyNotes()) : null;
    const agent = remote
      ? new RemotePolicy!(client!, {
          baseUrl: remote.url,
          model: remote.model,
          apiKey: remote.apiKey,
          temperature: remote.temperature,
          maxTokens: remote.maxTokens,
          conversation: `${o.seed}:${task.task_id}:${trial}:${o.date ?? EPOCH}`,
        })
      : new ScriptedAgent(
          chooseAgent(o as SimulateOptions & { agent: AgentName | 'mix' }, i, trial),
          world,
          task,
          `${o.seed}:${trial}`,
          o.noise,
        );
    const episode = await runEpisode(world, task, agent, remote?.maxTurns, notes ? feedbackBlock(notes) : '');
    if (notes && !episode.success) taskNotes.set(i, addNotes(notes, episode.messages));
    if (notes && trial === o.trials - 1) taskNotes.delete(i);
    const createdAt = new Date(start + ((i - o.offset) * o.trials + trial) * 60_000).toISOString();
    return episodeSession(world, task, agent, episode, { trial, createdAt });
  };
  const limit = pLimit(remote?.concurrency ?? 1);
  const ahead: Promise<Session>[] = [];
  for (let i = o.offset; i < o.offset + o.tasks; i++) {
    let before: Promise<unknown> | null = null;
    for (let trial = 0; trial < o.trials; trial++) {
      // With notes, a task's trials one after another: each reads the ones before it.
      const next: Promise<Session> =
        o.notes && before ? before.then(() => limit(() => play(i, trial))) : limit(() => play(i, trial));
      before = next;
      next.catch(() => undefined); // awaited below, in order
      ahead.push(next);
      if (ahead.length > 2 * (remote?.concurrency ?? 0)) yield await ahead.shift()!;
    }
  }
  while (ahead.length > 0) yield await ahead.shift()!;
}

function emptyStats(): SimulationStats {
  return { byAgent: {}, byDifficulty: {} };
}

function addToStats(stats: SimulationStats, s: Session): void {
  const meta = JSON.parse(s.metadata) as { success: boolean; turns: number; difficulty: number };
  const agent = (stats.byAgent[s.model ?? '?'] ??= { sessions: 0, successes: 0, reward: 0, turns: 0 });
  agent.sessions++;
  agent.successes += meta.success ? 1 : 0;
  agent.reward += s.reward;
  agent.turns += meta.turns;
  const d = ((stats.byDifficulty[s.model ?? '?'] ??= {})[meta.difficulty] ??= { sessions: 0, successes: 0 });
  d.sessions++;
  d.successes += meta.success ? 1 : 0;
}

function formatStats(stats: SimulationStats): string {
  const pct = (a: number, b: number) => (b ? `${((100 * a) / b).toFixed(1)}%` : '-');
  const lines = ['agent        sessions  success  reward  turns/mean  success by difficulty 1..5'];
  let n = 0;
  let ok = 0;
  for (const [name, a] of Object.entries(stats.byAgent).sort()) {
    n += a.sessions;
    ok += a.successes;
    const byD = [1, 2, 3, 4, 5].map((d) => {
      const c = stats.byDifficulty[name]?.[d];
      return c ? pct(c.successes, c.sessions).padStart(6) : '     -';
    });
    lines.push(
      `${name.padEnd(12)} ${String(a.sessions).padStart(8)}  ${pct(a.successes, a.sessions).padStart(7)}  ${(a.reward / a.sessions).toFixed(3)}  ${(a.turns / a.sessions).toFixed(1).padStart(10)}  ${byD.join(' ')}`,
    );
  }
  lines.push(`${'all'.padEnd(12)} ${String(n).padStart(8)}  ${pct(ok, n).padStart(7)}`);
  return lines.join('\n') + '\n';
}

const agentName = (v: string) => {
  if (/^https?:\/\//.test(v) || (AGENTS as readonly string[]).includes(v) || v === 'mix') return v;
  throw new InvalidArgumentError(`expected one of ${AGENTS.join(', ')}, mix, or an endpoint's URL (http://…/v1)`);
};
const temperatureOf = (v: string) => {
  const n = Number(v);
  if (!(n >= 0 && n <= 2)) throw new InvalidArgumentError('expected a number in [0, 2]');
  return n;
};
const day = (v: string) => {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(v) || Number.isNaN(Date.parse(`${v}T00:00:00Z`)))
    throw new InvalidArgumentError('expected a day, YYYY-MM-DD');
  return v;
};
const probability = (v: string) => {
  const n = Number(v);
  if (!(n >= 0 && n <= 1)) throw new InvalidArgumentError('expected a number in [0, 1]');
  return n;
};

export function addSimulateCommands(program: Command, ctx: CommandContext): void {
  program
    .command('simulate')
    .description('generate logged sessions of scripted agents in the customer-service world (deterministic per seed)')
    .option('--tasks <n>', 'number of tasks', wholeNumber, 100)
    .option('--trials <k>', 'attempts per task (several, so groups exist for pairing)', wholeNumber, 4)
    .option(
      '--agent <name|url>',
      `which scripted agent (${AGENTS.join(', ')}), their mix (about 70% success), or the base URL of an OpenAI-compatible endpoint (e.g. \`prefab serve\`'s http://127.0.0.1:8000/v1)`,
      agentName,
      'mix',
    )
    .option('--model <name>', 'with --agent URL: the model asked for', 'production')
    .option(
      '--api-key-env <var>',
      'with --agent URL: the environment variable holding its API key',
      'PREFAB_SERVE_API_KEY',
    )
    .option('--temperature <t>', "with --agent URL: the model's sampling temperature (0 to 2)", temperatureOf, 0.5)
    .option('--max-tokens <n>', 'with --agent URL: most tokens in one assistant message', wholeNumber, 160)
    .option('--max-turns <n>', 'with --agent URL: most assistant messages in one episode', wholeNumber, 12)
    .option('--concurrency <n>', 'with --agent URL: episodes played at once', wholeNumber, 8)
    .option('--date <day>', 'the day the sessions are dated from, one a minute (YYYY-MM-DD)', day, EPOCH)
    .option('--noise <p>', 'the noisy agent: chance of dropping each needed field', probability, 0.3)
    .addOption(
      new Option('--split <split>', 'train tasks, or validation tasks on companies never seen in training')
        .choices(['train', 'val'])
        .default('train'),
    )
    .option('--seed <s>', 'world and episode seed', wholeNumber, 1)
    .option('--companies <n>', 'companies in the world', wholeNumber, DEFAULT_WORLD.companies)
    .option('--offset <i>', 'index of the first task', wholeNumber, 0)
    .option('--out <file>', 'write sessions as JSONL (.gz to compress)')
    .option('--stats', 'print success by agent and by difficulty, and mean turns')
    .option(
      '--notes',
      "each trial after a failed one reads, in the user's request, what the representatives said in the task's failed trials before it (feedback-guided DAPO's notes)",
    )
    .action(
      async (
        given: Omit<SimulateOptions, 'agent'> & {
          agent: string;
          model: string;
          apiKeyEnv: string;
          temperature: number;
          maxTokens: number;
          maxTurns: number;
          concurrency: number;
          out?: string;
          stats?: boolean;
        },
      ) => {
        if (!given.out && !given.stats) throw new UsageError('simulate: give --out FILE, --stats, or both');
        const remote = /^https?:\/\//.test(given.agent);
        const agent = remote
          ? {
              url: given.agent,
              model: given.model,
              apiKey: process.env[given.apiKeyEnv] ?? '',
              temperature: given.temperature,
              maxTokens: given.maxTokens,
              maxTurns: given.maxTurns,
              concurrency: Math.max(1, given.concurrency),
            }
          : (given.agent as AgentName | 'mix');
        const opts = { ...given, agent };
        const stats = emptyStats();
        // Written beside --out and renamed at the end: a run that fails leaves no part-file that a night's
        // ingest would take for sessions.
        const part = opts.out ? `${opts.out}.${process.pid}.part` : null;
        if (opts.out) mkdirSync(dirname(opts.out), { recursive: true });
        const raw = part ? createWriteStream(part) : null;
        const gz = opts.out?.endsWith('.gz') ? createGzip() : null;
        if (gz && raw) gz.pipe(raw);
        const out = gz ?? raw;
        const progress = ctx.logger().progress('simulate', opts.tasks * opts.trials);
        try {
          for await (const session of simulate(opts)) {
            addToStats(stats, session);
            if (out && !out.write(JSON.stringify(session) + '\n')) await once(out, 'drain');
            progress.tick();
          }
          progress.done();
          if (out) {
            out.end();
            await once(raw!, 'finish');
            renameSync(part!, opts.out!);
          }
        } catch (error) {
          raw?.destroy();
          if (part) rmSync(part, { force: true });
          throw error;
        }
        if (opts.stats) process.stdout.write(formatStats(stats));
        ctx.setExit(0);
      },
    );

  program
    .command('replay')
    .description('re-run the tool calls of logged simulator sessions and report results or rewards that do not match')
    .argument('<file>', 'JSONL of sessions (as `prefab simulate` writes them)')
    .action(async (file: string) => {
      if (!existsSync(file)) throw new UsageError(`replay: ${file} does not exist`);
      const worlds = new WorldCache();
      let checked = 0;
      let bad = 0;
      let skipped = 0;
      for await (const session of readJsonl<Session>(file)) {
        const report = replaySession(session, worlds);
        if (!report.replayable) {
          skipped++;
          continue;
        }
        checked++;
        if (report.ok) continue;
        bad++;
        process.stdout.write(JSON.stringify(report) + '\n');
      }
      ctx.logger().info('replayed', { file, checked, mismatched: bad, not_replayable: skipped });
      ctx.setExit(bad > 0 ? 1 : 0);
    });
}
