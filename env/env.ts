// The environment's rules as pure functions: reset(task) and step(state, call) → observation, reward,
// done, feedback. Scripted agents, the trained policy, a model served over HTTP and the replay verifier
// all act through these two functions.
import { FIELDS, FIELD_WORDS, SENSITIVE, departmentType, type Field, type Task, type World } from './world.ts';
import { seeded } from '../core/random.ts';

export const TOOL_NAMES = ['search_directory', 'auth_info_form', 'call', 'finish'] as const;

/** The tools in OpenAI's function-calling format, for prompts and for serving. */
export const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'search_directory',
      description:
        "List a company's departments and their phone numbers. The directory does not say what each department asks for.",
      parameters: {
        type: 'object',
        properties: { company: { type: 'string' } },
        required: ['company'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'auth_info_form',
      description:
        'Ask the user to fill in a form with the listed fields. The user fills it ONCE per task: ask for everything you will need in one go, and nothing sensitive you will not need.',
      parameters: {
        type: 'object',
        properties: { fields: { type: 'array', items: { type: 'string', enum: [...FIELDS] } } },
        required: ['fields'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'call',
      description:
        'Phone a department. Give the authentication values it needs and say what you want. Include reference numbers from earlier calls when a department asks for them.',
      parameters: {
        type: 'object',
        properties: {
          phone_number: { type: 'string' },
          auth: { type: 'object', propertyNames: { enum: [...FIELDS] }, additionalProperties: { type: 'string' } },
          request: { type: 'string' },
        },
        required: ['phone_number', 'auth', 'request'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'finish',
      description: 'End the task when everything is done, or nothing more can be done.',
      parameters: { type: 'object', properties: {}, additionalProperties: false },
    },
  },
] as const;

export const SYSTEM_PROMPT =
  "You are an assistant that phones companies on the user's behalf. Tools: search_directory(company) lists departments and phone numbers; " +
  'auth_info_form(fields) asks the user for personal details, and the user fills it only once, so ask for every field you will need at once ' +
  '(asking for sensitive fields you do not need is penalised); call(phone_number, auth, request) phones a department, which either does the ' +
  'request or says exactly what is missing; finish() ends the task. The directory does not list what each department requires. ' +
  `Fields: ${FIELDS.join(', ')}.`;

const MAX_STEPS = 24;
const FAILED_CALL_PENALTY = 0.02;
const NEEDLESS_SENSITIVE_PENALTY = 0.05;
const MAX_PENALTY = 0.3;

export interface EnvState {
  task: Task;
  /** Every field some department of the task requires: what the form should ask for, no more. */
  needed: Field[];
  steps: number;
  /** Fields the user filled in, or null before the form. */
  form: Partial<Record<Field, string>> | null;
  /** Department name → the reference number its completed call gave. */
  completed: Record<string, string>;
  failedCalls: number;
  /** The representatives' feedback on failed calls, in order. */
  feedback: string[];
  done: boolean;
}

export interface ToolCallRequest {
  name: string;
  /** The raw JSON string of the arguments, as a model writes them. */
  arguments: string;
}

export interface StepResult {
  state: EnvState;
  observation: string;
  /** The episode's reward when it ends, else 0. */
  reward: number;
  done: boolean;
  /** Actionable feedback from this step (what was missing, and where), or null. */
  feedback: string | null;
}

export function reset(world: World, task: Task): EnvState {
  const company = world.companies.find((c) => c.name === task.company)!;
  const needed = new Set<Field>();
  for (const call of task.calls)
    for (const f of company.departments.find((d) => d.name === call.department)!.requires) needed.add(f);
  return { task, needed: [...needed], steps: 0, form: null, completed: {}, failedCalls: 0, feedback: [], done: false };
}

function referenceNumber(world: World, task: Task, department: string): string {
  const rand = seeded(world.options.seed, 'reference', task.task_id, department);
  return `REF-${String(Math.floor(rand() * 1e6)).padStart(6, '0')}`;
}

/** Share of required calls completed, minus small penalties, in [0, 1]. */
export function episodeReward(state: EnvState): number {
  const required = state.task.calls.length;
  const done = state.task.calls.filter((c) => state.completed[c.department] !== undefined).length;
  if (done === 0) return 0;
  const needless = Object.keys(state.form ?? {}).filter(
    (f) => SENSITIVE.has(f as Field) && !state.needed.includes(f as Field),
  ).length;
  const penalty = Math.min(
    MAX_PENALTY,
    needless * NEEDLESS_SENSITIVE_PENALTY + state.failedCalls * FAILED_CALL_PENALTY,
  );
  return Math.max(0, Math.min(1, done / required - penalty));
}

export function isSuccess(state: EnvState): boolean {
  return state.task.calls.every((c) => state.completed[c.department] !== undefined);
}

function words(fields: Field[]): string {
  const w = fields.map((f) => FIELD_WORDS[f]);
  return w.length <= 1 ? (w[0] ?? '') : `${w.slice(0, -1).join(', ')} and ${w.at(-1)}`;
}

function parseArgs(raw: string): Record<string, unknown> | null {
  try {
    const v = JSON.parse(raw) as unknown;
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** One tool call. Pure: the state passed in is not changed. */
export function step(world: World, state: EnvState, call: ToolCallRequest): StepResult {
  if (state.done) return { state, observation: 'The task is over.', reward: 0, done: true, feedback: null };
  const next: EnvState = {
    ...state,
    steps: state.steps + 1,
    completed: { ...state.completed },
    feedback: [...state.feedback],
  };
  const out = (observation: string, feedback: string | null = null): StepResult => {
    if (feedback) next.feedback.push(feedback);
    if (next.steps >= MAX_STEPS && !next.done) {
      next.done = true;
      return {
        state: next,
        observation: `${observation}\n(Step limit reached: the task is over.)`,
        reward: episodeReward(next),
        done: true,
        feedback,
      };
    }
    return { state: next, observation, reward: next.done ? episodeReward(next) : 0, done: next.done, feedback };
  };
  const args = parseArgs(call.arguments);
  if (args === null)
    return out(
      `Error: the arguments of ${call.name} must be a JSON object.`,
      `${call.name}: arguments were not a JSON object`,
    );

  switch (call.name) {
    case 'search_directory': {
      const name = String(args.company ?? '')
        .trim()
        .toLowerCase();
      const company = world.byName.get(name);
      if (!company) {
        const close = world.companies
          .filter((c) => name && c.name.toLowerCase().includes(name.split(' ')[0]!))
          .map((c) => c.name)
          .slice(0, 3);
        return out(
          `No company named "${args.company}" in the directory.${close.length ? ` Did you mean: ${close.join(', ')}?` : ''}`,
        );
      }
      return out(
        JSON.stringify({
          company: company.name,
          departments: company.departments.map((d) => ({ name: d.name, phone: d.phone })),
        }),
      );
    }
    case 'auth_info_form': {
      if (state.form !== null)
        return out(
          'The user already filled in the form once and will not fill in another.',
          'auth_info_form: a second form was refused',
        );
      const asked = Array.isArray(args.fields) ? args.fields.map(String) : [];
      const unknown = asked.filter((f) => !(FIELDS as readonly string[]).includes(f));
      const fields = [...new Set(asked.filter((f): f is Field => (FIELDS as readonly string[]).includes(f)))];
      next.form = Object.fromEntries(fields.map((f) => [f, state.task.profile.values[f]]));
      const note = unknown.length ? ` (left blank, not fields the user knows: ${unknown.join(', ')})` : '';
      return out(JSON.stringify(next.form) + note);
    }
    case 'call': {
      const phone = String(args.phone_number ?? '').trim();
      const reached = world.byPhone.get(phone);
      if (!reached) {
        next.failedCalls++;
        return out(
          `The number ${phone || '(none)'} is not in service.`,
          `call: ${phone || 'no number'} is not in service`,
        );
      }
      const { company, department } = reached;
      const wanted = state.task.calls.find((c) => c.department === department.name);
      if (company.name !== state.task.company || !wanted) {
        next.failedCalls++;
        return out(
          `You've reached ${department.name}. I'm sorry, we can't help with that here: wrong department.`,
          `call: ${department.name} is the wrong department for this task`,
        );
      }
      const done = state.completed[department.name];
      if (done) return out(`That request was already completed. Your reference number is ${done}.`);
      const auth = args.auth !== null && typeof args.auth === 'object' ? (args.auth as Record<string, unknown>) : {};
      const missing = department.requires.filter((f) => auth[f] === undefined || auth[f] === null || auth[f] === '');
      const wrong = department.requires.filter(
        (f) => !missing.includes(f) && String(auth[f]).trim() !== state.task.profile.values[f],
      );
      if (missing.length > 0) {
        next.failedCalls++;
        return out(
          `${department.name} here. I can't verify your identity yet: I need your ${words(missing)}.`,
          `${department.name} (${department.phone}) needs ${missing.join(', ')}; it requires ${department.requires.join(', ')}`,
        );
      }
      if (wrong.length > 0) {
        next.failedCalls++;
        return out(
          `${department.name} here. The ${words(wrong)} you gave doesn't match our records.`,
          `${department.name}: wrong value for ${wrong.join(', ')}`,
        );
      }
      if (department.needsReferenceFrom) {
        const prior = company.departments.find((d) => d.type === department.needsReferenceFrom)!;
        const ref = state.completed[prior.name];
        const given = `${String(args.request ?? '')} ${Object.values(auth).join(' ')}`;
        if (!ref || !given.includes(ref)) {
          next.failedCalls++;
          return out(
            `${department.name} here. Before I can do that, I need the reference number from your call with ${prior.name}.`,
            `${department.name} needs the reference number from ${prior.name}${ref ? '' : ', which has not been called successfully yet'}`,
          );
        }
      }
      const reference = referenceNumber(world, state.task, department.name);
      next.completed[department.name] = reference;
      return out(
        `${department.name} here. Thank you, that's done: ${wanted.request}. Your reference number is ${reference}.`,
      );
    }
    case 'finish': {
      next.done = true;
      const n = Object.keys(next.completed).length;
      return out(`Task ended: ${n} of ${state.task.calls.length} requests completed.`);
    }
    default:
      return out(
        `Error: there is no tool "${call.name}". Tools: ${TOOL_NAMES.join(', ')}.`,
        `unknown tool ${call.name}`,
      );
  }
}

/** The department types of a task, for agents that know what each kind of department usually asks. */
export const usualFields = (type: string): Field[] => departmentType(type).usual;
