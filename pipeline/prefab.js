#!/usr/bin/env node
// The `prefab` executable: TypeScript runs through tsx, so a clean clone needs no build step.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('./cli.ts');
const { STAGES, COMMANDS } = await import('../stages/index.ts');
process.exitCode = await main(process.argv, STAGES, COMMANDS);
