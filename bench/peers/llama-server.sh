#!/usr/bin/env bash
# Builds llama.cpp's llama-server, the serving and decoding peer of `npm run bench:serve` and
# `bench:decode` (llama-batched-bench, built beside it), from the source node-llama-cpp ships (.ci/llama-cpp, installed by
# `npm ci --omit=optional --prefix .ci/llama-cpp`): offline, for this CPU, once; later calls print the
# cached binary's path. Tens of minutes (docs/experiments.md). Usage: bench/peers/llama-server.sh [cache folder]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/prefab/llama-server}"
bundle="$repo/.ci/llama-cpp/node_modules/node-llama-cpp/llama/gitRelease.bundle"
binary="$cache/build/bin/llama-server"
if [ -x "$binary" ] && [ -x "$cache/build/bin/llama-batched-bench" ]; then echo "$binary"; exit 0; fi
[ -f "$bundle" ] || { echo "no llama.cpp source at $bundle: npm ci --omit=optional --prefix .ci/llama-cpp" >&2; exit 1; }
mkdir -p "$cache"
[ -d "$cache/src" ] || git clone -q "$bundle" "$cache/src"
cmake -S "$cache/src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$cache/build" --target llama-server llama-batched-bench -j "${JOBS:-1}" >&2
echo "$binary"
