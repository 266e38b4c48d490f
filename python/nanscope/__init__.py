"""nanscope for PyTorch: your own training loop, optimizer and scheduler, with
nanscope's C++ step guard around each step.

    guard = nanscope.StepGuard(model, optimizer, run_dir="runs/ft", amp="bf16", clip=1.0)
    for x, y in loader:
        result = guard.step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        if result.stop:
            break

The closure runs your forward and loss; the guard does autocast, loss scaling
(fp16), backward, unscale, clipping, the one finiteness read per step, the
skip (a transaction: weights, optimizer state and buffers as before), the
forensic re-run that names where the first NaN/Inf was born, snapshots, the
fallback, early warnings and rollback, and writes RUN_DIR/run.h5: the same C++
code and the same files as nanscope-train. Don't call backward(), step() or
zero_grad() yourself for a guarded step.
"""
import sys

from . import _distributed
from . import _scopes
from ._nanscope import StepResult
from ._nanscope import _StepGuard
from ._nanscope import replay_report as _replay_report
from ._report import Birth, ReplayReport

__all__ = ["StepGuard", "StepResult", "replay", "ReplayReport", "Birth"]


class StepGuard:
    """The guarded step around a loop of yours.

    model: a torch.nn.Module (a DistributedDataParallel's .module works too);
    optimizer: any torch.optim optimizer over its parameters; scheduler: an LR
    scheduler of yours, whose base LRs follow the guard's LR cuts (fallback,
    rollback) so its next step() keeps them. amp: 'fp32', 'bf16' or 'fp16';
    clip: the global grad-norm clip after unscaling (0: none); fallback:
    'whole' (the stock one-shot switch to fp32 with the LR x lr_backoff),
    'auto' (the remedy the step's diagnosis supports) or 'off'; fp32_modules:
    module paths that run with autocast off from the start. log=False silences
    the guard's lines on stderr.

    Under torch.distributed (initialised by you; Gloo, or process_group=),
    every rank builds a guard: ranks agree on each skip, fallback, rollback and
    stop, each writes run-rank-R.h5, and only a rank whose own step went
    non-finite writes a snapshot. The guard averages the gradients in one
    all-reduce per step (a DistributedDataParallel model's own sync is held off
    with no_sync(), so each rank's gradients are checked before they mix); a
    plain model starts from rank 0's weights. A DistributedDataParallel model
    with buffers needs broadcast_buffers=False (its forward would otherwise wait
    for the other ranks during one rank's forensic re-run).
    """

    def __init__(self, model, optimizer, *, run_dir="nanscope-run", amp="fp32", clip=0.0, fallback="auto",
                 lr_backoff=0.5, fp32_modules=(), probe=True, warn=True, rollback=True, max_snapshots=3,
                 act_absmax_every=0, model_name="", scheduler=None, log=True, process_group=None):
        average, rank, world_size = _distributed.averager(model, process_group)
        amp = _amp_name(amp)
        # A torch.compile'd model is named as the user wrote it ('mid', not
        # '_orig_mod.mid'): the guard sees the module inside, the loop calls the
        # compiled one, and both hold the same parameters.
        named = _scopes.uncompiled(model)
        self._guard = _StepGuard(named, optimizer, str(run_dir), amp, float(clip), fallback, float(lr_backoff),
                                 list(fp32_modules), bool(probe), bool(warn), bool(rollback), int(max_snapshots),
                                 int(act_absmax_every), model_name, bool(log), average, rank, world_size)
        self._ddp = model if _distributed.is_ddp(model) else None
        # Only a plain model under torch.distributed can be the inside of a
        # DistributedDataParallel; the check is a global hook that Dynamo must
        # not trace, so a compiled model goes without it.
        self._wrapper_unchecked = self._ddp is None and _distributed.initialized() and named is model
        self._model = model
        self._paths = _scopes.module_paths(named)
        self._scheduler = scheduler
        self._lr_multiplier = 1.0

    def step(self, closure, batch, step=None):
        """One guarded step: closure() returns the loss of `batch` (a tensor, or
        (inputs, targets)), which the guard checks, snapshots and replays.
        Steps are numbered from 0 unless given. Returns a StepResult."""
        if self._guard is None:
            raise ValueError("nanscope.StepGuard: the guard is closed")
        if not callable(closure):
            raise TypeError(f"nanscope: closure must be callable, got {closure!r}")
        def closure_call():
            return _distributed.call(self._ddp, _scopes.call, closure, self._paths)
        if self._wrapper_unchecked:  # the first step only: no cost after it
            self._wrapper_unchecked = False
            closure_call = _distributed.refusing_a_wrapper_of(self._model, closure_call)
        result = self._guard.step(closure_call, batch, step)
        self._follow_lr_cuts()
        return result

    def _follow_lr_cuts(self):
        multiplier = self._guard.lr_multiplier
        if self._scheduler is not None and multiplier != self._lr_multiplier:
            factor = multiplier / self._lr_multiplier
            # Schedulers that derive the LR from base_lrs (LambdaLR, StepLR,
            # CosineAnnealingLR, ...); OneCycleLR and others set it from
            # their own bounds, and the cut lasts until their next step().
            if hasattr(self._scheduler, "base_lrs"):
                self._scheduler.base_lrs = [lr * factor for lr in self._scheduler.base_lrs]
        self._lr_multiplier = multiplier

    def state_dict(self):
        """What the guard has learnt that a resumed run needs besides the model's
        and the optimizer's state dicts, as torch.amp.GradScaler keeps its scale:
        the precision (and whether the fp32 fallback fired), the fp16 loss scale
        and its growth tracker, the LR cuts of the fallback and rollbacks, the
        modules in fp32, the updates applied, the next step's number and the
        early warnings' baselines. Save it beside model.state_dict() and
        optimizer.state_dict(); the rollback ring is not in it (it starts afresh)."""
        return dict(self._open().state_dict())

    def load_state_dict(self, state):
        """Puts back a state_dict() after the model and the optimizer got theirs:
        a fallback that had fired fires again (the model to fp32), and step
        numbers go on where they were."""
        self._open().load_state_dict(dict(state))
        # The scheduler's own state_dict holds its base LRs with the cuts in them.
        self._lr_multiplier = self._guard.lr_multiplier

    def close(self):
        """Writes what run.h5 buffers and closes it; the guard steps no more.
        Called by `with nanscope.StepGuard(...) as guard:` on the way out."""
        if self._guard is not None:
            self._guard.flush()
            self._guard = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _open(self):
        if self._guard is None:
            raise ValueError("nanscope.StepGuard: the guard is closed")
        return self._guard

    run_file = property(lambda self: self._guard.run_file, doc="RUN_DIR/run.h5")
    amp = property(lambda self: self._guard.amp, doc="the precision steps run in now")
    snapshots = property(lambda self: self._guard.snapshots, doc="the snapshots written so far")
    fp32_modules = property(lambda self: self._guard.fp32_modules)
    applied_steps = property(lambda self: self._guard.applied_steps, doc="updates that reached the weights")

    def health(self):
        """The tensors of the training state that are sick: a NaN anywhere, or
        an infinity in a parameter or the optimizer's state (a buffer may keep
        infinities on purpose, as an additive -inf attention mask does), as
        "parameter NAME" / "buffer NAME" / "optimizer state NAME"; [] when
        healthy. Slow (one reduction per tensor): not for every step."""
        return self._guard.health()

    def flush(self):
        """Writes run.h5's buffered rows to disk (they are written every 16 rows and at the end)."""
        self._guard.flush()


def _amp_name(amp):
    """'bf16', 'fp16', 'fp32' ('off'), or the torch dtype: torch.bfloat16, torch.float16, torch.float32."""
    import torch
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", "off": "fp32"}
    if isinstance(amp, str):
        return names.get(amp, amp)
    if amp in names:
        return names[amp]
    raise ValueError(f"nanscope: amp must be 'fp32', 'bf16', 'fp16' or torch.bfloat16, torch.float16, "
                     f"torch.float32, not {amp!r}")


def replay(snapshot, model, loss, *, write=True, repeats=3, bisect=True, print_report=False, json=False):
    """Replays a snapshot written from Python with nanscope-replay's engine and
    returns a ReplayReport (verdict, category, suggestion, the births, the
    rows without which the step is finite, the fp32 modules found; print()
    gives nanscope-replay's report, to_dict() its JSON).

    model() builds the model (any weights: the snapshot's are loaded), and
    loss(model, batch) returns the loss of `batch` as it was given to
    guard.step. write=False leaves the snapshot as it is (else the result is
    appended to it, for nanscope-view and nanscope-report); print_report=True
    also prints the report (as JSON with json=True). A missing, corrupt or
    foreign snapshot, or one whose model the factory cannot hold, raises
    ValueError; a replay that failed RuntimeError; an exception model() raises
    comes back as itself."""
    import torch
    if not callable(model) or isinstance(model, torch.nn.Module):
        raise TypeError("nanscope.replay: model must be a function that builds the model (a class or a factory), "
                        f"got {model!r}")
    if not callable(loss):
        raise TypeError(f"nanscope.replay: loss must be a function loss(model, batch), got {loss!r}")
    if int(repeats) < 1:
        raise ValueError(f"nanscope.replay: repeats must be 1 or more, not {repeats}")

    def scoped_loss(m, batch):
        return _scopes.call(loss, _scopes.module_paths(_scopes.uncompiled(m)), m, batch)

    json_text, text = _replay_report(str(snapshot), model, scoped_loss, int(repeats), bool(bisect), bool(write))
    report = ReplayReport(json_text, text)
    if print_report:
        print(report.to_json() if json else report, end="" if not json else "\n")
    return report
