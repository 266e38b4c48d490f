"""An optimizer that evaluates the loss itself (torch.optim.LBFGS) through
guard.closure_step, the same form as for any optimizer: one row per step, a
non-finite evaluation at a trial point skips the step with the weights and
the optimizer's state as before it, the birth named at that trial point; a
finite step is the plain LBFGS step bit for bit."""
import copy
import math

import h5py
import pytest
import torch
from torch import nn

import nanscope


class GaussianFit(nn.Module):
    """A Gaussian fitted by its negative log-likelihood in float64, its scale a
    raw parameter (no softplus keeps it positive): a step that moves sigma
    below zero makes log(sigma) NaN."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.full((1,), 3.0, dtype=torch.double))
        self.sigma = nn.Parameter(torch.ones(1, dtype=torch.double))

    def forward(self, y):
        return torch.log(self.sigma).sum() + ((y - self.mu).pow(2) / (2 * self.sigma.pow(2))).mean()


def samples():
    torch.manual_seed(0)
    return 3 + 0.5 * torch.randn(64, dtype=torch.double)


def lbfgs(model, lr):
    return torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=2)


def plain_failing_evaluation(y, short_lr, long_lr):
    """The same two steps in plain PyTorch: at which evaluation of the long one
    the loss goes non-finite (0: none). The data decide, on this machine."""
    model = GaussianFit()
    optimizer = lbfgs(model, short_lr)
    evaluations, failed = [0], [0]

    def closure():
        optimizer.zero_grad()
        loss = model(y)
        loss.backward()
        evaluations[0] += 1
        if not failed[0] and not math.isfinite(loss.item()):
            failed[0] = evaluations[0]
        return loss
    optimizer.step(closure)
    for group in optimizer.param_groups:
        group["lr"] = long_lr
    evaluations[0] = failed[0] = 0
    optimizer.step(closure)
    return failed[0]


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


def test_a_non_finite_trial_point_skips_the_step_as_if_it_never_ran(tmp_path, nanscope_lines):
    y = samples()
    model = GaussianFit()
    optimizer = lbfgs(model, 0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path), amp="fp32",
                               config=nanscope.GuardConfig(fallback="off"))
    assert guard.closure_step(lambda: model(y), y).counted  # a short step: the optimizer has a history
    set_lr(optimizer, 3.0)  # a long step now takes sigma below zero at a trial point
    failing = plain_failing_evaluation(y, 0.01, 3.0)
    assert failing > 1, "the plain step must meet the NaN at a trial point, not at its start"

    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict())
    nanscope_lines()
    result = guard.closure_step(lambda: model(y), y)
    lines = nanscope_lines()
    assert not result.counted
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    after = optimizer.state_dict()["state"][0]
    for key, value in state["state"][0].items():
        if torch.is_tensor(value):
            assert torch.equal(after[key], value), key
        elif isinstance(value, list) and key != "al":  # al: scratch space, refilled before it is read
            assert len(after[key]) == len(value) and all(torch.equal(a, b) for a, b in zip(after[key], value)), key
        elif key != "al":
            assert after[key] == value, key
    assert result.first_birth.startswith("nan at aten::log (forward)"), result.first_birth
    assert f"at the optimizer's evaluation {failing} of the step" in lines, lines
    assert model.mu.dtype == torch.double

    set_lr(optimizer, 0.01)
    assert guard.closure_step(lambda: model(y), y).counted
    guard.close()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert len(f["steps/step"]) == 3, "one row per step, not per evaluation"


def test_a_finite_step_is_the_plain_step_bit_for_bit(tmp_path):
    y = samples()
    plain, guarded = GaussianFit(), GaussianFit()
    plain_optimizer, optimizer = lbfgs(plain, 0.5), lbfgs(guarded, 0.5)
    guard = nanscope.StepGuard(guarded, optimizer, run_dir=str(tmp_path), amp="fp32", log=False)

    def closure():
        plain_optimizer.zero_grad()
        loss = plain(y)
        loss.backward()
        return loss
    for _ in range(3):
        plain_optimizer.step(closure)
        assert guard.closure_step(lambda: guarded(y), y).counted
    guard.close()
    assert torch.equal(plain.mu, guarded.mu) and torch.equal(plain.sigma, guarded.sigma)
    assert plain_optimizer.state_dict()["state"][0]["n_iter"] == optimizer.state_dict()["state"][0]["n_iter"]


def test_the_watched_form_says_to_use_the_closure_form(tmp_path):
    y = samples()
    model = GaussianFit()
    guard = nanscope.StepGuard(model, lbfgs(model, 0.1), run_dir=str(tmp_path), amp="fp32", log=False)
    with pytest.raises(RuntimeError, match="closure form"):
        guard.backward(model(y), y)
    guard.close()
