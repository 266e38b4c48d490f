#!/usr/bin/env bash
# Runs every fuzz target: first each kept crasher and seed once (regressions),
# then libFuzzer for RUNS executions from seeds made by the real programs.
# Prints each target's executions and findings; a new crash is kept under
# BUILD_DIR/fuzz-findings/ and fails the run.
# Usage: tests/fuzz/run.sh FUZZ_BUILD_DIR [RUNS=100000] [MAIN_BUILD_DIR=build]
#   (env TARGETS: a subset; FUZZ_SEED: libFuzzer's seed, for repeatable short runs;
#    FUZZ_TIMEOUT, FUZZ_RSS_MB: libFuzzer's limits while fuzzing, 20 s and 4096 MB;
#    FUZZ_JOBS: how many targets fuzz side by side, 2)
#   FUZZ_BUILD_DIR: configured with -DNANSCOPE_LIGHT=ON -DNANSCOPE_FUZZ=ON (scripts/sanitize.sh)
#   MAIN_BUILD_DIR: the normal build, whose nanscope-train writes the seeds
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
runs=${2:-100000}
main=${3:-$repo/build}
here=$repo/tests/fuzz
seeds=$build/fuzz-seeds
findings=$build/fuzz-findings
mkdir -p "$seeds" "$findings"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Seeds: what the programs write, small.
if [[ ! -f $seeds/.made && -x $main/trainer/nanscope-train ]]; then
  tmp=$(mktemp -d)
  "$main/trainer/nanscope-train" --model mlp --hidden 8 --steps 12 --batch-size 4 --amp bf16 \
    --fault nonfinite_input@5:1 --act-absmax-every 3 --checkpoint-every 6 --quiet --threads 1 \
    --run-dir "$tmp/run" >/dev/null 2>&1 || true
  # A replayed precision verdict: its snapshot holds /replay and its precision trail.
  "$main/trainer/nanscope-train" --model mlp --hidden 8 --steps 8 --batch-size 4 --amp bf16 \
    --fault variance_cancellation@5 --quiet --threads 1 --run-dir "$tmp/precision" >/dev/null 2>&1 || true
  "$main/replay/nanscope-replay" --repeats 1 --no-bisect "$tmp"/precision/snapshots/*.h5 >/dev/null 2>&1 || true
  mkdir -p "$seeds"/{run_file,snapshot,checkpoint,data_file,config}
  cp "$tmp/run/run.h5" "$seeds/run_file/"
  cp "$tmp"/run/snapshots/*.h5 "$seeds/snapshot/" 2>/dev/null || true
  cp "$tmp"/precision/snapshots/step-0000005.h5 "$seeds/snapshot/replayed-precision.h5" 2>/dev/null || true
  cp "$tmp/run/checkpoint.h5" "$seeds/checkpoint/" 2>/dev/null || true
  cp "$tmp/run/options.toml" "$seeds/config/"
  cp "$repo"/samples/configs/*.toml "$repo"/samples/faults/*.toml "$seeds/config/"
  /usr/bin/python3 - "$seeds/data_file/data.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["inputs"] = np.arange(24, dtype=np.float32).reshape(4, 6)
    f["targets"] = np.arange(4, dtype=np.int64)
PY
  rm -rf "$tmp"
  touch "$seeds/.made"
fi

# fuzz_target NAME: the regressions and the fuzzing of one target; its exit
# status says whether it found anything.
fuzz_target() {
  local target=$1 status=0
  local exe=$build/tests/fuzz/fuzz_$target
  local corpus=$build/fuzz-corpus/$target
  mkdir -p "$corpus" "$seeds/$target" "$findings/hdf5"
  local kept=()
  [[ -d $here/crashers/$target ]] && kept+=("$here/crashers/$target"/*)
  [[ -d $seeds/$target ]] && kept+=("$seeds/$target"/*)
  # Regressions: each kept input once, with the readers' rehearsal on as the
  # programs run: a kept HDF5 crasher must now be a clean "corrupt".
  if ((${#kept[@]})) && ! NANSCOPE_FUZZ_REHEARSAL=1 "$exe" "${kept[@]}" >"$findings/$target-regressions.log" 2>&1; then
    echo "fuzz $target: a kept input fails again (see $findings/$target-regressions.log)"
    status=1
  fi
  # Fuzzing, rehearsal off, for a fixed number of executions from a fixed
  # seed. What it stops on is judged by what the programs do with it, never
  # by this machine's speed:
  #  - a crash whose first frame of ours-or-theirs is in our code is a finding;
  #  - anything else (a crash inside HDF5, an input that ran past libFuzzer's
  #    time or memory limit, which a loaded machine makes more of) is replayed
  #    alone with the rehearsal on, as the programs read: it must end cleanly
  #    within the readers' bound (format/src/rehearsal.hpp), or it is a finding.
  # Each finding keeps its input; fuzzing goes on after what the rehearsal takes.
  # The time limit is the rehearsal's CPU bound for an input of at most
  # -max_len (format/src/rehearsal.hpp: 20 s + 0.1 s/MiB, so 20 s here; change
  # them together): an input HDF5 spins on for longer is one the programs
  # stop there, so it is replayed as they read it rather than waited for
  # (with 120 s, one checkpoint input ran 112 s and its round 7 minutes; the
  # rehearsal ends it in 0.5 s).
  local done_runs=0 taken=0 ours=0 rounds=0 log clean n artifact culprit kept_input speed
  : >"$findings/$target.log"
  # Each stop costs a restart; the cap stops a target that only crashes.
  while ((done_runs < runs && rounds < 200 + runs / 100)); do
    rounds=$((rounds + 1))
    log=$findings/$target-round.log
    # Leak checks after every input would halve the speed; the regressions
    # above and the unit tests run with them.
    ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" "$exe" -runs=$((runs - done_runs)) ${FUZZ_SEED:+-seed=$FUZZ_SEED} -max_len=262144 -timeout=${FUZZ_TIMEOUT:-20} -rss_limit_mb=${FUZZ_RSS_MB:-4096} -print_final_stats=1 \
      -artifact_prefix="$findings/$target-" "$corpus" "$seeds/$target" >"$log" 2>&1 && clean=1 || clean=0
    cat "$log" >>"$findings/$target.log"
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    [[ -z $n ]] && n=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    done_runs=$((done_runs + ${n:-1}))
    ((clean)) && break
    artifact=$(ls -t "$findings/$target"-crash-* "$findings/$target"-timeout-* "$findings/$target"-oom-* \
      "$findings/$target"-leak-* 2>/dev/null | head -1 || true)
    [[ -n $artifact ]] || { echo "fuzz $target: libFuzzer stopped without an artifact (see $log)"; status=1; break; }
    # Whose crash: the first stack frame after the report that is not the C
    # library, an allocator or a sanitizer interceptor.
    culprit=$(sed -n '/ERROR: /,$p' "$log" | grep -E '^ +#[0-9]+ ' |
      grep -vE 'malloc|calloc|realloc|operator new|__interceptor_|__mem(cpy|move|set)|sysdeps|libc\.so|libstdc\+\+|__asan|__sanitizer|fuzzer::| in (std::|__gnu_cxx::|__cxa_)|nptl|stdlib/|signal/|include/c\+\+/|lib/gcc/| in (str[a-z]*|wcs[a-z]*|mem[a-z]*|bcmp|printf|vsnprintf) ' |
      head -1 || true)
    if [[ $(basename "$artifact") == "$target"-crash-* && $culprit != *libhdf5* ]]; then
      ours=$((ours + 1))
      status=1
      echo "fuzz $target: a crash in nanscope's own code: $artifact (see $findings/$target.log)"
      break
    fi
    taken=$((taken + 1))
    mv "$artifact" "$findings/hdf5/"
    kept_input=$findings/hdf5/$(basename "$artifact")
    # Alone, with time to spare on a loaded machine: the bound is the
    # rehearsal's (CPU time and memory), not this wall clock.
    if ! NANSCOPE_FUZZ_REHEARSAL=1 "$exe" -timeout=900 -rss_limit_mb=2048 "$kept_input" \
      >"$kept_input.replay.log" 2>&1; then
      echo "fuzz $target: an input the rehearsal does not take: $kept_input (see $kept_input.replay.log)"
      status=1
    fi
  done
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$findings/$target.log" | sort -n | tail -1)
  echo "fuzz $target: $done_runs executions (${speed:-?}/s at best), ${#kept[@]} kept inputs replayed," \
    "$taken stop(s) replayed with the rehearsal (HDF5 crashes, slow or large inputs), $ours crash(es) in nanscope's code"
  return $status
}

# Each target runs single-threaded, so FUZZ_JOBS (default 2) of them run side
# by side, the slowest first: one after the other, the five took 121 s on two
# cores, snapshot alone 66 s. What each finds does not depend on the others:
# each has its own corpus, artifacts and seed.
# A target whose job stops early (set -e) leaves no exit file: a failure.
side_by_side=${FUZZ_JOBS:-2}
targets=(${TARGETS:-snapshot run_file checkpoint config data_file})
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= side_by_side)); do wait -n || true; done
  rm -f "$findings/$target.exit"
  { fuzz_target "$target"; echo $? >"$findings/$target.exit"; } &
done
wait
status=0
for target in "${targets[@]}"; do
  [[ $(cat "$findings/$target.exit" 2>/dev/null) == 0 ]] || status=1
done
exit $status
