#!/usr/bin/env bash
# Data-parallel scaling of nanscope-train on this machine: 1, 2 and 4 ranks
# (c10d Gloo over 127.0.0.1, one intra-op thread per rank), the same per-rank
# batch (weak scaling: the global batch grows with the ranks). Rounds
# interleave the rank counts so all see the same machine load. Prints each
# run, then per rank count: median steps/s, samples/s, median step, median
# time in the gradient all-reduce and its share of the step. The baseline row
# is one process using every core for the same global batch as the largest
# rank count that fits one rank per core: is data parallelism worth it here?
# Usage: bench/dist_scaling.sh [BUILD_DIR] [ROUNDS]   (env RANKS="1 2 4", STEPS=60, MODEL=gpt)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
rounds=${2:-3}
ranks_list=${RANKS:-1 2 4}
steps=${STEPS:-60}
batch=8
sizes=(--model "${MODEL:-gpt}" --n-layer 2 --n-head 4 --n-embd 64 --seq-len 64)
exe="$build/trainer/nanscope-train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
port=$((29600 + RANDOM % 300))

cores=$(nproc)
declare -A sps step ar
threads_sps=()
for r in $(seq 1 "$rounds"); do
  t=$("$exe" "${sizes[@]}" --batch-size $((batch * cores)) --steps "$steps" --threads "$cores" --quiet \
      --run-dir "$tmp/threads" | sed -n 's/.*, \([0-9.e+]*\) steps\/s (median step.*/\1/p')
  echo "round $r, 1 process x $cores threads, batch $((batch * cores)): $t steps/s"
  threads_sps+=("$t")
  for n in $ranks_list; do
    port=$((port + 1))
    pids=()
    for rank in $(seq 0 $((n - 1))); do
      RANK=$rank WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$exe" "${sizes[@]}" --batch-size $batch --steps "$steps" --threads 1 --quiet --run-dir "$tmp/r$n" >"$tmp/out$rank" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$tmp"/out*; exit 1; }; done
    s=$(sed -n 's/.*, \([0-9.e+]*\) steps\/s (median step \([0-9.e+]*\) ms).*/\1 \2/p' "$tmp/out0")
    a=$(sed -n 's/.*median all-reduce \([0-9.e+-]*\) ms.*/\1/p' "$tmp/out0")
    a=${a:-0}
    echo "round $r, $n rank(s): $(echo "$s" | awk '{printf "%.1f steps/s, median step %.2f ms", $1, $2}'), all-reduce $a ms"
    sps[$n]+="$(echo "$s" | cut -d' ' -f1) "; step[$n]+="$(echo "$s" | cut -d' ' -f2) "; ar[$n]+="$a "
  done
done
echo "medians over $rounds rounds (gpt 2x64, $batch samples/rank/step, $steps steps, 1 thread per rank, $cores cores):"
base=""
for n in $ranks_list; do
  # shellcheck disable=SC2086
  m=$(median ${sps[$n]}); st=$(median ${step[$n]}); a=$(median ${ar[$n]})
  base=${base:-$m}
  awk -v n="$n" -v m="$m" -v st="$st" -v a="$a" -v b="$base" -v B=$batch 'BEGIN {
    printf "  %d rank(s): %6.1f steps/s  %7.1f samples/s  (x%.2f of 1 rank)  step %6.2f ms  all-reduce %5.2f ms = %4.1f%% of the step\n",
      n, m, m * n * B, m * n / b, st, a, 100 * a / st }'
done
tm=$(median "${threads_sps[@]}")
awk -v m="$tm" -v b="$base" -v c="$cores" -v B=$batch 'BEGIN {
  printf "  baseline: 1 process x %d threads, batch %d: %6.1f steps/s  %7.1f samples/s  (x%.2f of 1 rank)\n",
    c, B * c, m, m * B * c, m * c / b }'
