"""The guard's lines in Python go through the logging module: one record of
the logger "nanscope" per line, with the step, rank and model as fields;
where nobody configured logging, to sys.stderr as it is at each line (which
is what Jupyter and contextlib.redirect_stderr replace), never to file
descriptor 2 behind Python's back."""
import logging
import os
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F

import nanscope


def _failing_step(run_dir, model_name=""):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(run_dir), amp="fp32",
                               model_name=model_name, config=nanscope.GuardConfig(fallback="off"))
    for step in range(3):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step == 2:
            x[5, 1] = float("nan")
        guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
    guard.close()


def test_each_line_is_a_record_with_its_step_rank_and_model(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nanscope")
    _failing_step(tmp_path / "run", model_name="probe")
    records = [r for r in caplog.records if r.name == "nanscope"]
    opening = [r for r in records if r.getMessage().startswith("nanscope: writing ")]
    assert len(opening) == 1 and opening[0].levelno == logging.INFO and opening[0].step is None, opening
    birth = [r for r in records if "first birth" in r.getMessage()]
    assert len(birth) == 1, [r.getMessage() for r in records]
    assert birth[0].levelno == logging.WARNING
    assert (birth[0].step, birth[0].rank, birth[0].model) == (2, 0, "probe")
    assert "step 2: first birth: nan at input" in birth[0].getMessage(), birth[0].getMessage()


def test_a_handler_of_the_applications_gets_them_and_log_false_silences_a_guard(tmp_path, caplog):
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    handler = Keep()
    logging.getLogger().addHandler(handler)
    try:
        _failing_step(tmp_path / "a")
        assert any("first birth" in line for line in seen), seen
        seen.clear()
        model = torch.nn.Linear(4, 1)
        guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(tmp_path / "b"),
                                   log=False)
        x = torch.full((2, 4), float("nan"))
        guard.closure_step(lambda: model(x).sum(), batch=x)
        guard.close()
        assert seen == [], seen
    finally:
        logging.getLogger().removeHandler(handler)


def test_unconfigured_the_lines_go_to_sys_stderr_which_redirect_stderr_catches(tmp_path):
    """In a process of its own: no test runner's handler on the root logger."""
    program = textwrap.dedent("""
        import contextlib, io, sys, torch, torch.nn.functional as F, nanscope
        model = torch.nn.Linear(4, 1)
        caught = io.StringIO()
        with contextlib.redirect_stderr(caught):
            guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=sys.argv[1])
            x, y = torch.randn(8, 4), torch.randn(8, 1)
            x[3, 0] = float("nan")
            guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
            guard.close()
        print(caught.getvalue(), end="")
    """)
    run = subprocess.run([sys.executable, "-c", program, str(tmp_path / "run")], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    assert "step 0: first birth: nan at input" in run.stdout, run.stdout
    assert "nanscope: writing" in run.stdout
    assert "first birth" not in run.stderr, run.stderr  # nothing past Python's sys.stderr
