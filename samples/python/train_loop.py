# A PyTorch training loop of your own, with its optimizer and scheduler, run
# through nanscope's step guard; then the snapshot of the failed step replayed.
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class Scale(nn.Module):
    def forward(self, x):
        return x / x.abs().sum(1, keepdim=True)  # a hand-made normalisation: 0 / 0 for a blank sample


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(Scale(), nn.Linear(8, 8), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def loss_of(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


run_dir = sys.argv[1] if len(sys.argv) > 1 else "python-run"
torch.manual_seed(0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16", config=nanscope.GuardConfig(clip=1.0))
for step in range(20):
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    if step == 12:
        x[5] = 0  # a blank sample
    result = guard.closure_step(lambda: loss_of(model, (x, y)), batch=(x, y))
    scheduler.step()
    if not result.counted:
        print(f"step {step}: first birth: {result.first_birth}")
    if result.stop:
        break

report = nanscope.replay(guard.snapshots[0], model=Net, loss=loss_of, write=False)
print(report)  # report.verdict, report.category, report.rows, report.to_dict(), ...
