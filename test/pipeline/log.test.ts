// The logger's progress: a bar on a terminal (cli-progress, loaded only then), elsewhere nothing until a
// log line is due.
import { describe, expect, it, vi } from 'vitest';
import { Logger } from '../../pipeline/log.ts';

/** A stream that keeps what is written, a terminal or not (a terminal's cursor moves are kept as nothing). */
function stream(isTTY: boolean) {
  const written: string[] = [];
  const out = {
    isTTY,
    columns: 100,
    write: (s: string) => (written.push(s), true),
    cursorTo: () => true,
    clearLine: () => true,
    moveCursor: () => true,
    on: () => out,
    removeListener: () => out,
  };
  return { out: out as unknown as NodeJS.WriteStream, written };
}

describe('progress', () => {
  it('draws a bar with the label and the count on a terminal', () => {
    const { out, written } = stream(true);
    const bar = new Logger('text', out).progress('pairs train', 4);
    bar.tick(3);
    bar.done();
    expect(written.join('')).toMatch(/pairs train \[[^\]]*\] 3\/4/);
  });

  it('writes nothing for a short run elsewhere', () => {
    const { out, written } = stream(false);
    const bar = new Logger('text', out).progress('pairs train', 4);
    bar.tick(4);
    bar.done();
    expect(written).toEqual([]);
  });
});

describe('progress of a resumed run', () => {
  it('counts the work done before as done, and only this run’s work in the rate and ETA', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      const { out, written } = stream(false);
      const bar = new Logger('json', out).progress('sft steps', 100, 90);
      vi.advanceTimersByTime(10_000);
      bar.tick(5);
      bar.done();
      const line = JSON.parse(written.join(''));
      expect(line).toMatchObject({ event: 'progress', done: 95, total: 100, rate_per_s: 1, eta_s: 10 });
    } finally {
      vi.useRealTimers();
    }
  });
});
