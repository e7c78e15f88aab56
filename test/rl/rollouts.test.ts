// The dapo stage's rollouts in the simulator: dynamic sampling keeps only groups whose rewards differ, and
// feedback-guided groups, played in order, let an agent that can only succeed by reading the notes succeed
// where the standard groups never do.
import { describe, expect, it } from 'vitest';
import { ScriptedAgent } from '../../env/agents.ts';
import { generateWorld, taskPool, type Task } from '../../env/world.ts';
import type { Message } from '../../core/records.ts';
import { simulatorRollouts, type Actor, type RolloutMode } from '../../rl/rollouts.ts';
import type { Llama } from '../../model/llama.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';

// Every department asks for something its kind usually does not: an agent that knows only the usual fields
// (the `prior` agent) fails every task on its own, and the form is filled once, so it cannot recover in an episode.
const world = generateWorld({ seed: 7, deviation: 1 });
const pool = taskPool(world, 'train', 6, 1);

/** The prior agent as an actor: a fresh agent per episode, reading whatever the rollouts show it. */
function priorActor(): Actor {
  const byRequest = new Map<string, Task>(pool.map((t) => [t.request, t]));
  let agent: ScriptedAgent | null = null;
  const actor: Actor = {
    name: 'prior',
    turns: [],
    random: Math.random,
    reads: null,
    respond(messages: Message[]) {
      if (messages.length === 2)
        agent = new ScriptedAgent('prior', world, byRequest.get(messages[1]!.content!)!, 'actor');
      return agent!.respond(actor.reads ? actor.reads(messages) : messages);
    },
  };
  return actor;
}

const rollouts = (mode: RolloutMode) =>
  simulatorRollouts({
    world,
    chat: null as never, // the scripted actor reads messages, not tokens
    context: 0,
    placeholders: null,
    sampling: { maxTokens: 160, temperature: 1, topP: 1, engine: { kind: 'reference' } },
    maxTurns: 12,
    seed: 's',
    groupSize: 4,
    tasksPerStep: 2,
    maxGenerationBatches: 2,
    taskPool: pool.length,
    maxCalls: 1,
    mode,
    reward: 'success',
    overlongBuffer: 0,
    log: quietLogger(),
    actor: priorActor,
  })(0, null as unknown as Llama);

describe('dapo rollouts', () => {
  it('draw training tasks with at most max_calls calls when asked', () => {
    expect(pool.every((t) => t.calls.length === 1 && t.split === 'train')).toBe(true);
    expect(taskPool(world, 'val', 5, null).map((t) => t.index)).toEqual([0, 1, 2, 3, 4]);
  });

  it('standard: every episode fails, no group is informative, and nothing is kept after every generation batch', async () => {
    const { rollouts: kept, metrics } = await rollouts('standard');
    expect(kept).toEqual([]);
    expect(metrics).toMatchObject({ success: 0, kept_groups: 0, groups: 4, episodes: 16, guided: 0 });
    expect(metrics.success_guided).toBeUndefined();
  });

  it('feedback-guided: each group’s first episode fails, those reading its notes succeed, and the groups are kept', async () => {
    const { rollouts: kept, metrics } = await rollouts('feedback');
    expect(metrics).toMatchObject({
      success_plain: 0,
      success_guided: 1,
      kept_groups: 2,
      groups: 2,
      episodes: 8,
      guided: 0.75,
    });
    expect(kept.map((r) => r.reward)).toEqual([0, 1, 1, 1, 0, 1, 1, 1]);
    expect(new Set(kept.map((r) => r.group)).size).toBe(2);
  });
});
