// prefab's stages in run order. A stage reads only the stages before it.
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
import { sft } from './sft/index.ts';
import { split } from './split/index.ts';
import { tokenizer } from './tokenizer/index.ts';

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
