// The part of the WebAssembly JavaScript API that runtime/attention-wasm.ts and runtime/decode.ts use: Node has
// it as a global, but TypeScript declares it only in the DOM library, which this project does not load.
declare namespace WebAssembly {
  class Module {
    constructor(bytes: Uint8Array);
  }
  class Instance {
    constructor(module: Module, imports: Record<string, Record<string, unknown>>);
    readonly exports: Record<string, unknown>;
  }
  class Memory {
    constructor(descriptor: { initial: number; maximum?: number });
    readonly buffer: ArrayBuffer;
    /** Adds `pages` pages of 64 KiB; detaches the old buffer. */
    grow(pages: number): number;
  }
}
