"""--fallback whole against --fallback auto on the fault catalog and the corpus.

Usage: fallback_modes.py TRAIN_EXE SAMPLES_DIR CORPUS_DIR [OUT_DIR] [MIN_STEPS=60]

Runs every catalog config (SAMPLES_DIR/faults/*.toml) and every corpus model's
faulted fine-tune (CORPUS_DIR/corpus.json, made by tests/corpus/make_corpus.py)
twice, once per mode, for at least MIN_STEPS steps (the catalog's configs
stop a few steps after their fault, before a fallback's cost shows), and
prints per run: the exit code, the steps skipped,
the steps run in fp32 after a fallback, the total step time, the final loss
(median of the last 10 counted steps), and what auto chose (its remedy
events). Step times come from run.h5 (/steps/step_time), so both modes are
timed the same way; the runs are interleaved (whole, auto, whole, auto, ...)
so they share the machine's noise.
"""
import glob
import json
import re
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter

import h5py


def read(run_dir):
    with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:
        steps = f["steps"]
        loss = list(steps["loss"][:])
        skipped = list(steps["skipped"][:])
        amp = list(steps["amp"][:])
        step_time = list(steps["step_time"][:])
        kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in f["events/kind"][:]]
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in f["events/text"][:]]
    counted = [l for l, s in zip(loss, skipped) if not s and math.isfinite(l)]
    started_low = amp[0] != 0 if amp else False
    return {
        "rows": len(loss),
        "skipped": sum(skipped),
        "fp32_steps": sum(1 for a in amp if a == 0) if started_low else 0,
        "seconds": sum(step_time),
        "final_loss": statistics.median(counted[-10:]) if counted else float("nan"),
        "remedies": [t.split(":")[0] for k, t in zip(kinds, texts) if k == "remedy"],
    }


def run(cmd, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    r = subprocess.run(cmd + ["--run-dir", run_dir, "--quiet", "--threads", "1"], capture_output=True, text=True)
    out = {"exit": r.returncode, "wall": time.monotonic() - start}
    if os.path.exists(os.path.join(run_dir, "run.h5")):
        out.update(read(run_dir))
    return out


def main(train_exe, samples, corpus, out_dir, min_steps):
    jobs = []
    for config in sorted(glob.glob(os.path.join(samples, "faults", "*.toml"))):
        name = os.path.basename(config)[:-5]
        steps = re.search(r"^steps\s*=\s*(\d+)", open(config).read(), re.M)
        steps = max(min_steps, int(steps.group(1)) if steps else 0)
        jobs.append((name, [train_exe, "--config", config, "--steps", str(steps)]))
    corpus_json = os.path.join(corpus, "corpus.json")
    if os.path.exists(corpus_json):
        for e in json.load(open(corpus_json)):
            jobs.append(("corpus/" + e["name"], [
                train_exe, "--model", os.path.join(corpus, e["model"]), "--data", os.path.join(corpus, e["faulted"]),
                "--steps", str(max(min_steps, e["steps"])), "--batch-size", str(e["batch_size"]), "--lr", str(e["lr"]),
                "--amp", e["amp"], "--no-shuffle"]))
    print(f"fallback_modes: whole vs auto, one process per run, 1 thread, at least {min_steps} steps")
    header = (f"{'run':28} {'mode':5} {'exit':>4} {'skip':>4} {'fp32':>5} {'steps s':>8} {'wall s':>7} "
              f"{'final loss':>11}  auto's remedies")
    print(header)
    totals = {"whole": 0.0, "auto": 0.0}
    walls = {"whole": 0.0, "auto": 0.0}
    fp32_steps = {"whole": 0, "auto": 0}
    for name, cmd in jobs:
        results = {}
        for mode in ("whole", "auto"):
            results[mode] = run(cmd + ["--fallback", mode], os.path.join(out_dir, name.replace("/", "-") + "-" + mode))
        if results["whole"].get("exit") == 2:
            print(f"{name:28} (bad input here, exit 2: fp16 needs LibTorch 2.x on CPU; sample-burst needs "
                  "its --model/--data)")
            continue
        for mode in ("whole", "auto"):
            r = results[mode]
            totals[mode] += r.get("seconds", 0.0)
            walls[mode] += r["wall"]
            fp32_steps[mode] += r.get("fp32_steps", 0)
            counts = Counter(r.get("remedies", []))
            remedy = ", ".join(f"{k} x{n}" for k, n in counts.items()) if mode == "auto" else ""
            print(f"{name:28} {mode:5} {r['exit']:>4} {r.get('skipped', 0):>4} {r.get('fp32_steps', 0):>5} "
                  f"{r.get('seconds', 0.0):>8.2f} {r['wall']:>7.2f} {r.get('final_loss', float('nan')):>11.4g}  {remedy}")
    print(f"steps in fp32 after a fallback: whole {fp32_steps['whole']}, auto {fp32_steps['auto']}")
    print(f"total step time (run.h5): whole {totals['whole']:.1f} s, auto {totals['auto']:.1f} s; "
          f"wall time (processes, with auto's diagnosis): whole {walls['whole']:.1f} s, auto {walls['auto']:.1f} s")


if __name__ == "__main__":
    out = sys.argv[4] if len(sys.argv) > 4 else "/tmp/nanscope-fallback-modes"
    os.makedirs(out, exist_ok=True)
    main(sys.argv[1], sys.argv[2], sys.argv[3], out, int(sys.argv[5]) if len(sys.argv) > 5 else 60)
