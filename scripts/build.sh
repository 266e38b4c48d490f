#!/usr/bin/env bash
# Configures and builds nanscope in BUILD_DIR (default build/) against the
# system LibTorch, or the one CMAKE_PREFIX_PATH points at.
# Usage: scripts/build.sh [TARGET...]   (default: everything, tests included)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
mkdir -p "$build"
# The configure log stays in the build directory, never beside the sources.
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
ninja -C "$build" -j"${JOBS:-$(nproc)}" "$@"
