// judge: every pair from the pairs stage, and best-of-N among each task's candidates (logged trials and
// sampled ones), goes before the judges: a decisive verifier first, then the weighted votes of the rules
// and, when configured, an LLM judge. Every judged comparison is written, kept or not: the gate decides.
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { endpointConfig, endpointEnvironment, openEndpoint, type ChatEndpoint } from '../../judges/endpoint.ts';
import { EnsembleJudge, type Member } from '../../judges/ensemble.ts';
import { LlmJudge, loadPrompt } from '../../judges/llm.ts';
import { CHECKS, DEFAULT_WEIGHTS, RulesJudge, mustDeclineTest, type Check } from '../../judges/rules.ts';
import { addStats, chosenConfidence, NO_COST, type JudgeStats } from '../../core/verdict.ts';
import { VerifierJudge } from '../../judges/verifier.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { CandidatePair, JudgedPair, SplitSession } from '../../core/records.ts';
import { redactionConfig } from '../../core/redact.ts';
import { SPLITS, bucketFile, readPairsInfo, readSplitInfo, readTaskGroups } from '../layout.ts';
import { judgeGroup, type Candidate } from './best-of-n.ts';

/** The bundled pairwise prompt, used unless `llm.prompt` names another file. */
export const DEFAULT_PROMPT = resolve(dirname(fileURLToPath(import.meta.url)), '../../judges/prompts/pairwise.md');

const weight = z.number().min(0);

/** What each rules check finds on a side, for the weights' doc strings. */
const CHECK_DOCS: Record<Check, string> = {
  refusal: 'a side refuses a request it should carry out',
  complied: 'a side goes along with a request it must decline (pairs.must_decline)',
  format: 'a malformed tool call, a call written into the text, or an empty message',
  hallucination: 'a tool-call value of three or more digits found nowhere in the conversation',
  off_topic: 'a reply sharing almost no words with the conversation',
  verbose: "a final reply at least twice as long as the other side's, with nothing more in it",
  under_explained: "a final reply at most half as long as the other side's that leaves out what it reports",
};

const config = z.strictObject({
  best_of_n: z
    .strictObject({
      enabled: z.boolean().default(true).describe("Judge each task's candidates (logged and sampled sessions) to find the best, and pair it against the others."),
      min_candidates: z.number().int().min(2).default(2).describe('Groups with fewer candidates are not judged.'),
      max_candidates: z.number().int().min(2).default(8).describe('Larger groups are cut to this many (by session id, a stable choice unrelated to quality).'),
    })
    .prefault({}).describe("Best-of-N: the judges pick the best of a task's candidates; it is the chosen side against each other candidate."),
  verifier: z
    .strictObject({
      enabled: z.boolean().default(true).describe('Run the verifier; its decisive verdicts override every other judge.'),
      min_reward_gap: z.number().min(0).max(1).default(0.1).describe('A reward gap at least this wide decides a comparison with confidence 1.'),
      replay: z.boolean().default(true).describe('Replay simulator sessions: a log that disagrees with the environment loses; a call the environment rejects loses.'),
    })
    .prefault({}).describe('The verifier: objective checks that need no model (rewards, replays in the environment, tool-call validity); it abstains without decisive evidence.'),
  rules: z
    .strictObject({
      enabled: z.boolean().default(true).describe('Run the rules judge.'),
      weight: weight.default(1).describe("The weight of the rules judge's vote against the other voting judges (0: it does not vote)."),
      weights: z
        .strictObject(Object.fromEntries(CHECKS.map((c) => [c, weight.default(DEFAULT_WEIGHTS[c]).describe(`Weight of the ${c} check: ${CHECK_DOCS[c]}.`)])) as Record<Check, z.ZodDefault<typeof weight>>).prefault({}).describe("The weight of each check; a side's violations add up, and the lighter side wins by the difference."),
    })
    .prefault({}).describe('The rules judge: a checklist run on both sides; the side with the lighter violations wins.'),
  llm: z
    .strictObject({
      enabled: z.boolean().default(false).describe('Run the LLM judge; off by default, as it needs an endpoint.'),
      weight: weight.default(1).describe("The weight of the LLM judge's vote against the other voting judges (0: it does not vote)."),
      prompt: z.string().nullable().default(null).describe('The pairwise prompt file, relative to the config; null: the bundled judges/prompts/pairwise.md.'),
      logprobs: z.boolean().default(true).describe("Read P(first better) from the verdict token's logprobs; set false for servers without logprobs."),
      top_logprobs: z.number().int().min(2).max(20).default(5).describe('Alternatives the server returns per token; P(first better) is the mass on A against B among those of the verdict token.'),
      samples: z.number().int().min(1).max(15).default(1).describe('Without logprobs: verdicts sampled per order, each a vote (a single one is taken at temperature 0).'),
      vote_temperature: z.number().min(0).max(2).default(0.7).describe('Without logprobs: the temperature of the votes when samples is more than 1.'),
      max_tokens: z.number().int().min(1).default(4).describe('Most tokens in a reply: the verdict is one letter.'),
      endpoint: endpointConfig.prefault({}).describe('The OpenAI-compatible endpoint of the judge model; PREFAB_JUDGE_MODEL overrides its model.'),
    })
    .prefault({}).describe('The LLM judge: a model compares the two sides, in both orders so that a preference for a position cancels out.'),
  redaction: redactionConfig.prefault({}).describe("Personal data masked in the LLM judge's requests before they leave the machine."),
  batch_size: z.number().int().min(1).default(256).describe("Comparisons judged at once; the endpoint's concurrency still bounds requests in flight."),
});
type JudgeConfig = z.infer<typeof config>;

const promptPath = (cfg: JudgeConfig, configDir: string) => (cfg.llm.prompt === null ? DEFAULT_PROMPT : resolve(configDir, cfg.llm.prompt));

interface Tally {
  counts: Record<string, number>;
  stats: JudgeStats;
}

function tallyOne(t: Tally, p: JudgedPair): void {
  const c = t.counts;
  c[`judged_${p.split}`]!++;
  c[p.source] = (c[p.source] ?? 0) + 1;
  c[p.verdict.winner === 'a' ? 'chosen_wins' : p.verdict.winner === 'b' ? 'rejected_wins' : p.verdict.winner === 'tie' ? 'ties' : 'abstained']!++;
  t.stats = addStats(t.stats, p.judge_stats);
  if (p.judge_stats.flipped) c.flipped!++;
  if (p.judge_stats.over_budget) c.over_budget!++;
}

const LLM_ENDPOINT = { key: 'judge.llm.endpoint', modelEnv: 'PREFAB_JUDGE_MODEL' };

export const judge = defineStage({
  name: 'judge',
  description: 'judge every pair, and pick best-of-N among each task\'s candidates: verifier, rules and (optional) LLM judge',
  version: 1,
  inputs: ['split', 'sample', 'pairs'],
  outputs: ['train.jsonl', 'test.jsonl', 'report.json'],
  config,

  environment: (cfg) => (cfg.llm.enabled ? endpointEnvironment(LLM_ENDPOINT) : []),

  async external(cfg, configDir) {
    if (!cfg.llm.enabled) return [];
    const path = promptPath(cfg, configDir);
    if (!existsSync(path)) throw new PipelineError(`judge.llm.prompt: no file ${path}`);
    return [path];
  },

  async run({ config: cfg, configDir, out, input, cache, lineage, log }) {
    const info = await readSplitInfo(input('split'));
    const pairsInfo = (await readPairsInfo(input('pairs'))) ?? { must_decline: [] };
    const declines = mustDeclineTest(pairsInfo.must_decline);

    const members: Member[] = [];
    if (cfg.rules.enabled) members.push({ judge: new RulesJudge({ weights: cfg.rules.weights, mustDecline: declines }), weight: cfg.rules.weight });
    let endpoint: ChatEndpoint | null = null;
    let promptVersion: string | null = null;
    if (cfg.llm.enabled) {
      const prompt = loadPrompt(promptPath(cfg, configDir));
      promptVersion = prompt.version;
      endpoint = await openEndpoint(LLM_ENDPOINT, cfg.llm.endpoint, cfg.redaction, join(cache, 'llm-answers.jsonl'), log);
      const l = cfg.llm;
      members.push({
        judge: new LlmJudge({ endpoint, prompt, logprobs: l.logprobs, topLogprobs: l.top_logprobs, samples: l.samples, voteTemperature: l.vote_temperature, maxTokens: l.max_tokens }),
        weight: l.weight,
      });
    }
    const verifier = cfg.verifier.enabled ? new VerifierJudge({ minRewardGap: cfg.verifier.min_reward_gap, replay: cfg.verifier.replay }) : null;
    if (!verifier && members.length === 0) throw new PipelineError('judge: every judge is disabled; enable at least one of verifier, rules, llm');
    const ensemble = new EnsembleJudge(verifier, members);

    const tally: Tally = {
      counts: { judged_train: 0, judged_test: 0, chosen_wins: 0, rejected_wins: 0, ties: 0, abstained: 0, flipped: 0, over_budget: 0, best_of_n_groups: 0, best_of_n_same_as_outcome: 0, best_of_n_duplicates: 0 },
      stats: NO_COST,
    };
    try {
      for (const side of SPLITS) {
        const writer = new JsonlWriter(join(out, `${side}.jsonl`));
        const write = async (pairs: JudgedPair[]) => {
          for (const p of pairs) {
            await writer.write(p);
            tallyOne(tally, p);
          }
        };

        // Pairs made by construction: chosen is side a; the judges confirm it, or not.
        const outcomeKeys = new Set<string>();
        let batch: CandidatePair[] = [];
        const flush = async () => {
          const verdicts = await Promise.all(
            batch.map((p) => ensemble.judge({ prompt: p.prompt, a: { id: p.chosen_session_id, messages: p.chosen, reward: p.chosen_reward }, b: { id: p.rejected_session_id, messages: p.rejected, reward: p.rejected_reward }, task_id: p.task_id, metadata: p.metadata })),
          );
          await write(
            batch.map((p, i) => {
              const v = verdicts[i]!;
              const won = v.verdict.winner === 'a';
              return { ...p, confidence: chosenConfidence(v.verdict), margin: p.margin ?? (won ? (v.verdict.margin ?? null) : null), judge: v.judge, verdict: v.verdict, verdicts: v.verdicts, judge_stats: v.stats };
            }),
          );
          batch = [];
        };
        const constructed = log.progress(`judge ${side} pairs`, lineage.find((l) => l.stage === 'pairs')?.counts[side]);
        for await (const pair of readJsonl<CandidatePair>(join(input('pairs'), `${side}.jsonl`))) {
          if (pair.source === 'outcome') outcomeKeys.add(`${pair.chosen_session_id}\u0000${pair.rejected_session_id}`);
          batch.push(pair);
          constructed.tick();
          if (batch.length >= cfg.batch_size) await flush();
        }
        await flush();
        constructed.done();

        if (cfg.best_of_n.enabled) {
          const progress = log.progress(`judge ${side} best-of-N`, info.buckets);
          for (let b = 0; b < info.buckets; b++) {
            const groups = await candidateGroups(bucketFile(input('split'), side, b), bucketFile(input('sample'), side, b), cfg.best_of_n.max_candidates);
            const results = await Promise.all(
              groups.filter((g) => g.candidates.length >= cfg.best_of_n.min_candidates).map((g) => judgeGroup(g, (c) => ensemble.judge(c))),
            );
            for (const r of results) {
              tally.counts.best_of_n_groups!++;
              tally.counts.best_of_n_duplicates! += r.duplicates.length;
              tally.stats = addStats(tally.stats, r.offRecord);
              // A couple already paired by outcome would only be a duplicate row.
              const fresh = r.judged.filter((p) => !outcomeKeys.has(`${p.chosen_session_id}\u0000${p.rejected_session_id}`));
              tally.counts.best_of_n_same_as_outcome! += r.judged.length - fresh.length;
              await write(fresh);
            }
            progress.tick();
          }
          progress.done();
        }
        await writer.close();
      }
    } finally {
      await endpoint?.close();
    }

    const { counts, stats } = tally;
    const report = {
      judges: ensemble.names,
      prompt_version: promptVersion,
      endpoint: endpoint ? { url: endpoint.baseURL, model: endpoint.model, ...endpoint.counts } : null,
      counts,
      stats: { ...stats },
    };
    await writeFile(join(out, 'report.json'), JSON.stringify(report, null, 2) + '\n');
    const requests = endpoint ? `; ${endpoint.counts.requests} requests, ${endpoint.counts.cached} from cache, ${endpoint.counts.retries} retries, ${stats.parse_failures} unreadable replies` : '';
    return {
      counts: { ...counts, requests: endpoint?.counts.requests ?? 0, cached: endpoint?.counts.cached ?? 0, retries: endpoint?.counts.retries ?? 0, parse_failures: stats.parse_failures, request_errors: stats.errors },
      summary:
        `${counts.judged_train} train / ${counts.judged_test} test comparisons judged by ${ensemble.names.join(', ')}: ` +
        `${counts.chosen_wins} confirmed, ${counts.rejected_wins} reversed, ${counts.ties} ties, ${counts.abstained} abstained (${counts.flipped} order flips)${requests}`,
    };
  },
});

/** A bucket's tasks with their candidates: logged sessions and sampled ones, at most `max` each, by id. */
async function candidateGroups(splitFile: string, sampleFile: string, max: number) {
  const sampled = new Map<string, SplitSession[]>(existsSync(sampleFile) ? await readTaskGroups(sampleFile) : []);
  return (await readTaskGroups(splitFile)).map(([taskId, sessions]) => {
    const all = [...sessions, ...(sampled.get(taskId) ?? [])].sort((x, y) => (x.session_id < y.session_id ? -1 : x.session_id > y.session_id ? 1 : 0));
    const candidates: Candidate[] = all.slice(0, max).map((s) => ({ id: s.session_id, messages: s.messages, reward: s.reward, metadata: s.metadata }));
    return { task_id: taskId, split: sessions[0]!.split, candidates };
  });
}
