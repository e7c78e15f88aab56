// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw little-endian data. Written in float32;
// read from float32, bfloat16 or float16 (converted to float32).
import { readFileSync, writeFileSync } from 'node:fs';

export interface NamedTensor {
  shape: number[];
  data: Float32Array;
}

export function writeSafetensors(
  path: string,
  tensors: Map<string, NamedTensor>,
  metadata: Record<string, string> = {},
): void {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const [name, t] of tensors) {
    const size = t.shape.reduce((a, b) => a * b, 1);
    if (size !== t.data.length)
      throw new Error(`safetensors: ${name} has ${t.data.length} values for shape [${t.shape}]`);
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

/** Bytes a value of each dtype this reader converts takes. */
const WIDTH: Record<string, number> = { F32: 4, BF16: 2, F16: 2 };

/** IEEE half → float32. */
function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24;
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

/** The values of a tensor's bytes as float32. */
function toFloat32(bytes: Buffer, dtype: string): Float32Array {
  if (dtype === 'F32')
    return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  const out = new Float32Array(bytes.byteLength / 2);
  if (dtype === 'BF16') {
    // bfloat16 is the top half of a float32's bits.
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < out.length; i++) bits[i] = bytes.readUInt16LE(2 * i) << 16;
  } else for (let i = 0; i < out.length; i++) out[i] = halfToFloat(bytes.readUInt16LE(2 * i));
  return out;
}

export function readSafetensors(path: string): {
  tensors: Map<string, NamedTensor>;
  metadata: Record<string, string>;
  dtypes: string[];
} {
  const buf = readFileSync(path);
  const fail = (why: string) => new Error(`${path}: not a safetensors file this reader supports (${why})`);
  if (buf.length < 8) throw fail('shorter than its header');
  const n = Number(buf.readBigUInt64LE(0));
  if (8 + n > buf.length) throw fail('header runs past the end of the file');
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8')) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const base = 8 + n;
  const tensors = new Map<string, NamedTensor>();
  const dtypes = new Set<string>();
  let metadata: Record<string, string> = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = info as unknown as Record<string, string>;
      continue;
    }
    const width = WIDTH[info.dtype];
    if (!width) throw fail(`${name} is ${info.dtype}; F32, BF16 and F16 are read`);
    const [begin, end] = info.data_offsets;
    if (base + end > buf.length || end - begin !== width * info.shape.reduce((a, b) => a * b, 1))
      throw fail(`${name}'s byte range does not match its shape`);
    dtypes.add(info.dtype);
    tensors.set(name, { shape: info.shape, data: toFloat32(buf.subarray(base + begin, base + end), info.dtype) });
  }
  return { tensors, metadata, dtypes: [...dtypes] };
}
