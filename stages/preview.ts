// `prefab preview`: see what prefab makes of your data before and after a run, without writing queries.
//   preview inputs: the first records of each input, mapped as ingest maps them (or why one would be
//                   quarantined), writing nothing;
//   preview pairs:  a few pairs of a stage's output, of a source or negative type, chosen and rejected side by
//                   side below the end of their shared prompt.
import { join } from 'node:path';
import type { Command } from 'commander';
import { wholeNumber, type CommandContext } from '../pipeline/commands.ts';
import type { Engine } from '../pipeline/engine.ts';
import { UsageError } from '../pipeline/errors.ts';
import type { Message, Pair, Session } from '../core/records.ts';
import type { PairSide } from '../store/messages.ts';
import type { Config as IngestConfig } from './ingest/index.ts';

/** A message in one line: its role, its text and its calls, cut to `width`. */
function messageLine(m: Message, width: number): string {
  const calls = (m.tool_calls ?? []).map((c) => `${c.function.name}(${c.function.arguments})`).join(' ');
  const text = [m.content ?? '', calls && `→ ${calls}`].filter(Boolean).join(' ').replace(/\s+/g, ' ');
  const line = `${m.role}: ${text}`;
  return line.length > width ? `${line.slice(0, width - 1)}…` : line;
}

/** Messages as lines of `width` characters, wrapped (each message's lines indented after its first). */
function wrapped(messages: Message[], width: number): string[] {
  const out: string[] = [];
  for (const m of messages) {
    const calls = (m.tool_calls ?? []).map((c) => `→ ${c.function.name}(${c.function.arguments})`);
    const text = `${m.role}: ${[m.content ?? '', ...calls].filter(Boolean).join(' ')}`.replace(/\s+/g, ' ');
    for (let at = 0, first = true; at < text.length || first; first = false) {
      const room = first ? width : width - 2;
      out.push(`${first ? '' : '  '}${text.slice(at, at + room)}`);
      at += room;
    }
  }
  return out;
}

/** A session as a few lines of what prefab read. */
function sessionLines(s: Session, width: number): string[] {
  const metadata = Object.keys(JSON.parse(s.metadata) as object);
  const firstUser = s.messages.find((m) => m.role === 'user');
  const roles = s.messages.map((m) => (m.tool_calls?.length ? `${m.role}+${m.tool_calls.length} call(s)` : m.role));
  return [
    `session ${s.session_id}  task ${s.task_id ?? '(none: grouped by request)'}  reward ${s.reward}  model ${s.model ?? '–'}  created ${s.created_at ?? '–'}`,
    `messages (${s.messages.length}): ${roles.length > 10 ? [...roles.slice(0, 6), '…', ...roles.slice(-2)].join(', ') : roles.join(', ')}`,
    ...(firstUser ? [messageLine(firstUser, width)] : []),
    `feedback: ${s.feedback === null ? '–' : JSON.stringify(s.feedback.slice(0, 80))}`,
    `metadata: ${metadata.length ? metadata.join(', ') : '–'}`,
  ];
}

/** The first `n` records of each input, as ingest would read them. */
async function previewInputs(engine: Engine, n: number, json: boolean): Promise<void> {
  const [{ resolveInputs }, { detectFormat, readRecords, recordLimit }, { readOne }, { readingOptions }] =
    await Promise.all([
      import('../pipeline/inputs.ts'),
      import('../pipeline/records.ts'),
      import('./ingest/segment.ts'),
      import('./ingest/run.ts'),
    ]);
  const cfg = engine.config.ingest as IngestConfig;
  const files = await resolveInputs(cfg.inputs, engine.configDir);
  if (files.length === 0) process.stdout.write('ingest.inputs names no file: nothing to preview\n');
  const o = await readingOptions(cfg, engine.configDir);
  const width = Math.max(60, (process.stdout.columns ?? 120) - 4);
  for (const path of files) {
    const format = cfg.format === 'auto' ? detectFormat(path) : cfg.format;
    if (!json) process.stdout.write(`${path} (${format ?? 'unknown format'})\n`);
    if (format === null) {
      if (json) process.stdout.write(JSON.stringify({ file: path, reason: 'unknown format' }) + '\n');
      else process.stdout.write('  not read: name it .jsonl, .json or .parquet, or set ingest.format\n');
      continue;
    }
    let seen = 0;
    for await (const record of readRecords(
      path,
      format,
      recordLimit(cfg.max_record_bytes, 'ingest.max_record_bytes'),
    )) {
      if (seen++ >= n) break;
      const made = readOne(record, path, o);
      const session = 'session' in made ? made.session : null;
      const reason = 'reason' in made ? made.reason : 'fault' in made ? made.fault : null;
      if (json) {
        process.stdout.write(JSON.stringify({ file: path, where: record.where, session, reason }) + '\n');
        continue;
      }
      const lines = session ? sessionLines(session, width) : [`quarantined: ${reason}`];
      process.stdout.write(`  ${record.where}\n${lines.map((l) => `    ${l}`).join('\n')}\n`);
    }
  }
}

/** A few pairs of a stage's output, chosen and rejected side by side. */
async function previewPairs(
  engine: Engine,
  o: { stage: string; side: string; source?: string; type?: string; n: number; json: boolean },
): Promise<void> {
  const { readPairs, readSplitInfo } = await import('./layout.ts');
  const ws = engine.ws;
  const file = join(ws.stageDir(o.stage), `${o.side}.jsonl`);
  const folders = { split: ws.stageDir('split'), ingest: ws.stageDir('ingest') };
  let info;
  try {
    info = await readSplitInfo(folders.split);
  } catch {
    throw new UsageError(`no pairs to preview in ${ws.root}: run \`prefab run --until ${o.stage}\` first`);
  }
  const width = Math.max(100, process.stdout.columns ?? 160);
  const half = Math.floor((width - 3) / 2);
  let shown = 0;
  for await (const { whole } of readPairs<Pair<PairSide>>(file, folders, info.buckets)) {
    if (o.source && whole.source !== o.source) continue;
    if (o.type && whole.negative_type !== o.type) continue;
    if (shown++ >= o.n) break;
    if (o.json) {
      process.stdout.write(JSON.stringify(whole) + '\n');
      continue;
    }
    const judged = whole as Pair & { verdict?: { rationale?: string } };
    process.stdout.write(
      `\n${whole.pair_id}  ${whole.source}${whole.negative_type ? `/${whole.negative_type}` : ''}  task ${whole.task_id ?? '–'}  judge ${whole.judge || '–'}  confidence ${whole.confidence.toFixed(2)}  margin ${whole.margin ?? '–'}\n`,
    );
    if (judged.verdict?.rationale) process.stdout.write(`why: ${judged.verdict.rationale}\n`);
    const tail = whole.prompt.slice(-2);
    process.stdout.write(
      `prompt (${whole.prompt.length} messages${whole.prompt.length > 2 ? ', the last 2' : ''}):\n${tail.map((m) => `  ${messageLine(m, width - 2)}`).join('\n')}\n`,
    );
    const [left, right] = [wrapped(whole.chosen, half), wrapped(whole.rejected, half)];
    process.stdout.write(`${'chosen'.padEnd(half)} │ rejected\n${'─'.repeat(half)}─┼─${'─'.repeat(half)}\n`);
    for (let i = 0; i < Math.max(left.length, right.length); i++)
      process.stdout.write(`${(left[i] ?? '').padEnd(half)} │ ${right[i] ?? ''}\n`);
  }
  if (shown === 0)
    process.stdout.write(
      `no pair in ${file}${o.source ? ` of source ${o.source}` : ''}${o.type ? ` of type ${o.type}` : ''}\n`,
    );
}

export function addPreviewCommands(program: Command, ctx: CommandContext): void {
  const preview = program
    .command('preview')
    .description('see what prefab makes of your data: mapped input records, or pairs side by side');
  preview
    .command('inputs')
    .description(
      'map the first records of each of ingest.inputs as ingest would, and print them as prefab reads them (or why each would be quarantined); writes nothing',
    )
    .option('--records <n>', 'records of each file', wholeNumber, 3)
    .option('--json', 'one JSON object a record: the session, or the reason')
    .action(async (opts: { records: number; json?: boolean }) => {
      await previewInputs(ctx.pipeline(ctx.logger()).engine, opts.records, opts.json ?? false);
      ctx.setExit(0);
    });
  preview
    .command('pairs')
    .description("print a few pairs of a stage's output, chosen and rejected side by side below their prompt's end")
    .option('--stage <stage>', 'pairs (as built), judge (with verdicts) or gate (as kept)', 'gate')
    .option('--side <side>', 'train or test', 'train')
    .option('--source <source>', 'only pairs of this source (outcome, best_of_n, hard_negative, imported, ...)')
    .option('--type <type>', 'only hard negatives of this type (refusal, hallucination, off_topic, ...)')
    .option('-n, --pairs <n>', 'how many', wholeNumber, 3)
    .option('--json', 'the pairs whole, one JSON object a line')
    .action(
      async (opts: { stage: string; side: string; source?: string; type?: string; pairs: number; json?: boolean }) => {
        if (!['pairs', 'judge', 'gate'].includes(opts.stage))
          throw new UsageError(`--stage ${opts.stage}: expected pairs, judge or gate`);
        if (!['train', 'test'].includes(opts.side)) throw new UsageError(`--side ${opts.side}: expected train or test`);
        await previewPairs(ctx.pipeline(ctx.logger()).engine, { ...opts, n: opts.pairs, json: opts.json ?? false });
        ctx.setExit(0);
      },
    );
}
