// JsonlWriter.bytes is where the next record starts in the file, in bytes (a shard's chunk index relies on
// it), whatever the records hold and however much is still on its way to disk; the checksum it remembers is
// the file's XXH64, as xxhsum prints it. readLineBlocks (ingest's reader of JSONL as bytes) cuts and numbers lines as readline does.
import { appendFileSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import xxhash from 'xxhash-wasm';
import { checksumFile, outputChecksum } from '../../pipeline/hash.ts';
import { JsonlWriter, readLines } from '../../pipeline/jsonl.ts';
import { BufferShelf, sizeClass } from '../../pipeline/buffers.ts';
import { forEachLine, readLineBlocks } from '../../pipeline/records.ts';
import { seeded } from '../../core/random.ts';
import { tempDir } from '../fixtures/pipeline.ts';

// The whole file hashed at once (xxhash-wasm's one-shot XXH64), against the writer's and checksumFile's streams.
const { h64Raw } = await xxhash();
const xxh64 = (path: string) => h64Raw(readFileSync(path)).toString(16).padStart(16, '0');

/** The lines readLineBlocks yields, decoded and numbered, then where the file broke off, if it did. */
async function blockLines(path: string, size: number): Promise<{ lines: [number, string][]; damaged: string | null }> {
  const lines: [number, string][] = [];
  let damaged: string | null = null;
  for await (const block of readLineBlocks(path, size)) {
    if ('damaged' in block) {
      damaged = block.damaged;
      continue;
    }
    const bytes = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.byteLength);
    let n = block.firstLine;
    forEachLine(bytes, (start, end) => lines.push([n++, bytes.toString('utf8', start, end)]));
  }
  return { lines, damaged };
}

async function readlineLines(path: string): Promise<[number, string][]> {
  const lines: [number, string][] = [];
  for await (const { line, text } of readLines(path)) lines.push([line, text]);
  return lines;
}

describe('forEachLine', () => {
  it('counts runs of empty lines without a call each when asked, numbering the others as readline does', () => {
    const text = '\n\n{"a":1}\r\n\n\n\nx\ry\n\n\nlast';
    const every: [number, string][] = [];
    const total = forEachLine(Buffer.from(text), (s, e, n) => every.push([n, text.slice(s, e)]));
    const some: [number, string][] = [];
    const counted = forEachLine(Buffer.from(text), (s, e, n) => some.push([n, text.slice(s, e)]), true);
    expect(counted).toBe(total);
    expect(total).toBe(text.split(/\r\n|\n|\r/).length);
    expect(some).toEqual(every.filter(([, line]) => line !== ''));
    expect(some).toEqual([
      [3, '{"a":1}'],
      [7, 'x'],
      [8, 'y'],
      [11, 'last'],
    ]);
  });
});

describe('JsonlWriter', () => {
  it('counts the bytes of what it has written, multi-byte characters and pre-made lines included', async () => {
    const path = join(tempDir(), 'out.jsonl');
    const writer = new JsonlWriter(path, 'w', 64);
    const starts: number[] = [];
    for (let i = 0; i < 500; i++) {
      starts.push(writer.bytes);
      if (i % 3 === 0) await writer.writeBytes(new TextEncoder().encode(`{"raw":${i}}\n`));
      else await writer.write({ i, text: `ünïcødé — ${'✓'.repeat(i % 7)} 😀` });
    }
    const end = writer.bytes;
    await writer.close();
    const file = readFileSync(path);
    expect(statSync(path).size).toBe(end);
    // Each recorded start is the byte just after the previous line's newline.
    starts.slice(1).forEach((at) => expect(file[at - 1]).toBe(0x0a));
    expect(JSON.parse(file.subarray(starts[250]!, starts[251]! - 1).toString('utf8'))).toEqual({
      i: 250,
      text: `ünïcødé — ${'✓'.repeat(250 % 7)} 😀`,
    });
  });
});

describe('JsonlWriter', () => {
  it('remembers the checksum of what it wrote, which the engine takes only while the file is as it left it', async () => {
    const path = join(tempDir(), 'out.jsonl');
    const writer = new JsonlWriter(path);
    for (let i = 0; i < 2000; i++)
      await (i % 2
        ? writer.write({ i, text: 'ünïcødé 😀' })
        : writer.writeBytes(new TextEncoder().encode(`{"raw":${i}}\n`)));
    await writer.close();
    expect(await outputChecksum(path, statSync(path))).toBe(xxh64(path));
    // Changed after it was closed: the file is read again.
    const again = new JsonlWriter(path);
    await again.write({ first: true });
    await again.close();
    appendFileSync(path, '{"appended":true}\n');
    expect(await outputChecksum(path, statSync(path))).toBe(xxh64(path));
  });

  it('checksums a file as xxhsum -H1 does (XXH64, seed 0: the reference test vectors)', async () => {
    const dir = tempDir();
    const vectors: [string, string][] = [
      ['', 'ef46db3751d8e999'],
      ['abc', '44bc2cf5ad770999'],
    ];
    for (const [i, [text, sum]] of vectors.entries()) {
      writeFileSync(join(dir, `${i}.txt`), text);
      expect(await checksumFile(join(dir, `${i}.txt`))).toBe(sum);
    }
    // Reads of 2 MiB, three under way at once: files of every size about them, and not a multiple of XXH64's 32-byte stripes.
    const MiB = 1 << 20;
    for (const size of [1, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1, 6 * MiB, 6 * MiB + 1, 15 * MiB + 17]) {
      const big = join(dir, `big-${size}.bin`);
      writeFileSync(big, Buffer.from(Array.from({ length: size }, (_, k) => (k * 31 + (k >> 20)) & 0xff)));
      expect(await checksumFile(big)).toBe(xxh64(big));
    }
  });

  it('says which file it could not write when the disk is full, and the process lives on', async () => {
    // /dev/full answers every write with ENOSPC, as a full disk does.
    for (const lines of [1, 5000]) {
      const writer = new JsonlWriter('/dev/full');
      const writing = (async () => {
        for (let i = 0; i < lines; i++) await writer.write({ i, text: 'x'.repeat(500) });
        await writer.close();
      })();
      await expect(writing).rejects.toThrow(/^\/dev\/full could not be written \(ENOSPC.*the stage stops/);
      await writer.abort();
    }
  });

  it('says which file it could not read', async () => {
    const dir = tempDir();
    await expect(checksumFile(join(dir, 'missing.bin'))).rejects.toThrow(/missing\.bin/);
  });
});

describe('readLineBlocks', () => {
  it('cuts a file into blocks of whole lines that number and hold what readline reads, whatever the block size', async () => {
    const dir = tempDir();
    const random = seeded('lines');
    const pieces = [
      '{"a":1}',
      '',
      '   ',
      'ünï — ✓ 😀',
      '{"b":"x\\ny"}',
      '\r',
      '\r\n',
      '\n',
      '\n',
      '\n',
      'z'.repeat(300),
    ];
    for (let file = 0; file < 12; file++) {
      let text = file % 4 === 0 ? '\uFEFF' : '';
      for (let i = 0; i < 200; i++) text += pieces[Math.floor(random() * pieces.length)];
      const path = join(dir, `f${file}.jsonl`);
      writeFileSync(path, text);
      const expected = await readlineLines(path);
      expect(expected.length).toBeGreaterThan(50);
      for (const size of [1, 7, 64, 1 << 20]) {
        const { lines, damaged } = await blockLines(path, size);
        expect(damaged).toBeNull();
        expect(lines, `file ${file}, blocks of ${size}`).toEqual(expected);
      }
    }
  });

  it('yields the whole lines of a cut .gz, then where it broke off', async () => {
    const path = join(tempDir(), 'cut.jsonl.gz');
    const text = Array.from({ length: 3000 }, (_, i) =>
      JSON.stringify({ i, text: `reply ${(i * 7919) % 10007} ✓` }),
    ).join('\n');
    const gz = gzipSync(text);
    writeFileSync(path, gz.subarray(0, Math.floor(gz.length * 0.7)));
    const { lines, damaged } = await blockLines(path, 4096);
    expect(damaged).toMatch(/unexpected end of file.*\(the rest of the file is unread\)/);
    expect(lines.length).toBeGreaterThan(1000);
    expect(lines.length).toBeLessThan(3000);
    lines.forEach(([n, line]) => expect(JSON.parse(line)).toMatchObject({ i: n - 1 }));
  });
});

describe('readLineBlocks, its blocks given back to be read into again', () => {
  it('gives every line of a file back whole, however long the lines are against the blocks', async () => {
    const dir = tempDir();
    const random = seeded('own lines');
    for (const [file, size] of [
      [0, 8],
      [1, 64],
      [2, 1 << 20],
    ] as const) {
      const lines = Array.from({ length: 300 }, (_, i) =>
        JSON.stringify({ i, text: 'ünï ✓ 😀 '.repeat(Math.floor(random() * 40)) }),
      );
      const path = join(dir, `f${file}.jsonl`);
      // The last line of one file has no newline.
      writeFileSync(path, lines.join('\n') + (file === 1 ? '' : '\n'));
      const shelf = new BufferShelf();
      const read: string[] = [];
      for await (const block of readLineBlocks(path, size, shelf)) {
        if ('damaged' in block) throw new Error(block.damaged);
        const bytes = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.byteLength);
        forEachLine(bytes, (start, end) => read.push(bytes.toString('utf8', start, end)));
        shelf.put(block.bytes.buffer as ArrayBuffer);
      }
      expect(read, `blocks of ${size} bytes`).toEqual(lines);
    }
    const empty = join(dir, 'empty.jsonl');
    writeFileSync(empty, '');
    for await (const _ of readLineBlocks(empty)) throw new Error('an empty file has no block');
  });
});

describe('BufferShelf', () => {
  it('gives the smallest spare large enough and not four times too large, keeps only so many, and makes the rest anew', () => {
    const shelf = new BufferShelf(2);
    const [tiny, small, mid, large] = [
      new ArrayBuffer(50_000),
      new ArrayBuffer(100_000),
      new ArrayBuffer(300_000),
      new ArrayBuffer(5_000_000),
    ];
    shelf.put(large);
    shelf.put(small);
    shelf.put(tiny); // no room: two at most, and it is the smallest
    expect(shelf.take(90_000).buffer).toBe(small);
    shelf.put(tiny);
    shelf.put(mid); // a full shelf keeps the larger buffer in place of the smallest
    expect(shelf.take(90_000).buffer).toBe(mid);
    shelf.put(small);
    // The large one is too large for a request of 200 KB; a new buffer is made, of the size asked for rounded up to its class.
    const made = shelf.take(200_000);
    expect(made.buffer).not.toBe(large);
    expect(made.byteLength).toBe(sizeClass(200_000));
    expect(shelf.take(2_000_000).buffer).toBe(large);
  });

  it('rounds new buffers up to a size class, so that a slightly larger request finds the last one', () => {
    for (const bytes of [1, 4096, 4097, 65_536, 1_000_000, 1 << 20, (1 << 20) + 1, 123_456_789]) {
      expect(sizeClass(bytes)).toBeGreaterThanOrEqual(bytes);
      expect(sizeClass(bytes)).toBeLessThanOrEqual(Math.max(4096, 1.25 * bytes));
    }
    const shelf = new BufferShelf(1);
    const first = shelf.take((1 << 20) + 100);
    shelf.put(first.buffer as ArrayBuffer);
    expect(shelf.take((1 << 20) + 2000).buffer).toBe(first.buffer);
  });

  it('serves readLineBlocks its blocks again without changing a line read', async () => {
    const path = join(tempDir(), 'lines.jsonl');
    const random = seeded('shelf lines');
    const lines = Array.from({ length: 3000 }, (_, i) =>
      JSON.stringify({ i, text: 'ünï ✓ '.repeat(Math.floor(random() * 50)) }),
    );
    writeFileSync(path, lines.join('\n') + '\n');
    const shelf = new BufferShelf();
    const read: string[] = [];
    let blocks = 0;
    const buffers = new Set<ArrayBufferLike>();
    for await (const block of readLineBlocks(path, 4096, shelf)) {
      if ('damaged' in block) throw new Error(block.damaged);
      const bytes = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.byteLength);
      forEachLine(bytes, (start, end) => read.push(bytes.toString('utf8', start, end)));
      buffers.add(block.bytes.buffer);
      shelf.put(block.bytes.buffer as ArrayBuffer); // done with it: the reader fills it again
      blocks++;
    }
    expect(blocks).toBeGreaterThan(100);
    expect(read).toEqual(lines);
    // Every block but the first fits in the one before it (a line carried over asks a few bytes more).
    expect(buffers.size).toBeLessThanOrEqual(2);
  });
});
