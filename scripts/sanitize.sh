#!/usr/bin/env bash
# The sanitizer lane: everything without LibTorch (the file formats, the
# option parsing, the viewer's model) and their tests built with clang's
# AddressSanitizer and UndefinedBehaviorSanitizer, then every fuzz target for
# a short run (FUZZ_RUNS executions each; tests/fuzz/run.sh for long ones).
# Usage: scripts/sanitize.sh [FUZZ_RUNS=3000]   (env SANITIZE_BUILD_DIR, MAIN_BUILD_DIR)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${SANITIZE_BUILD_DIR:-$repo/build-sanitize}
runs=${1:-3000}
# fuzzer-no-link: the libraries get libFuzzer's coverage counters too, so
# the fuzzer is guided by the readers' code, not only by the targets'.
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNANSCOPE_LIGHT=ON -DNANSCOPE_FUZZ=ON -DNANSCOPE_BUILD_BENCH=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j2
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$repo/tests/fuzz/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The tests and the fuzz regressions both run; either failing fails the lane.
status=0
(cd "$build" && ctest -j2 --output-on-failure --timeout 300) || status=1
FUZZ_SEED=${FUZZ_SEED:-1} "$repo/tests/fuzz/run.sh" "$build" "$runs" "${MAIN_BUILD_DIR:-$repo/build}" || status=1
exit $status
