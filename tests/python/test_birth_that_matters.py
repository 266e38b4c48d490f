"""The birth reported is the one that matters: the first whose values reach
what the step failed on. An infinity the model computes and throws away (T5's
relative position buckets take log(0) and drop it), a NaN in a batch leaf the
loss never reads, and the loss scaler's overflow are not the cause of a NaN
born elsewhere."""
import math

import pytest
import torch
import torch.nn as nn

import nanscope


def needs_fp16_on_cpu():
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip("fp16 autocast on the CPU needs torch 2.x")


def test_t5s_discarded_log_of_zero_is_a_note_and_the_overflow_at_wo_is_the_birth(tmp_path, nanscope_lines):
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
                                   num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
                                   decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(m, batch):
        return m(**batch).loss

    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", loss_fn=loss_fn)
    batch = {"input_ids": torch.randint(1, 32, (4, 6)), "labels": torch.randint(1, 32, (4, 5))}
    assert guard.closure_step(lambda: loss_fn(model, batch), batch=batch).counted
    # The classic fp16 fault at T5's feed-forward output, made certain at any
    # precision: every output a sum of positive activations times 1e38.
    wo = model.encoder.block[1].layer[1].DenseReluDense.wo
    with torch.no_grad():
        wo.weight.fill_(1e38)
    result = guard.closure_step(lambda: loss_fn(model, batch), batch=batch)
    assert result.skipped
    born, _, note = result.first_birth.partition("; before it, ")
    assert born.startswith("inf at "), result.first_birth
    assert "in module 'encoder.block.1.layer.1.DenseReluDense.wo'" in born, result.first_birth
    # The bucketing's -inf, earlier, is named as what it is.
    assert note.startswith("inf at aten::log (forward) in module 'encoder.block.0.layer.0.SelfAttention'"), note
    assert "not the cause" in note, note
    guard.close()

    report = nanscope.replay(result.snapshot, model=lambda: transformers.T5ForConditionalGeneration(config),
                             loss=loss_fn, write=False)
    assert report.category != "log_nonpositive", report
    assert report.first_birth.module == "encoder.block.1.layer.1.DenseReluDense.wo", report


def where_sqrt(h):
    # sqrt where positive, 0 elsewhere: the forward's NaNs (sqrt of the
    # negatives) are dropped by where(), whose backward then sends a zero
    # gradient into them: 0 / NaN is NaN. The classic where() gradient NaN, at
    # any loss scale and in fp32 too: no scale makes or unmakes it.
    return torch.where(h > 0, torch.sqrt(h), torch.zeros_like(h))


class WhereSqrt(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return where_sqrt(self.lin(x)).mean()


def test_an_fp16_backward_nan_is_diagnosed_at_its_first_occurrence_and_keeps_the_scale(tmp_path, nanscope_lines):
    needs_fp16_on_cpu()
    torch.manual_seed(0)
    model = WhereSqrt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp16",
                               loss_fn=lambda m, x: m(x))
    scale = guard.get_scale()
    x = torch.randn(8, 4) * 0.01  # gradients far below fp16's range even at the scale of 2**16
    with torch.no_grad():
        model.lin.bias.copy_(torch.tensor([0.5, -0.5, 0.5, -0.5]))  # two outputs negative: where() masks them
    result = guard.closure_step(lambda: model(x), batch=x)
    lines = nanscope_lines()
    assert result.skipped
    assert "the scaler's routine" not in lines, lines
    # The NaN the gradients carry is the forward sqrt's, which where() hid from the loss only.
    assert result.first_birth.startswith("nan at aten::sqrt (forward) in module ''"), (result.first_birth, lines)
    assert result.snapshot, lines
    assert guard.get_scale() == scale, "a NaN the scale did not make spends none of it"
    guard.close()


def test_a_plain_fp16_overflow_is_still_the_scalers_routine(tmp_path, nanscope_lines):
    needs_fp16_on_cpu()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp16",
                               loss_fn=lambda m, b: m(b[0]).sub(b[1]).pow(2).mean())
    scale = guard.get_scale()
    # A loss near 2**10 whose gradient times the scale (2**16) is past fp16's 65504.
    x, y = torch.full((4, 4), 8.0), torch.full((4, 1), -32.0)
    result = guard.closure_step(lambda: model(x).sub(y).pow(2).mean(), batch=(x, y))
    lines = nanscope_lines()
    assert result.skipped
    assert "the scaler's routine" in lines, lines
    assert guard.get_scale() == scale / 2
    assert not result.snapshot
    guard.close()


def test_a_nan_in_a_batch_leaf_the_loss_never_reads_is_a_note(tmp_path, nanscope_lines):
    # open_clip's accumulation loop: the batch carries features cached by a
    # no-grad pass, one with a NaN the loss never reads; the model's own log
    # makes the step's NaN.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))

    def loss_fn(m, batch):
        h = torch.log(m[0](batch["x"]))  # NaN where the first layer's output is negative
        return (m[1](h) - batch["y"]).pow(2).mean()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32", loss_fn=loss_fn)
    cached = torch.randn(6, 3)
    cached[2, 1] = math.nan
    batch = {"x": torch.randn(6, 4), "y": torch.randn(6, 1), "cached": cached}
    result = guard.closure_step(lambda: loss_fn(model, batch), batch=batch)
    lines = nanscope_lines()
    assert result.skipped
    assert result.first_birth.startswith("nan at aten::log (forward)"), result.first_birth
    assert "input 'cached'" in result.first_birth and "not the cause" in result.first_birth, result.first_birth
    assert result.remedy != "data", lines
    guard.close()


def test_the_row_search_runs_with_dropout_on_and_keeps_the_draws(tmp_path, nanscope_lines):
    # Every Transformers model has dropout on by default: the row search puts a
    # copy of another row in each row's place (shapes, so draws, kept).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.Linear(8, 1))

    def loss_fn(m, batch):
        x, y = batch
        scale = torch.log(x.std(1, keepdim=True))  # a blank sample: std 0, log -inf
        return ((m(x) * scale - y) ** 2).mean()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="bf16", loss_fn=loss_fn,
                               config=nanscope.GuardConfig(fallback="auto"))
    x, y = torch.rand(8, 6), torch.randn(8, 1)
    x[5] = 0.25
    result = guard.closure_step(lambda: loss_fn(model, (x, y)), batch=(x, y))
    lines = nanscope_lines()
    assert result.skipped
    assert result.remedy == "model_or_data", lines
    assert "finite without batch row 5 (each row tested by putting a copy of another row in its place" in lines, lines
    guard.close()


def test_a_nan_the_loss_never_reads_does_not_hide_a_precision_fault(tmp_path, nanscope_lines,
                                                                      bf16_cancellation_model):
    # open_clip with accumulation: a cached feature holds a NaN no op reads,
    # while the step's own fault is one of precision. The remedy follows the
    # real birth: its module in fp32, not a skip as a data fault.
    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch["x"]), batch["y"])

    torch.manual_seed(0)
    model = bf16_cancellation_model()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=str(tmp_path / "run"),
                               amp="bf16", loss_fn=loss_fn)
    cached = torch.randn(8, 4)
    cached[5, 0] = math.nan
    batch = {"x": torch.rand(8, 6), "y": torch.randint(0, 3, (8,)), "cached": cached}
    result = guard.closure_step(lambda: loss_fn(model, batch), batch=batch)
    lines = nanscope_lines()
    assert not result.counted
    assert result.first_birth.startswith("inf at aten::log (forward) in module 'cancel'"), result.first_birth
    assert "input 'cached'" in result.first_birth, result.first_birth
    assert result.remedy == "fp32-modules", lines
    assert guard.fp32_modules == ["cancel"]
    guard.close()
