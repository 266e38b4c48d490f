#!/usr/bin/env bash
# pytorch/examples' cpp/mnist with nanscope added (samples/mnist): on generated
# MNIST-format files with two planted faults, the guard names each birth's op,
# module and batch row at the right step, trains on, and the same binary
# replays the internal birth's snapshot.
# Usage: mnist_sample_test.sh MNIST_BINARY SAMPLE_DIR
set -euo pipefail
mnist=$1 sample=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
/usr/bin/python3 "$sample/make_mnist_files.py" data 640 100
# 640 examples are 10 batches of 64 per epoch: example 130 is step 2, row 2;
# example 700 is step 10 (the second epoch's first batch), row 60.
NANSCOPE_MNIST_FAULTS="nan@130,max@700" "$mnist" >train.log 2>&1 || { cat train.log; exit 1; }
cat train.log
expect() { grep -qF "$1" "$2" || { echo "missing from $2: $1"; exit 1; }; }
expect "step 2: first birth: nan at input (input) in module '', batch row 2" train.log
expect "step 10: first birth: inf at aten::conv2d (forward) in module 'conv1', batch row 60" train.log
expect "Test set: Average loss:" train.log  # it trained on to the end
test -f mnist-run/run.h5
"$mnist" mnist-run/snapshots/step-0000010.h5 --json --no-write >replay.json 2>&1 || { cat replay.json; exit 1; }
cat replay.json
expect '"module": "conv1"' replay.json
expect '"draws_random_numbers": true' replay.json  # dropout: no batch bisection; the birth's row names the sample
echo "mnist: both births found and the snapshot replayed by the training binary"
