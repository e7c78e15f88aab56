#!/usr/bin/env bash
# What a lent GPU machine needs, packed: ../shared/gpu/pack.sh (Node, the production node_modules, the Vulkan
# loader), then onnxruntime-node's binaries for other systems dropped from the packed node_modules, so that
# .gpu/ and .gl/ stay under the 64 MiB a GPU machine takes (its linux-x64 library alone is 32 MB, 8.5 MB
# compressed; all of its systems' are 247 MB). Run it at the project root instead of pack.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/gpu/pack.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
xz -dc .gpu/node_modules.tar.xz | tar -C "$tmp" -xf -
ort="$tmp/node_modules/onnxruntime-node/bin"
[ -d "$ort" ] && find "$ort" -mindepth 3 -maxdepth 3 -type d ! -path '*/linux/x64' -exec rm -rf {} +
tar -C "$tmp" -cf - node_modules | xz -T0 -6 > .gpu/node_modules.tar.xz
du -sh .gpu .gl
