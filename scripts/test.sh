#!/usr/bin/env bash
# The whole test suite, from a fresh Debian bookworm machine (root):
# dependencies, the LibTorch 1.13 build and its tests, then the LibTorch 2.x
# lane (LibTorch 2.14) in a Debian testing (forky) chroot; between them the
# sanitizer lane (scripts/sanitize.sh). The LibTorch 2.6 lane (trixie):
# NANSCOPE_TORCH2_SUITE=trixie scripts/test-torch2.sh
# Set NANSCOPE_SKIP_TORCH2=1 to skip the 2.x lane, NANSCOPE_FUZZ_RUNS for longer fuzzing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
start=$(date +%s)
"$repo/scripts/install-deps.sh"

chroot_pid=
chroot_log=/tmp/nanscope-torch2-chroot.log
if [ "${NANSCOPE_SKIP_TORCH2:-0}" != 1 ]; then
  # Making the 2.x chroot (first use only) is mostly download and unpack: it
  # runs while the 1.13 lane builds and tests. A failing lane waits for it, so
  # no half-made chroot is left behind.
  "$repo/scripts/torch2-chroot.sh" >"$chroot_log" 2>&1 &
  chroot_pid=$!
  trap '[ -z "$chroot_pid" ] || wait "$chroot_pid" 2>/dev/null || true' EXIT
fi

echo "== LibTorch 1.13 lane (Debian bookworm)"
"$repo/scripts/build.sh"
# The benchmarks are not run here, but one that no longer builds fails the lane.
ninja -C "${BUILD_DIR:-$repo/build}" -j2 benchmarks
(cd "${BUILD_DIR:-$repo/build}" && ctest -j2 --output-on-failure --timeout 600)
lane1=$(( $(date +%s) - start ))

echo "== Sanitizer lane (clang ASan + UBSan: formats, options, the viewer's model; short fuzz runs)"
MAIN_BUILD_DIR="${BUILD_DIR:-$repo/build}" "$repo/scripts/sanitize.sh" "${NANSCOPE_FUZZ_RUNS:-3000}"


if [ -n "$chroot_pid" ]; then
  echo "== LibTorch 2.14 lane (Debian testing, forky chroot)"
  status=0
  wait "$chroot_pid" || status=$?
  chroot_pid=
  cat "$chroot_log"
  [ "$status" = 0 ] || exit "$status"
  "$repo/scripts/test-torch2.sh"
fi
echo "test.sh: 1.13 lane ${lane1}s, total $(( $(date +%s) - start ))s"
