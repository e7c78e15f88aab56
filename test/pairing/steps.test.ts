// Step pairs (pairing/steps.ts): rollouts of one task, a prefix tree over their turns, each assistant turn
// valued by the success rate of the rollouts through it; siblings apart by the margin become a pair on that
// one turn, in TRL's format. On hand-made rollouts, then on the simulator's scripted agents.
import { describe, expect, it } from 'vitest';
import type { Message, Session } from '../../core/records.ts';
import { ScriptedAgent } from '../../env/agents.ts';
import { episodeSession, runEpisode } from '../../env/rollout.ts';
import { generateWorld, taskPool } from '../../env/world.ts';
import { stepPairs } from '../../pairing/steps.ts';

const SYSTEM: Message = { role: 'system', content: 'You phone companies for the user.' };
const USER: Message = { role: 'user', content: 'Cancel my gym membership.' };
/** An assistant turn calling `name` with `args`, its call id `id` (rollouts number their calls as they like). */
const call = (name: string, args: object, id: string): Message => ({
  role: 'assistant',
  content: null,
  tool_calls: [{ id, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
});
const tool = (content: string, id: string): Message => ({ role: 'tool', content, tool_call_id: id });
const rollout = (id: string, reward: number, messages: Message[]): Session => ({
  session_id: id,
  task_id: 'T',
  messages: [SYSTEM, USER, ...messages],
  reward,
  feedback: null,
  model: 'policy',
  source: 'rollouts',
  created_at: null,
  metadata: '{}',
});

// Turn 1: search the directory (3 rollouts) or call blindly (1, fails). After the search, turn 2: ask for the
// right fields (2 rollouts, both succeed) or the wrong ones (1, fails).
const SEARCH = (id: string) => call('search_directory', { company: 'Globo Gym' }, id);
const FOUND = (id: string) => tool('Billing: 555-0101', id);
const ROLLOUTS = [
  rollout('r1', 1, [SEARCH('a1'), FOUND('a1'), call('auth_info_form', { fields: ['pin'] }, 'a2')]),
  rollout('r2', 1, [SEARCH('b1'), FOUND('b1'), call('auth_info_form', { fields: ['pin'] }, 'b2')]),
  rollout('r3', 0, [SEARCH('c1'), FOUND('c1'), call('auth_info_form', { fields: ['email'] }, 'c2')]),
  rollout('r4', 0, [call('call', { phone_number: '555-0000' }, 'd1'), tool('no such number', 'd1')]),
];

describe('step pairs', () => {
  it('pair the likelier turn with each sibling worse by the margin, at every point where the rollouts part', () => {
    const pairs = stepPairs(ROLLOUTS, { margin: 0.5, successReward: 1, minVisits: 1 });
    expect(pairs).toHaveLength(2);
    const [first, second] = pairs;
    // Where the rollouts part at their first turn: search (2 of 3 succeed) over calling blindly (0 of 1).
    expect(first!.prompt).toEqual([SYSTEM, USER]);
    expect(first!.chosen[0]!.tool_calls![0]!.function.name).toBe('search_directory');
    expect(first!.rejected[0]!.tool_calls![0]!.function.name).toBe('call');
    expect([first!.chosen_reward, first!.rejected_reward]).toEqual([2 / 3, 0]);
    expect(first!.margin).toBeCloseTo(2 / 3, 10);
    expect(first!.judge).toBe('rollouts:3/1');
    // After the search (its call ids differ between rollouts: the same turn all the same), the right fields.
    expect(second!.prompt.map((m) => m.role)).toEqual(['system', 'user', 'assistant', 'tool']);
    expect(JSON.parse(second!.chosen[0]!.tool_calls![0]!.function.arguments)).toEqual({ fields: ['pin'] });
    expect([second!.chosen_reward, second!.rejected_reward, second!.chosen_session_id]).toEqual([1, 0, 'r1']);
    for (const p of pairs) {
      // TRL's format: the prompt ends on a user or tool turn; each side is one assistant turn.
      expect(['user', 'tool']).toContain(p.prompt.at(-1)!.role);
      expect([p.chosen.length, p.rejected.length, p.chosen[0]!.role, p.rejected[0]!.role]).toEqual([
        1,
        1,
        'assistant',
        'assistant',
      ]);
      expect([p.source, p.confidence, p.task_id, p.split]).toEqual(['step', 1, 'T', 'train']);
    }
  });

  it('leaves out siblings closer than the margin, or taken by too few rollouts to be valued', () => {
    expect(stepPairs(ROLLOUTS, { margin: 0.7, successReward: 1, minVisits: 1 })).toHaveLength(1); // 2/3 < 0.7
    expect(stepPairs(ROLLOUTS, { margin: 0.5, successReward: 1, minVisits: 2 })).toEqual([]); // r4 and r3 alone
    expect(stepPairs(ROLLOUTS.slice(0, 2), { margin: 0.1, successReward: 1, minVisits: 1 })).toEqual([]); // one way each
  });

  it('are the same pairs, ids included, whatever order the rollouts come in', () => {
    const o = { margin: 0.5, successReward: 1, minVisits: 1 };
    expect(stepPairs([...ROLLOUTS].reverse(), o)).toEqual(stepPairs(ROLLOUTS, o));
  });

  it('find in the simulator’s rollouts of one task the turns that lead to success more often', async () => {
    const world = generateWorld({ seed: 3, companies: 20 });
    let found = 0;
    for (const task of taskPool(world, 'train', 6, 2)) {
      const rollouts: Session[] = [];
      for (let trial = 0; trial < 8; trial++) {
        const agent = new ScriptedAgent('noisy', world, task, `steps-${trial}`);
        const episode = await runEpisode(world, task, agent, 12);
        rollouts.push(episodeSession(world, task, agent, episode, { trial, createdAt: '2026-12-06' }));
      }
      for (const p of stepPairs(rollouts, { margin: 0.5, successReward: 1, minVisits: 1 })) {
        found++;
        // The chosen turn's rollouts succeed more often than the rejected turn's, by the margin.
        expect(p.chosen_reward! - p.rejected_reward!).toBeGreaterThanOrEqual(0.5);
        // Both sides follow the same conversation: the prompt is a prefix of both their rollouts.
        const through = (id: string) => rollouts.find((r) => r.session_id === id)!.messages;
        for (const id of [p.chosen_session_id, p.rejected_session_id])
          expect(through(id).slice(0, p.prompt.length)).toEqual(p.prompt);
      }
    }
    expect(found).toBeGreaterThan(0);
  });
});
