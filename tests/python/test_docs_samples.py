"""Every Python sample in the README and docs/ is held to the API as it is:
each parses as Python, and each call of nanscope's (nanscope.X(...), a
guard's methods, a GuardConfig) uses only keywords the callee takes, so a
sample cannot drift from the code (docs/python.md once gave guard_trainer
fallback= and doom_search=, which raise TypeError). A sample that defines
everything it uses runs as written, in a scratch directory."""
import ast
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import nanscope

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def samples():
    out = []
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[:match.start()].count("\n") + 2
            out.append(pytest.param(match.group(1), id=f"{path.relative_to(ROOT)}:{line}"))
    return out


# Keyword catch-alls that refuse what they catch (with a TypeError saying
# where the option went) accept nothing; guard_trainer's pass on to StepGuard.
REFUSING = {"misplaced", "gone"}
FORWARDED = {"guard_trainer": nanscope.StepGuard.__init__}
RECEIVERS = {"guard": nanscope.StepGuard}  # the name the samples give a StepGuard


def accepted(function):
    """The keywords `function` takes, or None where it takes any."""
    if function.__name__ in FORWARDED:
        return accepted(FORWARDED[function.__name__])
    if inspect.isclass(function):
        function = function.__init__
    params = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD and p.name not in REFUSING for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def callee(call):
    """The nanscope function or guard method a call names, with how the sample names it."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id == "nanscope":
            assert hasattr(nanscope, f.attr), f"nanscope.{f.attr} does not exist"
            return getattr(nanscope, f.attr), f"nanscope.{f.attr}"
        if f.value.id in RECEIVERS:
            owner = RECEIVERS[f.value.id]
            assert hasattr(owner, f.attr), f"{f.value.id}.{f.attr}: {owner.__name__} has no {f.attr}"
            return getattr(owner, f.attr), f"{f.value.id}.{f.attr}"
    return None, None


@pytest.mark.parametrize("source", samples())
def test_a_sample_parses_and_calls_nanscope_only_as_it_is(source):
    tree = ast.parse(source)  # a sample is Python as written: `...` stands for the user's code
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function, name = callee(node)
        if function is None or not callable(function):
            continue
        keywords = accepted(function)
        for keyword in node.keywords:
            if keyword.arg is not None and keywords is not None:
                assert keyword.arg in keywords, f"{name}(..., {keyword.arg}=...): {name} takes no {keyword.arg}="


def undefined_names(tree):
    """Names a sample reads that neither it nor Python defines."""
    import builtins
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - defined


def a_run_to_read(where):
    """run/run.h5 as the samples that read one expect it: a few guarded steps,
    one of them skipped on a NaN."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with nanscope.StepGuard(model, optimizer, run_dir=str(where / "run"), amp="fp32", log=False,
                            loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1])) as guard:
        for step in range(4):
            x, y = torch.randn(8, 4), torch.randn(8, 1)
            if step == 2:
                x[3, 1] = float("nan")
            guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))


@pytest.mark.parametrize("source", samples())
def test_a_whole_sample_runs_as_written(source, tmp_path):
    tree = ast.parse(source)
    missing = undefined_names(tree)
    if missing or any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree)):
        pytest.skip(f"an excerpt (uses {', '.join(sorted(missing)) or '...'}): checked against the API above")
    if "run/run.h5" in source:
        a_run_to_read(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
