"""Two processes under torch.distributed (Gloo): a NaN sample on rank 1 only.
Both ranks skip the same step, keep identical weights, write their own run
file, and only rank 1 writes a snapshot, which names the birth. For a plain
model (the guard averages) and a DistributedDataParallel one (ddp_worker.py,
run by ranks that stay up across the tests: rank_pool.py)."""
import json
import subprocess

import pytest

@pytest.mark.parametrize("kind, form", [("plain", "closure"), ("ddp", "closure"), ("plain", "watched"),
                                        ("ddp", "watched"), ("ddp-own-hook", "closure"),
                                        ("ddp-own-hook", "watched")])
def test_ranks_agree_on_the_skip_and_only_the_sick_rank_snapshots(tmp_path, tool, rank_pools, kind, form):
    """DDP averages the gradients in its own backward, overlapped, as in the
    plain loop (the guard's communication hook notes each rank's gradients
    before they mix); a model with a hook of its own keeps it, its sync held
    off while the guard averages. Either way the same step is skipped."""
    outs = rank_pools.run("ddp_skip", 2, 300, run_dir=str(tmp_path / "run"), kind=kind, watched=form == "watched")
    for out in outs:
        assert out["counted"] == [True, True, True, False, True, True]
        if form == "watched" and kind != "plain":
            assert out["synced_in_backward"] == (kind == "ddp"), out["synced_in_backward"]
    assert outs[0]["weights"] == outs[1]["weights"], "every rank holds the same weights"
    assert outs[0]["snapshots"] == []
    assert outs[1]["snapshots"] == [str(tmp_path / "run" / "snapshots" / "rank-1" / "step-0000003.h5")]
    report = json.loads(subprocess.run([tool("NANSCOPE_REPORT"), str(tmp_path / "run"), "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    assert len(report["runs"]) == 2
    births = {run["rank"]: [e["text"] for e in run["events"] if e["kind"] == "first_birth"] for run in report["runs"]}
    # The watched step's second micro-batch holds rows 4-7 of the closure step's batch.
    expected = "nan at input (input) in module '', micro-batch 1, batch row 2" if form == "watched" else \
        "nan at input (input) in module '', batch row 6"
    assert births[1] == [expected], births


@pytest.mark.parametrize("world", [2, 3])
def test_a_guarded_ddp_step_issues_the_plain_steps_collectives_and_ends_with_its_weights(tmp_path, rank_pools, world):
    """The guard's flags ride in DDP's last bucket: a clean guarded step
    issues the collectives the plain step issues (DDP's default reduction,
    one per bucket), no more, at two ranks. From three ranks a longer bucket
    would change the order the ring adds each gradient's parts in, so there
    the flags have a reduction of their own, begun at the same bucket: one
    more. Either way the weights are the plain loop's, bit for bit."""
    outs = rank_pools.run("ddp_collectives", world, 300, run_dir=str(tmp_path / "run"))
    for rank, out in enumerate(outs):
        assert all(n > 0 for n in out["plain"]), out
        extra = 0 if world == 2 else 1
        assert out["guarded"] == [n + extra for n in out["plain"]], (rank, out)
        assert out["weights"]["guarded"] == out["weights"]["plain"], rank


@pytest.mark.parametrize("kind", ["plain", "ddp"])
def test_auto_fallback_on_one_ranks_data_fault_is_a_skip_on_every_rank_as_in_one_process(tmp_path, rank_pools,
                                                                                         kind):
    """fallback='auto', a blank sample on rank 1: rank 1 diagnoses the step
    (0/0 in fp32 too, finite without the sample), every rank takes that
    remedy, model_or_data (an unsafe op the blank sample triggers), and
    nothing more (no fp32, no LR cut): the weights end as
    with the stock skip alone (fallback='off')."""
    automatic, skip_only = (rank_pools.run("ddp_auto_fallback", 2, 300, run_dir=str(tmp_path / fallback), kind=kind,
                                           fallback=fallback) for fallback in ("auto", "off"))
    for rank, out in enumerate(automatic):
        results = out["results"]
        assert [r["skipped"] for r in results] == [s == 3 for s in range(6)], rank
        assert [r["remedy"] for r in results] == ["model_or_data" if s == 3 else "none" for s in range(6)], rank
        assert {r["amp"] for r in results} == {"bf16"} and results[-1]["lr"] == pytest.approx(1e-2), rank
        assert "rank 1: non-finite with autocast off too; finite without batch row 6, an ordinary sample" in out["log"], (
            rank, out["log"])
        assert out["weights"] == skip_only[rank]["weights"], rank


def test_two_ranks_leave_out_the_same_samples_whatever_their_timing(tmp_path, rank_pools):
    """Rank 1 meets a corrupt row at the last step of each epoch (a data
    fault: both ranks skip it, and its row is listed). LeaveOut(guard=) leaves
    it out from the epoch that begins two steps or more after it was listed,
    on both ranks alike: the next epoch, which begins one step after, still
    meets it (on a quick rank the line might not be on disk yet); the one
    after that does not."""
    outs = rank_pools.run("ddp_leave_out", 2, 300, run_dir=str(tmp_path / "run"), epochs=3)
    assert outs[0]["left_out"] == outs[1]["left_out"] == [[], [], [15]], outs
    assert outs[0]["skipped"] == outs[1]["skipped"] == [1, 3], outs


def test_a_guard_given_model_module_while_the_loop_calls_the_wrapper_is_refused(tmp_path):
    """Given the model inside a DistributedDataParallel while the closure calls the
    wrapper, the ranks would hang in mismatched collectives: a TypeError on the first
    step instead, before the wrapper's forward syncs anything (one rank suffices)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    import nanscope
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        guard = nanscope.StepGuard(model.module, torch.optim.SGD(model.parameters(), lr=0.1),
                                   run_dir=tmp_path / "run", log=False)
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        with pytest.raises(TypeError, match="give the guard the wrapper"):
            guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        fine = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "ok",
                                  log=False)
        assert fine.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y)).counted
    finally:
        dist.destroy_process_group()
