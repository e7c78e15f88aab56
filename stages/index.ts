// prefab's stages in run order. A stage reads only the stages before it.
import type { CommandFactory } from '../pipeline/commands.ts';
import type { Stage } from '../pipeline/stage.ts';
import { dapo } from './dapo/index.ts';
import { dpo } from './dpo/index.ts';
import { evalStage } from './eval/index.ts';
import { exportStage } from './export/index.ts';
import { gate } from './gate/index.ts';
import { importStage } from './import/index.ts';
import { ingest } from './ingest/index.ts';
import { judge } from './judge/index.ts';
import { pairs } from './pairs/index.ts';
import { sample } from './sample/index.ts';
import { addSimulateCommands } from '../env/simulate.ts';
import { sft } from './sft/index.ts';
import { split } from './split/index.ts';
import { addBackendOption } from '../runtime/device.ts';
import { addModelCommands } from '../runtime/commands.ts';
import { addRefreshCommand, addRegistryCommands, addServeCommand } from '../loop/commands.ts';
import { tokenizer } from './tokenizer/index.ts';
import { addPreviewCommands } from './preview.ts';
import { addReportCommand } from '../report/command.ts';

export const STAGES: Stage[] = [
  ingest,
  importStage,
  split,
  sample,
  pairs,
  judge,
  gate,
  exportStage,
  tokenizer,
  sft,
  dpo,
  dapo,
  evalStage,
] as Stage[];

/** Commands beyond the pipeline's own. */
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
