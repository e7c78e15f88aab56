import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { reset, step } from '../../env/env.ts';
import { ScriptedAgent } from '../../env/agents.ts';
import { runEpisode } from '../../env/rollout.ts';
import { generateTask, generateWorld } from '../../env/world.ts';
import type { Message } from '../../core/records.ts';
import { openDevice } from '../../runtime/device.ts';
import { renderText } from '../../model/chat-template.ts';
import { loadCheckpoint, saveCheckpoint } from '../../model/checkpoint.ts';
import { completionSequences } from '../../trainers/data.ts';
import { prefabChat } from '../../model/chat.ts';
import { Llama } from '../../model/llama.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { modelView } from '../../model/placeholders.ts';
import { placeholdersConfig, placeholdersOf } from '../../stages/tokenizer/placeholders.ts';
import { TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';

const world = generateWorld({ seed: 5, companies: 30 });
const PLACEHOLDERS = placeholdersOf(placeholdersConfig.parse({}));

async function oracleSession(index: number) {
  const task = generateTask(world, 'train', index);
  return { task, messages: (await runEpisode(world, task, new ScriptedAgent('oracle', world, task, 's'))).messages };
}

const callsIn = (messages: Message[]) =>
  messages.flatMap((m) => m.tool_calls ?? []).filter((c) => c.function.name === 'call');

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

describe('placeholders: the values a model copies, as it reads them', () => {
  it('shows every number and form value as a placeholder, the same one wherever the value appears', async () => {
    const { task, messages } = await oracleSession(2);
    const { messages: view } = modelView(messages, PLACEHOLDERS);
    const text = renderText(view);
    const company = world.companies.find((c) => c.name === task.company)!;
    for (const d of company.departments) expect(text).not.toContain(d.phone);
    for (const v of Object.values(task.profile.values)) expect(text).not.toContain(`"${v}"`);
    // The directory's phone of each department called is the placeholder the call dials.
    const directory = JSON.parse(view.find((m) => m.role === 'tool')!.content!) as {
      departments: { name: string; phone: string }[];
    };
    for (const [i, call] of callsIn(view).entries()) {
      const dialled = JSON.parse(call.function.arguments).phone_number as string;
      const original = JSON.parse(callsIn(messages)[i]!.function.arguments).phone_number as string;
      const department = company.departments.find((d) => d.phone === original)!;
      expect(dialled).toMatch(/^\[PHONE_\d+\]$/);
      expect(directory.departments.find((d) => d.name === department.name)!.phone).toBe(dialled);
      for (const v of Object.values(JSON.parse(call.function.arguments).auth as Record<string, string>))
        expect(v).toMatch(/^\[[A-Z_]+_1\]$/);
    }
    // The company the user named, and what the agent asks for, are not values: the model still reads them.
    expect(text).toContain(task.company);
  });

  it('reads a conversation so far exactly as the start of the whole one, so training and acting agree', async () => {
    const { messages } = await oracleSession(3);
    const whole = modelView(messages, PLACEHOLDERS).messages;
    for (let t = 1; t <= messages.length; t++)
      expect(modelView(messages.slice(0, t), PLACEHOLDERS).messages).toEqual(whole.slice(0, t));
  });

  it("puts the values back into what the model writes, so the environment completes the model's call", async () => {
    const { task, messages } = await oracleSession(4);
    const at = messages.findIndex((m) => m.tool_calls?.[0]?.function.name === 'call');
    const { messages: view, restore } = modelView(messages.slice(0, at), PLACEHOLDERS);
    // What the model writes is in the placeholders it read: the oracle's call as the model sees it.
    const written = modelView(messages.slice(0, at + 1), PLACEHOLDERS).messages[at]!;
    expect(written.tool_calls![0]!.function.arguments).toMatch(/\[PHONE_\d+\]/);
    const restored = restore(written);
    expect(restored.tool_calls).toEqual(messages[at]!.tool_calls);
    let state = reset(world, task);
    for (const m of messages.slice(0, at))
      for (const c of m.tool_calls ?? [])
        state = step(world, state, { name: c.function.name, arguments: c.function.arguments }).state;
    const c = restored.tool_calls![0]!.function;
    const after = step(world, state, { name: c.name, arguments: c.arguments }).state;
    expect(Object.keys(after.completed).length).toBe(Object.keys(state.completed).length + 1);
    // A placeholder the conversation never issued stays as written: the environment says the number is not in service.
    expect(restore({ role: 'assistant', content: 'dial [PHONE_99]' }).content).toBe('dial [PHONE_99]');
    expect(view).toHaveLength(at);
  });

  it("reads the directory's company names and the reference numbers as placeholders, and acts on them when put back", async () => {
    const named = placeholdersOf(
      placeholdersConfig.parse({ directory: { world_seed: 5, companies: 30 }, patterns: { REF: String.raw`REF-\d+` } }),
    )!;
    expect(named.terms!.COMPANY).toEqual(world.companies.map((c) => c.name));
    // A task whose calls need a reference number from an earlier one.
    let found: Awaited<ReturnType<typeof oracleSession>> | undefined;
    for (let i = 0; !found && i < 200; i++) {
      const s = await oracleSession(i);
      if (callsIn(s.messages).some((c) => /reference number from/.test(c.function.arguments))) found = s;
    }
    const { task, messages } = found!;
    const { messages: view } = modelView(messages, named);
    const text = renderText(view);
    expect(text).not.toContain(task.company);
    expect(text).not.toMatch(/REF-\d/);
    expect(view[1]!.content).toContain('[COMPANY_1]');
    expect(view[2]!.tool_calls![0]!.function.arguments).toBe('{"company":"[COMPANY_1]"}');
    expect(text).toMatch(/"name":"\[COMPANY_1\] [A-Z]/);
    // Acting from the masked view alone: every call the oracle made, put back, completes its department.
    let state = reset(world, task);
    for (let t = 0; t < messages.length; t++) {
      if (messages[t]!.role !== 'assistant' || !messages[t]!.tool_calls) continue;
      const { restore } = modelView(messages.slice(0, t), named);
      const c = restore(modelView(messages.slice(0, t + 1), named).messages[t]!).tool_calls![0]!.function;
      state = step(world, state, { name: c.name, arguments: c.arguments }).state;
    }
    expect(Object.keys(state.completed)).toHaveLength(task.calls.length);
  });

  it('leaves conversations as they are when off', async () => {
    const { messages } = await oracleSession(5);
    const { messages: view, restore } = modelView(messages, null);
    expect(view).toBe(messages);
    expect(restore(messages[2]!)).toBe(messages[2]);
  });

  it("gives a pair's sides one reading of the prompt, and a number the rejected side made up a placeholder of its own", async () => {
    const { messages } = await oracleSession(6);
    const at = messages.findIndex((m) => m.tool_calls?.[0]?.function.name === 'call');
    const prompt = messages.slice(0, at);
    const chosen = [messages[at]!];
    const args = JSON.parse(chosen[0]!.tool_calls![0]!.function.arguments);
    const rejected: Message[] = [
      {
        ...chosen[0]!,
        tool_calls: [
          {
            ...chosen[0]!.tool_calls![0]!,
            function: { name: 'call', arguments: JSON.stringify({ ...args, phone_number: '1-800-555-0100' }) },
          },
        ],
      },
    ];
    const json = trainTokenizer([renderText(modelView(messages, PLACEHOLDERS).messages)], 300);
    const tokenizer = new TextTokenizer(json);
    const sequences = await completionSequences(prefabChat(json), prompt, [chosen, rejected], 4096, PLACEHOLDERS);
    if ('tooLong' in sequences) throw new Error(sequences.tooLong);
    const [c, r] = sequences;
    const promptTokens = c!.mask.indexOf(1);
    expect(r!.mask.indexOf(1)).toBe(promptTokens);
    expect(r!.ids.slice(0, promptTokens)).toEqual(c!.ids.slice(0, promptTokens));
    const directoryPhones = world.companies.find((x) => renderText(prompt).includes(x.name))!.departments.length;
    expect(await tokenizer.decode(r!.ids.slice(promptTokens))).toContain(`[PHONE_${directoryPhones + 1}]`);
    expect(await tokenizer.decode(c!.ids.slice(promptTokens))).not.toContain(`[PHONE_${directoryPhones + 1}]`);
  });

  it('is saved with the model, and a malformed record names the file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'prefab-placeholders-'));
    const model = Llama.create(tinyLlama({ vocabSize: 300, layers: 1 }), 'p');
    saveCheckpoint(join(dir, 'masked'), {
      model,
      tokenizer: { 'tokenizer.json': '{}' },
      context: 16,
      placeholders: PLACEHOLDERS,
    });
    expect(JSON.parse(readFileSync(join(dir, 'masked', 'config.json'), 'utf8')).prefab_placeholders.keys).toContain(
      'zip_code',
    );
    expect(loadCheckpoint(join(dir, 'masked')).placeholders).toEqual(PLACEHOLDERS);
    saveCheckpoint(join(dir, 'plain'), { model, tokenizer: { 'tokenizer.json': '{}' }, context: 16 });
    expect(loadCheckpoint(join(dir, 'plain')).placeholders).toBeNull();
    const config = join(dir, 'masked', 'config.json');
    writeFileSync(
      config,
      JSON.stringify({
        ...JSON.parse(readFileSync(config, 'utf8')),
        prefab_placeholders: { kinds: ['phone'], keys: 'pin' },
      }),
    );
    expect(() => loadCheckpoint(join(dir, 'masked'))).toThrow(
      /config\.json: prefab_placeholders is not \{kinds, keys, terms, patterns\}: keys/,
    );
    model.dispose();
  });
});
