"""Writes the real-model corpus and its ground truth, from plain PyTorch.

Usage: make_corpus.py OUT_DIR [NAME...]

For each model of corpus_models.py: NAME.pt (TorchScript, scripted or traced),
NAME-clean.h5 and NAME-faulted.h5 (/inputs, /targets), and an entry of
OUT_DIR/corpus.json with the settings nanscope-train is to run with and what an
independent reference found on the faulted data:

- the step: the same loop as nanscope-train --no-shuffle in plain PyTorch
  (batch i is rows [i*B, (i+1)*B) wrapping around; AdamW, weight decay 0.01,
  global-norm clipping at 1.0; forward and loss under torch.autocast), run
  until the first step whose loss or gradients are not finite;
- the op: that step again under a TorchDispatchMode that applies the birth
  definition of docs/design.md to every op LibTorch dispatches, with the module
  from forward hooks (dispatch sees ops after LibTorch decomposed them:
  aten::_softmax for softmax, aten::addmm for linear);
- fp32: the same step from the same state with autocast off: finite or not;
- the rows of the batch without which the step is finite;
- for a step that is finite in fp32: each module that, run alone in fp32
  (autocast off inside, its inputs cast up, as Python code would write it),
  makes the step finite.

Each entry also carries the category the hazard belongs to, by its author's
reading (docs/playbook.md's categories).

Every hazard is one row of the faulted data set, shaped as such rows arise
(a left-padded sequence, an image that missed its /255, a corrupt image, an
empty sentence, an unscaled feature, a missing-value sentinel), so the step is
fixed by the data and does not hang on rounding.
"""
import json
import math
import os
import sys

import h5py
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import corpus_models as cm

STEPS, BATCH, LR = 10, 8, 1e-3

POINTWISE = {"exp", "exp2", "expm1", "pow", "mul", "div", "add", "sub", "rsub", "square", "sinh", "cosh", "tan",
             "reciprocal", "rsqrt", "log", "log2", "log10", "xlogy", "addcmul", "addcdiv", "lerp", "where", "to",
             "_to_copy", "copy", "type_as", "softplus", "ldexp", "float_power"}


def floats(values):
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()]


class BirthFinder(TorchDispatchMode):
    """The first op whose output holds a NaN (Inf) that none of its inputs held."""

    def __init__(self, modules):
        super().__init__()
        self.modules, self.phase, self.births, self.index = modules, "forward", [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t.detach().clone() for t in floats((args, kwargs))]
        scalars = [v for v in tree_flatten((args, kwargs))[0] if isinstance(v, float)]
        out = func(*args, **kwargs)
        outs = floats(out)
        self.index += 1
        name = func._schema.name
        base = name.split("::")[-1].rstrip("_")
        in_nan = any(t.isnan().any() for t in inputs) or any(math.isnan(s) for s in scalars)
        in_inf = any(t.isinf().any() for t in inputs)
        scalar_inf = any(math.isinf(s) for s in scalars)
        module = self.modules[-1] if self.phase == "forward" else None
        for o in outs[:1]:
            if o.isnan().any() and not in_nan:
                self.births.append(dict(kind="nan", op=name, module=module, phase=self.phase, index=self.index))
            if o.isinf().any() and not in_nan:
                new = not in_inf and not scalar_inf
                if in_inf and not scalar_inf and base in POINTWISE:
                    try:
                        inherited = torch.zeros(o.shape, dtype=torch.bool)
                        for t in inputs:
                            inherited |= torch.broadcast_to(t.isinf(), o.shape)
                        new = bool((o.isinf() & ~inherited).any())
                    except RuntimeError:
                        new = False
                if new:
                    self.births.append(dict(kind="inf", op=name, module=module, phase=self.phase, index=self.index))
        return out


def module_stack(model):
    """Forward hooks keep the named_modules() path of the running module."""
    stack = [""]

    def enter(name):
        def hook(module, inputs):
            stack.append(name)
        return hook

    def leave(module, inputs, output):
        stack.pop()

    for name, m in model.named_modules():
        if name:
            m.register_forward_pre_hook(enter(name))
            m.register_forward_hook(leave)
    return stack


def batch_rows(step, n):
    return [(step * BATCH + j) % n for j in range(BATCH)]


def loss_and_grads_finite(model, inputs, targets, amp):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = model(inputs, targets)
    loss.float().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    finite = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(g).all()) for g in grads)
    return loss, finite


def in_fp32(forward):
    def forward_in_fp32(*args):
        with torch.autocast("cpu", enabled=False):
            return forward(*[a.float() if torch.is_tensor(a) and a.dtype in (torch.bfloat16, torch.float16) else a
                             for a in args])
    return forward_in_fp32


def reference(model, inputs, targets):
    """The first non-finite step of the bf16 loop, and what happened in it."""
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    stack = module_stack(model)
    for step in range(STEPS):
        rows = batch_rows(step, inputs.shape[0])
        x, y = inputs[rows], targets[rows]
        rng = torch.get_rng_state()
        state = {k: v.clone() for k, v in model.state_dict().items()}
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            bad = [i for i in range(BATCH) if not bool(torch.isfinite(x[i]).all())]
            return dict(step=step, kind="nan" if bool(x.isnan().any()) else "inf", op="input", module="",
                        phase="input", sample=bad[0], fp32_finite=False, rows=bad, fp32_singles=[])
        loss, finite = loss_and_grads_finite(model, x, y, True)
        if finite:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            continue
        # The failing step again, from the same weights and RNG state: births, fp32, rows.
        def again(amp, xs=x, ys=y, finder=None):
            model.load_state_dict(state)
            torch.set_rng_state(rng)
            if finder is None:
                return loss_and_grads_finite(model, xs, ys, amp)[1]
            model.zero_grad(set_to_none=True)
            with finder:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    l = model(xs, ys)
                finder.phase = "backward"
                l.float().backward()
            return None
        finder = BirthFinder(stack)
        again(True, finder=finder)
        # One op that gives birth to both NaN and Inf is an Inf birth (docs/design.md).
        first = min(finder.births, key=lambda b: (b["index"], b["kind"] != "inf"))
        fp32_finite = again(False)
        draws = not torch.equal(torch.get_rng_state(), rng)  # where again() left the generator
        if draws:
            # A step that draws random numbers (dropout) draws others without a
            # row: a row fixes it when a copy of some other row in its place
            # (every shape, so every draw, kept) makes the step finite.
            def replaced(i, j):
                index = list(range(BATCH))
                index[i] = j
                return x[index], y[index]
            rows_fixing = [i for i in range(BATCH)
                           if any(again(True, *replaced(i, j)) for j in range(BATCH) if j != i)]
        else:
            rows_fixing = [i for i in range(BATCH)
                           if again(True, x[[j for j in range(BATCH) if j != i]], y[[j for j in range(BATCH) if j != i]])]
        fp32_singles = []
        if fp32_finite:
            for name, module in model.named_modules():
                if not name:
                    continue
                module.forward = in_fp32(module.forward)
                if again(True):
                    fp32_singles.append(name)
                del module.forward
        return dict(step=step, kind=first["kind"], op=first["op"], module=first["module"], phase=first["phase"],
                    sample=None, fp32_finite=fp32_finite, rows=rows_fixing, fp32_singles=fp32_singles,
                    out_of_range=rows_out_of_range(rows_fixing, x, y))
    return None


def rows_out_of_range(rows, *tensors):
    """docs/replay.md's test, written here from its words: a row whose largest
    magnitude over the batch's floating tensors is over 1000 times the median
    of the other rows' largest magnitudes (3 rows at least)."""
    largest = torch.zeros(BATCH, dtype=torch.float64)
    for t in tensors:
        if t.is_floating_point():
            largest = torch.maximum(largest, t.detach().abs().reshape(BATCH, -1).amax(1).double())
    out = []
    for row in rows:
        others = torch.cat([largest[:row], largest[row + 1:]])
        median = others.sort().values[others.numel() // 2]
        if BATCH >= 3 and median > 0 and largest[row] > 1000 * median:
            out.append(row)
    return out


def save_data(path, inputs, targets):
    with h5py.File(path, "w") as f:
        f["inputs"] = inputs.numpy()
        f["targets"] = targets.numpy()


# --- the data, clean and with the one row that breaks it ----------------------
def tokens_markov(n, t, vocab, g):
    rows = torch.empty(n, t + 1, dtype=torch.long)
    rows[:, 0] = torch.randint(1, vocab, (n,), generator=g)
    for i in range(1, t + 1):
        step = torch.randint(1, 4, (n,), generator=g)
        rows[:, i] = (rows[:, i - 1] - 1 + step) % (vocab - 1) + 1
    return rows


def nanogpt_data(g):
    rows = tokens_markov(64, 16, 64, g)
    x, y = rows[:, :-1].clone(), rows[:, 1:].clone()
    bad = 21
    fx, fy = x.clone(), y.clone()
    fx[bad, :5] = 0  # a short sequence, left-padded to the batch's length
    fy[bad, :5] = -1
    return (x, y), (fx, fy), bad


def nanogpt_exp_data(g):
    rows = tokens_markov(64, 16, cm.RARE_TOKEN, g)  # ids 1..62: the rare token never occurs
    x, y = rows[:, :-1].clone(), rows[:, 1:].clone()
    bad = 29
    fx = x.clone()
    fx[bad, 7] = cm.RARE_TOKEN  # one row holding the rare special token
    return (x, y), (fx, y), bad


def vae_data(g):
    x = torch.rand(64, 784, generator=g)
    fx = x.clone()
    bad = 5
    fx[bad] = torch.round(fx[bad] * 255)  # an image that missed its /255
    return (x, torch.zeros(64, 1)), (fx, torch.zeros(64, 1)), bad


def mnist_data(g):
    x = torch.rand(64, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    fx = x.clone()
    bad = 45
    fx[bad, 0, 20:, :] = float("nan")  # a truncated image file, decoded with NaN for the missing rows
    return (x, y), (fx, y), bad


def lstm_data(g):
    x = torch.randint(1, 64, (64, 12), generator=g)
    lengths = torch.randint(3, 13, (64,), generator=g)
    for i in range(64):
        x[i, lengths[i]:] = 0
    y = (x.sum(1) % 4).long()
    fx = x.clone()
    bad = 29
    fx[bad] = 0  # an empty sentence: nothing left after tokenization
    return (x, y), (fx, y), bad


def tabular_mlp_data(g, model):
    x = torch.randn(64, 12, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).float()
    fx = x.clone()
    bad = 5
    # A feature left unscaled in one row (an age among z-scores). Its size is
    # chosen so the row's logit under the initial weights is between 8 and 14:
    # sigmoid rounds to 1.0 in bf16 there, not yet in fp32. The row is in the
    # first batch, because an update moves a logit this sensitive by units.
    with torch.no_grad():
        for value in [float(v) for v in range(5, 400)]:
            fx[bad, 2] = value
            logit = float(model.head(model.body(fx[bad:bad + 1])))
            if 8.0 < logit < 14.0:
                break
        else:
            raise SystemExit("tabular_mlp: no feature value gives a logit in (8, 14)")
    return (x, y), (fx, y), bad


def ft_transformer_data(g):
    x = torch.randn(64, 8, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    fx = x.clone()
    bad = 50
    fx[bad, 3] = 3.0e38  # a missing value stored as the float maximum
    return (x, y), (fx, y), bad


# Each model: its class, the data builder, and how it is exported.
MODELS = {
    "nanogpt": (lambda: cm.GPT(cm.GPTConfig()), lambda g, model: nanogpt_data(g), "traced"),
    "nanogpt_exp": (lambda: cm.pretrained_with_a_sharp_rare_token(cm.LossOf(cm.ExpSumGPT(cm.GPTConfig()))),
                    lambda g, model: nanogpt_exp_data(g), "traced_inside_script"),
    "vae": (cm.VAE, lambda g, model: vae_data(g), "scripted"),
    "mnist_cnn": (cm.Net, lambda g, model: mnist_data(g), "scripted"),
    "lstm_classifier": (cm.LSTMClassifier, lambda g, model: lstm_data(g), "scripted"),
    "tabular_mlp": (cm.TabularMLP, tabular_mlp_data, "scripted"),
    "ft_transformer": (cm.FTTransformer, lambda g, model: ft_transformer_data(g), "scripted"),
}


def build(name, g):
    if name not in MODELS:
        raise SystemExit(f"unknown model {name}")
    make_model, make_data, export = MODELS[name]
    torch.manual_seed(0)
    model = make_model()
    clean, faulted, bad = make_data(g, model)
    return model, clean, faulted, bad, export


CATEGORIES = {
    "nanogpt": "fully_masked_softmax",  # a left-padded query sees only padded keys
    "nanogpt_exp": "exp_overflow",      # the hand-written softmax's exp over a sharp head's logits
    "vae": "exp_overflow",              # logvar.exp() of an unnormalised image's logvar
    "mnist_cnn": "nonfinite_input",     # NaN pixels in the batch itself
    "lstm_classifier": "div_by_zero",   # mean over zero tokens: 0 / 0
    "tabular_mlp": "log_nonpositive",   # log(1 - p) with p rounded to 1.0 in bf16
    "ft_transformer": "overflow",       # 3e38 * weight, then q @ k past fp32's range
}
NAMES = list(CATEGORIES)


# Written into the corpus when the reference ran without oneDNN (check_corpus.py reads it).
ONEDNN_OFF_MARKER = "onednn-off"


def onednn_runs_a_bf16_lstm():
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.LSTM(4, 4, batch_first=True)(torch.randn(2, 3, 4))
        return True
    except RuntimeError:
        return False


def main(out, names):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    # nanscope-train runs TorchScript unoptimised, op by op. An optimising
    # executor (PyTorch 2.x, from the third call) fuses tabular_mlp's
    # sigmoid and log into one kernel that computes in fp32, and the bf16
    # hazard is gone: the reference must run the same ops.
    torch._C._set_graph_executor_optimize(False)
    # The same kernels as nanscope under NANSCOPE_ONEDNN=off (a CPU without
    # AVX-512, where LibTorch runs its own bf16 gemm instead of oneDNN's). A
    # CPU where this torch's oneDNN cannot run a bf16 LSTM at all (torch 2.6 on
    # an AVX2-only CPU: "could not create a primitive descriptor") gets the
    # same: the marker file tells check_corpus.py to run nanscope so too.
    marker = os.path.join(out, ONEDNN_OFF_MARKER)
    if os.path.exists(marker):
        os.remove(marker)
    if os.environ.get("NANSCOPE_ONEDNN") == "off" or not onednn_runs_a_bf16_lstm():
        torch.backends.mkldnn.enabled = False
        with open(marker, "w") as f:
            f.write("off\n")
    entries = []
    for name in names:
        g = torch.Generator().manual_seed(1234)
        model, clean, faulted, bad, export = build(name, g)
        example = (clean[0][:BATCH], clean[1][:BATCH])
        if export == "traced":
            exported = torch.jit.trace(model, example)
        elif export == "traced_inside_script":  # the traced GPT inside the scripted LossOf
            exported = torch.jit.script(cm.LossOf(torch.jit.trace(model.gpt, example)))
        else:
            exported = torch.jit.script(model)
        exported.save(f"{out}/{name}.pt")
        save_data(f"{out}/{name}-clean.h5", *clean)
        save_data(f"{out}/{name}-faulted.h5", *faulted)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        clean_failure = reference(model, *clean)
        model.load_state_dict(initial)
        torch.manual_seed(0)
        found = reference(model, *faulted)
        if clean_failure is not None:
            raise SystemExit(f"{name}: the clean data fails at step {clean_failure['step']}")
        if found is None:
            raise SystemExit(f"{name}: the faulted data never fails")
        expected_step = bad // BATCH
        if found["step"] != expected_step:
            raise SystemExit(f"{name}: failed at step {found['step']}, not at the bad row's step {expected_step}")
        found["bad_row"] = bad % BATCH
        entries.append(dict(name=name, model=f"{name}.pt", export=export, clean=f"{name}-clean.h5",
                            faulted=f"{name}-faulted.h5", steps=STEPS, batch_size=BATCH, lr=LR, amp="bf16",
                            category=CATEGORIES[name], modules=[n for n, _ in exported.named_modules()],
                            reference=found))
        print(name, json.dumps(found))
    with open(f"{out}/corpus.json", "w") as f:
        json.dump(entries, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    main(sys.argv[1], sys.argv[2:] or NAMES)
