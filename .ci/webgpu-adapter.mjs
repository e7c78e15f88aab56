// Exit 0 when WebGPU (the optional webgpu package's dawn.node) finds an adapter here, printing it; 1 otherwise.
try {
  const { create } = await import('webgpu');
  const instance = create([]);
  const adapter = await instance.requestAdapter();
  if (!adapter) throw new Error('no adapter');
  console.log(`WebGPU adapter: ${adapter.info.description || adapter.info.vendor}`);
  process.exit(0);
} catch (error) {
  console.log(`no WebGPU adapter (${error.message})`);
  process.exit(1);
}
