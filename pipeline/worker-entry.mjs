// A worker thread's start when prefab runs from its TypeScript sources (tests, PREFAB_TSX=1): TypeScript
// through tsx, then the worker module named by pipeline/workers.ts. From the bundle, a worker starts from
// the bundle's own entry for it instead.
import { workerData } from 'node:worker_threads';

const { register } = await import('tsx/esm/api');
register();
await import(workerData.module);
