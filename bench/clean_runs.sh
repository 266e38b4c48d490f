#!/usr/bin/env bash
# False alarms: long runs with nothing planted, counting the warning and
# rollback events each writes (goal: none). The built-in mlp (3 seeds x 3000
# steps) and gpt (1000 steps), and each corpus model on its clean data (needs
# the corpus: ctest -R Corpus.Make, which writes BUILD_DIR/corpus).
# Usage: bench/clean_runs.sh [BUILD_DIR] [CORPUS_STEPS=1000]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
corpus_steps=${2:-1000}
train="$build/trainer/nanscope-train"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total_steps=0 total_warnings=0 total_rollbacks=0

# Prints "warnings rollbacks" of a run file.
count_events() {
  /usr/bin/python3 - "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r", libver="latest", swmr=True) as f:
    kinds = [k.decode() for k in f["/events/kind"][:]]
print(kinds.count("warning"), kinds.count("rollback"))
PY
}

one_run() {  # NAME STEPS ARGS...
  local name=$1 steps=$2
  shift 2
  "$train" --steps "$steps" --quiet --threads 2 --run-dir "$tmp/$name" "$@" >/dev/null
  read -r w r < <(count_events "$tmp/$name/run.h5")
  echo "  $name: $steps steps, $w warning(s), $r rollback(s)"
  total_steps=$((total_steps + steps)) total_warnings=$((total_warnings + w)) total_rollbacks=$((total_rollbacks + r))
}

echo "clean_runs: nothing planted; every warning or rollback is a false alarm"
for seed in 0 1 2; do one_run "mlp-seed$seed" 3000 --model mlp --amp bf16 --seed "$seed"; done
one_run gpt 1000 --model gpt --amp bf16
corpus="$build/corpus/corpus.json"
if [[ -f $corpus ]]; then
  while read -r name model data batch lr amp; do
    one_run "corpus-$name" "$corpus_steps" --model "$build/corpus/$model" --data "$build/corpus/$data" \
      --batch-size "$batch" --lr "$lr" --amp "$amp"
  done < <(/usr/bin/python3 -c "
import json, sys
for e in json.load(open('$corpus')):
    print(e['name'], e['model'], e['clean'], e['batch_size'], e['lr'], e['amp'])")
else
  echo "  (no corpus at $corpus: run ctest -R Corpus.Make first)"
fi
echo "total: $total_steps clean steps, $total_warnings warning(s) and $total_rollbacks rollback(s):" \
  "$(/usr/bin/python3 -c "print(f'{1000*$total_warnings/$total_steps:.2f}')") false warnings per 1000 steps"
