"""torch.compile under the guard (torch 2.x; skipped on 1.x): the guarded steps
run the user's compiled program, nanscope puts nothing into Dynamo's graph (no
graph break, no skipped frame), and the forensic re-run of a failing step runs
eagerly, so the birth is named by op, module and row as for the eager model:
six real hazards come out as on the eager model, in the guard and in the
replay. A step that only a (deliberately wrong) compiled program makes
non-finite gets the compiler's verdict and the module to run eagerly."""
import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope

pytestmark = pytest.mark.skipif(not hasattr(getattr(torch, "compiler", None), "set_stance"),
                                reason="torch.compile with compiler stances needs torch 2.6 or newer")


class CountingBackend:
    """A torch.compile backend that counts the graphs it compiles and the calls of them."""

    def __init__(self):
        self.graphs = self.runs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1

        def run(*args):
            self.runs += 1
            return gm.forward(*args)
        return run


def _fresh_compile(net, backend):
    """`net` compiled with `backend` by a Dynamo with nothing cached or counted yet."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return torch.compile(net, backend=backend)


@pytest.mark.parametrize("amp", ["fp32", "bf16"])
def test_a_compiled_model_runs_compiled_on_every_guarded_step(tmp_path, amp):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    compiled(x)  # compiled once before the guard, as a user's warm-up would
    guard = nanscope.StepGuard(compiled, torch.optim.SGD(compiled.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               amp=amp, log=False)
    runs = []
    for _ in range(4):
        assert guard.closure_step(lambda: F.cross_entropy(compiled(x), y), batch=(x, y)).counted
        runs.append(backend.runs)
    assert runs == [2, 3, 4, 5], f"the compiled graph ran {runs} (graphs compiled: {backend.graphs})"
    assert backend.graphs <= 2, "at most one recompile, for autocast's state"
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


class RowScale(nn.Module):
    def forward(self, x):
        return x / x.abs().sum(-1, keepdim=True)  # 0 / 0 for an all-zero row


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8, bias=False)
        self.mid = RowScale()
        self.last = nn.Linear(8, 3)

    def forward(self, x):
        return self.last(self.mid(self.first(x)))


def test_the_failing_step_of_a_compiled_model_is_named_as_the_eager_models(tmp_path):
    """Inductor fuses the division into a kernel op-level capture cannot see; the
    re-run runs the same module eagerly, so the birth is the eager model's. The
    replay (its factory compiling) re-runs eagerly once more and gives the eager
    model's verdict, not the compiler's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    births, reports, warned = {}, {}, []
    for kind in ("eager", "compiled"):
        torch.manual_seed(0)
        net = Net()
        model = torch.compile(net) if kind == "compiled" else net
        guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=tmp_path / kind,
                                   amp="bf16", log=False)
        for step in range(3):
            x, y = torch.randn(8, 8), torch.randint(0, 3, (8,))
            if step == 2:
                x[5] = 0  # a blank sample: the first linear (no bias) gives 0, RowScale 0 / 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
            warned += [str(w.message) for w in caught if "global hooks" in str(w.message)]
        assert not result.counted
        births[kind] = result.first_birth
        factory = (lambda: torch.compile(Net())) if kind == "compiled" else Net
        reports[kind] = nanscope.replay(result.snapshot, factory, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                                        write=False)
    assert births["eager"].startswith("nan at aten::div (forward) in module 'mid', batch row 5"), births
    assert births["compiled"].replace("_orig_mod.", "") == births["eager"], births
    assert not warned, "torch.compile's warning about global hooks, which nanscope's re-run handles: " + warned[0]
    eager, compiled = reports["eager"], reports["compiled"]
    assert compiled.eager_finite is False and eager.eager_finite is None
    assert (compiled.verdict, compiled.category) == (eager.verdict, eager.category) == ("model_or_data",
                                                                                       "div_by_zero"), reports
    assert compiled.rows == eager.rows == [5]


@pytest.mark.parametrize("amp", ["fp32", "bf16"])
def test_the_watched_form_runs_the_compiled_program_and_names_births_as_eager(tmp_path, amp):
    """The watched form on a compiled model: the loop's own forward runs the
    compiled graph on every micro-batch (the guard's hook on the compiled module
    puts nothing into Dynamo's graph), and a failing micro-batch is re-run
    eagerly, named as for the eager model."""
    torch.manual_seed(0)
    backend = CountingBackend()
    compiled = _fresh_compile(Net(), backend)
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    guard = nanscope.StepGuard(compiled, optimizer, run_dir=tmp_path / "run", amp=amp, log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    ctx = guard.autocast()
    results, runs, graphs = [], [], []
    for step in range(4):
        for micro in range(2):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            if step == 2 and micro == 1:
                x[3] = 0
            with ctx:
                loss = F.cross_entropy(compiled(x), y) / 2
            guard.scale(loss, (x, y)).backward()  # the targets are no argument of the model's
        results.append(guard.step(optimizer))
        guard.update()
        optimizer.zero_grad()
        runs.append(backend.runs)
        graphs.append(backend.graphs)
    assert [r.counted for r in results] == [True, True, False, True]
    assert results[2].first_birth.startswith("nan at aten::div (forward) in module 'mid', micro-batch 1, batch row 3")
    # Each clean step runs the compiled graph once per micro-batch (the failing
    # step's diagnosis may run it more: its fallback re-runs need no eager run).
    assert runs[0] == 2 and runs[1] - runs[0] == 2 and runs[3] - runs[2] == 2, \
        f"the compiled graph ran {runs} times (graphs: {backend.graphs})"
    # At most one recompile, for autocast's state, before the failing step (its
    # diagnosis may compile the fp32 re-run), and none after it.
    assert graphs[1] <= 2 and graphs[3] == graphs[2], f"graphs compiled after each step: {graphs}"
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


# --- The compiler's verdict: a deliberately wrong compiled program.

def _wrong_gelu(x, *args, **kwargs):
    """GELU as a broken compiler might emit it: NaN wherever its input exceeds 3."""
    return F.gelu(x, *args, **kwargs).masked_fill(x > 3, float("nan"))


class CorruptingBackend:
    """A torch.compile backend that compiles every GELU wrongly (_wrong_gelu)
    and runs the rest of the graph as traced; counts the graphs it compiles."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        for node in gm.graph.nodes:
            if node.op == "call_function" and "gelu" in str(node.target):
                node.target = _wrong_gelu
        gm.recompile()
        return gm.forward


class GeluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.mid = nn.Sequential(nn.Linear(16, 16), nn.GELU())
        self.last = nn.Linear(16, 3)

    def forward(self, x):
        return self.last(self.mid(self.first(x)))


def _gelu_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, 8, generator=g) * 0.1, torch.randint(0, 3, (8,), generator=g)
    if step == 2:
        x[4] = 40.0  # large, finite: GELU's input passes 3 (finite eagerly, NaN in the wrong program)
    return x, y


def _gelu_loss(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def test_a_step_non_finite_only_compiled_gets_the_compilers_verdict_and_its_module(tmp_path, caplog):
    """Finite eagerly, non-finite compiled: not transient, not the model's math.
    The guard skips it as the compiler's, names the module that breaks the step
    compiled alone, and the replay (its factory compiling the same way) says
    'compiler'; the fix it suggests, that module run eagerly, holds."""
    torch.manual_seed(0)
    net = GeluNet()
    backend = CorruptingBackend()
    compiled = _fresh_compile(net, backend)
    guard = nanscope.StepGuard(compiled, torch.optim.SGD(compiled.parameters(), lr=0.01), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    results, graphs = [], []
    for step in range(5):
        batch = _gelu_batch(step)
        results.append(guard.closure_step(lambda: _gelu_loss(compiled, batch), batch=batch))
        graphs.append(backend.graphs)
    assert [r.counted for r in results] == [True, True, False, True, True], results
    failed = results[2]
    assert failed.first_birth.startswith("finite when run eagerly, non-finite compiled"), failed.first_birth
    assert "module 'mid.1' compiled alone breaks the step" in failed.first_birth, failed.first_birth
    assert failed.remedy == "compiler", failed.remedy
    assert guard.amp == "bf16", "the compiler's fault is no reason to leave bf16"
    # The diagnosis compiled modules alone; the user's program compiled nothing after it.
    assert graphs[3] == graphs[4] == graphs[2], graphs
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])

    with caplog.at_level(logging.ERROR, logger="torch._dynamo"):
        report = nanscope.replay(failed.snapshot, lambda: torch.compile(GeluNet(), backend=CorruptingBackend()),
                                 _gelu_loss, write=False)
    # Only errors count: torch 2.14's structured trace ("torch.__trace") sends
    # empty DEBUG records through the same handler.
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "Dynamo logged errors during the replay: " + "; ".join(r.getMessage() for r in errors)
    assert report.verdict == "compiler", report
    assert report.category == "compiled_program"
    assert report.eager_finite is True and report.reproduced_count == report.repeats
    assert report.compiled_region == "mid.1", report
    assert "torch.compiler.disable" in report.suggestion and "get_submodule('mid.1')" in report.suggestion
    assert "re-run eagerly:   finite" in str(report)

    # The suggested fix: that module eagerly, the rest compiled as before.
    torch.manual_seed(0)
    fixed = GeluNet()
    fixed.load_state_dict(net.state_dict())
    sub = fixed.get_submodule("mid.1")
    sub.forward = torch.compiler.disable(sub.forward)
    batch = _gelu_batch(2)
    assert torch.isfinite(_gelu_loss(torch.compile(fixed, backend=CorruptingBackend()), batch))
    assert not torch.isfinite(_gelu_loss(torch.compile(GeluNet(), backend=CorruptingBackend()), batch))


# --- Real hazards: named on a compiled model exactly as on the eager one.

class Hazard(nn.Module):
    """first (Linear) -> mid (the hazard) -> last (Linear); `mid` does what the name says."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.first = nn.Linear(8, 8, bias=False)  # a blank sample stays blank
        self.mid = _HAZARDS[kind]()
        self.last = nn.Linear(8, 3)

    def forward(self, x, mask=None):
        h = self.first(x)
        h = self.mid(h, mask) if self.kind == "masked_softmax" else self.mid(h)
        return self.last(h)


class ZeroOverZero(nn.Module):
    def forward(self, h):
        return h / h.abs().sum(-1, keepdim=True)


class LogOfNonPositive(nn.Module):
    def forward(self, h):
        return h * torch.log(h.abs().sum(-1, keepdim=True))


class HandSoftmax(nn.Module):
    def forward(self, h):
        e = torch.exp(h)
        return e / e.sum(-1, keepdim=True)


class MaskedSoftmax(nn.Module):
    def forward(self, h, mask):
        return h.masked_fill(mask == 0, float("-inf")).softmax(-1)


class Scale(nn.Module):
    def forward(self, h):
        return h * 1.0


class Square(nn.Module):
    def forward(self, h):
        return h * h  # past fp16's 65504 once |h| passes 256


_HAZARDS = {"zero_over_zero": ZeroOverZero, "log_nonpositive": LogOfNonPositive, "exp_overflow": HandSoftmax,
            "masked_softmax": MaskedSoftmax, "nan_input": Scale, "fp16_overflow": Square}


def _hazard_batch(kind, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
    mask = torch.ones(8, 8)
    if step == 1:
        if kind in ("zero_over_zero", "log_nonpositive"):
            x[5] = 0  # a blank sample: `first` has no bias, so its output row is 0
        elif kind == "exp_overflow":
            x[5] = 500.0
        elif kind == "masked_softmax":
            mask[5] = 0
        elif kind == "nan_input":
            x[5] = float("nan")
        elif kind == "fp16_overflow":
            x[5] = 1e3  # finite in fp16, and so is `first`'s output; its square is not
    return (x, mask, y) if kind == "masked_softmax" else (x, y)


def _hazard_loss(model, batch):
    if len(batch) == 3:
        return F.cross_entropy(model(batch[0], batch[1]), batch[2])
    return F.cross_entropy(model(batch[0]), batch[1])


def _can_autocast_fp16_on_cpu():
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    except RuntimeError:
        return False


@pytest.mark.parametrize("kind", sorted(_HAZARDS))
def test_a_hazard_on_a_compiled_model_is_named_as_on_the_eager_model(tmp_path, kind):
    amp = "fp16" if kind == "fp16_overflow" else "bf16"
    if amp == "fp16" and not _can_autocast_fp16_on_cpu():
        pytest.skip("this torch has no fp16 autocast on the CPU")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        net = Hazard(kind)
        model = torch.compile(net) if mode == "compiled" else net
        guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=tmp_path / mode,
                                   amp=amp, log=False)
        results = []
        for step in range(3):
            batch = _hazard_batch(kind, step)
            results.append(guard.closure_step(lambda: _hazard_loss(model, batch), batch=batch))
        out[mode] = results
    eager, compiled = out["eager"], out["compiled"]
    assert [r.counted for r in eager] == [True, False, True], eager
    assert [r.counted for r in compiled] == [r.counted for r in eager], compiled
    assert compiled[1].first_birth == eager[1].first_birth, (compiled[1].first_birth, eager[1].first_birth)
    assert compiled[1].remedy == eager[1].remedy
    assert "batch row 5" in eager[1].first_birth, eager[1].first_birth
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    # The replays agree too: a factory that compiles gets the eager model's verdict.
    verdicts = {}
    for mode in ("eager", "compiled"):
        factory = (lambda: torch.compile(Hazard(kind))) if mode == "compiled" else (lambda: Hazard(kind))
        report = nanscope.replay(out[mode][1].snapshot, factory, _hazard_loss, write=False)
        verdicts[mode] = (report.verdict, report.category, str(report.first_birth))
    assert verdicts["compiled"] == verdicts["eager"], verdicts
    assert verdicts["eager"][0] != "compiler"
