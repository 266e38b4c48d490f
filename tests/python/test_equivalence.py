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


class Root(nn.Module):  # parameter-free: named only by where it sits
    def forward(self, x):
        return torch.sqrt(x)


class Net(nn.Module):
    def __init__(self, log_of_activation: bool):
        super().__init__()
        self.pre = Root()
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 3)
        self.log_of_activation = log_of_activation

    def forward(self, x):
        h = self.act(self.fc1(self.pre(x)))
        if self.log_of_activation:
            h = torch.log(h)
        return self.fc2(h)


class WithLoss(nn.Module):
    """nanscope-train's TorchScript contract: forward(inputs, targets) is the loss."""

    def __init__(self, log_of_activation: bool):
        super().__init__()
        self.net = Net(log_of_activation)

    def forward(self, inputs, targets):
        return F.cross_entropy(self.net(inputs), targets)


BATCH, STEPS = 8, 5


def make_data(path, bad_row):
    torch.manual_seed(3)
    inputs = torch.rand(64, 6) + 0.1
    if bad_row is not None:
        inputs[bad_row, 2] = -1.0  # sqrt of a negative: NaN, inside the model
    targets = torch.randint(0, 3, (64,))
    with h5py.File(path, "w") as f:
        f["inputs"] = inputs.numpy()
        f["targets"] = targets.numpy()
    return inputs, targets


SCENARIOS = {
    # name: (log of the activation, the row with a negative input)
    "sqrt_of_a_negative_input": (False, 21),
    "log_of_an_activation": (True, None),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_python_and_nanscope_train_find_the_same_birth(tmp_path, tool, capfd, scenario):
    log_of_activation, bad_row = SCENARIOS[scenario]
    inputs, targets = make_data(tmp_path / "data.h5", bad_row)
    torch.manual_seed(0)
    model = WithLoss(log_of_activation)
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
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "py", amp="bf16", clip=1.0, warn=False,
                               log=False)
    births = []
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        x, y = inputs[rows], targets[rows]
        result = guard.step(lambda: model(x, y), batch=(x, y))
        if result.first_birth:
            births.append((step, result.first_birth))
    guard.flush()

    cpp_births = [(e["step"], e["text"]) for e in cpp["events"] if e["kind"] == "first_birth"]
    assert births and births[0] == cpp_births[0], (births, cpp_births)
    expected = "nan at aten::sqrt (forward) in module 'net.pre', batch row 5" if bad_row else \
        "at aten::log (forward) in module 'net'"
    assert expected in births[0][1]

    # Replay: nanscope-replay on the C++ snapshot, nanscope.replay on the Python one.
    step = births[0][0]
    cpp_replay = json.loads(subprocess.run([tool("NANSCOPE_REPLAY"), str(tmp_path / "cpp" / "snapshots" /
                                                                        f"step-{step:07d}.h5"), "--json",
                                            "--no-write"], check=True, capture_output=True, text=True).stdout)
    capfd.readouterr()
    code = nanscope.replay(tmp_path / "py" / "snapshots" / f"step-{step:07d}.h5",
                           model=lambda: WithLoss(log_of_activation), loss=lambda m, batch: m(*batch), json=True,
                           write=False)
    py_replay = json.loads(capfd.readouterr().out)
    assert code == 0
    for key in ("verdict", "category"):
        assert py_replay[key] == cpp_replay[key], key
    assert py_replay["capture"]["first_birth"]["module"] == cpp_replay["capture"]["first_birth"]["module"]
