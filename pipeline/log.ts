// The one logger: readable lines on a terminal, JSON lines for schedulers, progress with rate and ETA.
import { createRequire } from 'node:module';

export type LogFormat = 'text' | 'json';
type Level = 'info' | 'warn' | 'error';
type Fields = Record<string, unknown>;

// A name ending in `token` is a credential (token, access_token, apiToken); `tokens` and `tokens/s` are counts.
const SECRET_KEY = /(api[_-]?key|token$|secret|password|authorization)/i;
const PROGRESS_EVERY_MS = 10_000;

export interface Progress {
  tick(n?: number): void;
  done(): void;
}

export class Logger {
  constructor(
    readonly format: LogFormat,
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean } = process.stderr,
    private readonly bound: Fields = {},
    readonly quiet = false,
  ) {}

  static defaultFormat(): LogFormat {
    return process.stderr.isTTY ? 'text' : 'json';
  }

  child(fields: Fields): Logger {
    return new Logger(this.format, this.out, { ...this.bound, ...fields }, this.quiet);
  }

  info(event: string, fields: Fields = {}): void {
    if (!this.quiet) this.emit('info', event, fields);
  }

  warn(event: string, fields: Fields = {}): void {
    this.emit('warn', event, fields);
  }

  error(event: string, fields: Fields = {}): void {
    this.emit('error', event, fields);
  }

  private emit(level: Level, event: string, fields: Fields): void {
    const all = withoutSecrets({ ...this.bound, ...fields });
    if (this.format === 'json') {
      this.out.write(JSON.stringify({ ts: new Date().toISOString(), level, event, ...all }) + '\n');
      return;
    }
    const time = new Date().toISOString().slice(11, 19);
    const where = typeof all.stage === 'string' ? `${all.stage}: ` : '';
    delete all.stage;
    const rest = Object.entries(all)
      .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
      .join(' ');
    const tag = level === 'info' ? '' : `${level.toUpperCase()} `;
    this.out.write(`[${time}] ${tag}${where}${event}${rest ? '  ' + rest : ''}\n`);
  }

  /**
   * A progress bar on a terminal; elsewhere a log line every few seconds with rate and ETA. `from`: work done
   * before this run (a resumed one), counted as done but not in the rate.
   */
  progress(label: string, total?: number, from = 0): Progress {
    if (this.quiet) return { tick() {}, done() {} };
    const started = Date.now();
    let count = from;
    if (this.format === 'text' && this.out.isTTY && total !== undefined) {
      // cli-progress only for a bar on a terminal: every other command's start would pay for loading it.
      const cliProgress = createRequire(import.meta.url)('cli-progress') as typeof import('cli-progress');
      const bar = new cliProgress.SingleBar(
        {
          format: `  ${label} [{bar}] {value}/{total} {rate}/s eta {eta_formatted}`,
          stream: this.out as NodeJS.WriteStream,
          hideCursor: true,
          clearOnComplete: true,
        },
        cliProgress.Presets.shades_classic,
      );
      bar.start(total, from, { rate: 0 });
      return {
        tick: (n = 1) => {
          count += n;
          bar.update(count, { rate: Math.round((count - from) / Math.max((Date.now() - started) / 1000, 1e-3)) });
        },
        done: () => bar.stop(),
      };
    }
    let last = started;
    return {
      tick: (n = 1) => {
        count += n;
        const now = Date.now();
        if (now - last < PROGRESS_EVERY_MS) return;
        last = now;
        const rate = (count - from) / ((now - started) / 1000);
        const eta = total !== undefined && rate > 0 ? Math.round((total - count) / rate) : undefined;
        this.info('progress', { label, done: count, total, rate_per_s: Math.round(rate), eta_s: eta });
      },
      done: () => {},
    };
  }
}

function withoutSecrets(fields: Fields): Fields {
  const out: Fields = {};
  for (const [k, v] of Object.entries(fields)) out[k] = SECRET_KEY.test(k) ? '[redacted]' : v;
  return out;
}
