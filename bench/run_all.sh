#!/usr/bin/env bash
# All benchmarks, one after the other (each interleaves its own modes).
# Usage: bench/run_all.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
cmake --build "$build" --target benchmarks  # not in the default build
echo "== probe overhead and capture cost (C++, one process)"
"$build/bench/probe_overhead" 7 20 "${THREADS:-2}"
echo "== early warnings and rollback: on vs off, the state ring, a restart"
"$build/bench/sentinel_overhead" "$build/trainer/nanscope-train" 7 50 "${THREADS:-2}"
echo "== import nanscope: the guard around a Python bf16 loop, and anomaly mode"
PYTHONPATH="$build/python" /usr/bin/python3 "$repo/bench/python_guard_overhead.py"
echo "== nanscope-train vs the same loop in Python PyTorch"
"$repo/bench/train_vs_python.sh" "$build" 5
echo "== data-parallel scaling: 1, 2, 4 ranks over c10d Gloo"
"$repo/bench/dist_scaling.sh" "$build" 3
