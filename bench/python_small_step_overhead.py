"""What the watched form costs a small step, where the guard's fixed cost per
step shows most: an MNIST-shaped RNN (an LSTM over 28 rows of 28 pixels,
BatchNorm on its last state, a linear head), bf16 autocast, Adam, trained

  - by the plain loop (autocast, backward, optimizer.step());
  - by the same loop with nanscope.StepGuard in GradScaler's place;

one step of each in turn, in one process. The arms take turns going first in
each pair (plain-guarded, then guarded-plain), so that neither always runs on
what the other left in the caches. Prints each arm's median step, their ratio
with a 95% interval, the guard's own time per step (the difference), and what
a skip costs when the micro-batch itself holds the NaN (the guard sees it in
the batch and needs no forensic re-run), in clean guarded steps.

The interval: a shared machine slows whole stretches of steps, both arms alike
within a stretch. The ratio is taken again over 2000 resamples of the pairs,
drawn in runs of 10 consecutive pairs (a stretch stays together), and the
interval holds the middle 95% of those ratios.

Then, in a guarded run of its own, the guard's own time per call, each call
timed where the loop makes it (median over the steps): the model call's two
hooks, guard.backward() less the backward itself, and guard.step() less the
optimizer's step. Their sum is the guard's own time without the noise between
arms. It is printed as the median over all steps and as the median of the
quietest block of 50.

usage: PYTHONPATH=BUILD/python /usr/bin/python3 bench/python_small_step_overhead.py [--pairs 300]
"""
import argparse
import random
import statistics
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class RowRnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 64, batch_first=True)
        self.norm = nn.BatchNorm1d(64)
        self.head = nn.Linear(64, 10)

    def forward(self, images):
        out, _ = self.lstm(images.view(-1, 28, 28))
        return self.head(self.norm(out[:, -1]))


def arm(guarded, run_dir, batches):
    torch.manual_seed(0)
    model = RowRnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if guarded:
        guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                                   loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
        context = guard.autocast()
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)

    def step(i, poisoned=False):
        x, y = batches[i % len(batches)]
        if poisoned:
            x = x.clone()
            x[3, 0, 5] = float("nan")
        start = time.perf_counter()
        with context:
            loss = F.cross_entropy(model(x), y)
        if guarded:
            guard.backward(loss, (x, y))
            guard.step()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - start
    return step


def own_time_per_call(batches, run_dir, steps=400):
    """The guard's own calls in a step, each timed (microseconds, medians)."""
    from nanscope import _watch  # the hooks the guard puts on the model, timed where they run
    torch.manual_seed(0)
    model = RowRnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", log=False,
                               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    times = {"model call's hooks": [], "backward() less the backward": [], "step() less the optimizer": []}
    hooks, inner = [0.0], {"backward": 0.0, "optimizer": 0.0}

    def timed(function, into):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                into(time.perf_counter() - start)
        return call

    def add_hook(seconds):
        hooks[0] += seconds
    originals = (_watch._CallRecorder.__call__, _watch._CallEnd.__call__)
    _watch._CallRecorder.__call__ = timed(originals[0], add_hook)
    _watch._CallEnd.__call__ = timed(originals[1], add_hook)
    optimizer.step = timed(optimizer.step, lambda t: inner.__setitem__("optimizer", t))
    try:
        context = guard.autocast()
        for i in range(steps):
            x, y = batches[i % len(batches)]
            hooks[0] = 0.0
            with context:
                loss = F.cross_entropy(model(x), y)
            start = time.perf_counter()
            scaled = guard.scale(loss, (x, y))
            middle = time.perf_counter()
            scaled.backward()
            end = time.perf_counter()
            guard.step()
            after = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            # The step's autograd graph is freed here, untimed, as the plain
            # loop frees it outside the guard's calls: left to the next
            # scale(), which rebinds `scaled`, it would be timed as the guard's.
            del loss, scaled
            if i >= steps // 4:  # warmed up
                times["model call's hooks"].append(hooks[0])
                times["backward() less the backward"].append(middle - start)
                times["step() less the optimizer"].append(after - end - inner["optimizer"])
    finally:
        _watch._CallRecorder.__call__, _watch._CallEnd.__call__ = originals
        guard.close()
    medians = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    # A shared machine's other work slows whole stretches of steps: the sum's
    # median in each block of 50 steps, the quietest of them beside the whole run's.
    sums = [sum(step) * 1e6 for step in zip(*times.values())]
    blocks = [statistics.median(sums[i:i + 50]) for i in range(0, len(sums) - 49, 50)]
    return medians, statistics.median(sums), min(blocks), len(blocks)


def ratio_interval(plain, guarded, run=10, resamples=2000):
    """The middle 95% of median(guarded) / median(plain) over resamples of the
    pairs, drawn in runs of `run` consecutive pairs."""
    rng = random.Random(0)
    starts = range(0, len(plain) - run + 1)
    ratios = []
    for _ in range(resamples):
        picked = [k for _ in range(len(plain) // run) for start in (rng.choice(starts),) for k in range(start, start + run)]
        ratios.append(statistics.median(guarded[k] for k in picked) / statistics.median(plain[k] for k in picked))
    ratios.sort()
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=300, help="steps of each arm, taken in turn")
    p.add_argument("--batch", type=int, default=64, help="images per step (raise it to bring the plain step near 10 ms: on this project's machine 80 on torch 1.13, 400 on 2.14)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(a.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (a.batch,), generator=g))
               for _ in range(16)]
    warm_up = 20
    with tempfile.TemporaryDirectory() as tmp:
        arms = {"plain": arm(False, None, batches), "guarded": arm(True, tmp + "/run", batches)}
        times = {name: [] for name in arms}
        for i in range(warm_up + a.pairs):
            order = ("plain", "guarded") if i % 2 == 0 else ("guarded", "plain")
            pair = {name: arms[name](i) for name in order}
            if i >= warm_up:
                for name in arms:
                    times[name].append(pair[name])
        plain, guarded = statistics.median(times["plain"]), statistics.median(times["guarded"])
        low, high = ratio_interval(times["plain"], times["guarded"])
        # Skips whose batch holds the NaN, each between clean steps, against those clean steps.
        i = warm_up + a.pairs
        skips, clean = [], []
        for k in range(12):
            clean.append(arms["guarded"](i))
            skips.append(arms["guarded"](i + 1, poisoned=True))
            i += 2
        print(f"watched form, LSTM 28x64 + BatchNorm over 28x28 images, batch {a.batch}, bf16, Adam, "
              f"{a.threads} thread(s), torch {torch.__version__} ({a.pairs} steps of each arm in turn)")
        print(f"  plain {plain * 1e3:.2f} ms, guarded {guarded * 1e3:.2f} ms, ratio {guarded / plain:.3f} "
              f"(95% interval {low:.3f} to {high:.3f}); the guard's own {1e3 * (guarded - plain):+.3f} ms")
        print(f"  a skip whose batch holds the NaN: {statistics.median(skips) * 1e3:.2f} ms = "
              f"{statistics.median(skips) / statistics.median(clean):.2f} clean guarded steps")
        calls, summed, quietest, blocks = own_time_per_call(batches, tmp + "/calls")
        print("  the guard's own time per call (median us): " +
              ", ".join(f"{name} {us:.0f}" for name, us in calls.items()) +
              f"; in all {summed:.0f} us a step (median of the steps' sums; "
              f"{quietest:.0f} in the quietest of {blocks} blocks of 50 steps)")


if __name__ == "__main__":
    main()
