"""One rank of test_distributed.py's runs, on two Gloo ranks (rank_server.py
runs them): a small model, plain (the guard averages the gradients) or under
DistributedDataParallel, with a NaN sample (skip_run) or a blank one
(auto_fallback_run) in rank 1's batch at step 3."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

FAULT_STEP, STEPS = 3, 6


def skip_run(rank, run_dir, kind, watched):
    """kind: plain | ddp | ddp-own-hook (the loop's own communication hook,
    registered before the guard is made). watched: nanoGPT's loop, DDP's sync
    on for the last micro-batch only, GradScaler's calls on the guard."""
    import nanscope
    world = dist.get_world_size()
    torch.manual_seed(rank)  # different initial weights: the guard (or DDP) starts every rank from rank 0's
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    ddp = kind.startswith("ddp")
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    if kind == "ddp-own-hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                               loss_fn=(lambda m, b: F.cross_entropy(m(b[0]), b[1])) if watched else None)
    counted, synced_in_backward = [], None
    for step in range(STEPS):
        torch.manual_seed(100 * step + rank)
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        if step == FAULT_STEP and rank == 1:
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
    out = {"counted": counted, "weights": [p.detach().flatten().tolist() for p in model.parameters()],
           "snapshots": guard.snapshots, "synced_in_backward": synced_in_backward}
    guard.close()
    return out


def collectives_run(rank, run_dir, steps=4):
    """A clean run of DDP's watched loop (two micro-batches, the sync on the
    last), plain and guarded, the plain one with DDP's default reduction as a
    Python hook so that its collectives are counted too. Returns, per step,
    the collectives each loop issued from Python, and both loops' weights."""
    import nanscope
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    counts = {"n": 0}
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter")}

    def counted(function):
        def call(*args, **kwargs):
            counts["n"] += 1
            return function(*args, **kwargs)
        return call

    def model():
        torch.manual_seed(0)
        return nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2)))
    plain, guarded = model(), model()
    plain.register_comm_hook(None, default_hooks.allreduce_hook)
    plain_opt, guarded_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, guarded))
    guard = nanscope.StepGuard(guarded, guarded_opt, run_dir=run_dir, amp="bf16", log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    plain_counts, guarded_counts = [], []
    for name, function in originals.items():
        setattr(dist, name, counted(function))
    try:
        for step in range(steps):
            torch.manual_seed(100 * step + rank)
            x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
            for loop, counts_of in (("plain", plain_counts), ("guarded", guarded_counts)):
                m = plain if loop == "plain" else guarded
                counts["n"] = 0
                for micro in range(2):
                    m.require_backward_grad_sync = micro == 1
                    rows = slice(4 * micro, 4 * micro + 4)
                    if loop == "plain":
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            loss = F.cross_entropy(m(x[rows]), y[rows]) / 2
                        loss.backward()
                    else:
                        with guard.autocast():
                            loss = F.cross_entropy(m(x[rows]), y[rows]) / 2
                        guard.scale(loss, (x[rows], y[rows])).backward()
                if loop == "plain":
                    plain_opt.step()
                    plain_opt.zero_grad(set_to_none=True)
                else:
                    guard.unscale_(guarded_opt)
                    assert guard.step(guarded_opt).counted
                    guarded_opt.zero_grad(set_to_none=True)
                counts_of.append(counts["n"])
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
    guard.close()
    weights = {m: [p.detach().flatten().tolist() for p in model.parameters()]
               for m, model in (("plain", plain), ("guarded", guarded))}
    return {"plain": plain_counts, "guarded": guarded_counts, "weights": weights}


class Normalize(nn.Module):
    """Each row over its length: a blank row is 0/0, at any precision."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


def auto_fallback_run(rank, run_dir, kind, fallback):
    """kind: plain | ddp; the guard's fallback as given, its lines logged."""
    import nanscope
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), Normalize(), nn.Linear(8, 2))
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16",
                               config=nanscope.GuardConfig(fallback=fallback),
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    results = []
    for step in range(STEPS):
        torch.manual_seed(100 * step + rank)
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        if step == FAULT_STEP and rank == 1:
            x[6] = 0.0  # a blank sample
        r = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        results.append({"skipped": r.skipped, "remedy": r.remedy, "amp": r.amp, "lr": r.lr})
    guard.flush()
    out = {"results": results, "weights": [p.detach().flatten().tolist() for p in model.parameters()]}
    guard.close()
    return out



def leave_out_run(rank, run_dir, epochs):
    """Both ranks over one data set of 16 rows, DistributedSampler (no
    shuffle: rank r draws rows r, r+2, ...) under nanscope.LeaveOut(guard=),
    4 rows a step, 2 steps an epoch. Row 15, corrupt, is rank 1's in the last
    step of every epoch. Returns, per epoch, the rows LeaveOut left out and
    the steps skipped."""
    import nanscope
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)
    x[15, 1] = float("nan")
    sampler = nanscope.LeaveOut(DistributedSampler(range(16), shuffle=False), run_dir, guard=guard)
    loader = DataLoader(TensorDataset(x, y, torch.arange(16)), batch_size=4, sampler=sampler)
    left_out, skipped = [], []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb, rows in loader:
            number = guard.next_step
            with guard.autocast():
                loss = F.cross_entropy(model(xb), yb)
            guard.backward(loss, (xb, yb), rows=rows)
            result = guard.step()
            optimizer.zero_grad(set_to_none=True)
            if result.skipped:
                skipped.append(number)
        left_out.append(sorted(sampler.left_out))
    guard.close()
    return {"left_out": left_out, "skipped": skipped}
