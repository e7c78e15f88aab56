// Scripted agents of graded skill, as policies: given the conversation so far, the next assistant message.
// The trained model and a model served over HTTP are policies too, so every rollout goes through one loop.
import type { Message, Policy } from '../core/records.ts';
import { usualFields } from './env.ts';
import { FIELDS, FIELD_WORDS, SENSITIVE, type Field, type Task, type World } from './world.ts';
import { pick, sample, seeded, type Random } from '../core/random.ts';

export type AgentName = 'oracle' | 'prior' | 'noisy' | 'random';
export const AGENTS: readonly AgentName[] = ['oracle', 'prior', 'noisy', 'random'];

interface Skill {
  /** The fields the agent believes a department needs. */
  believes(department: string, type: string): Field[];
  /** Whether it includes a known reference number before being asked. */
  anticipatesReferences: boolean;
  /** Whether it retries a call after a representative names what was missing. */
  retries: boolean;
  /** Extra fields it asks for in the form. */
  extraFields: Field[];
  /** Which phone it calls for a department. */
  phoneFor(department: string, directory: { name: string; phone: string }[]): string;
}

function skillOf(name: AgentName, noise: number, world: World, task: Task, rand: Random): Skill {
  const company = world.companies.find((c) => c.name === task.company)!;
  const truth = (department: string) => company.departments.find((d) => d.name === department)!.requires;
  const rightPhone = (department: string, directory: { name: string; phone: string }[]) =>
    directory.find((d) => d.name === department)?.phone ?? '';
  switch (name) {
    case 'oracle':
      return { believes: truth, anticipatesReferences: true, retries: true, extraFields: [], phoneFor: rightPhone };
    case 'prior':
      return {
        believes: (_d, type) => usualFields(type),
        anticipatesReferences: false,
        retries: true,
        extraFields: [],
        phoneFor: rightPhone,
      };
    case 'noisy': {
      const sensitive = FIELDS.filter((f) => SENSITIVE.has(f));
      return {
        believes: (d) => truth(d).filter(() => rand() >= noise),
        anticipatesReferences: rand() >= noise,
        retries: rand() >= noise,
        extraFields: rand() < noise ? [pick(rand, sensitive)] : [],
        phoneFor: (d, dir) => (rand() < noise / 2 ? pick(rand, dir).phone : rightPhone(d, dir)),
      };
    }
    case 'random':
      return {
        believes: () => sample(rand, FIELDS, 1 + Math.floor(rand() * 3)),
        anticipatesReferences: false,
        retries: false,
        extraFields: sample(rand, FIELDS, Math.floor(rand() * 3)),
        phoneFor: (_d, dir) => pick(rand, dir).phone,
      };
  }
}

/**
 * A scripted agent: looks the company up, asks for the fields it believes are needed in one form, calls each
 * department in the order the user gave, retries (at most twice a call) when told which fields or which reference
 * number is missing and it has them, and finishes.
 */
const ASKED_LINE = /^- (.+) asked for ([a-z_0-9, ]+)\.$/gm;

/**
 * What notes from earlier attempts (env/feedback.ts writes them beside the user's request) say each department
 * asked for, read as a scripted agent reads text: the lines `- <department> asked for <fields>.`
 */
export function readNotes(text: string): Map<string, Field[]> {
  const asked = new Map<string, Field[]>();
  for (const m of text.matchAll(ASKED_LINE))
    asked.set(
      m[1]!,
      m[2]!.split(', ').filter((f): f is Field => (FIELDS as readonly string[]).includes(f)),
    );
  return asked;
}

export class ScriptedAgent implements Policy {
  readonly name: string;
  private readonly skill: Skill;
  private directory: { name: string; phone: string }[] = [];
  private form: Partial<Record<Field, string>> = {};
  private phase: 'start' | 'form' | 'first-call' | 'calls' | 'finish' | 'closing' = 'start';
  private callIndex = 0;
  /** Retries of the current call: one per distinct complaint (missing fields, then a missing reference). */
  private retries = 0;
  private lastAuth: Record<string, string> = {};
  private readonly references: Record<string, string> = {};
  private callCounter = 0;
  /** Notes from earlier attempts beside the user's request (feedback-guided rollouts): department → the fields it asked for. */
  private notes = new Map<string, Field[]>();

  constructor(
    kind: AgentName,
    private readonly world: World,
    private readonly task: Task,
    seed: string,
    noise = 0.3,
  ) {
    this.name = kind === 'noisy' ? `noisy(${noise})` : kind;
    this.skill = skillOf(kind, noise, world, task, seeded(seed, 'agent', kind, task.task_id));
  }

  private tool(name: string, args: unknown): Message {
    return {
      role: 'assistant',
      content: null,
      tool_calls: [
        { id: `call_${++this.callCounter}`, type: 'function', function: { name, arguments: JSON.stringify(args) } },
      ],
    };
  }

  /** What the agent believes a department needs, and what notes from earlier attempts say it asked for. */
  private needs(department: string, type: string): Field[] {
    return [...new Set([...this.skill.believes(department, type), ...(this.notes.get(department) ?? [])])];
  }

  private authFor(department: string, type: string): Record<string, string> {
    const fields = this.needs(department, type);
    return Object.fromEntries(fields.filter((f) => this.form[f] !== undefined).map((f) => [f, this.form[f]!]));
  }

  private callRequest(index: number, withReference: boolean): string {
    const call = this.task.calls[index]!;
    const company = this.world.companies.find((c) => c.name === this.task.company)!;
    const needs = company.departments.find((d) => d.name === call.department)?.needsReferenceFrom;
    const prior = needs ? company.departments.find((d) => d.type === needs)?.name : undefined;
    const ref = prior ? this.references[prior] : undefined;
    return withReference && ref
      ? `I'd like to ${call.request}. My reference number from ${prior} is ${ref}.`
      : `I'd like to ${call.request}.`;
  }

  private nextCall(lastAuth?: Record<string, string>, withReference = false): Message {
    const call = this.task.calls[this.callIndex]!;
    const auth = lastAuth ?? this.authFor(call.department, call.type);
    this.lastAuth = auth;
    return this.tool('call', {
      phone_number: this.skill.phoneFor(call.department, this.directory),
      auth,
      request: this.callRequest(this.callIndex, withReference || this.skill.anticipatesReferences),
    });
  }

  async respond(messages: Message[]): Promise<Message> {
    const last = messages.at(-1)!;
    const observation = last.role === 'tool' ? (last.content ?? '') : '';
    switch (this.phase) {
      case 'start':
        this.notes = readNotes(messages.find((m) => m.role === 'user')?.content ?? '');
        this.phase = 'form';
        return this.tool('search_directory', { company: this.task.company });
      case 'form': {
        try {
          this.directory = (JSON.parse(observation) as { departments: { name: string; phone: string }[] }).departments;
        } catch {
          this.directory = [];
        }
        const fields = new Set<Field>(this.skill.extraFields);
        for (const call of this.task.calls) for (const f of this.needs(call.department, call.type)) fields.add(f);
        this.phase = 'first-call';
        return this.tool('auth_info_form', { fields: FIELDS.filter((f) => fields.has(f)) });
      }
      case 'first-call':
        this.form = JSON.parse(observation.replace(/ \(left blank.*$/, '')) as Partial<Record<Field, string>>;
        this.phase = 'calls';
        return this.nextCall();
      case 'calls': {
        const ref = /reference number is (REF-\d+)/.exec(observation);
        if (ref) this.references[this.task.calls[this.callIndex]!.department] = ref[1]!;
        const failed = !ref && !observation.startsWith('That request was already completed');
        if (failed && this.skill.retries && this.retries < 2) {
          const missing = FIELDS.filter(
            (f) => observation.includes(FIELD_WORDS[f]) && this.form[f] !== undefined && this.lastAuth[f] === undefined,
          );
          const wantsReference = observation.includes('reference number from');
          if (missing.length > 0 || wantsReference) {
            this.retries++;
            const add = Object.fromEntries(missing.map((f) => [f, this.form[f]!]));
            return this.nextCall({ ...this.lastAuth, ...add }, wantsReference);
          }
        }
        this.retries = 0;
        this.callIndex++;
        if (this.callIndex < this.task.calls.length) return this.nextCall();
        this.phase = 'finish';
        return this.tool('finish', {});
      }
      case 'finish':
      case 'closing': {
        this.phase = 'closing';
        const done = Object.keys(this.references).length;
        const total = this.task.calls.length;
        return {
          role: 'assistant',
          content:
            done === total
              ? `All done: ${total === 1 ? 'your request is' : `all ${total} requests are`} complete. References: ${Object.values(this.references).join(', ')}.`
              : `I completed ${done} of ${total} requests; ${this.task.company} still needs more from you for the rest.`,
        };
      }
    }
  }
}
