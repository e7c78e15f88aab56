import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { int, pick, seeded } from '../../core/random.ts';
import { BufferShelf } from '../../pipeline/buffers.ts';
import {
  ELEMENT_FIELDS,
  elementWhere,
  readElementBlocks,
  readJsonArray,
  readLineBlocks,
  type RawRecord,
} from '../../pipeline/records.ts';
import { readBatch, type ReadingOptions } from '../../stages/ingest/segment.ts';
import { session, tempDir } from '../fixtures/pipeline.ts';

async function all(path: string): Promise<RawRecord[]> {
  const out: RawRecord[] = [];
  for await (const r of readJsonArray(path)) out.push(r);
  return out;
}

describe('JSON array reader', () => {
  it('cuts out every element across read chunks, whatever brackets, quotes and escapes the strings hold', async () => {
    const path = join(tempDir(), 'big.json');
    const elements = Array.from({ length: 3000 }, (_, i) => ({
      i,
      text: `a "quoted" ] }, [ { \\ string ${'x'.repeat(i % 50)}`,
      nested: [[i], { k: ']' }],
    }));
    writeFileSync(path, '\uFEFF  [\n' + elements.map((e) => JSON.stringify(e)).join(' ,\n') + '\n]\n');
    const records = await all(path);
    expect(records.map((r) => r.value)).toEqual(elements);
    expect(records[2]!.where).toBe('element 3 (line 4)');
  });

  it('numbers every element by the line it starts on, whatever its strings hold, across read chunks', async () => {
    const rand = seeded('json array lines');
    // \u0001 stands for a newline written raw inside a string (not JSON: the element is reported, and its
    // lines still count); the long piece makes strings run across the reader's chunks.
    const pieces = [
      'plain',
      'a "quote"',
      'back\\slash\\',
      'ünï 🙂',
      'escaped\nnewline',
      ']}[{,"',
      '\u0001raw',
      'ends\u0001',
      'then\u0001\\',
      'x'.repeat(70_000),
    ];
    let text = '\n[';
    const expected: { where: string; value: unknown }[] = [];
    for (let i = 0; i < 300; i++) {
      text += (i > 0 ? ',' : '') + pick(rand, ['', ' ', '\n', '\n\n  ', '\t']);
      const value = {
        i,
        text: Array.from({ length: int(rand, 1, 4) }, () => pick(rand, pieces)).join(' '),
        n: [i, { k: ']' }],
      };
      const json = JSON.stringify(value).replaceAll('\\u0001', '\n');
      expected.push({
        where: `element ${i + 1} (line ${text.split('\n').length})`,
        value: json.includes('\n') ? undefined : value,
      });
      text += json;
    }
    const path = join(tempDir(), 'lines.json');
    writeFileSync(path, text + '\n]\n');
    const records = await all(path);
    expect(records.map((r) => ({ where: r.where, value: r.value }))).toEqual(expected);
    expect(expected.filter((e) => e.value === undefined).length).toBeGreaterThan(20);
  });

  it('reports an element that is not JSON and goes on with the next', async () => {
    const path = join(tempDir(), 'bad.json');
    writeFileSync(path, '[\n{"a": 1},\n{"a": tru},\n{"a": 3}\n]');
    const records = await all(path);
    expect(records.map((r) => r.value ?? null)).toEqual([{ a: 1 }, null, { a: 3 }]);
    expect(records[1]).toMatchObject({ where: 'element 2 (line 3)', raw: '{"a": tru}' });
    expect(records[1]!.error).toMatch(/not valid JSON/);
  });

  it('refuses a file that is not an array, or an array that never closes, naming the line', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'obj.json'), '\n{"sessions": []}');
    await expect(all(join(dir, 'obj.json'))).rejects.toThrow(/obj\.json: line 2: expected a JSON array/);
    writeFileSync(join(dir, 'cut.json'), '[{"a": 1},\n{"a": ');
    await expect(all(join(dir, 'cut.json'))).rejects.toThrow(
      /cut\.json: line 2: the JSON array is not closed \(the file ends inside element 2\)/,
    );
  });
});

/** Every element of the blocks readElementBlocks gives at `size`: where it is and its text; and how many blocks. */
async function elementsInBlocks(
  path: string,
  size: number,
): Promise<{ blocks: number; elements: { where: string; raw: string }[] }> {
  const found: { where: string; raw: string }[] = [];
  let blocks = 0;
  for await (const { bytes, elements } of readElementBlocks(path, size)) {
    blocks++;
    const block = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let e = 0; e < elements.length; e += ELEMENT_FIELDS) {
      expect(elements[e + 1]!).toBeLessThanOrEqual(bytes.length);
      found.push({ where: elementWhere(elements, e), raw: block.toString('utf8', elements[e]!, elements[e + 1]!) });
    }
  }
  return { blocks, elements: found };
}

describe('JSON array blocks', () => {
  it('cut out the same elements, whole, whatever the block size, with blank of every kind around them', async () => {
    const rand = seeded('json array blocks');
    // Strings that end in escaped backslashes or quotes, and long ones, fall across block ends at every size.
    const pieces = [
      'plain',
      'a "quote"',
      'back\\slash\\',
      'ünï 🙂',
      ']}[{,"',
      'x'.repeat(700),
      '\\"',
      'tab\t',
      'y'.repeat(40) + '\\'.repeat(61) + '"',
    ];
    // Blank as JavaScript's \s is: ASCII, no-break and ideographic spaces, line separators, byte order marks.
    const blanks = ['', ' ', '\n', '\r\n  ', '\t', '\u00a0', '\u2028\n', '\u3000', '\ufeff', '\v\f'];
    let text = '\ufeff ' + pick(rand, blanks) + '[';
    const expected: { where: string; raw: string }[] = [];
    for (let i = 0; i < 250; i++) {
      if (i > 0) text += pick(rand, blanks) + ',' + (i % 37 === 0 ? ' ,' : ''); // now and then a blank element, not counted
      text += pick(rand, blanks);
      const value = {
        i,
        text: Array.from({ length: int(rand, 1, 3) }, () => pick(rand, pieces)).join(' '),
        n: [i, { k: ']' }],
      };
      const raw = i % 5 === 0 ? JSON.stringify(value, null, 2) : i % 11 === 0 ? `${i}` : JSON.stringify(value);
      expected.push({ where: `element ${i + 1} (line ${text.split('\n').length})`, raw });
      text += raw + pick(rand, blanks);
    }
    const path = join(tempDir(), 'blocks.json');
    writeFileSync(path, text + ']' + pick(rand, blanks) + '\u3000\n');
    // Blocks of 13 bytes are read 13 bytes at a time: every string and blank falls across a read's end somewhere.
    for (const size of [13, 256, 4096, 1 << 20]) {
      const { blocks, elements } = await elementsInBlocks(path, size);
      expect(elements, `blocks of ${size} bytes`).toEqual(expected);
      if (size <= 4096) expect(blocks).toBeGreaterThan(size <= 256 ? 30 : 5);
    }
    const gz = join(tempDir(), 'blocks.json.gz');
    writeFileSync(gz, gzipSync(text + ']'));
    expect((await elementsInBlocks(gz, 256)).elements).toEqual(expected);
  });

  it('give the whole elements before what is not an array, or follows it', async () => {
    const dir = tempDir();
    const cases: [string, string, RegExp][] = [
      ['after', '[1, {"a": [2]} ,\n3] x', /after\.json: line 2: unexpected 'x' after the closing '\]' of the array/],
      ['comma', '[1, 2],[3]', /line 1: unexpected ',' after the closing/],
      ['before', '\u00a0\n é[1]', /before\.json: line 2: expected a JSON array of records \('\[' first\), found 'é'/],
      [
        'cut',
        '[1, 2, {"a": "b\\"]',
        /cut\.json: line 1: the JSON array is not closed \(the file ends inside element 3\)/,
      ],
      ['empty', '\n \u3000', /empty\.json: empty file; expected a JSON array of records/],
    ];
    for (const [name, text, error] of cases) {
      const path = join(dir, `${name}.json`);
      writeFileSync(path, text);
      const seen: string[] = [];
      await expect(
        (async () => {
          for await (const { bytes, elements } of readElementBlocks(path, 1)) {
            for (let e = 0; e < elements.length; e += ELEMENT_FIELDS)
              seen.push(Buffer.from(bytes).toString('utf8', elements[e]!, elements[e + 1]!));
          }
        })(),
      ).rejects.toThrow(error);
      expect(seen, name).toEqual(
        { after: ['1', '{"a": [2]}', '3'], comma: ['1', '2'], before: [], cut: ['1', '2'], empty: [] }[name],
      );
    }
    writeFileSync(join(dir, 'fine.json'), '\ufeff[1]\u3000\u2029 \n');
    expect((await elementsInBlocks(join(dir, 'fine.json'), 1)).elements).toEqual([
      { where: 'element 1 (line 1)', raw: '1' },
    ]);
  });

  it("are read into the same sessions, reasons and ids as their elements' text read as records", async () => {
    const o: ReadingOptions = {
      format: 'json',
      mapping: {
        fields: {
          messages: 'messages',
          reward: 'reward',
          feedback: 'feedback',
          model: 'model',
          created_at: 'created_at',
        },
        message: { role: 'role', content: 'content', roles: {} },
        outOfRangeReward: 'reject',
        tools: null,
      },
      maxRecordBytes: 4096,
    };
    // As a Node logger writes them (their messages kept as stored), as Python does (", " and ": "), pretty,
    // and bad in every way a record can be.
    const elements = Array.from({ length: 120 }, (_, i) => {
      const s = session(
        i % 9 === 0 ? undefined : `s-${i}`,
        i % 4 === 0 ? null : `T${i % 7}`,
        (i % 3) / 2,
        `answer ${i} — ünï 🙂`,
      );
      switch (i % 8) {
        case 1:
          return JSON.stringify(s).replaceAll('","', '", "').replaceAll('":', '": ');
        case 2:
          return JSON.stringify(s, null, 2);
        case 3:
          return JSON.stringify({ ...s, reward: 3 });
        case 4:
          return JSON.stringify(s).replace('"reward":', '"reward":tru,"x":');
        case 5:
          return JSON.stringify({ ...s, messages: [{ role: 'robot', content: 'x' }] });
        case 6:
          return JSON.stringify({ ...s, padding: 'y'.repeat(5000) });
        default:
          return JSON.stringify(s);
      }
    });
    const bytes = Buffer.from(`[${elements.join(',\n')}]`);
    bytes[bytes.indexOf('answer 16')] = 0xff; // a byte that is not UTF-8
    const path = join(tempDir(), 'records.json');
    writeFileSync(path, bytes);
    const shelf = new BufferShelf();
    let asElements = { lines: '', records: [] as number[], notes: [] as string[] };
    let asRecords = { lines: '', records: [] as number[], notes: [] as string[] };
    // Outcomes without where a record's text lies (which only a block of bytes has) or its place in the batch.
    const kept = (records: Uint32Array) => Array.from(records).filter((_, k) => ![1, 2, 3].includes(k % 8));
    for await (const block of readElementBlocks(path, 1000)) {
      const records: RawRecord[] = [];
      const text = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.byteLength);
      for (let e = 0; e < block.elements.length; e += ELEMENT_FIELDS)
        records.push({
          where: elementWhere(block.elements, e),
          raw: text.toString('utf8', block.elements[e]!, block.elements[e + 1]!),
        });
      const fromRecords = readBatch({ records }, 'records.json', o, shelf);
      const fromBlock = readBatch(block, 'records.json', o, shelf);
      asElements = {
        lines: asElements.lines + Buffer.from(fromBlock.lines).toString(),
        records: [...asElements.records, ...kept(fromBlock.records)],
        notes: [...asElements.notes, ...fromBlock.notes],
      };
      asRecords = {
        lines: asRecords.lines + Buffer.from(fromRecords.lines).toString(),
        records: [...asRecords.records, ...kept(fromRecords.records)],
        notes: [...asRecords.notes, ...fromRecords.notes],
      };
    }
    expect(asElements).toEqual(asRecords);
    expect(asRecords.notes.length).toBeGreaterThanOrEqual(45);
    expect(asRecords.lines.split('\n').length).toBeGreaterThan(60);
    expect(asRecords.lines).toContain('"source":"records.json element 120 (line');
    expect(asRecords.records.filter((_, k) => k % 5 === 4).some((flags) => flags & 1)).toBe(true); // the byte that is not UTF-8
  });
});

/**
 * `text` gzipped, then damaged midway by random bytes, as two of 200 such files were found where the
 * compressed reads' size decided how much came before the damage (zlib drops what the failing read
 * inflated): the two trials of those 200 that showed it, each a file in `dir` named `t<trial><ext>`.
 */
function damagedGzFiles(text: string, ext: string): { trial: number; path: string }[] {
  let seed = 7;
  const rand = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
  const dir = tempDir();
  const files: { trial: number; path: string }[] = [];
  for (let trial = 0; trial <= 168; trial++) {
    const where = 0.05 + 0.9 * rand();
    const noise = Array.from({ length: 1 + Math.floor(rand() * 2000) }, () => Math.floor(rand() * 256));
    if (trial !== 40 && trial !== 168) continue;
    const gz = gzipSync(text, { level: 1 + (trial % 9) });
    gz.set(noise, Math.floor(gz.length * where));
    const path = join(dir, `t${trial}${ext}`);
    writeFileSync(path, gz);
    files.push({ trial, path });
  }
  return files;
}

const DAMAGED_RECORDS = Array.from({ length: 20_000 }, (_, i) =>
  JSON.stringify({ id: i, t: `x${(i * 7919) % 10007} ${'abc'.repeat(i % 17)}` }),
);
const BLOCK_SIZES = [64 << 10, 100 << 10, 200 << 10, 1 << 20];

/**
 * Reads each of the two damaged files at every block size (`read`: how many of `unit` it gave, and why it
 * stopped) and expects the same whatever the size, with something read and a damage told.
 */
async function expectSameAtEverySize(
  files: { trial: number; path: string }[],
  unit: string,
  read: (path: string, size: number) => Promise<[number, string]>,
): Promise<void> {
  expect(files).toHaveLength(2);
  for (const { trial, path } of files) {
    const outcomes: string[] = [];
    for (const size of BLOCK_SIZES) {
      const [count, damaged] = await read(path, size);
      outcomes.push(`${count} ${unit}, then ${damaged}`);
    }
    expect(outcomes[0]).toMatch(new RegExp(`^\\d+ ${unit}, then .+`));
    expect(new Set(outcomes).size, `trial ${trial}: ${outcomes.join(' | ')}`).toBe(1);
  }
}

describe('gzip line blocks', () => {
  it('keep the same lines of a file damaged midway whatever the block size (which the threads set)', async () => {
    await expectSameAtEverySize(
      damagedGzFiles(DAMAGED_RECORDS.join('\n') + '\n', '.jsonl.gz'),
      'lines',
      async (path, size) => {
        let lines = 0;
        let damaged = '';
        for await (const block of readLineBlocks(path, size)) {
          if ('bytes' in block) lines += block.bytes.filter((c) => c === 10).length;
          else damaged = block.damaged;
        }
        return [lines, damaged];
      },
    );
  });

  it('keep the same elements of a JSON array damaged midway whatever the block size', async () => {
    await expectSameAtEverySize(
      damagedGzFiles('[' + DAMAGED_RECORDS.join(',\n') + ']\n', '.json.gz'),
      'elements',
      async (path, size) => {
        let elements = 0;
        let damaged = '';
        try {
          for await (const block of readElementBlocks(path, size)) elements += block.elements.length / ELEMENT_FIELDS;
        } catch (error) {
          damaged = (error as Error).message;
        }
        return [elements, damaged];
      },
    );
  });
});
