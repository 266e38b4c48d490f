#!/usr/bin/env bash
# The whole test suite, from a fresh Debian bookworm machine (root):
# dependencies, the LibTorch 1.13 build and its tests, the sanitizer lane
# (scripts/sanitize.sh), then the LibTorch 2.x lane (LibTorch 2.14) in a
# Debian testing (forky) chroot. Every lane runs whatever an earlier one did;
# the end is a summary of each, and the exit status is 1 if any failed.
# The LibTorch 2.6 lane (trixie): NANSCOPE_TORCH2_SUITE=trixie scripts/test-torch2.sh
# Set NANSCOPE_SKIP_TORCH2=1 to skip the 2.x lane, NANSCOPE_FUZZ_RUNS for longer fuzzing.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
start=$(date +%s)
"$repo/scripts/install-deps.sh" || exit 1

chroot_pid=
chroot_log=/tmp/nanscope-torch2-chroot.log
if [ "${NANSCOPE_SKIP_TORCH2:-0}" != 1 ]; then
  # Making the 2.x chroot (first use only) is mostly download and unpack: it
  # runs while the 1.13 lane builds and tests.
  "$repo/scripts/torch2-chroot.sh" >"$chroot_log" 2>&1 &
  chroot_pid=$!
  trap '[ -z "$chroot_pid" ] || wait "$chroot_pid" 2>/dev/null || true' EXIT
fi

summary=()
failed=0
# lane NAME COMMAND...: runs one lane, notes its result and time, and goes on.
lane() {
  local name=$1 t0=$(date +%s) status=0
  shift
  echo "== $name"
  "$@" || status=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$status" = 0 ]; then
    summary+=("$(printf '%-44s passed  %5d s' "$name" "$took")")
  else
    summary+=("$(printf '%-44s FAILED  %5d s (exit %d)' "$name" "$took" "$status")")
    failed=1
  fi
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
lane "Sanitizer lane (ASan + UBSan, fuzz regressions)" \
  env MAIN_BUILD_DIR="$build" "$repo/scripts/sanitize.sh" "${NANSCOPE_FUZZ_RUNS:-3000}"
[ -z "$chroot_pid" ] || lane "LibTorch 2.14 lane (Debian testing, forky chroot)" lane_torch2

echo "== test.sh: $(( $(date +%s) - start )) s in all"
printf '   %s\n' "${summary[@]}"
exit "$failed"
