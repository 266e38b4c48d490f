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
    """The guard's amp: the accelerator's mixed precision, which its prepared
    model's forward already runs under."""
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
        self.batch = None  # the micro-batch guard.backward(loss, batch) names for Accelerate's scale() call
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
