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
    # The rewrite a user would write: log(1 - sigmoid(z)) is logsigmoid(-z).
    assert "F.logsigmoid(-z)" in report.suggestion, report.suggestion
    assert "ordinary sample" in report.suggestion, report.suggestion


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


def test_gradients_grown_past_the_norms_range_blame_the_update_before_not_an_op(tmp_path, nanscope_lines):
    # nanoGPT's loop with a scheduler that spiked the LR for one step: the
    # weights it left make the next step's gradients so large that their norm
    # passes fp32's range (each gradient finite), whichever sample the batch holds.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.Linear(8, 1, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(m, batch):
        return m(batch[0]).mean()

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", loss_fn=loss_fn)
    x = torch.rand(8, 4) + 0.5
    assert not guard.closure_step(lambda: loss_fn(model, (x,)), batch=(x,)).skipped
    with torch.no_grad():
        model[1].weight.fill_(1e20)  # what the spiked update left in the last layer
    # The data decide: each gradient of the first layer is finite, their norm is not.
    probe = nn.Sequential(nn.Linear(4, 8, bias=False), nn.Linear(8, 1, bias=False))
    probe.load_state_dict(model.state_dict())
    loss_fn(probe, (x,)).backward()
    assert torch.isfinite(probe[0].weight.grad).all()
    assert not torch.isfinite(torch.linalg.vector_norm(probe[0].weight.grad))
    result = guard.closure_step(lambda: loss_fn(model, (x,)), batch=(x,))
    lines = nanscope_lines()
    assert result.skipped
    assert "(grad_norm)" in result.first_birth, result.first_birth
    assert "the gradients explode" in lines and "doom_search" in lines, lines
    assert "fix the op" not in lines, lines
    assert not result.fell_back  # no precision is at fault
    guard.close()


def raw_logistic_regression(guarded, tmp_path, steps=8, fault_step=5):
    """A tutorial's logistic regression on raw tensors, W and b, with
    optim.SGD([W, b]); at one step a sample's feature is NaN."""
    torch.manual_seed(0)
    W = torch.zeros(3, 1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([W, b], lr=0.1)

    def loss_of(_, batch):
        x, y = batch
        return torch.nn.functional.binary_cross_entropy_with_logits(x @ W + b, y)

    guard = nanscope.StepGuard([W, b], optimizer, run_dir=str(tmp_path / "raw"), loss_fn=loss_of) if guarded else None
    results = []
    for step in range(steps):
        x = torch.randn(8, 3)
        y = (x[:, :1] > 0).float()
        if step == fault_step:
            x[2, 1] = float("nan")
        if guard:
            results.append(guard.closure_step(lambda: loss_of(None, (x, y)), batch=(x, y)))
        else:
            optimizer.zero_grad()
            loss = loss_of(None, (x, y))
            loss.backward()
            if step != fault_step:
                optimizer.step()
    if guard:
        guard.close()
    return results, (W.detach().clone(), b.detach().clone()), optimizer


def test_a_raw_tensor_program_is_guarded_in_one_line_and_replayed(tmp_path):
    results, (W, b), optimizer = raw_logistic_regression(True, tmp_path)
    _, (W_plain, b_plain), _ = raw_logistic_regression(False, tmp_path)
    assert [r.skipped for r in results] == [s == 5 for s in range(8)]
    failed = results[5]
    assert failed.first_birth.startswith("nan at input"), failed.first_birth
    assert "batch row 2" in failed.first_birth, failed.first_birth
    assert failed.remedy == "data"
    assert torch.equal(W, W_plain) and torch.equal(b, b_plain)  # every clean step as the plain loop's

    # The replay loads W and b at the failed step into the tensors the factory's optimizer steps.
    W2, b2 = torch.ones(3, 1, requires_grad=True), torch.ones(1, requires_grad=True)
    report = nanscope.replay(failed.snapshot, model=lambda: (None, torch.optim.SGD([W2, b2], lr=0.1)),
                             loss=lambda _, batch: torch.nn.functional.binary_cross_entropy_with_logits(
                                 batch[0] @ W2 + b2, batch[1]), write=False)
    assert report.verdict == "data", report
    assert not torch.equal(W2.detach(), torch.ones(3, 1)), "the snapshot's W was loaded"
    try:
        nanscope.replay(failed.snapshot, model=torch.nn.Module, loss=lambda m, batch: batch[0].sum(), write=False)
    except ValueError as e:
        assert "'optimizer.0.0', 'optimizer.0.1' outside the model" in str(e), e
    else:
        raise AssertionError("a replay without the optimizer's tensors must be refused")


def test_tensors_the_optimizer_steps_beside_a_module_are_the_guards(tmp_path):
    """Prompt tuning's shape: a frozen module and a learnable prompt the
    optimizer steps beside it. The guard clears the prompt's gradient as the
    plain loop's zero_grad does, so a clean guarded run is the plain run."""
    def run(guarded):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        for p in model.parameters():
            p.requires_grad_(False)
        prompt = torch.zeros(1, 4, requires_grad=True)
        optimizer = torch.optim.Adam([prompt], lr=0.05)
        guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "prompt"), log=False) if guarded else None
        for _ in range(5):
            x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
            def loss():
                return nn.functional.cross_entropy(model(x + prompt), y)
            if guard:
                assert guard.closure_step(loss, batch=(x, y)).counted
            else:
                optimizer.zero_grad()
                loss().backward()
                optimizer.step()
        if guard:
            guard.close()
        return prompt.detach().clone()
    assert torch.equal(run(True), run(False))
