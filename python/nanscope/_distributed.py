"""The guard's one collective per step for a torch.distributed process group:
each parameter's gradient averaged and the guard's flags reduced with MAX, so
every rank knows which rank went non-finite and all decide alike.

A DistributedDataParallel model keeps its own gradient sync, overlapped with
the backward as in the plain loop: the guard registers DDP's communication
hook, which notes whether this rank's own gradients were finite before they
mix (that names the rank a NaN came from) and then all-reduces each bucket as
DDP's default does. The guard's collective is then the flags alone, begun at
the guard's unscale_() where the loop calls it (so it runs beside the loop's
clipping) and waited for in step(). A model
that has a communication hook of its own keeps it: there DDP's sync is held
off (no_sync) and the guard averages the gradients itself, after checking
them. A forensic re-run calls the module inside, so it never waits for the
other ranks."""
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
    average(flags) averages each parameter's gradient (unless DDP's backward
    did) and reduces the flags with MAX; sum(values) sums; sharded: the model
    is sharded (FSDP), its own backward reduced the gradients, and the guard
    only sums."""

    def __init__(self, dist, group, world, params, sharded):
        self._dist, self._group, self._world, self._params = dist, group, world, params
        self.sharded = sharded
        self.reduces_in_backward = False  # DDP's backward averages, through _note_and_all_reduce
        self._ddp_group = self._all_reduce = None  # DDP's group, and its default reduction of a bucket
        self._own_largest = None  # the largest magnitude of this rank's own gradients this step, before they mixed
        self._begun = None  # (flags' data_ptr, work): a reduction begin_average() started
        self._closed = False

    def take_over_sync_of(self, ddp):
        """Registers the hook that lets DDP's backward average the gradients,
        unless the model has a communication hook of its own
        (reduces_in_backward says which)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        try:
            ddp.register_comm_hook(self, _note_and_all_reduce)
        except RuntimeError:  # "can only be called once": the loop's own hook stays
            return
        self._ddp_group = ddp.process_group
        self._all_reduce = default_hooks.allreduce_hook  # DDP's default: divide, then sum
        self.reduces_in_backward = True

    def own_gradients_nonfinite(self):
        """1.0 (a tensor) when this rank's own gradients held a NaN or an
        infinity before DDP's backward mixed them, else 0.0; None when no
        backward reduced them since the last average()."""
        if self._own_largest is None:
            return None
        return (~torch.isfinite(self._own_largest)).to(torch.float32)

    def close(self):
        """The guard is done: the hook all-reduces as DDP's default and notes nothing."""
        self._closed = True
        self.finish_begun()
        self._own_largest = self._params = None

    def begin_average(self, flags):
        """DDP's backward averaged the gradients: the flags' reduction starts
        now (the guard's unscale_(), before the loop's clipping) and average()
        of the same flags waits for it, so it overlaps the clip."""
        if self._own_largest is None or self._closed:
            return
        self.finish_begun()
        work = self._dist.all_reduce(flags, op=self._dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._begun = (flags.data_ptr(), work)

    def finish_begun(self):
        """Waits for a reduction begin_average() started; whether there was one (its flags' data_ptr, or None)."""
        begun, self._begun = self._begun, None
        if begun is None:
            return None
        begun[1].wait()
        return begun[0]

    def average(self, flags):
        dist, group = self._dist, self._group
        if self._own_largest is not None:  # DDP's backward averaged them
            self._own_largest = None
            if self.finish_begun() != flags.data_ptr():
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
            return
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


def _note_and_all_reduce(ranks, bucket):
    """DDP's communication hook: the bucket's largest magnitude kept (NaN
    propagates through it; a reduction, no copy and no host sync), then the
    bucket averaged as DDP's own default does (divided, then summed)."""
    if not ranks._closed:
        largest = torch.linalg.vector_norm(bucket.buffer(), float("inf")).to(torch.float32)
        # DDP reduces the buckets in their order: bucket 0 begins a backward.
        earlier = None if bucket.index() == 0 else ranks._own_largest
        ranks._own_largest = largest if earlier is None else torch.maximum(earlier, largest)
    return ranks._all_reduce(ranks._ddp_group, bucket)


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
    ranks = Ranks(dist, group, world, params, sharded)
    if is_ddp(model):
        ranks.take_over_sync_of(model)
    return ranks, rank, world


def call(ddp, function, *args):
    """function(*args), a DistributedDataParallel model's forward under no_sync()
    (given the model where the guard averages its gradients itself)."""
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
