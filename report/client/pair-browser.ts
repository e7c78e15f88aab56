// The pair browser: filter the judged pairs by source, negative type, deciding judge, gate decision, split and
// confidence; pick one to read its shared prompt, chosen and rejected side by side (tool calls shown), and
// what each judge said.
import type { BrowserMessage, BrowserPair, PairBrowser } from '../data.ts';

const PAGE = 50;
/** The prompt's last messages shown at first; the rest open on request. */
const PROMPT_TAIL = 4;

type Child = Node | string | null | undefined | false;

function h(tag: string, attrs: Record<string, string> = {}, ...children: Child[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined && c !== false) el.append(c);
  return el;
}

interface Filters {
  source: string;
  type: string;
  judge: string;
  decision: string;
  split: string;
  min: number;
  max: number;
  text: string;
}

const ALL = '';

export function pairBrowser(root: HTMLElement, data: PairBrowser): void {
  const pairs = data.pairs;
  const text = (i: number | null) => (i === null ? null : data.texts[i]!);
  const messages = (ids: number[]) => ids.map((i) => data.messages[i]!);
  const filters: Filters = { source: ALL, type: ALL, judge: ALL, decision: ALL, split: ALL, min: 0, max: 1, text: '' };
  let page = 0;
  let selected: BrowserPair | null = pairs[0] ?? null;

  const choice = (name: keyof Filters, label: string, values: string[], show: (v: string) => string = (v) => v) => {
    const select = h(
      'select',
      { name },
      h('option', { value: ALL }, 'all'),
      ...values.map((v) => h('option', { value: v }, show(v))),
    );
    select.addEventListener('change', () => {
      (filters[name] as string) = (select as HTMLSelectElement).value;
      page = 0;
      render();
    });
    return h('label', {}, `${label} `, select);
  };
  const distinct = (f: (p: BrowserPair) => string) => [...new Set(pairs.map(f))].sort();
  const range = (name: 'min' | 'max', label: string) => {
    const input = h('input', { type: 'number', name, min: '0', max: '1', step: '0.05', value: String(filters[name]) });
    input.addEventListener('input', () => {
      const v = Number((input as HTMLInputElement).value);
      if (Number.isFinite(v)) filters[name] = v;
      page = 0;
      render();
    });
    return h('label', {}, `${label} `, input);
  };
  const search = h('input', { type: 'search', name: 'text', placeholder: 'pair or task id' });
  search.addEventListener('input', () => {
    filters.text = (search as HTMLInputElement).value.trim();
    page = 0;
    render();
  });

  const count = h('p', { class: 'count' });
  const list = h('div', { class: 'pair-list' });
  const detail = h('div', { class: 'pair-detail' });
  root.append(
    h('p', { class: 'note' }, `${pairs.length} pairs here: ${data.picked}.`),
    h(
      'div',
      { class: 'filters' },
      choice(
        'source',
        'source',
        distinct((p) => p.source),
      ),
      choice(
        'type',
        'negative type',
        distinct((p) => p.type ?? '—'),
      ),
      choice(
        'judge',
        'judge',
        distinct((p) => p.judge),
        (v) => v || '(none voted)',
      ),
      choice('decision', 'gate', ['kept', 'dropped']),
      choice(
        'split',
        'split',
        distinct((p) => p.split),
      ),
      range('min', 'confidence from'),
      range('max', 'to'),
      h('label', {}, 'find ', search),
    ),
    count,
    list,
    detail,
  );

  const matches = () =>
    pairs.filter(
      (p) =>
        (filters.source === ALL || p.source === filters.source) &&
        (filters.type === ALL || (p.type ?? '—') === filters.type) &&
        (filters.judge === ALL || p.judge === filters.judge) &&
        (filters.decision === ALL || (p.dropped === null ? 'kept' : 'dropped') === filters.decision) &&
        (filters.split === ALL || p.split === filters.split) &&
        p.confidence >= filters.min &&
        p.confidence <= filters.max &&
        (filters.text === '' || p.id.includes(filters.text) || (p.task ?? '').includes(filters.text)),
    );

  function render(): void {
    const found = matches();
    const pages = Math.max(1, Math.ceil(found.length / PAGE));
    page = Math.min(page, pages - 1);
    if (!selected || !found.includes(selected)) selected = found[0] ?? null;
    count.textContent = `${found.length} of ${pairs.length} pairs match.`;
    const rows = found.slice(page * PAGE, (page + 1) * PAGE).map((p) => {
      const tr = h(
        'tr',
        { class: p === selected ? 'selected' : '', 'data-pair': p.id },
        h('td', {}, p.id.slice(0, 12)),
        h('td', {}, p.source),
        h('td', {}, p.type ?? '—'),
        h('td', {}, p.judge || '—'),
        h('td', { class: 'n' }, p.confidence.toFixed(3)),
        h('td', {}, p.dropped === null ? 'kept' : h('span', { class: 'bad', title: p.dropped }, 'dropped')),
        h('td', {}, p.split),
      );
      tr.addEventListener('click', () => {
        selected = p;
        render();
      });
      return tr;
    });
    const nav = h('div', { class: 'pager' });
    if (pages > 1) {
      const to = (n: number, label: string) => {
        const b = h('button', n === page ? { disabled: '' } : {}, label);
        b.addEventListener('click', () => {
          page = n;
          render();
        });
        return b;
      };
      nav.append(
        to(Math.max(0, page - 1), '‹ earlier'),
        ` page ${page + 1} of ${pages} `,
        to(Math.min(pages - 1, page + 1), 'later ›'),
      );
    }
    list.replaceChildren(
      h(
        'table',
        {},
        h(
          'thead',
          {},
          h('tr', {}, ...['pair', 'source', 'type', 'judge', 'confidence', 'gate', 'split'].map((c) => h('th', {}, c))),
        ),
        h('tbody', {}, ...rows),
      ),
      nav,
    );
    detail.replaceChildren(
      selected ? pairView(selected, messages, text) : h('p', { class: 'note' }, 'No pair matches.'),
    );
  }
  render();
}

function pairView(
  p: BrowserPair,
  messages: (ids: number[]) => BrowserMessage[],
  text: (i: number | null) => string | null,
): HTMLElement {
  const prompt = messages(p.prompt);
  const hidden = prompt.slice(0, Math.max(0, prompt.length - PROMPT_TAIL));
  const shown = prompt.slice(hidden.length);
  const verdicts = Object.entries(p.verdicts);
  const winner = (w: string) => (w === 'a' ? 'chosen' : w === 'b' ? 'rejected' : w);
  return h(
    'div',
    { class: 'pair', 'data-pair': p.id },
    h(
      'p',
      { class: 'pair-head' },
      h('b', {}, `pair ${p.id}`),
      ` · ${p.source}${p.type ? ` / ${p.type}` : ''} · task ${p.task ?? '—'} · ${p.split} · judge ${p.judge || '—'} · confidence ${p.confidence.toFixed(3)} · `,
      p.dropped === null ? 'kept by the gate' : h('span', { class: 'bad' }, `dropped: ${p.dropped}`),
    ),
    h(
      'div',
      { class: 'prompt' },
      h('h4', {}, `Shared prompt (${prompt.length} messages)`),
      hidden.length > 0 &&
        h(
          'details',
          {},
          h('summary', {}, `the ${hidden.length} earlier messages`),
          ...hidden.map((m) => message(m, text)),
        ),
      ...shown.map((m) => message(m, text)),
    ),
    h(
      'div',
      { class: 'sides' },
      h('div', { class: 'side chosen' }, h('h4', {}, 'Chosen'), ...messages(p.chosen).map((m) => message(m, text))),
      h(
        'div',
        { class: 'side rejected' },
        h('h4', {}, 'Rejected'),
        ...messages(p.rejected).map((m) => message(m, text)),
      ),
    ),
    h(
      'div',
      { class: 'verdicts' },
      h('h4', {}, 'What the judges said'),
      verdicts.length === 0
        ? h('p', { class: 'note' }, 'No judge’s verdict is recorded for this pair.')
        : h(
            'table',
            {},
            h(
              'thead',
              {},
              h(
                'tr',
                {},
                h('th', {}, 'judge'),
                h('th', {}, 'prefers'),
                h('th', { class: 'n' }, 'confidence'),
                h('th', {}, 'why'),
              ),
            ),
            h(
              'tbody',
              {},
              ...verdicts.map(([judge, v]) =>
                h(
                  'tr',
                  {},
                  h('td', {}, judge),
                  h('td', {}, winner(v.winner)),
                  h('td', { class: 'n' }, v.confidence.toFixed(3)),
                  h('td', {}, v.rationale ?? ''),
                ),
              ),
            ),
          ),
    ),
  );
}

function message(m: BrowserMessage, text: (i: number | null) => string | null): HTMLElement {
  const content = text(m.text);
  return h(
    'div',
    { class: `msg ${m.role}` },
    h('span', { class: 'role' }, m.role + (m.callId ? ` (answer to ${m.callId})` : '')),
    content !== null && h('pre', {}, content),
    ...(m.calls ?? []).map((c) => h('pre', { class: 'call' }, `→ ${c.name}(${c.arguments})`)),
  );
}
