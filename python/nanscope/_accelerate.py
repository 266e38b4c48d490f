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
        Trainer's, and the norm it logs) sees unscaled gradients."""
        guard = self._guard
        unscales_itself = accelerator.native_amp and accelerator.mixed_precision == "fp16"

        def unscaled_first(clip):
            def run(*args, **kwargs):
                if not unscales_itself and not guard._unscaled and guard._guard is not None:
                    guard.unscale_()
                return clip(*args, **kwargs)
            run.__wrapped__ = clip
            return run
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            setattr(accelerator, name, unscaled_first(getattr(accelerator, name)))

    def backward(self, loss, batch):
        """accelerator.backward(loss), with the micro-batch named."""
        self.batch = batch
        try:
            self._accelerator.backward(loss)
        finally:
            self.batch = None

    def micro_batch_began(self):
        """A new micro-batch: the last boundary's skip is no longer the news."""
        self._wrapper._is_overflow = False
