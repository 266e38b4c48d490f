# Hugging Face Accelerate's quick-tour loop (prepare, accumulate, backward, the
# prepared optimizer and scheduler) with nanscope's guard in it. The lines
# marked "nanscope" are all the change; the test suite runs this file as
# written, and again with those lines undone (the plain loop).
# Usage: accelerate_loop.py RUN_DIR [GRADIENT_ACCUMULATION_STEPS [FAULT]]
#        FAULT: blank or nan, planted in sample 21 (toy_task.py)
import sys

import torch
import torch.nn as nn
from accelerate import Accelerator

import nanscope  # nanscope
from toy_task import Net, planted_dataset

run_dir = sys.argv[1]
accumulation = int(sys.argv[2]) if len(sys.argv) > 2 else 1
fault = sys.argv[3] if len(sys.argv) > 3 else "blank"
accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=accumulation, cpu=True)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
training_dataloader = torch.utils.data.DataLoader(planted_dataset(fault), batch_size=4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
loss_function = nn.CrossEntropyLoss()
model, optimizer, training_dataloader, scheduler = accelerator.prepare(model, optimizer, training_dataloader, scheduler)
guard = nanscope.StepGuard(model, optimizer, accelerator=accelerator, run_dir=run_dir,  # nanscope
                           loss_fn=lambda model, batch: loss_function(model(batch[0]), batch[1]))  # nanscope
for i, batch in enumerate(training_dataloader):
    with accelerator.accumulate(model):
        inputs, targets = batch
        outputs = model(inputs)
        loss = loss_function(outputs, targets)
        guard.backward(loss, batch)  # nanscope (was: accelerator.backward(loss))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    accelerator.print(f"batch {i}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.6g}, "
                      f"skipped {accelerator.optimizer_step_was_skipped}")
accelerator.print("weights finite:", all(bool(p.isfinite().all()) for p in model.parameters()))
