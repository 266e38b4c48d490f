"""A run written from Python opens in nanscope-view: a real window under Xvfb,
a screenshot with the loss curve, the layer heatmap and the snapshot."""
import shutil
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


def test_a_python_run_opens_in_the_viewer(tmp_path, tool):
    view = tool("NANSCOPE_VIEW")
    xvfb = shutil.which("xvfb-run")
    if xvfb is None:
        pytest.skip("xvfb-run not installed")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    for step in range(30):
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        if step == 20:
            x[3, 1] = float("inf")
        guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    del guard  # closes run.h5
    shot = tmp_path / "view.png"
    result = subprocess.run([xvfb, "-a", view, str(tmp_path / "run"), "--screenshot", str(shot), "--frames", "3"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for region in ("region plot.loss", "region heatmap", "region note.loss_scale"):
        assert region in result.stdout, result.stdout
    assert shot.stat().st_size > 10000
