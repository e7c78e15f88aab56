import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { int, pick, seeded } from '../../core/random.ts';
import { readJsonArray, readLineBlocks, type RawRecord } from '../../pipeline/records.ts';
import { tempDir } from '../fixtures/pipeline.ts';

async function all(path: string): Promise<RawRecord[]> {
  const out: RawRecord[] = [];
  for await (const r of readJsonArray(path)) out.push(r);
  return out;
}

describe('JSON array reader', () => {
  it('cuts out every element across read chunks, whatever brackets, quotes and escapes the strings hold', async () => {
    const path = join(tempDir(), 'big.json');
    const elements = Array.from({ length: 3000 }, (_, i) => ({ i, text: `a "quoted" ] }, [ { \\ string ${'x'.repeat(i % 50)}`, nested: [[i], { k: ']' }] }));
    writeFileSync(path, '\uFEFF  [\n' + elements.map((e) => JSON.stringify(e)).join(' ,\n') + '\n]\n');
    const records = await all(path);
    expect(records.map((r) => r.value)).toEqual(elements);
    expect(records[2]!.where).toBe('element 3 (line 4)');
  });

  it('numbers every element by the line it starts on, whatever its strings hold, across read chunks', async () => {
    const rand = seeded('json array lines');
    // \u0001 stands for a newline written raw inside a string (not JSON: the element is reported, and its
    // lines still count); the long piece makes strings run across the reader's chunks.
    const pieces = ['plain', 'a "quote"', 'back\\slash\\', 'ünï 🙂', 'escaped\nnewline', ']}[{,"', '\u0001raw', 'ends\u0001', 'then\u0001\\', 'x'.repeat(70_000)];
    let text = '\n[';
    const expected: { where: string; value: unknown }[] = [];
    for (let i = 0; i < 300; i++) {
      text += (i > 0 ? ',' : '') + pick(rand, ['', ' ', '\n', '\n\n  ', '\t']);
      const value = { i, text: Array.from({ length: int(rand, 1, 4) }, () => pick(rand, pieces)).join(' '), n: [i, { k: ']' }] };
      const json = JSON.stringify(value).replaceAll('\\u0001', '\n');
      expected.push({ where: `element ${i + 1} (line ${text.split('\n').length})`, value: json.includes('\n') ? undefined : value });
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
    await expect(all(join(dir, 'cut.json'))).rejects.toThrow(/cut\.json: line 2: the JSON array is not closed \(the file ends inside element 2\)/);
  });
});

describe('gzip line blocks', () => {
  it('keep the same lines of a file damaged midway whatever the block size (which the threads set)', async () => {
    const text = Array.from({ length: 20_000 }, (_, i) => JSON.stringify({ id: i, t: `x${(i * 7919) % 10007} ${'abc'.repeat(i % 17)}` })).join('\n') + '\n';
    // Bytes overwritten midway, as two of 200 such files were found where the compressed reads' size decided
    // how many lines came before the damage (zlib drops what the failing read inflated).
    let seed = 7;
    const rand = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
    const dir = tempDir();
    for (let trial = 0; trial <= 168; trial++) {
      const where = 0.05 + 0.9 * rand();
      const noise = Array.from({ length: 1 + Math.floor(rand() * 2000) }, () => Math.floor(rand() * 256));
      if (trial !== 40 && trial !== 168) continue;
      const gz = gzipSync(text, { level: 1 + (trial % 9) });
      gz.set(noise, Math.floor(gz.length * where));
      const path = join(dir, `t${trial}.jsonl.gz`);
      writeFileSync(path, gz);
      const read: string[] = [];
      for (const size of [64 << 10, 100 << 10, 200 << 10, 1 << 20]) {
        let lines = 0;
        let damaged = '';
        for await (const block of readLineBlocks(path, size)) {
          if ('bytes' in block) lines += block.bytes.filter((c) => c === 10).length;
          else damaged = block.damaged;
        }
        read.push(`${lines} lines, then ${damaged}`);
      }
      expect(read[0]).toMatch(/^\d+ lines, then .+/);
      expect(new Set(read).size, `trial ${trial}: ${read.join(' | ')}`).toBe(1);
    }
  });
});
