// Answers of costly requests (judge verdicts, sampled completions) kept on disk by key, appended as they
// arrive: a rerun pays nothing for what was answered, and an interrupted run resumes where it stopped.
import { existsSync } from 'node:fs';
import { appendFile, open } from 'node:fs/promises';
import { JsonlWriter, readLines } from './jsonl.ts';

export class AnswerCache<V> {
  private constructor(
    private readonly answers: Map<string, V>,
    private readonly writer: JsonlWriter,
    /** Lines that could not be read back (a run killed mid-write): skipped, and asked again. */
    readonly unreadable: number,
  ) {}

  static async open<V>(path: string): Promise<AnswerCache<V>> {
    const answers = new Map<string, V>();
    let unreadable = 0;
    if (existsSync(path)) {
      for await (const { text } of readLines(path)) {
        if (!text) continue;
        try {
          const { k, v } = JSON.parse(text) as { k: string; v: V };
          answers.set(k, v);
        } catch {
          unreadable++;
        }
      }
    }
    if (await endsMidLine(path)) await appendFile(path, '\n'); // so the next answer starts a line of its own
    return new AnswerCache(answers, new JsonlWriter(path, 'a'), unreadable);
  }

  get size(): number {
    return this.answers.size;
  }

  get(key: string): V | undefined {
    return this.answers.get(key);
  }

  async put(key: string, value: V): Promise<void> {
    this.answers.set(key, value);
    await this.writer.write({ k: key, v: value });
  }

  async close(): Promise<void> {
    await this.writer.close();
  }
}

async function endsMidLine(path: string): Promise<boolean> {
  if (!existsSync(path)) return false;
  const file = await open(path, 'r');
  try {
    const { size } = await file.stat();
    if (size === 0) return false;
    const last = Buffer.alloc(1);
    await file.read(last, 0, 1, size - 1);
    return last[0] !== 0x0a;
  } finally {
    await file.close();
  }
}
