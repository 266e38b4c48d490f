"""What nanscope's watched form costs a nanoGPT-shaped loop on clean steps.

The gpt of bench/python_gpt_loop.py trained as karpathy/nanoGPT's train.py
trains: gradient accumulation over micro-batches (the loss divided by their
number, each with its own backward), bf16 autocast, the LR set by hand every
iteration, unscale_ + clip_grad_norm_, AdamW, zero_grad(set_to_none=True), one
loss.item() per step. Once as written (GradScaler-free, as on CPU) and once
with nanscope.StepGuard taking GradScaler's place (guard.autocast(),
guard.scale(loss).backward(), guard.unscale_, guard.step, guard.update).

Time: both loops in one process, in alternating blocks after a warm-up;
medians of the step time, and their ratio. Memory (--memory): each loop in its
own process, alternated, its peak RSS above the RSS of the model and its
optimizer state before any forward (activations, gradients, and whatever the
guard keeps); medians of three runs each, and their ratio.

usage: PYTHONPATH=BUILD/python /usr/bin/python3 bench/python_watched_overhead.py [--micro-batches 8]
       [--n-layer 2 --n-embd 128 --vocab 256] [--memory]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt_loop import GplBatches, Gpt  # noqa: E402

import nanscope  # noqa: E402


def plain_step(model, optimizer, batches, it, a):
    for group in optimizer.param_groups:
        group["lr"] = 3e-4
    for micro in range(a.micro_batches):
        x, y = batches(it * a.micro_batches + micro)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y) / a.micro_batches
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()


def guarded_step(model, optimizer, batches, it, a, guard, ctx):
    for group in optimizer.param_groups:
        group["lr"] = 3e-4
    for micro in range(a.micro_batches):
        x, y = batches(it * a.micro_batches + micro)
        with ctx:
            loss = model(x, y) / a.micro_batches
        guard.scale(loss).backward()
    guard.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    guard.step(optimizer)
    guard.update()
    optimizer.zero_grad(set_to_none=True)


def build(a, run_dir, guarded):
    torch.manual_seed(0)
    model = Gpt(a.n_layer, 4, a.n_embd, a.seq_len, vocab=a.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    if not guarded:
        return model, optimizer, lambda batches, it: plain_step(model, optimizer, batches, it, a)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                               loss_fn=lambda m, b: m(*b))
    ctx = guard.autocast()
    return model, optimizer, lambda batches, it: guarded_step(model, optimizer, batches, it, a, guard, ctx)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_memory_run(a):
    """This process: one loop, its peak RSS above the model's (printed)."""
    batches = GplBatches(a.seq_len, a.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        model, optimizer, step = build(a, tmp, a.one == "guarded")
        # The model and its optimizer state, before any forward: the base.
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        base = peak_rss_mib()
        for it in range(a.steps):
            step(batches, it)
        print(f"peak_above_model_mib={peak_rss_mib() - base:.1f} base_mib={base:.1f} peak_mib={peak_rss_mib():.1f}")


def memory(a):
    above = {"plain": [], "guarded": []}
    whole = {"plain": [], "guarded": []}
    for _ in range(3):
        for which in ("plain", "guarded"):
            out = subprocess.run([sys.executable, __file__, "--one", which, "--steps", str(a.steps),
                                  "--micro-batches", str(a.micro_batches), "--batch-size", str(a.batch_size),
                                  "--threads", str(a.threads), "--n-layer", str(a.n_layer), "--n-embd",
                                  str(a.n_embd), "--vocab", str(a.vocab)],
                                 capture_output=True, text=True, check=True).stdout
            above[which].append(float(out.split("peak_above_model_mib=")[1].split()[0]))
            whole[which].append(float(out.split("peak_mib=")[1].split()[0]))
    p, g = statistics.median(above["plain"]), statistics.median(above["guarded"])
    wp, wg = statistics.median(whole["plain"]), statistics.median(whole["guarded"])
    print(f"peak RSS, {a.micro_batches} micro-batches, {a.steps} steps (medians of 3 processes each): the process "
          f"plain {wp:.1f} MiB, guarded {wg:.1f} MiB, ratio {wg / wp:.3f}; above the model plain {p:.1f} MiB, "
          f"guarded {g:.1f} MiB, ratio {g / p:.3f} (the guard's rollback ring keeps a state every 25 steps)")


def timing(a):
    batches = GplBatches(a.seq_len, a.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        loops = {"plain": build(a, tmp, False)[2], "guarded": build(a, tmp, True)[2]}
        times = {name: [] for name in loops}
        it = 0
        for name, step in loops.items():  # warm-up
            step(batches, it)
            it += 1
        block_ratios = []
        for _ in range(a.blocks):
            block = {}
            for name, step in loops.items():
                block[name] = []
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    step(batches, it)
                    block[name].append(time.perf_counter() - t0)
                    it += 1
                times[name] += block[name]
            # Neighbouring blocks see the same machine: their ratio holds where its speed drifts.
            block_ratios.append(statistics.median(block["guarded"]) / statistics.median(block["plain"]))
    p, g = statistics.median(times["plain"]), statistics.median(times["guarded"])
    print(f"clean step, {a.micro_batches} micro-batches x {a.batch_size} rows (medians of {a.blocks} alternated "
          f"blocks x {a.steps} steps): plain {p * 1e3:.2f} ms, guarded {g * 1e3:.2f} ms, ratio {g / p:.3f}; "
          f"median of the blocks' ratios {statistics.median(block_ratios):.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256,
                   help="embedding and head rows (50304: nanoGPT's GPT-2 vocabulary, where per-element work shows)")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory", action="store_true", help="measure peak memory (one process per run)")
    p.add_argument("--one", choices=["plain", "guarded"], help=argparse.SUPPRESS)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.one:
        one_memory_run(a)
    elif a.memory:
        memory(a)
    else:
        timing(a)


if __name__ == "__main__":
    main()
