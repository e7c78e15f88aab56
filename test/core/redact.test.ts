import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { findTask, generateWorld } from '../../env/world.ts';
import type { Message, Session } from '../../core/records.ts';
import { DEFAULT_REDACTION, PII_KINDS, Redactor } from '../../core/redact.ts';
import { airline, count, prose, retail } from '../fixtures/personal.ts';

const redact = (s: string) => new Redactor().text(s);

const toolResult = (content: unknown, id = 'call_2'): Message => ({
  role: 'tool',
  content: JSON.stringify(content),
  tool_call_id: id,
});
const toolCall = (name: string, args: unknown, id = 'call_3'): Message => ({
  role: 'assistant',
  content: null,
  tool_calls: [{ id, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
});
const argumentsOf = (m: Message) => JSON.parse(m.tool_calls![0]!.function.arguments) as Record<string, unknown>;

async function firstSampleSession(): Promise<Session> {
  for await (const s of readJsonl<Session>(join(__dirname, '..', '..', 'data', 'sample', 'sessions.jsonl.gz')))
    return s;
  throw new Error('the sample is empty');
}

/** Every string a message carries: its content and its tool-call arguments. */
const textsOf = (ms: Message[]) =>
  ms.flatMap((m) => [m.content ?? '', ...(m.tool_calls ?? []).map((c) => c.function.arguments)]).join('\n');

describe('Redactor in free text', () => {
  it('gives every spelling of one phone number one placeholder, and another number another', () => {
    expect(
      redact(
        'Call (412) 555-0193, 412-555-0193, 412.555.0193 or +1 (412) 555-0193; the desk is 1-800-306-8514; London +44 20 7946 0958.',
      ),
    ).toBe('Call [PHONE_1], [PHONE_1], [PHONE_1] or [PHONE_1]; the desk is [PHONE_2]; London [PHONE_3].');
  });

  it('masks full SSNs and the last four digits when the text says they are an SSN', () => {
    expect(redact('SSN 123-45-6789 (or 123 45 6789).')).toBe('SSN [SSN_1] (or [SSN_1]).');
    expect(redact('The SSN ending in 6789 is on file.')).toBe('The SSN ending in [SSN_1] is on file.');
    expect(redact('Here are the last 4 of my SSN: 0357, and my PIN.')).toBe(
      'Here are the last 4 of my SSN: [SSN_1], and my PIN.',
    );
    expect(redact('The last four digits of your SSN are 0357.')).toBe('The last four digits of your SSN are [SSN_1].');
  });

  it('masks account numbers: digit groups, card and bank numbers, IBANs, and numbers called an account number', () => {
    expect(redact('Account 6484-3494-092 and card 4111 1111 1111 1111.')).toBe(
      'Account [ACCOUNT_1] and card [ACCOUNT_2].',
    );
    expect(redact('Wire it from 000123456789 to GB82 WEST 1234 5698 7654 32.')).toBe(
      'Wire it from [ACCOUNT_1] to [ACCOUNT_2].',
    );
    expect(redact('My account number is 4417, account no. 55-12.')).toBe(
      'My account number is [ACCOUNT_1], account no. [ACCOUNT_2].',
    );
  });

  it('takes an IBAN-shaped word that fails the checksum for no account', () => {
    expect(redact('Code GB00 WEST 1234 5698 7654 32.')).toBe('Code GB00 WEST 1234 5698 7654 32.');
  });

  it('masks email addresses, the same address in any case as one', () => {
    expect(
      redact('Write to aisha.haddad85@example.com or AISHA.Haddad85@Example.com, cc ops+x@mail.example.co.uk.'),
    ).toBe('Write to [EMAIL_1] or [EMAIL_1], cc [EMAIL_2].');
  });

  it('masks a date after a birth cue, every date format of one day as one value', () => {
    const text =
      'I was born on January 14, 1965. DOB: 01/14/1965; date of birth is 14.01.1965; my birthday: 14 January 1965; born 1965-01-14; born in 1971.';
    expect(redact(text)).toBe(
      'I was born on [DOB_1]. DOB: [DOB_1]; date of birth is [DOB_1]; my birthday: [DOB_1]; born [DOB_1]; born in [DOB_2].',
    );
  });

  it('leaves reference numbers, ids, ZIP codes, counts, timestamps and years alone', () => {
    const text = [
      'Your reference number is REF-121089.',
      'Order ORD-123456, policy POL-1234567, member MBR-654321.',
      'ZIP 07819 (or 07819-1234).',
      'Task ended: 3 of 5 requests completed.',
      'Logged at 2026-01-01T00:00:00.000Z, version 1.2.3, address 10.0.0.1.',
      'Since 1999 we have served 12,345,678 customers; pi is 3.14159265.',
      'Your order number is 12345678 and the confirmation # 87654321.',
    ].join(' ');
    const r = new Redactor();
    expect(r.text(text)).toBe(text);
    expect(r.counts).toEqual({});
  });

  it('changes nothing in text it has already redacted, with this Redactor or a fresh one', () => {
    const r = new Redactor();
    const once = r.text(
      'Aisha, 412-555-0193, aisha@example.com, SSN ending in 0357, born 1965-01-14, account 6484-3494-092, {"pin": "2620"}',
    );
    expect(once).toBe(
      'Aisha, [PHONE_1], [EMAIL_1], SSN ending in [SSN_1], born [DOB_1], account [ACCOUNT_1], {"pin": "[PIN_1]"}',
    );
    expect(r.text(once)).toBe(once);
    expect(new Redactor().text(once)).toBe(once);
  });
});

describe('Redactor in JSON', () => {
  it('masks every value under a listed key at any depth, whatever its shape, keeping the key order', () => {
    const content = toolResult({
      account_number: '6484-3494-092',
      last_4_ssn: '0357',
      date_of_birth: '1965-01-14',
      zip_code: '07819',
      profile: { Email: 'aisha.haddad85@example.com', PIN: 2620, contacts: [{ phone_number: '412-555-0193' }] },
      pin: '2620',
    }).content!;
    expect(JSON.parse(new Redactor().text(content))).toEqual({
      account_number: '[ACCOUNT_1]',
      last_4_ssn: '[SSN_1]',
      date_of_birth: '[DOB_1]',
      zip_code: '07819',
      profile: { Email: '[EMAIL_1]', PIN: '[PIN_1]', contacts: [{ phone_number: '[PHONE_1]' }] },
      pin: '[PIN_1]',
    });
    expect(Object.keys(JSON.parse(new Redactor().text(content)))).toEqual([
      'account_number',
      'last_4_ssn',
      'date_of_birth',
      'zip_code',
      'profile',
      'pin',
    ]);
  });

  it('masks the elements of an array under a listed key', () => {
    expect(redact('{"pin":["2620","1111"],"fields":["pin","email"]}')).toBe(
      '{"pin":["[PIN_1]","[PIN_2]"],"fields":["pin","email"]}',
    );
  });

  it('names a key-masked value after the key when the key has no kind', () => {
    const r = new Redactor({ kinds: PII_KINDS, keys: ['member_id'] });
    expect(r.text('{"member_id":"MBR-123456"}')).toBe('{"member_id":"[MEMBER_ID_1]"}');
    expect(r.counts).toEqual({ member_id: 1 });
  });

  it('masks a birth date under birth_date though the key is not listed, and only when it is a date', () => {
    expect(redact('{"birth_date":"January 14, 1965","birthdate":"unknown"}')).toBe(
      '{"birth_date":"[DOB_1]","birthdate":"unknown"}',
    );
  });

  it('masks free text inside JSON strings by the text rules', () => {
    expect(redact('{"request":"Text 412-555-0193 when done","count":12345678}')).toBe(
      '{"request":"Text [PHONE_1] when done","count":12345678}',
    );
  });

  it('keeps tool-call arguments valid JSON and their other fields as they were', () => {
    const args = {
      phone_number: '1-800-306-8514',
      auth: { email: 'aisha.haddad85@example.com', pin: '2620' },
      request: "I'd like to reset my online password.",
    };
    const out = new Redactor().message(toolCall('call', args));
    expect(out.tool_calls![0]!.id).toBe('call_3');
    expect(out.tool_calls![0]!.function.name).toBe('call');
    expect(argumentsOf(out)).toEqual({
      phone_number: '[PHONE_1]',
      auth: { email: '[EMAIL_1]', pin: '[PIN_1]' },
      request: args.request,
    });
  });

  it('falls back to "key": value patterns in text that is not valid JSON, quoting a masked number', () => {
    expect(redact('Form sent: {"pin": "2620", "email":"a@b.co", "account_number": 12345, "zip_code": "07819"')).toBe(
      'Form sent: {"pin": "[PIN_1]", "email":"[EMAIL_1]", "account_number": "[ACCOUNT_1]", "zip_code": "07819"',
    );
    expect(redact('args were "{\\"pin\\":\\"2620\\"}" (truncated')).toBe(
      'args were "{\\"pin\\":\\"[PIN_1]\\"}" (truncated',
    );
  });

  it('leaves JSON it has nothing to mask in exactly as it was written', () => {
    const pretty = JSON.stringify({ company: 'Virtucon Bank', zip_code: '07819' }, null, 2);
    expect(redact(pretty)).toBe(pretty);
  });
});

describe('Redactor across messages', () => {
  const directory = toolResult(
    {
      company: 'Virtucon Bank',
      departments: [
        { name: 'Billing', phone: '1-800-242-2349' },
        { name: 'Account Security', phone: '1-800-306-8514' },
      ],
    },
    'call_1',
  );

  it('gives the number an agent dialled the placeholder the directory gave it, and a made-up number another', () => {
    const [dir, dialled, madeUp] = new Redactor().messages([
      directory,
      toolCall('call', { phone_number: '1-800-306-8514' }),
      toolCall('call', { phone_number: '1-800-111-2222' }),
    ]);
    const phones = (JSON.parse(dir!.content!) as { departments: { phone: string }[] }).departments.map((d) => d.phone);
    expect(phones).toEqual(['[PHONE_1]', '[PHONE_2]']);
    expect(argumentsOf(dialled!).phone_number).toBe('[PHONE_2]');
    expect(argumentsOf(madeUp!).phone_number).toBe('[PHONE_3]');
  });

  it('restarts numbering in a fresh Redactor', () => {
    const r = new Redactor();
    r.text('a@example.com');
    expect(r.text('b@example.com')).toBe('[EMAIL_2]');
    expect(new Redactor().text('b@example.com')).toBe('[EMAIL_1]');
  });

  it('returns new messages and leaves the ones it was given untouched', () => {
    const user: Message = {
      role: 'user',
      content: 'Good morning, Aisha Haddad here. Call me on 412-555-0193.',
      name: 'aisha',
    };
    const before = structuredClone(user);
    const [out] = new Redactor().messages([user]);
    expect(out).toEqual({
      role: 'user',
      content: 'Good morning, Aisha Haddad here. Call me on [PHONE_1].',
      name: 'aisha',
    });
    expect(user).toEqual(before);
  });

  it('counts every masked occurrence by kind, and key names for keys without a kind', () => {
    const r = new Redactor();
    r.messages([
      directory,
      toolCall('call', { phone_number: '1-800-306-8514', auth: { pin: '2620', last_4_ssn: '0357' } }),
      { role: 'user', content: 'SSN ending in 0357' },
    ]);
    expect(r.counts).toEqual({ phone: 3, pin: 1, ssn: 2 });
  });

  it('restores the values behind its own placeholders, as first written, and leaves others', () => {
    const r = new Redactor();
    const [dir] = r.messages([directory]);
    const reply = `Dialling ${(JSON.parse(dir!.content!) as { departments: { phone: string }[] }).departments[1]!.phone} about [EMAIL_9].`;
    expect(reply).toBe('Dialling [PHONE_2] about [EMAIL_9].');
    expect(r.restore(reply)).toBe('Dialling 1-800-306-8514 about [EMAIL_9].');
    expect(new Redactor().restore(reply)).toBe(reply);
  });

  it('masks only the chosen kinds, and does not let another kind take a value it leaves alone', () => {
    const r = new Redactor({ kinds: ['email'], keys: [] });
    expect(r.text('Call 1-800-306-8514 or mail a@example.com; SSN 123-45-6789; born 1965-01-14; {"pin":"2620"}')).toBe(
      'Call 1-800-306-8514 or mail [EMAIL_1]; SSN 123-45-6789; born 1965-01-14; {"pin":"2620"}',
    );
  });

  it('masks named terms as whole words in any case, the longest first, and restores them as listed', () => {
    const r = new Redactor({ kinds: [], keys: [], terms: { COMPANY: ['Acme Air', 'Acme Airways', 'Acme Air 12'] } });
    const text = r.text('Call acme  AIR, then Acme Airways, then Acme Air 12; not Acme Airlines or FooAcme Air.');
    expect(text).toBe('Call [COMPANY_1], then [COMPANY_2], then [COMPANY_3]; not Acme Airlines or FooAcme Air.');
    expect(r.text('{"company":"ACME AIR","departments":[{"name":"Acme Air Billing"}]}')).toBe(
      '{"company":"[COMPANY_1]","departments":[{"name":"[COMPANY_1] Billing"}]}',
    );
    expect(r.restore('{"company":"[COMPANY_1]"}')).toBe('{"company":"Acme Air"}');
  });

  it("masks a pattern's matches, one placeholder per distinct value, before the detectors see them", () => {
    const r = new Redactor({ ...DEFAULT_REDACTION, patterns: { REF: String.raw`REF-\d+` } });
    expect(r.text('Your reference number is REF-004211. Call 1-800-306-8514 with REF-004211 and REF-1.')).toBe(
      'Your reference number is [REF_1]. Call [PHONE_1] with [REF_1] and [REF_2].',
    );
    expect(r.restore('[REF_2]')).toBe('REF-1');
  });

  it('refuses a label that cannot name a placeholder, an expression that does not compile, and one that matches nothing', () => {
    expect(() => new Redactor({ kinds: [], keys: [], terms: { company: ['Acme'] } })).toThrow(
      /terms label "company" must be upper case/,
    );
    expect(() => new Redactor({ kinds: [], keys: [], patterns: { REF: 'REF-(' } })).toThrow(
      /patterns\.REF: .*Unterminated group/,
    );
    expect(() => new Redactor({ kinds: [], keys: [], patterns: { REF: '\\d*' } })).toThrow(
      /patterns\.REF .* matches empty text/,
    );
  });

  it('masks every date with a day, month and year, one placeholder per day in any format', () => {
    const text = 'Fly out 2024-05-20, back on May 27, 2024; the 05/20/2024 fare; 27 May 2024 is a Monday; since 2019.';
    expect(redact(text)).toBe(
      'Fly out [DATE_1], back on [DATE_2]; the [DATE_1] fare; [DATE_2] is a Monday; since 2019.',
    );
  });

  it('lists all six kinds and the profile keys by default', () => {
    expect(DEFAULT_REDACTION.kinds).toEqual(['ssn', 'account', 'phone', 'email', 'dob', 'date']);
    expect(new Redactor().text('{"Social_Security_Number":"123456789","DOB":"1965-01-14"}')).toBe(
      '{"Social_Security_Number":"[SSN_1]","DOB":"[DOB_1]"}',
    );
  });
});

describe('Redactor on a sample session', () => {
  it("leaves none of the user's profile in it, but keeps reference numbers and department names", async () => {
    const session = await firstSampleSession();
    const profile = findTask(generateWorld(), session.task_id!).profile.values;
    const before = textsOf(session.messages);
    const redactor = new Redactor();
    const redacted = redactor.messages(session.messages);
    const after = JSON.stringify(redacted);

    for (const value of [profile.email, profile.date_of_birth, profile.account_number]) {
      expect(before).toContain(value);
      expect(after).not.toContain(value);
    }
    for (const value of [profile.last_4_ssn, profile.pin]) {
      expect(before).toContain(`"${value}"`);
      expect(textsOf(redacted)).not.toContain(`"${value}"`);
    }
    const references = before.match(/REF-\d{6}/g)!;
    expect(references.length).toBeGreaterThan(0);
    for (const ref of references) expect(after).toContain(ref);
    const departments = (
      JSON.parse(session.messages.find((m) => m.tool_call_id === 'call_1')!.content!) as {
        departments: { name: string }[];
      }
    ).departments;
    for (const d of departments) expect(after).toContain(d.name);
    for (const m of redacted)
      for (const c of m.tool_calls ?? []) expect(() => JSON.parse(c.function.arguments)).not.toThrow();
    expect(redactor.messages(redacted)).toEqual(redacted);
  });

  it('dials in the redacted session the placeholder the redacted directory lists for that department', async () => {
    const session = await firstSampleSession();
    const redacted = new Redactor().messages(session.messages);
    type Directory = { departments: { name: string; phone: string }[] };
    const directoryAt = session.messages.findIndex((m) => m.tool_call_id === 'call_1');
    const original = (JSON.parse(session.messages[directoryAt]!.content!) as Directory).departments;
    const masked = (JSON.parse(redacted[directoryAt]!.content!) as Directory).departments;
    const calls = session.messages.flatMap((m, i) => (m.tool_calls?.[0]?.function.name === 'call' ? [i] : []));
    expect(calls.length).toBeGreaterThan(0);
    for (const i of calls) {
      const department = original.findIndex((d) => d.phone === argumentsOf(session.messages[i]!).phone_number);
      expect(argumentsOf(redacted[i]!).phone_number).toBe(masked[department]!.phone);
      expect(masked[department]!.phone).toMatch(/^\[PHONE_\d+\]$/);
    }
  });
});

describe('Redactor on what a conversation reveals about a person (sessionValues)', () => {
  it('masks every value the conversation reveals, wherever and however it reappears, with one placeholder each', () => {
    for (const conversation of [airline, prose, retail]) {
      const before = JSON.stringify(conversation);
      expect(count(before)).toBeGreaterThan(3);
      const masked = new Redactor().messages(conversation);
      expect(count(JSON.stringify(masked)), JSON.stringify(masked)).toBe(0);
    }
    const masked = new Redactor().messages(airline);
    // The date of birth is one value in JSON, after "remains:" and spelt out: one placeholder.
    expect(masked[4]!.content).toBe(
      'Thanks [NAME_1] [NAME_2]. Date of Birth remains: [DOB_1], and the passenger record reads [NAME_2]/[NAME_1], born [DOB_1], passport [PASSPORT_1].',
    );
    expect(JSON.parse(masked[3]!.content!)).toMatchObject({
      dob: '[DOB_1]',
      name: { first_name: '[NAME_1]', last_name: '[NAME_2]' },
      address: { city: 'Austin' },
    });
    // Tool names and arguments stay valid.
    expect(masked[2]!.tool_calls![0]!.function.name).toBe('get_user_details');
  });

  it('is off unless asked: a model reads the values it must copy as they are', () => {
    const plain = new Redactor({ kinds: ['phone'], keys: [] }).messages(retail);
    expect(plain[1]!.content).toContain('Ana López');
  });
});
