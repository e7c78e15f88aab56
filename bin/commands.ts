// The commands beyond the pipeline's own, and the options every command takes: bin/prefab.js hands them to
// the CLI with the stages. Each room adds its own (the simulator's `simulate`, the runtime's `model`, the
// loop's `models`, `serve` and `refresh`, the stages' `preview`, the report's `report`, the device's
// `--backend`); only this list knows them all.
import type { CommandFactory } from '../pipeline/commands.ts';
import { addSimulateCommands } from '../env/simulate.ts';
import { addRefreshCommand, addRegistryCommands, addServeCommand } from '../loop/commands.ts';
import { addReportCommand } from '../report/command.ts';
import { addModelCommands } from '../runtime/commands.ts';
import { addBackendOption } from '../runtime/device.ts';
import { addPreviewCommands } from '../stages/preview.ts';

export const COMMANDS: CommandFactory[] = [
  addSimulateCommands,
  addModelCommands,
  addRegistryCommands,
  addServeCommand,
  addRefreshCommand,
  addPreviewCommands,
  addReportCommand,
  addBackendOption,
];
