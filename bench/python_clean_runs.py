"""False alarms in Python: the pre-LN GPT of python_gpt_loop.py trained under
nanscope.StepGuard (bf16, AdamW, byte-level GPL-3, batch 8 x 64, in order) at
several LRs and seeds with nothing planted; every warning is a false alarm.
Prints one line per run and a total. Goal: none.

Usage: PYTHONPATH=BUILD/python python3 bench/python_clean_runs.py [--steps 300] [--lrs 3e-4,1e-3,3e-3] [--seeds 0,1]
"""
import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt_loop import GplBatches, Gpt  # noqa: E402  the speed baseline's model and data

import nanscope  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    seq = 64
    batches = GplBatches(seq, 8)
    total_steps = total_warnings = 0
    print("python_clean_runs: nothing planted; every warning is a false alarm")
    for lr in (float(x) for x in a.lrs.split(",")):
        for seed in (int(x) for x in a.seeds.split(",")):
            torch.manual_seed(seed)
            model = Gpt(2, 4, 128, seq)
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
            with tempfile.TemporaryDirectory() as run_dir:
                guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                                           config=nanscope.GuardConfig(clip=1.0))
                warnings, skipped = [], 0
                for step in range(a.steps):
                    x, y = batches(step)
                    result = guard.closure_step(lambda: model(x, y), batch=(x, y))
                    warnings += [f"step {step}: {w}" for w in result.warnings]
                    skipped += not result.counted
            if skipped:
                print(f"  lr {lr:g} seed {seed}: went non-finite on {skipped} step(s) for real: not counted")
                continue
            print(f"  lr {lr:g} seed {seed}: {a.steps} steps, {len(warnings)} warning(s)"
                  + "".join(f"\n    {w}" for w in warnings))
            total_steps += a.steps
            total_warnings += len(warnings)
    print(f"python_clean_runs: {total_warnings} warning(s) in {total_steps} clean steps")


if __name__ == "__main__":
    main()
