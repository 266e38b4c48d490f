"""What nanscope.replay returns: the replay of one snapshot as an object.

The fields are those of `nanscope-replay --json` (docs/replay.md lists them), read
from the one JSON the C++ engine writes, so the object, its to_dict() and the
command line never disagree; str() is nanscope-replay's text report."""
import json


class Birth:
    """Where a NaN or Inf was first made: the op, its phase ('forward',
    'backward', 'input', ...), the module path ('' is the root), the kind ('nan'
    or 'inf'), for a backward op its autograd node and the forward op or custom
    Function that made it (backward_node, forward_op), its site ('op',
    'gradient_hook', 'recomputation'), the micro-batch (None for a step of one
    batch), and the batch rows it made non-finite (rows) with their rows in the
    data set (dataset_rows, None where unknown). str() is the birth's line as
    the guard and nanscope-replay write it."""

    def __init__(self, fields):
        self._fields = fields
        self.op = fields["op"]
        self.phase = fields["phase"]
        self.module = fields["module"]
        self.kind = fields["kind"]
        self.backward_node = fields.get("backward_node")
        self.forward_op = fields.get("forward_op")
        self.site = fields.get("site", "op")
        self.sample = fields.get("sample")
        self.micro_batch = fields.get("micro_batch")
        self.rows = list(fields.get("rows") or [])
        self.dataset_rows = list(fields.get("dataset_rows") or [])

    def to_dict(self):
        return dict(self._fields)

    def __str__(self):
        return self._fields.get("text") or f"{self.kind} at {self.op} ({self.phase}) in module '{self.module}'"

    def __repr__(self):
        return f"Birth({self})"


def _birth(fields):
    return Birth(fields) if fields else None


class OpError:
    """One op of a precision trail: the op, its phase, module and autograd node
    (backward_node, None in the forward), its index in the low-precision run,
    and how far its output was from the same op's in fp32: max_abs, max_rel,
    ulps (max_abs in units in the last place of the low type at the op's
    largest fp32 value; inf where it made a NaN/Inf fp32 did not) and
    nonfinite (how many such positions)."""

    def __init__(self, fields):
        self._fields = fields
        self.index = fields["index"]
        self.op = fields["op"]
        self.phase = fields["phase"]
        self.module = fields["module"]
        self.backward_node = fields.get("backward_node")
        # float(): JSON has no word for a non-finite number, and nanscope writes one as "inf"
        self.max_abs = float(fields["max_abs"])
        self.max_rel = float(fields["max_rel"])
        self.ulps = float(fields["ulps"])
        self.nonfinite = fields["nonfinite"]

    def to_dict(self):
        return dict(self._fields)

    def __repr__(self):
        return f"OpError({self.op} in {self.module!r} ({self.phase}): {self.ulps:.3g} ulps)"


class PrecisionTrail:
    """A precision verdict's step run at its precision and in fp32, op by op
    up to its first birth (docs/replay.md, "The precision trail"): ops (each
    an OpError, in execution order, the birth's op last), type (the 16-bit
    type errors are counted in), margin_ulps, first_lost (the first op past the
    margin: where precision was lost; None when none was), unmatched (ops of
    the low-precision run with no fp32 counterpart: casts) and cut_short (why
    the trail stops before the birth, or None). str() is its one line."""

    def __init__(self, fields):
        self._fields = fields
        self.type = fields["type"]
        self.margin_ulps = float(fields["margin_ulps"])
        self.ops = [OpError(op) for op in fields["ops"]]
        self.first_lost = OpError(fields["first_lost"]) if fields["first_lost"] else None
        self.unmatched = fields["unmatched"]
        self.cut_short = fields.get("cut_short")

    def to_dict(self):
        return dict(self._fields)

    def __str__(self):
        return self._fields["text"]

    def __repr__(self):
        return f"PrecisionTrail({self})"


class _PrintedJson:
    """A result nanscope's C++ side gives as its JSON and its printed text."""

    def __init__(self, json_text, text):
        self._dict = json.loads(json_text)
        self._text = text

    def to_dict(self):
        """The object as the command's --json prints it (a fresh copy)."""
        return json.loads(json.dumps(self._dict))

    def to_json(self):
        return json.dumps(self._dict, indent=2)

    def __str__(self):
        return self._text


class ReplayReport(_PrintedJson):
    """The replay of a snapshot: step, reproduced (non-finite again at its own
    precision) with reproduced_count of repeats, fp32_finite (with
    widened_weights: the 16-bit type of a model's own weights, widened to
    float32 for that re-run, or None), verdict
    ('precision', 'model_or_data', 'data', 'transient', 'compiler', 'kernel'), category,
    suggestion, for a torch.compile'd model eager_finite (the same step run
    eagerly) and compiled_region (the module that, compiled alone, breaks the
    step; '' for the whole model), doomed_by (the training run's doom event
    about this step, when it searched: doom_search=True),
    first_birth / first_nan_birth / first_inf_birth (Birth or None),
    fp32_first_birth, fp32_modules (the smallest set that makes the step
    finite in fp32, or None when not searched), rows (the batch rows without
    which the step is finite, or None when the batch was not bisected) and
    their dataset_rows, no_row_found (why a bisection found no row),
    draws_random_numbers, anomaly and rerun_error; nonfinite_weights (the
    parameters that held a NaN/Inf as the step began: nothing was re-run, and
    the category is 'nonfinite_weights'); kernels (where the born op has
    other kernels on this machine: {'op', 'used', 'tried': {kernel: outcome}},
    the step re-run with each; a 'kernel' verdict when one was finite; None
    otherwise); for a 'precision' verdict
    precision_trail (a PrecisionTrail: where, op by op, the step left fp32;
    None otherwise)."""

    def __init__(self, json_text, text):
        super().__init__(json_text, text)
        capture, replay = self._dict["capture"], self._dict["replay"]
        self.step = self._dict["step"]
        self.verdict = self._dict["verdict"]
        self.category = self._dict["category"]
        self.suggestion = self._dict["suggestion"]
        self.first_birth = _birth(capture["first_birth"])
        self.first_nan_birth = _birth(capture["first_nan_birth"])
        self.first_inf_birth = _birth(capture["first_inf_birth"])
        self.nonfinite_weights = list(replay.get("nonfinite_weights") or [])  # read, not re-run
        self.reproduced = replay["reproduced"]
        self.reproduced_count = replay["reproduced_count"]
        self.repeats = replay["repeats"]
        self.fp32_finite = replay["fp32_finite"]
        self.widened_weights = replay.get("widened_weights")  # the model's own 16-bit type, widened for fp32
        self.eager_finite = replay["eager_finite"]  # a compiled model's eager re-run; None otherwise
        self.compiled_region = replay["compiled_region"]
        self.doomed_by = self._dict.get("doomed_by")  # the run's doom event for this step, or None
        self.fp32_first_birth = _birth(replay["fp32_first_birth"])
        self.anomaly = replay["anomaly"]
        self.rerun_error = replay["rerun_error"]
        self.draws_random_numbers = replay["draws_random_numbers"]
        bisection = replay["precision_bisection"]
        self.fp32_modules = list(bisection["fp32_modules"]) if bisection else None
        rows = replay["batch_bisection"]
        self.rows = list(rows["samples"]) if rows else None
        self.dataset_rows = list(rows["dataset_rows"]) if rows else None
        self.no_row_found = rows.get("no_row_found") if rows else None
        self.kernels = replay.get("kernels")  # the born op's other kernels tried, or None
        trail = replay.get("precision_trail")
        self.precision_trail = PrecisionTrail(trail) if trail else None

    def __repr__(self):
        return f"ReplayReport(step={self.step}, verdict={self.verdict!r}, category={self.category!r})"


class SnapshotInspection(_PrintedJson):
    """What a snapshot holds and what replaying it would run, read without
    running or loading any of it (nanscope-replay --inspect): step, origin
    ('python', 'nanscope-train', 'cpp'), model_name, carries_code (True when
    replaying runs code stored in the file: a TorchScript program, or the
    batch's pickled Python objects, which replay unpickles), replay_runs (that
    in one sentence), program_bytes and program_files (a TorchScript model's
    source files), parameters, buffers, optimizer_state and batch
    (each a list of {'name', 'dtype', 'shape'}) and pickled_objects."""

    def __init__(self, json_text, text):
        super().__init__(json_text, text)
        model = self._dict["model"]
        self.step = self._dict["step"]
        self.origin = self._dict["origin"]
        self.carries_code = self._dict["carries_code"]
        self.replay_runs = self._dict["replay_runs"]
        self.model_name = model["name"]
        self.program_bytes = model["program_bytes"]
        self.program_files = list(model["program_files"])
        self.parameters = list(self._dict["parameters"])
        self.buffers = list(self._dict["buffers"])
        self.optimizer_state = list(self._dict["optimizer"]["state"])
        self.batch = list(self._dict["batch"]["tensors"])
        self.pickled_objects = self._dict["batch"]["pickled_objects"]

    def __repr__(self):
        return (f"SnapshotInspection(step={self.step}, model_name={self.model_name!r}, "
                f"carries_code={self.carries_code})")
