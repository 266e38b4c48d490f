"""The guard's collectives for a torch.distributed process group: each
parameter's gradient averaged and the guard's flags summed (each rank writes
its own slots, zeros elsewhere), so every rank knows which rank went
non-finite and all decide alike.

A DistributedDataParallel model keeps its own gradient sync, overlapped with
the backward as in the plain loop: the guard registers DDP's communication
hook, which notes whether this rank's own gradients were finite before they
mix (that names the rank a NaN came from) and then all-reduces each bucket as
DDP's default does. At the last bucket every flag is known (the loss came
through guard.scale, the earlier buckets' notes are in), and the flags ride
in that bucket's reduction: appended to it, split off when it completes, so
the guarded step has no collective the plain step does not. They ride where
that leaves the gradients' sums bit for bit as DDP's default makes them: two
ranks (a sum of two is the same in either order) and a float32 or float64
bucket. From three ranks a longer buffer moves where the ring splits it, and
so the order each gradient's parts are added in; there, and in a 16-bit
bucket (which would round the losses), the flags' own reduction begins at the
same hook, beside the bucket's, and step() waits for it.

A model that has a communication hook of its own keeps it: there DDP's sync
is held off (no_sync) and the guard averages the gradients itself, after
checking them. A forensic re-run calls the module inside, so it never waits
for the other ranks."""
import weakref

import torch

from . import _nanscope
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
    did) and sums the flags (or waits for their sum, begun in DDP's last
    bucket); sum(values) sums (or waits for begin_sum's); sharded: the
    model is sharded (FSDP), its own backward reduced the gradients, and the
    guard only sums."""

    def __init__(self, dist, group, world, params, sharded):
        self._dist, self._group, self._world, self._params = dist, group, world, params
        self.sharded = sharded
        self.reduces_in_backward = False  # DDP's backward averages, through _note_and_all_reduce
        self._ddp_group = self._all_reduce = None  # DDP's group, and its default reduction of a bucket
        self._own_largest = None  # the largest magnitude of this rank's own gradients this step, before they mixed
        self._begun = None  # (flags' data_ptr, work or future): a reduction begun before average()
        self._flags_of_step = lambda: None  # this rank's flags for the open watched step, or None (send_flags_of)
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

    def send_flags_of(self, guard):
        """At DDP's last bucket the hook asks `guard` (a _StepGuard, weakly:
        the guard holds these ranks) for this rank's flags of the open watched
        step, and sends them with the bucket, or beside it. Only where DDP's
        group is the guard's: the flags are laid out for the guard's ranks."""
        ours = self._group if self._group is not None else self._dist.group.WORLD
        if not self.reduces_in_backward or self._ddp_group is not ours:
            return
        guard = weakref.ref(guard)

        def flags():
            g = guard()
            return None if g is None else g.flags_for_gradient_reduction()
        self._flags_of_step = flags

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
        now (at the last bucket, or at the guard's unscale_(), before the
        loop's clipping) and average() of the same flags waits for it, so it
        overlaps what comes between."""
        if self._own_largest is None or self._closed:
            return
        self.finish_begun()
        work = self._dist.all_reduce(flags, group=self._group, async_op=True)
        self._begun = (flags.data_ptr(), work)

    def reduce_last_bucket(self, bucket, flags):
        """DDP's last bucket, reduced as DDP's default does (divided, then
        summed) with `flags` appended, which are split off into `flags` when
        it completes; or, where that would change the gradients' sums (see
        the module's note), the bucket as DDP's default and the flags' own
        reduction begun beside it. A future of the bucket's averaged buffer."""
        buffer = bucket.buffer()
        world = self._world
        if world != 2 or buffer.dtype not in (torch.float32, torch.float64):
            reduced = self._all_reduce(self._ddp_group, bucket)
            self.begin_average(flags)
            return reduced
        self.finish_begun()
        size = buffer.numel()
        both = torch.cat([buffer.div_(world), flags.to(buffer.dtype)])

        def split(future):
            summed = future.value()[0]
            flags.copy_(summed[size:])
            return summed[:size]
        future = self._dist.all_reduce(both, group=self._ddp_group, async_op=True).get_future().then(split)
        self._begun = (flags.data_ptr(), future)
        return future

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
                dist.all_reduce(flags, group=group)
            return
        grads = []
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        # One round trip: the flags after the gradients, where one dtype and device hold them all.
        rides = bool(grads) and all(g.dtype == torch.float32 and g.device == flags.device for g in grads)
        if not rides:
            dist.all_reduce(flags, group=group)
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads] + ([flags] if rides else []))
            dist.all_reduce(flat, group=group)
            size = flat.numel() - (flags.numel() if rides else 0)
            if rides:
                flags.copy_(flat[size:])
            flat = flat[:size]
            flat /= self._world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def begin_sum(self, values):
        """A sharded model's flags and shard norms: their sum starts now (the
        guard's unscale_(), before the loop's clipping) and sum() of the same
        values waits for it."""
        if self._closed:
            return
        self.finish_begun()
        self._begun = (values.data_ptr(), self._dist.all_reduce(values, group=self._group, async_op=True))

    def sum(self, values):
        if self.finish_begun() != values.data_ptr():
            self._dist.all_reduce(values, group=self._group)


def _note_and_all_reduce(ranks, bucket):
    """DDP's communication hook: the bucket's largest magnitude kept (NaN
    propagates through it; one pass, no copy and no host sync), then the
    bucket averaged as DDP's own default does (divided, then summed); the
    last bucket takes the guard's flags with it."""
    if ranks._closed:
        return ranks._all_reduce(ranks._ddp_group, bucket)
    largest = _nanscope.largest_magnitude(bucket.buffer())
    # DDP reduces the buckets in their order: bucket 0 begins a backward.
    earlier = None if bucket.index() == 0 else ranks._own_largest
    ranks._own_largest = largest if earlier is None else torch.maximum(earlier, largest)
    if bucket.is_last():
        flags = ranks._flags_of_step()
        if flags is not None:
            return ranks.reduce_last_bucket(bucket, flags)
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
