// The verifier: objective checks that need no model. Its decisive verdicts (confidence 1) override every
// other judge; where it has no decisive evidence it abstains. In order:
//   1. replay: a side whose logged tool results or reward disagree with a replay in the environment loses;
//   2. outcome reward: a gap of at least `minRewardGap` decides;
//   3. environment steps (sides without a reward, such as one transformed turn): a side whose own tool calls
//      fail in the environment loses to one whose calls all succeed, if that one made at least as many;
//   4. tool-call validity: a side with a malformed call loses to one whose calls are all well formed.
import { WorldCache, replayCalls, replayOn, sessionTask } from '../env/replay.ts';
import { episodeReward } from '../env/env.ts';
import type { Message } from '../core/records.ts';
import { callValidity, knownTools } from './tool-calls.ts';
import {
  NO_COST,
  abstain,
  type Comparison,
  type Completion,
  type Judge,
  type Judged,
  type Verdict,
} from '../core/verdict.ts';

export interface VerifierOptions {
  /** The smallest reward gap that decides a comparison on its own. */
  minRewardGap: number;
  /** Replay simulator sessions in the environment (integrity and step outcomes). */
  replay: boolean;
}

const REWARD_TOLERANCE = 1e-6;
/** Rounding slack on the gap, so that 0.3 against 0.2 is the 0.1 it is written as (0.0999... in floating point). */
const GAP_EPSILON = 1e-9;

interface Replayed {
  /** Logged tool results or reward that do not match the replay. */
  tampered: string[];
  /** Tool calls made by the completion itself, and how many the environment rejected. */
  calls: number;
  failed: string[];
}

export class VerifierJudge implements Judge {
  readonly name = 'verifier';
  private readonly worlds = new WorldCache();
  constructor(private readonly options: VerifierOptions) {}

  async judge(c: Comparison): Promise<Judged> {
    return { verdict: this.verdict(c), stats: NO_COST };
  }

  verdict(c: Comparison): Verdict {
    const decide = (winner: 'a' | 'b', rationale: string, margin?: number): Verdict => ({
      winner,
      confidence: 1,
      rationale,
      ...(margin === undefined ? {} : { margin }),
    });
    const found = this.options.replay ? sessionTask({ task_id: c.task_id, metadata: c.metadata }, this.worlds) : null;
    // The prompt, which both sides go on from, is replayed once.
    const opening =
      found && !('reason' in found) ? { found, prompt: replayCalls(found.world, found.task, c.prompt) } : null;
    const replay = opening ? { a: this.replay(opening, c, c.a), b: this.replay(opening, c, c.b) } : null;

    if (replay) {
      const ta = replay.a.tampered.length > 0;
      const tb = replay.b.tampered.length > 0;
      if (ta && tb) return abstain('both logs disagree with a replay in the environment');
      if (ta !== tb)
        return decide(
          ta ? 'b' : 'a',
          `${ta ? 'a' : 'b'}'s log disagrees with a replay: ${(ta ? replay.a : replay.b).tampered[0]}`,
        );
    }

    const ra = c.a.reward;
    const rb = c.b.reward;
    if (ra !== null && rb !== null && Math.abs(ra - rb) >= this.options.minRewardGap - GAP_EPSILON) {
      return decide(ra > rb ? 'a' : 'b', `outcome reward ${ra} vs ${rb}`, Math.abs(ra - rb));
    }

    if (replay && (ra === null || rb === null)) {
      // A side does not win by making fewer calls: leaving a call out (or making none) avoids its failure.
      const fa = replay.a.failed.length > 0;
      const fb = replay.b.failed.length > 0;
      if (fa && !fb && replay.b.calls > 0 && replay.b.calls >= replay.a.calls)
        return decide('b', `a's tool call failed in the environment: ${replay.a.failed[0]}`);
      if (fb && !fa && replay.a.calls > 0 && replay.a.calls >= replay.b.calls)
        return decide('a', `b's tool call failed in the environment: ${replay.b.failed[0]}`);
    }

    const tools = knownTools(c);
    const va = callValidity(c.a.messages, tools);
    const vb = callValidity(c.b.messages, tools);
    if (va.invalid.length > 0 && vb.invalid.length === 0 && vb.calls > 0)
      return decide('b', `a's tool call is malformed: ${va.invalid[0]}`);
    if (vb.invalid.length > 0 && va.invalid.length === 0 && va.calls > 0)
      return decide('a', `b's tool call is malformed: ${vb.invalid[0]}`);

    return abstain(
      ra !== null && rb !== null
        ? `rewards ${ra} and ${rb} are within ${this.options.minRewardGap}`
        : 'no decisive evidence',
    );
  }

  private replay(
    opening: {
      found: Exclude<ReturnType<typeof sessionTask>, { reason: string }>;
      prompt: ReturnType<typeof replayCalls>;
    },
    c: Comparison,
    side: Completion,
  ): Replayed {
    const messages = [...c.prompt, ...side.messages];
    const { calls, state } = replayOn(opening.found.world, opening.prompt, messages, c.prompt.length);
    const tampered: string[] = [];
    const failed: string[] = [];
    let own = 0;
    for (const call of calls) {
      if (call.result_index >= 0) {
        const logged = messages[call.result_index]!.content ?? '';
        if (logged !== call.observation)
          tampered.push(
            `tool result at message ${call.result_index} was "${clip(logged)}", replay gives "${clip(call.observation)}"`,
          );
      } else if (call.message_index < messages.length - 1) {
        // The log goes on past the call without its result; only a side's last turn may end before its results.
        tampered.push(
          `tool call ${call.call_id} at message ${call.message_index} has no logged result; replay gives "${clip(call.observation)}"`,
        );
      }
      if (call.message_index >= c.prompt.length) {
        own++;
        if (call.feedback) failed.push(call.feedback);
      }
    }
    // A turn-level side (one turn of a logged episode) carries its episode's reward, but its replay stops
    // where the turn does: the reward can be recomputed only from a side that reaches the episode's end.
    if (side.reward !== null && reachesEnd(side.messages, state.done)) {
      const replayed = Math.round(episodeReward(state) * 1e6) / 1e6;
      if (Math.abs(replayed - side.reward) > REWARD_TOLERANCE)
        tampered.push(`logged reward ${side.reward}, replay gives ${replayed}`);
    }
    return { tampered, calls: own, failed };
  }
}

/**
 * Whether a side runs to the end of its episode: the environment ended it (finish, step limit) or the agent
 * stopped, which a reply without tool calls does in the simulator.
 */
function reachesEnd(messages: Message[], done: boolean): boolean {
  const last = messages.at(-1);
  return done || (last?.role === 'assistant' && !last.tool_calls?.length);
}

const clip = (s: string) => (s.length > 80 ? `${s.slice(0, 77)}...` : s);
