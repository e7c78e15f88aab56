// A worker thread of the pairs stage: whole buckets paired as pairBucket pairs them on the main thread. It
// loads only what pairing needs (no rewriter, endpoint, config schemas or progress bars): a thread starts in
// a few tens of milliseconds.
import { serveBatches, threadShelf } from '../../pipeline/workers.ts';
import { BucketPairer, bucketOptions, type BucketJob, type PairedBucket, type PairingConfig } from './bucket.ts';

// Only the rewriter logs from inside a bucket, and it never runs on a worker thread.
const silent = { warn: () => {} };

serveBatches(
  (cfg: PairingConfig) => {
    // A thread pairs one bucket at a time (serveBatches), so one pairer, with its buffers, serves them all.
    const pairer = new BucketPairer(bucketOptions(cfg, null), silent, threadShelf);
    return (job: BucketJob): Promise<PairedBucket> => pairer.pair(job);
  },
  (made) => [made.pairs.buffer as ArrayBuffer, made.dropped.buffer as ArrayBuffer],
  // A thread has one bucket in flight besides the one it pairs (more only while what waits to be written is
  // small: inOrder's held): the two buffers of one bucket (its pairs and dropped lines) are all it needs
  // back, and a spare of a bucket's pairs is tens of MB.
  2,
);
