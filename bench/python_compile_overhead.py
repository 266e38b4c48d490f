"""The guard around a torch.compile'd model (torch 2.6, the 2.x lane): the same
compiled GPT (bench/python_gpt_loop.py's, 2 x 128, batch 8 x 64, bf16 autocast,
AdamW, clip 1.0, Inductor) stepped by a plain PyTorch loop and by
nanscope.StepGuard, in alternating blocks after both have compiled; prints the
median step of each and the ratio. Goal: within 3%.

Usage: PYTHONPATH=BUILD/python python3 bench/python_compile_overhead.py [--rounds 7] [--steps 20] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt_loop import GplBatches, Gpt  # noqa: E402

import nanscope  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    seq = 64
    batch_of = GplBatches(seq, 8)
    model = Gpt(2, 4, 128, seq)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = 0

    def plain():
        nonlocal step
        x, y = batch_of(step)
        step += 1
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()

    with tempfile.TemporaryDirectory() as run_dir:
        guard = nanscope.StepGuard(compiled, optimizer, run_dir=run_dir, amp="bf16", log=False,
                                   config=nanscope.GuardConfig(clip=1.0))

        def guarded():
            nonlocal step
            x, y = batch_of(step)
            step += 1
            guard.closure_step(lambda: compiled(x, y), batch=(x, y))

        for fn in (plain, guarded, plain, guarded):  # compile (and any recompile) before timing
            fn()
        times = {"plain": [], "guarded": []}
        for _ in range(a.rounds):
            for name, fn in (("plain", plain), ("guarded", guarded)):
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
    plain_ms, guarded_ms = (statistics.median(times[k]) * 1e3 for k in ("plain", "guarded"))
    print(f"compiled GPT 2x128, bf16, {a.rounds} rounds x {a.steps} steps alternated: plain loop {plain_ms:.2f} ms, "
          f"nanscope.StepGuard {guarded_ms:.2f} ms, ratio {guarded_ms / plain_ms:.3f}")


if __name__ == "__main__":
    main()
