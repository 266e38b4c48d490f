"""Checks nanscope's answers on one corpus model against the reference.

Usage: check_corpus.py TRAIN_EXE REPLAY_EXE CORPUS_DIR NAME

Runs nanscope-train on NAME's clean data (no skip, no snapshot, finite
losses), then on its faulted data, and nanscope-replay --json on the
snapshot, and compares step, op, phase, module, kind, sample, verdict,
category, the fp32 modules and the batch rows with what make_corpus.py's
plain-PyTorch reference found. Exit 0 when every answer agrees; otherwise
each disagreement is printed and the exit code is 1.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import h5py

# Dispatch sees the ops LibTorch's composite ops decompose into; nanscope names
# the op the model called. These are the decompositions that occur here.
DECOMPOSES_INTO = {
    "softmax": {"_softmax"},
    "log_softmax": {"_log_softmax"},
    "matmul": {"bmm", "mm", "addmm", "mv", "dot"},
    "linear": {"addmm", "mm", "bmm", "matmul"},
    "cross_entropy_loss": {"_log_softmax", "nll_loss_forward", "nll_loss2d_forward"},
    "layer_norm": {"native_layer_norm"},
    "conv2d": {"convolution", "_convolution", "mkldnn_convolution"},
}


def bare(op):
    return op.split("::")[-1].split(".")[0].rstrip("_")


def same_op(nanscope_op, reference_op):
    if nanscope_op == reference_op:
        return True
    a, b = bare(nanscope_op), bare(reference_op)
    return a == b or b in DECOMPOSES_INTO.get(a, set())


def train(exe, entry, corpus, data, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [exe, "--model", os.path.join(corpus, entry["model"]), "--data", os.path.join(corpus, data),
           "--steps", str(entry["steps"]), "--batch-size", str(entry["batch_size"]), "--lr", str(entry["lr"]),
           "--amp", entry["amp"], "--no-shuffle", "--threads", "1", "--quiet", "--run-dir", run_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, env=kernel_env(corpus))
    return r.returncode, r.stdout + r.stderr


def kernel_env(corpus):
    """The environment nanscope runs in: oneDNN off where make_corpus.py's reference ran without it."""
    env = dict(os.environ)
    if os.path.exists(os.path.join(corpus, "onednn-off")):
        env["NANSCOPE_ONEDNN"] = "off"
    return env


def read_run(run_dir):
    with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:
        loss = list(f["steps/loss"][:])
        kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in f["events/kind"][:]]
    return loss, kinds


def main(train_exe, replay_exe, corpus, name):
    with open(os.path.join(corpus, "corpus.json")) as f:
        entry = next(e for e in json.load(f) if e["name"] == name)
    ref = entry["reference"]
    problems = []

    def expect(what, got, want):
        if got != want:
            problems.append(f"{what}: nanscope {got!r}, reference {want!r}")

    # The clean fine-tune: nothing to report.
    run_dir = os.path.join(corpus, f"run-{name}-clean")
    code, out = train(train_exe, entry, corpus, entry["clean"], run_dir)
    expect("clean run exit code", code, 0)
    if code == 0:
        loss, kinds = read_run(run_dir)
        expect("clean run rows", len(loss), entry["steps"])
        expect("clean run non-finite losses", sum(not math.isfinite(v) for v in loss), 0)
        expect("clean run skips", kinds.count("skip"), 0)
        expect("clean run snapshots", os.path.isdir(os.path.join(run_dir, "snapshots")), False)

    # The faulted fine-tune: the step, then the replay of its snapshot.
    run_dir = os.path.join(corpus, f"run-{name}-faulted")
    code, out = train(train_exe, entry, corpus, entry["faulted"], run_dir)
    expect("faulted run exit code", code, 0)
    if code != 0:
        print(out)
    else:
        loss, kinds = read_run(run_dir)
        first_bad = next((i for i, v in enumerate(loss) if not math.isfinite(v)), None)
        expect("first non-finite step", first_bad, ref["step"])
        snapshot = os.path.join(run_dir, "snapshots", "step-%07d.h5" % ref["step"])
        if not os.path.exists(snapshot):
            problems.append(f"no snapshot {snapshot}")
        else:
            r = subprocess.run([replay_exe, snapshot, "--json", "--no-write"], capture_output=True, text=True,
                               env=kernel_env(corpus))
            expect("replay exit code", r.returncode, 0)
            report = json.loads(r.stdout) if r.returncode == 0 else {}
            check_report(report, entry, ref, expect, problems)
    print(f"{name}: " + ("every answer agrees with the reference" if not problems else "DISAGREES"))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def check_report(report, entry, ref, expect, problems):
    birth = report.get("capture", {}).get("first_birth") or {}
    expect("phase", birth.get("phase"), ref["phase"])
    expect("kind", birth.get("kind"), ref["kind"])
    expect("module", birth.get("module"), ref["module"])
    if not same_op(birth.get("op", ""), ref["op"]):
        problems.append(f"op: nanscope {birth.get('op')!r} is not reference {ref['op']!r} nor a composite of it")
    if ref["phase"] == "input":
        expect("sample", birth.get("sample"), ref["sample"])
    modules = set(entry["modules"])
    if birth.get("module") not in modules:
        problems.append(f"module {birth.get('module')!r} is not one of the model's named_modules()")
    # Not precision, and finite without rows out of the batch's range: the data's (docs/replay.md).
    out_of_range = not ref["fp32_finite"] and bool(ref.get("out_of_range"))
    want_verdict = ("data" if ref["phase"] == "input" or out_of_range
                    else "precision" if ref["fp32_finite"] else "model_or_data")
    expect("verdict", report.get("verdict"), want_verdict)
    expect("category", report.get("category"), entry["category"])
    replay = report.get("replay", {})
    expect("fp32 re-run finite", replay.get("fp32_finite"), ref["fp32_finite"] if ref["phase"] != "input" else False)
    suggestion = report.get("suggestion", "")
    precision = (replay.get("precision_bisection") or {}).get("fp32_modules")
    if want_verdict == "precision":
        # The set nanscope names must make the step finite by the reference too.
        if not precision or len(precision) != 1 or precision[0] not in ref["fp32_singles"]:
            problems.append(f"fp32 modules: nanscope {precision!r}, reference singles {ref['fp32_singles']!r}")
    elif re.search(r"keep .* in fp32", suggestion):
        problems.append("suggestion advises fp32 modules on a non-precision verdict: " + suggestion)
    if "instead of fp16" in suggestion and entry["amp"] != "fp16":
        problems.append("suggestion advises bf16 over fp16 on a " + entry["amp"] + " run: " + suggestion)
    if want_verdict == "model_or_data" and "exceed the range of " + entry["amp"] in suggestion:
        problems.append("suggestion blames the range of " + entry["amp"] + " though fp32 failed too: " + suggestion)
    for module in precision or []:
        if module not in modules:
            problems.append(f"fp32 module {module!r} is not one of the model's named_modules()")
    batch = replay.get("batch_bisection")
    if ref["phase"] != "input":
        # A model that samples is searched by replacing rows (docs/replay.md), as the reference does.
        expect("batch rows without which the step is finite", (batch or {}).get("samples"), ref["rows"])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
