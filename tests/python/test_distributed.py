"""Two processes under torch.distributed (Gloo): a NaN sample on rank 1 only.
Both ranks skip the same step, keep identical weights, write their own run
file, and only rank 1 writes a snapshot, which names the birth. For a plain
model (the guard averages) and a DistributedDataParallel one."""
import json
import os
import subprocess
import sys

import pytest

WORKER = r'''
import os, sys, json
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import nanscope

rank, world, run_dir, kind = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3]
ddp = kind.startswith("ddp")
# A file store in the test's own directory: no port picked ahead of time that
# another process may take before rank 0 listens on it (Gloo's own sockets bind port 0).
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=world)
torch.manual_seed(rank)  # different initial weights: the guard (or DDP) starts every rank from rank 0's
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
if ddp:
    model = nn.parallel.DistributedDataParallel(model)
if kind == "ddp-own-hook":  # the loop's own communication hook, registered before the guard is made
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model.register_comm_hook(None, default_hooks.allreduce_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# watched: nanoGPT's loop, DDP's sync on for the last micro-batch only, GradScaler's calls on the guard
watched = len(sys.argv) > 4
guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                           loss_fn=(lambda m, b: F.cross_entropy(m(b[0]), b[1])) if watched else None)
counted = []
for step in range(6):
    torch.manual_seed(100 * step + rank)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    if step == 3 and rank == 1:
        x[6, 0] = float("nan")
    if not watched:
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    else:
        for micro in range(2):
            if ddp:
                model.require_backward_grad_sync = micro == 1
            rows = slice(4 * micro, 4 * micro + 4)
            with guard.autocast():
                loss = F.cross_entropy(model(x[rows]), y[rows]) / 2
            guard.scale(loss, (x[rows], y[rows])).backward()
        if step == 0:  # were the gradients averaged in the backward (DDP's own sync), before guard.step?
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            every = [torch.zeros_like(grads) for _ in range(world)]
            dist.all_gather(every, grads)
            synced_in_backward = all(torch.equal(every[0], g) for g in every)
        result = guard.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    counted.append(result.counted)
guard.flush()
weights = [p.detach().flatten().tolist() for p in model.parameters()]
print(json.dumps({"counted": counted, "weights": weights, "snapshots": guard.snapshots,
                  "synced_in_backward": synced_in_backward if watched else None}), flush=True)
# What uses the process group goes before it: DDP's reducer (its threads, at
# interpreter exit, otherwise outlive the group: "terminate called").
guard.close()
del guard, model, optimizer
dist.destroy_process_group()
'''


@pytest.mark.parametrize("kind, form", [("plain", "closure"), ("ddp", "closure"), ("plain", "watched"),
                                        ("ddp", "watched"), ("ddp-own-hook", "closure"),
                                        ("ddp-own-hook", "watched")])
def test_ranks_agree_on_the_skip_and_only_the_sick_rank_snapshots(tmp_path, tool, kind, form):
    """DDP averages the gradients in its own backward, overlapped, as in the
    plain loop (the guard's communication hook notes each rank's gradients
    before they mix); a model with a hook of its own keeps it, its sync held
    off while the guard averages. Either way the same step is skipped."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = dict(os.environ, STORE=str(tmp_path / "store"), OMP_NUM_THREADS="1")
    extra = ["watched"] if form == "watched" else []
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(tmp_path / "run"), kind] + extra, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
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


AUTO_WORKER = r'''
import os, sys, json
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import nanscope

rank, run_dir, kind, fallback = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2)


class Normalize(nn.Module):  # each row over its length: a blank row is 0/0, at any precision
    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8, bias=False), Normalize(), nn.Linear(8, 2))
if kind == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", config=nanscope.GuardConfig(fallback=fallback),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
results = []
for step in range(6):
    torch.manual_seed(100 * step + rank)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    if step == 3 and rank == 1:
        x[6] = 0.0  # a blank sample
    r = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    results.append({"skipped": r.skipped, "remedy": r.remedy, "amp": r.amp, "lr": r.lr})
guard.flush()
weights = [p.detach().flatten().tolist() for p in model.parameters()]
print(json.dumps({"results": results, "weights": weights}), flush=True)
guard.close()
del guard, model, optimizer
dist.destroy_process_group()
'''


def run_auto_worker(tmp_path, kind, fallback):
    where = tmp_path / fallback
    where.mkdir()
    worker = where / "worker.py"
    worker.write_text(AUTO_WORKER)
    env = dict(os.environ, STORE=str(where / "store"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(where / "run"), kind, fallback], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(dict(json.loads(out.strip().splitlines()[-1]), log=err))
    return outs


@pytest.mark.parametrize("kind", ["plain", "ddp"])
def test_auto_fallback_on_one_ranks_data_fault_is_a_skip_on_every_rank_as_in_one_process(tmp_path, kind):
    """fallback='auto', a blank sample on rank 1: rank 1 diagnoses the step
    (0/0 in fp32 too, finite without the sample), every rank takes that
    remedy, data, and nothing more (no fp32, no LR cut): the weights end as
    with the stock skip alone (fallback='off')."""
    automatic = run_auto_worker(tmp_path, kind, "auto")
    skip_only = run_auto_worker(tmp_path, kind, "off")
    for rank, out in enumerate(automatic):
        results = out["results"]
        assert [r["skipped"] for r in results] == [s == 3 for s in range(6)], rank
        assert [r["remedy"] for r in results] == ["data" if s == 3 else "none" for s in range(6)], rank
        assert {r["amp"] for r in results} == {"bf16"} and results[-1]["lr"] == pytest.approx(1e-2), rank
        assert "rank 1: finite without batch row(s) 6; no fallback" in out["log"], (rank, out["log"])
        assert out["weights"] == skip_only[rank]["weights"], rank


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
