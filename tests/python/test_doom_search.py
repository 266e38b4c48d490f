"""doom_search=True: a NaN born on a harmless batch, d steps after the finite
update that made it inevitable. The guard replays the steps since its oldest
saved state leaving updates out, names the dooming step and its batch row,
blames no step for a failure of the batch's own, and with rollback on goes on
without that update only.

The planted fault, in a transformer and in an RNN: besides its classifier,
the model has a probe, a Poisson regression head on detached features
(log-rate out, F.poisson_nll_loss: exp(rate) - count * rate), trained only by
the rows that carry a count. At step P one row carries a glitched count (1e8,
finite): its update is applied, and it pushes the probe's weights so far that
the next counted row, d steps later, overflows exp(): the loss goes
non-finite on a harmless batch: the glitched sample's inputs come again (as in
the next epoch) with a plausible count, and so they do on every later step,
failing each unless the run goes on without that update. Nothing between P
and P + d uses the probe."""
import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope

B, T, FEATURES, D, CLASSES = 8, 6, 8, 32, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln = nn.LayerNorm(D)

    def forward(self, x):
        return self.ln(self.blocks(self.inp(x)))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEATURES, D, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class Net(nn.Module):
    def __init__(self, trunk):
        super().__init__()
        self.trunk = Transformer() if trunk == "transformer" else Recurrent()
        self.head = nn.Linear(D, CLASSES)
        self.probe = nn.Linear(D, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.head(h), self.probe(h.detach().mean(1)).squeeze(-1)


def loss_fn(model, batch):
    x, y, counts, counted = batch
    logits, log_rate = model(x)
    loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1))
    if counted.any():
        loss = loss + F.poisson_nll_loss(log_rate[counted], counts[counted], log_input=True)
    return loss


def batch_at(step, plan):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(B, T, FEATURES, generator=g)
    counts, counted = torch.poisson(torch.full((B,), 3.0), generator=g), torch.zeros(B, dtype=torch.bool)
    if step == plan.get("poison"):
        counts[3], counted[3] = 1e8, True  # a glitched count: finite
    if step == plan.get("spike"):
        counted[:] = True  # every row counts: the LR spike, not a row, does the harm
    if plan.get("trigger") is not None and step >= plan["trigger"]:
        # From here on the sample at row 3 of step `echo` comes again (the next
        # epoch), with a plausible count: harmless unless the probe was wrecked.
        x[5] = torch.randn(B, T, FEATURES, generator=torch.Generator().manual_seed(1000 + plan["echo"]))[3]
        counts[5], counted[5] = 3.0, True
    if step == plan.get("own_fault"):
        x[2] = 3e38  # the failing batch's own: its input projection overflows whatever the weights
    y = x[..., :CLASSES].argmax(-1)  # learnable: the final loss says how well a run recovered
    return x, y, counts, counted


def train(tmp_path, trunk, plan, steps, doom_search=True, rollback=True, lr=0.05):
    torch.manual_seed(0)
    model = Net(trunk)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="fp32", log=False, loss_fn=loss_fn,
                               config=nanscope.GuardConfig(warn=False, doom_search=doom_search, rollback=rollback, rollback_every=40, rollback_states=4))
    results = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * (1e3 if step == plan.get("spike") else 1.0)
        batch = batch_at(step, plan)
        results.append(guard.closure_step(lambda: loss_fn(model, batch), batch=batch))
    guard.close()
    return results


def failing(results):
    return next(r for r in results if not r.counted and not math.isfinite(r.loss) or r.doomed_by)


@pytest.mark.parametrize("trunk", ["transformer", "rnn"])
@pytest.mark.parametrize("d", [1, 10, 100])
def test_the_step_that_doomed_a_later_one_is_named_with_its_row(tmp_path, trunk, d):
    poison = 45
    plan = {"poison": poison, "trigger": poison + d, "echo": poison}
    results = train(tmp_path, trunk, plan, poison + d + 1, rollback=False)
    assert results[poison].counted and math.isfinite(results[poison].loss), "the poisoned update is finite, applied"
    assert all(r.counted for r in results[:poison + d]), [i for i, r in enumerate(results) if not r.counted]
    failed = results[poison + d]
    assert not failed.counted
    assert failed.doomed_by_step == poison, failed.doomed_by
    assert failed.doom_rows == [3], failed.doomed_by
    assert failed.doomed_by == f"step {poison}, batch row 3"
    if d == 10:  # the replay of the failing step quotes the run's finding
        report = nanscope.replay(failed.snapshot, lambda: Net(trunk), loss_fn, write=False)
        assert report.doomed_by.startswith(f"step {poison} doomed step {poison + d}: without batch row 3"), report
        assert "doomed by:        step 45" in str(report)


def test_an_lr_spike_is_the_step_not_a_row(tmp_path):
    spike = 50
    results = train(tmp_path, "rnn", {"spike": spike, "trigger": spike + 10, "echo": spike}, spike + 11,
                    rollback=False)
    failed = results[spike + 10]
    assert not failed.counted
    assert failed.doomed_by_step == spike, failed.doomed_by
    assert failed.doom_rows == [], failed.doomed_by  # every row, at that LR: the step itself


def test_a_failure_of_the_batchs_own_blames_no_earlier_step(tmp_path):
    own = 60
    results = train(tmp_path, "transformer", {"own_fault": own}, own + 1, rollback=False)
    failed = results[own]
    assert not failed.counted
    assert failed.doomed_by == "no earlier step", failed.doomed_by
    assert failed.doomed_by_step is None


def test_the_recovery_skips_the_dooming_batch_alone_and_ends_as_well_as_a_rollback(tmp_path):
    """With rollback on, the run goes back to the saved state and replays every
    step but the dooming one; it ends at a loss no worse than today's rollback
    (which skips every batch since its state and cuts the LR)."""
    poison, d, steps = 45, 10, 120
    plan = {"poison": poison, "trigger": poison + d, "echo": poison}

    def final_loss(results):
        tail = [r.loss for r in results[-20:] if r.counted]
        return sum(tail) / len(tail)

    doom = train(tmp_path / "doom", "rnn", plan, steps, doom_search=True)
    rollback = train(tmp_path / "rollback", "rnn", plan, steps, doom_search=False)
    clean = train(tmp_path / "clean", "rnn", {"trigger": poison + d, "echo": poison}, steps, doom_search=False)
    failed = doom[poison + d]
    assert failed.doomed_by_step == poison and failed.rolled_back_to >= 0, failed.doomed_by
    assert all(r.counted for r in doom[poison + d + 1:]), "the recovered run goes on clean"
    assert final_loss(doom) <= final_loss(rollback) * 1.02, (final_loss(doom), final_loss(rollback))
    print(f"final loss: doom recovery {final_loss(doom):.4f}, rollback {final_loss(rollback):.4f}, "
          f"clean {final_loss(clean):.4f}")


def train_with_checkpoint(tmp_path, trunk, plan, steps, checkpoint_step, lr=0.05):
    """The run as a user has it: no search while training, a checkpoint of
    their own (torch.save) before step `checkpoint_step`."""
    torch.manual_seed(0)
    model = Net(trunk)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="fp32", log=False, loss_fn=loss_fn,
                               config=nanscope.GuardConfig(warn=False, rollback=False))
    path = tmp_path / "ckpt.pt"
    for step in range(steps):
        if step == checkpoint_step:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng_state": torch.get_rng_state()}, path)
        for group in optimizer.param_groups:
            group["lr"] = lr * (1e3 if step == plan.get("spike") else 1.0)
        batch = batch_at(step, plan)
        guard.closure_step(lambda: loss_fn(model, batch), batch=batch)
    guard.close()
    return path


def search_after(tmp_path, trunk, plan, checkpoint, start_step, **options):
    return nanscope.find_dooming_step(tmp_path / "run", lambda: Net(trunk),
                                      lambda m: torch.optim.SGD(m.parameters(), lr=0.05), loss_fn,
                                      lambda step: batch_at(step, plan), checkpoint=checkpoint,
                                      start_step=start_step, **options)


@pytest.mark.parametrize("trunk", ["transformer", "rnn"])
def test_after_the_run_the_dooming_step_is_found_from_the_users_checkpoint(tmp_path, trunk, nanscope_lines):
    poison, d = 45, 10
    plan = {"poison": poison, "trigger": poison + d, "echo": poison}
    checkpoint = train_with_checkpoint(tmp_path, trunk, plan, poison + d + 3, checkpoint_step=40)
    found = search_after(tmp_path, trunk, plan, checkpoint, 40)
    assert found.outcome == "dooming_step", found
    assert (found.failing_step, found.step, found.rows) == (poison + d, poison, [3]), found
    assert str(found).startswith(f"step {poison} doomed step {poison + d}: without batch row 3"), found
    assert found.steps_run > poison + d - 40 and found.replays >= 3
    # One JSON behind the object: to_json() reads back as to_dict(), every field there.
    assert json.loads(found.to_json()) == found.to_dict()
    assert found.to_dict()["rows"] == [3] and found.to_dict()["text"] == str(found)
    assert "nanscope: doom search: replay 1, without steps 40-54;" in nanscope_lines()
    # A budget too small: the steps still suspected, narrowed from 40-54.
    short = search_after(tmp_path, trunk, plan, checkpoint, 40, budget=60, progress=False)
    assert short.outcome == "budget_spent", short
    assert short.first <= poison <= short.last and short.last - short.first < 14, short


def test_after_the_run_an_lr_spike_is_the_step_and_an_own_failure_no_step(tmp_path):
    spike = 50
    plan = {"spike": spike, "trigger": spike + 10, "echo": spike}
    checkpoint = train_with_checkpoint(tmp_path / "spike", "rnn", plan, spike + 11, checkpoint_step=40)
    found = search_after(tmp_path / "spike", "rnn", plan, checkpoint, 40, progress=False)
    assert (found.outcome, found.step, found.rows) == ("dooming_step", spike, []), found  # the run.h5 LR replayed

    own = 60
    plan = {"own_fault": own}
    checkpoint = train_with_checkpoint(tmp_path / "own", "transformer", plan, own + 1, checkpoint_step=40)
    found = search_after(tmp_path / "own", "transformer", plan, checkpoint, 40, progress=False)
    assert found.outcome == "no_earlier_step" and found.step is None, found


def test_after_the_run_what_cannot_be_searched_raises_saying_why(tmp_path):
    poison, d = 45, 1
    plan = {"poison": poison, "trigger": poison + d, "echo": poison}
    checkpoint = train_with_checkpoint(tmp_path, "rnn", plan, poison + d + 1, checkpoint_step=40)
    with pytest.raises(ValueError, match="after the failing step 46"):
        search_after(tmp_path, "rnn", plan, checkpoint, 50, progress=False)
    with pytest.raises(ValueError, match="no row for that step"):
        search_after(tmp_path, "rnn", plan, checkpoint, 40, failing_step=99, progress=False)
    with pytest.raises(ValueError, match="bad run file"):
        nanscope.find_dooming_step(tmp_path / "nowhere", lambda: Net("rnn"), lambda m: torch.optim.SGD(
            m.parameters(), lr=0.05), loss_fn, lambda s: batch_at(s, plan), checkpoint=checkpoint, start_step=40)
    with pytest.raises(ValueError, match="no 'optimizer'"):
        search_after(tmp_path, "rnn", plan, {"model": Net("rnn").state_dict()}, 40)
    # A failing batch that holds a NaN of its own has no earlier step to blame.
    def with_nan_at_the_failing_step(step):
        x, y, counts, counted = batch_at(step, plan)
        if step == poison + d:
            x = x.clone()
            x[4, 0, 0] = float("nan")
        return x, y, counts, counted
    with pytest.raises(ValueError, match=r"step 46's batch holds a non-finite value \(row 4\): its own batch is the"):
        nanscope.find_dooming_step(tmp_path / "run", lambda: Net("rnn"), lambda m: torch.optim.SGD(
            m.parameters(), lr=0.05), loss_fn, with_nan_at_the_failing_step, checkpoint=checkpoint, start_step=40,
            progress=False)
    # Ctrl-C in the loss during a replay ends the search as Ctrl-C, not as a replay that failed.
    calls = []
    def interrupted_loss(model, batch):
        calls.append(1)
        if len(calls) == 12:
            raise KeyboardInterrupt
        return loss_fn(model, batch)
    with pytest.raises(KeyboardInterrupt):
        nanscope.find_dooming_step(tmp_path / "run", lambda: Net("rnn"), lambda m: torch.optim.SGD(
            m.parameters(), lr=0.05), interrupted_loss, lambda s: batch_at(s, plan), checkpoint=checkpoint,
            start_step=40, progress=False)
    # Other batches than the run's: the failing step does not fail again.
    with pytest.raises(RuntimeError, match="does not fail again"):
        nanscope.find_dooming_step(tmp_path / "run", lambda: Net("rnn"), lambda m: torch.optim.SGD(
            m.parameters(), lr=0.05), loss_fn, lambda s: batch_at(s, {}), checkpoint=checkpoint, start_step=40,
            progress=False)
