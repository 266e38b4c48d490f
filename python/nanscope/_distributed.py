"""The guard's one collective per step for a torch.distributed process group:
each parameter's gradient averaged and the guard's flags reduced with MAX, so
every rank knows which rank went non-finite and all decide alike. A
DistributedDataParallel model's own gradient sync is held off (no_sync): the
guard checks each rank's own gradients before they are averaged, which names
the rank a NaN came from, and a forensic re-run on that rank alone must not
wait for the others."""
import torch

from . import _sharded


def _dist():
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


def initialized():
    return _dist() is not None


def is_ddp(model):
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


class Ranks:
    """The guard's collectives over one process group (python_averager.hpp):
    average(flags) averages each parameter's gradient and reduces the flags
    with MAX; sum(values) sums; sharded: the model is sharded (FSDP), its own
    backward reduced the gradients, and the guard only sums."""

    def __init__(self, dist, group, world, params, sharded):
        self._dist, self._group, self._world, self._params = dist, group, world, params
        self.sharded = sharded

    def average(self, flags):
        dist, group = self._dist, self._group
        grads = []
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            flat /= self._world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)

    def sum(self, values):
        self._dist.all_reduce(values, group=self._group)


def averager(model, group):
    """(Ranks or None, rank, world size) for the current process group."""
    sharded = _sharded.is_sharded(model)  # also refuses a model FSDP1 flattened
    dist = _dist()
    if dist is None:
        if group is not None:
            raise ValueError("nanscope.StepGuard: process_group given but torch.distributed is not initialised")
        return None, 0, 1
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if world < 2:
        return None, rank, world
    params = [p for p in model.parameters() if p.requires_grad]
    if not is_ddp(model) and not sharded:  # every rank starts from rank 0's weights, as DistributedDataParallel does
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return Ranks(dist, group, world, params, sharded), rank, world


def call(ddp, function, *args):
    """function(*args), a DistributedDataParallel model's forward under no_sync()."""
    if ddp is not None:
        with ddp.no_sync():
            return function(*args)
    return function(*args)


def refusing_a_wrapper_of(model, function):
    """function, run with a check for the first step: the loop must not call a
    DistributedDataParallel that wraps the guard's model. Given model.module
    while the loop calls the wrapper, the wrapper and the guard would each
    synchronise the gradients, in different orders on different ranks, and the
    ranks would wait for each other for ever. The check raises before the
    wrapper's forward runs any collective."""
    def refuse(module, _inputs):
        if is_ddp(module) and module.module is model:
            raise TypeError("nanscope.StepGuard was given the model inside a DistributedDataParallel "
                            "(model.module), but the closure calls the DistributedDataParallel itself: give "
                            "the guard the wrapper, nanscope.StepGuard(ddp_model, optimizer, ...), so the "
                            "gradients are synchronised once")

    def run():
        hook = torch.nn.modules.module.register_module_forward_pre_hook(refuse)
        try:
            return function()
        finally:
            hook.remove()
    return run
