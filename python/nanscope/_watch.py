"""The watched form: the loop runs forward, loss, backward, its clipping and
its update; the guard is told where micro-batches end (scale / backward) and
decides at step(). Forward hooks on the model the loop calls mark where each
call begins and ends (the RNG state a re-run starts from; the first call of a
step also where the buffers a skip puts back were taken) and record its
arguments: the micro-batch, when the loop does not name it. A loop calls its
model for more than its loss (sample images, a logging or evaluation call, a
GAN's critic in the generator's phase): of the calls before a micro-batch's
loss, the core takes the one the loss's graph holds, decided on a failing
step only. Two Python calls per model call; nothing per op."""
import contextlib
import sys

import torch

from . import _batch
from . import _compiled
from . import _distributed
from . import _scopes
from . import _nanscope


def inner(model):
    """The module a re-run calls: without torch.compile (eager, every op seen)
    and without DistributedDataParallel (no collective on one rank's re-run)."""
    model = _scopes.uncompiled(model)
    return model.module if _distributed.is_ddp(model) else model


class Watch:
    """The watched form's hooks and calls, over the guard's C++ core (`core`,
    the _StepGuard binding) and what the guard told it when it was made:
    whether several ranks run (`several_ranks`, this one `rank`), whether
    DistributedDataParallel's own sync is held off (`holds_sync`), and how to
    check the optimizer a loop hands to step() (`check_optimizer`)."""

    def __init__(self, core, model, named, *, several_ranks, rank, holds_sync, check_optimizer):
        self._core = core  # None once the guard is closed
        self._several_ranks = several_ranks
        self._rank = rank
        self._check_optimizer = check_optimizer
        self._named = named
        self._busy = False  # inside the guard's own step or re-run: the hook stands aside
        self._watched = False  # the loop uses the watched form (or gave loss_fn): the hook marks micro-batches
        self._started = False  # a micro-batch's forward began since the last scale()
        self._calls = []  # the model's calls since the last scale(): their (args, kwargs), oldest first
        self._in_call = False  # the latest call was recorded and has not returned yet
        self._rank_failed = False  # several ranks: a forward raised here, and the guard stopped the run
        self._autocast = None
        self._model = model
        self._hook = None
        self._end_hook = None
        self._holds_sync = holds_sync  # DDP's sync held off: the guard averages
        self._listening = None  # the fp32 modules' scopes over the loop's forward
        self._paths = _scopes.module_paths(named)
        self._loss_fn = False  # the guard was given loss_fn: every micro-batch must be known
        self.others = {}  # label -> another model the step's re-runs ran (a GAN's critic)
        self.kept_buffers = {}  # those models' buffers before the step's first re-run

    def _watch_calls(self):
        """From the first use of the watched form (or loss_fn) on: a closure-form
        loop's model is never hooked."""
        self._watched = True
        if self._hook is not None:
            return
        recorder = _CallRecorder(self)
        # Several ranks: first, before a sharded model's all-gather, so that a
        # refused call joins no collective.
        first = {"prepend": True} if self._several_ranks else {}
        try:
            self._hook = self._model.register_forward_pre_hook(recorder, with_kwargs=True, **first)
        except TypeError:  # torch 1.x: pre-hooks see positional arguments only
            self._hook = self._model.register_forward_pre_hook(recorder)
        if self._several_ranks:
            try:  # several ranks: a forward that raises is seen (torch 2)
                self._end_hook = self._model.register_forward_hook(_CallEnd(self), always_call=True)
                return
            except TypeError:
                pass
        self._end_hook = self._model.register_forward_hook(_CallEnd(self))

    def close(self):
        """The watch is over: its hook removed, and the loop's model and the
        guard let go (a DistributedDataParallel model's reducer must not
        outlive the process group the loop destroys next)."""
        self._stop_listening()
        if self._hook is not None:
            self._hook.remove()
            self._end_hook.remove()
            self._hook = self._end_hook = None
        self._model = self._named = self._core = self._check_optimizer = None

    @contextlib.contextmanager
    def busy(self):
        was, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = was

    def _pre_hook(self, module, args, kwargs):
        if self._holds_sync:
            # The guard averages the gradients itself, once, after checking each
            # rank's own (as the closure form's no_sync() does): a loop that turns
            # DistributedDataParallel's sync on for its last micro-batch, as
            # nanoGPT does, is held off here, after its own setting.
            module.require_backward_grad_sync = False
        if self._busy or not self._watched or not torch.is_grad_enabled() or _scopes.rerunning():
            return None
        guard = self._core
        if guard is None:
            return None
        kwargs = kwargs if kwargs is not None else {}
        # One call into the core at each model call: it begins the micro-batch
        # and reads the call's version counters (None: the run is stopped).
        versions = guard.begin_model_call(args, kwargs)
        if versions is None:  # the loop's later calls (an evaluation) are its own business,
            if self._rank_failed:  # unless a rank failed: the ranks' collectives are out of step, say so
                guard.refuse_if_stopped()
            return None
        if not self._started:
            self._started = True
            self._stop_listening()
            if guard.module_regions:
                # Modules in fp32 (planned, or --fallback auto's remedy) or with a
                # kernel pinned: the loop's forward runs them so, through the
                # scopes the core listens for.
                self._listening = contextlib.ExitStack()
                self._listening.enter_context(_scopes.listening(self._paths))
        self._calls.append((args, kwargs, versions))
        self._in_call = True
        return None

    def _call_failed(self, error):
        """Several ranks: the loop's forward raised (this rank's own error, or a
        collective its peers left) while the guard watched the step. Its peers
        cannot go on without this rank: the guard stops the run with one line,
        and the error goes on to the loop."""
        self._in_call = False
        guard = self._core
        if guard is not None and not guard.stopped and not self._busy:
            self._rank_failed = True
            guard.stop_for_failed_rank(self._rank, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")

    def _call_ended(self):
        if self._in_call:
            self._in_call = False
            self._core.end_model_call()

    def rerun(self, loss_fn):
        """loss_fn as the core calls it on a micro-batch: on the model's
        unwrapped module, with module scopes while the core listens. A
        torch.compile'd model is called as it is: the listening re-run runs it
        eagerly, and the compiler check compiled."""
        self._watch_calls()
        self._loss_fn = True
        compiled = _compiled.program_of(self._model) is not None
        model = self._model if compiled else inner(self._named)
        paths = _scopes.module_paths(_scopes.uncompiled(model))

        def run(batch):
            with self.busy():
                return _scopes.call(loss_fn, paths, model, batch, others=self.others, kept=self.kept_buffers)
        return run

    def keep_others(self, result):
        """After a step: the other models its re-runs ran get their buffers
        back (a re-run is no step of theirs), and go into the failed step's
        snapshot as they were, so that nanscope.replay can run its loss again."""
        _scopes.put_back(self.kept_buffers)
        others, self.others = self.others, {}
        if not result.snapshot or not others:
            return
        tensors = [(f"{label}.{name}", t.detach()) for label, module in others.items()
                   for name, t in module.state_dict().items() if torch.is_tensor(t)]
        _nanscope.append_other_modules(result.snapshot, tensors)

    def autocast(self):
        self._watch_calls()
        if self._autocast is None:
            self._autocast = _Autocast(self)
        return self._autocast

    def scale(self, loss, batch, rows=None):
        if not torch.is_tensor(loss):
            raise TypeError(f"nanscope: scale() takes the loss as a tensor, got {loss!r}")
        self._watch_calls()
        calls, self._calls = self._calls, []
        earlier = []
        changed = False  # the loop changed the call's tensors in place since the call (a refilled buffer)
        if batch is None and calls and (calls[-1][0] or calls[-1][1]):
            args, kwargs, versions = calls[-1]
            batch = _batch.call_batch(args, kwargs)
            changed = self._loss_fn and _nanscope.tensor_versions(args, kwargs) != versions
            # Several calls before this loss: the one it used is decided if the step fails.
            earlier = [_candidate(call) for call in calls[:-1]] if self._loss_fn else []
        elif batch is None and self._loss_fn:
            self._open().refuse_if_stopped()  # a stopped run's hook stood aside: say why, not "no call seen"
            raise TypeError("nanscope: no call of the guard's model with its micro-batch was seen (torch 1.x hooks "
                            "see positional arguments only: a model(**batch) call is invisible there); name the "
                            "micro-batch: guard.scale(loss, batch) / guard.backward(loss, batch)")
        # else no micro-batch is known (no loss_fn): the step is checked and
        # skipped as a transaction, not re-run.
        self._started = False
        self._stop_listening()
        return self._open().scale(loss, batch, earlier, changed, rows)

    def _open(self):
        if self._core is None:
            raise ValueError("nanscope.StepGuard: the guard is closed")
        return self._core

    def cut_short(self):
        """(micro-batch, module) of a step the loop began and never handed the
        guard (its forward ran, no scale() or backward() came: a loop that
        exits on its own NaN check before its backward), or None. Forgets it."""
        if not (self._started and self._calls and self._loss_fn) or self._core is None:
            return None
        batch = _candidate(self._calls[-1])
        self._started, self._calls = False, []
        return None if batch == () else (batch, inner(self._named))

    several_ranks = property(lambda self: self._several_ranks)
    amp = property(lambda self: self._open().amp, doc="the precision the guard runs in now")

    def _stop_listening(self):
        if self._listening is not None:
            self._listening.close()
            self._listening = None

    def step(self, optimizer):
        self._check_optimizer(optimizer)
        guard = self._open()
        self._stop_listening()
        # busy() spelt out: this runs at every step, where a generator-made
        # context manager costs a small step measurably.
        was, self._busy = self._busy, True
        try:
            result = guard.step()
        finally:
            self._busy = was
            _scopes.close_lingering()
        if self.others or self.kept_buffers:  # a re-run ran another model (a GAN's critic)
            self.keep_others(result)
        self._started, self._calls = False, []
        return result

    def device_type(self):
        for p in self._named.parameters():
            return p.device.type
        return "cpu"


def _candidate(call):
    """An earlier call's micro-batch; () when it cannot be one (the core then keeps the latest)."""
    args, kwargs, _ = call
    return _batch.call_batch(args, kwargs) if not (args and kwargs) else ()


def _inert_hook(*_args):
    return None


class _CallRecorder:
    """The forward pre-hook of the guard's model. A copy or a pickle of the
    model (torch.save(model), copy.deepcopy for an EMA or a reference model)
    gets an inert hook in its place: the copy is no model the guard watches."""

    def __init__(self, watch):
        self._watch = watch

    def __call__(self, module, args, kwargs=None):
        return self._watch._pre_hook(module, args, kwargs)

    def __reduce__(self):
        return (_inert_factory, ())

    def __deepcopy__(self, memo):
        return _inert_factory()


def _inert_factory():
    return _inert_hook


class _CallEnd(_CallRecorder):
    """The forward hook: where the call's autograd nodes end."""

    def __call__(self, module, args, output):
        error = sys.exc_info()[1] if output is None else None  # always_call: the forward raised
        if error is not None and self._watch.several_ranks:
            self._watch._call_failed(error)
        else:
            self._watch._call_ended()


class _Autocast:
    """guard.autocast(): re-entrant and reusable, at the precision the guard runs in now.
    One torch.autocast per precision and nesting depth, made once: making one
    costs more than entering it (a quarter of a millisecond on CPU, per
    micro-batch), which is why loops keep theirs (nanoGPT's ctx)."""
    _DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

    def __init__(self, watch):
        self._watch = watch
        self._open = []
        self._made = {}  # (precision, depth) -> its context

    def __enter__(self):
        amp = self._watch.amp
        key = (amp, len(self._open))
        context = self._made.get(key)
        if context is None:
            context = (torch.autocast(self._watch.device_type(), dtype=self._DTYPES[amp]) if amp in self._DTYPES
                       else contextlib.nullcontext())
            self._made[key] = context
        context.__enter__()
        self._open.append(context)
        return self

    def __exit__(self, *exc):
        return self._open.pop().__exit__(*exc)
