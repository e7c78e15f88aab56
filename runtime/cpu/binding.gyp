{
  "targets": [
    {
      "target_name": "prefab_cpu",
      "sources": ["prefab_cpu.c", "decode.c", "sampling.c"],
      "cflags": ["-O3", "-march=native", "-std=gnu11"],
      "libraries": ["-ldl", "-lm", "-lpthread"],
      "xcode_settings": { "OTHER_CFLAGS": ["-O3"] }
    }
  ]
}
