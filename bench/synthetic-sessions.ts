// Synthetic customer-service agent sessions in the Session format, deterministic from a seed: the load
// for bench/ingest and, until the simulator lands (issue 3), the bundled sample in data/sample/.
//
//   npx tsx bench/synthetic-sessions.ts --sessions 600 --seed 1 --out data/sample/sessions.jsonl
import { createWriteStream } from 'node:fs';
import { once } from 'node:events';
import { parseArgs } from 'node:util';
import { seeded } from '../core/random.ts';
import type { Message, Session } from '../core/records.ts';

const COMPANIES = [
  'Acme Telecom',
  'Northwind Bank',
  'Globex Insurance',
  'Initech Energy',
  'Umbrella Health',
  'Soylent Foods',
  'Hooli Cloud',
  'Vandelay Imports',
];
const DEPARTMENTS: Record<string, string[]> = {
  billing: ['account_number', 'zip_code'],
  technical_support: ['account_number', 'phone_number'],
  cancellations: ['account_number', 'last_4_ssn'],
  refunds: ['order_id', 'email'],
  claims: ['policy_number', 'date_of_birth'],
  fraud: ['account_number', 'last_4_ssn', 'date_of_birth'],
};
const REQUESTS: Record<string, string[]> = {
  billing: ['dispute a duplicate charge', 'ask why my bill went up'],
  technical_support: ['fix my internet outage', 'reset my router remotely'],
  cancellations: ['cancel my subscription', 'close my account'],
  refunds: ['get a refund for order', 'return a damaged item'],
  claims: ['file a claim for water damage', 'check my claim status'],
  fraud: ['report a fraudulent transaction', 'freeze my card'],
};
const PHRASINGS = [
  'Please call {company} for me and {request}.',
  'Can you contact {company}? I need to {request}.',
  'I want to {request} with {company}, could you handle it?',
];
const VALUES: Record<string, string> = {
  account_number: '4417-2290-118',
  zip_code: '94110',
  phone_number: '415-555-0142',
  last_4_ssn: '6789',
  order_id: 'ORD-88231',
  email: 'sam@example.com',
  policy_number: 'POL-55120',
  date_of_birth: '1987-03-14',
};

const SYSTEM =
  "You are an assistant that phones companies on the user's behalf. Tools: search_directory(company), auth_info_form(fields) (once), call(phone_number, auth, request), finish().";

export function* syntheticSessions(count: number, seed: number, trialsPerTask = 4): Generator<Session> {
  const rand = seeded(seed, 'synthetic-sessions');
  const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)]!;
  let callId = 0;
  const tool = (name: string, args: unknown): Message => ({
    role: 'assistant',
    content: null,
    tool_calls: [{ id: `call_${++callId}`, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
  });
  const result = (content: string): Message => ({ role: 'tool', content, tool_call_id: `call_${callId}` });

  let made = 0;
  for (let task = 0; made < count; task++) {
    const company = pick(COMPANIES);
    const dept = pick(Object.keys(DEPARTMENTS));
    const request = pick(REQUESTS[dept]!);
    const required = DEPARTMENTS[dept]!;
    const phone = `1-800-555-${String(1000 + Math.floor(rand() * 9000))}`;
    for (let trial = 0; trial < trialsPerTask && made < count; trial++, made++) {
      const skill = rand();
      const asked = skill < 0.7 ? required : required.slice(0, Math.max(1, required.length - 1));
      const ok = asked.length === required.length;
      const missing = required.filter((f) => !asked.includes(f));
      const messages: Message[] = [
        { role: 'system', content: SYSTEM },
        { role: 'user', content: pick(PHRASINGS).replace('{company}', company).replace('{request}', request) },
        tool('search_directory', { company }),
        result(JSON.stringify({ company, departments: [{ name: dept, phone }] })),
        tool('auth_info_form', { fields: asked }),
        result(JSON.stringify(Object.fromEntries(asked.map((f) => [f, VALUES[f]])))),
        tool('call', { phone_number: phone, auth: Object.fromEntries(asked.map((f) => [f, VALUES[f]])), request }),
        result(
          ok
            ? `Done: your request to ${request} is complete. Reference ${1000 + task}.`
            : `I can't help without your ${missing.join(' and ').replace(/_/g, ' ')}.`,
        ),
        {
          role: 'assistant',
          content: ok
            ? `All set: ${company} completed your request.`
            : `I could not finish: ${company} needs your ${missing.join(', ')}.`,
        },
      ];
      yield {
        session_id: `t${task}-trial${trial}-s${seed}`,
        task_id: `task-${seed}-${task}`,
        messages,
        reward: ok ? 1 : 0,
        feedback: ok ? null : `missing fields: ${missing.join(', ')}`,
        model: skill < 0.7 ? 'agent-v2' : 'agent-v1',
        source: 'synthetic',
        created_at: new Date(Date.UTC(2026, 0, 1) + made * 60_000).toISOString(),
        metadata: JSON.stringify({ trial, difficulty: required.length }),
      };
    }
  }
}

/** Writes sessions as JSONL in the shape of an input log (no `source`; metadata fields inline). */
export async function writeSyntheticSessions(path: string, count: number, seed: number): Promise<void> {
  const out = createWriteStream(path);
  for (const s of syntheticSessions(count, seed)) {
    const { source: _source, metadata, ...rest } = s;
    const line = JSON.stringify({ ...rest, ...JSON.parse(metadata) }) + '\n';
    if (!out.write(line)) await once(out, 'drain');
  }
  out.end();
  await once(out, 'finish');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: {
      sessions: { type: 'string', default: '600' },
      seed: { type: 'string', default: '1' },
      out: { type: 'string' },
    },
  });
  if (!values.out) throw new Error('--out FILE is required');
  await writeSyntheticSessions(values.out, Number(values.sessions), Number(values.seed));
}
