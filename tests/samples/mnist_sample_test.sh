#!/usr/bin/env bash
# pytorch/examples' cpp/mnist with nanscope added (samples/mnist): on generated
# MNIST-format files with two planted faults, the guard names each birth's op,
# module and batch row at the right step and trains on; the same binary
# replays the internal birth's snapshot; nanscope-report reads the run.
# The example trains 10 epochs of 60000; the test stops it once the faults
# are behind it and 40 more steps have run.
# Usage: mnist_sample_test.sh MNIST_BINARY SAMPLE_DIR NANSCOPE_REPORT
set -euo pipefail
mnist=$1 sample=$2 report=$3
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
/usr/bin/python3 "$sample/make_mnist_files.py" data
# Batches of 64 in order: example 130 is step 2, row 2; example 700 is step 10, row 60.
NANSCOPE_MNIST_FAULTS="nan@130,max@700" "$mnist" >train.log 2>&1 &
pid=$!
for _ in $(seq 600); do
  if [ -f mnist-run/snapshots/step-0000010.h5 ] && "$report" mnist-run --json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["runs"][0]["summary"]["last_step"] >= 50 else 1)' 2>/dev/null; then
    break
  fi
  kill -0 "$pid" 2>/dev/null || { cat train.log; echo "mnist ended early"; exit 1; }
  sleep 0.5
done
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=
cat train.log | tr '\r' '\n'
expect() { grep -qF "$1" "$2" || { echo "missing from $2: $1"; exit 1; }; }
expect "step 2: first birth: nan at input (input) in module '', batch row 2" train.log
# The NaN at step 2 is the data's: skipped, no fallback (the library's fallback
# is auto), so step 10 still runs in bf16, and autocast's cast of conv1's input
# to bf16 is where the image of float's largest value (past bf16's) becomes Inf.
grep -qE "step 10: first birth: inf at aten::(to|_to_copy) \(forward\) in module 'conv1', batch row 60" train.log \
  || { echo "missing from train.log: step 10's birth in conv1, batch row 60"; exit 1; }
"$mnist" mnist-run/snapshots/step-0000010.h5 --json --no-write >replay.json 2>&1 || { cat replay.json; exit 1; }
cat replay.json
expect '"module": "conv1"' replay.json
expect '"draws_random_numbers": true' replay.json  # dropout: no batch bisection; the birth's row names the sample
"$report" mnist-run >report.txt
cat report.txt
expect "origin cpp" report.txt
expect "batch row 60" report.txt
echo "mnist: both births found, the snapshot replayed by the training binary, the run reported"
