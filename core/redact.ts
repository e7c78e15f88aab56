// Masks personal data before text leaves the machine (a judge's or sampler's request) or goes into an
// exported dataset. One Redactor gives each distinct value one placeholder, so a judge can still see that
// the number an agent dialled is the one the directory gave ([PHONE_3] in both places).
import { z } from 'zod';
import { MONTH, normaliseDate } from './dates.ts';
import type { Message } from './records.ts';

export type PiiKind = 'ssn' | 'account' | 'phone' | 'email' | 'dob' | 'date';
export const PII_KINDS: readonly PiiKind[] = ['ssn', 'account', 'phone', 'email', 'dob', 'date'];

export interface RedactionOptions {
  /** Which kinds to mask. */
  kinds: readonly PiiKind[];
  /** JSON keys whose string/number values are masked whatever they look like (e.g. 'pin', 'last_4_ssn'). */
  keys: readonly string[];
  /**
   * Named phrases masked wherever they appear, as whole words and in any case: label → phrases
   * ({COMPANY: ['Globex Insurance', ...]} makes "call globex insurance" read "call [COMPANY_1]"). Restored as listed.
   */
  terms?: Readonly<Record<string, readonly string[]>>;
  /** Values of a shape of one's own: label → regular expression ({REF: 'REF-\\d+'}). */
  patterns?: Readonly<Record<string, string>>;
  /**
   * Learn, before masking a conversation (`messages`), every value it reveals under a personal key (a
   * profile's name or address, a form's date of birth: SESSION_KEYS and `keys`, in JSON or as "Name: ..."),
   * and mask that value wherever else it appears in the conversation, whatever the text around it.
   */
  sessionValues?: boolean;
}

export const DEFAULT_REDACTION: RedactionOptions = {
  kinds: PII_KINDS,
  keys: [
    'last_4_ssn',
    'ssn',
    'social_security_number',
    'account_number',
    'date_of_birth',
    'dob',
    'pin',
    'phone_number',
    'email',
  ],
  sessionValues: true,
};

/** Keys whose values a conversation reveals about a person, learnt by `sessionValues`, with the placeholder's label. */
const SESSION_KEYS: Readonly<Record<string, string>> = {
  first_name: 'NAME',
  last_name: 'NAME',
  middle_name: 'NAME',
  full_name: 'NAME',
  customer_name: 'NAME',
  passenger_name: 'NAME',
  user_name: 'NAME',
  username: 'NAME',
  address: 'ADDRESS',
  address1: 'ADDRESS',
  address2: 'ADDRESS',
  address_line1: 'ADDRESS',
  address_line2: 'ADDRESS',
  street: 'ADDRESS',
  street_address: 'ADDRESS',
  home_address: 'ADDRESS',
  billing_address: 'ADDRESS',
  zip: 'ZIP',
  zip_code: 'ZIP',
  zipcode: 'ZIP',
  postal_code: 'ZIP',
  postcode: 'ZIP',
  ssn: 'SSN',
  last_4_ssn: 'SSN',
  social_security_number: 'SSN',
  dob: 'DOB',
  date_of_birth: 'DOB',
  birth_date: 'DOB',
  birthdate: 'DOB',
  email: 'EMAIL',
  email_address: 'EMAIL',
  phone: 'PHONE',
  phone_number: 'PHONE',
  account_number: 'ACCOUNT',
  card_number: 'ACCOUNT',
  passport: 'PASSPORT',
  passport_number: 'PASSPORT',
};

/** "Name: Mia Garcia", "Date of Birth remains: 1989-12-13": a personal label in prose, and the value after it. */
const PROSE_VALUE =
  /(?<![\w])(full name|first name|last name|name|date of birth|birth date|dob|address|home address|street address|e-?mail(?: address)?|phone(?: number)?|ssn|passport(?: number)?)\b(?:\s+(?:is|was|remains|now))?\s*[:=]\s*([^\n,;()]{2,60})/gi;
const PROSE_LABELS: Readonly<Record<string, string>> = {
  name: 'NAME',
  'full name': 'NAME',
  'first name': 'NAME',
  'last name': 'NAME',
  'date of birth': 'DOB',
  'birth date': 'DOB',
  dob: 'DOB',
  address: 'ADDRESS',
  'home address': 'ADDRESS',
  'street address': 'ADDRESS',
  email: 'EMAIL',
  'e-mail': 'EMAIL',
  'email address': 'EMAIL',
  'e-mail address': 'EMAIL',
  phone: 'PHONE',
  'phone number': 'PHONE',
  ssn: 'SSN',
  passport: 'PASSPORT',
  'passport number': 'PASSPORT',
};

/** The kind of a key's value: it names the placeholder, and says which values are the same value. */
const KEY_KINDS: Readonly<Record<string, PiiKind>> = {
  ssn: 'ssn',
  last_4_ssn: 'ssn',
  social_security_number: 'ssn',
  account: 'account',
  account_number: 'account',
  card_number: 'account',
  iban: 'account',
  phone: 'phone',
  phone_number: 'phone',
  email: 'email',
  email_address: 'email',
  dob: 'dob',
  date_of_birth: 'dob',
  birth_date: 'dob',
  birthdate: 'dob',
};

/** Keys whose date values are dates of birth, even when they are not among the masked keys. */
const DOB_KEYS: ReadonlySet<string> = new Set(['date_of_birth', 'dob', 'birth_date', 'birthdate']);

/** A placeholder as a Redactor writes it ([PHONE_1]). */
export const PLACEHOLDERS = /\[[A-Z][A-Z0-9_]*_\d+\]/g;
const PLACEHOLDER = new RegExp(`^${PLACEHOLDERS.source}$`);

// ---- what a date looks like (only ever masked in a date-of-birth context) ----

const DAY = String.raw`\d{1,2}(?:st|nd|rd|th)?`;
const DATE_FORMS = [
  String.raw`\d{4}[-/.]\d{1,2}[-/.]\d{1,2}`, // 1965-01-14
  String.raw`\d{1,2}[-/.]\d{1,2}[-/.](?:\d{4}|\d{2})`, // 01/14/1965, 14.01.1965
  String.raw`${MONTH}\s+${DAY},?\s+\d{4}`, // January 14, 1965
  String.raw`${DAY}\s+(?:of\s+)?${MONTH},?\s+\d{4}`, // 14 January 1965
  String.raw`${MONTH}\s+\d{4}`, // January 1965
  String.raw`(?:19|20)\d{2}`, // born in 1965
];
const DATE = DATE_FORMS.join('|');
const WHOLE_DATE = new RegExp(`^(?:${DATE})$`, 'i');
/** A date with a day, month and year: what the `date` kind masks wherever it appears. */
const FULL_DATE = DATE_FORMS.slice(0, 4).join('|');

// ---- detectors over free text, in priority order: where two overlap, the earlier one keeps the span ----

interface Detector {
  kind: PiiKind;
  /** Global; the whole match is the value (context sits in lookbehinds). */
  pattern: RegExp;
  accept?: (match: string) => boolean;
}

const digitCount = (s: string) => s.replace(/\D/g, '').length;

// Numbers after these words are the environment's own identifiers, not personal data.
const NOT_AN_ID = String.raw`(?<!\b(?:order|ref(?:erence)?|confirmation|ticket|case|tracking|invoice|policy|member)\.?(?:\s*(?:number|no\.?|id|#))?[\s:#]*(?:is\s+)?)`;
const DATE_SHAPED = /^(?:\d{4}-\d{1,2}-\d{1,2}|\d{1,2}-\d{1,2}-\d{4})$/;
const ZIP_PLUS_4 = /^\d{5}-\d{4}$/;

const DETECTORS: readonly Detector[] = [
  { kind: 'email', pattern: /(?<![\w.%+-])[\w.%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}(?![\w-])/gi },
  {
    kind: 'dob',
    pattern: new RegExp(
      String.raw`(?<=\b(?:born(?:\s+(?:on|in))?|date\s+of\s+birth|birth\s*date|birthday|d\.?o\.?b)\b[\s:=,.-]*(?:(?:is|was)\s+)?)(?:${DATE})(?!\d)`,
      'gi',
    ),
  },
  // Any other date, wherever it is (a date of birth after an unusual cue, a travel date): [DATE_n], or the DOB
  // placeholder when it is a date of birth the conversation revealed.
  { kind: 'date', pattern: new RegExp(String.raw`(?<![\w/.-])(?:${FULL_DATE})(?![\w/-]|\.\d)`, 'gi') },
  // "SSN ending in 6789", "last 4 of my SSN: 6789": the first number after the cue, nothing in between.
  {
    kind: 'ssn',
    pattern:
      /(?<=\b(?:ssn|social\s+security(?:\s+number)?)\b[^\d\n.;!?]{0,30})(?<!\w)(?:\d{3}[- ]?\d{2}[- ]?\d{4}|\d{4})(?![\w-])/gi,
  },
  {
    kind: 'account',
    pattern:
      /(?<=\b(?:account|acct)\.?\s*(?:(?:number|num|no|id)\b\.?|[:#])[\s:#=]*(?:(?:is|was)\s+)?)(?<!\w)\d+(?:[ -]\d+)*(?![\w-])/gi,
    accept: (s) => digitCount(s) >= 4,
  },
  { kind: 'ssn', pattern: /(?<![\w-])\d{3}([- ])\d{2}\1\d{4}(?![\w-])/g },
  { kind: 'account', pattern: /\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b/g, accept: isIban },
  { kind: 'phone', pattern: /(?<![\w+-])(?:\+?1[-. ]?)?(?:\(\d{3}\) ?|\d{3}[-. ])\d{3}[-. ]\d{4}(?![\w-])/g },
  {
    kind: 'phone',
    pattern: /(?<![\w+])\+\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,6}(?![\w-])/g,
    accept: (s) => digitCount(s) >= 8 && digitCount(s) <= 15,
  },
  { kind: 'account', pattern: /(?<![\w-])\d{4} (?:\d{4} \d{4} \d{4}(?: \d{1,3})?|\d{6} \d{4,5})(?![\w-])/g }, // cards
  {
    kind: 'account',
    pattern: new RegExp(String.raw`${NOT_AN_ID}(?<![\w-]|\d[.,])\d+(?:-\d+){0,4}(?![\w-]|[.,]\d)`, 'gi'),
    accept: (s) => digitCount(s) >= 8 && digitCount(s) <= 19 && !DATE_SHAPED.test(s) && !ZIP_PLUS_4.test(s),
  },
];

/** The ISO 13616 mod-97 check, so that words followed by numbers are not taken for IBANs. */
function isIban(s: string): boolean {
  const compact = s.replace(/ /g, '');
  if (compact.length < 15 || compact.length > 34) return false;
  let remainder = 0;
  for (const ch of compact.slice(4) + compact.slice(0, 4)) {
    const n = parseInt(ch, 36);
    remainder = (remainder * (n < 10 ? 10 : 100) + n) % 97;
  }
  return remainder === 1;
}

// ---- when two spellings are the same value ----

const digitsOf = (s: string) => s.replace(/\D/g, '');

const NORMALISE: Readonly<Record<PiiKind, (value: string) => string>> = {
  ssn: digitsOf,
  account: (v) => v.replace(/[^0-9a-z]/gi, '').toUpperCase(),
  // +1 (412) 555-0193 and 412-555-0193 are one number.
  phone: (v) => {
    const d = digitsOf(v);
    return d.length === 11 && d.startsWith('1') ? d.slice(1) : d;
  },
  email: (v) => v.trim().toLowerCase(),
  dob: normaliseDate,
  date: normaliseDate,
};

// ---- masking ----

/** What a masked value becomes: its placeholder family, and its identity within the family. */
interface Target {
  label: string;
  normalised: string;
  /** As written, for `restore`. */
  value: string;
}

/** What a phrase of a `terms` list, or a match of a `patterns` expression, becomes. */
interface NamedValues {
  label: string;
  pattern: RegExp;
  /** The value as it should be restored: a term's listed spelling, a pattern's match as written. */
  canonical: (match: string) => string;
}

const LABEL = /^[A-Z][A-Z0-9_]*$/;

function namedValues(options: RedactionOptions): NamedValues[] {
  const checkLabel = (label: string, what: string) => {
    if (!LABEL.test(label))
      throw new Error(
        `${what} label "${label}" must be upper case letters, digits and _ (it names the placeholder: [${label}_1])`,
      );
  };
  const out: NamedValues[] = [];
  for (const [label, phrases] of Object.entries(options.terms ?? {})) {
    checkLabel(label, 'terms');
    const listed = new Map(
      phrases.filter((p) => p.trim() !== '').map((p) => [p.trim().toLowerCase().replace(/\s+/g, ' '), p.trim()]),
    );
    if (listed.size === 0) continue;
    // Longest first, so "Acme Bank 12" is not read as "Acme Bank" followed by 12.
    const alternatives = [...listed.keys()]
      .sort((a, b) => b.length - a.length)
      .map((p) => escapeRegExp(p).replace(/\s+/g, '\\s+'));
    out.push({
      label,
      pattern: new RegExp(`(?<![\\w])(?:${alternatives.join('|')})(?![\\w])`, 'gi'),
      canonical: (m) => listed.get(m.toLowerCase().replace(/\s+/g, ' ')) ?? m,
    });
  }
  for (const [label, source] of Object.entries(options.patterns ?? {})) {
    checkLabel(label, 'patterns');
    let pattern: RegExp;
    try {
      pattern = new RegExp(source, 'g');
    } catch (e) {
      throw new Error(`patterns.${label}: ${(e as Error).message}`);
    }
    if (pattern.test('')) throw new Error(`patterns.${label} (${source}) matches empty text: it must match a value`);
    out.push({ label, pattern, canonical: (m) => m });
  }
  return out;
}

/** A span of plain text one detector has taken; `target` null keeps it as it is (its kind is not masked). */
interface Claim {
  start: number;
  end: number;
  target: Target | null;
  /** Put around the placeholder: a quote where it replaces a bare JSON number. */
  quote: string;
}

const targetOf = (kind: PiiKind, value: string): Target => ({
  label: kind.toUpperCase(),
  normalised: NORMALISE[kind](value),
  value,
});
const escapeRegExp = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** `"key": "value"` and `"key": 123`, also with escaped quotes (JSON inside a JSON string). */
function keyedValuePattern(keys: Iterable<string>): RegExp | null {
  const names = [...keys].map(escapeRegExp).join('|');
  if (names === '') return null;
  return new RegExp(
    String.raw`(?<esc>\\?)"(?<key>${names})\k<esc>"\s*:\s*(?:\k<esc>"(?<text>(?:[^"\\]|\\.)*?)\k<esc>"|(?<number>-?\d+(?:\.\d+)?)(?![\w.]))`,
    'gid',
  );
}

/** JSON objects and arrays (bare JSON scalars are left to the text rules). */
function parseJsonContainer(s: string): unknown {
  if (!/^\s*[[{]/.test(s)) return undefined;
  try {
    return JSON.parse(s) as unknown;
  } catch {
    return undefined;
  }
}

/** A message with `f` applied to its text: its content and its tool calls' arguments. */
export function mapMessageText(m: Message, f: (text: string) => string): Message {
  const out: Message = { ...m, content: m.content === null ? null : f(m.content) };
  if (m.tool_calls)
    out.tool_calls = m.tool_calls.map((c) => ({
      ...c,
      function: { ...c.function, arguments: f(c.function.arguments) },
    }));
  return out;
}

/** Masks personal data consistently: one Redactor maps each distinct value to the same placeholder, e.g. [PHONE_1], [SSN_1], [EMAIL_2], [ACCOUNT_1], [DOB_1], [PIN_1] (key-masked values use the key's kind, or the upper-cased key name when it has no kind). */
export class Redactor {
  /** How many values of each kind were masked so far: every occurrence counts, under the placeholder's name in lower case ('phone', 'pin'). */
  readonly counts: Record<string, number> = {};
  private readonly kinds: ReadonlySet<PiiKind>;
  private readonly keys: ReadonlySet<string>;
  private readonly keyedValue: RegExp | null;
  private readonly named: NamedValues[];
  /** label + normalised value → placeholder */
  private readonly placeholders = new Map<string, string>();
  /** placeholder → the value as first written */
  private readonly originals = new Map<string, string>();
  private readonly issued = new Map<string, number>();
  private readonly sessionValues: boolean;
  /** Values the conversation revealed under personal keys (`learn`), as targets, and the pattern that finds them in text. */
  private readonly learnt = new Map<string, Target>();
  private learntPattern: RegExp | null = null;
  /** The normalised dates of birth learnt: a date anywhere that is one of them is masked as [DOB_n]. */
  private readonly dobs = new Set<string>();

  constructor(options: RedactionOptions = DEFAULT_REDACTION) {
    this.sessionValues = options.sessionValues ?? false;
    this.kinds = new Set(options.kinds);
    this.keys = new Set(options.keys.map((k) => k.toLowerCase()));
    this.keyedValue = keyedValuePattern(new Set([...this.keys, ...(this.kinds.has('dob') ? DOB_KEYS : [])]));
    this.named = namedValues(options);
  }

  text(s: string): string {
    const json = parseJsonContainer(s);
    if (json === undefined) return this.plainText(s);
    const redacted = JSON.stringify(this.jsonValue(json, null));
    return redacted === JSON.stringify(json) ? s : redacted; // untouched JSON keeps its formatting
  }

  message(m: Message): Message {
    return mapMessageText(m, (s) => this.text(s));
  }

  /** A conversation masked; with `sessionValues`, the personal values it reveals are learnt from all of it first. */
  messages(ms: Message[]): Message[] {
    if (this.sessionValues) this.learn(ms);
    return ms.map((m) => this.message(m));
  }

  /**
   * Learns the values `ms` reveals under personal keys (SESSION_KEYS and the masked `keys`): in JSON
   * (a tool result's profile, a form's fields, call arguments), as "key": "value" inside text, and as
   * "Name: ..." in prose. Each is then masked wherever it appears, as a whole word, in any case.
   */
  learn(ms: Message[]): void {
    const add = (label: string, value: string) => {
      const v = value.trim();
      if (
        v.length < 2 ||
        PLACEHOLDER.test(v) ||
        /^(?:null|none|n\/a|unknown|true|false)$/i.test(v) ||
        /^\d{1,2}$/.test(v)
      )
        return;
      const kind = label.toLowerCase() as PiiKind;
      const target =
        kind in NORMALISE ? targetOf(kind, v) : { label, normalised: v.toLowerCase().replace(/\s+/g, ' '), value: v };
      if (label === 'DOB') this.dobs.add(target.normalised);
      this.learnt.set(v.toLowerCase().replace(/\s+/g, ' '), target);
    };
    const labelOf = (key: string): string | null => {
      const k = key.toLowerCase();
      if (SESSION_KEYS[k]) return SESSION_KEYS[k]!;
      if (!this.keys.has(k)) return null;
      const kind = KEY_KINDS[k];
      return kind ? kind.toUpperCase() : k.toUpperCase().replace(/[^A-Z0-9]+/g, '_');
    };
    const walk = (value: unknown, key: string | null): void => {
      if (typeof value === 'string' || typeof value === 'number') {
        const label = key === null ? null : labelOf(key);
        if (label) add(label, String(value));
        else if (typeof value === 'string') readText(value);
      } else if (Array.isArray(value)) value.forEach((v) => walk(v, key));
      else if (value !== null && typeof value === 'object') for (const [k, v] of Object.entries(value)) walk(v, k);
    };
    const keyed = keyedValuePattern(new Set([...Object.keys(SESSION_KEYS), ...this.keys]));
    const readText = (text: string): void => {
      const json = parseJsonContainer(text);
      if (json !== undefined) return walk(json, null);
      for (const m of keyed ? text.matchAll(keyed) : []) {
        const label = labelOf(m.groups!.key!);
        if (label) add(label, m.groups!.text ?? m.groups!.number!);
      }
      // The value runs to the end of its line or clause; a sentence's full stop is not part of it.
      for (const m of text.matchAll(PROSE_VALUE))
        add(PROSE_LABELS[m[1]!.toLowerCase()] ?? 'NAME', m[2]!.replace(/[.!?\s]+$/, ''));
    };
    for (const m of ms) {
      if (m.content) readText(m.content);
      for (const c of m.tool_calls ?? []) readText(c.function.arguments);
    }
    const values = [...this.learnt.keys()]
      .sort((a, b) => b.length - a.length)
      .map((v) => escapeRegExp(v).replace(/\s+/g, '\\s+'));
    this.learntPattern = values.length
      ? new RegExp(`(?<![\\w@.-])(?:${values.join('|')})(?![\\w@-]|\\.\\w)`, 'gi')
      : null;
  }

  /**
   * Puts back the values behind this Redactor's placeholders (a sampler's reply must dial the real number),
   * each as it was first written. Placeholders it did not issue stay.
   */
  restore(text: string): string {
    return text.replace(PLACEHOLDERS, (p) => this.originals.get(p) ?? p);
  }

  /** `restore` over a message's content and its tool calls' arguments. */
  restoreMessage(m: Message): Message {
    return mapMessageText(m, (s) => this.restore(s));
  }

  private placeholder(target: Target): string {
    const id = `${target.label}\u0000${target.normalised}`;
    let p = this.placeholders.get(id);
    if (p === undefined) {
      const n = (this.issued.get(target.label) ?? 0) + 1;
      this.issued.set(target.label, n);
      p = `[${target.label}_${n}]`;
      this.placeholders.set(id, p);
      this.originals.set(p, target.value);
    }
    const name = target.label.toLowerCase();
    this.counts[name] = (this.counts[name] ?? 0) + 1;
    return p;
  }

  /** The target of a value under a JSON key, or null when the key does not mask it. */
  private keyedTarget(key: string, value: string): Target | null {
    const k = key.toLowerCase();
    const v = value.trim();
    if (v === '' || PLACEHOLDER.test(v)) return null;
    if (this.keys.has(k)) {
      const kind = KEY_KINDS[k];
      return kind ? targetOf(kind, v) : { label: k.toUpperCase().replace(/[^A-Z0-9]+/g, '_'), normalised: v, value: v };
    }
    if (this.kinds.has('dob') && DOB_KEYS.has(k) && WHOLE_DATE.test(v)) return targetOf('dob', v);
    return null;
  }

  /** Array elements inherit their array's key, so `"emails": [...]` is masked like `"email": "..."`. */
  private jsonValue(value: unknown, key: string | null): unknown {
    if (typeof value === 'string') {
      const target = key === null ? null : this.keyedTarget(key, value);
      return target ? this.placeholder(target) : this.text(value);
    }
    if (typeof value === 'number') {
      const target = key === null ? null : this.keyedTarget(key, String(value));
      if (target) return this.placeholder(target);
      // Past 2^53 the parse already lost digits; such a run is card-number-sized, as in free text.
      if (Number.isInteger(value) && !Number.isSafeInteger(value) && this.kinds.has('account'))
        return this.placeholder(targetOf('account', String(value)));
      return value;
    }
    if (Array.isArray(value)) return value.map((v) => this.jsonValue(v, key));
    if (value !== null && typeof value === 'object') {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, this.jsonValue(v, k)]));
    }
    return value;
  }

  /** Keyed values first, then named terms and patterns, then the detectors in priority order; placeholders are issued in reading order. */
  private plainText(s: string): string {
    const claims: Claim[] = [];
    const claim = (c: Claim) => {
      if (!claims.some((o) => c.start < o.end && o.start < c.end)) claims.push(c);
    };
    if (this.keyedValue) {
      for (const m of s.matchAll(this.keyedValue)) {
        const g = m.groups!;
        const value = g.text ?? g.number!;
        const target = this.keyedTarget(g.key!, value);
        const [start, end] = m.indices!.groups![g.text !== undefined ? 'text' : 'number']!;
        if (target) claim({ start, end, target, quote: g.text !== undefined ? '' : `${g.esc}"` });
      }
    }
    if (this.learntPattern) {
      for (const m of s.matchAll(this.learntPattern)) {
        const target = this.learnt.get(m[0].toLowerCase().replace(/\s+/g, ' '));
        if (target) claim({ start: m.index, end: m.index + m[0].length, target, quote: '' });
      }
    }
    for (const n of this.named) {
      for (const m of s.matchAll(n.pattern)) {
        if (m[0] === '' || PLACEHOLDER.test(m[0])) continue;
        const value = n.canonical(m[0]);
        claim({
          start: m.index,
          end: m.index + m[0].length,
          target: { label: n.label, normalised: value.toLowerCase(), value },
          quote: '',
        });
      }
    }
    for (const d of DETECTORS) {
      for (const m of s.matchAll(d.pattern)) {
        if (d.accept && !d.accept(m[0])) continue;
        // A date that is a date of birth the conversation revealed gets that DOB's placeholder.
        const kind = d.kind === 'date' && this.kinds.has('dob') && this.dobs.has(normaliseDate(m[0])) ? 'dob' : d.kind;
        claim({
          start: m.index,
          end: m.index + m[0].length,
          target: this.kinds.has(kind) ? targetOf(kind, m[0]) : null,
          quote: '',
        });
      }
    }
    if (claims.length === 0) return s;
    claims.sort((a, b) => a.start - b.start);
    let out = '';
    let at = 0;
    for (const c of claims) {
      out +=
        s.slice(at, c.start) + (c.target ? c.quote + this.placeholder(c.target) + c.quote : s.slice(c.start, c.end));
      at = c.end;
    }
    return out + s.slice(at);
  }
}

/** The `redaction` section of a stage's config: what is masked before text leaves the machine. */
export const redactionConfig = z.strictObject({
  enabled: z
    .boolean()
    .default(true)
    .describe('Mask personal data before a request leaves the machine; false sends the texts as logged.'),
  kinds: z
    .array(z.enum(PII_KINDS as [PiiKind, ...PiiKind[]]))
    .default([...DEFAULT_REDACTION.kinds])
    .describe(
      'Kinds of personal data masked wherever they appear in free text: ssn, account (account, card and IBAN numbers), phone, email, dob (a date after a cue such as "born"), date (any other date with a day, month and year: [DATE_n], or [DOB_n] when it is a date of birth the conversation revealed).',
    ),
  keys: z
    .array(z.string().min(1))
    .default([...DEFAULT_REDACTION.keys])
    .describe('JSON keys whose values are masked whatever they look like.'),
  session_values: z
    .boolean()
    .default(true)
    .describe(
      'Also mask, wherever it appears in a conversation, every value the conversation reveals under a personal key (a profile\'s name and address, a form\'s date of birth; in JSON or as "Name: ..."), whatever the text around it.',
    ),
});
export type RedactionConfig = z.infer<typeof redactionConfig>;

/** A fresh Redactor per request, as the endpoint wants it; null when redaction is off. */
export function redactorFactory(cfg: RedactionConfig): (() => Redactor) | null {
  return cfg.enabled
    ? () => new Redactor({ kinds: cfg.kinds, keys: cfg.keys, sessionValues: cfg.session_values })
    : null;
}
