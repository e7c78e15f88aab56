// `prefab models list|show|promote|rollback`: the model registry (loop/registry.ts) by hand. Every promotion
// and rollback is a line of the registry's history, with who asked and why.
import type { Command } from 'commander';
import { join } from 'node:path';
import type { CommandContext } from '../pipeline/stage.ts';
import { Registry, type VersionInfo } from './registry.ts';

const registryOf = (program: Command) => new Registry(join(program.opts<{ workdir: string }>().workdir, 'registry'));

/** A version's validation success as its eval table gives it (the column of the stage that trained it). */
function success(v: VersionInfo): string {
  const models = (v.eval as { models?: Record<string, Record<string, number | null>> } | null)?.models ?? {};
  const column = models[String(v.source.stage ?? '')] ?? {};
  const key = Object.keys(column).find((k) => k.startsWith('success/mean@'));
  return key && typeof column[key] === 'number' ? `${key} ${column[key].toFixed(3)}` : '—';
}

export function addRegistryCommands(program: Command, ctx: CommandContext): void {
  const models = program.command('models').description('the model registry: every trained model a version; production and candidate aliases; promote and roll back');
  models
    .command('list')
    .description('every version: when, its parent, its aliases, what trained it and its validation success')
    .option('--json', 'one JSON object: aliases, versions and history')
    .action((opts: { json?: boolean }) => {
      const registry = registryOf(program);
      const aliases = registry.aliases();
      const versions = registry.versions();
      if (opts.json) {
        process.stdout.write(JSON.stringify({ aliases, versions, history: registry.history() }, null, 2) + '\n');
        return;
      }
      if (versions.length === 0) {
        process.stdout.write(`no versions in ${registry.dir}\n`);
        return;
      }
      const rows = versions.map((v) => [v.id, v.created_at.slice(0, 19).replace('T', ' '), v.parent ?? '—', [aliases.production === v.id ? 'production' : '', aliases.candidate === v.id ? 'candidate' : ''].filter(Boolean).join(', ') || '—', String(v.source.stage ?? '—'), success(v)]);
      const head = ['version', 'created', 'parent', 'aliases', 'trained by', 'validation'];
      const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
      for (const r of [head, ...rows]) process.stdout.write(r.map((c, i) => c.padEnd(widths[i]!)).join('  ').trimEnd() + '\n');
    });
  models
    .command('show')
    .argument('<version>', 'a version id, production or candidate')
    .description("a version's info (version.json: parent, source, config, eval) and its folder, as JSON")
    .action((name: string) => {
      const registry = registryOf(program);
      const aliases = registry.aliases();
      const id = name === 'production' || name === 'candidate' ? aliases[name] : name;
      if (id === null) {
        process.stderr.write(`the registry has no ${name}\n`);
        ctx.setExit(1);
        return;
      }
      process.stdout.write(JSON.stringify({ ...registry.version(id), folder: join(registry.folder(id), 'model') }, null, 2) + '\n');
    });
  models
    .command('promote')
    .argument('<version>', 'the version to make production')
    .option('--reason <text>', 'why, for the history', 'promoted by hand')
    .description('make a version production (recorded in the history)')
    .action((id: string, opts: { reason: string }) => {
      const e = registryOf(program).promote(id, opts.reason);
      process.stdout.write(`${e.version} is production (was ${'from' in e ? (e.from ?? 'none') : 'none'})\n`);
    });
  models
    .command('rollback')
    .option('--reason <text>', 'why, for the history', 'rolled back by hand')
    .description('put back the production before the current one (recorded in the history)')
    .action((opts: { reason: string }) => {
      const e = registryOf(program).rollback(opts.reason);
      process.stdout.write(`${e.version} is production again (was ${'from' in e ? e.from : '?'})\n`);
    });
}
