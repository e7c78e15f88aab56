// The customer-service world, generated from a seed: companies with departments,
// a public directory that does NOT list what each department asks for, per-department authentication
// (a usual set per department type, with company-specific deviations), routing dependencies, and tasks.
import { int, pick, sample, seeded, type Random } from '../core/random.ts';

export const FIELDS = [
  'account_number',
  'last_4_ssn',
  'date_of_birth',
  'zip_code',
  'phone_number',
  'email',
  'pin',
  'order_id',
  'policy_number',
  'member_id',
] as const;
export type Field = (typeof FIELDS)[number];

/** Fields whose needless collection costs reward: the user should not hand them out for nothing. */
export const SENSITIVE: ReadonlySet<Field> = new Set(['last_4_ssn', 'date_of_birth', 'pin', 'account_number']);

/** How a representative says each field. */
export const FIELD_WORDS: Record<Field, string> = {
  account_number: 'account number',
  last_4_ssn: 'last four digits of your SSN',
  date_of_birth: 'date of birth',
  zip_code: 'ZIP code',
  phone_number: 'phone number on file',
  email: 'email address',
  pin: 'account PIN',
  order_id: 'order number',
  policy_number: 'policy number',
  member_id: 'member ID',
};

export interface DepartmentType {
  type: string;
  label: string;
  /** What departments of this type usually ask for: the prior an agent can learn. */
  usual: Field[];
  /** What a user asks this department to do. */
  requests: string[];
}

export const CATALOGUE: readonly DepartmentType[] = [
  {
    type: 'billing',
    label: 'Billing',
    usual: ['account_number', 'zip_code'],
    requests: ['dispute a duplicate charge on my last bill', 'find out why my bill went up', 'set up a payment plan'],
  },
  {
    type: 'technical_support',
    label: 'Technical Support',
    usual: ['account_number', 'phone_number'],
    requests: ['fix my internet outage', 'get my router reset remotely', 'restore my email access'],
  },
  {
    type: 'cancellations',
    label: 'Cancellations',
    usual: ['account_number', 'last_4_ssn'],
    requests: ['cancel my subscription', 'close my account', 'stop my automatic renewal'],
  },
  {
    type: 'claims',
    label: 'Claims',
    usual: ['policy_number', 'date_of_birth'],
    requests: ['file a claim for water damage', 'check the status of my claim', 'add a receipt to my claim'],
  },
  {
    type: 'refunds',
    label: 'Refunds',
    usual: ['order_id', 'email'],
    requests: ['get a refund for a returned item', 'get my money back for a cancelled order'],
  },
  {
    type: 'fraud',
    label: 'Fraud Prevention',
    usual: ['account_number', 'last_4_ssn', 'date_of_birth'],
    requests: ['report a fraudulent charge', 'freeze my card'],
  },
  {
    type: 'shipping',
    label: 'Shipping',
    usual: ['order_id', 'zip_code'],
    requests: ['track a late package', 'change my delivery address'],
  },
  {
    type: 'account_security',
    label: 'Account Security',
    usual: ['email', 'pin'],
    requests: ['reset my online password', 'unlock my account'],
  },
  {
    type: 'loans',
    label: 'Loans',
    usual: ['account_number', 'last_4_ssn', 'date_of_birth'],
    requests: ['ask about refinancing my loan', 'get my loan payoff amount'],
  },
  {
    type: 'appointments',
    label: 'Appointments',
    usual: ['member_id', 'date_of_birth'],
    requests: ['book an appointment', 'reschedule my appointment'],
  },
  {
    type: 'pharmacy',
    label: 'Pharmacy',
    usual: ['member_id', 'date_of_birth', 'zip_code'],
    requests: ['refill a prescription', 'transfer a prescription'],
  },
  {
    type: 'rewards',
    label: 'Rewards',
    usual: ['email', 'phone_number'],
    requests: ['redeem my reward points', 'merge two rewards accounts'],
  },
];
const TYPE = new Map(CATALOGUE.map((d) => [d.type, d]));
export const departmentType = (type: string): DepartmentType => TYPE.get(type)!;

const INDUSTRIES: Record<string, { suffixes: string[]; departments: string[] }> = {
  telecom: {
    suffixes: ['Telecom', 'Wireless', 'Communications'],
    departments: ['billing', 'technical_support', 'cancellations', 'account_security', 'shipping'],
  },
  bank: {
    suffixes: ['Bank', 'Credit Union', 'Financial'],
    departments: ['billing', 'fraud', 'loans', 'account_security', 'cancellations'],
  },
  insurer: {
    suffixes: ['Insurance', 'Mutual', 'Assurance'],
    departments: ['claims', 'billing', 'cancellations', 'account_security'],
  },
  retailer: {
    suffixes: ['Outfitters', 'Market', 'Goods'],
    departments: ['refunds', 'shipping', 'rewards', 'billing', 'account_security'],
  },
  health: { suffixes: ['Health', 'Clinics', 'Care'], departments: ['appointments', 'pharmacy', 'billing', 'claims'] },
  utility: { suffixes: ['Energy', 'Power', 'Water'], departments: ['billing', 'technical_support', 'cancellations'] },
  airline: {
    suffixes: ['Airlines', 'Air', 'Airways'],
    departments: ['refunds', 'rewards', 'billing', 'cancellations'],
  },
};
const NAME_WORDS = [
  'Acme',
  'Northwind',
  'Globex',
  'Initech',
  'Umbrella',
  'Soylent',
  'Hooli',
  'Vandelay',
  'Stark',
  'Wayne',
  'Tyrell',
  'Cyberdyne',
  'Wonka',
  'Gringotts',
  'Oscorp',
  'Pied Piper',
  'Dunder',
  'Massive',
  'Blue Sun',
  'Aperture',
  'Monarch',
  'Virtucon',
  'Zorg',
  'Sirius',
  'Prestige',
  'Nakatomi',
  'Genco',
  'Kramerica',
  'Bluth',
  'Los Pollos',
  'Sterling',
  'Rekall',
  'Weyland',
  'Tessier',
  'Ollivander',
  'Duff',
  'Krusty',
  'Planet',
  'Omni',
  'Vault',
];
const FIRST_NAMES = [
  'Sam',
  'Alex',
  'Priya',
  'Jordan',
  'Mei',
  'Carlos',
  'Fatima',
  'Noah',
  'Olga',
  'Kwame',
  'Lena',
  'Ravi',
  'Sofia',
  'Tom',
  'Aisha',
  'Diego',
];
const LAST_NAMES = [
  'Rivera',
  'Chen',
  'Okafor',
  'Novak',
  'Patel',
  'Kim',
  'Schmidt',
  'Haddad',
  'Silva',
  'Moreau',
  'Ito',
  'Larsen',
];

export interface Department {
  /** As the directory lists it: "Globex Insurance Claims". */
  name: string;
  type: string;
  phone: string;
  /** What this company's department really asks for. Not in the directory. */
  requires: Field[];
  /** The department (type) whose reference number this one needs first, if any. */
  needsReferenceFrom: string | null;
}

interface Company {
  name: string;
  industry: string;
  departments: Department[];
  split: 'train' | 'val';
}

export interface WorldOptions {
  seed: number;
  companies: number;
  /** Share of companies held out for validation tasks (never seen in training tasks). */
  valShare: number;
  /** Chance that a department deviates from its type's usual requirements. */
  deviation: number;
  /** Chance that a department needs a reference number from another of its company's departments. */
  dependency: number;
}

export const DEFAULT_WORLD: WorldOptions = {
  seed: 1,
  companies: 100,
  valShare: 0.2,
  deviation: 0.35,
  dependency: 0.25,
};

export interface World {
  options: WorldOptions;
  companies: Company[];
  byPhone: Map<string, { company: Company; department: Department }>;
  /** Each company by its name in lower case (the first, should two names differ only in case): what search_directory looks up. */
  byName: Map<string, Company>;
}

function requirementsFor(rand: Random, type: DepartmentType, deviation: number): Field[] {
  const usual = [...type.usual];
  if (rand() >= deviation) return usual;
  const others = FIELDS.filter((f) => !usual.includes(f));
  if (rand() < 0.5 || usual.length === 1) return [...usual, pick(rand, others)]; // asks for one more
  const i = Math.floor(rand() * usual.length);
  usual[i] = pick(rand, others); // asks for something else instead
  return usual;
}

export function generateWorld(options: Partial<WorldOptions> = {}): World {
  const o = { ...DEFAULT_WORLD, ...options };
  const rand = seeded(o.seed, 'world');
  const names = new Set<string>();
  const phones = new Set<string>();
  const industries = Object.keys(INDUSTRIES);
  const companies: Company[] = [];
  const valCount = Math.round(o.companies * o.valShare);
  for (let c = 0; c < o.companies; c++) {
    const industry = industries[c % industries.length]!;
    const spec = INDUSTRIES[industry]!;
    let name: string;
    do name = `${pick(rand, NAME_WORDS)} ${pick(rand, spec.suffixes)}`;
    while (names.has(name) && names.size < NAME_WORDS.length * 3);
    if (names.has(name)) name = `${name} ${c}`;
    names.add(name);
    const types = sample(rand, spec.departments, int(rand, 3, spec.departments.length));
    const departments: Department[] = types.map((type, i) => {
      let phone: string;
      do phone = `1-800-${int(rand, 200, 999)}-${String(int(rand, 0, 9999)).padStart(4, '0')}`;
      while (phones.has(phone));
      phones.add(phone);
      const t = departmentType(type);
      const needsReferenceFrom = i > 0 && rand() < o.dependency ? types[Math.floor(rand() * i)]! : null;
      return {
        name: `${name} ${t.label}`,
        type,
        phone,
        requires: requirementsFor(rand, t, o.deviation),
        needsReferenceFrom,
      };
    });
    companies.push({ name, industry, departments, split: 'train' });
  }
  // Validation companies: a seeded choice, so they are spread over industries.
  for (const c of sample(rand, companies, valCount)) c.split = 'val';
  const byPhone = new Map<string, { company: Company; department: Department }>();
  for (const company of companies)
    for (const department of company.departments) byPhone.set(department.phone, { company, department });
  const byName = new Map<string, Company>();
  for (const company of companies)
    if (!byName.has(company.name.toLowerCase())) byName.set(company.name.toLowerCase(), company);
  return { options: o, companies, byPhone, byName };
}

interface Profile {
  name: string;
  values: Record<Field, string>;
}

interface TaskCall {
  department: string;
  type: string;
  request: string;
}

export interface Task {
  task_id: string;
  split: 'train' | 'val';
  index: number;
  company: string;
  /** The calls to complete, in an order that respects reference dependencies. */
  calls: TaskCall[];
  /** The user's request in natural language. */
  request: string;
  profile: Profile;
}

const taskId = (seed: number, split: string, index: number) => `cs-${seed}-${split}-${String(index).padStart(5, '0')}`;

/** A task id's seed, split and index; null for an id the simulator did not make. */
export function parseTaskId(id: string): { seed: number; split: 'train' | 'val'; index: number } | null {
  const m = /^cs-(\d+)-(train|val)-(\d+)$/.exec(id);
  return m ? { seed: Number(m[1]), split: m[2] as 'train' | 'val', index: Number(m[3]) } : null;
}

function profileFor(rand: Random): Profile {
  const digits = (n: number) => Array.from({ length: n }, () => int(rand, 0, 9)).join('');
  const first = pick(rand, FIRST_NAMES);
  const last = pick(rand, LAST_NAMES);
  return {
    name: `${first} ${last}`,
    values: {
      account_number: `${digits(4)}-${digits(4)}-${digits(3)}`,
      last_4_ssn: digits(4),
      date_of_birth: `19${int(rand, 50, 99)}-${String(int(rand, 1, 12)).padStart(2, '0')}-${String(int(rand, 1, 28)).padStart(2, '0')}`,
      zip_code: digits(5),
      phone_number: `${int(rand, 200, 989)}-555-${digits(4)}`,
      email: `${first.toLowerCase()}.${last.toLowerCase()}${int(rand, 1, 99)}@example.com`,
      pin: digits(4),
      order_id: `ORD-${digits(6)}`,
      policy_number: `POL-${digits(7)}`,
      member_id: `MBR-${digits(6)}`,
    },
  };
}

const OPENERS = ['Hi, this is {name}.', "Hello! I'm {name}.", 'Hey there.', 'Good morning, {name} here.'];
const ASKS = [
  'Could you call {company} for me? I need to {list}.',
  'Please contact {company}: I want to {list}.',
  'Can you phone {company} and {list}?',
  'I need help with {company}. I have to {list}.',
];

function joinRequests(parts: string[]): string {
  if (parts.length === 1) return parts[0]!;
  return `${parts.slice(0, -1).join(', ')}, and then ${parts.at(-1)}`;
}

/**
 * Task `index` of a split: generated from (seed, split, index) alone, so any task can be rebuilt from
 * its id. Its difficulty (1–5) is the number of departments to complete, drawn uniformly.
 */
export function generateTask(world: World, split: 'train' | 'val', index: number): Task {
  const rand = seeded(world.options.seed, 'task', split, index);
  const companies = world.companies.filter((c) => c.split === split);
  if (companies.length === 0) throw new Error(`the world has no ${split} companies; raise --companies`);
  const want = int(rand, 1, 5);
  // A company with enough departments for the difficulty, if there is one.
  const able = companies.filter((c) => c.departments.length >= want);
  const company = pick(rand, able.length > 0 ? able : companies);
  const k = Math.min(want, company.departments.length);
  const byType = new Map(company.departments.map((d) => [d.type, d]));
  const chosen: Department[] = [];
  const add = (d: Department) => {
    if (chosen.includes(d)) return;
    if (d.needsReferenceFrom) add(byType.get(d.needsReferenceFrom)!); // prerequisites come first
    chosen.push(d);
  };
  for (const d of sample(rand, company.departments, company.departments.length)) {
    if (chosen.length >= k) break;
    const before = chosen.length;
    add(d);
    if (chosen.length > k) chosen.splice(before); // its prerequisites would overshoot: skip it
  }
  const calls = chosen.map((d) => ({
    department: d.name,
    type: d.type,
    request: pick(rand, departmentType(d.type).requests),
  }));
  const profile = profileFor(rand);
  const request = `${pick(rand, OPENERS).replace('{name}', profile.name)} ${pick(rand, ASKS)
    .replace('{company}', company.name)
    .replace('{list}', joinRequests(calls.map((c) => c.request)))}`;
  return {
    task_id: taskId(world.options.seed, split, index),
    split,
    index,
    company: company.name,
    calls,
    request,
    profile,
  };
}

export function findTask(world: World, id: string): Task {
  const parsed = parseTaskId(id);
  if (!parsed || parsed.seed !== world.options.seed)
    throw new Error(`task ${id} is not a task of the world with seed ${world.options.seed}`);
  return generateTask(world, parsed.split, parsed.index);
}

/** The first `count` tasks of `split` with at most `maxCalls` calls (every task when null), in index order. */
export function taskPool(world: World, split: 'train' | 'val', count: number, maxCalls: number | null): Task[] {
  const tasks: Task[] = [];
  for (let i = 0; tasks.length < count; i++) {
    if (i > 100 * count + 1000) throw new Error(`fewer than ${count} ${split} tasks have at most ${maxCalls} calls`);
    const task = generateTask(world, split, i);
    if (maxCalls === null || task.calls.length <= maxCalls) tasks.push(task);
  }
  return tasks;
}
