"""skorch adopted with two overrides of NeuralNet (samples/python/skorch_loop.py,
docs/python.md): fit, callbacks and history stay skorch's; each step is the
guard's, so a planted fault is skipped and named, in each epoch, and the
repeat is known as the same fault."""
import os
import pathlib
import subprocess
import sys

import h5py
import pytest

pytest.importorskip("skorch")

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples" / "python"


def run_sample(run_dir, fault):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SAMPLES), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(SAMPLES / "skorch_loop.py"), str(run_dir), fault], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("fault, remedy", [("nan", "data"), ("blank", "model_or_data")])
def test_a_skorch_net_with_two_overrides_skips_and_names_its_fault_each_epoch(tmp_path, fault, remedy):
    out = run_sample(tmp_path / "run", fault)
    assert "weights finite: True" in out, out
    assert "epochs: 2" in out, out
    # Sample 21 is row 1 of batch 5 (4 a batch, 16 batches an epoch): steps 5 and 21.
    skips = [line for line in out.splitlines() if line.startswith("skipped:")]
    assert len(skips) == 2 and all("batch row 1" in s and s.endswith("; " + remedy) for s in skips), out
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        skipped = [int(s) for s, k in zip(f["steps/step"][()], f["steps/skipped"][()]) if k]
        events = [(int(s), k.decode(), t.decode()) for s, k, t in
                  zip(f["events/step"][()], f["events/kind"][()], f["events/text"][()])]
    assert skipped == [5, 21], skipped
    if fault == "nan":  # the same sample in the next epoch: the same fault again, no escalation
        assert any(s == 21 and k == "remedy" and "again (as step 5)" in t for s, k, t in events), events
