import { describe, expect, it } from 'vitest';
import { ScriptedAgent } from '../../env/agents.ts';
import { seeded } from '../../core/random.ts';
import { runEpisode } from '../../env/rollout.ts';
import { generateTask, generateWorld } from '../../env/world.ts';
import type { Message } from '../../core/records.ts';
import { copiedValues, reshape, resampleCopies } from '../../trainers/augment.ts';

const world = generateWorld({ seed: 3, companies: 30 });

async function oracleSession(index: number): Promise<Message[]> {
  const task = generateTask(world, 'train', index);
  return (await runEpisode(world, task, new ScriptedAgent('oracle', world, task, 's'))).messages;
}

const calls = (messages: Message[]) =>
  messages
    .flatMap((m) => m.tool_calls ?? [])
    .map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) as Record<string, unknown> }));

describe('copy augmentation', () => {
  it('finds the values the assistant copied, and not field names or the requests it wrote', async () => {
    const messages = await oracleSession(0);
    const task = generateTask(world, 'train', 0);
    const copied = copiedValues(messages);
    expect(copied).toContain(task.company);
    const phones = calls(messages)
      .filter((c) => c.name === 'call')
      .map((c) => c.args.phone_number as string);
    expect(phones.length).toBeGreaterThan(0);
    for (const p of phones) expect(copied).toContain(p);
    for (const c of calls(messages).filter((c) => c.name === 'call')) {
      for (const v of Object.values(c.args.auth as Record<string, string>)) expect(copied).toContain(v);
      expect(copied).not.toContain(c.args.request);
    }
    expect(copied).not.toContain('account_number');
  });

  it('keeps the shape of a value: digits, letters of each case, punctuation', () => {
    const out = reshape('Acme Bank 1-800-555-0199 jo.e@x.com', seeded('r'));
    expect(out).toMatch(/^[A-Z][a-z]{3} [A-Z][a-z]{3} \d-\d{3}-\d{3}-\d{4} [a-z]{2}\.[a-z]@[a-z]\.[a-z]{3}$/);
    expect(out).not.toBe('Acme Bank 1-800-555-0199 jo.e@x.com');
  });

  it('replaces each copied value everywhere, consistently, so the session still works in the world', async () => {
    for (const index of [0, 1, 2, 3]) {
      const messages = await oracleSession(index);
      const fresh = resampleCopies(messages, seeded('swap', index));
      expect(fresh[0]).toEqual(messages[0]);
      const text = JSON.stringify(fresh);
      for (const v of copiedValues(messages)) expect(text).not.toContain(v);
      // The renamed company is searched for by the name the user gave, and every call goes to a number
      // the renamed directory lists, with the values the renamed form returned.
      const user = fresh[1]!.content!;
      const observations = fresh
        .filter((m) => m.role === 'tool')
        .map((m) => m.content!)
        .join('\n');
      for (const c of calls(fresh)) {
        if (c.name === 'search_directory') expect(user).toContain(c.args.company);
        if (c.name === 'call') {
          expect(observations).toContain(`"phone":"${c.args.phone_number}"`);
          for (const [field, value] of Object.entries(c.args.auth as Record<string, string>))
            expect(observations).toContain(`"${field}":"${value}"`);
        }
      }
      // The same tools in the same order: only copied values differ.
      expect(calls(fresh).map((c) => c.name)).toEqual(calls(messages).map((c) => c.name));
    }
  });

  it('is a function of the seed, and leaves a session that copies nothing as it is', async () => {
    const messages = await oracleSession(1);
    expect(resampleCopies(messages, seeded('a'))).toEqual(resampleCopies(messages, seeded('a')));
    expect(resampleCopies(messages, seeded('a'))).not.toEqual(resampleCopies(messages, seeded('b')));
    const plain: Message[] = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Hello there' },
      { role: 'assistant', content: 'Hi!' },
    ];
    expect(resampleCopies(plain, seeded('a'))).toBe(plain);
  });
});
