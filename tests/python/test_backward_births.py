"""Every birth named: a NaN or Inf born in the backward is named by the module
whose forward made its autograd node, with its batch row and micro-batch,
whatever made the node: an aten op's derivative, a custom autograd Function,
a tensor hook, activation checkpointing's recomputation. The model is the
same each time: in blocks.1.norm, sample 2's gradient goes non-finite in the
backward only (its forward and the loss are finite)."""
import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as checkpoint

import nanscope

BATCH, SICK_ROW = 4, 2
TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
# checkpoint_sequential's kind: torch 2.x asks for it (reentrant, its old default); 1.13 takes no such argument.
SEQUENTIAL_KIND = {"use_reentrant": True} if TORCH_2 else {}


class GradPoison(torch.autograd.Function):
    """A hand-written backward (a fused kernel's, a straight-through
    estimator's): divides the gradient by each sample's largest input, 0 for
    an all-zero sample."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / x.abs().amax(dim=(1, 2), keepdim=True)


class Norm(nn.Module):
    """How the backward op comes to be: 'function' (GradPoison), 'hook' (a
    tensor hook scaling the gradient per sample), 'derivative' (an RMS whose
    sqrt's derivative divides by a zero norm), 'recomputed' (a forward that
    differs when activation checkpointing runs it again: its second call in
    a step loses its eps)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.calls = 0
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x):
        if self.how == "function":
            return GradPoison.apply(x)
        if self.how == "hook":
            h = x * 1
            scale = x.detach().abs().amax(dim=(1, 2), keepdim=True)
            if h.requires_grad:  # reentrant checkpointing's first forward runs without grad
                h.register_hook(lambda g: g / scale)
            return h
        rms = x.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()
        if self.how == "recomputed":
            self.calls += 1
            # The gain's gradient needs the quotient, so a recomputation that
            # stops once it has what the backward needs (non-reentrant, torch 2.x)
            # still runs the division.
            return x / (rms + (1e-3 if self.calls == 1 else 0.0)) * self.gain
        return x / (rms + 1e-3)


class Block(nn.Module):
    def __init__(self, how, width=8):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = Norm(how)

    def forward(self, x):
        return self.norm(self.lin(x))


class Net(nn.Module):
    """Three blocks; blocks.0 and blocks.1 map an all-zero sample to zeros,
    so blocks.1.norm is the first, in backward order, to see it."""

    def __init__(self, how, checkpointing=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(how) for _ in range(3)])
        self.checkpointing = checkpointing
        with torch.no_grad():
            for block in self.blocks[:2]:
                block.lin.bias.zero_()

    def forward(self, x):
        # blocks.0 runs as it is: reentrant checkpointing needs an input that requires grad.
        x = self.blocks[0](x)
        if self.checkpointing == "sequential":
            x = checkpoint.checkpoint_sequential(self.blocks[1:], 2, x, **SEQUENTIAL_KIND)  # checkpoints blocks.1
        else:
            for block in self.blocks[1:]:
                x = block(x) if self.checkpointing is None else checkpoint.checkpoint(
                    block, x, use_reentrant=self.checkpointing == "reentrant")
        return x.sum(-1).mean()


def batch():
    x = torch.randn(BATCH, 5, 8, generator=torch.Generator().manual_seed(1))
    x[SICK_ROW] = 0
    return x


def reset_calls(model):
    for block in model.blocks:
        block.norm.calls = 0


def loss_of(model, inputs):
    reset_calls(model)
    return model(inputs)


def guarded_step(tmp_path, how, checkpointing=None, micro_batches=1):
    """One guarded step of the watched form (the sick sample in the last
    micro-batch): its StepResult and the snapshots it wrote."""
    torch.manual_seed(0)
    model = Net(how, checkpointing)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: loss_of(m, *b), config=nanscope.GuardConfig(fallback="off"))
    for micro in range(micro_batches):
        x = batch() if micro == micro_batches - 1 else torch.randn(BATCH, 5, 8)
        reset_calls(model)
        loss = model(x) / micro_batches
        assert torch.isfinite(loss)
        guard.scale(loss).backward()
    result = guard.step(optimizer)
    guard.update()
    snapshots = list(guard.snapshots)
    guard.close()
    return result, snapshots


NODE = {
    "function": "(backward, in GradPoisonBackward of GradPoison",
    "hook": "(backward, in a gradient hook at MulBackward0 of aten::mul",
    "derivative": "(backward, in SqrtBackward0 of aten::sqrt",
}


@pytest.mark.parametrize("checkpointing", [None, "reentrant", "non-reentrant"])
@pytest.mark.parametrize("how", ["function", "hook", "derivative"])
def test_a_backward_birth_names_the_module_that_made_its_node_and_the_row(tmp_path, how, checkpointing):
    result, _ = guarded_step(tmp_path, how, checkpointing)
    assert result.skipped
    birth = result.first_birth
    assert NODE[how] in birth, birth
    assert "in module 'blocks.1.norm', batch row 2" in birth, birth
    # Reentrant checkpointing backpropagates through a recomputed graph: its
    # nodes were made by the recomputation, and the line says so. The
    # non-reentrant kind backpropagates through the first forward's nodes.
    recomputed_node = checkpointing == "reentrant" and how != "hook"
    assert (", recomputed)" in birth) == recomputed_node, birth


@pytest.mark.parametrize("checkpointing", ["reentrant", "non-reentrant", "sequential"])
def test_a_birth_in_a_recomputed_forward_is_named_by_its_module_and_says_it_was_recomputed(tmp_path, checkpointing):
    result, _ = guarded_step(tmp_path, "recomputed", checkpointing)
    assert result.skipped
    assert "nan at aten::div (forward, recomputed) in module 'blocks.1.norm', batch row 2" in result.first_birth, \
        result.first_birth


def test_a_backward_birth_in_a_later_micro_batch_names_that_micro_batch_and_its_row(tmp_path):
    result, _ = guarded_step(tmp_path, "function", micro_batches=2)
    assert "in module 'blocks.1.norm', micro-batch 1, batch row 2" in result.first_birth, result.first_birth


@pytest.mark.parametrize("how,checkpointing,names", [
    ("function", None, "the backward of GradPoison in blocks.1.norm"),
    ("hook", None, "a gradient hook at MulBackward0 (of aten::mul) in blocks.1.norm"),
    ("derivative", None, "the sqrt in blocks.1.norm"),
    ("derivative", "reentrant", "the sqrt in blocks.1.norm"),
])
def test_the_replay_of_a_backward_birth_names_its_module_node_and_row(tmp_path, how, checkpointing, names):
    _, snapshots = guarded_step(tmp_path, how, checkpointing)
    assert snapshots, "the failed step wrote no snapshot"
    report = nanscope.replay(snapshots[-1], lambda: Net(how, checkpointing), lambda m, b: loss_of(m, *b),
                             write=False, repeats=1)
    birth = report.first_birth
    assert (birth.phase, birth.module, birth.rows) == ("backward", "blocks.1.norm", [SICK_ROW]), birth
    assert birth.forward_op == {"function": "GradPoison", "hook": "aten::mul", "derivative": "aten::sqrt"}[how]
    assert str(birth) in str(report), "the report and the object say the birth in one wording"
    assert names in report.suggestion, report.suggestion
    assert "root module" not in report.suggestion, report.suggestion
    assert "batch row 2" in report.suggestion, report.suggestion


@pytest.mark.skipif(not TORCH_2,
                    reason="LibTorch 1.x's autograd engine does not say which parameter a gradient hook runs for")
def test_a_parameters_gradient_hook_is_named_by_the_parameters_module(tmp_path):
    """A hook on a parameter (per-parameter clipping or scaling, as
    DistributedDataParallel's reducer hooks each one) runs with its
    AccumulateGrad node, which no forward op made: it is named by the module
    that owns the parameter."""
    torch.manual_seed(0)
    model = Net("derivative")
    zero = torch.zeros(())
    model.blocks[1].lin.weight.register_hook(lambda g: g / zero)  # a scale that went to 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", log=False,
                               loss_fn=lambda m, b: loss_of(m, *b), config=nanscope.GuardConfig(fallback="off"))
    guard.scale(model(torch.randn(BATCH, 5, 8))).backward()
    result = guard.step(optimizer)
    guard.close()
    assert result.skipped
    assert "(backward, in a gradient hook at torch::autograd::AccumulateGrad) in module 'blocks.1.lin'" in \
        result.first_birth, result.first_birth


def test_an_input_that_requires_grad_still_does_when_its_step_is_re_run(tmp_path):
    """An input-gradient loop (saliency, adversarial training) feeds the
    checkpointed first block an input that requires grad: reentrant
    checkpointing backpropagates only through inputs that do. The step's kept
    micro-batch must require grad as the loop's did, or the re-run's backward
    never reaches the block and its birth reads as a transient."""
    torch.manual_seed(0)
    model = Net("derivative")

    def loss_with_input_grad(m, x):
        reset_calls(m)
        return checkpoint.checkpoint(m.blocks[0], x, use_reentrant=True).sum(-1).mean()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(tmp_path / "run"),
                               amp="fp32", log=False, loss_fn=loss_with_input_grad,
                               config=nanscope.GuardConfig(fallback="off"))
    with torch.no_grad():
        model.blocks[0].lin.bias.zero_()
    x = batch().requires_grad_()
    guard.scale(loss_with_input_grad(model, x), x).backward()
    result = guard.step()
    assert result.skipped
    assert "(backward, in SqrtBackward0 of aten::sqrt" in result.first_birth, result.first_birth
    assert "in module 'blocks.0.norm', batch row 2" in result.first_birth, result.first_birth
    guard.close()
