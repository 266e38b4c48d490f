#!/usr/bin/env bash
# The whole test suite, from a fresh Debian bookworm machine (root):
# dependencies, the LibTorch 1.13 build and its tests, then the LibTorch 2.x
# lane in a trixie chroot. Set NANSCOPE_SKIP_TORCH2=1 to run the first lane only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$(date +%s)
"$repo/scripts/install-deps.sh"
echo "== LibTorch 1.13 lane (Debian bookworm)"
"$repo/scripts/build.sh"
(cd "${BUILD_DIR:-$repo/build}" && ctest -j2 --output-on-failure --timeout 600)
lane1=$(( $(date +%s) - start ))
if [ "${NANSCOPE_SKIP_TORCH2:-0}" != 1 ]; then
  echo "== LibTorch 2.x lane (Debian trixie chroot)"
  "$repo/scripts/test-torch2.sh"
fi
echo "test.sh: 1.13 lane ${lane1}s, total $(( $(date +%s) - start ))s"
