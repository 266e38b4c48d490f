"""torch.compile under the guard (torch 2.x; skipped on 1.x): the guarded steps
run the user's compiled program, nanscope puts nothing into Dynamo's graph (no
graph break, no skipped frame), and the forensic re-run of a failing step runs
eagerly, so the birth is named by op, module and row as for the eager model."""
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
        assert guard.step(lambda: F.cross_entropy(compiled(x), y), batch=(x, y)).counted
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
    re-run runs the same module eagerly, so the birth is the eager model's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    births = {}
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
            result = guard.step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        assert not result.counted
        births[kind] = result.first_birth
    assert births["eager"].startswith("nan at aten::div (forward) in module 'mid', batch row 5"), births
    assert births["compiled"].replace("_orig_mod.", "") == births["eager"], births


@pytest.mark.parametrize("amp", ["fp32", "bf16"])
def test_the_watched_form_runs_the_compiled_program_and_names_births_as_eager(tmp_path, amp):
    """The watched form on a compiled model: the loop's own forward runs the
    compiled graph on every micro-batch (the guard's hook on the compiled module
    puts nothing into Dynamo's graph), and a failing micro-batch is re-run
    eagerly, named as for the eager model."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    net = Net()
    backend = CountingBackend()
    compiled = torch.compile(net, backend=backend)
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    guard = nanscope.StepGuard(compiled, optimizer, run_dir=tmp_path / "run", amp=amp, log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    ctx = guard.autocast()
    results, runs = [], []
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
    assert [r.counted for r in results] == [True, True, False, True]
    assert results[2].first_birth.startswith("nan at aten::div (forward) in module 'mid', micro-batch 1, batch row 3")
    assert runs[0] == 2 and runs[-1] - runs[0] == 6, f"the compiled graph ran {runs} times (graphs: {backend.graphs})"
    assert backend.graphs <= 2, "at most one recompile, for autocast's state"
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
