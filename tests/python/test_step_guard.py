"""nanscope.StepGuard around a Python loop: births named by named_modules()
paths on eager models, the skip as a transaction, the user's optimizer and
scheduler, the same files as the C++ side, and clear errors."""
import json
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class LogAct(nn.Module):
    """A parameter-free module: only a forward hook can name it."""

    def forward(self, x):
        return torch.log(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.log_act = LogAct()
        self.poison = None  # None, "functional" or "module"

    def forward(self, x):
        h = self.act(self.fc(x))
        if self.poison == "functional":
            h = torch.log(h)  # a functional call: belongs to the block
        elif self.poison == "module":
            h = self.log_act(h)
        return h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.blocks = nn.ModuleList([Block(), Block()])
        self.heads = nn.ModuleDict({"out": nn.Linear(8, 3)})

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.heads["out"](h)


def data(rows=16):
    torch.manual_seed(1)
    return torch.randn(rows, 4), torch.randint(0, 3, (rows,))


@pytest.mark.parametrize("poison, module", [("functional", "blocks.1"), ("module", "blocks.1.log_act")])
def test_the_birth_is_named_by_its_named_modules_path(tmp_path, poison, module):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", log=False,
                               config=nanscope.GuardConfig(fallback="whole"))
    x, y = data()
    for step in range(5):
        model.blocks[1].poison = poison if step == 3 else None
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        assert result.counted == (step != 3)
    assert result.amp == "fp32", "the stock fallback switched to fp32"
    assert guard.snapshots == [str(tmp_path / "run" / "snapshots" / "step-0000003.h5")]


def test_birth_text(tmp_path):
    torch.manual_seed(0)
    model = Net()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    x, y = data()
    model.blocks[1].poison = "module"
    result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    assert result.first_birth.startswith("nan at aten::log (forward) in module 'blocks.1.log_act'"), result
    assert not result.counted and not result.stop


def test_a_skip_is_a_transaction_for_weights_buffers_and_the_optimizer(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False,
                               config=nanscope.GuardConfig(fallback="off"))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer_before = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    bad = x.clone()
    bad[2, 1] = float("nan")
    result = guard.closure_step(lambda: F.mse_loss(model(bad), y), batch=(bad, y))
    assert not result.counted
    assert "1.running_mean" in result.restored
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], optimizer_before)
    assert result.first_birth == "nan at input (input) in module '', batch row 2"


def test_the_scheduler_keeps_the_fallbacks_lr_cut(tmp_path):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", log=False,
                               config=nanscope.GuardConfig(fallback="whole", lr_backoff=0.5))
    x, y = data()
    for step in range(4):
        model.blocks[0].poison = "functional" if step == 1 else None
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        scheduler.step()
    # The cut rides on each update; the groups keep the scheduler's LR.
    assert result.lr == pytest.approx(0.05)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert guard.lr_multiplier == 0.5


def test_keywords_that_are_gone_say_what_to_use_instead(tmp_path):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(TypeError, match="scheduler= is no keyword of the guard: it never touches your scheduler"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", scheduler=scheduler)
    for gone in ("print_report", "json"):
        with pytest.raises(TypeError, match=f"{gone}= is gone: print\\(report\\)"):
            nanscope.replay(tmp_path / "none.h5", Net, lambda m, b: m(b[0]).sum(), **{gone: True})


def test_is_enabled_says_whether_losses_are_scaled_as_gradscalers_does(tmp_path):
    model = Net()
    # fp16 autocast on the CPU needs torch 2.x (the 1.13 lane has none).
    amps = ("fp32", "bf16", "fp16") if int(torch.__version__.split(".")[0]) >= 2 else ("fp32", "bf16")
    for amp in amps:
        guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / amp,
                                   amp=amp, log=False)
        assert guard.is_enabled() is (amp == "fp16"), amp
        guard.close()


def test_tied_parameters_count_once(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 6)
            self.head = nn.Linear(6, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    torch.manual_seed(0)
    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False)
    tokens = torch.randint(0, 10, (8, 5))
    targets = torch.randint(0, 10, (8, 5))
    before = model.embed.weight.detach().clone()
    result = guard.closure_step(lambda: F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten()),
                        batch=(tokens, targets))
    assert result.counted
    reference = Tied()
    reference.embed.weight.data.copy_(before)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    F.cross_entropy(reference(tokens).flatten(0, 1), targets.flatten()).backward()
    ref_opt.step()
    assert torch.allclose(model.embed.weight, reference.embed.weight), "one tensor, stepped once"


def test_files_are_the_c_plus_plus_sides_and_the_snapshot_replays(tmp_path, tool, capfd):
    torch.manual_seed(0)
    model = Net()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    x, y = data()
    for step in range(3):
        model.blocks[1].poison = "module" if step == 1 else None
        guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    guard.flush()
    report = json.loads(subprocess.run([tool("NANSCOPE_REPORT"), str(tmp_path / "run"), "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    run = report["runs"][0]
    assert run["origin"] == "python"
    assert run["summary"]["skipped"] == 1

    def factory():
        net = Net()
        net.blocks[1].poison = "module"
        return net

    def loss(net, batch):
        inputs, targets = batch
        return F.cross_entropy(net(inputs), targets)

    report = nanscope.replay(tmp_path / "run" / "snapshots" / "step-0000001.h5", model=factory, loss=loss,
                             write=False)
    assert report.first_birth.module == "blocks.1.log_act"
    assert report.verdict == "model_or_data"
    assert report.category == "log_nonpositive"
    assert report.to_dict()["capture"]["first_birth"]["module"] == "blocks.1.log_act"


def test_the_guards_options_are_one_config_with_nanscope_trains_defaults_and_words(tmp_path):
    import dataclasses
    import inspect
    import h5py
    from nanscope._nanscope import guard_keyword_list
    declared = guard_keyword_list()
    own = inspect.signature(nanscope.StepGuard).parameters
    fields = {f.name: f for f in dataclasses.fields(nanscope.GuardConfig)}
    for option in declared:
        if option["name"] in ("run_dir", "amp"):  # every loop sets them: StepGuard's own keywords
            assert own[option["name"]].kind is inspect.Parameter.KEYWORD_ONLY
            assert option["name"] not in fields
            continue
        assert fields[option["name"]].default == option["default"], option["name"]
        assert fields[option["name"]].kw_only, option["name"]
        assert f"{option['name']}=" in nanscope.GuardConfig.__doc__
        assert option["name"] not in own, f"{option['name']} is declared once, in GuardConfig"
    # As GradScaler's few: the keywords a loop needs, and the config.
    assert len(own) <= 12, list(own)
    # Each option elsewhere says where it goes, as does a GradScaler keyword.
    with pytest.raises(TypeError, match=r"clip= is an option of nanscope.GuardConfig: nanscope.StepGuard\(\.\.\., "
                                        r"config=nanscope.GuardConfig\(clip=1.0\)\)"):
        nanscope.StepGuard(Net(), None, run_dir=tmp_path / "x", clip=1.0)
    with pytest.raises(TypeError, match="init_scale= is no keyword of the guard: the guard keeps fp16's loss scale"):
        nanscope.StepGuard(Net(), None, run_dir=tmp_path / "x", init_scale=2.0 ** 16)
    with pytest.raises(TypeError, match="config must be a nanscope.GuardConfig"):
        nanscope.StepGuard(Net(), None, run_dir=tmp_path / "x", config={"clip": 1.0})
    assert not (tmp_path / "x").exists()
    frozen = nanscope.GuardConfig(clip=1.0)
    assert dataclasses.replace(frozen, clip=0.5).clip == 0.5 and frozen.clip == 1.0
    assert frozen.given() == {"clip": 1.0}
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp=torch.bfloat16, log=False,
                               config=nanscope.GuardConfig(max_rollbacks=1, rollback_memory=64, capture="every-step", fp32_modules=("blocks.0",)))
    assert guard.amp == "bf16"
    guard.close()
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        config = {key: (value.decode() if isinstance(value, bytes) else str(value)) for key, value in f["config"].attrs.items()}
    assert {option["name"] for option in declared} <= set(config)
    assert (config["amp"], config["max_rollbacks"], config["rollback_memory"]) == ("bf16", "1", "64")
    assert (config["capture"], config["fp32_modules"], config["rollback"]) == ("every-step", "blocks.0", "on")
    # What Python's own flags and counts take: numpy's bool, a float that is a whole number, a bytes path.
    import numpy as np
    lenient = nanscope.StepGuard(model, optimizer, run_dir=bytes(tmp_path / "e"), log=False,
                                 config=nanscope.GuardConfig(warn=np.bool_(False), rollback_every=50 / 2))
    lenient.close()
    with h5py.File(tmp_path / "e" / "run.h5", "r") as f:
        assert f["config"].attrs["warn"] in ("off", b"off") and f["config"].attrs["rollback_every"] in ("25", b"25")
    with pytest.raises(TypeError, match="nanscope.GuardConfig: rollback_every must be an int, not 2.5"):
        nanscope.GuardConfig(rollback_every=2.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'rollbak'"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "a", rollbak=False)
    with pytest.raises(TypeError, match="max_rollbacks must be an int, not 1.5"):
        nanscope.GuardConfig(max_rollbacks=1.5)
    with pytest.raises(ValueError, match="rollback_every must be a positive whole number, not '0'"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "c", config=nanscope.GuardConfig(rollback_every=0))
    with pytest.raises(ValueError, match="act_absmax_every needs probe on"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "d",
                           config=nanscope.GuardConfig(probe=False, act_absmax_every=5))
    assert not (tmp_path / "b").exists() and not (tmp_path / "d").exists()


def test_bad_arguments_raise_python_errors(tmp_path):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="amp must be"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "a", amp="fp8")
    with pytest.raises(ValueError, match="fallback must be"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "b", config=nanscope.GuardConfig(fallback="sometimes"))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        nanscope.StepGuard("not a model", optimizer, run_dir=tmp_path / "c")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        nanscope.StepGuard(model, object(), run_dir=tmp_path / "d")
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "e", log=False)
    x, y = data()
    with pytest.raises(TypeError, match="batch must hold tensors"):
        guard.closure_step(lambda: F.cross_entropy(model(x), y), batch={"x": "no tensor"})
    with pytest.raises(TypeError, match="closure must be a function"):
        guard.closure_step(3, batch=(x, y))
    # The closure form's old spelling, step(closure, batch), says what to call instead.
    for old_spelling in (lambda: guard.step(lambda: F.cross_entropy(model(x), y), (x, y)),
                         lambda: guard.step(lambda: F.cross_entropy(model(x), y), batch=(x, y))):
        with pytest.raises(TypeError, match=r"guard.closure_step\(closure, batch\)"):
            old_spelling()
    with pytest.raises(TypeError, match="takes no arguments for optimizer.step"):
        guard.step(optimizer, closure=lambda: 1.0)
    with pytest.raises(Exception, match="must return the loss as a tensor"):
        guard.closure_step(lambda: 1.0, batch=(x, y))
    with pytest.raises(ZeroDivisionError):
        guard.closure_step(lambda: 1 / 0, batch=(x, y))
    # The interpreter and the guard are fine after all that.
    assert guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y)).counted


def test_python_m_nanscope_replay_names_a_bad_factory(tmp_path):
    result = subprocess.run(["/usr/bin/python3", "-m", "nanscope", "replay", str(tmp_path / "x.h5"), "--model",
                             "no_such_module:f", "--loss", "no_such_module:g"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "cannot load --model no_such_module:f" in result.stderr


def test_fallback_auto_puts_only_the_module_that_needs_it_in_fp32(tmp_path, bf16_cancellation_model):
    torch.manual_seed(0)
    model = bf16_cancellation_model()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=tmp_path / "run",
                               amp="bf16", log=False, config=nanscope.GuardConfig(fallback="auto"))
    x, y = torch.rand(8, 6), torch.randint(0, 3, (8,))
    first = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    assert not first.counted
    assert first.remedy == "fp32-modules", first
    assert guard.fp32_modules == ["cancel"]
    second = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
    assert second.counted and second.amp == "bf16", "the rest of the model stays in bf16"


def test_a_rollback_cuts_the_lr_of_the_optimizer_it_restored(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False,
                               config=nanscope.GuardConfig(fallback="off", lr_backoff=0.5))
    rolled_back = []
    for step in range(40):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step in (30, 31):  # NaN again on the step after a skip: the run goes back to a saved state
            x[0, 0] = float("nan")
        result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
        if result.rolled_back_to >= 0:
            rolled_back.append(result.rolled_back_to)
    assert rolled_back, "a rollback happened"
    # load_state_dict gave the optimizer new group dicts: they keep the loop's
    # LR, and the cut rides on each update made after the rollback.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert result.lr == pytest.approx(0.05)


def test_each_rollback_restores_the_saved_weights_and_optimizer_state_exactly(tmp_path):
    """Two rollbacks to the same kept state: both put back its weights and
    AdamW's moments exactly, so the kept copy is not the live state, and the
    training between them did not change it."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False,
                               config=nanscope.GuardConfig(fallback="off"))
    after = {}  # step -> (weights, optimizer state) after it
    restored = []
    for step in range(45):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step in (30, 31, 40, 41):  # NaN on two steps in a row: back to the state after step 24
            x[0, 0] = float("nan")
        result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
        weights = [p.detach().clone() for p in model.parameters()]
        state = {i: {k: v.clone() for k, v in slots.items()} for i, slots in optimizer.state_dict()["state"].items()}
        if result.rolled_back_to >= 0:
            restored.append((result.rolled_back_to, weights, state))
        else:
            after[step] = (weights, state)
    assert [r[0] for r in restored] == [24, 24], restored
    for to, weights, state in restored:
        kept_weights, kept_state = after[to]
        assert all(torch.equal(a, b) for a, b in zip(weights, kept_weights))
        assert state.keys() == kept_state.keys()
        for i in state:
            assert all(torch.equal(state[i][k], kept_state[i][k]) for k in kept_state[i]), (to, i)


def test_a_kept_state_written_into_the_memory_of_one_it_displaced_restores_exactly(tmp_path):
    """Two kept states, one every 5 steps: from the third on, each kept
    optimizer state is written into the memory of the one it displaces. Two
    rollbacks to such a state (no state is kept between them) both put back
    AdamW's moments exactly as they were after its step."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False,
                               config=nanscope.GuardConfig(fallback="off", rollback_every=5, rollback_states=2))
    after, restored = {}, []
    for step in range(60):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step in (47, 48, 52, 53):  # NaN on two steps in a row: a rollback
            x[0, 0] = float("nan")
        result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
        state = {i: {k: v.clone() for k, v in slots.items()} for i, slots in optimizer.state_dict()["state"].items()}
        if result.rolled_back_to >= 0:
            restored.append((result.rolled_back_to, state))
        else:
            after[step] = state
    assert [r[0] for r in restored] == [44, 44], [r[0] for r in restored]
    for to, state in restored:
        kept = after[to]
        assert state.keys() == kept.keys()
        for i in state:
            assert all(torch.equal(state[i][k], kept[i][k]) for k in kept[i]), (to, i)


def test_a_sick_optimizer_state_is_never_kept_for_a_rollback(tmp_path):
    """AdamW's second moment of one weight goes infinite between two steps
    (its update is 0 there, so the weights stay finite): the state after the
    next due step is refused, naming that slot, as a LibTorch optimizer's is."""
    import h5py
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False,
                               config=nanscope.GuardConfig(rollback_every=5))
    for step in range(12):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step == 7:
            optimizer.state[model.weight]["exp_avg_sq"][0, 1] = float("inf")
        assert guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y)).counted
    guard.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        events = [(int(s), k.decode(), t.decode()) for s, k, t in
                  zip(f["/events/step"][:], f["/events/kind"][:], f["/events/text"][:])]
    refused = [(s, t) for s, k, t in events if k == "save_refused"]
    assert refused == [(9, "rollback state after step 9 not kept: optimizer state weight/exp_avg_sq non-finite")], events


def test_a_buffer_the_forward_assigns_anew_is_the_one_the_guard_reads(tmp_path):
    """A buffer replaced by assignment (module.stat = tensor), not written in
    place, at every step: the guard reads the model's buffers as they are now,
    so the state after the step whose new buffer holds a NaN is not kept for a
    rollback, and the steps around it are."""
    import h5py

    class Assigning(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)
            self.register_buffer("stat", torch.zeros(1))
            self.value = 0.0

        def forward(self, x):
            self.stat = torch.full((1,), self.value)  # a new tensor under the buffer's name
            return self.lin(x)

    torch.manual_seed(0)
    model = Assigning()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=tmp_path / "run",
                               log=False, config=nanscope.GuardConfig(rollback_every=1))
    for step in range(5):
        model.value = float("nan") if step == 2 else float(step)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        assert guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y)).counted
    guard.close()
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        events = [(int(s), k.decode(), t.decode()) for s, k, t in
                  zip(f["/events/step"][:], f["/events/kind"][:], f["/events/text"][:])]
    refused = [(s, t) for s, k, t in events if k == "save_refused"]
    assert refused == [(2, "rollback state after step 2 not kept: buffer stat non-finite")], events


class _Wrapped(torch.Tensor):
    """A tensor subclass that keeps its values in another tensor, as DTensor
    keeps its local shard: its own memory holds nothing."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.size(), dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map
        unwrap = lambda t: t.elem if isinstance(t, _Wrapped) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: _Wrapped(t) if type(t) is torch.Tensor else t, out)


def test_a_batch_of_a_tensor_subclass_trains_and_its_nan_step_is_skipped(tmp_path):
    """The guard reads a plain CPU tensor's values in its memory; a subclass's
    (a DTensor's) are not there, and reading them there crashed the step's
    check of its batch. Such a batch trains, and the step whose batch holds a
    NaN is skipped, with the weights as they were."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)

    def loss_fn(m, batch):
        return F.mse_loss(m(batch[0].elem), batch[1])

    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               log=False, loss_fn=loss_fn)
    counted = []
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if step == 2:
            x[3, 1] = float("nan")
        batch = (_Wrapped(x), y)
        guard.backward(loss_fn(model, batch), batch)
        before = [p.detach().clone() for p in model.parameters()]
        counted.append(guard.step().counted)
        if step == 2:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert counted == [True, True, False, True]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_ctrl_c_in_the_closure_is_not_a_model_error(tmp_path):
    model = nn.Linear(4, 1)
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               log=False)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    calls = []

    def interrupted():
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guard.closure_step(interrupted, batch=(x, y))
    assert len(calls) == 1, "no forensic re-run of an interrupt"
    assert guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y)).counted
    guard.flush()
    assert guard.applied_steps == 1


def test_a_child_that_raised_inside_a_caught_forward_does_not_shift_the_names(tmp_path):
    class Flaky(nn.Module):
        def forward(self, x):
            raise ValueError("not today")

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.flaky = Flaky()
            self.fc = nn.Linear(4, 4)
            self.out = LogAct()

        def forward(self, x):
            try:
                x = self.flaky(x)
            except ValueError:
                pass
            return self.out(self.fc(x))

    torch.manual_seed(0)
    model = Parent()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               log=False)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
    assert result.first_birth.startswith("nan at aten::log (forward) in module 'out'"), result


def test_the_guard_is_a_pytorch_object_with_a_state_dict_and_a_with_form(tmp_path):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data()
    with nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "a", amp=torch.bfloat16, log=False,
                            config=nanscope.GuardConfig(fallback="whole")) as guard:
        assert guard.amp == "bf16"
        for step in range(4):
            model.blocks[0].poison = "functional" if step == 2 else None
            guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        state = guard.state_dict()
    assert state["amp"] == "fp32" and state["fallback_step"] == 2 and state["applied_steps"] == 3
    assert state["next_step"] == 4
    assert state["sentinel"]["finite_steps"] == 3 and "grad/mean" in state["sentinel"]
    with pytest.raises(ValueError, match="closed"):
        guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))

    # A new process: the model, the optimizer and the guard each from their state dicts.
    resumed_model = Net()
    resumed_model.load_state_dict(model.state_dict())
    resumed_optimizer = torch.optim.SGD(resumed_model.parameters(), lr=0.1)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    guard = nanscope.StepGuard(resumed_model, resumed_optimizer, run_dir=tmp_path / "b", amp="bf16", log=False)
    guard.load_state_dict(state)
    assert guard.amp == "fp32", "the fallback that had fired is in force again"
    assert guard.applied_steps == 3
    assert guard.state_dict()["sentinel"] == state["sentinel"], "the early warnings go on from their baselines"
    result = guard.closure_step(lambda: F.cross_entropy(resumed_model(x), y), batch=(x, y))
    assert result.counted and result.amp == "fp32"
    assert guard.state_dict()["next_step"] == 5
    assert guard.lr_multiplier == state["lr_multiplier"] == 0.5, "the fallback's LR cut is in the state"
    guard.close()
    guard.close()  # twice is fine

    # A state_dict from a nanscope before format 1.7 kept the rollbacks' cut
    # alone, as rollback_lr_multiplier: the fallback's is added back.
    old = dict(state, rollback_lr_multiplier=1.0)
    del old["lr_multiplier"]
    fresh = Net()
    guard = nanscope.StepGuard(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), run_dir=tmp_path / "c", amp="bf16",
                               log=False, config=nanscope.GuardConfig(lr_backoff=0.5))
    guard.load_state_dict(old)
    assert guard.lr_multiplier == 0.5 and guard.state_dict()["lr_multiplier"] == 0.5
    guard.close()


def test_options_are_keywords_and_amp_takes_a_dtype(tmp_path):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError):
        nanscope.StepGuard(model, optimizer, str(tmp_path / "run"))  # run_dir is keyword-only
    with pytest.raises(ValueError, match="amp must be"):
        nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp=torch.int8)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp=torch.float16, log=False)
    assert guard.amp == "fp16"


def test_a_snapshot_of_a_wrapped_model_replays_into_the_plain_models_factory(tmp_path):
    """DistributedDataParallel (and torch.compile) put the model under `module.` (`_orig_mod.`):
    the replay's factory may build the plain model all the same."""
    class Wrapper(nn.Module):  # names its parameters as DistributedDataParallel does
        def __init__(self, net):
            super().__init__()
            self.module = net

        def forward(self, x):
            return self.module(x)

    torch.manual_seed(0)
    wrapped = Wrapper(Net())
    guard = nanscope.StepGuard(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               log=False)
    x, y = data()
    x[4, 2] = float("nan")
    assert not guard.closure_step(lambda: F.cross_entropy(wrapped(x), y), batch=(x, y)).counted

    def loss(net, batch):
        return F.cross_entropy(net(batch[0]), batch[1])

    report = nanscope.replay(guard.snapshots[0], model=Net, loss=loss, write=False)
    assert report.verdict == "data" and report.first_birth.sample == 4


def test_the_loop_library_integrations_read_the_guard_through_one_door():
    """_trainer, _accelerate and _ignite read a StepGuard only through
    guard._integration(), never its private fields: the guard's fields can
    change without breaking them."""
    import ast
    import pathlib
    package = pathlib.Path(nanscope.__file__).parent
    reached = []
    for name in ("_trainer.py", "_accelerate.py", "_ignite.py"):
        tree = ast.parse((package / name).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr != "_integration"):
                continue
            owner = node.value
            owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if owner_name == "guard":
                reached.append(f"{name}:{node.lineno} guard.{node.attr}")
    assert reached == [], reached
