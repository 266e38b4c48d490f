"""One rank of the dooming-step search under several ranks, for
test_sharded.py: test_doom_search.py's planted fault (a glitched but finite
count on rank 1's step P wrecks the shared probe head; its sample comes again
on rank 1 at P + D and overflows) on 2 Gloo ranks, the model sharded (FSDP2,
FSDP1) or replicated (DDP).

run() is one rank's run, on its process group (rank_server.py): each step's
StepResult fields, and the rank's weights at the end."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import sharded_worker
import test_doom_search as doom

POISON, D, STEPS = 45, 10, 60


def wrap(model, engine):
    if engine == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if engine == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        return FullyShardedDataParallel(model, use_orig_params=True, device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard
    for block in model.trunk.blocks:
        fully_shard(block)
    return fully_shard(model)


def loss_fn(model, batch):
    """test_doom_search.py's loss, with the probe in every backward of every
    rank (a zero gradient where no row counts): FSDP reduce-scatters a
    parameter's gradient on every rank or on none."""
    x, y, counts, counted = batch
    logits, log_rate = model(x)
    loss = F.cross_entropy(logits.reshape(-1, doom.CLASSES), y.reshape(-1))
    if counted.any():
        loss = loss + F.poisson_nll_loss(log_rate[counted], counts[counted], log_input=True)
    return loss + log_rate[:0].sum()


def batch(step, rank):
    """Rank 1 carries the planted fault; rank 0 trains on other, harmless batches."""
    if rank == 1:
        return doom.batch_at(step, {"poison": POISON, "trigger": POISON + D, "echo": POISON})
    return doom.batch_at(step + 10_000, {})


def run(rank, run_dir, engine, rollback):
    import nanscope
    torch.manual_seed(0)
    model = wrap(doom.Net("transformer"), engine)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="fp32", log=False, loss_fn=loss_fn,
                               config=nanscope.GuardConfig(warn=False, fallback="off", doom_search=True,
                                                           rollback=rollback, rollback_every=40, rollback_states=4))
    results = []
    for step in range(STEPS):
        b = batch(step, rank)
        r = guard.closure_step(lambda: loss_fn(model, b), batch=b)
        results.append({"counted": r.counted, "loss": r.loss, "doomed_by": r.doomed_by,
                        "doomed_by_step": r.doomed_by_step, "doom_rows": r.doom_rows,
                        "rolled_back_to": r.rolled_back_to})
    guard.close()
    weights = (sharded_worker.whole_weights(model) if engine != "ddp" else
               {name: p.detach().flatten().tolist() for name, p in model.module.named_parameters()})
    return {"results": results, "weights": weights}
