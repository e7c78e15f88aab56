// Feedback-guided rollouts' notes: built from what the representatives said, never from what the task hides,
// and read by a later attempt (a scripted agent that reads them succeeds where it failed without them).
import { describe, expect, it } from 'vitest';
import { AGENTS, ScriptedAgent, readNotes } from '../../env/agents.ts';
import { addNotes, emptyNotes, feedbackBlock, withFeedback } from '../../env/feedback.ts';
import { runEpisode } from '../../env/rollout.ts';
import { FIELDS, FIELD_WORDS, generateTask, generateWorld, type Field } from '../../env/world.ts';
import type { Message, Session } from '../../core/records.ts';
import { replaySession } from '../../env/replay.ts';
import { simulate } from '../../env/simulate.ts';

const world = generateWorld({ seed: 5 });

describe('notes from failed attempts', () => {
  it("name only the fields a representative said were missing, per department, never a department's hidden requirements", async () => {
    let departmentsNoted = 0;
    let hiddenLeft = 0;
    for (let i = 0; i < 120; i++) {
      const task = generateTask(world, 'train', i);
      const agent = AGENTS[i % AGENTS.length]!;
      const episode = await runEpisode(world, task, new ScriptedAgent(agent, world, task, 'notes', 0.5));
      const block = feedbackBlock(addNotes(emptyNotes(), episode.messages));
      const replies = episode.messages.filter((m) => m.role === 'tool').map((m) => m.content ?? '');
      for (const [department, fields] of readNotes(block)) {
        departmentsNoted++;
        // Every field noted for a department was named as missing by that department's representative.
        const said = replies.filter((r) => r.startsWith(`${department} here. I can't verify your identity yet`));
        expect(said.length).toBeGreaterThan(0);
        for (const f of fields) expect(said.some((r) => r.includes(FIELD_WORDS[f]))).toBe(true);
        const requires = world.companies
          .find((c) => c.name === task.company)!
          .departments.find((d) => d.name === department)!.requires;
        // A required field the agent gave is not named: what the task hides stays hidden.
        if (requires.some((f) => !fields.includes(f))) hiddenLeft++;
      }
      // No personal value of the user ever reaches the notes.
      for (const value of Object.values(task.profile.values)) expect(block).not.toContain(value);
      if (!replies.some((r) => / here\. (I can't verify|Before I can)|wrong department/.test(r)))
        expect(block).toBe('');
    }
    expect(departmentsNoted).toBeGreaterThan(10);
    expect(hiddenLeft).toBeGreaterThan(0);
  });

  it('condense many failures into one block: fields merged per department, references and wrong numbers once', () => {
    const tool = (content: string): Message => ({ role: 'tool', content, tool_call_id: 'c' });
    const notes = emptyNotes();
    addNotes(notes, [
      tool("Acme Bank Billing here. I can't verify your identity yet: I need your account PIN."),
      tool("You've reached Acme Bank Fraud Prevention. I'm sorry, we can't help with that here: wrong department."),
    ]);
    addNotes(notes, [
      tool(
        "Acme Bank Billing here. I can't verify your identity yet: I need your account number, last four digits of your SSN and account PIN.",
      ),
      tool(
        'Acme Bank Loans here. Before I can do that, I need the reference number from your call with Acme Bank Billing.',
      ),
      tool("You've reached Acme Bank Fraud Prevention. I'm sorry, we can't help with that here: wrong department."),
    ]);
    const block = feedbackBlock(notes);
    expect(block).toBe(
      [
        'Notes from earlier attempts at this task:',
        '- Acme Bank Billing asked for account_number, last_4_ssn, pin.',
        '- Acme Bank Loans needs the reference number from Acme Bank Billing: call Acme Bank Billing first.',
        '- Acme Bank Fraud Prevention is the wrong department.',
      ].join('\n'),
    );
    expect(readNotes(block)).toEqual(new Map([['Acme Bank Billing', ['account_number', 'last_4_ssn', 'pin']]]));
    // Every field's words are read back to the field, the longest match first ("account PIN" is not an account number).
    for (const f of FIELDS) {
      const n = addNotes(emptyNotes(), [
        tool(`X here. I can't verify your identity yet: I need your ${FIELD_WORDS[f]}.`),
      ]);
      expect([...n.asked.get('X')!]).toEqual([f]);
    }
  });

  it("go after the user's first message, and only there", () => {
    const conversation: Message[] = [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'Call Acme.' },
      { role: 'user', content: 'later' },
    ];
    expect(withFeedback(conversation, '')).toBe(conversation);
    const shown = withFeedback(conversation, 'Notes: x');
    expect(shown.map((m) => m.content)).toEqual(['sys', 'Call Acme.\n\nNotes: x', 'later']);
    expect(conversation[1]!.content).toBe('Call Acme.');
  });

  it('let a scripted agent that reads them succeed where it failed: a department asking for more than its kind usually does', async () => {
    const deviant = generateWorld({ seed: 5, deviation: 1 });
    let rescued = 0;
    for (let i = 0; i < 40; i++) {
      const task = generateTask(deviant, 'train', i);
      if (task.calls.length !== 1) continue;
      const first = await runEpisode(deviant, task, new ScriptedAgent('prior', deviant, task, 'n'));
      expect(first.success).toBe(false); // every department deviates from its kind's usual fields
      const block = feedbackBlock(addNotes(emptyNotes(), first.messages));
      const second = await runEpisode(deviant, task, {
        name: 'prior',
        respond: (
          (agent) => (m: Message[]) =>
            agent.respond(withFeedback(m, block))
        )(new ScriptedAgent('prior', deviant, task, 'n')),
      });
      expect(second.success).toBe(true);
      const asked = JSON.parse(
        second.messages.find((m) => m.tool_calls?.[0]?.function.name === 'auth_info_form')!.tool_calls![0]!.function
          .arguments,
      ) as { fields: Field[] };
      expect(asked.fields).toEqual(expect.arrayContaining([...readNotes(block).values()].flat()));
      rescued++;
    }
    expect(rescued).toBeGreaterThan(3);
  });
});

describe('prefab simulate --notes', () => {
  it('logs each trial after a failed one with the notes of the failed trials before it in the request, and replays', async () => {
    const opts = {
      tasks: 40,
      trials: 3,
      agent: 'prior' as const,
      noise: 0.3,
      split: 'train' as const,
      seed: 5,
      companies: 100,
      offset: 0,
    };
    const plain: Session[] = [];
    const noted: Session[] = [];
    for await (const s of simulate(opts)) plain.push(s);
    for await (const s of simulate({ ...opts, notes: true })) noted.push(s);
    const request = (s: Session) => s.messages.find((m) => m.role === 'user')!.content!;
    let read = 0;
    for (let i = 0; i < noted.length; i += opts.trials) {
      const trials = noted.slice(i, i + opts.trials);
      trials.forEach((s, k) => {
        // The notes are those of the failed trials before, as feedback-guided rollouts build them.
        const notes = emptyNotes();
        for (const before of trials.slice(0, k))
          if (JSON.parse(before.metadata).success === false) addNotes(notes, before.messages);
        const block = feedbackBlock(notes);
        expect(request(s)).toBe(block ? `${request(plain[i]!)}\n\n${block}` : request(plain[i]!));
        if (block) read++;
        expect(replaySession(s).ok).toBe(true);
      });
    }
    expect(read).toBeGreaterThan(5);
    // Reading them, the prior agent succeeds more often than it does without.
    const successes = (xs: Session[]) => xs.filter((s) => JSON.parse(s.metadata).success).length;
    expect(successes(noted)).toBeGreaterThan(successes(plain));
  });
});
