"""What the guard concludes after a right birth, on loops written the way
tutorials and RL code write them: an unsafe loss on a correct sample is the
op's fault, not the data's; the same fault met again (a reused rollout) is
skipped again without escalating; a one-row batch takes no fallback it has no
evidence for. The replay of each snapshot gives the same cause as the run."""
import torch
import torch.nn as nn

import nanscope


def logistic_loss(model, batch):
    # The tutorial's hand-written binary cross-entropy: log(1 - sigmoid(z)) is
    # -inf once a correctly classified negative saturates the sigmoid to 1.
    x, y = batch
    p = torch.sigmoid(model(x)).squeeze(1)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def test_an_unsafe_loss_on_a_correct_sample_is_the_ops_fault_not_the_datas(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", loss_fn=logistic_loss)
    x = torch.randn(8, 2)
    y = (x[:, 0] > 0).float()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0]]))
        model.bias.zero_()
    # Row 5: a negative the model already gets right, far enough out that the
    # sigmoid rounds to exactly 0 for -z... and to 1 for its own side.
    x[5] = torch.tensor([40.0, 0.0])
    y[5] = 1.0
    x[2] = torch.tensor([-40.0, 0.0])
    y[2] = 0.0
    # Where this CPU rounds sigmoid(40) to exactly 1, log(1 - p) is -inf for row 5
    # (weighted by 1 - y = 0: 0 * -inf = NaN); the data decide, not the test.
    p = torch.sigmoid(model(x)).squeeze(1)
    assert not torch.isfinite(torch.log(1 - p)).all()
    result = guard.closure_step(lambda: logistic_loss(model, (x, y)), batch=(x, y))
    lines = nanscope_lines()
    assert result.skipped
    assert "aten::log (forward)" in result.first_birth, result.first_birth
    assert result.remedy == "model_or_data", lines
    assert "an ordinary sample" in lines and "fix the op, not the data" in lines, lines
    assert not result.fell_back and guard.lr_multiplier == 1.0
    guard.close()

    report = nanscope.replay(result.snapshot, model=lambda: nn.Linear(2, 1), loss=logistic_loss, write=False)
    assert report.verdict == "model_or_data", report
    assert report.category == "log_nonpositive", report


def ppo_like_updates(guarded, tmp_path, nan_sample=11):
    """PPO's shape: each iteration collects a rollout of 24 transitions and
    reuses it for 4 epochs of shuffled minibatch steps. The second rollout
    holds one NaN reward, and its minibatches are the whole rollout, so every
    one of its 4 steps in a row meets that sample, each time in another row.
    Returns each step's result (guarded) or skip flag (plain), the final
    weights, and the guard's LR multiplier and precision."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def loss_fn(model, batch):
        s, r = batch
        return ((model(s) - r) ** 2).mean()

    guard = None
    if guarded:
        # fp32, as the plain loop runs; a rollback state kept every 2 healthy
        # steps, so a rollback could be taken (and must not be).
        guard = nanscope.StepGuard(policy, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", loss_fn=loss_fn,
                                   config=nanscope.GuardConfig(rollback_every=2))
    generator = torch.Generator().manual_seed(1)
    outcomes = []
    for iteration, minibatch in enumerate((6, 24, 6)):
        states, returns = torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator)
        if iteration == 1:
            returns[nan_sample] = float("nan")
        for _ in range(4):
            order = torch.randperm(24, generator=generator)
            for start in range(0, 24, minibatch):
                rows = order[start:start + minibatch]
                batch = (states[rows], returns[rows])
                if guard:
                    outcomes.append(guard.closure_step(lambda: loss_fn(policy, batch), batch=batch))
                else:
                    optimizer.zero_grad()
                    loss = loss_fn(policy, batch)
                    loss.backward()
                    if torch.isfinite(loss):  # the plain loop with the failed updates dropped
                        optimizer.step()
                    outcomes.append(not torch.isfinite(loss))
    state = (guard.lr_multiplier, guard.amp) if guard else None
    if guard:
        guard.close()
    return outcomes, [p.detach().clone() for p in policy.parameters()], state


def test_a_reused_rollouts_bad_sample_is_skipped_again_and_escalates_nothing(tmp_path, nanscope_lines):
    results, weights, (lr_multiplier, amp) = ppo_like_updates(True, tmp_path)
    lines = nanscope_lines()
    plain_skips, plain_weights, _ = ppo_like_updates(False, tmp_path)
    skipped = [i for i, r in enumerate(results) if r.skipped]
    assert skipped == [16, 17, 18, 19] == [i for i, s in enumerate(plain_skips) if s], (skipped, plain_skips)
    assert all(results[i].remedy == "data" for i in skipped), [results[i].remedy for i in skipped]
    for step in skipped[1:]:
        assert f"step {step}: non-finite loss -> skipped; data: again (as step 16)" in lines, lines
    assert not any(r.rolled_back_to >= 0 or r.fell_back for r in results), lines
    assert (lr_multiplier, amp) == (1.0, "fp32")  # no LR cut, no fallback; and no stop: all 36 steps ran
    # Every clean step was applied as the plain loop applied it, the 16 after the bad rollout too.
    assert len(results) == 36
    for got, want in zip(weights, plain_weights):
        assert torch.equal(got, want)


def test_a_one_row_batch_takes_no_precision_remedy_and_says_the_search_cannot_run(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(m, batch):
        x, y = batch
        h = m(x)
        return ((h / h.abs().sum() - y) ** 2).mean() + torch.log(x.sum())  # log of a sum that can be 0

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", loss_fn=loss_fn)
    x, y = torch.tensor([[0.5, -0.25, -0.25]]), torch.zeros(1, 1)
    result = guard.closure_step(lambda: loss_fn(model, (x, y)), batch=(x, y))
    lines = nanscope_lines()
    assert result.skipped
    assert result.remedy == "model_or_data", lines
    assert "the row search cannot run on a batch of one row" in lines, lines
    assert not result.fell_back and guard.amp == "bf16" and guard.lr_multiplier == 1.0
    guard.close()
