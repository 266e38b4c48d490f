"""A snapshot is code when its batch holds pickled objects (the Python replay
unpickles them) or its model is a TorchScript program: inspect_snapshot and
`python -m nanscope inspect` show what one holds and would run without
loading any of it; replaying does load it."""
import json
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope

UNPICKLED = []  # each Note unpickled, by its text


class Note:
    """A batch's object that is neither a tensor nor a JSON value: pickled into
    the snapshot. Unpickling it records it, as a hostile pickle would act."""

    def __init__(self, text):
        self.text = text

    def __setstate__(self, state):
        self.__dict__.update(state)
        UNPICKLED.append(self.text)


def loss_of(model, batch):
    return F.mse_loss(model(batch["x"]), batch["y"])


def snapshot_of(tmp_path, batch):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(tmp_path), amp="fp32",
                               log=False, loss_fn=loss_of, config=nanscope.GuardConfig(fallback="off"))
    result = guard.closure_step(lambda: loss_of(model, batch), batch=batch)
    guard.close()
    assert result.snapshot, result
    return result.snapshot


def nan_batch():
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    x[5, 1] = float("nan")
    return {"x": x, "y": y}


def test_a_batch_with_a_pickled_object_is_code_and_inspecting_does_not_unpickle_it(tmp_path):
    batch = nan_batch()
    batch["note"] = Note("from the loader")
    snapshot = snapshot_of(tmp_path, batch)
    UNPICKLED.clear()

    inspection = nanscope.inspect_snapshot(snapshot)
    assert UNPICKLED == [], "inspecting unpickled the batch"
    assert inspection.carries_code and inspection.pickled_objects == 1, inspection.to_dict()
    assert inspection.origin == "python" and inspection.model_name == "Linear"
    assert "unpickles" in inspection.replay_runs and "source you trust" in inspection.replay_runs
    assert {"name": "weight", "dtype": "float32", "shape": [1, 3]} in inspection.parameters
    assert {"name": "x", "dtype": "float32", "shape": [8, 3]} in inspection.batch  # named by its key
    assert inspection.program_bytes == 0 and inspection.program_files == []
    assert "1 pickled Python object(s)" in str(inspection)

    # Replaying does unpickle it: the warning is about something real.
    nanscope.replay(snapshot, model=lambda: nn.Linear(3, 1), loss=loss_of, write=False, bisect=False)
    assert "from the loader" in UNPICKLED


def test_a_batch_of_tensors_carries_no_code(tmp_path):
    snapshot = snapshot_of(tmp_path, nan_batch())
    inspection = nanscope.inspect_snapshot(snapshot)
    assert not inspection.carries_code and inspection.pickled_objects == 0, inspection.to_dict()
    assert "the file holds its weights" in inspection.replay_runs

    out = subprocess.run(["/usr/bin/python3", "-m", "nanscope", "inspect", snapshot, "--json"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == inspection.to_dict()


def test_inspecting_a_file_that_is_no_snapshot_is_bad_input(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("not a snapshot")
    with pytest.raises(ValueError, match="notes.h5"):
        nanscope.inspect_snapshot(text)
    out = subprocess.run(["/usr/bin/python3", "-m", "nanscope", "inspect", str(text)], capture_output=True, text=True)
    assert out.returncode == 2 and "not an HDF5 file" in out.stderr, out.stderr
