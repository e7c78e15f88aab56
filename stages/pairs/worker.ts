// A worker thread of the pairs stage: whole buckets paired as pairBucket pairs them on the main thread.
import { Writable } from 'node:stream';
import { Logger } from '../../pipeline/log.ts';
import { serveBatches, threadShelf } from '../../pipeline/workers.ts';
import { StoredBucketReader } from '../layout.ts';
import { bucketOptions, pairBucketFile, type BucketJob, type PairedBucket, type PairingConfig } from './bucket.ts';

// Only the rewriter logs from inside a bucket, and it never runs on a worker thread.
const silent = new Logger('json', new Writable({ write: (_chunk, _encoding, done) => done() }), {}, true);

serveBatches(
  (cfg: PairingConfig) => {
    const o = bucketOptions(cfg, null);
    // A thread pairs one bucket at a time (serveBatches), so one reader serves them all.
    const reader = new StoredBucketReader();
    return ({ path, bytes, side }: BucketJob): Promise<PairedBucket> => pairBucketFile(reader, path, bytes, side, o, silent, threadShelf);
  },
  (made) => [made.pairs.buffer as ArrayBuffer, made.dropped.buffer as ArrayBuffer],
);
