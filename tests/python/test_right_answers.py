"""Right answers on the shapes of models people train: an additive -inf mask
buffer (LLaMA-style attention on torch 1.x), a loss in the root's own forward
after blocks that read buffers (nanoGPT), a finite loss that jumps a
thousandfold, the way to the replay of a Python snapshot, the replay as an
object, and defaults that do not punish a data fault."""
import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class MaskedAttention(nn.Module):
    """llama2.c's attention on torch 1.x: the causal mask is a buffer holding -inf above the diagonal."""

    def __init__(self, dim=16, seq=8):
        super().__init__()
        self.wq, self.wk, self.wv = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.register_buffer("mask", torch.triu(torch.full((1, seq, seq), float("-inf")), diagonal=1))

    def forward(self, x):
        scores = self.wq(x) @ self.wk(x).transpose(1, 2) / 4.0 + self.mask
        return F.softmax(scores.float(), dim=-1).type_as(x) @ self.wv(x)


class MaskedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([MaskedAttention(), MaskedAttention()])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x).mean(1)


def test_a_minus_inf_mask_buffer_trains_and_its_nan_sample_is_still_found(tmp_path):
    torch.manual_seed(0)
    model = MaskedNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", log=False)
    assert guard.health() == []
    for step in range(30):
        x, y = torch.randn(8, 8, 16), torch.randint(0, 4, (8,))
        if step == 12:
            x[3, 2, 5] = float("nan")
        result = guard.closure_step(lambda: F.cross_entropy(model(x), y), batch=(x, y))
        assert not result.stop, result.stop_reason
        assert result.counted == (step != 12), (step, result.first_birth)
    assert guard.applied_steps == 29
    assert guard.health() == []
    with torch.no_grad():
        model.layers[1].mask[0, 0, 0] = float("nan")  # a state gone sick outside any step
    assert guard.health() == ["buffer layers.1.mask"]


class Attention(nn.Module):
    """nanoGPT's attention before flash: a causal-mask buffer read on every forward."""

    def __init__(self, dim, seq):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        T, C = x.size(1), x.size(2)
        q, k, v = self.c_attn(x).split(C, dim=2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C)
        att = att.masked_fill(self.bias[:, :, :T, :T].squeeze(0) == 0, float("-inf"))
        return self.c_proj(F.softmax(att, dim=-1) @ v)


class Block(nn.Module):
    def __init__(self, dim, seq):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(dim), Attention(dim, seq)

    def forward(self, x):
        return x + self.attn(self.ln_1(x))


class GPT(nn.Module):
    """nanoGPT's layout: model(idx, targets) -> (logits, loss), the loss in the root's own forward."""

    def __init__(self, vocab=32, dim=16, seq=8, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, dim), wpe=nn.Embedding(seq, dim),
                                              h=nn.ModuleList([Block(dim, seq) for _ in range(layers)]),
                                              ln_f=nn.LayerNorm(dim)))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1)))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def gpt_loss(model, batch):
    return model(*batch)[1]


def test_a_loss_in_the_roots_forward_after_blocks_that_read_buffers_is_the_roots(tmp_path):
    torch.manual_seed(0)
    model = GPT()
    guard = nanscope.StepGuard(model, torch.optim.AdamW(model.parameters(), lr=1e-3), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    for step in range(4):
        idx, targets = torch.randint(0, 32, (4, 8)), torch.randint(0, 32, (4, 8))
        if step == 2:
            targets[:] = -1  # a padding-only batch: every target ignored, 0 / 0
        result = guard.closure_step(lambda: gpt_loss(model, (idx, targets)), batch=(idx, targets))
        assert result.counted == (step != 2)
    assert result.amp == "bf16", "a data fault is skipped, not punished with fp32 (fallback='auto' by default)"
    births = [line for line in open_events(guard, "first_birth")]
    assert births == ["nan at aten::cross_entropy_loss (forward) in module ''"], births
    report = nanscope.replay(guard.snapshots[0], model=GPT, loss=gpt_loss, write=False)
    assert report.first_birth.module == ""
    assert report.verdict == "data" and report.category == "all_targets_ignored"


def open_events(guard, kind):
    import h5py
    guard.flush()
    with h5py.File(guard.run_file, "r", libver="latest", swmr=True) as f:
        kinds = [k.decode() for k in f["/events/kind"][:]]
        texts = [t.decode() for t in f["/events/text"][:]]
    return [t for k, t in zip(kinds, texts) if k == kind]


def test_a_thousandfold_finite_loss_jump_warns_at_once(tmp_path):
    """word_language_model with clipping off: loss 7.8, then 6.7e11 (finite, applied), then NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=1e-3), run_dir=tmp_path / "run",
                               log=False)
    warned = {}
    for step in range(4):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        if step == 2:
            x = x * 1e5  # finite, and a loss some 1e10 times the first ones
        result = guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
        warned[step] = [w.split(":")[0] for w in result.warnings]
    assert warned[0] == warned[1] == [], warned
    assert "loss_jump" in warned[2], warned
    assert any(text.startswith("loss_jump") for text in open_events(guard, "warning"))


def test_the_report_of_a_python_run_says_how_to_replay_it(tmp_path, tool):
    torch.manual_seed(0)
    model = GPT()
    guard = nanscope.StepGuard(model, torch.optim.AdamW(model.parameters(), lr=1e-3), run_dir=tmp_path / "run",
                               log=False)
    idx, targets = torch.randint(0, 32, (4, 8)), torch.full((4, 8), -1)
    assert not guard.closure_step(lambda: gpt_loss(model, (idx, targets)), batch=(idx, targets)).counted
    guard.flush()
    snapshot = guard.snapshots[0]
    text = subprocess.run([tool("NANSCOPE_REPORT"), str(tmp_path / "run")], capture_output=True, text=True).stdout
    # The interpreter that trained, not the first python3 on PATH (pyenv, conda, a venv).
    assert f"{sys.executable} -m nanscope replay {snapshot} --model MODULE:FACTORY --loss MODULE:LOSS_FN" in text, text
    as_json = json.loads(subprocess.run([tool("NANSCOPE_REPORT"), str(tmp_path / "run"), "--json"],
                                        capture_output=True, text=True).stdout)
    assert as_json["runs"][0]["snapshots"][0]["replay_command"].startswith(f"{sys.executable} -m nanscope replay ")
    # nanscope-replay cannot rebuild a Python model, and says what can.
    stock = subprocess.run([tool("NANSCOPE_REPLAY"), snapshot, "--no-write"], capture_output=True, text=True)
    assert stock.returncode == 2
    assert f"{sys.executable} -m nanscope replay" in stock.stderr and ".hpp" not in stock.stderr, stock.stderr


def test_replay_returns_a_report_object_and_raises_on_bad_input(tmp_path):
    torch.manual_seed(0)
    model = MaskedNet()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=tmp_path / "run",
                               amp="bf16", log=False)
    x, y = torch.randn(8, 8, 16), torch.randint(0, 4, (8,))
    x[5] = float("inf")

    def loss(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1])

    assert not guard.closure_step(lambda: loss(model, (x, y)), batch=(x, y)).counted
    report = nanscope.replay(guard.snapshots[0], model=MaskedNet, loss=loss, write=False)
    assert isinstance(report, nanscope.ReplayReport)
    assert (report.step, report.verdict, report.category) == (0, "data", "nonfinite_input")
    assert report.first_birth.phase == "input" and report.first_birth.sample == 5
    assert report.reproduced and report.repeats == 3
    assert report.to_dict()["verdict"] == "data"
    assert "verdict:    data" in str(report)

    (tmp_path / "garbage.h5").write_bytes(b"not an hdf5 file")
    with pytest.raises(ValueError, match="bad snapshot"):
        nanscope.replay(tmp_path / "garbage.h5", model=MaskedNet, loss=loss)
    with pytest.raises(ValueError, match="no such file"):
        nanscope.replay(tmp_path / "missing.h5", model=MaskedNet, loss=loss)
    with pytest.raises(TypeError, match="model must be a function"):
        nanscope.replay(guard.snapshots[0], model=MaskedNet(), loss=loss)


def test_the_guard_says_its_fallback_and_an_fp32_run_is_not_told_it_falls_back_to_fp32(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "auto")
    assert "fallback auto" in nanscope_lines()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "whole",
                               config=nanscope.GuardConfig(fallback="whole"))
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    x[2, 0] = float("nan")  # the stock fallback fires on any non-finite step
    guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
    err = nanscope_lines()
    assert "fallback whole" in err
    assert "fallback to fp32" not in err and "LR x 0.5 (already fp32" in err, err


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _mlp_guard_counting_re_runs(tmp_path, config=None):
    """The MLP, its Adam and a bf16 guard whose loss function counts its calls (the re-runs) in `calls`."""
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    calls = []

    def loss_fn(m, batch):
        calls.append(1)
        return F.cross_entropy(m(batch[0]), batch[1])

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=loss_fn, config=config)
    return model, optimizer, guard, calls


def test_weights_an_update_made_nonfinite_are_named_as_the_birth_and_read_not_rerun(tmp_path):
    """An LR that is NaN for one step (a schedule's bug) turns finite gradients
    into NaN weights: that update is applied, and the next step fails. Its
    birth is no op of its own: the guard names the weights, re-runs nothing
    (the loss function is never called again), rolls back, and the replay of
    the snapshot says the same from the weights it loads."""
    model, optimizer, guard, calls = _mlp_guard_counting_re_runs(tmp_path, nanscope.GuardConfig(rollback_every=5))
    g = torch.Generator().manual_seed(1)
    results = []
    for step in range(14):
        x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
        with guard.autocast():
            loss = F.cross_entropy(model(x), y)
        guard.backward(loss, (x, y))
        optimizer.param_groups[0]["lr"] = float("nan") if step == 11 else 1e-3
        calls.clear()
        results.append(guard.step())
        optimizer.zero_grad(set_to_none=True)
        if step == 12:
            assert calls == [], "no re-run from weights that already hold the NaN"
    assert results[11].counted  # its gradients were finite: the update went in
    failed = results[12]
    assert not failed.counted
    assert failed.first_birth.startswith(
        "born before this step: its weights held NaN/Inf as it began (parameter 0.weight, parameter 0.bias, "
        "parameter 2.weight and 1 more)"), failed.first_birth
    assert failed.rolled_back_to == 9
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(r.counted for r in results[13:])
    guard.close()

    report = nanscope.replay(failed.snapshot, _mlp, lambda m, b: F.cross_entropy(m(b[0]), b[1]), write=False)
    assert (report.verdict, report.category) == ("model_or_data", "nonfinite_weights")
    assert report.nonfinite_weights == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert report.to_dict()["replay"]["nonfinite_weights"] == report.nonfinite_weights
    assert report.repeats == 0  # read from the weights, not re-run
    assert "GuardConfig(doom_search=True)" in report.suggestion


def _watched_steps(guard, model, optimizer, batches, loss_of):
    """The watched loop over (x, y) batches: one result per step."""
    results = []
    for x, y in batches:
        with guard.autocast():
            loss = loss_of(model(x), y)
        guard.backward(loss, (x, y))
        results.append(guard.step())
        optimizer.zero_grad(set_to_none=True)
    return results


def _batches(steps, x_shape, y_of, plant_at, row, col, value, dtype=torch.float32):
    """Seeded (x, y) batches; step `plant_at`'s x holds `value` at [row, col]."""
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x, y = torch.randn(*x_shape, generator=g).to(dtype), y_of(g)
        if step == plant_at:
            x[row, col] = value
        yield x, y


def _batch_norm_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def test_a_nan_in_the_batch_is_the_birth_as_the_batch_was_at_its_backward(tmp_path):
    """The guard looks at a batch only once its step failed. A NaN pixel in
    row 5 of step 3's batch is that step's birth, named from the batch as it
    was at its backward (the loop cleans its tensor in place after the
    backward: the guard's kept copy still holds the NaN), found read by its
    one forensic re-run (the loss function called once again). A clean step
    with a NaN in a part of the batch its loss never reads counts as any
    clean step."""
    model, optimizer, guard, calls = _mlp_guard_counting_re_runs(tmp_path)
    g = torch.Generator().manual_seed(2)
    results = []
    for step in range(6):
        x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
        unread = torch.zeros(32, 3)  # carried in the batch, never read by the loss
        if step == 1:
            unread[7, 0] = float("nan")
        if step == 3:
            x[5, 2] = float("nan")
        with guard.autocast():
            loss = F.cross_entropy(model(x), y)
        guard.backward(loss, (x, y, unread))
        x.nan_to_num_(0.0)  # the loop's own clean-up, after the backward
        calls.clear()
        results.append(guard.step())
        optimizer.zero_grad(set_to_none=True)
        if step == 3:
            assert len(calls) == 1, "one re-run, which says the step read the batch's NaN"
    assert [r.counted for r in results] == [True, True, True, False, True, True]
    assert results[3].first_birth == "nan at input '[0]' (input) in module '', batch row 5", results[3].first_birth
    guard.close()


def test_a_buffer_an_op_wrote_inf_into_is_born_there_and_its_sample_found(tmp_path):
    """One sample far out of range (a corrupt record): BatchNorm's batch variance
    overflows, so its running_var goes Inf while its output, the loss and the
    gradients stay finite. The guard names the op that wrote the Inf (its
    re-run sees the buffer), skips the step as a data fault with its sample,
    and the replay of the snapshot reproduces it and finds the same sample,
    as C++ does."""
    model = _batch_norm_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(m, batch):
        return F.mse_loss(m(batch[0]), batch[1])

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=loss_fn)
    # 1e30 squared is past float's range on every machine.
    batches = _batches(4, (16, 4), lambda g: torch.randn(16, 1, generator=g), 2, 5, 1, 1e30)
    results = _watched_steps(guard, model, optimizer, batches, F.mse_loss)
    failed = results[2]
    assert [r.counted for r in results] == [True, True, False, True]
    assert failed.first_birth.startswith("inf at aten::batch_norm (forward) in module '1'"), failed.first_birth
    assert failed.remedy == "data", failed.remedy
    assert all(torch.isfinite(b).all() for b in model.buffers())
    guard.close()

    report = nanscope.replay(failed.snapshot, _batch_norm_mlp, loss_fn, write=False)
    assert report.reproduced_count == report.repeats > 0
    assert (report.verdict, report.category) == ("data", "overflow")  # out of the batch's range, as in the run
    assert report.rows == [5]


def _mlp_of(width=32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))


def _classes(g):
    return torch.randint(0, 4, (16,), generator=g)


def test_a_sample_whose_loss_is_huge_is_found_by_the_row_search_at_the_loops_weight(tmp_path):
    """One sample of 1e38 (a corrupt record) makes the loss 1e35, finite, and
    the gradients' norm overflow. The watched loop backpropagated that loss
    halved (its own weighting): the re-runs weigh each loss as the loop did,
    a weight read once on the whole batch, so the re-run without the sample
    is finite and the step is a data skip naming it, in the guard and in the
    replay (reading the weight off each re-run's own loss scaled the re-run
    without the sample by 1e35 and called every row innocent)."""
    model = _mlp_of()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1])

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=loss_fn)
    batches = _batches(4, (16, 8), _classes, 2, 4, 0, 1e38)
    results = _watched_steps(guard, model, optimizer, batches, lambda out, y: F.cross_entropy(out, y) * 0.5)
    failed = results[2]
    assert [r.counted for r in results] == [True, True, False, True]
    assert math.isfinite(failed.loss) and failed.loss > 1e30, failed.loss
    assert failed.remedy == "data", (failed.remedy, failed.first_birth)
    assert guard.amp == "bf16"  # no fallback
    guard.close()

    report = nanscope.replay(failed.snapshot, _mlp_of, loss_fn, write=False)
    assert report.rows == [4], report


def test_a_model_of_its_own_bf16_weights_keeps_them_through_the_fallback(tmp_path):
    """A model trained in bf16 itself (model.to(torch.bfloat16), as a fine-tune
    loads one) and fed bf16 batches: the whole-model fallback keeps its weights
    bf16 and is the LR cut. Widened to float32, the loop's next bf16 batch
    would raise (mat1 and mat2 must have the same dtype), and its memory double."""
    model = _mlp_of().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]).float(), b[1]),
                               config=nanscope.GuardConfig(fallback="whole"))
    batches = _batches(5, (16, 8), _classes, 2, 3, 1, float("nan"), dtype=torch.bfloat16)
    results = _watched_steps(guard, model, optimizer, batches, lambda out, y: F.cross_entropy(out.float(), y))
    assert [r.counted for r in results] == [True, True, False, True, True]
    assert results[2].fell_back
    assert guard.lr_multiplier == 0.5
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(s.dtype == torch.bfloat16 for state in optimizer.state.values() for s in state.values()
               if torch.is_tensor(s) and s.is_floating_point() and s.dim() > 0)
    guard.close()


class _GapNet(nn.Module):
    """A linear classifier plus 1e-3 / ((m + 1e-3) - m), m each row's largest
    |x|: in bfloat16 the 1e-3 is lost next to m >= 0.25 (the spacing there is
    2^-9 or more) and the quotient is 1/0; in float32 it is about 1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        top = x.abs().amax(1, keepdim=True)
        return self.head(x) + 1e-3 / ((top + 1e-3) - top)


def test_a_model_of_its_own_bf16_weights_is_re_run_in_fp32_only_when_widened(tmp_path):
    """A model whose own weights are bf16 computes in bf16 with autocast off
    too: the guard's diagnosis claims no fp32 re-run for it (the words used
    to be "non-finite with autocast off too", read as fp32's), and the replay
    widens its weights and batch to float32 for the fp32 re-run, where the
    step is finite: precision, not "non-finite in fp32 too". The weights are
    bf16 again after the replay."""
    model = _GapNet().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]).float(), b[1])
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=loss_fn, config=nanscope.GuardConfig(fallback="auto"))
    g = torch.Generator().manual_seed(1)
    batches = []
    for step in range(4):
        x = 0.01 * torch.randn(16, 8, generator=g)
        if step == 2:
            x[:, 0] = 2.0  # every row's m: 2 + 1e-3 is 2 in bfloat16
        batches.append((x.to(torch.bfloat16), _classes(g)))
    results = _watched_steps(guard, model, optimizer, batches, lambda out, y: F.cross_entropy(out.float(), y))
    assert [r.skipped for r in results] == [False, False, True, False]
    assert "aten::reciprocal" in results[2].first_birth or "aten::div" in results[2].first_birth
    (remedy,) = open_events(guard, "remedy")
    assert "non-finite in the model's own bfloat16 weights (no fp32 re-run" in remedy, remedy
    assert "autocast off" not in remedy
    snapshot = results[2].snapshot
    guard.close()

    built = []

    def factory():
        built.append(_GapNet().to(torch.bfloat16))
        return built[-1]
    report = nanscope.replay(snapshot, factory, loss_fn, write=False)
    text = str(report)
    assert report.verdict == "precision", text
    assert "re-run in fp32:   finite (its bfloat16 weights widened to float32)" in text
    assert "re-run at bf16:   non-finite in 3 of 3" in text
    # Widened under the step's own bf16 autocast, the gap's ops run in float32: finite, so autocast stays.
    assert "re-run widened:   finite at bf16 with its weights in float32" in text
    assert "finite under its bf16 autocast too" in report.suggestion, report.suggestion
    assert all(p.dtype == torch.bfloat16 for p in built[0].parameters())
    assert report.to_dict()["replay"]["widened_weights"] == "bfloat16"


class _SquareNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h * h)


def test_a_float16_model_that_overflows_its_own_range_is_told_so_not_fp32s(tmp_path):
    """A model loaded in float16 trained with autocast off: an activation past
    65504 is float16's overflow. The guard's lines name float16 (they said
    "at fp32"), and the replay, whose fp32 re-run used to run the float16
    weights again and conclude "exceed the range of fp32", widens them and
    finds the step finite."""
    try:
        _SquareNet().half()(torch.ones(1, 8, dtype=torch.float16))
    except RuntimeError:
        pytest.skip("this torch has no float16 matmul on the CPU")
    model = _SquareNet().half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]).float(), b[1])
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=loss_fn, config=nanscope.GuardConfig(fallback="auto"))
    batches = [(x.half(), y) for x, y in _batches(4, (16, 8), _classes, 2, slice(None), slice(None), 1000.0)]
    with torch.no_grad():  # the planted step's activations: float16's overflow, far inside float32's range
        h = model.a.float()(batches[2][0].float())
        model.a.half()
    assert 65504 * 4 < (h * h).max() < 1e30
    results = _watched_steps(guard, model, optimizer, batches, lambda out, y: F.cross_entropy(out.float(), y))
    assert [r.skipped for r in results] == [False, False, True, False]
    assert open_events(guard, "skip") == ["non-finite loss at float16; optimizer step skipped"]
    (remedy,) = open_events(guard, "remedy")
    assert "non-finite in the model's own float16 weights (no fp32 re-run" in remedy, remedy
    snapshot = results[2].snapshot
    guard.close()

    report = nanscope.replay(snapshot, lambda: _SquareNet().half(), loss_fn, write=False)
    assert report.verdict == "precision", str(report)
    assert report.widened_weights == "float16"
    assert "range of fp16" in report.suggestion and "range of fp32" not in report.suggestion, report.suggestion


def test_a_module_of_bf16_weights_asked_for_in_fp32_is_refused_with_how_to_widen_it(tmp_path):
    """fp32_modules naming a module whose weights are bf16: autocast off
    inside it still computes in bf16, and the float32 inputs an fp32 module
    takes did not match its weights (the loop's forward raised "mat1 and mat2
    must have the same dtype"). The guard refuses as it is made, saying how to
    widen the module; widened, the module runs in fp32 inside the loop's bf16."""
    model = _mlp_of().to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = nanscope.GuardConfig(fp32_modules=["2"])
    with pytest.raises(ValueError, match=r"module '2' holds bfloat16 weights \(2\.weight\).*"
                                         r"model\.get_submodule\('2'\)\.float\(\)"):
        nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", config=config)
    assert not (tmp_path / "run" / "run.h5").exists()
    model.get_submodule("2").float()
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False, config=config,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]).float(), b[1]))
    batches = _batches(2, (16, 8), _classes, -1, 0, 0, 0.0, dtype=torch.bfloat16)
    results = _watched_steps(guard, model, optimizer, batches, F.cross_entropy)
    assert [r.counted for r in results] == [True, True]
    guard.close()
