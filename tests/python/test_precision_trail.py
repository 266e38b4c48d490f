"""The precision trail (docs/replay.md): a 'precision' verdict's step run at
its precision and in fp32 op by op up to its birth, naming the op where the
low-precision run left fp32, the same from Python as from nanscope-replay."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class _NaiveNorm(nn.Module):
    """A layer norm whose variance is E[x^2] - E[x]^2. Features around 300 with
    a variance of about 1 need 17 significant bits to keep it; bfloat16 has 8,
    so both terms round to the same multiple of 512 and the variance comes out
    0 (or 512 apart) where float32's is about 1."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        variance = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / variance.sqrt()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = _NaiveNorm()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(x))


def _loss(model, batch):
    return F.cross_entropy(model(batch[0]).float(), batch[1])


def _snapshot_of(tmp_path, plant):
    """Four steps of a bfloat16 model; step 2's batch is planted by plant(x)."""
    model = _Net().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=_loss)
    g = torch.Generator().manual_seed(1)
    snapshot = None
    for step in range(4):
        x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
        if step == 2:
            x = plant(x)
        batch = (x.to(torch.bfloat16), y)
        guard.backward(_loss(model, batch), batch)
        result = guard.step()
        optimizer.zero_grad(set_to_none=True)
        if result.skipped:
            snapshot = result.snapshot
    guard.close()
    assert snapshot, "step 2 went non-finite and was kept"
    return snapshot


def test_the_trail_names_the_subtraction_that_cancelled_not_the_op_that_made_the_nan(tmp_path):
    snapshot = _snapshot_of(tmp_path, lambda x: x + 300.0)
    report = nanscope.replay(snapshot, lambda: _Net().to(torch.bfloat16), _loss)
    assert report.verdict == "precision", str(report)
    trail = report.precision_trail
    assert isinstance(trail, nanscope.PrecisionTrail)
    assert trail.type == "bfloat16"
    lost = trail.first_lost
    assert (lost.op, lost.module, lost.phase) == ("aten::sub", "norm", "forward"), str(report)
    assert lost.ulps > trail.margin_ulps
    at = [o.index for o in trail.ops].index(lost.index)
    before = trail.ops[:at]
    assert {"aten::mean", "aten::mul"} <= {o.op for o in before}, trail.ops
    assert all(o.ulps <= trail.margin_ulps for o in before), before
    # It ends at the birth (the square root of a negative variance, or the division by a zero one).
    assert trail.ops[-1].op == report.first_birth.op and trail.ops[-1].nonfinite > 0, str(report)
    assert "precision lost:   aten::sub in module 'norm' (forward)" in str(report)
    assert report.to_dict()["replay"]["precision_trail"]["first_lost"]["op"] == "aten::sub"


def test_a_verdict_other_than_precision_has_no_trail(tmp_path):
    def corrupt(x):
        x[5, 3] = float("nan")
        return x
    report = nanscope.replay(_snapshot_of(tmp_path, corrupt), lambda: _Net().to(torch.bfloat16), _loss,
                             write=False)
    assert report.verdict == "data", str(report)
    assert report.precision_trail is None
    assert report.to_dict()["replay"]["precision_trail"] is None
