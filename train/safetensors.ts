// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw little-endian data. Float32 only.
import { readFileSync, writeFileSync } from 'node:fs';

export interface NamedTensor {
  shape: number[];
  data: Float32Array;
}

export function writeSafetensors(path: string, tensors: Map<string, NamedTensor>, metadata: Record<string, string> = {}): void {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const [name, t] of tensors) {
    const size = t.shape.reduce((a, b) => a * b, 1);
    if (size !== t.data.length) throw new Error(`safetensors: ${name} has ${t.data.length} values for shape [${t.shape}]`);
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + 4 * size] };
    offset += 4 * size;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8); // the data starts 8-byte aligned
  const head = Buffer.from(json, 'utf8');
  const out = Buffer.alloc(8 + head.length + offset);
  out.writeBigUInt64LE(BigInt(head.length), 0);
  head.copy(out, 8);
  let at = 8 + head.length;
  for (const t of tensors.values()) {
    Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).copy(out, at);
    at += t.data.byteLength;
  }
  writeFileSync(path, out);
}

export function readSafetensors(path: string): { tensors: Map<string, NamedTensor>; metadata: Record<string, string> } {
  const buf = readFileSync(path);
  const fail = (why: string) => new Error(`${path}: not a safetensors file this reader supports (${why})`);
  if (buf.length < 8) throw fail('shorter than its header');
  const n = Number(buf.readBigUInt64LE(0));
  if (8 + n > buf.length) throw fail('header runs past the end of the file');
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const base = 8 + n;
  const tensors = new Map<string, NamedTensor>();
  let metadata: Record<string, string> = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = info as unknown as Record<string, string>;
      continue;
    }
    if (info.dtype !== 'F32') throw fail(`${name} is ${info.dtype}; only F32 is read`);
    const [begin, end] = info.data_offsets;
    if (base + end > buf.length || end - begin !== 4 * info.shape.reduce((a, b) => a * b, 1)) throw fail(`${name}'s byte range does not match its shape`);
    const data = new Float32Array(buf.buffer.slice(buf.byteOffset + base + begin, buf.byteOffset + base + end));
    tensors.set(name, { shape: info.shape, data });
  }
  return { tensors, metadata };
}
