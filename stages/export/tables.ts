// One side's Parquet tables, written by the main thread or by a worker thread (worker.ts): the sessions, SFT
// and KTO tables from split's buckets, and the pairs table from the gate's pairs. Each file is written by one
// of them, its rows in the same order whichever: the same bytes on any number of threads.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { ParquetTableWriter, type Column, type Compression } from '../../pipeline/parquet.ts';
import { sessionTools, type Pair, type SftRow, type Split } from '../../core/records.ts';
import { StoredBucketReader, readBucketSessions } from '../../store/bucket-reader.ts';
import { bucketFile, readPairs, type SplitFolders } from '../layout.ts';
import type { PairSide } from '../../store/messages.ts';
import { Redactor } from '../../core/redact.ts';
import { ktoRow, maskPair, maskSession, trlPair } from './rows.ts';
import { KTO_COLUMNS, PAIR_COLUMNS, SESSION_COLUMNS, SFT_COLUMNS } from './schema.ts';
import type { Config } from './index.ts';

/** The tables made from sessions. */
export type SessionTable = 'sessions' | 'sft' | 'kto';

/** Where a side's tables are read from and written to. */
export interface TableSource {
  cfg: Config;
  out: string;
  folders: SplitFolders;
  gate: string;
  buckets: number;
}

/** What writing tables of a side gave: rows a table, and the KTO rows left out (no assistant turn). */
export interface TablesWritten {
  rows: Partial<Record<SessionTable | 'pairs' | 'trajectories', number>>;
  ktoSkipped: number;
}

async function open(
  dir: string,
  side: Split,
  columns: Record<string, Column>,
  cfg: Config,
): Promise<ParquetTableWriter<object>> {
  await mkdir(dir, { recursive: true });
  return ParquetTableWriter.open(join(dir, `${side}.parquet`), columns, {
    rowGroupSize: cfg.row_group_size,
    compression: cfg.compression as Compression,
  });
}

/** One Redactor per row: placeholders are consistent within a row and say nothing across rows; null when masking is off. */
function masker(cfg: Config): (() => Redactor) | null {
  const r = cfg.redaction;
  return r.enabled ? () => new Redactor({ kinds: r.kinds, keys: r.keys, sessionValues: r.session_values }) : null;
}

/**
 * The `tables` of one side made from its sessions, bucket by bucket (`beforeBucket` runs before each: a safe
 * point on the main thread). Each file closes once its last row is in: a file's footer describes every row
 * group, and the writer holds it until then.
 */
export async function writeSessionTables(
  s: TableSource,
  side: Split,
  tables: SessionTable[],
  beforeBucket: (b: number) => Promise<void> = async () => {},
): Promise<TablesWritten> {
  const { cfg } = s;
  const mask = masker(cfg);
  const w: Partial<Record<SessionTable, ParquetTableWriter<object>>> = {};
  const columns = { sessions: SESSION_COLUMNS, sft: SFT_COLUMNS, kto: KTO_COLUMNS };
  for (const t of tables) w[t] = await open(join(s.out, t), side, columns[t], cfg);
  let ktoSkipped = 0;
  // Every bucket's sessions are read into the same buffers.
  const reader = new StoredBucketReader();
  for (let b = 0; b < s.buckets; b++) {
    await beforeBucket(b);
    for await (const logged of readBucketSessions(bucketFile(s.folders.split, side, b), s.folders.ingest, reader)) {
      const session = mask ? maskSession(logged, mask()) : logged;
      await w.sessions?.append(session);
      if (w.sft && session.reward >= cfg.sft_min_reward) {
        await w.sft.append({
          messages: session.messages,
          session_id: session.session_id,
          task_id: session.task_id,
          reward: session.reward,
          tools: sessionTools(session.metadata),
        } satisfies SftRow);
      }
      const label =
        session.reward >= cfg.kto_desirable_min ? true : session.reward <= cfg.kto_undesirable_max ? false : null;
      if (w.kto && label !== null) {
        const row = ktoRow(session, label);
        if (row) await w.kto.append(row);
        else ktoSkipped++;
      }
    }
  }
  const rows: TablesWritten['rows'] = {};
  for (const t of tables) {
    await w[t]!.close();
    rows[t] = w[t]!.rows;
  }
  return { rows, ktoSkipped };
}

/**
 * The pairs and trajectories tables of one side: the gate's pairs, their sides made whole from split's
 * buckets, bucket by bucket, each with the tools its sessions' agent had. A pair TRL reads right as it is, or
 * once cut (trlPair), goes to `pairs`; one whose trajectories part before any assistant turn to `trajectories`.
 */
export async function writePairTable(s: TableSource, side: Split): Promise<TablesWritten> {
  const mask = masker(s.cfg);
  const pairs = await open(join(s.out, 'pairs'), side, PAIR_COLUMNS, s.cfg);
  const trajectories = await open(join(s.out, 'trajectories'), side, PAIR_COLUMNS, s.cfg);
  for await (const { whole, tools } of readPairs<Pair<PairSide>>(join(s.gate, `${side}.jsonl`), s.folders, s.buckets)) {
    const row = { ...(mask ? maskPair(whole, mask()) : whole), tools };
    const cut = trlPair(row);
    await (cut ? pairs.append(cut) : trajectories.append(row));
  }
  await pairs.close();
  await trajectories.close();
  return { rows: { pairs: pairs.rows, trajectories: trajectories.rows }, ktoSkipped: 0 };
}
