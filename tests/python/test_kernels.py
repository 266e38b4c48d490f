"""The kernel verdict: a step whose NaN one kernel of the born op makes and
another does not. On torch 2.x's CPU, scaled-dot-product attention runs with
the flash kernel or the math path; they agree on anything short of extreme
magnitudes. One such case: keys near 1e18 saturate the softmax into exact
zeros and ones, and over values near 1e32 the flash kernel's backward turns
that into NaN where the math path's gives exact zeros. The guard and the
replay both re-run the step with math, find it finite, and say `kernel`; the
guard pins math inside the attention module for the rest of the run."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope

if not hasattr(torch.nn, "attention"):
    pytest.skip("scaled-dot-product attention's backends need torch 2.x", allow_module_level=True)

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


class Attention(nn.Module):
    """One head over (batch, seq, 16) that reads a fixed memory of values:
    `key_scale` stands for a key projection whose outputs have blown up,
    `value_scale` for the memory's magnitude."""

    def __init__(self, key_scale, value_scale):
        super().__init__()
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
        self.key_scale = key_scale
        self.register_buffer("values", torch.randn(8, 16) * value_scale)

    def forward(self, x):
        q, k = self.q(x), self.k(x) * self.key_scale
        v = self.values.expand(x.shape[0], -1, -1)
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]


class Net(nn.Module):
    def __init__(self, key_scale=1e18, value_scale=1e32):
        super().__init__()
        self.attn = Attention(key_scale, value_scale)

    def forward(self, x):
        return self.attn(x).mean((1, 2))[:, None]


def loss_fn(model, batch):
    x, y = batch
    return (model(x) - y).abs().mean()


def step_is_finite_with(backend, model, batch):
    model.zero_grad(set_to_none=True)
    with sdpa_kernel([backend]):
        loss = loss_fn(model, batch)
        loss.backward()
    return all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


def batch():
    torch.manual_seed(1)
    return torch.randn(4, 8, 16), torch.randn(4, 1)


def test_the_case_is_what_it_claims_on_this_machine():
    # The data decides: the two kernels disagree on this step here.
    torch.manual_seed(0)
    model, b = Net(), batch()
    assert not step_is_finite_with(SDPBackend.FLASH_ATTENTION, model, b)
    assert step_is_finite_with(SDPBackend.MATH, model, b)


def test_a_nan_only_the_flash_kernel_makes_is_the_kernels_and_math_is_pinned(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step stays the same step
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="fp32", loss_fn=loss_fn)
    assert torch.backends.cuda.flash_sdp_enabled()
    try:
        b = batch()
        result = guard.closure_step(lambda: loss_fn(model, b), batch=b)
        lines = nanscope_lines()
        assert result.skipped
        assert "flash_attention" in result.first_birth and "backward" in result.first_birth, result.first_birth
        assert result.remedy == "kernel", lines
        assert "math now pinned in attn" in lines and "flash non-finite (the step's), math finite" in lines, lines
        assert "torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)" in lines, lines
        # Pinned in attn alone: the process's switches stay, and the same step now trains.
        assert torch.backends.cuda.flash_sdp_enabled()
        assert guard.closure_step(lambda: loss_fn(model, b), batch=b).counted
        assert torch.backends.cuda.flash_sdp_enabled(), "put back as attn's scope closed"
        assert guard.state_dict()["pinned_kernels"] == ["attn=math"]
        snapshot = guard.snapshots[0]
        guard.close()

        # The replay, from the snapshot alone and the switches as a fresh process has them, agrees.
        torch.backends.cuda.enable_flash_sdp(True)
        report = nanscope.replay(snapshot, model=Net, loss=loss_fn, write=False)
        assert report.verdict == "kernel", report.to_dict()
        assert report.kernels["used"] == "flash" and report.kernels["tried"] == {"math": "finite"}, report.kernels
        assert "Pin math" in report.suggestion and "sdpa_kernel" in report.suggestion, report.suggestion
        assert torch.backends.cuda.flash_sdp_enabled(), "the replay's pins are undone after each re-run"
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_math_sdp(True)


def test_a_resumed_guard_pins_the_kernel_again_in_the_closure_and_the_watched_form(tmp_path):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="fp32", log=False)
    state = guard.state_dict()
    state["pinned_kernels"] = ["attn=math"]  # as a checkpoint of the run above holds it
    guard.load_state_dict(state)
    assert guard.state_dict()["pinned_kernels"] == ["attn=math"]
    b = batch()
    assert guard.closure_step(lambda: loss_fn(model, b), batch=b).counted
    # The loop's own forward and backward (the watched form), as GradScaler's users
    # write it: the forward under guard.autocast(), where the guard sees the model's calls.
    with guard.autocast():
        loss = loss_fn(model, b)
    guard.scale(loss).backward()
    assert guard.step(optimizer).counted
    guard.update()
    optimizer.zero_grad(set_to_none=True)
    assert torch.backends.cuda.flash_sdp_enabled()
    guard.close()


def test_kernels_that_agree_give_no_kernel_verdict(tmp_path):
    # Logits past float32's range: the forward's softmax is NaN with either kernel.
    torch.manual_seed(0)
    model = Net(key_scale=1e20, value_scale=1.0)
    with torch.no_grad():
        model.attn.q.weight.mul_(1e20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="fp32", log=False, loss_fn=loss_fn)
    b = batch()
    result = guard.closure_step(lambda: loss_fn(model, b), batch=b)
    assert result.skipped and result.remedy != "kernel", (result.remedy, result.first_birth)
    assert torch.backends.cuda.flash_sdp_enabled(), "nothing pinned"
    report = nanscope.replay(guard.snapshots[0], model=lambda: Net(key_scale=1e20, value_scale=1.0), loss=loss_fn,
                             write=False)
    guard.close()
    assert report.verdict != "kernel", report.to_dict()
    # The birth names the op that chooses the kernel (its output is the first
    # non-finite one): every kernel was tried, and each agreed.
    assert report.first_birth.op == "aten::scaled_dot_product_attention", report.first_birth
    assert report.kernels == {"op": "aten::scaled_dot_product_attention", "used": "unknown",
                              "tried": {"math": "non-finite", "flash": "non-finite"}}, report.kernels
