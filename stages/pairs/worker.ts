// A worker thread of the pairs stage: buckets (or pieces of a large one) paired as BucketPairer pairs them on the main thread. It
// loads only what pairing needs (no rewriter, endpoint, config schemas or progress bars): a thread starts in
// a few tens of milliseconds.
import { serveBatches, threadShelf } from '../../pipeline/workers.ts';
import { bucketOptions, type PairingConfig } from '../../pairing/bucket.ts';
import { BucketPairer, movedBuffers, type BucketJob, type PairedJob } from '../../pairing/pairer.ts';

// Only the rewriter logs from inside a bucket, and it never runs on a worker thread.
const silent = { warn: () => {} };

serveBatches(
  (cfg: PairingConfig) => {
    // A thread pairs one bucket at a time (serveBatches), so one pairer, with its buffers, serves them all.
    const pairer = new BucketPairer(bucketOptions(cfg, null), silent, threadShelf);
    return (job: BucketJob): Promise<PairedJob> => pairer.pair(job);
  },
  movedBuffers,
  // A thread has one bucket in flight besides the one it pairs (more only while what waits to be written is
  // small: inOrder's held): the two buffers of one bucket (its pairs and dropped lines) are all it needs
  // back, and a spare of a bucket's pairs is tens of MB.
  2,
);
