// Dates written in the ways people and logs write them ("2024-05-20", "05/20/2024", "20.05.2024",
// "May 20th", "20 May 2024"): read to one spelling, so that two spellings of a day are one value. Redaction
// gives them one placeholder; the rules judge grounds a call's date in the user's words.

/** A month's name or abbreviation, with an optional full stop (as a regular-expression source, non-capturing). */
export const MONTH = String.raw`(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?`;

const MONTHS = ['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'];
const monthOf = (name: string) => MONTHS.indexOf(name.slice(0, 3).toLowerCase()) + 1;
const pad2 = (n: number | string) => String(n).padStart(2, '0');

/** A date as YYYY-MM-DD where it can be read, so '01/14/1965' and 'January 14, 1965' are one value; otherwise the text, lower-cased. */
export function normaliseDate(s: string): string {
  const t = s.trim().toLowerCase().replace(/\s+/g, ' ');
  const iso = (y: string, m: string | number, d: string) => `${y}-${pad2(m)}-${pad2(d)}`;
  let m: RegExpExecArray | null;
  if ((m = /^(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})$/.exec(t))) return iso(m[1]!, m[2]!, m[3]!);
  if ((m = /^(\d{1,2})([-/.])(\d{1,2})[-/.](\d{2,4})$/.exec(t))) {
    // Dotted dates are day-first (European); others month-first (American) unless that cannot be.
    const dayFirst = m[2] === '.' || Number(m[1]) > 12;
    return dayFirst ? iso(m[4]!, m[3]!, m[1]!) : iso(m[4]!, m[1]!, m[3]!);
  }
  if ((m = /^([a-z]+)\.? (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})$/.exec(t)) && monthOf(m[1]!) > 0)
    return iso(m[3]!, monthOf(m[1]!), m[2]!);
  if ((m = /^(\d{1,2})(?:st|nd|rd|th)? (?:of )?([a-z]+)\.?,? (\d{4})$/.exec(t)) && monthOf(m[2]!) > 0)
    return iso(m[3]!, monthOf(m[2]!), m[1]!);
  if ((m = /^([a-z]+)\.? (\d{4})$/.exec(t)) && monthOf(m[1]!) > 0) return `${m[2]}-${pad2(monthOf(m[1]!))}`;
  return t;
}

// The four ways daysIn reads a day, made once (matchAll matches on a copy: the shared objects keep no state).
const ISO_DAY = /(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)/g;
const SLASHED_DAY = /(?<![\d.])(\d{1,2})\/(\d{1,2})(?:\/(\d{4}|\d{2}))?(?![\d/])/g;
const MONTH_DAY = new RegExp(String.raw`\b(${MONTH})\s+(\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(\d{4}))?\b`, 'gi');
const DAY_MONTH = new RegExp(String.raw`\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(${MONTH})(?:,?\s+(\d{4}))?\b`, 'gi');

/**
 * The days a text names anywhere in it, as `MM-DD` and, where it gives the year, `YYYY-MM-DD`: "2024-05-20",
 * "05/20/2024", "May 20th", "20 May 2024" all name 05-20.
 */
export function daysIn(text: string): Set<string> {
  const out = new Set<string>();
  const add = (y: string | undefined, m: number, d: number) => {
    if (m < 1 || m > 12 || d < 1 || d > 31) return;
    out.add(`${pad2(m)}-${pad2(d)}`);
    if (y) out.add(`${y.length === 2 ? `20${y}` : y}-${pad2(m)}-${pad2(d)}`);
  };
  for (const m of text.matchAll(ISO_DAY)) add(m[1], Number(m[2]), Number(m[3]));
  for (const m of text.matchAll(SLASHED_DAY)) add(m[3], Number(m[1]), Number(m[2]));
  for (const m of text.matchAll(MONTH_DAY)) add(m[3], monthOf(m[1]!), Number(m[2]));
  for (const m of text.matchAll(DAY_MONTH)) add(m[3], monthOf(m[2]!), Number(m[1]));
  return out;
}
