#!/usr/bin/env bash
# The whole test suite, from a fresh Debian bookworm machine (root):
# dependencies, the LibTorch 1.13 build and its tests, then the LibTorch 2.x
# lane (LibTorch 2.14) in a Debian testing (forky) chroot with the sanitizer
# lane (scripts/sanitize.sh) beside it. Every lane runs whatever an earlier one did;
# the end is a summary of each, and the exit status is 1 if any failed.
# The LibTorch 2.6 lane (trixie): NANSCOPE_TORCH2_SUITE=trixie scripts/test-torch2.sh
# Set NANSCOPE_SKIP_TORCH2=1 to skip the 2.x lane, NANSCOPE_FUZZ_RUNS for longer fuzzing.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
start=$(date +%s)
"$repo/scripts/install-deps.sh" || exit 1

chroot_pid=
beside_pid=  # a lane running in the background (lane_beside)
chroot_log=/tmp/nanscope-torch2-chroot.log
if [ "${NANSCOPE_SKIP_TORCH2:-0}" != 1 ]; then
  # Making the 2.x chroot (first use only) is mostly download and unpack: it
  # runs while the 1.13 lane builds and tests.
  "$repo/scripts/torch2-chroot.sh" >"$chroot_log" 2>&1 &
  chroot_pid=$!
  trap 'for p in $chroot_pid $beside_pid; do wait "$p" 2>/dev/null || true; done' EXIT
fi

summary=()
failed=0
# record NAME SECONDS STATUS: one line of the summary.
record() {
  if [ "$3" = 0 ]; then
    summary+=("$(printf '%-44s passed  %5d s' "$1" "$2")")
  else
    summary+=("$(printf '%-44s FAILED  %5d s (exit %d)' "$1" "$2" "$3")")
    failed=1
  fi
}

# lane NAME COMMAND...: runs one lane, notes its result and time, and goes on.
lane() {
  local name=$1 t0=$(date +%s) status=0
  shift
  echo "== $name"
  "$@" || status=$?
  record "$name" $(( $(date +%s) - t0 )) "$status"
}

# lane_beside NAME COMMAND...: starts a lane in the background, its output kept
# in a file; lane_join waits for it and prints it. Two cores are not kept busy
# by one lane alone: its fuzz targets run one at a time, and a suite under
# ctest -j2 leaves about a quarter of the CPU idle between its processes.
beside_log=/tmp/nanscope-lane-beside.log
lane_beside() {
  beside_name=$1 beside_t0=$(date +%s)
  shift
  echo "== $beside_name: runs beside the next lane; its output follows that lane's"
  "$@" >"$beside_log" 2>&1 &
  beside_pid=$!
}
lane_join() {
  local status=0
  wait "$beside_pid" || status=$?
  beside_pid=
  echo "== $beside_name"
  cat "$beside_log"
  record "$beside_name" $(( $(date +%s) - beside_t0 )) "$status"
}

lane_113() {
  "$repo/scripts/build.sh" || return
  # The benchmarks are not run here, but one that no longer builds fails the lane.
  ninja -C "$build" -j2 benchmarks || return
  (cd "$build" && ctest -j2 --output-on-failure --timeout 600)
}

lane_torch2() {
  local status=0
  wait "$chroot_pid" || status=$?
  chroot_pid=
  cat "$chroot_log"
  [ "$status" = 0 ] || return "$status"
  "$repo/scripts/test-torch2.sh"
}

lane "LibTorch 1.13 lane (Debian bookworm)" lane_113
sanitizer=(env MAIN_BUILD_DIR="$build" "$repo/scripts/sanitize.sh" "${NANSCOPE_FUZZ_RUNS:-3000}")
if [ -z "$chroot_pid" ]; then
  lane "Sanitizer lane (ASan + UBSan, fuzz regressions)" "${sanitizer[@]}"
else
  # The sanitizer lane (clang, no LibTorch) fills what the 2.14 lane's build
  # and tests leave idle: from a fresh clone 1,927 s one after the other.
  lane_beside "Sanitizer lane (ASan + UBSan, fuzz regressions)" "${sanitizer[@]}"
  lane "LibTorch 2.14 lane (Debian testing, forky chroot)" lane_torch2
  lane_join
fi

echo "== test.sh: $(( $(date +%s) - start )) s in all"
printf '   %s\n' "${summary[@]}"
exit "$failed"
