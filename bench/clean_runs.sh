#!/usr/bin/env bash
# False alarms: long runs with nothing planted, counting the warning and
# rollback events each writes (goal: none). The built-in mlp (3 seeds x 3000
# steps); GPT-style models with LayerNorm, whose per-layer gradient norms are
# the noisiest (the built-in gpt and the corpus's two nanoGPTs, at three
# learning rates and several seeds, shuffled); and each other corpus model on
# its clean data (needs the corpus: ctest -R Corpus.Make, which writes
# BUILD_DIR/corpus). About 35,000 steps; ~10 minutes on 2 cores.
# Usage: bench/clean_runs.sh [BUILD_DIR] [CORPUS_STEPS=1000]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
corpus_steps=${2:-1000}
train="$build/trainer/nanscope-train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total_steps=0 total_warnings=0 total_rollbacks=0

# Prints "warnings rollbacks non-finite-steps" of a run file.
count_events() {
  /usr/bin/python3 - "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r", libver="latest", swmr=True) as f:
    kinds = [k.decode() for k in f["/events/kind"][:]]
    skipped = int(f["/steps/skipped"][:].sum())
print(kinds.count("warning"), kinds.count("rollback"), skipped)
PY
}

one_run() {  # NAME STEPS ARGS...
  local name=$1 steps=$2
  shift 2
  "$train" --steps "$steps" --quiet --threads 2 --run-dir "$tmp/$name" "$@" >/dev/null 2>&1 || true
  read -r w r bad < <(count_events "$tmp/$name/run.h5")
  if [ "$bad" -gt 0 ]; then
    # Real trouble, not a false alarm: what the guard did is its business.
    echo "  $name: $steps steps, went non-finite on $bad step(s) for real ($w warning(s), $r rollback(s)): not counted"
    return
  fi
  echo "  $name: $steps steps, $w warning(s), $r rollback(s)"
  total_steps=$((total_steps + steps)) total_warnings=$((total_warnings + w)) total_rollbacks=$((total_rollbacks + r))
}

echo "clean_runs: nothing planted; every warning or rollback is a false alarm"
for seed in 0 1 2; do one_run "mlp-seed$seed" 3000 --model mlp --amp bf16 --seed "$seed"; done
for lr in 0.0003 0.001 0.003; do
  for seed in 0 1 2; do one_run "gpt-lr$lr-seed$seed" 1000 --model gpt --amp bf16 --lr "$lr" --seed "$seed"; done
done
# The shape of an outside fine-tune that raised a false layer warning: 2 x 128,
# batch 8 x 64, its text in order (--no-shuffle), where a surprising window
# makes the grad norm jump 5-13x for a few steps.
for lr in 0.0003 0.001 0.003; do
  for seed in 0 1; do
    one_run "gpt-inorder-lr$lr-seed$seed" 1000 --model gpt --n-embd 128 --batch-size 8 --seq-len 64 --no-shuffle \
      --amp bf16 --lr "$lr" --seed "$seed"
  done
done
corpus="$build/corpus/corpus.json"
if [[ -f $corpus ]]; then
  while read -r name model data batch lr amp; do
    if [[ $name == nanogpt ]]; then
      for lr in 0.0003 0.001 0.003; do
        for seed in 0 1; do
          one_run "corpus-$name-lr$lr-seed$seed" "$corpus_steps" --model "$build/corpus/$model" \
            --data "$build/corpus/$data" --batch-size "$batch" --lr "$lr" --amp "$amp" --seed "$seed"
        done
      done
      continue
    fi
    one_run "corpus-$name" "$corpus_steps" --model "$build/corpus/$model" --data "$build/corpus/$data" \
      --batch-size "$batch" --lr "$lr" --amp "$amp"
  done < <(/usr/bin/python3 -c "
import json, sys
for e in json.load(open('$corpus')):
    print(e['name'], e['model'], e['clean'], e['batch_size'], e['lr'], e['amp'])")
else
  echo "  (no corpus at $corpus: run ctest -R Corpus.Make first)"
fi
# The other side of the bar: the warnings must still come early where trouble
# builds slowly (goal: 10 steps or more before the first non-finite step).
lead_time() {  # NAME: the slow-onset catalog scenario
  "$train" --config "$repo/samples/faults/$1.toml" --quiet --threads 2 --run-dir "$tmp/$1" >/dev/null 2>&1 || true
  /usr/bin/python3 - "$tmp/$1/run.h5" "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r", libver="latest", swmr=True) as f:
    skipped, steps = f["/steps/skipped"][:], f["/steps/step"][:]
    kinds, at = [k.decode() for k in f["/events/kind"][:]], f["/events/step"][:]
first_bad = next((int(s) for s, k in zip(steps, skipped) if k), None)
first_warning = next((int(s) for s, k in zip(at, kinds) if k == "warning"), None)
lead = first_bad - first_warning if first_bad is not None and first_warning is not None else None
print(f"  {sys.argv[2]}: first warning at step {first_warning}, first non-finite step {first_bad}, lead {lead} steps")
PY
}
echo "lead times on the slow-onset catalog:"
lead_time slow-lr-ramp
lead_time slow-input-ramp
echo "total: $total_steps clean steps, $total_warnings warning(s) and $total_rollbacks rollback(s):" \
  "$(/usr/bin/python3 -c "print(f'{1000*$total_warnings/$total_steps:.2f}')") false warnings per 1000 steps"
