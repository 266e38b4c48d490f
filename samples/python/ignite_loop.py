# A PyTorch-Ignite Engine whose update function is the plain training step
# that create_supervised_trainer builds, with TerminateOnNan and a running
# average of the loss, and nanscope's guard in it. The lines marked "nanscope"
# are all the change; the test suite runs this file as written, and again with
# those lines undone (the plain loop, which TerminateOnNan ends at the NaN).
# Usage: ignite_loop.py RUN_DIR [FAULT]
#        FAULT: nan or blank, planted in sample 21 (toy_task.py)
import sys

import torch
import torch.nn as nn
from ignite.engine import Engine, Events
from ignite.handlers import TerminateOnNan
from ignite.metrics import RunningAverage

import nanscope  # nanscope
from toy_task import Net, planted_dataset

run_dir = sys.argv[1]
fault = sys.argv[2] if len(sys.argv) > 2 else "nan"
loader = torch.utils.data.DataLoader(planted_dataset(fault), batch_size=4)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()


def train_step(engine, batch):
    model.train()
    optimizer.zero_grad()
    x, y = batch
    y_pred = model(x)
    loss = loss_fn(y_pred, y)
    guard.backward(loss, batch)  # nanscope (was: loss.backward())
    guard.step()  # nanscope (was: optimizer.step())
    return loss.item()


trainer = Engine(train_step)
trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan())
RunningAverage(output_transform=lambda loss: loss).attach(trainer, "running_loss")
guard = nanscope.StepGuard(model, optimizer, run_dir=run_dir, amp="bf16",  # nanscope
                           loss_fn=lambda model, batch: loss_fn(model(batch[0]), batch[1]))  # nanscope
guard.attach(trainer)  # nanscope


@trainer.on(Events.ITERATION_COMPLETED)
def log_iteration(engine):
    print(f"iteration {engine.state.iteration}: loss {engine.state.output:.4f}, "
          f"running {engine.state.metrics['running_loss']:.4f}")


trainer.run(loader, max_epochs=2)
print(f"stopped after iteration {trainer.state.iteration};",
      "weights finite:", all(bool(p.isfinite().all()) for p in model.parameters()))
