"""The watched form: loops as their authors wrote them (GradScaler's calls,
gradient accumulation, dict batches, (seq, batch) data, a hand-set LR, a
manual update rule), each with a planted fault found at the right op, module,
micro-batch and row, and replayed to the right verdict."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class Normalise(nn.Module):
    """A hand-made normalisation: 0 / 0 for an all-zero sample."""

    def forward(self, x):
        return x / x.abs().sum(-1, keepdim=True)


class TinyGPT(nn.Module):
    """nanoGPT's contract: model(idx, targets) -> (logits, loss)."""

    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.norm = Normalise()
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.lm_head(self.norm(self.wte(idx)))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_loss(model, batch):
    return model(*batch)[1]


BAD_TOKEN = 15  # its embedding row is zero: a sample holding it divides 0 by 0


def token_batch(generator, rows=4, bad_row=None):
    idx = torch.randint(0, BAD_TOKEN, (rows, 6), generator=generator)
    if bad_row is not None:
        idx[bad_row, 2] = BAD_TOKEN
    return idx, torch.randint(0, BAD_TOKEN, (rows, 6), generator=generator)


def zero_bad_token(model):
    with torch.no_grad():
        model.wte.weight[BAD_TOKEN] = 0


def run_nanogpt_loop(run_dir, bad=None, steps=5, accumulation=4, fallback="auto"):
    """nanoGPT's train.py loop: the LR set by hand each iteration, the next
    batch fetched between forward and backward, the loss divided by the
    accumulation steps, GradScaler's calls on the guard."""
    torch.manual_seed(0)
    model = TinyGPT()
    zero_bad_token(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", loss_fn=nanogpt_loss, log=False,
                                config=nanscope.GuardConfig(fallback=fallback))
    ctx = scaler.autocast()
    generator = torch.Generator().manual_seed(1)
    X, Y = token_batch(generator)
    results = []
    for it in range(steps):
        lr = 1e-3 * (it + 1) / steps
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for micro_step in range(accumulation):
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / accumulation
            nxt = it * accumulation + micro_step + 1
            X, Y = token_batch(generator, bad_row=bad[2] if bad and nxt == bad[0] * accumulation + bad[1] else None)
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        results.append((scaler.step(optimizer), lr))
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scaler, results


def test_a_nanogpt_loop_keeps_its_lines_and_the_birth_names_micro_batch_and_row(tmp_path):
    # Micro-batch 2 of step 3, row 1 holds the bad token.
    model, optimizer, guard, results = run_nanogpt_loop(tmp_path / "run", bad=(3, 2, 1))
    skipped = [i for i, (r, _) in enumerate(results) if not r.counted]
    assert skipped == [3]
    failed = results[3][0]
    assert failed.first_birth == "nan at aten::div (forward) in module 'norm', micro-batch 2, batch row 1"
    assert failed.remedy == "model_or_data"  # the replay's verdict too: the norm's 0 / 0 on an ordinary row
    assert guard.applied_steps == 4
    # The snapshot keeps the failing micro-batch as it was; replay and the row
    # search stay inside it.
    report = nanscope.replay(failed.snapshot, model=TinyGPT, loss=nanogpt_loss, write=False)
    assert report.verdict == "model_or_data"
    assert report.category == "div_by_zero"
    assert report.first_birth.micro_batch == 2
    assert report.rows == [1]


def test_a_clean_accumulating_loop_matches_plain_pytorch(tmp_path):
    """The guard changes nothing on clean steps: the same weights as the loop without it."""
    model, _, _, results = run_nanogpt_loop(tmp_path / "run", steps=3)
    assert all(r.counted for r, _ in results)
    torch.manual_seed(0)
    plain = TinyGPT()
    zero_bad_token(plain)
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    X, Y = token_batch(generator)
    for it in range(3):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3 * (it + 1) / 3
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = plain(X, Y)
            X, Y = token_batch(generator)
            (loss / 4).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_unscale_returns_the_norm_a_clip_would_take_so_the_clip_need_not_take_it_again(tmp_path):
    """guard.unscale_() returns the step's grad norm: the one
    clip_grad_norm_ returns on the same gradients, to the bit. Where torch has
    clip_grads_with_norm_, clipping with it leaves the gradients and the
    weights the plain loop's (clip_grad_norm_), to the bit."""
    def trained(guarded):
        torch.manual_seed(0)
        model = TinyGPT()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False) if guarded else None
        generator = torch.Generator().manual_seed(1)
        norms = []
        for _ in range(3):
            X, Y = token_batch(generator)
            loss = model(X, Y)[1] * 50  # norms well over the clip's 1.0: the clip acts
            if guarded:
                guard.backward(loss, (X, Y))
                norm = guard.unscale_()
                reference = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
                assert norm.dim() == 0 and torch.equal(norm, reference), (norm, reference)
                if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
                    torch.nn.utils.clip_grads_with_norm_(list(model.parameters()), 1.0, norm)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                assert guard.step().counted
            else:
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            norms.append(float(norm))
        return model, norms
    guarded, guarded_norms = trained(True)
    plain, plain_norms = trained(False)
    assert min(plain_norms) > 1.0
    assert guarded_norms == plain_norms
    for a, b in zip(guarded.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_the_fallbacks_lr_cut_survives_an_lr_set_by_hand(tmp_path):
    # 'whole': the first non-finite step switches to fp32 and cuts the LR.
    model, optimizer, guard, results = run_nanogpt_loop(tmp_path / "run", bad=(1, 0, 2), fallback="whole")
    assert not results[1][0].counted and guard.amp == "fp32"
    for result, hand_set in results[2:]:
        assert result.counted
        assert result.lr == pytest.approx(hand_set * 0.5)  # the update ran with the cut
    assert optimizer.param_groups[0]["lr"] == pytest.approx(results[-1][1])  # the group keeps the loop's LR
    assert guard.lr_multiplier == 0.5


class TinyEncoder(nn.Module):
    """A Hugging Face-style model: forward(input_ids, attention_mask, labels) -> an output with .loss."""

    class Output:
        def __init__(self, loss, logits):
            self.loss, self.logits = loss, logits

    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.attn = nn.Linear(width, width)
        self.classifier = nn.Linear(width, 2)

    def forward(self, input_ids, attention_mask, labels):
        h = self.embed(input_ids)
        scores = self.attn(h) @ h.transpose(1, 2)
        scores = scores.masked_fill(attention_mask[:, None, :] == 0, float("-inf"))
        h = torch.softmax(scores, -1) @ h  # a fully masked row: softmax over -inf only is 0/0
        logits = self.classifier(h.mean(1))
        return self.Output(F.cross_entropy(logits, labels), logits)


TORCH_1 = int(torch.__version__.split(".")[0]) < 2


@pytest.mark.parametrize("named", [True, pytest.param(False, marks=pytest.mark.skipif(
    TORCH_1, reason="torch 1.x forward pre-hooks do not see keyword arguments"))])
def test_a_dict_batch_called_as_model_kwargs_is_kept_and_handed_back(tmp_path, named):
    torch.manual_seed(0)
    model = TinyEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    seen = []

    def loss_fn(m, batch):
        seen.append(sorted(batch))
        return m(**batch).loss

    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", loss_fn=loss_fn, log=False)
    results = []
    for step in range(4):
        batch = {"input_ids": torch.randint(0, 16, (4, 5)), "attention_mask": torch.ones(4, 5, dtype=torch.long),
                 "labels": torch.randint(0, 2, (4,)), "return_dict": True}
        if step == 2:
            batch["attention_mask"][3] = 0
        batch = {k: v for k, v in batch.items() if k != "return_dict"}
        outputs = model(**batch)
        guard.backward(outputs.loss, batch if named else None)  # else the model call's keyword arguments
        results.append(guard.step(optimizer))
        scheduler.step()
        optimizer.zero_grad()
    assert [r.counted for r in results] == [True, True, False, True]
    # The softmax over a fully masked row, in the root's own forward.
    assert results[2].first_birth == "nan at aten::softmax (forward) in module '', batch row 3"
    seen.clear()
    report = nanscope.replay(results[2].snapshot, model=TinyEncoder, loss=loss_fn, write=False)
    assert seen and seen[0] == ["attention_mask", "input_ids", "labels"]
    assert report.verdict == "model_or_data"
    assert report.rows == [3]


class WordModel(nn.Module):
    """word_language_model's RNN: (seq, batch) data, the hidden state carried across batches."""

    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.encoder = nn.Embedding(vocab, width)
        self.norm = Normalise()
        self.rnn = nn.LSTM(width, width)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, data, hidden):
        output, hidden = self.rnn(self.norm(self.encoder(data)), hidden)
        return self.decoder(output), hidden

    def init_hidden(self, batch):
        return (torch.zeros(1, batch, 8), torch.zeros(1, batch, 8))


def word_loss(model, batch):
    data, targets, hidden = batch
    output, _ = model(data, hidden)
    return F.cross_entropy(output.view(-1, 16), targets)


def test_torch_1_asks_for_a_micro_batch_its_hooks_cannot_see(tmp_path):
    model = TinyEncoder()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run",
                               loss_fn=lambda m, b: m(**b).loss, log=False)
    batch = {"input_ids": torch.randint(0, 16, (4, 5)), "attention_mask": torch.ones(4, 5, dtype=torch.long),
             "labels": torch.randint(0, 2, (4,))}
    loss = model(**batch).loss
    if TORCH_1:
        with pytest.raises(TypeError, match="name the micro-batch"):
            guard.backward(loss)
    else:
        guard.backward(loss)
        assert guard.step().counted


def test_a_watched_model_can_still_be_saved_and_copied(tmp_path):
    """torch.save(model) and copy.deepcopy (an EMA, a reference model) of a
    model the guard watches: the copy runs its own weights and is no model of
    the guard's."""
    import copy
    model, _, guard, _ = run_nanogpt_loop(tmp_path / "run", steps=1)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)  # a whole model, as word_language_model saves it
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.bias.add_(1.0)
    X, Y = token_batch(torch.Generator().manual_seed(5))
    twin_logits, loaded_logits = twin(X, Y)[0], loaded(X, Y)[0]
    assert not guard._guard.step_open  # the copies' calls (gradients on) opened no step of the guard's
    with torch.no_grad():
        logits = model(X, Y)[0]
    assert not torch.equal(twin_logits, logits)
    assert torch.equal(loaded_logits, logits)


def test_a_manual_update_loop_with_carried_state_and_seq_batch_rows(tmp_path):
    torch.manual_seed(0)
    model = WordModel()
    with torch.no_grad():
        model.encoder.weight[BAD_TOKEN] = 0
    guard = nanscope.StepGuard(model, None, run_dir=tmp_path / "run", loss_fn=word_loss, row_dim=1, log=False)
    lr = 0.5
    hidden = model.init_hidden(4)
    results = []
    for step in range(4):
        data = torch.randint(0, BAD_TOKEN, (6, 4))  # (seq, batch): column 2 is one sample
        if step == 2:
            data[3, 2] = BAD_TOKEN
        targets = torch.randint(0, BAD_TOKEN, (6 * 4,))
        model.zero_grad()
        hidden = tuple(h.detach() for h in hidden)
        batch = (data, targets, hidden)
        output, hidden = model(data, hidden)
        loss = F.cross_entropy(output.view(-1, 16), targets)
        guard.backward(loss, batch)
        before = [p.detach().clone() for p in model.parameters()]
        result = guard.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        if not result.counted:
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))  # the update added nothing
            hidden = model.init_hidden(4)  # the loop's own state went non-finite with the step
        results.append(result)
    assert [r.counted for r in results] == [True, True, False, True]
    assert results[2].first_birth == "nan at aten::div (forward) in module 'norm', batch row 2"
    report = nanscope.replay(results[2].snapshot, model=WordModel, loss=word_loss, write=False)
    assert report.verdict == "model_or_data"
    assert report.category == "div_by_zero"


def test_update_puts_back_what_a_loops_own_rule_changed_on_a_skipped_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Normalise())
    guard = nanscope.StepGuard(model, None, run_dir=tmp_path / "run",
                               loss_fn=lambda m, b: m(b).sum(), log=False)
    x = torch.zeros(2, 4)
    with torch.no_grad():
        model[0].bias.zero_()
    before = [p.detach().clone() for p in model.parameters()]
    guard.backward(model(x).sum(), x)
    assert not guard.step().counted
    for p in model.parameters():
        p.data.mul_(0.9)  # weight decay, applied by the loop whatever the step said
    guard.update()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_a_manual_update_after_a_step_that_stops_the_run_adds_nothing(tmp_path):
    # A weight went non-finite with no rollback state yet: the run is dead. A
    # loop that applies its own rule without looking at result.stop must add
    # nothing (zero gradients), not crash on a missing one.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    guard = nanscope.StepGuard(model, None, run_dir=tmp_path / "run", loss_fn=lambda m, b: m(b).sum(), log=False)
    with torch.no_grad():
        model[0].weight[3] = float("inf")
    tokens = torch.tensor([1, 3, 5])
    guard.backward(model(tokens).sum(), tokens)
    result = guard.step()
    assert result.stop and not result.counted, result
    for p in model.parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0
        p.data.add_(p.grad, alpha=-0.1)


def test_a_closed_guard_lets_go_of_the_loops_model(tmp_path):
    # A loop destroys its process group after closing the guard: the model (a
    # DistributedDataParallel's reducer uses that group) must go when the loop
    # drops it, by reference counting alone, not at some later collection.
    import weakref
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Normalise())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", loss_fn=lambda m, b: m(b).sum(), log=False)
    x = torch.randn(2, 4)
    with guard.autocast():
        loss = model(x).sum()
    guard.scale(loss).backward()
    assert guard.step(optimizer).counted
    guard.close()
    alive = weakref.ref(model)
    del model, optimizer, loss
    assert alive() is None, "the closed guard still holds the loop's model"
    with pytest.raises(ValueError, match="closed"):
        guard.autocast()
    with pytest.raises(ValueError, match="closed"):
        guard.update()


def test_two_optimizers_each_with_its_guard(tmp_path):
    """A GAN-style loop: each model and optimizer has its guard; a NaN in one
    loss skips that update only."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 1), Normalise())
    opt_g, opt_d = torch.optim.Adam(gen.parameters()), torch.optim.Adam(disc.parameters())
    guard_d = nanscope.StepGuard(disc, opt_d, run_dir=tmp_path / "d", log=False,
                                 loss_fn=lambda m, b: F.softplus(-m(b)).mean())
    guard_g = nanscope.StepGuard(gen, opt_g, run_dir=tmp_path / "g", log=False,
                                 loss_fn=lambda m, b: F.softplus(-disc(m(b))).mean())
    real = torch.randn(8, 4)
    disc.zero_grad()
    guard_d.backward(F.softplus(-disc(real)).mean(), real)
    assert guard_d.step(opt_d).counted
    noise = torch.randn(8, 4)
    noise[5] = float("nan")
    gen.zero_grad()
    guard_g.backward(F.softplus(-disc(gen(noise))).mean(), noise)
    result = guard_g.step(opt_g)
    assert not result.counted
    assert result.first_birth == "nan at input (input) in module '', batch row 5"


def test_watched_form_errors_are_python_exceptions(tmp_path):
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", log=False)
    with pytest.raises(RuntimeError, match="no backward through the guard"):
        guard.step(optimizer)
    with pytest.raises(TypeError, match="loss as a tensor"):
        guard.scale(1.0)
    with pytest.raises(ValueError, match="optimizer it was built with"):
        guard.step(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="batch must hold tensors"):
        guard.scale(torch.ones((), requires_grad=True), batch=3)
    # Out of order, as GradScaler refuses it: a second unscale_(), a closure step inside a watched one.
    X, Y = token_batch(torch.Generator().manual_seed(0))
    guard.backward(model(X, Y)[1], (X, Y))
    guard.unscale_()
    with pytest.raises(RuntimeError, match="already called in this step"):
        guard.unscale_()
    with pytest.raises(RuntimeError, match="a watched step is open"):
        guard.closure_step(lambda: model(X, Y)[1], batch=(X, Y))
    assert guard.step(optimizer).counted, "the step in order still runs"
    manual = nanscope.StepGuard(model, None, run_dir=tmp_path / "manual", log=False)
    with pytest.raises(TypeError, match="no optimizer"):
        manual.closure_step(lambda: model(*token_batch(torch.Generator()))[1], batch=torch.zeros(1))


def test_a_loss_function_that_cannot_run_the_step_again_says_why(tmp_path):
    """word_language_model's natural mistake: the loss function takes the
    hidden state from the loop's variable, which the forward has replaced by
    its own output, whose graph the step's backward already freed."""
    torch.manual_seed(0)
    model = WordModel()
    with torch.no_grad():
        model.encoder.weight[BAD_TOKEN] = 0
    state = {"hidden": model.init_hidden(4)}

    def loss_from_the_loops_variable(m, batch):
        data, targets = batch
        output, _ = m(data, state["hidden"])
        return F.cross_entropy(output.view(-1, 16), targets)

    guard = nanscope.StepGuard(model, None, run_dir=tmp_path / "run", loss_fn=loss_from_the_loops_variable,
                               row_dim=1, log=False)
    for step in range(2):
        data = torch.randint(0, BAD_TOKEN, (6, 4))
        targets = torch.randint(0, BAD_TOKEN, (24,))
        hidden = tuple(h.detach() for h in state["hidden"])  # repackage_hidden
        output, state["hidden"] = model(data, hidden)
        loss = F.cross_entropy(output.view(-1, 16), targets)
        if step == 0:
            guard.backward(loss, (data, targets))
            assert guard.step().counted
    # The loop's own arithmetic poisons the loss; the re-run through the loss
    # function reaches into the freed graph of the step before.
    guard.backward(loss * float("nan"), (data, targets))
    result = guard.step()
    assert not result.counted
    assert "cannot run the step again" in result.first_birth
    assert "put the state the step began with, detached, in its batch" in result.first_birth
    assert "transient" not in result.first_birth


def test_fp32_modules_run_in_fp32_inside_the_loops_own_forward(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dtypes = []
    model.lm_head.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", loss_fn=nanogpt_loss, log=False,
                               config=nanscope.GuardConfig(fp32_modules=["lm_head"]))
    X, Y = token_batch(torch.Generator().manual_seed(2))
    for _ in range(2):
        with guard.autocast():
            _, loss = model(X, Y)
        guard.scale(loss).backward()
        assert guard.step(optimizer).counted
    assert dtypes == [torch.float32, torch.float32], dtypes  # under bf16 autocast: the guard's fp32 region


def test_a_calls_version_counters_are_read_positional_then_keyword_and_move_with_in_place_writes():
    """What tells the watched form that a loop refilled its batch between the
    model call and the backward: each tensor's version counter, in the call's
    order, other arguments passed over."""
    from nanscope import _nanscope
    x, y, w = torch.zeros(2), torch.zeros(3), nn.Parameter(torch.zeros(1))

    def versions():
        return _nanscope.tensor_versions((x, 3, y), {"mask": None, "w": w})
    before = versions()
    assert before == (x._version, y._version, w._version)
    y.add_(1)
    with torch.no_grad():
        w.mul_(2)
        w.mul_(2)
    assert [now - then for now, then in zip(versions(), before)] == [0, 1, 2]


OWN_NAN_EXIT = '''
import math, sys
import torch, torch.nn as nn
import nanscope

class Detector(nn.Module):  # returns a dict of losses, as torchvision's detection models do
    def __init__(self):
        super().__init__()
        self.backbone, self.head = nn.Linear(4, 4), nn.Linear(4, 1)
    def forward(self, x, y):
        return {"loss_box": ((self.head(torch.log(self.backbone(x))) - y) ** 2).mean()}

torch.manual_seed(0)
model = Detector()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
guard = nanscope.StepGuard(model, optimizer, run_dir=sys.argv[1], amp="fp32", log=False,
                           loss_fn=lambda m, b: sum(m(*b).values()))
with torch.no_grad():
    model.backbone.bias.fill_(5.0)
for step in range(5):
    x, y = torch.rand(8, 4), torch.randn(8, 1)
    if step == 3:
        with torch.no_grad():
            model.backbone.bias[1] = -50.0  # the log's input goes negative
    losses = sum(model(x, y).values())
    if not math.isfinite(losses.item()):  # torchvision's train_one_epoch
        print(f"Loss is {losses.item()}, stopping training")
        sys.exit(1)
    guard.backward(losses)
    guard.step()
'''


def test_a_loop_that_exits_on_its_own_nan_check_still_gets_that_steps_birth_snapshot_and_row(tmp_path):
    """torchvision's detection reference ends the run with sys.exit(1) on a
    non-finite loss, before the guard's backward: at the interpreter's exit
    the guard runs that step from the model's last call, skipped, so the run
    keeps its birth, snapshot and row."""
    import os
    import subprocess
    import sys
    script = tmp_path / "own_exit.py"
    script.write_text(OWN_NAN_EXIT)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)), timeout=300)
    assert run.returncode == 1 and "stopping training" in run.stdout, run.stdout + run.stderr
    with nanscope.open_run(tmp_path / "run") as f:
        n = f["/steps/step"].shape[0]
        steps, skipped = list(f["/steps/step"][:n]), list(f["/steps/skipped"][:n])
        events = [(int(s), k.decode(), t.decode()) for s, k, t in
                  zip(f["/events/step"][:], f["/events/kind"][:], f["/events/text"][:])]
    assert steps == [0, 1, 2, 3] and skipped == [0, 0, 0, 1], (steps, skipped)
    assert (3, "first_birth", "nan at aten::log (forward) in module ''") in events, events
    assert list((tmp_path / "run" / "snapshots").glob("*.h5")), "the step's snapshot"


# --- A loss over nothing: a micro-batch whose every label is ignored.

MARKED = 16  # a token the data never draws: a batch holding it gets the loop's own 0 / 0 of a constant


class Tagger(nn.Module):
    """A token tagger with dropout: the mean cross-entropy over the labels
    not ignored (-100), the loss of every Transformers token classifier. A
    micro-batch whose every label is -100 has a NaN loss (0 / 0) and exactly
    zero gradients; so has one holding the MARKED token, from a division."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(MARKED + 1, 8)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 3)

    def forward(self, idx, labels):
        logits = self.head(self.drop(self.embed(idx)))
        loss = F.cross_entropy(logits.view(-1, 3), labels.view(-1))
        if (idx == MARKED).any():
            loss = loss + torch.zeros(()) / torch.zeros(())
        return loss


def tagged_batch(generator, empty):
    idx, labels = torch.randint(0, 16, (4, 6), generator=generator), torch.randint(0, 3, (4, 6), generator=generator)
    return idx, labels.fill_(-100) if empty else labels


def run_tagger_loop(run_dir, empty, steps, accumulation, guarded):
    """A hand loop under bf16 autocast with accumulation and a clip, guarded
    in GradScaler's place or plain; micro-batch (step, k) in `empty` has no label."""
    torch.manual_seed(0)
    model = Tagger()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", loss_fn=lambda m, b: m(*b),
                               config=nanscope.GuardConfig(fallback="auto")) if guarded else None
    generator = torch.Generator().manual_seed(1)
    results = []
    for step in range(steps):
        for k in range(accumulation):
            idx, labels = tagged_batch(generator, (step, k) in empty)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, labels) / accumulation
            (guard.scale(loss) if guard else loss).backward()
        if guard:
            guard.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if guard:
            results.append(guard.step(optimizer))
            guard.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, guard, results


def run_events(run_dir):
    import h5py
    with h5py.File(run_dir / "run.h5", "r") as f:
        return [(int(s), k.decode().rstrip("\0"), t.decode()) for s, k, t in
                zip(f["/events/step"][:], f["/events/kind"][:], f["/events/text"][:])]


def test_a_micro_batch_whose_every_label_is_ignored_adds_nothing_and_the_update_goes_on_as_plain_pytorchs(
        tmp_path, nanscope_lines):
    """Step 1's micro-batch 2 of 4 has no label: its loss is NaN and its
    gradients exactly zero. The plain loop's update is the other three's, and
    so is the guard's, to the bit; dropout's draws included."""
    empty = {(1, 2)}
    model, guard, results = run_tagger_loop(tmp_path / "run", empty, 3, 4, guarded=True)
    plain, _, _ = run_tagger_loop(None, empty, 3, 4, guarded=False)
    assert [r.counted for r in results] == [True, True, True], nanscope_lines()
    assert guard.skipped_steps == 0 and guard.fallbacks == 0 and guard.amp == "bf16"
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b), "not the plain loop's update"
    guard.close()
    events = run_events(tmp_path / "run")
    assert [(s, k) for s, k, _ in events] == [(1, "empty_loss")], events
    assert events[0][2] == ("micro-batch 2 of 4 left out: loss nan, a mean over no target (aten::cross_entropy_loss "
                            "counted none), gradients exactly zero; the update went on with the other 3, as a plain "
                            "loop's"), events[0][2]


def test_only_a_mean_over_no_target_is_left_out(tmp_path, nanscope_lines):
    """Step 1 has no label in any micro-batch: nothing is left to learn from,
    and it is a failed step, as a one-batch step without one is (its birth
    named). Step 2's micro-batch 1 adds the loop's own 0 / 0 of a constant:
    NaN with exactly zero gradients too, but not a mean over no target: a
    failed step naming that division."""
    empty = {(1, 0), (1, 1)}
    torch.manual_seed(0)
    model = Tagger()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", loss_fn=lambda m, b: m(*b),
                               config=nanscope.GuardConfig(fallback="auto"))
    generator = torch.Generator().manual_seed(1)
    results = []
    for step in range(4):
        for k in range(2):
            idx, labels = tagged_batch(generator, (step, k) in empty)
            if (step, k) == (2, 1):
                idx[0, 0] = MARKED
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, labels) / 2
            guard.scale(loss).backward()
        results.append(guard.step(optimizer))
        guard.update()
        optimizer.zero_grad(set_to_none=True)
    assert [r.counted for r in results] == [True, False, False, True], nanscope_lines()
    assert results[1].first_birth.startswith("nan at aten::cross_entropy_loss (forward)"), results[1].first_birth
    assert results[2].first_birth.startswith("nan at aten::div (forward)"), results[2].first_birth
    guard.close()
    assert "empty_loss" not in {k for _, k, _ in run_events(tmp_path / "run")}


@pytest.mark.parametrize("amp,under_autocast,told", [("bf16", False, True), ("bf16", True, False),
                                                     ("fp32", False, False)])
def test_a_forward_outside_the_guards_autocast_is_told_once(tmp_path, nanscope_lines, amp, under_autocast, told):
    """A watched loop that leaves its forward outside autocast computes in
    fp32 while the guard says bf16: said once, on the first step, with the
    Python spelling of the fix; under guard.autocast(), or at fp32, nothing."""
    import contextlib
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path), amp=amp,
                               loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]))
    for _ in range(3):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        with guard.autocast() if under_autocast else contextlib.nullcontext():
            loss = F.mse_loss(model(x), y)
        guard.scale(loss, (x, y)).backward()
        assert guard.step(optimizer).counted
        guard.update()
        optimizer.zero_grad()
    guard.close()
    lines = [line for line in nanscope_lines().splitlines() if "outside autocast" in line]
    assert len(lines) == (1 if told else 0), lines
    if told:
        assert "step 0: the loss's matrix products ran in fp32" in lines[0]
        assert "`with guard.autocast():`" in lines[0]
