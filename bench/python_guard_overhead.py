"""What nanscope.StepGuard costs a Python loop on a clean step.

The gpt of bench/python_gpt_loop.py trained three ways in one process, in
alternating blocks so all three see the same machine: the canonical bf16 loop
(autocast, backward, clip_grad_norm_, AdamW, one loss.item() per step); the
same loop through nanscope.StepGuard (amp bf16, clip 1.0: the guard does the
backward, clip and step); and the canonical loop under anomaly mode, PyTorch's
own NaN tool. Prints each one's median step time and the ratios.
On a GPU (--device cuda) the precision may be fp16 (--amp fp16): the canonical
loop then scales its loss with torch.amp.GradScaler and the guard with its own.

usage: PYTHONPATH=BUILD/python /usr/bin/python3 bench/python_guard_overhead.py [--blocks 8] [--steps 10]
           [--device cpu|cuda] [--amp bf16|fp16]
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt_loop import Gpt, alternated_arguments  # noqa: E402

import nanscope  # noqa: E402


def main():
    parser = alternated_arguments(__doc__, threads=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--amp", choices=["bf16", "fp16"], default="bf16", help="fp16 needs a GPU or torch 2.x")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    vocab = 256
    x = torch.randint(0, vocab, (a.batch_size, a.seq_len), device=a.device)
    y = torch.randint(0, vocab, (a.batch_size, a.seq_len), device=a.device)
    dtype = torch.float16 if a.amp == "fp16" else torch.bfloat16

    def make():
        torch.manual_seed(0)
        model = Gpt(4, 4, 128, a.seq_len, vocab).to(a.device)
        return model, torch.optim.AdamW(model.parameters(), lr=3e-4)

    def loss_of(model):
        return model(x, y)  # the gpt returns its cross-entropy loss

    plain_model, plain_opt = make()

    # torch.amp.GradScaler is torch 2.x's; 1.13 has only the CUDA one (and no fp16 on the CPU).
    scaler = (torch.amp.GradScaler(a.device, enabled=a.amp == "fp16") if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=a.amp == "fp16"))

    def plain_step(model=plain_model, optimizer=plain_opt):
        with torch.autocast(a.device, dtype=dtype):
            loss = loss_of(model)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        return loss.item()

    anomaly_model, anomaly_opt = make()

    def anomaly_step():
        with torch.autograd.detect_anomaly():
            return plain_step(anomaly_model, anomaly_opt)

    guarded_model, guarded_opt = make()
    run_dir = tempfile.mkdtemp(prefix="nanscope-bench-")
    guard = nanscope.StepGuard(guarded_model, guarded_opt, run_dir=run_dir, amp=a.amp, log=False,
                               config=nanscope.GuardConfig(clip=1.0))

    def guarded_step():
        return guard.closure_step(lambda: loss_of(guarded_model), batch=(x, y)).loss

    loops = {"plain": plain_step, "guard": guarded_step, "anomaly": anomaly_step}
    times = {name: [] for name in loops}
    for name, step in loops.items():  # warm-up
        for _ in range(3):
            step()
    for _ in range(a.blocks):
        for name, step in loops.items():
            for _ in range(a.steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name in loops:
        print(f"{name:8s} median step {median[name]:.2f} ms over {len(times[name])} steps")
    print(f"guard/plain = {median['guard'] / median['plain']:.3f}")
    print(f"anomaly/plain = {median['anomaly'] / median['plain']:.3f}")


if __name__ == "__main__":
    main()
