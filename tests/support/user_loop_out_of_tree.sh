#!/usr/bin/env bash
# A project of your own against the installed package: cmake --install this
# build into a temporary prefix, build samples/user_loop out of tree with
# find_package(nanscope), train (the guard writes a snapshot at the planted
# step) and replay that snapshot with the project's own replay program; the
# same for its GAN of two guarded models (two_models), with and without the
# critic the generator's loss runs, for its L-BFGS fit (lbfgs_fit) and for its
# LSTM with a nested batch and a loss that raises (lstm_sequences).
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
cmake --build "$work/build" -j2
"$work/build/user_loop" "$work/run" | tee "$work/train.log"
grep -qF "step 12: first birth: inf at aten::log1p (forward) in module '', batch row 3" "$work/train.log"
"$work/build/user_loop" "$work/run/snapshots/step-0000012.h5" --json --no-write | tee "$work/replay.json"
grep -q '"verdict": "model_or_data"' "$work/replay.json"
grep -q '"category": "log_nonpositive"' "$work/replay.json"
"$work/build/two_models" "$work/gan" | tee "$work/gan.log"
grep -qF "step 3: first birth: inf at aten::div (forward) in module '<not in the model> critic', batch row 5" "$work/gan.log"
grep -qF "bit-identical to the plain loop" "$work/gan.log"
gan_snapshot=$work/gan/generator/snapshots/step-0000003.h5
"$work/build/two_models" "$gan_snapshot" --json --no-write | tee "$work/gan-replay.json"
grep -q '"category": "div_by_zero"' "$work/gan-replay.json"
code=0
"$work/build/two_models" "$gan_snapshot" --no-write --without-critic 2>"$work/gan-refused.log" || code=$?
cat "$work/gan-refused.log"
[ "$code" = 2 ] && grep -qF "the step's loss also ran 'critic'" "$work/gan-refused.log"
"$work/build/lbfgs_fit" "$work/lbfgs" | tee "$work/lbfgs.log"
grep -qF "weights as before the step; dtype double" "$work/lbfgs.log"
"$work/build/lbfgs_fit" "$work/lbfgs/snapshots/step-0000001.h5" --json --no-write | tee "$work/lbfgs-replay.json"
grep -q '"op": "aten::log"' "$work/lbfgs-replay.json"
"$work/build/lstm_sequences" "$work/sequences" | tee "$work/sequences.log"
grep -qF "step 4: first birth: nan at input '[0]' (input) in module '', batch row 3" "$work/sequences.log"
"$work/build/lstm_sequences" "$work/sequences/snapshots/step-0000004.h5" --json --no-write | tee "$work/sequences.json"
grep -q '"verdict": "data"' "$work/sequences.json"
echo "out-of-tree user loops: installed, found, built, trained, replayed"
