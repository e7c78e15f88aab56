// prefab's stages in run order. A stage reads only the stages before it.
import type { Stage } from '../pipeline/stage.ts';
import { exportStage } from './export/index.ts';
import { ingest } from './ingest/index.ts';
import { pairs } from './pairs/index.ts';
import { split } from './split/index.ts';

export const STAGES: Stage[] = [ingest, split, pairs, exportStage] as Stage[];
