"""The guard on a GPU: fp16 with its loss scaler and bf16, births found where
they are made, a snapshot replayed to its verdict, the CUDA generators kept.
Each test runs on the CPU too (fp16 there needs torch 2.x), so that what it
expects is checked on every machine; the CUDA cases skip where torch sees no
CUDA device."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope



@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return request.param


def needs_amp(device, amp):
    if device == "cpu" and amp == "fp16" and int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("fp16 autocast on the CPU needs torch 2.x")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make(amp, tmp_path, device):
    needs_amp(device, amp)
    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp=amp, log=False)
    return model, guard


def batch(device):
    return torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device)


def test_an_fp16_forward_overflow_is_born_at_its_linear_and_backs_the_scale_off_as_gradscaler(tmp_path, device):
    model, guard = make("fp16", tmp_path, device)
    with torch.no_grad():
        model.fc1.weight.fill_(0.5)  # a row of 3e4s sums to 2.4e5 in fc1: past fp16's 65504, finite in fp32
    for step in range(4):
        x, y = batch(device)
        if step == 2:
            x[5] = 3e4
            scale = guard.get_scale()
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        if step == 2:  # the steps around it may be the scaler's own skips, as GradScaler's first steps are
            assert not result.counted
            # GradScaler halves on any non-finite step, and the guard in its place
            # ends as the plain loop would (test_transformers.py holds it to that).
            assert guard.get_scale() == scale / 2
            assert result.first_birth.startswith("inf at aten::"), result.first_birth
            assert "(forward) in module 'fc1'" in result.first_birth, result.first_birth
    born = guard.snapshots[0]
    report = nanscope.replay(born, model=Net, loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]), write=False)
    assert report.first_birth.module == "fc1", report.to_dict()
    assert report.first_birth.phase == "forward", report.to_dict()
    assert report.first_birth.rows == [5], report.to_dict()
    assert report.verdict == "precision", report.to_dict()  # finite in fp32: 2.4e5 is far inside its range
    guard.close()


def test_a_gradient_past_fp16_at_the_scale_is_the_scalers_routine(tmp_path, nanscope_lines, device):
    needs_amp(device, "fp16")
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp16")
    scale = guard.get_scale()
    x, y = torch.full((4, 4), 8.0, device=device), torch.full((4, 1), -32.0, device=device)
    result = guard.closure_step(lambda: model(x).sub(y).pow(2).mean(), batch=(x, y))
    assert result.skipped
    assert "the scaler's routine" in nanscope_lines()
    assert guard.get_scale() == scale / 2
    assert not result.snapshot
    guard.close()


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_a_nan_sample_is_named_by_row_and_replays_as_data(tmp_path, amp, device):
    model, guard = make(amp, tmp_path, device)
    for step in range(5):
        x, y = batch(device)
        if step == 3:
            x[6, 2] = float("nan")
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        assert result.counted == (step != 3), (step, result.first_birth)
        if step == 3:
            # A non-finite input is named as such, without a re-run.
            assert result.first_birth.startswith("nan at input (input)"), result.first_birth
            assert result.first_birth.endswith("batch row 6"), result.first_birth
    report = nanscope.replay(guard.snapshots[0], model=Net, loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                             write=False)
    assert report.verdict == "data" and report.first_birth.sample == 6, report.to_dict()
    guard.close()


def test_a_skip_leaves_the_cuda_generator_where_a_plain_loop_leaves_it(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    # Dropout draws from the CUDA generator: a skipped step's re-runs must not move it.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)).cuda()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    x, y = batch(device)
    x[1, 1] = float("nan")
    torch.cuda.manual_seed(7)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        F.cross_entropy(model(x), y)  # what a plain loop's step draws, once
    expected = torch.cuda.get_rng_state()
    torch.cuda.manual_seed(7)
    assert not guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y)).counted
    assert torch.equal(torch.cuda.get_rng_state(), expected)
    guard.close()
