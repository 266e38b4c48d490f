"""nanscope for PyTorch: your own training loop, optimizer and scheduler, with
nanscope's C++ step guard around each step, in one of two forms.

The watched form keeps your loop as written, as torch.amp.GradScaler does:

    guard = nanscope.StepGuard(model, optimizer, run_dir="runs/ft", amp="bf16",
                               loss_fn=lambda model, batch: model(*batch)[1])
    for X, Y in loader:
        for micro_step in range(accumulation):
            with guard.autocast():
                logits, loss = model(X, Y)
            guard.scale(loss / accumulation).backward()
        guard.unscale_()                               # before your own clipping, if any
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        result = guard.step()                          # optimizer.step(), or a skip
        guard.update()
        optimizer.zero_grad(set_to_none=True)

The closure form runs the step for you:

    result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))

Either way the guard does the one finiteness read per step, the skip (a
transaction: weights, optimizer state and buffers as before), the forensic
re-run that names where the first NaN/Inf was born (op, module, micro-batch,
row), snapshots, the fallback, early warnings and rollback, and writes
RUN_DIR/run.h5: the same C++ code and the same files as nanscope-train.
"""
import atexit
import functools
import weakref

from . import _accelerate
from . import _compiled
from . import _distributed
from . import _nanscope
from . import _options
from . import _ignite
from . import _logging
from . import _scopes
from . import _watch
from ._nanscope import DeadRunError
from ._nanscope import StepResult
from ._nanscope import _StepGuard
from ._nanscope import replay_report as _replay_report
from ._doom import DoomReport, find_dooming_step
from ._report import Birth, OpError, PrecisionTrail, ReplayReport, SnapshotInspection
from ._options import GuardConfig
from ._poisoned import LeaveOut, poisoned_samples
from ._trainer import TrainerGuard, guard_trainer

__all__ = ["StepGuard", "GuardConfig", "StepResult", "DeadRunError", "replay", "ReplayReport", "inspect_snapshot",
           "SnapshotInspection", "Birth", "find_dooming_step", "DoomReport", "GuardEvents", "guard_trainer", "TrainerGuard", "open_run",
           "LeaveOut", "poisoned_samples", "PrecisionTrail", "OpError"]

_logging.install()  # every line through the logging module (logger "nanscope")


def __getattr__(name):
    if name == "GuardEvents":  # Ignite's event type: imported only by a loop that asks for it
        return _ignite.guard_events()
    raise AttributeError(f"module 'nanscope' has no attribute {name!r}")

# Guards not closed yet. A loop rarely calls close(): each is closed (run.h5's
# buffered rows written, the file closed and unmarked) when it is collected,
# and at the interpreter's exit, which a normal end, an exception escaping the
# loop and Ctrl-C (KeyboardInterrupt) all reach.
_open_guards = weakref.WeakSet()


@atexit.register
def _close_open_guards():
    for guard in list(_open_guards):
        guard._step_cut_short()
        guard.close()


def open_run(path):
    """Opens a run file for reading with h5py (a run directory opens its
    run.h5), also after its writer was killed: a writer killed mid-run
    (SIGKILL, out of memory) leaves the file marked open for writing, which a
    plain h5py.File(path) refuses. The mark of a writer that is gone is cleared
    (as HDF5's h5clear -s does), so later plain readers open it too; a file a
    live writer holds is opened with SWMR, as nanscope's readers read it.
    Returns an h5py.File (a context manager); a missing or foreign file raises
    ValueError or OSError."""
    import os
    import h5py
    from ._nanscope import clear_mark_if_writer_gone
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "run.h5")
    if not os.path.exists(path):
        raise ValueError(f"nanscope.open_run: no run file at {path!r}")
    clear_mark_if_writer_gone(path)
    try:
        return h5py.File(path, "r")
    except OSError:
        return h5py.File(path, "r", swmr=True)  # its writer is still at work


def _module_of_tensors(model, optimizer):
    """A program that trains tensors of its own (W and b, optim.SGD([W, b]))
    has no module: given the tensors (a list or tuple) or None, the guard
    steers every tensor the optimizer steps, as an empty module's, each named
    by its place in the optimizer ('optimizer.GROUP.INDEX')."""
    import torch
    if model is not None and not isinstance(model, (list, tuple)):
        return model
    if optimizer is None:
        raise TypeError("nanscope.StepGuard: a loop that trains tensors of its own, with no torch.nn.Module, gives "
                        "the guard the optimizer over them: StepGuard([W, b], optimizer) or StepGuard(None, optimizer)")
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for i, t in enumerate(model or ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"nanscope.StepGuard: model must be a torch.nn.Module, or the tensors your optimizer "
                            f"trains; item {i} is {type(t).__name__}")
        if id(t) not in stepped:
            raise ValueError(f"nanscope.StepGuard: tensor {i} of the list is not one the optimizer steps: the guard "
                             "steers what the optimizer steps (build it over every tensor you train)")
    return torch.nn.Module()


class _IntegrationView:
    """What the integrations read of a StepGuard (StepGuard._integration)."""
    __slots__ = ("_of",)

    def __init__(self, guard):
        self._of = guard

    # The model as the loop gave it (a DDP or compiled wrapper included); None once closed.
    model = property(lambda self: self._of._model)
    # unscale_() came in the step in progress: the gradients are unscaled already.
    unscaled = property(lambda self: self._of._unscaled)
    # close() was called: the guard steps no more.
    closed = property(lambda self: self._of._guard is None)
    # The StepResult of the latest step (None before the first).
    last_result = property(lambda self: self._of._last_result)
    # The Accelerate installation (its micro-batch naming), or None.
    accelerated = property(lambda self: self._of._accelerated)


class StepGuard:
    """The guarded step around a loop of yours.

    model: the torch.nn.Module your loop calls (a DistributedDataParallel or a
    torch.compile'd one too), or for a program that trains tensors of its own
    the list of them (StepGuard([W, b], optimizer); births are named at the
    root, '', and the tensors 'optimizer.GROUP.INDEX'); optimizer: any
    torch.optim optimizer over its parameters, or None for a loop with its own
    update rule (watched form). Every tensor the optimizer steps is the
    guard's, the model's or not (an image it optimizes, a prompt, a
    temperature kept beside the model).
    run_dir: where run.h5 and snapshots/ go (created); amp: 'bf16', 'fp16'
    or 'off' (fp32), or the torch dtype (default: off, or the accelerator's
    precision); config: a nanscope.GuardConfig with the guard's other options
    (fallback, clip, rollback, doom_search, ...: nanscope-train's flags of the
    same names), as TrainingArguments holds a Trainer's. Keywords of Python's
    own: loss_fn (loss_fn(model, batch) -> the loss of one micro-batch: what
    re-runs a watched step for forensics, the earlier steps for doom_search,
    and nanscope.replay's loss); row_dim (the dimension of a batch's tensors
    that indexes samples: 1 for (seq, batch) data; or a dict naming the
    tensors that lie otherwise, {"hidden": 1} or {"[2]": 1}, each other
    tensor's found from the batch's size); model_name (what snapshots call
    the model; default: its class name); log=False silences the guard's lines.
    A keyword of GuardConfig's (or GradScaler's) given here is a TypeError
    that says where it goes. With GuardConfig(doom_search=True),
    StepResult.doomed_by names the earlier step whose update doomed a failing
    one (docs/recovery.md).

    The LR cuts of the fallback and of a rollback are applied to each update
    the guard makes and leave the LR in your optimizer's groups alone: a loop
    that sets param_group['lr'] by hand every iteration, or a scheduler, keeps
    them (guard.lr_multiplier; a loop with its own update rule multiplies its
    LR by it). Your scheduler needs nothing from the guard.

    accelerator=: a Hugging Face Accelerate loop (model and optimizer from
    accelerator.prepare): the guard takes the place of Accelerate's GradScaler,
    so accelerator.backward(loss), the prepared optimizer's step() and
    accelerator.clip_grad_norm_ run through it and the loop stays as written;
    amp is the accelerator's mixed_precision. For an Ignite Engine, see attach().

    Under torch.distributed (initialised by you; Gloo, or process_group=),
    every rank builds a guard: ranks agree on each skip, fallback, rollback and
    stop, each writes run-rank-R.h5, and only a rank whose own step went
    non-finite writes a snapshot (closure form). The guard averages the
    gradients in one all-reduce per step; a DistributedDataParallel model keeps
    its own sync, overlapped with the backward, through a communication hook
    the guard registers, which checks each rank's gradients before they mix
    (a model with a hook of its own keeps it, and its sync is held off with
    no_sync() while the guard averages). A plain model starts from rank 0's
    weights. A DistributedDataParallel model with buffers needs
    broadcast_buffers=False.
    A sharded model (FSDP2's fully_shard, FSDP1 with use_orig_params=True) is
    given as it is: the guard checks each rank's shards, sums the flags and
    shard norms in its one collective (norms of the whole gradients), and on a
    non-finite step every rank re-runs in lockstep; the rank that made the
    birth names it and writes the snapshot, with the whole parameters
    (docs/python.md, "Sharded models").
    """

    def __init__(self, model, optimizer=None, *, run_dir=_options.DEFAULT_RUN_DIR, amp=None, config=None, loss_fn=None,
                 row_dim=0, model_name="", log=True, process_group=None, accelerator=None, **misplaced):
        _options.refuse_misplaced(misplaced, own=_options.keywords_of(StepGuard.__init__))
        model = _module_of_tensors(model, optimizer)
        prepared = optimizer
        if accelerator is not None:
            amp = _accelerate.precision(accelerator) if amp is None else amp
            optimizer = _accelerate.unwrapped(optimizer)
        options = _options.guard_options(config, run_dir, amp)
        ranks, rank, world_size = _distributed.averager(model, process_group)
        self._averages = ranks is not None
        self._ranks = ranks
        self._rank = rank
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"nanscope.StepGuard: loss_fn must be a function loss_fn(model, batch), got {loss_fn!r}")
        # A torch.compile'd or DistributedDataParallel model is named as the
        # user wrote it ('mid', not '_orig_mod.mid' or 'module.mid', as a
        # sharded model's are): the guard sees the module inside, the loop calls
        # the wrapper, and both hold the same parameters.
        named = _watch.inner(model)
        if not isinstance(row_dim, dict):
            row_dim = int(row_dim)
        own = dict(model_name=model_name, log=bool(log), row_dim=row_dim)
        self._guard = _StepGuard(named, optimizer, options, own, ranks, rank, world_size,
                                 _compiled.program_of(model))
        if ranks is not None:
            ranks.send_flags_of(self._guard)  # in DistributedDataParallel's last bucket
        # A DistributedDataParallel model: its sync is held off in re-runs, which are one rank's alone, and
        # in every call where the guard averages the gradients itself (the model has a hook of its own).
        self._ddp = model if _distributed.is_ddp(model) else None
        self._ddp_held = self._ddp is not None and not (ranks is not None and ranks.reduces_in_backward)
        # Only a plain model under torch.distributed can be the inside of a
        # DistributedDataParallel; the check is a global hook that Dynamo must
        # not trace, so a compiled model goes without it.
        self._wrapper_unchecked = (not _distributed.is_ddp(model) and _distributed.initialized()
                                   and named is model)
        self._model = model
        self._optimizer = optimizer
        self._prepared_optimizer = prepared  # what the loop calls: Accelerate's wrapper, or the optimizer itself
        self._last_result = None  # the StepResult of the latest step
        self._skipped = 0  # steps skipped so far (skipped_steps)
        self._fallbacks = 0  # remedies beyond the skip taken so far (fallbacks)
        self._last_birth = ""  # the first birth of the latest skipped step
        self._unscaled = False  # unscale_() came in the step in progress
        self._paths = _scopes.module_paths(named)
        self._watch = _watch.Watch(self._guard, model, named, several_ranks=self._averages, rank=rank,
                                   holds_sync=self._ddp_held, check_optimizer=self._check_optimizer)
        self._loss_fn = loss_fn  # also for a step the loop cut short (_step_cut_short)
        if loss_fn is not None:
            self._guard.set_loss_fn(self._watch.rerun(loss_fn))
        self._accelerated = None
        if accelerator is not None:
            _accelerate.check_precision(accelerator, self.amp)
            self._accelerated = _accelerate.Installed(self, accelerator, prepared)
        _open_guards.add(self)

    # --- The watched form: GradScaler's calls.

    def step(self, optimizer=None, *args, **kwargs):
        """Ends the step your loop ran, as GradScaler.step(optimizer): the one
        host read, then the guard's optimizer steps (with the guard's LR cuts),
        or the step is skipped. The guard already holds its optimizer, so
        step() needs none; step(optimizer) is GradScaler's spelling and must
        name the same one. Returns a StepResult.

        As GradScaler's, further arguments would go to optimizer.step(): only
        None is taken (Accelerate passes closure=None); an optimizer closure is
        refused, as GradScaler refuses it."""
        if optimizer is not None or args or kwargs:  # guard.step() itself needs no check
            _check_step_arguments(optimizer, args, kwargs)
        self._open()
        self._unscaled = False
        return self._ended(self._watch.step(optimizer))

    def autocast(self):
        """A reusable context manager: autocast at the guard's precision for one
        micro-batch's forward and loss (nothing at fp32, and fp32 after a
        fallback), so the guard can change precision under your loop."""
        self._open().refuse_if_stopped()
        return self._watch.autocast()

    def scale(self, loss, batch=None, *, rows=None):
        """loss x the fp16 loss scale (loss itself otherwise), for your own
        .backward(), as GradScaler.scale(). Registers the micro-batch: `batch` as
        given, or else the arguments of the model's latest call (a tuple of its
        positional arguments, or the dict of its keyword arguments). `rows`:
        the micro-batch's rows in the data set (the indices its sampler drew),
        so a step whose verdict is `data` names its samples' data set rows and
        lists them in the run's poison list (nanscope.LeaveOut)."""
        self._open()
        if self._accelerated is not None:
            named, self._accelerated.batch = self._accelerated.batch, None  # named for this micro-batch only
            named_rows, self._accelerated.rows = self._accelerated.rows, None
            batch = named if batch is None else batch
            rows = named_rows if rows is None else rows
            self._accelerated.micro_batch_began()
        return self._watch.scale(loss, batch, _rows_tensor(rows))

    def backward(self, loss, batch=None, *, rows=None):
        """guard.scale(loss, batch, rows=rows).backward(); with accelerator=,
        accelerator.backward(loss) with the micro-batch named."""
        if self._accelerated is not None:
            self._open()
            self._accelerated.backward(loss, batch, rows)
        else:
            self.scale(loss, batch, rows=rows).backward()

    def unscale_(self, optimizer=None):
        """Divides the gradients by the loss scale now, before your own clipping,
        as GradScaler.unscale_(); the step's grad norm is taken here. Returns
        that norm, a 0-dim tensor (no host read) taken as
        torch.nn.utils.get_total_norm takes it, so a clip need not take it
        again: torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        then does what clip_grad_norm_ would, bit for bit (where the
        gradients are all the guard's parameters' and the norm is the 2-norm)."""
        self._check_optimizer(optimizer)
        norm = self._open().unscale()
        self._unscaled = True
        return norm

    def update(self, new_scale=None):
        """GradScaler's update(): the guard updated the scale in step(). After a
        skipped step whose update your own loop applied anyway (no optimizer),
        puts the weights back as they were before it."""
        if new_scale is not None:
            raise ValueError("nanscope.StepGuard.update: the guard keeps its own loss scale (no new_scale)")
        self._open().undo_loops_update()

    def get_scale(self):
        """The fp16 loss scale (1.0 when there is none), as GradScaler.get_scale()."""
        return self._open().loss_scale

    def is_enabled(self):
        """Whether losses are scaled (fp16 with its loss scaler on), as
        GradScaler.is_enabled(); False at bf16, at fp32 and after the fallback."""
        return self._open().scaling

    # --- The closure form: a helper over the guarded step.

    def closure_step(self, closure, batch, step=None, *, rows=None):
        """Runs one whole guarded step: closure() returns the loss of `batch` (a
        tensor, (inputs, targets), or a dict, tuple or list of tensors); the
        guard runs its backward and the update, checks it, and on a non-finite
        step skips it and snapshots and replays `batch`. Steps are numbered
        from 0 unless given. `rows`: the batch's rows in the data set, as in
        scale(). Returns a StepResult."""
        guard = self._open()
        if not callable(closure) or _is_optimizer(closure):
            raise TypeError(f"nanscope: closure must be a function returning the loss, got {closure!r}")
        if batch is None:
            raise TypeError("nanscope: the closure form needs the step's batch: guard.closure_step(closure, batch)")

        live = [True]  # the core's first call of the closure is the step itself; later ones re-run it

        def closure_call():
            run = functools.partial(_scopes.call, others=self._watch.others, kept=self._watch.kept_buffers, rerun=False)
            held = self._ddp if self._ddp_held or not live[0] else None
            live[0] = False
            return _distributed.call(held, run, closure, self._paths)
        if self._wrapper_unchecked:  # the first step only: no cost after it
            self._wrapper_unchecked = False
            closure_call = _distributed.refusing_a_wrapper_of(self._model, closure_call)
        try:
            with self._watch.busy():
                result = guard.closure_step(closure_call, batch, step, _rows_tensor(rows))
        finally:
            _scopes.close_lingering()
        self._watch.keep_others(result)
        return self._ended(result)

    def _ended(self, result):
        self._last_result = result
        if not result.counted:
            self._skipped += 1  # the fp16 scaler's routine backoffs too: their update never applied either
            if result.first_birth or result.error:
                self._last_birth = result.first_birth or result.error
        if result.fell_back or result.remedy in ("fp32-modules", "whole"):
            self._fallbacks += 1
        return result

    skipped_steps = property(lambda self: self._skipped, doc="steps skipped so far (their update never applied)")
    fallbacks = property(lambda self: self._fallbacks,
                         doc="fallbacks taken so far: modules put in fp32, or the whole model")
    last_first_birth = property(lambda self: self._last_birth,
                                doc="the first birth of the latest skipped step ('' before any skip)")

    def attach(self, engine):
        """Fits the guard to a PyTorch-Ignite Engine whose update function uses
        the watched form (guard.backward(loss, batch), guard.step(optimizer)):
        each update runs under guard.autocast(); engine.state.step_result is the
        iteration's StepResult (None when it made no update: accumulation); on
        a skipped iteration the trainer's metrics and TerminateOnNan leave it out
        (their NaN is the guard's business now) and GuardEvents.STEP_SKIPPED
        fires; the step that stops the run terminates the engine."""
        self._open()
        _ignite.attach(self, engine)

    def _check_optimizer(self, optimizer):
        if optimizer is not None and optimizer is not self._optimizer and optimizer is not self._prepared_optimizer:
            raise ValueError("nanscope.StepGuard: this guard steps the optimizer it was built with; got another one "
                             "(use one guard per model and optimizer)")

    lr_multiplier = property(lambda self: self._guard.lr_multiplier,
                             doc="the guard's LR cuts (fallback, rollbacks): 1.0 until one happens")

    def state_dict(self):
        """What the guard has learnt that a resumed run needs besides the model's
        and the optimizer's state dicts, as torch.amp.GradScaler keeps its scale:
        the precision (and whether the fp32 fallback fired), the fp16 loss scale
        and its growth tracker, the LR cuts of the fallback and rollbacks, the
        modules in fp32, the updates applied, the next step's number and the
        early warnings' baselines, and the counts a loop logs (skipped_steps,
        fallbacks, last_first_birth). Save it beside model.state_dict() and
        optimizer.state_dict(); the rollback ring is not in it (it starts afresh)."""
        state = dict(self._open().state_dict())
        state.update(skipped_steps=self._skipped, fallbacks=self._fallbacks, last_first_birth=self._last_birth)
        return state

    def load_state_dict(self, state):
        """Puts back a state_dict() after the model and the optimizer got theirs:
        a fallback that had fired fires again (the model to fp32), step
        numbers go on where they were, and so do the counts (a resumed run logs
        the skips of the whole run, as the uninterrupted one does)."""
        state = dict(state)
        # A state_dict from before the counts were kept leaves them as they are.
        self._skipped = int(state.pop("skipped_steps", self._skipped))
        self._fallbacks = int(state.pop("fallbacks", self._fallbacks))
        self._last_birth = str(state.pop("last_first_birth", self._last_birth))
        self._open().load_state_dict(state)

    def _step_cut_short(self):
        """At the interpreter's exit: a loop that stopped on its own NaN check
        between a forward and its backward (torchvision's detection reference:
        `if not math.isfinite(loss_value): sys.exit(1)`) left a step the guard
        never saw. With loss_fn, its micro-batch (the model's last call) is
        checked once more, its buffers put back after; a non-finite loss is run
        as a guarded step, skipped, so that step still gets its birth, snapshot
        and run.h5 row. A finite one is left alone: no update is made at exit."""
        import torch
        cut = self._watch.cut_short() if getattr(self, "_guard", None) is not None else None
        if cut is None or self._loss_fn is None:
            return
        (batch, model), loss_fn = cut, self._loss_fn
        kept = {}
        _scopes.keep_buffers(model, kept)
        try:
            with torch.no_grad(), self.autocast():
                finite = bool(torch.isfinite(loss_fn(model, batch)).all())
        except Exception:  # the loop's own exit stands; nothing more to learn here
            return
        finally:
            _scopes.put_back(kept)
        if finite:
            return
        try:
            self.closure_step(lambda: loss_fn(model, batch), batch=batch)
        except Exception:  # the loop's own exit stands
            pass

    def close(self):
        """Writes what run.h5 buffers and closes it; the guard steps no more.
        Called by `with nanscope.StepGuard(...) as guard:` on the way out, when
        the guard is collected, and at the interpreter's exit: a loop need not
        call it."""
        guard = getattr(self, "_guard", None)
        if guard is not None:
            self._guard = None
            _open_guards.discard(self)
            self._watch.close()
            # The model, a DistributedDataParallel wrapper and the optimizer are the loop's: no reference kept.
            self._model = self._ddp = self._optimizer = self._prepared_optimizer = self._accelerated = None
            if self._ranks is not None:
                self._ranks.close()
            guard.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at the interpreter's exit torch may be half gone; atexit has closed the file by then
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _open(self):
        if self._guard is None:
            raise ValueError("nanscope.StepGuard: the guard is closed")
        return self._guard

    def _integration(self):
        """The one door through which nanscope's loop-library integrations
        (the Trainer, Accelerate, Ignite) read the guard's state: a view, read
        when asked, so the guard's own fields can change behind it."""
        return _IntegrationView(self)

    run_file = property(lambda self: self._guard.run_file, doc="RUN_DIR/run.h5")
    amp = property(lambda self: self._guard.amp, doc="the precision steps run in now")
    snapshots = property(lambda self: self._guard.snapshots, doc="the snapshots written so far")
    fp32_modules = property(lambda self: self._guard.fp32_modules)
    applied_steps = property(lambda self: self._guard.applied_steps, doc="updates that reached the weights")
    next_step = property(lambda self: self._guard.next_step, doc="the number the next step gets (from 0)")

    def health(self):
        """The tensors of the training state that are sick: a NaN anywhere, or
        an infinity in a parameter or the optimizer's state (a buffer may keep
        infinities on purpose, as an additive -inf attention mask does), as
        "parameter NAME" / "buffer NAME" / "optimizer state NAME"; [] when
        healthy. Slow (one reduction per tensor): not for every step."""
        return self._guard.health()

    def flush(self):
        """Writes run.h5's buffered rows to disk (they are written every 64 rows or 2 seconds, and at the end)."""
        self._guard.flush()


def _other_models(others):
    """others={label: module} as the core takes them: (label, parameters,
    buffers), the buffers as state_dict() holds them (a snapshot keeps those).
    The core loads the snapshot's weights into them, or refuses a snapshot
    whose loss ran a model not given, naming it."""
    import torch
    out = []
    for label, module in dict(others or {}).items():
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"nanscope.replay: others['{label}'] must be a torch.nn.Module, got {module!r}")
        parameters = list(module.named_parameters())
        named = {id(p) for _, p in parameters}
        buffers = [(n, t) for n, t in module.state_dict(keep_vars=True).items()
                   if torch.is_tensor(t) and id(t) not in named]
        out.append((str(label), [(n, p) for n, p in parameters], buffers))
    return out


def _rows_tensor(rows):
    """A micro-batch's data set rows as the guard takes them: a 1-D int64 CPU tensor (None: not given)."""
    if rows is None:
        return None
    import torch
    try:
        tensor = torch.as_tensor(rows).detach().to("cpu").reshape(-1)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"nanscope: rows= takes the batch's data set rows (a tensor or a list of ints), got {rows!r}") from e
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"nanscope: rows= takes integer data set rows, got a {tensor.dtype} tensor")
    return tensor.to(torch.int64)


def _check_step_arguments(optimizer, args, kwargs):
    if "batch" in kwargs or (callable(optimizer) and not _is_optimizer(optimizer)):
        raise TypeError("nanscope.StepGuard.step() ends a step your loop ran (guard.step(), as "
                        "GradScaler.step(optimizer)); a closure with its batch is "
                        "guard.closure_step(closure, batch)")
    if any(a is not None for a in args) or any(v is not None for v in kwargs.values()):
        raise TypeError("nanscope.StepGuard.step(optimizer) takes no arguments for optimizer.step() (an optimizer "
                        "closure, as with GradScaler); a closure with its batch is "
                        "guard.closure_step(closure, batch)")
    if optimizer is not None and not _is_optimizer(optimizer):
        raise TypeError(f"nanscope.StepGuard.step: expected the guard's optimizer or nothing, got {optimizer!r}")


def _is_optimizer(obj):
    import torch
    return isinstance(obj, torch.optim.Optimizer)


def replay(snapshot, model, loss, *, others=None, write=True, repeats=3, bisect=True, **gone):
    """Replays a snapshot written from Python with nanscope-replay's engine and
    returns a ReplayReport (verdict, category, suggestion, the births, the
    rows without which the step is finite, the fp32 modules found; print()
    gives nanscope-replay's report, to_dict() its JSON).

    model() builds the model (any weights: the snapshot's are loaded), and
    loss(model, batch) returns the loss of `batch` as it was given to
    guard.step. write=False leaves the snapshot as it is (else the result is
    appended to it, for nanscope-view and nanscope-report). A missing, corrupt or
    foreign snapshot, or one whose model the factory cannot hold, raises
    ValueError; a replay that failed RuntimeError; an exception model() raises
    comes back as itself.

    others: the other models your loss runs besides the guarded one (a GAN's
    critic in the generator's loss), by the name the snapshot gives them (its
    class: others={"Discriminator": netD}); their weights at the failed step
    are in the snapshot and are loaded into them first. A snapshot whose loss
    ran another model must be given it (ValueError otherwise).

    A batch's objects that are neither tensors nor JSON values were pickled
    into the snapshot and are unpickled here, which runs code the file chose:
    replay only snapshots from a source you trust (inspect_snapshot shows
    what one holds without loading it)."""
    import torch
    for keyword in gone:
        if keyword in ("print_report", "json"):
            raise TypeError(f"nanscope.replay: {keyword}= is gone: print(report) prints nanscope-replay's report, "
                            "print(report.to_json()) its JSON")
        raise TypeError(f"nanscope.replay() got an unexpected keyword argument {keyword!r}")
    other_models = _other_models(others)
    if not callable(model) or isinstance(model, torch.nn.Module):
        raise TypeError("nanscope.replay: model must be a function that builds the model (a class or a factory), "
                        f"got {model!r}")
    if not callable(loss):
        raise TypeError(f"nanscope.replay: loss must be a function loss(model, batch), got {loss!r}")
    if int(repeats) < 1:
        raise ValueError(f"nanscope.replay: repeats must be 1 or more, not {repeats}")

    def scoped_loss(m, batch):
        return _scopes.call(loss, _scopes.module_paths(_scopes.uncompiled(m)), m, batch)

    try:
        json_text, text = _replay_report(str(snapshot), model, scoped_loss, int(repeats), bool(bisect), bool(write),
                                         other_models)
    finally:
        _scopes.close_lingering()
    return ReplayReport(json_text, text)


def inspect_snapshot(snapshot):
    """What `snapshot` holds and what replaying it would run, without running
    or loading any of it: a SnapshotInspection (print() gives nanscope-replay
    --inspect's text, to_dict() its JSON). A snapshot is code when its batch
    holds pickled Python objects (replay unpickles them) or its model is a
    TorchScript program: replay only snapshots from a source you trust. A
    missing, corrupt or foreign file raises ValueError."""
    return SnapshotInspection(*_nanscope.inspect_snapshot(str(snapshot)))
