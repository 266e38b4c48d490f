"""The guard on a sharded model: two Gloo ranks on CPU under FSDP2
(fully_shard) and FSDP1 (use_orig_params=True), a fault planted in one rank's
batch (sharded_worker.py, run by ranks that stay up across the tests:
rank_pool.py). Every rank skips the same step and ends with the
weights of the plain FSDP loop that left that step's update out by hand; the
guard's grad norms are the whole gradients' (as PyTorch's own sharded norm
gives them); the sick rank names the birth's op, module and row, its peer
names the sick rank, and the snapshot replays on one process with the plain
model's factory to the same birth."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14):
    pytest.skip("FSDP2 and FSDP1 train on CPU over Gloo from torch 2.14", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
import sharded_worker  # noqa: E402  (the model and loss the replay rebuilds)

WORKER = Path(__file__).parent / "sharded_worker.py"
SICK_RANK = {"forward": 1, "backward": 0, "input": 1}
EXPECTED = {  # by construction: the blank row 5 meets body.1; the NaN sits in input row 6
    "forward": ("aten::div", "forward", "body.1", [sharded_worker.BLANK_ROW]),
    "backward": (None, "backward", "body.1", [sharded_worker.BLANK_ROW]),
    "input": ("input", "input", "", [sharded_worker.NAN_ROW]),
}


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory, rank_pools):
    cache = {}

    def get(engine, fault):
        if (engine, fault) not in cache:
            cache[engine, fault] = rank_pools.run("sharded", 2, 300, run_dir=str(tmp_path_factory.mktemp("plain")),
                                                  engine=engine, form="plain", fault=fault)
        return cache[engine, fault]
    return get


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1", "ddp"])
@pytest.mark.parametrize("form, fault", [("closure", "forward"), ("closure", "backward"), ("closure", "input"),
                                         ("watched", "forward"), ("watched", "backward"),
                                         ("watched_unscale", "forward")])
def test_a_birth_on_one_rank_is_named_there_and_every_rank_skips_alike(tmp_path, run_ranks, plain_runs, engine, form,
                                                                        fault):
    """DDP too: its own buckets mix the gradients in the backward, and the
    guard's hook saw each rank's before they mixed, so a backward birth on
    rank 0 alone is rank 0's on every rank's line. watched_unscale: the
    guard's collective begun at unscale_ (a sharded model's flags and shard
    norms), waited for at step."""
    guarded = run_ranks(tmp_path, engine, form, fault)
    plain = plain_runs(engine, fault)
    sick = SICK_RANK[fault]
    for rank, out in enumerate(guarded):
        skipped = [r["skipped"] for r in out["results"]]
        assert skipped == [step == sharded_worker.FAULT_STEP for step in range(sharded_worker.STEPS)], rank
        # The skip is a transaction on every shard: the plain loop that dropped the update by hand.
        assert out["weights"] == plain[rank]["weights"], f"rank {rank}'s weights differ from the plain run's"
        # Norms of the whole gradients, not of this rank's shards.
        for step, (result, norm) in enumerate(zip(out["results"], plain[rank]["norms"])):
            if step != sharded_worker.FAULT_STEP:
                assert result["grad_norm"] == pytest.approx(norm, rel=1e-5), step
        if fault != "backward":  # the sick rank's loss names it; a backward birth's spreads through every shard
            assert f"step {sharded_worker.FAULT_STEP}: non-finite loss on rank(s) {sick} -> skipped" in out["log"], rank
    op, phase, module, rows = EXPECTED[fault]
    birth = guarded[sick]["results"][sharded_worker.FAULT_STEP]["first_birth"]
    assert f"({phase}" in birth and f"in module '{module}'" in birth and f"batch row {rows[0]}" in birth, birth
    if op:
        assert birth.startswith(f"nan at {op} "), birth
    peer = guarded[1 - sick]["results"][sharded_worker.FAULT_STEP]["first_birth"]
    assert peer == f"{birth}, on rank {sick}; born on rank(s) {sick}, not on rank {1 - sick} (run-rank-{sick}.h5 has " \
        "the rest)"
    assert guarded[1 - sick]["snapshots"] == []
    (snapshot,) = guarded[sick]["snapshots"]
    assert Path(snapshot).name == f"step-{sharded_worker.FAULT_STEP:07d}.h5" and f"rank-{sick}" in snapshot

    # The sick rank's snapshot holds the whole parameters: one process replays
    # it with the plain model's factory to the birth the rank named.
    import nanscope
    report = nanscope.replay(snapshot, model=lambda: sharded_worker.Net(fault), loss=sharded_worker.loss_of,
                             write=False, repeats=1)
    assert report.first_birth is not None
    replayed_rows = report.first_birth.rows or [report.first_birth.sample]  # an input birth names its sample
    assert (report.first_birth.module, report.first_birth.phase, replayed_rows) == (module, phase, rows)
    assert str(report.first_birth) in birth or report.first_birth.op in birth


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_the_guards_clip_uses_the_whole_gradients_norm(tmp_path, run_ranks, engine):
    """clip= on a sharded model scales every rank's shards by the whole
    gradients' norm: SGD ends where the plain FSDP loop's own
    clip_grad_norm_ takes it (a clip by a shard's own norm would not)."""
    clip = 0.05  # below every step's norm: each step is clipped
    guarded = run_ranks(tmp_path, engine, "closure", "none", {"fallback": "off", "clip": clip}, optimizer="sgd")
    plain = run_ranks(tmp_path, engine, "plain", "none", optimizer="sgd", clip=clip)
    assert all(norm > clip for norm in plain[0]["norms"])
    for rank in (0, 1):
        for name, values in plain[rank]["weights"].items():
            assert guarded[rank]["weights"][name] == pytest.approx(values, rel=1e-5, abs=1e-7), (rank, name)


def test_the_report_and_the_viewer_show_a_sharded_runs_ranks(tmp_path, tool, run_ranks):
    """The run directory of two FSDP2 ranks reads as a DDP one does: a run per
    rank in nanscope-report, the sick rank named as the first non-finite one
    and as the birth's, and a heatmap per rank in nanscope-view."""
    report_exe = tool("NANSCOPE_REPORT")
    run_ranks(tmp_path, "fsdp2", "closure", "forward")
    run_dir = tmp_path / "fsdp2-closure-forward-2" / "run"
    report = json.loads(subprocess.run([report_exe, str(run_dir), "--json"], check=True, capture_output=True,
                                       text=True).stdout)
    events = {run["rank"]: {e["kind"]: e["text"] for e in run["events"]} for run in report["runs"]}
    assert sorted(events) == [0, 1]
    for rank in (0, 1):
        assert events[rank]["first_nonfinite"] == "1", events[rank]
    assert events[1]["first_birth"].startswith("nan at aten::div (forward) in module 'body.1'")
    assert events[0]["first_birth"].startswith("nan at aten::div (forward) in module 'body.1'")
    assert events[0]["first_birth"].endswith(", on rank 1; born on rank(s) 1, not on rank 0 (run-rank-1.h5 has the rest)")
    xvfb = shutil.which("xvfb-run")
    if xvfb is None:
        pytest.skip("xvfb-run not installed")
    shot = tmp_path / "view.png"
    view = subprocess.run([xvfb, "-a", tool("NANSCOPE_VIEW"), str(run_dir), "--screenshot", str(shot), "--frames",
                           "3"], capture_output=True, text=True, timeout=120)
    assert view.returncode == 0, view.stderr
    for region in ("region heatmap-rank-0", "region heatmap-rank-1", "region plot.loss"):
        assert region in view.stdout, view.stdout
    assert shot.stat().st_size > 10000


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_the_whole_model_fallback_switches_every_rank_alike(tmp_path, run_ranks, engine):
    """A forward birth on rank 1 with fallback='whole': both ranks skip, go to
    fp32 and cut the LR, and end with the weights of the plain FSDP loop that
    dropped the update and went on in fp32 at the cut LR."""
    guarded = run_ranks(tmp_path, engine, "closure", "forward", {"fallback": "whole", "lr_backoff": 0.5}, steps=6)
    plain = run_ranks(tmp_path, engine, "plain", "forward", steps=6, fallback=0.5)
    for rank, out in enumerate(guarded):
        results = out["results"]
        assert [r["skipped"] for r in results] == [s == sharded_worker.FAULT_STEP for s in range(6)], rank
        assert [r["amp"] for r in results[sharded_worker.FAULT_STEP + 1:]] == ["fp32", "fp32"], rank
        assert results[-1]["lr"] == pytest.approx(0.005), rank
        assert out["weights"] == plain[rank]["weights"], f"rank {rank}'s weights differ from the plain run's"


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_a_rollback_restores_every_ranks_shards_of_the_same_saved_step(tmp_path, run_ranks, engine):
    """Births on two steps in a row (rollback's patience): every rank goes back
    to the state saved after step 2, its shards of the weights and of AdamW's
    state, and trains on alike."""
    fault_steps = (sharded_worker.FAULT_STEP, sharded_worker.FAULT_STEP + 1)
    guarded = run_ranks(tmp_path, engine, "closure", "forward",
                        {"fallback": "off", "rollback_every": 1, "lr_backoff": 0.5}, steps=7,
                        fault_steps=fault_steps, trace=True)
    for rank, out in enumerate(guarded):
        results, trace = out["results"], out["trace"]
        rolled = [(step, r["rolled_back_to"]) for step, r in enumerate(results) if r["rolled_back_to"] >= 0]
        assert rolled == [(fault_steps[1], fault_steps[0] - 1)], rank
        assert trace[fault_steps[1]] == trace[fault_steps[0] - 1], "the weights saved after step 2 are back"
        assert not any(r["skipped"] for r in results[fault_steps[1] + 1:]), rank
        assert results[-1]["lr"] == pytest.approx(0.005), rank


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1", "ddp"])
def test_every_rank_searches_together_and_names_the_dooming_step(tmp_path, rank_pools, engine):
    """Rank 1's finite update at step P dooms its step P + D: every rank
    replays its own batches together, and every rank names step P and the
    row: rank 1's batch row 3, row B + 3 of the whole batch (every rank's rows
    in rank order, as one process with the summed batch reads them)."""
    import doom_ranks_worker as w
    outs = rank_pools.run("doom", 2, 600, run_dir=str(tmp_path / "run"), engine=engine, rollback=False)
    for rank, out in enumerate(outs):
        results = out["results"]
        assert all(r["counted"] for r in results[:w.POISON + w.D]), rank
        failed = results[w.POISON + w.D]
        assert not failed["counted"], rank
        assert (failed["doomed_by_step"], failed["doom_rows"], failed["doomed_by"]) == (
            w.POISON, [w.doom.B + 3], f"step {w.POISON}, rank 1's batch row 3"), rank


@pytest.mark.parametrize("engine", ["fsdp2", "ddp"])
def test_every_rank_goes_on_without_the_dooming_update(tmp_path, rank_pools, engine):
    """With rollback on, every rank puts back the state saved before step P
    and replays the steps since without P's update: the run goes on finite,
    the ranks' weights alike."""
    import doom_ranks_worker as w
    outs = rank_pools.run("doom", 2, 600, run_dir=str(tmp_path / "run"), engine=engine, rollback=True)
    failed = [out["results"][w.POISON + w.D] for out in outs]
    assert failed[0]["rolled_back_to"] == failed[1]["rolled_back_to"]  # the same saved state
    for rank, out in enumerate(outs):
        assert failed[rank]["doomed_by_step"] == w.POISON and 0 <= failed[rank]["rolled_back_to"] < w.POISON, failed
        assert failed[rank]["doomed_by"].startswith(f"step {w.POISON}"), failed
        assert all(r["counted"] for r in out["results"][w.POISON + w.D + 1:]), rank
    assert outs[0]["weights"] == outs[1]["weights"]


@pytest.mark.parametrize("engine, form, after", [("fsdp2", "closure", "stay"), ("fsdp2", "watched", "exit"),
                                                  ("fsdp1", "closure", "exit")])
def test_a_rank_that_raises_ends_the_step_on_every_rank(tmp_path, engine, form, after):
    """Rank 1's forward raises mid-step while rank 0 waits in a collective:
    rank 1 lets its error through and stops, rank 0's collective fails (at
    once when rank 1 ends, at the process group's timeout when it stays), and
    each says so in one line and refuses a next step."""
    timeout = 10
    where = tmp_path / "run"
    env = dict(os.environ, STORE=str(tmp_path / "store"), OMP_NUM_THREADS="1", LOG="1", AFTER=after,
               PG_TIMEOUT=str(timeout), GUARD_OPTIONS=json.dumps({"fallback": "off"}))
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(where), engine, form, "raises"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        out0, err0 = procs[0].communicate(timeout=timeout + 60)
        if after == "stay":
            assert procs[1].poll() is None  # still alive, out of every collective: rank 0 ended at the timeout
            procs[1].kill()
        out1, err1 = procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, err0[-3000:]
    failed = [json.loads(out.strip().splitlines()[-1])["failed"] for out in (out0, out1)]
    step = sharded_worker.FAULT_STEP
    assert failed[1]["raised"] == "RuntimeError"  # the shape error, as the model raised it
    assert failed[0]["raised"] is not None and failed[0]["seconds"] < timeout + 20, failed[0]
    for rank, (f, err) in enumerate(zip(failed, (err0, err1))):
        lines = [line for line in err.splitlines() if f"step {step}: failed on rank {rank}: " in line]
        assert len(lines) == 1, err[-3000:]
        assert "the run stops on each" in lines[0]
        assert f"the guard stopped the run at step {step}: failed on rank {rank}" in f["next_step"]
    assert "mat1 and mat2 shapes cannot be multiplied" in err1


def test_a_flat_parameter_fsdp1_model_is_refused_with_what_to_do(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    import nanscope
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = FullyShardedDataParallel(torch.nn.Linear(4, 2), use_orig_params=False, device_id=torch.device("cpu"))
        with pytest.raises(ValueError, match="use_orig_params=True"):
            nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               log=False)
    finally:
        dist.destroy_process_group()



def test_a_sick_shard_of_the_optimizer_state_is_named_by_the_guards_health(tmp_path):
    """FSDP2 keeps AdamW's state as DTensors keyed by the DTensor parameters,
    while the guard steers their local shards: the health check finds each
    state through its shard, and names an infinite exp_avg_sq there."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    import nanscope
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False)
        for _ in range(3):
            x, y = torch.randn(8, 4), torch.randn(8, 1)
            with guard.autocast():
                loss = F.mse_loss(model(x), y)
            guard.backward(loss, (x, y))
            assert guard.step().counted
        assert guard.health() == []
        optimizer.state[model[0].weight]["exp_avg_sq"].to_local()[0, 1] = float("inf")
        assert guard.health() == ["optimizer state 0.weight/exp_avg_sq"]
        guard.close()
    finally:
        dist.destroy_process_group()
