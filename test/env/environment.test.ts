import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { AGENTS, ScriptedAgent } from '../../env/agents.ts';
import { episodeReward, reset, step, type EnvState } from '../../env/env.ts';
import { replaySession } from '../../env/replay.ts';
import { runEpisode } from '../../env/rollout.ts';
import { CATALOGUE, DEFAULT_WORLD, FIELD_WORDS, generateTask, generateWorld, type Task } from '../../env/world.ts';
import { validationEpisodes } from '../../env/evaluate.ts';
import { pairedLine, pairedSuccess, signTestP } from '../../core/paired-success.ts';
import { simulate } from '../../env/simulate.ts';
import type { Session } from '../../core/records.ts';
import { readLines } from '../../pipeline/jsonl.ts';
import { prefab } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';

const world = generateWorld({ seed: 3 });
const call = (state: EnvState, name: string, args: unknown) =>
  step(world, state, { name, arguments: JSON.stringify(args) });
const companyOf = (task: Task) => world.companies.find((c) => c.name === task.company)!;

/** A task whose first department needs at least two fields and no reference, for poking at the rules. */
function plainTask(): Task {
  for (let i = 0; ; i++) {
    const t = generateTask(world, 'train', i);
    const d = companyOf(t).departments.find((x) => x.name === t.calls[0]!.department)!;
    if (d.requires.length >= 2 && !d.needsReferenceFrom) return t;
  }
}

describe('the world', () => {
  it('is the same for the same seed and another for another seed', () => {
    expect(JSON.stringify(generateWorld({ seed: 3 }).companies)).toBe(JSON.stringify(world.companies));
    expect(JSON.stringify(generateWorld({ seed: 4 }).companies)).not.toBe(JSON.stringify(world.companies));
    expect(world.companies).toHaveLength(100);
  });

  it('keeps validation companies out of every training task', () => {
    const val = new Set(world.companies.filter((c) => c.split === 'val').map((c) => c.name));
    expect(val.size).toBe(20);
    const trainCompanies = new Set(Array.from({ length: 2000 }, (_, i) => generateTask(world, 'train', i).company));
    expect([...trainCompanies].filter((c) => val.has(c))).toEqual([]);
    const valCompanies = new Set(Array.from({ length: 300 }, (_, i) => generateTask(world, 'val', i).company));
    expect([...valCompanies].every((c) => val.has(c))).toBe(true);
  });

  it("gives departments their type's usual fields, with company-specific deviations, and lists none of it in the directory", () => {
    const departments = world.companies.flatMap((c) => c.departments);
    const usual = (type: string) => CATALOGUE.find((t) => t.type === type)!.usual;
    const deviating = departments.filter((d) => JSON.stringify(d.requires) !== JSON.stringify(usual(d.type)));
    expect(deviating.length / departments.length).toBeGreaterThan(0.2);
    expect(deviating.length / departments.length).toBeLessThan(0.5);
    expect(departments.some((d) => d.needsReferenceFrom)).toBe(true);
    const state = reset(world, plainTask());
    const listing = call(state, 'search_directory', { company: state.task.company }).observation;
    expect(Object.keys(JSON.parse(listing).departments[0]).sort()).toEqual(['name', 'phone']);
  });

  it('makes tasks of 1 to 5 departments, each prerequisite before the call that needs its reference', () => {
    const tasks = Array.from({ length: 500 }, (_, i) => generateTask(world, 'train', i));
    expect(new Set(tasks.map((t) => t.calls.length))).toEqual(new Set([1, 2, 3, 4, 5]));
    for (const t of tasks) {
      const c = companyOf(t);
      t.calls.forEach((tc, i) => {
        const need = c.departments.find((d) => d.name === tc.department)!.needsReferenceFrom;
        if (need) expect(t.calls.slice(0, i).map((x) => x.type)).toContain(need);
      });
      expect(t.request).toContain(t.company);
    }
  });
});

describe('the environment', () => {
  it('completes a call with the right fields and names exactly the missing ones otherwise', () => {
    const task = plainTask();
    const dept = companyOf(task).departments.find((d) => d.name === task.calls[0]!.department)!;
    let state = reset(world, task);
    state = call(state, 'auth_info_form', { fields: dept.requires }).state;
    const values = task.profile.values;
    const partial = Object.fromEntries(dept.requires.slice(1).map((f) => [f, values[f]]));
    const failed = call(state, 'call', { phone_number: dept.phone, auth: partial, request: 'help' });
    expect(failed.observation).toContain(`I need your ${FIELD_WORDS[dept.requires[0]!]}`);
    expect(failed.feedback).toContain(`needs ${dept.requires[0]}`);
    expect(failed.reward).toBe(0);

    const wrong = call(failed.state, 'call', {
      phone_number: dept.phone,
      auth: { ...partial, [dept.requires[0]!]: 'made-up' },
      request: 'help',
    });
    expect(wrong.observation).toMatch(/doesn't match our records/);

    const ok = call(wrong.state, 'call', {
      phone_number: dept.phone,
      auth: Object.fromEntries(dept.requires.map((f) => [f, values[f]])),
      request: 'help',
    });
    expect(ok.observation).toMatch(/that's done.*reference number is REF-\d{6}/);
    const end = call(ok.state, 'finish', {});
    expect(end.done).toBe(true);
    expect(end.reward).toBeCloseTo(1 / task.calls.length - 2 * 0.02);
  });

  it('refuses a second form, and says when a number is wrong or the department is not the right one', () => {
    const task = plainTask();
    let state = reset(world, task);
    state = call(state, 'auth_info_form', { fields: ['email'] }).state;
    const again = call(state, 'auth_info_form', { fields: ['pin'] });
    expect(again.observation).toMatch(/will not fill in another/);
    expect(again.state.form).toEqual({ email: task.profile.values.email });
    expect(call(state, 'call', { phone_number: '1-800-000-0000', auth: {}, request: 'x' }).observation).toMatch(
      /not in service/,
    );
    const other = companyOf(task).departments.find((d) => !task.calls.some((c) => c.department === d.name));
    if (other)
      expect(call(state, 'call', { phone_number: other.phone, auth: {}, request: 'x' }).observation).toMatch(
        /wrong department/,
      );
    expect(call(state, 'call', '{oops' as unknown as object).observation).toMatch(/must be a JSON object/);
  });

  it('asks for the reference number of an earlier call where routing needs it', async () => {
    const task = Array.from({ length: 3000 }, (_, i) => generateTask(world, 'train', i)).find((t) =>
      t.calls.some((c) => companyOf(t).departments.find((d) => d.name === c.department)!.needsReferenceFrom),
    )!;
    const e = await runEpisode(world, task, new ScriptedAgent('prior', world, task, 'x'));
    const asked = e.messages.findIndex(
      (m) => m.role === 'tool' && /need the reference number from your call with/.test(m.content ?? ''),
    );
    expect(asked).toBeGreaterThan(0);
    // The agent had the reference from the earlier call and gives it on its retry; it is not asked again.
    expect(e.messages[asked + 1]!.tool_calls![0]!.function.arguments).toMatch(/REF-\d{6}/);
    expect(e.messages[asked + 2]!.content).not.toMatch(/reference number from your call/);
  });

  it('costs reward for sensitive fields the task never needed', () => {
    const task = plainTask();
    const a = reset(world, task);
    const needless = (['last_4_ssn', 'pin', 'date_of_birth', 'account_number'] as const).filter(
      (f) => !a.needed.includes(f),
    );
    const dept = companyOf(task).departments.find((d) => d.name === task.calls[0]!.department)!;
    const run = (fields: string[]) => {
      let s = call(a, 'auth_info_form', { fields }).state;
      s = call(s, 'call', {
        phone_number: dept.phone,
        auth: Object.fromEntries(dept.requires.map((f) => [f, task.profile.values[f]])),
        request: 'x',
      }).state;
      return episodeReward(call(s, 'finish', {}).state);
    };
    expect(run([...dept.requires]) - run([...dept.requires, ...needless])).toBeCloseTo(0.05 * needless.length);
  });
});

describe('scripted agents', () => {
  it('range from an oracle that always succeeds to a random agent that almost never does', async () => {
    const byAgent: Record<string, { ok: number; n: number; easy: number[]; hard: number[] }> = {};
    for (const name of AGENTS) {
      const r = (byAgent[name] = { ok: 0, n: 0, easy: [] as number[], hard: [] as number[] });
      for (let i = 0; i < 250; i++) {
        const task = generateTask(world, i % 2 ? 'train' : 'val', i);
        const e = await runEpisode(world, task, new ScriptedAgent(name, world, task, 't'));
        r.n++;
        r.ok += e.success ? 1 : 0;
        if (task.calls.length <= 2) r.easy.push(e.success ? 1 : 0);
        if (task.calls.length >= 4) r.hard.push(e.success ? 1 : 0);
      }
    }
    const rate = (name: string) => byAgent[name]!.ok / byAgent[name]!.n;
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(rate('oracle')).toBe(1);
    expect(rate('random')).toBeLessThan(0.03);
    for (const name of ['prior', 'noisy']) {
      expect(rate(name)).toBeGreaterThan(rate('random'));
      expect(rate(name)).toBeLessThan(rate('oracle'));
      expect(mean(byAgent[name]!.easy)).toBeGreaterThan(mean(byAgent[name]!.hard));
    }
  });

  it('end at the step limit, or sooner at a cap on turns, when a policy keeps dialling a dead number', async () => {
    const task = generateTask(world, 'val', 0);
    let n = 0;
    const looping = {
      name: 'looping',
      respond: async () => ({
        role: 'assistant' as const,
        content: null,
        tool_calls: [
          {
            id: `call_${++n}`,
            type: 'function' as const,
            function: { name: 'call', arguments: '{"phone_number":"0"}' },
          },
        ],
      }),
    };
    const uncapped = await runEpisode(world, task, looping);
    expect(uncapped.state.done).toBe(true);
    expect(uncapped.state.steps).toBe(24);
    const capped = await runEpisode(world, task, looping, 5);
    expect(capped.turns).toBe(5);
    expect(capped.state.steps).toBe(5);
    expect(capped.success).toBe(false);
    // The oracle never needs the cap: at most search, form, five calls, finish and a closing line.
    for (let i = 0; i < 40; i++) {
      const t = generateTask(world, 'val', i);
      expect((await runEpisode(world, t, new ScriptedAgent('oracle', world, t, 'cap'), 9)).success).toBe(true);
    }
  });

  it('log feedback naming the missing fields on every failed call', async () => {
    for (let i = 0; i < 60; i++) {
      const task = generateTask(world, 'train', i);
      const e = await runEpisode(world, task, new ScriptedAgent('prior', world, task, 'f'));
      const failures = e.messages.filter((m) => m.role === 'tool' && /I need your/.test(m.content ?? ''));
      const named = e.state.feedback.filter((f) => / needs [a-z_0-9, ]+; it requires /.test(f));
      expect(named.length).toBe(failures.length);
    }
  });
});

describe('validation episodes', () => {
  it('play the first validation tasks with at most max_calls departments to call, each try in order', async () => {
    const world = generateWorld({ ...DEFAULT_WORLD });
    const played: Task[] = [];
    const options = { worldSeed: DEFAULT_WORLD.seed, companies: DEFAULT_WORLD.companies, tasks: 6, k: 2, maxTurns: 12 };
    const player = (taskId: string, trial: number) => {
      const task = Array.from({ length: 400 }, (_, i) => generateTask(world, 'val', i)).find(
        (t) => t.task_id === taskId,
      )!;
      if (trial === 0) played.push(task);
      return new ScriptedAgent('oracle', world, task, `v:${trial}`);
    };
    const records = await validationEpisodes(player, { ...options, maxCalls: 2 });
    expect(records.map((r) => r.trial)).toEqual([0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    expect(played.every((t) => t.calls.length <= 2)).toBe(true);
    // The first six such tasks in index order: some of the first tasks have more calls and are passed over.
    const all = Array.from({ length: 400 }, (_, i) => generateTask(world, 'val', i));
    expect(played.map((t) => t.index)).toEqual(
      all
        .filter((t) => t.calls.length <= 2)
        .slice(0, 6)
        .map((t) => t.index),
    );
    expect(played.at(-1)!.index).toBeGreaterThan(5);
    expect(records.every((r) => r.success === 1)).toBe(true); // the oracle succeeds
    // Without max_calls: the first six tasks, whatever their difficulty.
    played.length = 0;
    await validationEpisodes(player, options);
    expect(played.map((t) => t.index)).toEqual([0, 1, 2, 3, 4, 5]);
  });
  it('pairs the episodes of two policies twin by twin: the same seeds agree everywhere, a better policy wins the twins it differs in', async () => {
    const world = generateWorld({ ...DEFAULT_WORLD });
    const options = {
      worldSeed: DEFAULT_WORLD.seed,
      companies: DEFAULT_WORLD.companies,
      tasks: 30,
      k: 2,
      maxTurns: 12,
    };
    const tasks = new Map(
      Array.from({ length: 60 }, (_, i) => generateTask(world, 'val', i)).map((t) => [t.task_id, t]),
    );
    const agent = (name: 'prior' | 'noisy') => (taskId: string, trial: number) =>
      new ScriptedAgent(name, world, tasks.get(taskId)!, `twin:${taskId}:${trial}`);
    const noisy = await validationEpisodes(agent('noisy'), options);
    const stats = { samples: 500, alpha: 0.05, seed: 'twins' };
    const same = pairedSuccess(noisy, await validationEpisodes(agent('noisy'), options), stats);
    expect(same).toMatchObject({ difference: 0, better: 0, worse: 0, p: 1, interval: [0, 0] });
    const prior = await validationEpisodes(agent('prior'), options);
    const r = pairedSuccess(noisy, prior, stats);
    expect(r.difference).toBeCloseTo((r.better - r.worse) / 60, 12);
    expect(r.better).toBeGreaterThan(r.worse);
    expect(r.p).toBeCloseTo(signTestP(r.better, r.better + r.worse), 12);
    expect(r.interval[0]).toBeLessThanOrEqual(r.difference);
    expect(r.interval[1]).toBeGreaterThanOrEqual(r.difference);
    expect(pairedLine('prior', 'noisy', r)).toMatch(
      new RegExp(
        `^prior against noisy, twin episodes: \\+\\d\\.\\d{3} \\(${r.better} better, ${r.worse} worse; one-sided sign test p = `,
      ),
    );
    expect(() => pairedSuccess(noisy, prior.slice(1), stats)).toThrow(/did not play the same episodes/);
  });
});

describe('prefab simulate and the replay verifier', () => {
  it('writes byte-identical files for the same seed, and different ones for another', () => {
    const dir = tempDir();
    const run = (seed: number, out: string) =>
      prefab(['simulate', '--tasks', '30', '--trials', '3', '--seed', String(seed), '--out', join(dir, out)]);
    expect(run(5, 'a.jsonl').code).toBe(0);
    expect(run(5, 'b.jsonl').code).toBe(0);
    expect(run(6, 'c.jsonl').code).toBe(0);
    const [a, b, c] = ['a', 'b', 'c'].map((f) => readFileSync(join(dir, `${f}.jsonl`)));
    expect(a!.equals(b!)).toBe(true);
    expect(a!.equals(c!)).toBe(false);
    const sessions = a!
      .toString()
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Session);
    expect(sessions).toHaveLength(90);
    expect(new Set(sessions.map((s) => s.task_id)).size).toBe(30);
    expect(sessions[0]!.messages[2]!.tool_calls![0]!.function.name).toBe('search_directory');
  });

  it('prints success by agent and difficulty', () => {
    const r = prefab(['simulate', '--tasks', '40', '--trials', '2', '--stats']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^oracle\s+\d+\s+100\.0%/m);
    expect(r.stdout).toMatch(/^all\s+80\s+/m);
  });

  it('finds a logged session whose tool result or reward was edited', async () => {
    const sessions: Session[] = [];
    for await (const s of simulate({
      tasks: 5,
      trials: 2,
      agent: 'mix',
      noise: 0.3,
      split: 'train',
      seed: 9,
      companies: 100,
      offset: 0,
    }))
      sessions.push(s);
    expect(sessions.every((s) => replaySession(s).ok)).toBe(true);

    const edited = structuredClone(sessions[0]!);
    const at = edited.messages.findIndex((m) => m.role === 'tool' && m.content!.startsWith('{"company"'));
    edited.messages[at]!.content = edited.messages[at]!.content!.replace(/1-800-\d{3}-\d{4}/, '1-800-555-0000');
    const report = replaySession(edited);
    expect(report.ok).toBe(false);
    expect(report.problems[0]).toMatchObject({ kind: 'tool_result', message_index: at });

    const inflated = { ...structuredClone(sessions.find((s) => s.reward < 1)!), reward: 1 };
    expect(replaySession(inflated).problems.map((p) => p.kind)).toEqual(['reward']);

    const dir = tempDir();
    const file = join(dir, 's.jsonl');
    writeFileSync(file, [...sessions, edited].map((s) => JSON.stringify(s)).join('\n') + '\n');
    const cli = prefab(['replay', file, '--log-format', 'json']);
    expect(cli.code).toBe(1);
    expect(JSON.parse(cli.stdout.trim()).session_id).toBe(edited.session_id);
  });

  it('is what the bundled sample is made of, at about 70% success', async () => {
    let n = 0;
    let ok = 0;
    for await (const { text } of readLines(join(__dirname, '..', '..', 'data', 'sample', 'sessions.jsonl.gz'))) {
      const s = JSON.parse(text) as Session;
      n++;
      ok += JSON.parse(s.metadata).success ? 1 : 0;
      if (n % 97 === 0) expect(replaySession(s).ok).toBe(true);
    }
    expect(n).toBe(2000);
    expect(ok / n).toBeGreaterThan(0.6);
    expect(ok / n).toBeLessThan(0.8);
  });
});
