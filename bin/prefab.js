#!/usr/bin/env node
// The `prefab` executable: TypeScript runs through tsx, so a clean clone needs no build step.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../pipeline/cli.ts');
const { STAGES, COMMANDS } = await import('../stages/index.ts');
const code = await main(process.argv, STAGES, COMMANDS);
// Exit now rather than when the event loop drains: a stage that failed may leave retries of other requests
// waiting on timers. Standard output is flushed first.
process.stdout.write('', () => process.exit(code));
