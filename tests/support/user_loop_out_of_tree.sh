#!/usr/bin/env bash
# A project of your own against the installed package: cmake --install this
# build into a temporary prefix, configure samples/user_loop out of tree with
# find_package(nanscope), build its README loop (user_loop), train (the guard
# writes a snapshot at the planted step) and replay that snapshot with the
# project's own replay program. The project's other programs include the
# same two headers and link the same two libraries; this build runs them
# in its own tests (two_models, lbfgs_fit, lstm_sequences), and building
# them here again took 3 of this test's 4 compiles (about 90 s).
# Of core's headers only those a loop includes are installed.
# Usage: user_loop_out_of_tree.sh BUILD_DIR SOURCE_DIR [CMAKE_PREFIX_PATH]
set -euo pipefail
build=$1 source=$2 prefix_path=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The guard's face is installed, its inside is not.
test -f "$work/prefix/include/nanscope/core/step_guard.hpp"
for inside in journal.hpp train_step.hpp state_ring.hpp recovery_memory.hpp loss_scaler.hpp; do
  if [ -e "$work/prefix/include/nanscope/core/$inside" ]; then echo "installed: core/$inside" >&2; exit 1; fi
done
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source/samples/user_loop" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$work/prefix${prefix_path:+;$prefix_path}" "${launcher[@]}" >"$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" --target user_loop
"$work/build/user_loop" "$work/run" | tee "$work/train.log"
grep -qF "step 12: first birth: inf at aten::log1p (forward) in module '', batch row 3" "$work/train.log"
"$work/build/user_loop" "$work/run/snapshots/step-0000012.h5" --json --no-write | tee "$work/replay.json"
grep -q '"verdict": "model_or_data"' "$work/replay.json"
grep -q '"category": "log_nonpositive"' "$work/replay.json"
echo "out-of-tree user loop: installed, found, built, trained, replayed"
