#!/usr/bin/env bash
# The main job, from a fresh Debian bookworm machine (root): install, build,
# then an instrumented fine-tune of the bundled gpt sample with a planted fault,
# its replay, and the viewer (a screenshot; the window too when a display is present).
# Output goes to OUT_DIR (default ./nanscope-demo).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT_DIR:-$PWD/nanscope-demo}
"$repo/scripts/install-deps.sh"
# Only the three programs it runs (and their libraries): the tests, the
# Python module and the benchmarks are the test command's to build.
"$repo/scripts/build.sh" nanscope-train nanscope-replay nanscope-view
train="${BUILD_DIR:-$repo/build}/trainer/nanscope-train"
mkdir -p "$out"

echo "== 1/2 pre-train the gpt sample (the checkpoint the fine-tune starts from)"
"$train" --config "$repo/samples/configs/gpt-pretrain.toml" --run-dir "$out/pretrain" --save "$out/gpt-base.h5"

echo "== 2/2 fine-tune in bf16 with a planted fault (log of a GELU output at step 40)"
"$train" --config "$repo/samples/configs/gpt-finetune-fault.toml" --init "$out/gpt-base.h5" \
  --run-dir "$out/finetune" --save "$out/gpt-finetuned.h5"

echo "== what $out/finetune/run.h5 recorded (read back with h5py)"
/usr/bin/python3 - "$out/finetune/run.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r", libver="latest", swmr=True) as f:
    s, e = f["steps"], f["events"]
    n = s["step"].shape[0]
    print(f"{n} steps, {int(s['skipped'][:n].sum())} skipped, loss {s['loss'][0]:.3f} -> {s['loss'][n-1]:.3f}")
    for step, kind, text in zip(e["step"][:], e["kind"][:], e["text"][:]):
        print(f"  step {step:4d}  {kind.decode().rstrip(chr(0)):<14} {text.decode().rstrip(chr(0))}")
PY

snapshot=$(ls "$out"/finetune/snapshots/step-*.h5 | head -1)
echo "== replay of $snapshot (offline, from the snapshot alone)"
"${BUILD_DIR:-$repo/build}/replay/nanscope-replay" "$snapshot"

echo "== the same fine-tune as 2 data-parallel ranks (c10d Gloo on 127.0.0.1), the fault on rank 1 only"
# torchrun's conventions (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); scripts/launch.sh sets them.
"$repo/scripts/launch.sh" 2 "$train" --config "$repo/samples/configs/gpt-finetune-fault.toml" \
  --init "$out/gpt-base.h5" --batch-size 8 --fault log_nonpositive@40/rank1 --threads 1 \
  --run-dir "$out/finetune-2ranks"
ls "$out"/finetune-2ranks/run-rank-*.h5 "$out"/finetune-2ranks/snapshots/rank-*/

view="${BUILD_DIR:-$repo/build}/viewer/nanscope-view"
echo "== the viewer: $out/finetune-view.png (the run; its snapshot is under the Snapshot tab), $out/finetune-2ranks.png"
if [ -n "${DISPLAY:-}" ]; then
  "$view" "$out/finetune" --screenshot "$out/finetune-view.png" --frames 5
  "$view" "$out/finetune-2ranks" --screenshot "$out/finetune-2ranks.png" --frames 5
  echo "== opening nanscope-view on $out/finetune (close the window to finish)"
  "$view" "$out/finetune"
else
  # No display: a software-GL X server (Xvfb) renders the same window.
  xvfb-run -a -s "-screen 0 1600x1000x24" "$view" "$out/finetune" --screenshot "$out/finetune-view.png" --frames 5
  xvfb-run -a -s "-screen 0 1600x1000x24" "$view" "$out/finetune" --show snapshot \
    --screenshot "$out/finetune-snapshot.png" --frames 5
  xvfb-run -a -s "-screen 0 1600x1000x24" "$view" "$out/finetune-2ranks" \
    --screenshot "$out/finetune-2ranks.png" --frames 5
fi
