"""The Python PyTorch baseline for bench/train_vs_python.sh.

The same GPT as nanscope-train's built-in (pre-LN, causal attention with
masked_fill(-inf), GELU MLP, learned positions, byte-level vocab 256), the same
data (byte windows of /usr/share/common-licenses/GPL-3, batches of rows
[i*B, (i+1)*B) wrapping around), the same loop (AdamW, clip_grad_norm_ after
backward, one host read of the loss per step), the same threads.
Prints: median_step_ms=<float>
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = torch.nn.Linear(n_embd, 3 * n_embd)
        self.proj = torch.nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head)
        self.ln2 = torch.nn.LayerNorm(n_embd)
        self.fc = torch.nn.Linear(n_embd, 4 * n_embd)
        self.proj = torch.nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, n_layer, n_head, n_embd, seq_len, vocab=256):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, n_embd)
        self.pos_emb = torch.nn.Embedding(seq_len, n_embd)
        self.blocks = torch.nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(n_embd)
        self.head = torch.nn.Linear(n_embd, vocab)

    def forward(self, idx, targets):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GplBatches:
    """The built-in gpt's data: byte windows of /usr/share/common-licenses/GPL-3,
    batch i the rows [i*B, (i+1)*B) wrapping around (nanscope-train --no-shuffle)."""

    def __init__(self, seq_len, batch_size):
        text = open("/usr/share/common-licenses/GPL-3", "rb").read()
        data = torch.tensor(list(text), dtype=torch.long)
        self.windows = (len(text) - 1) // seq_len
        index = (torch.arange(self.windows) * seq_len)[:, None] + torch.arange(seq_len)[None, :]
        self.inputs, self.targets = data[index], data[index + 1]
        self.batch_size = batch_size

    def __call__(self, step):
        rows = (torch.arange(self.batch_size) + step * self.batch_size) % self.windows
        return self.inputs[rows], self.targets[rows]


def alternated_arguments(description, threads):
    """The options of a bench that alternates blocks of plain and guarded steps."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=8, help="alternating blocks per loop")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=threads, help="threads per process")
    return p


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    p.add_argument("--nan-hooks", action="store_true",
                   help="the playbook's cheap NaN check (P9): a forward hook on every module "
                        "that tests its output with isfinite().all()")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    batches = GplBatches(a.seq_len, a.batch_size)
    model = Gpt(a.n_layer, a.n_head, a.n_embd, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    if a.nan_hooks:
        def check(module, inputs, output, name=""):
            if torch.is_tensor(output) and not torch.isfinite(output).all():
                print(f"NaN in {name}")
        for name, m in model.named_modules():
            m.register_forward_hook(lambda mod, i, o, n=name: check(mod, i, o, n))
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        x, y = batches(step)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    print(f"median_step_ms={statistics.median(times) * 1e3:.3f}")


if __name__ == "__main__":
    main()
