// JsonlWriter.bytes is where the next record starts in the file, in bytes (a shard's chunk index relies on
// it), whatever the records hold and however much is still on its way to disk.
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { tempDir } from '../fixtures/pipeline.ts';

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
    expect(JSON.parse(file.subarray(starts[250]!, starts[251]! - 1).toString('utf8'))).toEqual({ i: 250, text: `ünïcødé — ${'✓'.repeat(250 % 7)} 😀` });
  });
});
