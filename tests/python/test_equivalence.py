"""The Python guard and nanscope-train give the same answer on the same model:
an eager model in Python, its TorchScript export in nanscope-train, the same
batches in the same order. Same step, op, module, phase, kind and batch row of
the first birth; the same verdict and category from replay."""
import json
import subprocess

import h5py
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class Pre(nn.Module):  # parameter-free: named only by where it sits
    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault

    def forward(self, x):
        if self.fault == "div_zero_std":
            return x / x.std(1, keepdim=True)
        return torch.sqrt(x)


class Cancel(nn.Module):  # bf16 has 8 bits of mantissa: (h + 256) - 256 is 0 for |h| < 1
    def forward(self, h):
        return torch.log(((h + 256.0) - 256.0).abs())


class Net(nn.Module):
    def __init__(self, fault: str):
        super().__init__()
        self.pre = Pre(fault)
        self.cancel = Cancel()
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 3)
        self.fault = fault

    def forward(self, x):
        h = self.fc1(self.pre(x))
        if self.fault == "exp_overflow":
            h = torch.exp(h * 300.0)
        if self.fault == "bf16_cancellation":
            h = self.cancel(h)
        h = self.act(h)
        if self.fault == "log_activation":
            h = torch.log(h)
        return self.fc2(h)


class WithLoss(nn.Module):
    """nanscope-train's TorchScript contract: forward(inputs, targets) is the loss."""

    def __init__(self, fault: str):
        super().__init__()
        self.net = Net(fault)

    def forward(self, inputs, targets):
        return F.cross_entropy(self.net(inputs), targets)


BATCH, STEPS = 8, 5


def make_data(path, fault, bad_row):
    torch.manual_seed(3)
    inputs = torch.rand(64, 6) + 0.1
    if fault == "sqrt_input":
        inputs[bad_row, 2] = -1.0  # sqrt of a negative: NaN, inside the model
    elif fault == "div_zero_std":
        inputs[bad_row] = 0.5  # a constant sample: its std is 0
    targets = torch.randint(0, 3, (64,))
    with h5py.File(path, "w") as f:
        f["inputs"] = inputs.numpy()
        f["targets"] = targets.numpy()
    return inputs, targets


SCENARIOS = {
    # fault: (the row that carries it or None, what the first birth must say)
    "sqrt_input": (21, "nan at aten::sqrt (forward) in module 'net.pre', batch row 5"),
    "div_zero_std": (30, "inf at aten::div (forward) in module 'net.pre', batch row 6"),
    "log_activation": (None, "nan at aten::log (forward) in module 'net'"),
    "exp_overflow": (None, "inf at aten::exp (forward) in module 'net'"),
    "bf16_cancellation": (None, "inf at aten::log (forward) in module 'net.cancel'"),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_python_and_nanscope_train_find_the_same_birth(tmp_path, tool, capfd, scenario):
    bad_row, expected = SCENARIOS[scenario]
    inputs, targets = make_data(tmp_path / "data.h5", scenario, bad_row)
    torch.manual_seed(0)
    model = WithLoss(scenario)
    torch.jit.script(model).save(str(tmp_path / "model.pt"))
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    subprocess.run([tool("NANSCOPE_TRAIN"), "--model", str(tmp_path / "model.pt"), "--data", str(tmp_path / "data.h5"),
                    "--no-shuffle", "--batch-size", str(BATCH), "--steps", str(STEPS), "--lr", "0.01",
                    "--optimizer", "sgd", "--amp", "bf16", "--threads", "1", "--warn", "off",
                    "--run-dir", str(tmp_path / "cpp")], check=True, capture_output=True)
    cpp = json.loads(subprocess.run([tool("NANSCOPE_REPORT"), str(tmp_path / "cpp"), "--json"], check=True,
                                    capture_output=True, text=True).stdout)["runs"][0]

    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "py", amp="bf16", log=False,
                               config=nanscope.GuardConfig(clip=1.0, warn=False))
    births = []
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        x, y = inputs[rows], targets[rows]
        result = guard.closure_step(lambda: model(x, y), batch=(x, y))
        if result.first_birth:
            births.append((step, result.first_birth))
    guard.flush()

    cpp_births = [(e["step"], e["text"]) for e in cpp["events"] if e["kind"] == "first_birth"]
    assert births and births[0] == cpp_births[0], (births, cpp_births)
    assert births[0][1] == expected, births

    # Replay: nanscope-replay on the C++ snapshot, nanscope.replay on the Python one.
    step = births[0][0]
    cpp_replay = json.loads(subprocess.run([tool("NANSCOPE_REPLAY"), str(tmp_path / "cpp" / "snapshots" /
                                                                        f"step-{step:07d}.h5"), "--json",
                                            "--no-write"], check=True, capture_output=True, text=True).stdout)
    py_replay = nanscope.replay(tmp_path / "py" / "snapshots" / f"step-{step:07d}.h5",
                                model=lambda: WithLoss(scenario), loss=lambda m, batch: m(*batch),
                                write=False).to_dict()
    for key in ("verdict", "category"):
        assert py_replay[key] == cpp_replay[key], key
    print(f"{scenario}: step {step}: {births[0][1]}; verdict {py_replay['verdict']}, category "
          f"{py_replay['category']}, fp32 modules {py_replay['replay']['precision_bisection']}")
    assert py_replay["capture"]["first_birth"]["module"] == cpp_replay["capture"]["first_birth"]["module"]
    assert py_replay["replay"]["precision_bisection"] == cpp_replay["replay"]["precision_bisection"]
