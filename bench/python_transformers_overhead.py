"""What the guard costs a Hugging Face fine-tune on clean steps: a small Llama
causal LM (left-padded, bf16 autocast on CPU), trained

  - by the Trainer, plain and with nanscope.guard_trainer(trainer) (one line);
  - by a hand-written loop, plain (torch.autocast, clip, AdamW) and with the
    guard in GradScaler's place (the watched form), its clip either
    clip_grad_norm_ as written or clip_grads_with_norm_ with the norm
    guard.unscale_() returns (not taken a second time).

Both arms of each pair in one process, alternated: the Trainer's as whole short
trainings (each step timed from on_step_begin to on_step_end by a callback, the
first steps of each training left out), the hand loop's as blocks of steps.
Medians of the step times, their ratio, and the median of the neighbouring
blocks' ratios (which holds where the machine's speed drifts).

usage: PYTHONPATH=BUILD/python python3 bench/python_transformers_overhead.py [--rounds 6] [--steps 12]
       (the LibTorch 2.14 lane's Python: Transformers 5.12)
"""
import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

import nanscope

transformers.logging.set_verbosity_error()


def model(a):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                         num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0)
    return LlamaForCausalLM(config)


def samples(a, n):
    g = torch.Generator().manual_seed(0)
    items = []
    for _ in range(n):
        length = int(torch.randint(a.seq // 2, a.seq + 1, (), generator=g))
        ids = torch.zeros(a.seq, dtype=torch.long)
        ids[a.seq - length:] = torch.randint(1, 256, (length,), generator=g)
        mask = (ids != 0).long()
        items.append({"input_ids": ids, "attention_mask": mask,
                      "labels": torch.where(mask.bool(), ids, torch.full_like(ids, -100))})
    return items


class Samples(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self._start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def trainer_run(a, items, guarded, out):
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=a.batch, max_steps=a.steps,
                             learning_rate=1e-4, bf16=True, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=10 ** 6, disable_tqdm=True, train_sampling_strategy="sequential",
                             dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model(a), args=args, train_dataset=Samples(items))
    if guarded:
        nanscope.guard_trainer(trainer, run_dir=out + "/run", log=False)
    times = StepTimes()
    trainer.add_callback(times)
    trainer.train()
    return times.times[a.skip:]


def hand_loop(a, items, guarded, out, reuse_norm=False):
    m = model(a)
    m.train()
    optimizer = torch.optim.AdamW(m.parameters(), lr=1e-4)
    loader = list(torch.utils.data.DataLoader(Samples(items), batch_size=a.batch, shuffle=False))

    def loss_of(model_, batch):
        return model_(**batch).loss
    if guarded:
        guard = nanscope.StepGuard(m, optimizer, run_dir=out + "/hand", amp="bf16", log=False, loss_fn=loss_of)
        context = guard.autocast()
    else:
        context = torch.autocast("cpu", dtype=torch.bfloat16)

    def step(i):
        batch = loader[i % len(loader)]
        with context:
            loss = loss_of(m, batch)
        if guarded:
            guard.backward(loss, batch)
            norm = guard.unscale_()
        else:
            loss.backward()
        if reuse_norm:
            torch.nn.utils.clip_grads_with_norm_(m.parameters(), 1.0, norm)
        else:
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        if guarded:
            guard.step()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return step


def report(name, times, block_ratios):
    p = statistics.median(times["plain"])
    arms = [f"plain {p * 1e3:.2f} ms"]
    for arm, ratios in block_ratios.items():
        g = statistics.median(times[arm])
        arms.append(f"{arm} {g * 1e3:.2f} ms, ratio {g / p:.3f} (median of the {len(ratios)} neighbouring blocks' "
                    f"ratios {statistics.median(ratios):.3f})")
    print(f"{name}:\n  " + "\n  ".join(arms))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6, help="alternations of the two arms")
    p.add_argument("--steps", type=int, default=14, help="steps per Trainer run and per hand-loop block")
    p.add_argument("--skip", type=int, default=4, help="first steps of each Trainer run left out")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    items = samples(a, a.batch * a.steps)
    with tempfile.TemporaryDirectory() as tmp:
        times = {"plain": [], "guarded": []}
        ratios = {"guarded": []}
        for r in range(a.rounds + 1):
            block = {arm: trainer_run(a, items, arm == "guarded", f"{tmp}/t{r}{arm}") for arm in ("plain", "guarded")}
            if r == 0:
                continue  # warm-up
            for arm in block:
                times[arm] += block[arm]
            ratios["guarded"].append(statistics.median(block["guarded"]) / statistics.median(block["plain"]))
        report(f"Trainer, Llama {a.layers}x{a.hidden}, batch {a.batch}x{a.seq}, bf16 ({a.rounds} alternated runs "
               f"x {a.steps - a.skip} steps)", times, ratios)

        steps = {"plain": hand_loop(a, items, False, f"{tmp}/plain"),
                 "guarded": hand_loop(a, items, True, f"{tmp}/guarded")}
        if hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch 2.6 and later
            steps["guarded, clipping with unscale_()'s norm"] = hand_loop(a, items, True, f"{tmp}/reused", True)
        times = {arm: [] for arm in steps}
        ratios = {arm: [] for arm in steps if arm != "plain"}
        i = 0
        for r in range(a.rounds + 1):
            block = {}
            for arm, step in steps.items():
                block[arm] = []
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    step(i)
                    block[arm].append(time.perf_counter() - t0)
                    i += 1
            if r == 0:
                continue
            for arm in block:
                times[arm] += block[arm]
            for arm in ratios:
                ratios[arm].append(statistics.median(block[arm]) / statistics.median(block["plain"]))
        report(f"hand loop (watched form), the same Llama ({a.rounds} alternated blocks x {a.steps} steps)", times,
               ratios)


if __name__ == "__main__":
    main()
