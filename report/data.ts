// What the page's script draws: the plots' numbers and the pairs to browse, embedded in the page as JSON.
// The tables are written into the page as HTML (sections.ts); only what the reader works with in the browser
// travels here. Types only: the Node side (plots.ts, pairs.ts) writes them, client/ reads them.

/** One plot: a line a series over a shared x axis (a step, a night); null where a series has no value. */
export interface Plot {
  id: string;
  title: string;
  /** What it shows, in a sentence. */
  what: string;
  /** Where its numbers come from: a file of the workspace and what a point is. */
  source: string;
  xLabel: string;
  x: number[];
  series: { label: string; values: (number | null)[] }[];
}

/** A message as the pair browser shows it; `text` is an index into PairBrowser.texts. */
export interface BrowserMessage {
  role: string;
  text: number | null;
  calls?: { name: string; arguments: string }[];
  callId?: string;
}

export interface Verdict {
  winner: string;
  confidence: number;
  rationale: string;
}

export interface BrowserPair {
  id: string;
  split: string;
  source: string;
  type: string | null;
  task: string | null;
  /** The deciding judge ('' where none voted) and the confidence the gate read. */
  judge: string;
  confidence: number;
  /** null: the gate kept it; otherwise why it dropped it. */
  dropped: string | null;
  /** Indices into PairBrowser.messages: the pairs of a session share its messages, stored once. */
  prompt: number[];
  chosen: number[];
  rejected: number[];
  /** What each judge said, by name. */
  verdicts: Record<string, Verdict>;
}

export interface PairBrowser {
  /** How many pairs were judged in all, and how the ones here were picked from them. */
  total: number;
  picked: string;
  texts: string[];
  messages: BrowserMessage[];
  pairs: BrowserPair[];
}

export interface PageData {
  plots: Plot[];
  pairs: PairBrowser | null;
}
