"""The guard in a Hugging Face Accelerate loop: StepGuard(..., accelerator=acc).

Accelerate keeps one GradScaler-shaped object, accelerator.scaler, and calls
it from its own methods: accelerator.backward(loss) calls scale(loss).backward(),
the prepared optimizer's step() calls step(optimizer) and update() on the
accumulation boundary only, accelerator.clip_grad_norm_ calls unscale_(). The
guard has those calls (the watched form), so it takes that slot, and the loop's
lines stay as they are. The prepared optimizer learns of a skip as it learns of
a GradScaler's (its own step() was not called), so the prepared scheduler does
not advance and accelerator.optimizer_step_was_skipped is true; the guard also
clears that flag at the next micro-batch, which Accelerate alone leaves set for
every micro-batch until the next boundary."""

import torch

from . import _sharded, _watch

_PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": None}


def precision(accelerator):
    """The guard's amp: the precision the accelerator really runs, which its
    prepared model's forward already runs under. mixed_precision="fp16" where
    Accelerate has no fp16 (on CPU: no autocast, no scaler) trains in fp32,
    and so does the guard: scaling the loss there would shrink every update."""
    if str(accelerator.mixed_precision) in ("fp16", "bf16") and not getattr(accelerator, "native_amp", True):
        return "fp32"
    amp = _PRECISIONS.get(str(accelerator.mixed_precision))
    if amp is None:
        raise ValueError(f"nanscope.StepGuard: Accelerate's mixed_precision={accelerator.mixed_precision!r} is not "
                         "one the guard runs (bf16, fp16 or no)")
    return amp


def check_precision(accelerator, amp):
    """An amp= given beside accelerator= must say what the accelerator does."""
    if amp != precision(accelerator):
        raise ValueError(f"nanscope.StepGuard: amp={amp!r} differs from the accelerator's mixed_precision="
                         f"{accelerator.mixed_precision!r}: leave amp out, the guard takes the accelerator's")


def unwrapped(optimizer):
    """The torch optimizer inside Accelerate's AcceleratedOptimizer (it is what
    the prepared optimizer hands to scaler.step and scaler.unscale_)."""
    return getattr(optimizer, "optimizer", optimizer) if _is_accelerated(optimizer) else optimizer


def _same_gradients(parameters, steered):
    """Whether torch's norm of `parameters`' gradients is the guard's: the same
    gradients in the same order (the guard's are those of the parameters it
    steers), all of one dtype and device, so that get_total_norm takes them as
    one group, in this order, as the guard does."""
    theirs = [p for p in parameters if p.grad is not None]
    mine = [p for p in steered if p.grad is not None]
    if not theirs or len(theirs) != len(mine) or any(a is not b for a, b in zip(theirs, mine)):
        return False
    first = theirs[0].grad
    return all(p.grad.dtype == first.dtype and p.grad.device == first.device and p.grad.layout == torch.strided
               for p in theirs)


def _is_accelerated(optimizer):
    return type(optimizer).__name__ == "AcceleratedOptimizer" and hasattr(optimizer, "gradient_state")


class Installed:
    """The guard in an accelerator's scaler slot, and the prepared optimizer that holds it."""

    def __init__(self, guard, accelerator, optimizer):
        from accelerate.optimizer import patch_optimizer_step

        if not _is_accelerated(optimizer):
            raise TypeError("nanscope.StepGuard(accelerator=...): give the guard the optimizer that "
                            "accelerator.prepare returned")
        if accelerator.distributed_type.name not in ("NO", "MULTI_CPU", "MULTI_GPU"):
            raise ValueError(f"nanscope.StepGuard: Accelerate's {accelerator.distributed_type.name} is not supported "
                             "(a single process, or DistributedDataParallel over several)")
        # The micro-batch the next scale() call is for: named by guard.backward(loss,
        # batch), or by a Trainer's compute_loss (_trainer.py); taken by that call.
        self.batch = None
        self.rows = None  # its data set rows, as guard.backward(loss, batch, rows=) named them
        self._wrapper = optimizer
        # What AcceleratedOptimizer.__init__ sets up when it is given a scaler:
        # its step() then calls scaler.step(optimizer) and tells a skip by
        # whether the optimizer's own step() ran.
        if optimizer.scaler is None:
            optimizer._accelerate_step_called = False
            optimizer._optimizer_original_step_method = optimizer.optimizer.step
            optimizer._optimizer_patched_step_method = patch_optimizer_step(optimizer, optimizer.optimizer.step)
        optimizer.scaler = guard
        accelerator.scaler = guard
        self._accelerator = accelerator
        self._guard = guard
        self._wrap_clipping(accelerator)

    def _wrap_clipping(self, accelerator):
        """accelerator.clip_grad_norm_ / clip_grad_value_ unscale through the
        guard first at every precision, not only where Accelerate unscales
        (fp16 with its scaler): the guard takes the step's grad norm there, so
        run.h5 records it before the clip, and the loop's clip (the
        Trainer's, and the norm it logs) sees unscaled gradients.

        In one process, clip_grad_norm_ then clips with the norm the guard
        just took, where torch would take the same one (see _same_gradients):
        torch.nn.utils.clip_grad_norm_ is get_total_norm and then
        clip_grads_with_norm_, and the guard takes its norm with get_total_norm's
        ops, so the gradients and the returned norm are bit for bit the plain
        loop's, and the norm is not taken twice (a tenth of a millisecond, a
        percent of a small Trainer step)."""
        guard = self._guard
        view = guard._integration()
        unscales_itself = accelerator.native_amp and accelerator.mixed_precision == "fp16"
        reuses_norm = accelerator.distributed_type.name == "NO" and hasattr(torch.nn.utils, "clip_grads_with_norm_")
        steered = [p for _, p in _sharded.named_parameters(_watch.inner(view.model), trainable=True)] \
            if reuses_norm else []

        def unscaled_first(clip):
            def run(*args, **kwargs):
                if not unscales_itself and not view.unscaled and not view.closed:
                    guard.unscale_()
                return clip(*args, **kwargs)
            run.__wrapped__ = clip
            return run

        def norm_from_the_guard(clip):
            def run(parameters, max_norm, norm_type=2):
                # Only where the guard unscales now: gradients changed after an
                # earlier unscale_() would have another norm.
                if reuses_norm and not view.closed and not view.unscaled and float(norm_type) == 2.0:
                    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                    if _same_gradients(parameters, steered):
                        norm = guard.unscale_()
                        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
                        return norm
                return clip(parameters, max_norm, norm_type)
            run.__wrapped__ = clip
            return run
        accelerator.clip_grad_norm_ = norm_from_the_guard(unscaled_first(accelerator.clip_grad_norm_))
        accelerator.clip_grad_value_ = unscaled_first(accelerator.clip_grad_value_)

    def backward(self, loss, batch, rows=None):
        """accelerator.backward(loss), with the micro-batch (and its data set rows) named."""
        self.batch, self.rows = batch, rows
        try:
            self._accelerator.backward(loss)
        finally:
            self.batch, self.rows = None, None

    def micro_batch_began(self):
        """A new micro-batch: the last boundary's skip is no longer the news."""
        self._wrapper._is_overflow = False
