// `prefab report`: writes workspace/report/index.html from what the workspace holds. The end of every
// `prefab run` and of every refresh night writes it too; a report that cannot be written is a warning there,
// never a failed run.
import type { Command } from 'commander';
import { wholeNumber, type CommandContext } from '../pipeline/commands.ts';
import type { Engine } from '../pipeline/engine.ts';
import type { Logger } from '../pipeline/log.ts';

/** The most pairs the page carries by default: a few hundred keep it a few megabytes. */
const MAX_PAIRS = 600;

/** The page's code, loaded when a report is written, not with every command. */
const writeReport = async (engine: Engine, log: Logger, maxPairs = MAX_PAIRS) =>
  (await import('./page.ts')).writeReport(engine, log, { maxPairs });

export function addReportCommand(program: Command, ctx: CommandContext): void {
  ctx.afterResults(reportAfter);
  program
    .command('report')
    .description(
      'write workspace/report/index.html: the data funnel, the judges, training curves, the eval table, the registry and refresh nights, and a browser of the pairs; one page that opens from disk',
    )
    .option(
      '--max-pairs <n>',
      `the most pairs the page's browser carries, an equal share of each kind (default ${MAX_PAIRS})`,
      wholeNumber,
    )
    .action(async (opts: { maxPairs?: number }) => {
      const log = ctx.logger();
      const { engine } = ctx.pipeline(log);
      const path = await writeReport(engine, log, opts.maxPairs);
      process.stdout.write(`${path}\n`);
      ctx.setExit(0);
    });
}

async function reportAfter(engine: Engine, log: Logger): Promise<void> {
  try {
    const path = await writeReport(engine, log);
    log.info('report written', { path });
  } catch (error) {
    log.warn(`report: not written: ${(error as Error).message} (\`prefab report\` writes it again)`);
  }
}
