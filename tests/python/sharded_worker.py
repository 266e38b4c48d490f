"""One rank of a sharded training run for test_sharded.py, over Gloo on CPU:
FSDP2 (fully_shard), FSDP1 (use_orig_params=True) or DDP, the guard's closure
or watched form, or the plain loop that leaves out one step's update by hand.
The tests run it through rank_server.py (run()); the command line is for a
rank that must end on its own (the "raises" fault).

usage: sharded_worker.py RANK RUN_DIR ENGINE FORM FAULT
  ENGINE: fsdp2 | fsdp1 | ddp      FORM: closure | watched | watched_unscale | plain
          (watched_unscale: the watched form with guard.unscale_ before step,
          where the guard begins its collective)
  FAULT:  forward (rank 1's batch has a blank row: 0/0 in Normalize's forward)
          backward (rank 0's batch has a blank row: sqrt'(0) in Magnitude's backward)
          input (rank 1's batch holds a NaN)
          raises (rank 1's batch is one column short: its forward raises; env
          AFTER=exit: rank 1 then ends, AFTER=stay: it stays, and its peer ends
          at the process group's timeout, env PG_TIMEOUT seconds)
Prints one JSON line: the StepResults, the whole weights and each step's grad norm.
Env: STORE (the process group's file), WORLD (2), GUARD_OPTIONS (JSON), LOG=1."""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS, FAULT_STEP, BLANK_ROW, NAN_ROW = 5, 3, 5, 6


class Normalize(nn.Module):
    """Each row over its length: a blank row is 0/0 in the forward."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


class Magnitude(nn.Module):
    """Each row's length as one more feature: finite for a blank row, but its
    gradient there is 0 x 1/(2 sqrt(0)) = NaN (a backward-only birth)."""

    def forward(self, x):
        return torch.cat([x, x.square().sum(1, keepdim=True).sqrt()], 1)


class Net(nn.Module):
    """A blank input row stays blank through the first layer (no bias), where
    body.1 meets it."""

    def __init__(self, fault):
        super().__init__()
        prep, width = (Normalize(), 16) if fault == "forward" else (Magnitude(), 17)
        self.body = nn.Sequential(nn.Linear(8, 16, bias=False), prep, nn.Linear(width, 32), nn.GELU(),
                                  nn.Linear(32, 32), nn.GELU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x))


def loss_of(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def batch(step, rank, fault, fault_steps=(FAULT_STEP,)):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 8, generator=g) + 0.5, torch.randint(0, 3, (8,), generator=g)
    if step in fault_steps:
        if fault == "forward" and rank == 1 or fault == "backward" and rank == 0:
            x[BLANK_ROW] = 0.0
        if fault == "input" and rank == 1:
            x[NAN_ROW, 2] = float("nan")
        if fault == "raises" and rank == 1:
            x = x[:, :-1]
    return x, y


def shard(model, engine):
    if engine == "ddp":  # replicated, for the same loops on a DistributedDataParallel model
        return nn.parallel.DistributedDataParallel(model)
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in (model.body, model.head):
            fully_shard(layer)
        return fully_shard(model)
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FullyShardedDataParallel(model, use_orig_params=True, device_id=torch.device("cpu"),
                                    auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))


def whole_weights(model):
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return {name: p.detach().flatten().tolist() for name, p in sorted(model.module.named_parameters())}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {name.replace("_fsdp_wrapped_module.", ""): t.flatten().tolist() for name, t in sorted(state.items())}


def total_norm(model, engine):
    """The whole gradient's norm, as PyTorch takes it for a sharded model."""
    if engine == "fsdp1":
        return float(model.clip_grad_norm_(float("inf")))
    if engine == "ddp":
        return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).full_tensor())


def failed_step(guard, model, optimizer, form, x, y, step):
    """The step where one rank's forward raises: what each rank's step raised,
    in how long, and what the guard says to a next step."""
    import nanscope

    def one_step(x, y):
        if form == "closure":
            return guard.closure_step(lambda: loss_of(model, (x, y)), batch=(x, y))
        with guard.autocast():
            loss = loss_of(model, (x, y))
        guard.scale(loss, (x, y)).backward()
        return guard.step(optimizer)
    start = time.monotonic()
    try:
        one_step(x, y)
        return {"raised": None}
    except Exception as e:  # noqa: BLE001 (the test asserts which)
        failed = {"raised": type(e).__name__, "seconds": time.monotonic() - start}
    try:
        one_step(*batch(step + 1, dist.get_rank(), "none"))
    except nanscope.DeadRunError as e:
        failed["next_step"] = str(e)
    return failed


def run(rank, run_dir, engine, form, fault, steps=STEPS, fault_steps=(FAULT_STEP,), optimizer="adamw", clip=None,
        fallback=None, trace=False, log=False, guard_options=None):
    """One run on this rank's process group: the StepResults (the guard's
    forms), each step's whole grad norm (the plain loop), the snapshots and
    the whole weights at the end. The plain loop clips at clip (the loop's
    own clip, as PyTorch does it on a sharded model) and, from the step after
    the fault, trains in fp32 at the LR cut by fallback (as the guard's
    whole-model fallback). Under the "raises" fault the run stops at the
    fault step with what it raised ("failed"), the guard left open."""
    torch.manual_seed(0)  # every rank builds the same weights; FSDP keeps its shard of them
    model = shard(Net(fault), engine)
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.5) if optimizer == "sgd" else
                 torch.optim.AdamW(model.parameters(), lr=1e-2))
    out = {"results": [], "norms": []}
    guard = None
    if form != "plain":
        import nanscope
        guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=log, loss_fn=loss_of,
                                   config=nanscope.GuardConfig(**(guard_options or {})))
    for step in range(steps):
        x, y = batch(step, rank, fault, fault_steps)
        if fault == "raises" and step >= FAULT_STEP:
            out["failed"] = failed_step(guard, model, optimizer, form, x, y, step)
            return out, guard
        if form == "closure":
            result = guard.closure_step(lambda: loss_of(model, (x, y)), batch=(x, y))
        elif form in ("watched", "watched_unscale"):
            with guard.autocast():
                loss = loss_of(model, (x, y))
            guard.scale(loss, (x, y)).backward()
            if form == "watched_unscale":
                guard.unscale_(optimizer)
            result = guard.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        else:  # the plain loop, bf16 autocast as the guard's, the fault step's update left out by hand
            fell_back = fallback is not None and step > FAULT_STEP
            if fell_back:
                for group in optimizer.param_groups:
                    group["lr"] = 1e-2 * fallback
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not fell_back):
                loss = loss_of(model, (x, y))
            loss.backward()
            out["norms"].append(total_norm(model, engine))
            if clip is not None:
                if engine == "fsdp1":
                    model.clip_grad_norm_(clip)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if step != FAULT_STEP or fault == "none":
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            continue
        out["results"].append({"skipped": result.skipped, "grad_norm": result.grad_norm,
                                "first_birth": result.first_birth, "snapshot": result.snapshot,
                                "rolled_back_to": result.rolled_back_to, "amp": result.amp, "lr": result.lr,
                                "remedy": result.remedy})
        if trace:  # the whole weights after each step
            out.setdefault("trace", []).append(whole_weights(model))
    if guard is not None:
        out["snapshots"] = guard.snapshots
        guard.close()
    out["weights"] = whole_weights(model)
    return out


def main():
    rank, run_dir, engine, form, fault = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank,
                            world_size=int(os.environ.get("WORLD", 2)),
                            timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", 1800))))
    out = run(rank, run_dir, engine, form, fault, log=os.environ.get("LOG") == "1",
              guard_options=json.loads(os.environ.get("GUARD_OPTIONS", "{}")))
    if fault != "raises":
        print(json.dumps(out), flush=True)
        dist.destroy_process_group()
        return
    out, guard = out
    if rank == 1 and os.environ.get("AFTER") == "stay":
        print(json.dumps(out), flush=True)
        time.sleep(600)  # alive, out of every collective: the peer must end at the timeout
    guard.close()
    print(json.dumps(out), flush=True)
    os._exit(0)  # a process group whose peer is gone cannot be torn down in step


if __name__ == "__main__":
    main()
