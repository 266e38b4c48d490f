"""Your own loop in the watched form: forward, backward, clipping and the
update stay the loop's; the guard takes torch.amp.GradScaler's place. The toy
task's sample 21 is blank, and its hand-made normalisation divides 0 by 0."""
import sys

import torch
import torch.nn.functional as F

import nanscope
from toy_task import Net, planted_dataset

run_dir = sys.argv[1] if len(sys.argv) > 1 else "watched-run"
torch.manual_seed(0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(planted_dataset("blank"), batch_size=4)
guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16",
                           loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]))
for x, y in loader:
    with guard.autocast():                   # autocast at the guard's precision (fp32 after a fallback)
        loss = F.cross_entropy(model(x), y)
    guard.backward(loss, (x, y))             # was: loss.backward(); names the micro-batch
    guard.unscale_()                         # before your own clipping (fp16)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    result = guard.step()                    # the one host read: optimizer.step(), or the skip
    if result.skipped:
        print("skipped:", result.first_birth)
    optimizer.zero_grad(set_to_none=True)
