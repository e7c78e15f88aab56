// A worker thread of the judge stage: pieces of the pairs stage's pairs, and a bucket's best-of-N, judged as
// the main thread judges them, with a panel of its own. Only a panel without an LLM judge runs on threads
// (an LLM judge's answers are asked of one endpoint and cached by one writer): no endpoint is opened here.
import { serveBatches, threadShelf } from '../../pipeline/workers.ts';
import { mustDeclineTest } from '../../judges/rules.ts';
import { openPanel } from '../../judges/panel.ts';
import { Logger } from '../../pipeline/log.ts';
import { SessionsById } from '../../store/sessions-by-id.ts';
import { StoredBucketReader } from '../../store/bucket-reader.ts';
import type { SplitFolders } from '../layout.ts';
import { judgeJob, type JudgeJob, type JudgedBucket } from './constructed.ts';
import type { Config } from './index.ts';

/** What a thread builds its panel and reads its buckets from. */
export interface JudgeThreadInit {
  cfg: Config;
  configDir: string;
  cacheDir: string;
  /** The pairs stage's must-decline patterns (pairs/info.json). */
  mustDecline: string[];
  folders: SplitFolders;
  buckets: number;
  /** The largest bucket a thread holds whole (SessionsById's; a test's). */
  heldBytes?: number;
}

// The panel logs only about its endpoint, which a thread never opens: its warnings would still be seen.
const log = new Logger('json', process.stderr, { thread: 'judge' }, true);

serveBatches(
  (init: JudgeThreadInit) => {
    const panel = openPanel(init.cfg, {
      configDir: init.configDir,
      cacheDir: init.cacheDir,
      redaction: init.cfg.redaction,
      mustDecline: mustDeclineTest(init.mustDecline),
      log,
    });
    // Every bucket is read through the same buffers; the last bucket pairs pointed into stays indexed.
    const reader = new StoredBucketReader();
    const sessions = new SessionsById(init.folders.ingest, reader, init.heldBytes);
    return async (job: JudgeJob): Promise<JudgedBucket> => {
      const { ensemble } = await panel;
      return judgeJob(job, {
        ensemble,
        folders: init.folders,
        buckets: init.buckets,
        batchSize: init.cfg.batch_size,
        reader,
        sessions,
        shelf: threadShelf,
      });
    };
  },
  (made) => [made.lines.buffer as ArrayBuffer],
  // A thread has two jobs being judged (inOrder's; more done ones wait only while small), and their lines'
  // buffers come back once written.
  3,
);
