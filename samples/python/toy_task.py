"""The task the loop-library samples (accelerate_loop.py, ignite_loop.py)
train: a small classifier whose hand-made normalisation divides 0 by 0 for a
blank sample, on 64 random samples of which sample 21 carries the planted
fault."""
import torch
import torch.nn as nn

FAULTY_SAMPLE = 21


class Normalize(nn.Module):
    def forward(self, x):
        return x / x.abs().sum(1, keepdim=True)  # a hand-made normalisation: 0 / 0 for a blank sample


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.hidden, self.head = Normalize(), nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(nn.functional.gelu(self.hidden(self.norm(x))))


def planted_dataset(fault):
    """fault: 'blank' (the sample all zeros: 0 / 0 in Normalize) or 'nan' (a NaN in it)."""
    torch.manual_seed(0)
    inputs, targets = torch.randn(64, 8), torch.randint(0, 3, (64,))
    if fault == "blank":
        inputs[FAULTY_SAMPLE] = 0
    elif fault == "nan":
        inputs[FAULTY_SAMPLE, 3] = float("nan")
    else:
        raise ValueError(f"fault must be 'blank' or 'nan', not {fault!r}")
    return torch.utils.data.TensorDataset(inputs, targets)
