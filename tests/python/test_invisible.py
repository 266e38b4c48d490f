"""Invisible until it matters: a guarded loop runs as the plain loop would,
except the skipped update, and its record survives however the loop ends.
Each loop is shaped like the public one it came from (nanoGPT's draws from
the global generator, DCGAN's refilled label and sample calls, two guards,
word_language_model's carried hidden state and manual update)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope

BAD_TOKEN = 15  # its embedding row is zero: a sample holding it divides 0 by 0


class Normalise(nn.Module):
    def forward(self, x):
        return x / x.abs().sum(-1, keepdim=True)


class DropoutGPT(nn.Module):
    """nanoGPT's contract, model(idx, targets) -> (logits, loss), with dropout:
    its masks come from the global generator, as the batches do."""

    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(0.2)
        self.norm = Normalise()
        self.lm_head = nn.Linear(width, vocab)
        with torch.no_grad():
            self.wte.weight[BAD_TOKEN] = 0

    def forward(self, idx, targets):
        logits = self.lm_head(self.norm(self.drop(self.wte(idx))))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def get_batch(poison_row=None):
    """nanoGPT's get_batch: torch.randint on the global generator."""
    x = torch.randint(0, BAD_TOKEN, (4, 6))
    y = torch.randint(0, BAD_TOKEN, (4, 6))
    if poison_row is not None:
        x[poison_row, 2] = BAD_TOKEN
    return x, y


def nanogpt_loop(guarded, bad_iteration=3, bad_micro=1, iterations=7, accumulation=3):
    """nanoGPT's train.py: prefetch between forward and backward; with
    `guarded` False, the plain loop that drops the bad iteration's update by
    hand (the reference a guarded loop must equal bit for bit)."""
    torch.manual_seed(0)
    model = DropoutGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = (nanscope.StepGuard(model, optimizer, run_dir=guarded, amp="fp32", log=False, loss_fn=lambda m, b: m(*b)[1],
                                config=nanscope.GuardConfig(fallback="off")) if guarded else None)
    drawn = []
    X, Y = get_batch()
    results = []
    for it in range(iterations):
        for micro in range(accumulation):
            logits, loss = model(X, Y)
            loss = loss / accumulation
            nxt = it * accumulation + micro + 1
            X, Y = get_batch(poison_row=2 if nxt == bad_iteration * accumulation + bad_micro else None)
            drawn.append(X.sum().item())
            (guard.scale(loss) if guard else loss).backward()
        if guard:
            results.append(guard.step(optimizer))
            guard.update()
        elif it != bad_iteration:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if guard:
        guard.close()
    return model, drawn, results


def test_after_a_skip_every_draw_and_weight_is_the_plain_loop_that_dropped_that_update(tmp_path):
    model, drawn, results = nanogpt_loop(str(tmp_path / "run"))
    reference, drawn_plain, _ = nanogpt_loop(None)
    assert [r.skipped for r in results] == [False, False, False, True, False, False, False]
    # The forensic re-run happened (the birth is inside the model) and was named.
    assert "aten::div" in results[3].first_birth and "micro-batch 1" in results[3].first_birth
    assert "batch row 2" in results[3].first_birth
    # The batches drawn after the skip are the plain loop's: the generator was put back.
    assert drawn == drawn_plain
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_a_refilled_target_buffer_is_rerun_as_it_was_at_its_backward(tmp_path):
    """A loop that refills its target tensor in place after each backward (a
    reused buffer, DCGAN's label.fill_): a padding-only step (every target of
    both micro-batches ignored, a 0/0 cross-entropy; with one good
    micro-batch beside it would be left out) is named as the data's fault,
    never 'transient', and its snapshot holds the targets it was trained with."""
    torch.manual_seed(0)
    model = DropoutGPT()
    model.drop.p = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: m(*b)[1], config=nanscope.GuardConfig(fallback="auto"))
    X = torch.empty(4, 6, dtype=torch.long)
    Y = torch.empty(4, 6, dtype=torch.long)
    results = []
    for it in range(3):
        for micro in range(2):
            x, y = get_batch()
            if it == 1:
                y.fill_(-1)
            X.copy_(x)
            Y.copy_(y)
            _, loss = model(X, Y)
            guard.scale(loss / 2).backward()
        results.append(guard.step(optimizer))
        X.zero_()  # the buffers refilled before the next step (a staging buffer)
        Y.zero_()
    guard.close()
    assert [r.skipped for r in results] == [False, True, False]
    assert "micro-batch 0" in results[1].first_birth, results[1].first_birth
    assert results[1].remedy == "data"
    with h5py.File(results[1].snapshot, "r") as f:
        leaves = f["batch/leaves"] if "batch/leaves" in f else None
        targets = leaves["1"][()] if leaves is not None else f["batch/targets"][()]
    assert (targets == -1).all()


class StagedGPT(DropoutGPT):
    """Takes its batch from a staging buffer into tensors of its own (as
    .to(device) does), so the loop may refill the buffer before the backward."""

    def forward(self, idx, targets):
        return super().forward(idx.clone(), targets.clone())


def test_a_buffer_refilled_between_the_model_call_and_its_backward_is_said_never_transient(tmp_path):
    """A loop that prefetches into the buffer it called the model with, before
    the backward: the micro-batch the guard is given is no longer the
    forward's, and the birth line says so."""
    torch.manual_seed(0)
    model = StagedGPT()
    model.drop.p = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: m(*b)[1], config=nanscope.GuardConfig(fallback="off"))
    X, Y = (t.clone() for t in get_batch())
    results = []
    for it in range(3):
        for micro in range(2):
            _, loss = model(X, Y)
            x, y = get_batch(poison_row=1 if (it, micro) == (1, 0) else None)
            X.copy_(x)  # the next micro-batch, into the same buffers, before this one's backward
            Y.copy_(y)
            guard.scale(loss / 2).backward()
        results.append(guard.step(optimizer))
    guard.close()
    assert [r.skipped for r in results] == [False, True, False]
    # Both micro-batches were refilled; the re-run of the changed copies is said to be one.
    assert "the loop changed micro-batch 1 in place between its model call and backward" in results[1].first_birth
    assert "transient" not in results[1].first_birth


class RowNormalisingRegressor(nn.Module):
    """Each sample divided by its own magnitude: 0 / 0 for an all-zero row.
    It clones its input, as a model may (an inference tensor needs it)."""

    def __init__(self):
        super().__init__()
        self.norm = Normalise()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(self.norm(x.clone()))


def _regressor_guard(tmp_path):
    torch.manual_seed(0)
    model = RowNormalisingRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]),
                               config=nanscope.GuardConfig(fallback="off"))
    return model, guard


def _regressor_batch(zero_row=None, rows=5):
    x, y = torch.randn(rows, 4) + 2, torch.randn(rows, 1)
    if zero_row is not None:
        x[zero_row] = 0
    return x, y


def test_a_write_into_the_batch_after_its_backward_is_seen_and_later_steps_keep_a_copy(tmp_path):
    """The guard keeps a clean step's micro-batch as the loop's own tensors,
    no copy, and reads their version counters at step(). A loop that first
    writes into its batch after the backward at a failing step is told so in
    the birth line (the re-run saw the new values); from then on the guard
    keeps copies, so the next such step is re-run as its batch was at its
    backward."""
    model, guard = _regressor_guard(tmp_path)
    results = []
    for step in range(3):
        x, y = _regressor_batch(zero_row=3 if step > 0 else None)
        guard.backward(F.mse_loss(model(x), y), (x, y))
        if step > 0:
            x.fill_(1.0)  # the loop's own clean-up, after the backward: finite everywhere now
        results.append(guard.step())
    guard.close()
    assert [r.counted for r in results] == [True, False, False]
    assert results[1].first_birth == (
        "not reproduced on re-run, but the loop changed micro-batch 0 in place after its backward, which it had not "
        "done before: the re-run saw the new values (the guard keeps a copy of each micro-batch from now on)")
    assert results[2].first_birth == "nan at aten::div (forward) in module 'norm', batch row 3", results[2].first_birth


def test_a_refill_through_numpy_after_the_backward_is_seen_in_the_batchs_bytes(tmp_path):
    """A write that no version counter sees (a data loader filling its
    buffer through a numpy view, 6.4 KB of it): the guard reads a sample of
    the buffer's bytes again at step(), tells the failing step's re-run saw
    new values, and keeps copies from then on."""
    model, guard = _regressor_guard(tmp_path)
    X, Y = torch.empty(400, 4), torch.empty(400, 1)
    results = []
    for step in range(3):
        x, y = _regressor_batch(zero_row=3 if step > 0 else None, rows=400)
        X.copy_(x)
        Y.copy_(y)
        guard.backward(F.mse_loss(model(X), Y), (X, Y))
        if step > 0:
            X.numpy()[:] = _regressor_batch(rows=400)[0].numpy()  # the next batch, past the version counter
        results.append(guard.step())
    guard.close()
    assert [r.counted for r in results] == [True, False, False]
    assert results[1].first_birth.startswith(
        "not reproduced on re-run, but the loop changed micro-batch 0 in place after its backward"), results[1].first_birth
    assert results[2].first_birth == "nan at aten::div (forward) in module 'norm', batch row 3", results[2].first_birth


def test_an_inference_tensor_in_the_batch_is_kept_as_a_copy(tmp_path):
    """A batch made under torch.inference_mode() has no version counter to
    read, and takes in-place writes there: the guard copies it at every step.
    The loop overwrites its failing batch in inference mode after the
    backward; the re-run still sees the zero row the step trained on."""
    model, guard = _regressor_guard(tmp_path)
    results = []
    for step in range(3):
        x, y = _regressor_batch(zero_row=3 if step == 2 else None)
        with torch.inference_mode():
            x = x.clone()  # an inference tensor
        guard.backward(F.mse_loss(model(x), y), (x, y))
        with torch.inference_mode():
            x.fill_(1.0)
        results.append(guard.step())
    guard.close()
    assert [r.counted for r in results] == [True, True, False]
    assert results[2].first_birth == "nan at aten::div (forward) in module 'norm', batch row 3", results[2].first_birth


def test_an_input_that_requires_grad_keeps_the_gradient_its_own_backward_gave(tmp_path):
    """A loop that reads its input's gradient after the backward (an
    adversarial step, FGSM): the guard keeps such an input as a copy, so the
    forensic re-run's backward adds nothing to the loop's x.grad."""
    model, guard = _regressor_guard(tmp_path)
    results = []
    for step in range(3):
        x, y = _regressor_batch(zero_row=3 if step == 2 else None)
        x.requires_grad_(True)
        guard.backward(F.mse_loss(model(x), y), (x, y))
        given = x.grad.clone()
        results.append(guard.step())
        torch.testing.assert_close(x.grad, given, rtol=0, atol=0, equal_nan=True)
    guard.close()
    assert [r.counted for r in results] == [True, True, False]
    assert results[2].first_birth == "nan at aten::div (forward) in module 'norm', batch row 3", results[2].first_birth


class SampleCallGPT(DropoutGPT):
    pass


def test_a_model_call_between_steps_is_not_taken_for_the_micro_batch(tmp_path):
    """DCGAN calls netG(fixed_noise) for its sample images with gradients on,
    between steps: the micro-batch is the call whose output the loss used."""
    torch.manual_seed(0)
    model = SampleCallGPT()
    model.drop.p = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: (calls.append(b), m(*b)[1])[1],
                               config=nanscope.GuardConfig(fallback="off"))
    fixed = get_batch()
    results = []
    for it in range(4):
        X, Y = get_batch(poison_row=1 if it == 2 else None)
        poisoned = X if it == 2 else poisoned if it else None
        _, loss = model(X, Y)
        guard.backward(loss)
        results.append(guard.step(optimizer))
        model(*fixed)  # the sample images, gradients on, feeding no loss
    guard.close()
    assert [r.skipped for r in results] == [False, False, True, False]
    assert "aten::div" in results[2].first_birth and "batch row 1" in results[2].first_birth
    assert "transient" not in results[2].first_birth
    assert torch.equal(calls[0][0], poisoned)  # the re-run ran the training call


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 6))

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 1))

    def forward(self, x):
        return self.main(x).view(-1)


def test_two_guards_say_which_wrote_each_line(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    netG, netD = Generator(), Discriminator()
    optG = torch.optim.SGD(netG.parameters(), lr=0.01)
    optD = torch.optim.SGD(netD.parameters(), lr=0.01)
    gG = nanscope.StepGuard(netG, optG, run_dir=str(tmp_path / "G"), amp="fp32", model_name="G",
                            config=nanscope.GuardConfig(fallback="off"))
    gD = nanscope.StepGuard(netD, optD, run_dir=str(tmp_path / "D"), amp="fp32", model_name="D",
                            config=nanscope.GuardConfig(fallback="off"))
    for it in range(2):
        real = torch.randn(4, 6)
        if it == 1:
            real[0, 0] = float("nan")
        label = torch.ones(4)
        gD.backward(F.binary_cross_entropy_with_logits(netD(real), label), (real, label))
        gD.step(optD)
        fake = netG(torch.randn(4, 4))
        if it == 1:
            fake = fake * float("nan")
        gG.backward(F.binary_cross_entropy_with_logits(netD(fake), torch.ones(4)))
        gG.step(optG)
    lines = nanscope_lines().splitlines()
    assert any(line.startswith("[D] step 1:") for line in lines), lines
    assert any(line.startswith("[G] step 1:") for line in lines), lines
    gG.close()
    gD.close()


class WordRNN(nn.Module):
    """word_language_model's RNNModel: (seq, batch) data, a carried hidden
    state; token 11's embedding is zero, so a sample holding it divides 0 by 0."""

    def __init__(self, vocab=12, width=8):
        super().__init__()
        self.encoder = nn.Embedding(vocab, width)
        self.norm = Normalise()
        self.rnn = nn.RNN(width, width)
        self.decoder = nn.Linear(width, vocab)
        with torch.no_grad():
            self.encoder.weight[11] = 0

    def forward(self, data, hidden):
        output, hidden = self.rnn(self.norm(self.encoder(data)), hidden)
        return self.decoder(output), hidden


def word_loss(m, b):
    return nn.CrossEntropyLoss()(m(b[0], b[2])[0].view(-1, 12), b[1])


def word_language_model(run_dir, put_back, batches=8, bad_batch=3, counter=None, bad_token=False, **options):
    """word_language_model's main.py: the target flattened (targets.view(-1)),
    no optimizer (p.data.add_(p.grad, alpha=-lr)), the hidden state carried
    on; at `bad_batch` sample column 3 turns sick (its state, or a token)."""
    torch.manual_seed(0)
    model = WordRNN()
    criterion = nn.CrossEntropyLoss()

    def loss_fn(m, b):
        if counter is not None:
            counter.append(1)
        return word_loss(m, b)

    guard = nanscope.StepGuard(model, None, row_dim=1, run_dir=run_dir, amp="fp32", log=True, loss_fn=loss_fn,
                               config=nanscope.GuardConfig(fallback="auto", **options))
    hidden = torch.zeros(1, 5, 8)
    results = []
    for i in range(batches):
        data = torch.randint(0, 11, (7, 5))
        targets = torch.randint(0, 11, (7, 5)).view(-1)
        state = hidden.detach()
        if i == bad_batch and bad_token:
            data[4, 3] = 11
        elif i == bad_batch:
            state[:, 3] = float("nan")
        model.zero_grad()
        output, hidden = model(data, state)
        loss = criterion(output.view(-1, 12), targets)
        guard.backward(loss, (data, targets, state))
        result = guard.step()
        if put_back and result.skipped:  # docs/python.md's one line: a skipped step's state is not carried on
            hidden = torch.zeros(1, 5, 8)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1 * guard.lr_multiplier)
        results.append(result)
    guard.close()
    return results


def test_a_carried_state_put_back_on_a_skip_trains_on_and_costs_one_rerun(tmp_path):
    reruns = []
    results = word_language_model(str(tmp_path / "run"), put_back=True, counter=reruns)
    assert [r.skipped for r in results] == [False, False, False, True, False, False, False, False]
    assert "input" in results[3].first_birth and "batch row 3" in results[3].first_birth
    # One forensic re-run, which says the step read the non-finite input (a
    # leaf it never read would be no birth); none for the clean steps after.
    assert len(reruns) == 1
    assert results[3].remedy == "data"


def test_a_one_sample_fault_with_a_flattened_target_is_named_and_its_replay_names_the_row(tmp_path):
    results = word_language_model(str(tmp_path / "run"), put_back=True, bad_token=True)
    assert [r.skipped for r in results] == [False, False, False, True, False, False, False, False]
    assert "aten::div" in results[3].first_birth and "in module 'norm'" in results[3].first_birth
    # The norm's 0 / 0 on an ordinary token: the op's trigger; no LR cut for one sample.
    assert results[3].remedy == "model_or_data" and not results[3].fell_back
    report = nanscope.replay(results[3].snapshot, model=WordRNN, loss=word_loss, write=False)
    assert report.rows == [3] and report.no_row_found is None, report

    # A loss that cannot run the batch without a row says why the bisection found none.
    def whole_batch_only(m, b):
        assert b[0].size(1) == 5, "this loss needs all 5 samples"
        return word_loss(m, b)
    report = nanscope.replay(results[3].snapshot, model=WordRNN, loss=whole_batch_only, write=False)
    assert report.rows == [] and "failed on the batch without a row" in report.no_row_found, report.no_row_found
    assert "this loss needs all 5 samples" in report.no_row_found


def test_a_carried_non_finite_state_is_told_and_a_stopped_run_raises(tmp_path, nanscope_lines):
    with pytest.raises(nanscope.DeadRunError, match="stopped the run"):
        word_language_model(str(tmp_path / "run"), put_back=False, batches=40, rollback=False, max_nonfinite_run=5)
    err = nanscope_lines()
    assert "State carried across steps" in err and "micro-batch 0" in err
    assert err.count("State carried across steps") == 1


LOOP = """
import sys, time, torch, nanscope
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
guard = nanscope.StepGuard(model, optimizer, run_dir=sys.argv[1], amp="fp32", log=False)
how, steps = sys.argv[2], int(sys.argv[3])
for step in range(steps):
    guard.backward(model(torch.randn(4, 3)).pow(2).mean())
    guard.step(optimizer)
    optimizer.zero_grad()
    print(step, time.monotonic(), flush=True)  # the clock of the writer's 2 s (steady_clock)
    if how == "raise" and step == 4:
        raise RuntimeError("the loop's own error")
    if how in ("kill", "interrupt"):
        time.sleep(0.2)
"""


def run_rows(run_dir):
    with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:  # a plain reader: the file was closed
        return list(f["steps/step"][()])


@pytest.mark.parametrize("how, steps, rows", [("normal", 12, 12), ("raise", 40, 5)])
def test_every_row_is_written_and_the_file_closed_without_close(tmp_path, how, steps, rows):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), how, str(steps)], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"), timeout=120)
    assert (run.returncode != 0) == (how == "raise"), run.stderr
    assert run_rows(str(tmp_path / "run")) == list(range(rows))


def test_ctrl_c_and_sigkill_lose_at_most_the_last_two_seconds(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    for how, sig in (("interrupt", signal.SIGINT), ("kill", signal.SIGKILL)):
        run_dir = str(tmp_path / how)
        process = subprocess.Popen([sys.executable, str(script), run_dir, how, "1000"], stdout=subprocess.PIPE,
                                   text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        printed = []
        start = time.time()
        while len(printed) < 20 and time.time() - start < 60:
            printed.append(process.stdout.readline().split())
        process.send_signal(sig)
        printed += [line.split() for line in process.stdout.read().splitlines()]
        process.wait(timeout=60)
        steps_done = [int(s) for s, _ in printed]
        if sig == signal.SIGINT:  # KeyboardInterrupt: every row, the file closed
            rows = run_rows(run_dir)
            assert rows[:len(steps_done)] == steps_done and len(rows) - len(steps_done) <= 1
        else:
            # The writer's promise (format/run_file.hpp): a kill loses only rows
            # appended in the 2 s before the last row it appended, on the loop's
            # own clock; the test's clock at the kill says nothing about that (a
            # loaded machine that stalls both processes for half a second made
            # rows the writer had not yet had to flush look 2.5 s old). Row L-1
            # of the last printed step L was appended, after step L-2's line
            # and before its own: every row printed 2 s before step L-2's line
            # was appended 2 s before it, so it is on disk.
            assert len(printed) >= 3, printed
            before = float(printed[-3][1]) - 2
            old = [int(s) for s, t in printed if float(t) <= before]
            # A plain reader refuses the killed writer's file; nanscope.open_run opens it and clears the mark.
            with pytest.raises(OSError, match="already open for write"):
                h5py.File(os.path.join(run_dir, "run.h5"), "r")
            with nanscope.open_run(run_dir) as f:
                written = list(f["steps/step"][()])
            assert old, "the loop ran for more than 2 s before the kill"
            assert written[:len(old)] == old and len(written) >= len(old), (old, written)
            with h5py.File(os.path.join(run_dir, "run.h5"), "r") as f:  # plain readers too, now
                assert list(f["steps/step"][()]) == written


class Critic(nn.Module):
    """A DCGAN-shaped discriminator: its BatchNorm statistics are written by
    every call in train mode, the generator's phase included."""

    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 1))

    def forward(self, x):
        return self.main(x).view(-1)


class NormalisingCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(Normalise(), nn.Linear(6, 1))

    def forward(self, x):
        return self.main(x).view(-1)


bce = F.binary_cross_entropy_with_logits


def gan(tmp_path, netG, netD, critic_fallback="off"):
    """DCGAN's two models, two optimizers and a guard each, in fp32: the
    critic's loss_fn takes (images, labels); the generator's runs the critic."""
    optG = torch.optim.SGD(netG.parameters(), lr=0.01)
    optD = torch.optim.SGD(netD.parameters(), lr=0.01)
    gD = nanscope.StepGuard(netD, optD, run_dir=str(tmp_path / "D"), amp="fp32", log=False,
                            loss_fn=lambda m, b: bce(m(b[0]), b[1]),
                            config=nanscope.GuardConfig(fallback=critic_fallback))
    gG = nanscope.StepGuard(netG, optG, run_dir=str(tmp_path / "G"), amp="fp32", log=False,
                            loss_fn=lambda m, b: bce(netD(m(*b)), torch.ones(len(b[0]))),
                            config=nanscope.GuardConfig(fallback="off"))
    return netG, netD, optG, optD, gG, gD


def test_a_birth_in_another_model_says_so_and_borrows_no_path(tmp_path):
    """The generator's loss runs the critic: a 0/0 in the critic is named as
    outside the generator, never by a path of the generator's or of the
    critic's own guard."""
    torch.manual_seed(0)
    netG, netD, optG, optD, gG, gD = gan(tmp_path, nn.Sequential(nn.Linear(4, 6, bias=False)), NormalisingCritic())
    results = []
    for it in range(3):
        real = torch.randn(4, 6)
        gD.backward(bce(netD(real), torch.ones(4)), (real, torch.ones(4)))
        gD.step(optD)
        z = torch.randn(4, 4)
        if it == 1:
            z[2] = 0  # a bias-free generator makes a zero sample: the critic's norm divides 0 by 0
        gG.backward(bce(netD(netG(z)), torch.ones(4)))
        critic_then = {k: v.clone() for k, v in netD.state_dict().items()}
        results.append(gG.step(optG))
        if it == 1:
            critic_at_failure = critic_then
    gG.close()
    gD.close()
    assert [r.skipped for r in results] == [False, True, False]
    assert "in module '<not in the model> NormalisingCritic.main.0'" in results[1].first_birth
    assert "batch row 2" in results[1].first_birth

    # The generator's snapshot replays with the critic as it was at that step.
    def generator():
        return nn.Sequential(nn.Linear(4, 6, bias=False))
    critic = NormalisingCritic()
    with pytest.raises(ValueError, match="others=.*NormalisingCritic"):
        nanscope.replay(results[1].snapshot, model=generator, loss=lambda m, b: bce(critic(m(*b)), torch.ones(4)))
    report = nanscope.replay(results[1].snapshot, model=generator, others={"NormalisingCritic": critic},
                             loss=lambda m, b: bce(critic(m(*b)), torch.ones(len(b[0]))), write=False)
    for name, tensor in critic.state_dict().items():
        assert torch.equal(tensor, critic_at_failure[name]), name
    assert report.verdict == "model_or_data" and report.first_birth.module == "<not in the model> NormalisingCritic.main.0"
    assert report.rows == [2], report


def test_buffers_made_non_finite_by_another_models_phase_are_put_back_and_the_run_trains_on(tmp_path):
    # The generator's re-runs run the critic too: no call of the loop's, and its buffers left as found.
    torch.manual_seed(0)
    netG, netD, optG, optD, gG, gD = gan(tmp_path, nn.Sequential(nn.Linear(4, 6)), Critic(), critic_fallback="whole")
    results, generator_results = [], []
    for it in range(4):
        real, label = torch.randn(4, 6), torch.ones(4)
        gD.backward(bce(netD(real), label), (real, label))
        fake = netG(torch.randn(4, 4))
        label.fill_(0.0)
        gD.backward(bce(netD(fake.detach()), label), (fake.detach(), label))
        results.append(gD.step(optD))
        if it == 1:
            fake = fake * float("nan")  # a sick fake batch in the generator's phase
        gG.backward(bce(netD(fake), torch.ones(4)))  # the critic in train mode: its statistics go NaN
        generator_results.append(gG.step(optG))
    gG.close()
    gD.close()
    # The generator's re-run ran the critic's BatchNorm, whose statistics its
    # backward reads: they go back after the step, not before that backward.
    assert generator_results[1].skipped and "re-run failed" not in generator_results[1].first_birth
    assert [r.skipped for r in results] == [False, False, True, False]
    assert "already non-finite, written by 1 call(s)" in results[2].first_birth
    assert "fed none of its losses" in results[2].first_birth
    assert results[2].snapshot == ""  # nothing of this step's own to replay
    assert not results[2].fell_back
    assert torch.isfinite(netD.main[1].running_mean).all() and torch.isfinite(netD.main[1].running_var).all()


class CausalMix(nn.Module):
    """A causal attention-like mix: masked_fill(-inf) makes infinities on purpose."""

    def __init__(self, width=8):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.register_buffer("causal", torch.tril(torch.ones(6, 6)).bool())

    def forward(self, x):
        scores = (x @ x.transpose(-1, -2)).masked_fill(~self.causal, float("-inf"))
        return self.proj(scores.softmax(-1) @ x)


def test_a_fault_that_does_not_come_back_is_transient_though_a_mask_makes_infinities(tmp_path):
    """A NaN planted by a hook keyed on the loop's counters does not come back
    on the re-run: 'transient' and no fallback, whatever infinities a causal
    mask makes on the way."""
    torch.manual_seed(0)
    embed, mix, head = nn.Embedding(16, 8), CausalMix(), nn.Linear(8, 16)
    model = nn.Sequential(embed, mix, head)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = [0]  # the hook fires on the model's second call only: the re-run is the third

    def sick_once(module, inputs, output):
        calls[0] += 1
        return output * float("nan") if calls[0] == 2 else None
    mix.register_forward_hook(sick_once)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]).view(-1, 16), b[1].view(-1)),
                               config=nanscope.GuardConfig(fallback="auto"))
    results = []
    for it in range(3):
        x, y = get_batch()
        loss = F.cross_entropy(model(x).view(-1, 16), y.view(-1))
        guard.backward(loss, (x, y))
        results.append(guard.step(optimizer))
    guard.close()
    assert [r.skipped for r in results] == [False, True, False]
    assert results[1].first_birth == "not reproduced on re-run (transient)"
    assert results[1].remedy == "transient" and not results[1].fell_back


def test_an_op_in_a_modules_own_forward_hook_is_named_by_that_module(tmp_path):
    """A forward hook on a submodule (a clamp, a rescale, here a 0/0): its ops
    run after the module's forward returned, and belong to that module."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4)), nn.Linear(4, 1))
    inner = model[1][0]
    inner.register_forward_hook(lambda m, i, o: o / o.abs().sum(-1, keepdim=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: m(b[0]).pow(2).mean(), config=nanscope.GuardConfig(fallback="off"))
    with torch.no_grad():
        inner.weight.zero_()
        inner.bias.zero_()  # every sample's output is 0: the hook divides 0 by 0
    x = torch.randn(3, 4)
    guard.backward(model(x).pow(2).mean(), (x,))
    result = guard.step(optimizer)
    guard.close()
    assert not result.counted
    assert result.first_birth.startswith("nan at aten::div (forward) in module '1.0'"), result.first_birth
    assert len(inner._forward_hooks) == 1  # the closing hook nanscope added is gone


def test_the_first_steps_are_no_baseline_and_a_fallback_on_counted_spikes_says_so(tmp_path, nanscope_lines):
    """pytorch/examples' siamese network saturates its BCE at its second step
    (0.84, then 50 twice) and then trains well: the largest loss of one or two
    steps is no baseline for a spike, so no fallback. Loss spikes that persist
    later, with no saved state to go back to, bring the whole fallback; those
    steps were applied, and its line does not call them skipped. The offset
    moves the losses and leaves the gradients alone."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=True)
    offsets = {1: 60.0, 2: 60.0, 15: 1000.0, 16: 1000.0}
    results = []
    for step in range(18):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        offset = offsets.get(step, 0.0)
        results.append(guard.closure_step(lambda: F.mse_loss(model(x), y) + offset, batch=(x, y)))
    guard.close()
    assert all(r.counted for r in results), [r.counted for r in results]
    assert [s for s, r in enumerate(results) if r.fell_back] == [16]
    assert {r.amp for r in results[:17]} == {"bf16"} and results[17].amp == "fp32"
    # A line says which guard wrote it ("[Linear] ") once another guard has lived in this process.
    lines = [line.split("] ", 1)[-1] for line in nanscope_lines().splitlines() if not line.startswith("nanscope:")]
    assert lines == ["step 16: trouble on 2 steps in a row at bf16 -> fallback bf16 -> fp32, LR x 0.5"], lines


class SparseBag(nn.Module):
    """A bag of embeddings with sparse gradients (nn.Embedding(sparse=True), as
    recommenders and word2vec train them), its 0/0 for BAD_TOKEN's zero row."""

    def __init__(self, vocab=16, width=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, width, sparse=True)
        self.norm = Normalise()
        self.head = nn.Linear(width, vocab)
        with torch.no_grad():
            self.emb.weight[BAD_TOKEN] = 0

    def forward(self, idx):
        return self.head(self.norm(self.emb(idx)))


def sparse_loop(guarded, tmp_path, bad_step=3, steps=6):
    """A watched loop with its own clip over sparse and dense gradients; with
    `guarded` False, the plain loop that drops the bad step's update by hand."""
    torch.manual_seed(0)
    model = SparseBag()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    criterion = lambda logits, y: F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", log=False,
                               loss_fn=lambda m, b: criterion(m(b[0]), b[1])) if guarded else None
    norms, results = [], []
    for step in range(steps):
        x, y = get_batch(poison_row=1 if step == bad_step else None)
        if guarded:
            with guard.autocast():
                loss = criterion(model(x), y)
            guard.backward(loss, (x, y))
            norms.append(guard.unscale_())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            results.append(guard.step())
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = criterion(model(x), y)
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
            if step != bad_step:
                optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if guard:
        guard.close()
    return model, norms, results


def test_sparse_gradients_are_guarded_as_dense_ones_are(tmp_path):
    """nn.Embedding(sparse=True) gives a sparse gradient, which LibTorch 1.13's
    foreach kernels refuse: the guard takes its norm as clip_grad_norm_ does
    (bit for bit), skips the step a NaN is born in with its birth and row, and
    leaves the model equal to the plain loop without that update."""
    guarded, guarded_norms, results = sparse_loop(True, tmp_path)
    plain, plain_norms, _ = sparse_loop(False, tmp_path)
    assert [r.counted for r in results] == [True, True, True, False, True, True]
    assert results[3].first_birth.startswith("nan at aten::div (forward) in module 'norm'"), results[3].first_birth
    assert "batch row 1" in results[3].first_birth
    assert results[0].grad_norm > 0.1  # the clip acts
    for step in (0, 1, 2, 4, 5):
        assert torch.equal(guarded_norms[step], plain_norms[step]), step
    for (name, a), b in zip(guarded.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
