// Whether an assistant's tool calls are well formed: shared by the verifier (decisive) and the rules judge.
import type { Message, ToolCall } from '../core/records.ts';
import { metadataOf, type Comparison } from '../core/verdict.ts';
import { canonicalJson } from '../pipeline/hash.ts';

export interface ToolSchema {
  name: string;
  required: string[];
}

interface OpenAiTool {
  function?: { name?: unknown; parameters?: { required?: unknown } };
}

function schemasOf(tools: readonly OpenAiTool[]): ToolSchema[] {
  return tools
    .filter((t) => typeof t.function?.name === 'string')
    .map((t) => ({
      name: t.function!.name as string,
      required: Array.isArray(t.function!.parameters?.required)
        ? (t.function!.parameters!.required as unknown[]).map(String)
        : [],
    }));
}

/**
 * The tools the agent had: the OpenAI `tools` list its session's record carried (kept in the metadata; the
 * simulator's sessions carry theirs, as logs of chat requests do), or null when unknown.
 */
export function knownTools(c: Comparison): ToolSchema[] | null {
  const m = metadataOf(c);
  return Array.isArray(m.tools) ? schemasOf(m.tools as OpenAiTool[]) : null;
}

/** What is wrong with one call: arguments that are not a JSON object, an unknown tool, a missing required argument. */
function toolCallProblems(call: ToolCall, tools: ToolSchema[] | null): string[] {
  const problems: string[] = [];
  const schema = tools?.find((t) => t.name === call.function.name);
  if (tools && !schema) problems.push(`unknown tool "${call.function.name}"`);
  let args: unknown;
  try {
    args = JSON.parse(call.function.arguments);
  } catch {
    return [...problems, `arguments of ${call.function.name} are not valid JSON`];
  }
  if (args === null || typeof args !== 'object' || Array.isArray(args))
    return [...problems, `arguments of ${call.function.name} are not a JSON object`];
  for (const key of schema?.required ?? [])
    if (!(key in args)) problems.push(`${call.function.name} lacks required argument "${key}"`);
  return problems;
}

const CALL_AS_TEXT = /(\{\s*"(?:name|function|tool)"\s*:\s*"|<tool_call>|<function=)/;

/** Every format problem in the assistant turns of `messages`. */
export function formatProblems(messages: Message[], tools: ToolSchema[] | null): string[] {
  const problems: string[] = [];
  for (const m of messages) {
    if (m.role !== 'assistant') continue;
    const calls = m.tool_calls ?? [];
    for (const call of calls) problems.push(...toolCallProblems(call, tools));
    if (calls.length === 0 && m.content && CALL_AS_TEXT.test(m.content))
      problems.push('a tool call written into the message text instead of tool_calls');
    if (calls.length === 0 && !m.content?.trim()) problems.push('an empty assistant message');
  }
  return problems;
}

/** Tool calls in `messages`, with whether each is well formed. */
export function callValidity(messages: Message[], tools: ToolSchema[] | null): { calls: number; invalid: string[] } {
  let calls = 0;
  const invalid: string[] = [];
  for (const m of messages) {
    if (m.role !== 'assistant') continue;
    for (const call of m.tool_calls ?? []) {
      calls++;
      invalid.push(...toolCallProblems(call, tools));
    }
  }
  return { calls, invalid };
}

/** A call's arguments, parsed; undefined when they are not JSON (which JSON itself can never produce). */
export function parseArguments(raw: string): unknown {
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    return undefined;
  }
}

/** A call as compared for repeats: its tool and its arguments (as JSON with keys in order, or as written). */
function callKey(call: ToolCall): string {
  const args = parseArguments(call.function.arguments);
  return `${call.function.name}\0${args === undefined ? call.function.arguments : canonicalJson(args)}`;
}

/**
 * The tool calls that repeat, as made, a call of the assistant turn with tool calls before them (the prompt's
 * last one, for the side's first): a retry that ignores what the tool answered.
 */
export function repeatedCalls(prompt: readonly Message[], side: readonly Message[]): ToolCall[] {
  const keys = (m: Message | undefined) => new Set((m?.tool_calls ?? []).map(callKey));
  let before = keys(prompt.findLast((m) => m.role === 'assistant' && m.tool_calls?.length));
  const repeats: ToolCall[] = [];
  for (const m of side) {
    if (m.role !== 'assistant' || !m.tool_calls?.length) continue;
    const mine = m.tool_calls.map(callKey);
    m.tool_calls.forEach((call, i) => before.has(mine[i]!) && repeats.push(call));
    before = new Set(mine);
  }
  return repeats;
}
