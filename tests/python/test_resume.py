"""A run resumed from a loop's own checkpoint goes on with the guard's state and
appends to its run.h5 (the rows after the checkpoint go, as nanscope-train
--resume drops them); a guard that was not resumed starts a new run.h5 and
keeps the earlier one beside it: no record is ever overwritten."""
import copy

import h5py
import torch
import torch.nn.functional as F

import nanscope


def batches(n):
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(n):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        if step == 2:
            x[3, 1] = float("nan")
        out.append((x, y))
    return out


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def run(guard, model, data, steps):
    for step in steps:
        x, y = data[step]
        guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y), step=step)


def rows_and_events(path):
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        n = f["steps/step"].shape[0]
        steps = [int(s) for s in f["steps/step"][:n]]
        events = [(int(s), k.decode().rstrip("\0")) for s, k in zip(f["events/step"][:], f["events/kind"][:])]
    return steps, events


def test_a_resumed_guard_appends_to_its_run_file_and_ends_where_the_whole_run_does(tmp_path):
    data = batches(6)
    whole_model, whole_opt = model_and_optimizer()
    whole = nanscope.StepGuard(whole_model, whole_opt, run_dir=str(tmp_path / "whole"), amp="fp32", log=False)
    run(whole, whole_model, data, range(6))
    whole.close()

    model, opt = model_and_optimizer()
    guard = nanscope.StepGuard(model, opt, run_dir=str(tmp_path / "run"), amp="fp32", log=False)
    run(guard, model, data, range(4))
    checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "guard": guard.state_dict()})
    run(guard, model, data, range(4, 5))  # a step past the checkpoint, then the process dies
    guard.close()

    model, opt = model_and_optimizer()
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    resumed = nanscope.StepGuard(model, opt, run_dir=str(tmp_path / "run"), amp="fp32", log=False)
    resumed.load_state_dict(checkpoint["guard"])
    run(resumed, model, data, range(4, 6))
    resumed.close()

    for p, q in zip(model.parameters(), whole_model.parameters()):
        assert torch.equal(p, q)
    # The counts a loop logs (the Trainer's nanscope/skipped_steps) are the whole run's.
    assert resumed.skipped_steps == whole.skipped_steps == 1
    assert resumed.last_first_birth == whole.last_first_birth != ""
    steps, events = rows_and_events(tmp_path / "run" / "run.h5")
    assert steps == list(range(6)), steps  # step 4's first row went with the resume
    assert (2, "skip") in events and (3, "resume") in events, events
    assert not (tmp_path / "run" / "run.1.h5").exists()


def test_a_guard_that_was_not_resumed_keeps_the_earlier_run_file_beside_its_own(tmp_path, nanscope_lines):
    data = batches(3)
    for attempt in range(2):
        model, opt = model_and_optimizer()
        guard = nanscope.StepGuard(model, opt, run_dir=str(tmp_path / "run"), amp="fp32")
        run(guard, model, data, range(3 - attempt))
        guard.close()
    assert rows_and_events(tmp_path / "run" / "run.1.h5")[0] == [0, 1, 2]
    assert rows_and_events(tmp_path / "run" / "run.h5")[0] == [0, 1]
    assert "kept as " + str(tmp_path / "run" / "run.1.h5") in nanscope_lines()
