# A skorch classifier guarded by nanscope: two overrides of NeuralNet, the
# optimizer's (the guard is made with it) and the training step's (the guard
# runs it, closure form), and the rest of skorch as it is: fit, callbacks,
# history, predict. The test suite runs this file as written.
# Usage: skorch_loop.py RUN_DIR [FAULT]
#        FAULT: nan or blank, planted in sample 21 (toy_task.py)
import sys

import torch
import torch.nn as nn
from skorch import NeuralNetClassifier
from skorch.dataset import unpack_data

import nanscope
from toy_task import FAULTY_SAMPLE, Net, planted_dataset


class GuardedNet(NeuralNetClassifier):
    """NeuralNetClassifier whose every training step is nanscope's: a
    non-finite step is skipped (the optimizer, the weights and the buffers as
    before it), its first birth named and its snapshot written to run_dir."""

    def __init__(self, *args, run_dir="nanscope-run", **kwargs):
        super().__init__(*args, **kwargs)
        self.run_dir = run_dir

    def initialize_optimizer(self, *args, **kwargs):
        super().initialize_optimizer(*args, **kwargs)
        self.guard_ = nanscope.StepGuard(
            self.module_, self.optimizer_, run_dir=self.run_dir, log=False,
            loss_fn=lambda module, batch: self.get_loss(module(batch[0]), batch[1], training=True))
        return self

    def train_step(self, batch, **fit_params):
        self.module_.train()
        Xi, yi = unpack_data(batch)
        step = {}

        def loss():
            step["y_pred"] = self.infer(Xi, **fit_params)
            step["loss"] = self.get_loss(step["y_pred"], yi, X=Xi, training=True)
            return step["loss"]

        self.last_step_ = self.guard_.closure_step(loss, batch=(Xi, yi))
        if self.last_step_.skipped:
            print(f"skipped: {self.last_step_.first_birth}; {self.last_step_.remedy}")
        return {"loss": step["loss"].detach(), "y_pred": step["y_pred"].detach()}


if __name__ == "__main__":
    run_dir = sys.argv[1]
    fault = sys.argv[2] if len(sys.argv) > 2 else "nan"
    data = planted_dataset(fault)
    X, y = data.tensors
    net = GuardedNet(Net, run_dir=run_dir, criterion=nn.CrossEntropyLoss, optimizer=torch.optim.AdamW, lr=1e-2,
                     max_epochs=2, batch_size=4, train_split=None, iterator_train__shuffle=False, verbose=0)
    net.fit(X, y)
    print("epochs:", len(net.history), "sample", FAULTY_SAMPLE, "fault:", fault)
    print("weights finite:", all(bool(p.isfinite().all()) for p in net.module_.parameters()))
    print("predictions:", net.predict(X[:8]).tolist())
