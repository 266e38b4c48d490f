"""The guard in a Hugging Face Trainer: one line after the Trainer is made.

    trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
    nanscope.guard_trainer(trainer, run_dir="runs/ft")
    trainer.train()

Trainer, Seq2SeqTrainer, and subclasses of either that override compute_loss
or training_step alike. The Trainer makes its optimizer inside train(), and
loads a checkpoint's scaler.pt before any callback of its runs; so the guard's
place, the accelerator's GradScaler slot, is taken at once by a TrainerGuard,
which builds the StepGuard when training begins (the model prepared, the
optimizer made) and holds a resumed state until then. From there it is the
Accelerate integration (_accelerate.py): accelerator.backward, the prepared
optimizer's step() and the Trainer's clipping run through the guard. Besides:
- the Trainer's checkpoints keep the guard's state_dict as scaler.pt, and
  resume_from_checkpoint puts it back: the guard goes on where it was, and
  appends to the run's run.h5;
- a failed micro-batch is re-run with the trainer's own compute_loss, so a
  subclass's loss is re-run as the loop computed it;
- every log of the Trainer's (log_history, and each tracker it reports to)
  carries nanscope/skipped_steps and nanscope/fallbacks, and after a skip
  nanscope/first_birth: what the first birth of the last skipped step was;
- a train_dataset of dict samples names each sample's data set row, through
  the collator to compute_loss, which takes it out before the model sees the
  batch: a `data` verdict lists its samples in the run's poison list, and a
  listed sample is replaced by the row before it from then on, this run and
  every run resumed in the same run_dir (_poisoned.RowsNamed)."""

from . import _poisoned
from ._options import DEFAULT_RUN_DIR

_LOG_SKIPPED = "nanscope/skipped_steps"
_LOG_FALLBACKS = "nanscope/fallbacks"
_LOG_BIRTH = "nanscope/first_birth"


def guard_trainer(trainer, **options):
    """Guards a Hugging Face Trainer's training steps; returns its TrainerGuard.

    trainer: a transformers.Trainer (or Seq2SeqTrainer, or a subclass), made
    and not yet training. options: StepGuard's keywords (run_dir, config=
    nanscope.GuardConfig(...), log, ...); amp is the precision the Trainer's
    accelerator really runs, and clip the Trainer's own max_grad_norm: neither
    is taken here."""
    for name in ("amp", "accelerator", "loss_fn"):
        if name in options:
            raise TypeError(f"nanscope.guard_trainer: {name}= is the Trainer's own (amp: the precision its "
                            "accelerator runs; loss_fn: its compute_loss); leave it out")
    if "clip" in options or getattr(options.get("config"), "clip", 0):
        raise TypeError("nanscope.guard_trainer: clip is the Trainer's own: TrainingArguments(max_grad_norm=...)")
    if not hasattr(trainer, "accelerator") or not hasattr(trainer, "add_callback"):
        raise TypeError(f"nanscope.guard_trainer: expected a transformers.Trainer, got {trainer!r}")
    if isinstance(getattr(trainer.accelerator, "scaler", None), TrainerGuard):
        raise ValueError("nanscope.guard_trainer: this Trainer is guarded already")
    return TrainerGuard(trainer, options)


class TrainerGuard:
    """In the Trainer's accelerator, where GradScaler sits, until the StepGuard
    is built; then `guard` is the StepGuard (nanscope.StepGuard), None before.
    GradScaler's calls (scale, unscale_, step, update, state_dict,
    load_state_dict) go to the guard, building it first if the Trainer's own
    hook has not (a loop that calls the Trainer's training_step itself)."""

    def __init__(self, trainer, options):
        self._trainer = trainer
        self._options = dict(options)
        self._state = None  # a state_dict put back before the guard was built (a resumed run)
        self._logged_skips = 0
        self.guard = None
        self._original_log = trainer.log
        self._compute_loss = trainer.compute_loss  # the loop's own (a subclass's too)
        self._name_rows(trainer, options.get("run_dir", DEFAULT_RUN_DIR))
        trainer.accelerator.scaler = self
        trainer.add_callback(_build_on_train_begin(self))
        trainer.log = self._log
        trainer.compute_loss = self._named_compute_loss

    def build(self):
        """The StepGuard, on the Trainer's prepared model and optimizer."""
        if self.guard is not None:
            return self.guard
        from . import StepGuard
        trainer = self._trainer
        if trainer.optimizer is None:
            raise RuntimeError("nanscope.guard_trainer: the Trainer has no optimizer yet (the guard is built when "
                               "training begins)")

        def loss_fn(model, batch):
            # The loop's own loss of a micro-batch (a subclass's compute_loss too).
            loss = self._compute_loss(model, batch)
            return loss.mean() if loss.dim() else loss
        options = dict(self._options)
        options.setdefault("model_name", type(trainer.model).__name__)
        self.guard = StepGuard(trainer.model_wrapped, trainer.optimizer, accelerator=trainer.accelerator,
                               loss_fn=loss_fn, **options)
        if self._state is not None:
            self.guard.load_state_dict(self._state)
            self._state = None
        return self.guard

    @staticmethod
    def _name_rows(trainer, run_dir):
        """The train_dataset's samples carry their rows (and leave listed rows
        out); the collator carries them to compute_loss; the Trainer's column
        filter (remove_unused_columns) lets them through."""
        dataset = trainer.train_dataset
        if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            return  # an iterable data set has no rows to name
        trainer.train_dataset = _poisoned.RowsNamed(dataset, run_dir)
        trainer.data_collator = _poisoned.RowsCollated(trainer.data_collator)
        trainer._set_signature_columns_if_needed()
        trainer._signature_columns.append(_poisoned.ROW_KEY)

    # --- GradScaler's calls, from Accelerate and the Trainer.

    def scale(self, loss):
        return self.build().scale(loss)

    def unscale_(self, optimizer=None):
        self.build().unscale_(optimizer)

    def step(self, optimizer=None, *args, **kwargs):
        return self.build().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.build().update(new_scale)

    def get_scale(self):
        return self.guard.get_scale() if self.guard is not None else 1.0

    def is_enabled(self):
        return self.guard.is_enabled() if self.guard is not None else False

    def state_dict(self):
        """The guard's state_dict (the Trainer saves it as scaler.pt)."""
        if self.guard is not None:
            return self.guard.state_dict()
        return dict(self._state) if self._state is not None else {}

    def load_state_dict(self, state):
        """A checkpoint's scaler.pt, which the Trainer loads before training begins: kept for the guard."""
        if not state:
            return
        if self.guard is not None:
            self.guard.load_state_dict(state)
        else:
            self._state = dict(state)

    def _named_compute_loss(self, model, inputs, *args, **kwargs):
        """The Trainer's compute_loss, naming its inputs as the micro-batch of the
        backward that follows: the whole batch (labels too), where the model's
        own call may see part of it (a subclass that computes the loss itself)."""
        rows = _poisoned.take_rows(inputs)
        accelerated = self.guard._integration().accelerated if self.guard is not None else None
        if accelerated is not None and model.training:
            accelerated.batch = inputs
            accelerated.rows = rows
        return self._compute_loss(model, inputs, *args, **kwargs)

    # --- The Trainer's logs.

    def log_fields(self):
        """What each of the Trainer's logs carries of the guard's."""
        guard = self.guard
        if guard is None:
            return {}
        fields = {_LOG_SKIPPED: guard.skipped_steps, _LOG_FALLBACKS: guard.fallbacks}
        if guard.skipped_steps > self._logged_skips and guard.last_first_birth:
            fields[_LOG_BIRTH] = guard.last_first_birth
        self._logged_skips = guard.skipped_steps
        return fields

    def _log(self, logs, *args, **kwargs):
        logs.update(self.log_fields())
        return self._original_log(logs, *args, **kwargs)


def _build_on_train_begin(owner):
    """The Trainer's callback that builds the guard when training begins:
    after the Trainer prepared its model and made its optimizer (and loaded a
    checkpoint's scaler.pt), before the first forward, whose call the guard
    must see; and writes run.h5's buffered rows when training ends."""
    from transformers import TrainerCallback

    class NanscopeGuard(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            owner.build()

        def on_train_end(self, args, state, control, **kwargs):
            if owner.guard is not None:
                owner.guard.flush()  # run.h5 whole when train() returns
    return NanscopeGuard()
