#!/usr/bin/env bash
# Median step time of nanscope-train on a small GPT against the same model and
# loop in plain Python PyTorch (Debian's python3-torch), interleaved in one run
# so both see the same machine load. Prints each round and the ratio of medians.
# Usage: bench/train_vs_python.sh [BUILD_DIR] [ROUNDS]   (env AMP=off|bf16, THREADS=2)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
rounds=${2:-5}
amp=${AMP:-off}
threads=${THREADS:-2}
sizes=(--n-layer 4 --n-head 4 --n-embd 128 --seq-len 64 --batch-size 16)
steps=60
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpp=() py=() probe_off=() hooks=()
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for r in $(seq 1 "$rounds"); do
  # Median over the steps of one run, excluding nothing: the trainer reports it.
  c=$("$build/trainer/nanscope-train" --model gpt "${sizes[@]}" --steps $steps --no-shuffle --amp "$amp" \
      --threads "$threads" --quiet --run-dir "$tmp/on" | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p')
  o=$("$build/trainer/nanscope-train" --model gpt "${sizes[@]}" --steps $steps --no-shuffle --amp "$amp" \
      --threads "$threads" --quiet --probe off --run-dir "$tmp/off" | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p')
  # nanscope-train runs OpenBLAS on one thread beside ATen's pool (trainer/setup.cpp);
  # Python gets the same BLAS setting so both loops run the same kernels the same way.
  p=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$repo/bench/python_gpt_loop.py" "${sizes[@]}" --steps $steps --amp "$amp" \
      --threads "$threads" | sed -n 's/median_step_ms=//p')
  h=$(OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$repo/bench/python_gpt_loop.py" "${sizes[@]}" --steps $steps --amp "$amp" \
      --threads "$threads" --nan-hooks | sed -n 's/median_step_ms=//p')
  echo "round $r: nanscope-train ${c} ms (probe off ${o} ms), python ${p} ms (with NaN forward hooks ${h} ms)"
  cpp+=("$c"); probe_off+=("$o"); py+=("$p"); hooks+=("$h")
done
mc=$(median "${cpp[@]}"); mo=$(median "${probe_off[@]}"); mp=$(median "${py[@]}"); mh=$(median "${hooks[@]}")
echo "median step: nanscope-train ${mc} ms, probe off ${mo} ms, python ${mp} ms (gpt 4x128, batch 16x64, amp $amp, $threads threads)"
awk -v c="$mc" -v p="$mp" -v o="$mo" -v h="$mh" 'BEGIN {printf "ratio nanscope-train / python = %.3f   probe on / off = %.3f   python NaN hooks / python = %.3f\n", c/p, c/o, h/p}'
