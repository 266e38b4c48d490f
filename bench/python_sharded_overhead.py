"""What nanscope.StepGuard costs an FSDP2 (or DDP) loop on a clean step.

N ranks over Gloo on CPU (--ranks, default 2), each holding two copies of the
gpt of bench/python_gpt_loop.py, sharded with fully_shard (per block and the
root) or wrapped in DistributedDataParallel (--engine ddp): one trained by the
plain bf16 loop (autocast, backward, clip_grad_norm_, AdamW, one loss.item()
per step), the other by the same loop in the guard's watched form
(guard.autocast, guard.scale(loss).backward(), unscale_, clip_grad_norm_,
guard.step, guard.update). Blocks alternate so both see the same machine;
rank 0 prints each loop's median step time, their ratio, and the median of
the blocks' own ratios (each block's guarded steps against its plain ones,
which ran beside them: less of the machine's drift).

usage: PYTHONPATH=BUILD/python python3 bench/python_sharded_overhead.py [--ranks 2] [--engine fsdp2|ddp]
       [--blocks 8] [--steps 10]
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt_loop import Gpt, alternated_arguments  # noqa: E402


def sharded_gpt(engine, vocab, seq_len):
    torch.manual_seed(0)
    model = Gpt(4, 4, 128, seq_len, vocab)
    if engine == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def rank_main(rank, a, store, run_dir):
    import nanscope
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=a.ranks)
    vocab = 256
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, vocab, (a.batch_size, a.seq_len), generator=g)
    y = torch.randint(0, vocab, (a.batch_size, a.seq_len), generator=g)
    plain, guarded = sharded_gpt(a.engine, vocab, a.seq_len), sharded_gpt(a.engine, vocab, a.seq_len)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    guarded_opt = torch.optim.AdamW(guarded.parameters(), lr=1e-4)
    guard = nanscope.StepGuard(guarded, guarded_opt, run_dir=os.path.join(run_dir, "guarded"), amp="bf16",
                               log=False, loss_fn=lambda m, b: m(*b))

    def plain_step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = plain(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)
        return loss.item()

    def guarded_step():
        with guard.autocast():
            loss = guarded(x, y)
        guard.scale(loss, (x, y)).backward()
        guard.unscale_(guarded_opt)
        torch.nn.utils.clip_grad_norm_(guarded.parameters(), 1.0)
        result = guard.step(guarded_opt)
        guard.update()
        guarded_opt.zero_grad(set_to_none=True)
        return result.loss

    times = {"plain": [], "guarded": []}
    ratios = []  # each block's guarded median over its plain one: neighbours that saw the same machine
    for step in (plain_step, guarded_step):  # warm-up
        for _ in range(2):
            step()
    for block in range(a.blocks):
        order = [("plain", plain_step), ("guarded", guarded_step)]
        this_block = {"plain": [], "guarded": []}
        for name, step in order if block % 2 == 0 else order[::-1]:
            for _ in range(a.steps):
                dist.barrier()
                start = time.perf_counter()
                step()
                this_block[name].append(time.perf_counter() - start)
            times[name] += this_block[name]
        ratios.append(statistics.median(this_block["guarded"]) / statistics.median(this_block["plain"]))
    guard.close()
    if rank == 0:
        plain_ms = statistics.median(times["plain"]) * 1e3
        guarded_ms = statistics.median(times["guarded"]) * 1e3
        print(f"{a.engine.upper()}, {a.ranks} ranks (Gloo, CPU), bf16, batch {a.batch_size}x{a.seq_len}, "
              f"{a.blocks} alternated blocks of {a.steps} steps")
        print(f"  plain {a.engine.upper():5} loop     median {plain_ms:8.2f} ms/step")
        print(f"  guarded (watched)    median {guarded_ms:8.2f} ms/step")
        print(f"  guarded/plain        {guarded_ms / plain_ms:.3f} (median of the {len(ratios)} blocks' own ratios "
              f"{statistics.median(ratios):.3f})")
    dist.destroy_process_group()


def main():
    p = alternated_arguments(__doc__, threads=1)
    p.add_argument("--ranks", type=int, default=2, help="processes (Gloo ranks on this machine)")
    p.add_argument("--engine", choices=["fsdp2", "ddp"], default="fsdp2")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(a, os.path.join(tmp, "store"), tmp), nprocs=a.ranks)


if __name__ == "__main__":
    main()
