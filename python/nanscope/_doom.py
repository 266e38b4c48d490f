"""nanscope.find_dooming_step: after a run, the earlier step whose update
doomed its failing step, replayed from one of your own checkpoints.

The run file says which steps were applied, the LR of each update, its
precision and loss scale; batches(step) gives each step's batch as the guard
was given it; the checkpoint gives the state the replays start from. The
search is the one the guard runs live with doom_search=True (a bisection over
updates left out, then over the dooming step's rows)."""
import json
import os
import time

from . import _logging
from . import _scopes
from ._nanscope import _search_doom


class DoomReport:
    """What find_dooming_step found. outcome: 'dooming_step' (step, and rows
    when some batch rows alone did it; [] is the step's whole update, an LR
    spike), 'no_earlier_step' (the failing step fails with every update since
    the checkpoint left out), 'several_steps' (only first..last together) or
    'budget_spent' (first..last still suspected). The fields are read from the
    one JSON the C++ search writes, so the object, to_dict() and to_json()
    never disagree; str() is the sentence."""

    _FIELDS = ("outcome", "failing_step", "step", "rows", "first", "last", "replays", "steps_run", "text")

    def __init__(self, json_text, seconds):
        fields = json.loads(json_text)
        for name in self._FIELDS:
            setattr(self, name, fields[name])
        self.seconds = seconds

    def to_dict(self):
        return {name: getattr(self, name) for name in self._FIELDS + ("seconds",)}

    def to_json(self):
        return json.dumps(self.to_dict())

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"DoomReport({self.text!r})"


def _run_file(run):
    path = os.fspath(run)
    return os.path.join(path, "run.h5") if os.path.isdir(path) else path


def find_dooming_step(run, model, optimizer, loss, batches, *, checkpoint, start_step, failing_step=None,
                      clip=None, spike_ratio=10.0, budget=5000, row_dim=0, progress=True):
    """Finds the step whose update doomed `run`'s failing step.

    run: the guard's run directory (or its run.h5). model(): builds the model
    and optimizer(model): its optimizer, as for training (eager; any weights).
    checkpoint: a dict (or a path torch.load reads) with the 'model' and
    'optimizer' state_dicts saved before step `start_step`, and the CPU RNG
    state as 'rng_state' (torch.get_rng_state()) when the model draws random
    numbers. loss(model, batch) -> the loss; batches(step) -> that step's
    batch, as the guard was given it (one batch per step). failing_step:
    default the run's first non-finite step. clip: the max gradient norm each
    replayed step clips to; default the guard's GuardConfig clip as run.h5 recorded it
    (give it when your loop clipped by itself, in the watched form). budget: steps replayed in all. progress: a line
    per replay on stderr (or a function given each line).

    Returns a DoomReport. A bad run file or checkpoint step raises ValueError;
    a failing step that does not fail again when replayed RuntimeError."""
    import torch
    if not callable(model) or isinstance(model, torch.nn.Module):
        raise TypeError(f"nanscope.find_dooming_step: model must be a function that builds the model, got {model!r}")
    if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("nanscope.find_dooming_step: optimizer must be a function of the model that builds its "
                        f"optimizer, got {optimizer!r}")
    if not callable(loss) or not callable(batches):
        raise TypeError("nanscope.find_dooming_step: loss(model, batch) and batches(step) must be functions")
    if int(budget) < 1:
        raise ValueError(f"nanscope.find_dooming_step: budget must be 1 or more, not {budget}")
    if not isinstance(checkpoint, dict):
        checkpoint = torch.load(checkpoint, map_location="cpu")
    missing = [k for k in ("model", "optimizer") if k not in checkpoint]
    if missing:
        raise ValueError(f"nanscope.find_dooming_step: the checkpoint has no {' or '.join(repr(k) for k in missing)} "
                         f"(it holds {sorted(checkpoint)})")
    module = model()
    module.load_state_dict(checkpoint["model"])
    module.train()
    opt = optimizer(module)
    opt.load_state_dict(checkpoint["optimizer"])
    if checkpoint.get("rng_state") is not None:
        torch.set_rng_state(checkpoint["rng_state"])
    if progress is True:
        def progress(line):
            _logging.logger.info("nanscope: doom search: %s", line)
    start = time.monotonic()
    try:
        found = _search_doom(_run_file(run), module, opt, loss, batches, int(start_step),
                              -1 if failing_step is None else int(failing_step),
                              -1.0 if clip is None else float(clip),  # -1: the run's own
                              float(spike_ratio), int(budget), progress or None, int(row_dim))
    finally:
        _scopes.close_lingering()
    return DoomReport(found, time.monotonic() - start)
