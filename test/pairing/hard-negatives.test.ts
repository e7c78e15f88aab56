import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { beforeAll, describe, expect, it } from 'vitest';
import { buildHardNegatives as buildStored } from '../../pairing/hard-negatives.ts';
import { readTemplates } from '../../pairing/templates.ts';
import { plainPair, stored } from '../fixtures/pipeline.ts';
import {
  ALL,
  TEMPLATES,
  SYSTEM,
  USER,
  buildHardNegatives,
  loadSample,
  options,
  session,
  successes,
} from '../fixtures/hard-negatives.ts';
import { AIRLINE_TOOLS, airlineTrials } from '../fixtures/public-shaped.ts';
import {
  NEGATIVE_TYPES,
  pairId,
  type Message,
  type NegativeType,
  type SplitSession,
  type ToolCall,
} from '../../core/records.ts';

beforeAll(loadSample);

describe("hard negatives fit the session's own world", () => {
  const writeTemplates = (text: string) => {
    const path = join(mkdtempSync(join(tmpdir(), 'templates-')), 'negatives.yaml');
    writeFileSync(path, text);
    return path;
  };
  const own = (o: { refusal?: string[]; off_topic?: string[] } = {}) =>
    readTemplates(
      writeTemplates(
        stringify({
          refusal: o.refusal ?? ["I'm sorry, but I can't book that table for you."],
          off_topic: o.off_topic ?? ['Tides follow the moon.'],
          verbose_openers: ['Happy to help!'],
          verbose_fillers: ['That is all there is to it.'],
          terse: ['Booked.'],
        }),
      ),
    );

  it('write what a templates file a config gives says, and nothing of the simulator', () => {
    const templates = own();
    for (const s of successes.slice(0, 30)) {
      const built = buildStored(stored(s), { ...options({ refusal: 1, under_explained: 1 }), templates });
      for (const pair of built.pairs.map(plainPair)) {
        const text = pair.rejected[0]!.content;
        expect(["I'm sorry, but I can't book that table for you.", 'Booked.']).toContain(text);
      }
    }
    // prefab's own speak of no task, tool or domain.
    for (const text of [...TEMPLATES.refusal, ...TEMPLATES.terse])
      expect(text).not.toMatch(/phone|call|compan|account|department/i);
  });

  it('refuse a templates file whose refusal would not read as one, or whose padding adds a digit, naming both', () => {
    expect(() => own({ refusal: ['Let me check that for you.'] })).toThrow(
      /negatives\.yaml \(pairs\.hard_negatives\.templates\): the refusal "Let me check that for you\." does not read as a refusal/,
    );
    const digits = writeTemplates(
      'refusal: ["I can\'t help with that."]\noff_topic: [x]\nverbose_openers: [Hi]\nverbose_fillers: ["Call 555."]\nterse: [Done.]\n',
    );
    expect(() => readTemplates(digits)).toThrow(/"Call 555\." holds a digit/);
    expect(() => readTemplates(writeTemplates('refusal: []\n'))).toThrow(/refusal: /);
  });

  it('pass over an off-topic remark that shares a word with the session, and say so when all do', () => {
    const templates = own({ off_topic: ['A proper risotto wants patience.', 'Honey never spoils in sealed jars.'] });
    const cooking = (id: string, words: string) =>
      session(id, [
        { role: 'system', content: 'You are a cooking assistant.' },
        { role: 'user', content: `How long should my ${words} rest?` },
        { role: 'assistant', content: 'About ten minutes, covered.' },
      ]);
    for (const salt of ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']) {
      const [pair] = buildStored(stored(cooking('r', 'Risotto')), {
        ...options({ off_topic: 1 }, salt),
        templates,
      }).pairs;
      expect(plainPair(pair!).rejected[0]!.content).toBe('Honey never spoils in sealed jars.');
    }
    const both = buildStored(stored(cooking('rh', 'risotto with honey')), { ...options({ off_topic: 1 }), templates });
    expect(both.pairs).toEqual([]);
    expect(both.skipped[0]!.reason).toMatch(/every off-topic template shares a word/);
  });

  it("misspell a tool, or leave out its required argument, only where the session's tools are known", () => {
    const names = new Set(AIRLINE_TOOLS.map((t) => t.function.name));
    const kinds = new Set<string>();
    for (const r of airlineTrials(8).filter((r) => r.reward === 1)) {
      const messages = r.traj as Message[];
      for (const salt of ['a', 'b', 'c', 'd', 'e', 'f']) {
        const withTools = session('t', messages, JSON.stringify({ tools: AIRLINE_TOOLS }));
        for (const pair of buildHardNegatives(withTools, options({ format: 1 }, salt)).pairs) {
          const [before, after] = [pair.chosen[0]!.tool_calls ?? [], pair.rejected[0]!.tool_calls ?? []];
          const renamed = after.find((c, i) => c.function.name !== before[i]?.function.name);
          if (renamed) {
            kinds.add('misspelled');
            expect(names.has(renamed.function.name)).toBe(false);
          }
        }
        // Without them, no name or argument is known to be wrong.
        for (const pair of buildHardNegatives(session('n', messages), options({ format: 1 }, salt)).pairs) {
          const after = pair.rejected[0]!.tool_calls ?? [];
          const before = pair.chosen[0]!.tool_calls!;
          for (const [i, c] of after.entries()) {
            expect(c.function.name).toBe(before[i]!.function.name);
            const parsed = (() => {
              try {
                return JSON.parse(c.function.arguments) as object;
              } catch {
                return null;
              }
            })();
            if (parsed) expect(Object.keys(parsed)).toEqual(Object.keys(JSON.parse(before[i]!.function.arguments)));
          }
        }
      }
    }
    expect(kinds).toEqual(new Set(['misspelled']));
  });
});

describe('hard negatives differ from the chosen turn only in what their type says', () => {
  // Logs of another agent, whose tool-call arguments are spaced as Python writes JSON, beside the sample's.
  const airline = airlineTrials(8)
    .filter((r) => r.reward === 1)
    .map((r) =>
      session(
        `air-${String(r.task_id)}-${String(r.trial)}`,
        r.traj as Message[],
        JSON.stringify({ tools: AIRLINE_TOOLS }),
      ),
    );
  const sameCall = (a: ToolCall, b: ToolCall) => JSON.stringify(a) === JSON.stringify(b);

  it.each(NEGATIVE_TYPES)('%s', (type) => {
    let checked = 0;
    for (const s of [...airline, ...successes.slice(0, 150)]) {
      for (const pair of buildHardNegatives(s, options({ [type]: 1 })).pairs) {
        expect(pair.chosen).toHaveLength(1);
        expect(pair.rejected).toHaveLength(1);
        const [c, r] = [pair.chosen[0]!, pair.rejected[0]!];
        expect(r.role).toBe('assistant');
        const calls = c.tool_calls ?? [];
        const kept = r.tool_calls ?? [];
        if (type === 'refusal' || type === 'off_topic') {
          expect(r.tool_calls).toBeUndefined();
          expect(r.content).toBeTruthy();
        } else if (type === 'verbose' || type === 'under_explained') {
          expect(kept).toEqual(calls);
          if (type === 'verbose') expect(r.content).toContain(c.content);
          else expect(r.content!.length).toBeLessThan(c.content!.length);
        } else if (type === 'hallucination') {
          expect(r.content).toBe(c.content);
          expect(kept).toHaveLength(calls.length);
          const changed = calls.flatMap((call, i) => (sameCall(call, kept[i]!) ? [] : [i]));
          expect(changed).toHaveLength(1);
          const [before, after] = [calls[changed[0]!]!.function.arguments, kept[changed[0]!]!.function.arguments];
          // The same text, spacing and all, but for some digits of one value.
          expect(after).toHaveLength(before.length);
          for (let i = 0; i < before.length; i++)
            if (before[i] !== after[i]) expect(/\d/.test(before[i]!) && /\d/.test(after[i]!)).toBe(true);
        } else {
          // format: one call broken (or moved into the text); the others as they were, in order.
          const same = calls.filter((call) => kept.some((k) => sameCall(call, k)));
          expect(same.length).toBeGreaterThanOrEqual(calls.length - 1);
          expect(same.length).toBeLessThan(calls.length);
        }
        checked++;
      }
    }
    expect(checked, type).toBeGreaterThan(20);
  });
});

describe('hard negative pairs', () => {
  it('are turn-level: the context before one assistant turn, that turn, and its transform', () => {
    const ids = new Set<string>();
    let made = 0;
    for (const s of successes.slice(0, 60)) {
      const { pairs, skipped } = buildHardNegatives(s, options(ALL));
      made += pairs.length;
      // Every type applies to every session but repeated_call, which needs a retry in it.
      expect(skipped.map((k) => k.type)).toEqual(skipped.length ? ['repeated_call'] : []);
      expect(pairs.map((p) => p.negative_type)).toEqual(
        NEGATIVE_TYPES.filter((t) => !skipped.some((k) => k.type === t)),
      );
      for (const p of pairs) {
        const k = p.prompt.length;
        expect(s.messages[k]!.role).toBe('assistant');
        expect(p.prompt).toEqual(s.messages.slice(0, k));
        expect(p.chosen).toEqual([s.messages[k]]);
        expect(p.rejected).toHaveLength(1);
        expect(p.rejected[0]!.role).toBe('assistant');
        expect(p.rejected[0]).not.toEqual(p.chosen[0]);
        const type = p.negative_type!;
        expect(p).toMatchObject({
          pair_id: pairId('hard_negative', s.session_id, `${s.session_id}~${type}`, type),
          source: 'hard_negative',
          chosen_session_id: s.session_id,
          rejected_session_id: `${s.session_id}~${type}`,
          chosen_reward: s.reward,
          rejected_reward: null,
          margin: null,
          confidence: 0,
          judge: '',
          task_id: s.task_id,
          split: 'train',
        });
        ids.add(p.pair_id);
      }
    }
    expect(ids.size).toBe(made);
  });

  it('select about the requested share of sessions per type, and none at ratio 0 or when the ratio is missing', () => {
    const sessions = successes.slice(0, 500);
    const selected = (ratios: Partial<Record<NegativeType, number>>, type: NegativeType) =>
      sessions.filter((s) => {
        const { pairs, skipped } = buildHardNegatives(s, options(ratios));
        return [...pairs.map((p) => p.negative_type), ...skipped.map((k) => k.type)].includes(type);
      });
    const ids = (list: SplitSession[]) => list.map((s) => s.session_id);
    const half = Object.fromEntries(NEGATIVE_TYPES.map((t) => [t, 0.5]));
    const byType = NEGATIVE_TYPES.map((t) => selected(half, t));
    for (const chosen of byType) {
      expect(chosen.length).toBeGreaterThanOrEqual(200);
      expect(chosen.length).toBeLessThanOrEqual(300);
    }
    // Each type draws its own sessions.
    expect(new Set(byType.map((c) => ids(c).join())).size).toBe(NEGATIVE_TYPES.length);

    const otherSalt = sessions.filter(
      (s) => buildHardNegatives(s, options({ verbose: 0.5 }, 'other')).pairs.length > 0,
    );
    expect(ids(otherSalt)).not.toEqual(ids(byType[NEGATIVE_TYPES.indexOf('verbose')]!));

    const fifth = selected({ verbose: 0.2 }, 'verbose').length;
    expect(fifth).toBeGreaterThanOrEqual(70);
    expect(fifth).toBeLessThanOrEqual(130);
    expect(selected({ verbose: 0, refusal: 1 }, 'verbose')).toEqual([]);
    expect(selected({ refusal: 1 }, 'off_topic')).toEqual([]);
  });

  it('come out byte-identical on a second run, without touching the sessions they read', () => {
    const sessions = successes.slice(0, 100);
    const before = JSON.stringify(sessions);
    const half = Object.fromEntries(NEGATIVE_TYPES.map((t) => [t, 0.5]));
    const run = (salt: string) => JSON.stringify(sessions.map((s) => buildHardNegatives(s, options(half, salt))));
    const first = run('night-1');
    expect(run('night-1')).toBe(first);
    expect(run('night-2')).not.toBe(first);
    expect(JSON.stringify(sessions)).toBe(before);
  });

  it("draw each type's sessions and transforms on their own: changing one ratio leaves the other types' pairs as they were", () => {
    const sessions = successes.slice(0, 200);
    const half = Object.fromEntries(NEGATIVE_TYPES.map((t) => [t, 0.5]));
    const made = (ratios: Partial<Record<NegativeType, number>>, type: NegativeType) =>
      JSON.stringify(
        sessions.flatMap((s) => buildHardNegatives(s, options(ratios)).pairs.filter((p) => p.negative_type === type)),
      );
    for (const changed of NEGATIVE_TYPES) {
      for (const ratio of [0, 0.9]) {
        const ratios = { ...half, [changed]: ratio };
        for (const other of NEGATIVE_TYPES.filter((t) => t !== changed))
          expect(made(ratios, other)).toBe(made(half, other));
      }
    }
  });

  it('report, with a reason, the types a plain-text reply cannot take', () => {
    const s = session('plain', [
      SYSTEM,
      USER,
      { role: 'assistant', content: 'I cancelled your Globo Gym membership as you asked today.' },
    ]);
    const { pairs, skipped } = buildHardNegatives(s, options(ALL));
    expect(pairs.map((p) => p.negative_type)).toEqual(['refusal', 'off_topic', 'verbose', 'under_explained']);
    expect(skipped.map((k) => [k.session_id, k.type])).toEqual([
      ['plain', 'hallucination'],
      ['plain', 'format'],
      ['plain', 'repeated_call'],
    ]);
    expect(skipped[0]!.reason).toMatch(/identifier/);
    expect(skipped[1]!.reason).toMatch(/tool call/);

    const short = buildHardNegatives(
      session('short', [SYSTEM, USER, { role: 'assistant', content: 'Calling them now.' }]),
      options(ALL),
    );
    expect(short.skipped.map((k) => k.type)).toEqual([
      'hallucination',
      'format',
      'verbose',
      'under_explained',
      'repeated_call',
    ]);
    const silent = buildHardNegatives(session('silent', [SYSTEM, USER]), options(ALL));
    expect(silent.pairs).toEqual([]);
    expect(silent.skipped.map((k) => k.type)).toEqual(NEGATIVE_TYPES);
    expect(silent.skipped.every((k) => k.reason.length > 0)).toBe(true);
  });
});
