"""A batch whose tensors hold their samples along different dimensions: an
LSTM's carried state (layers, batch, hidden) beside (batch, seq) data. The row
search cuts each tensor along its own dimension (found from the batch's size,
or named with row_dim={name: dim}); a search that cannot run says why and
escalates nothing."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nanscope


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, num_layers=2, batch_first=True)

    def forward(self, x, state):
        return self.lstm(x, state)[0]


def loss_of(model, batch):
    x, y, h, c = batch
    return F.mse_loss(model(x, (h, c)), y) + torch.log(x.mean((1, 2))).mean()


def one_step(tmp_path, batch_size, row_dim=0, lines=None):
    torch.manual_seed(0)
    model = Tagger()
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.01), run_dir=str(tmp_path), amp="fp32",
                               row_dim=row_dim, loss_fn=loss_of, config=nanscope.GuardConfig(fallback="auto"))
    x, y = torch.rand(batch_size, 4, 3), torch.rand(batch_size, 4, 5)
    x[1] *= -1  # one sample whose mean goes negative: its log is NaN
    h, c = torch.zeros(2, batch_size, 5), torch.zeros(2, batch_size, 5)
    result = guard.closure_step(lambda: loss_of(model, (x, y, h, c)), batch=(x, y, h, c))
    guard.close()
    return result


def test_a_carried_state_is_cut_along_its_own_dimension(tmp_path, nanscope_lines):
    result = one_step(tmp_path / "found", 6)
    # An ordinary sample whose mean the loss's own log cannot take: the op's trigger.
    assert result.remedy == "model_or_data" and not result.fell_back, nanscope_lines()
    assert "finite without batch row 1, an ordinary sample" in nanscope_lines()


def test_where_the_shape_cannot_tell_the_search_says_so_and_a_named_dimension_runs_it(tmp_path, nanscope_lines):
    result = one_step(tmp_path / "two", 2)  # two layers, two samples
    assert result.remedy == "model_or_data" and not result.fell_back
    assert "the row search could not run" in nanscope_lines()
    result = one_step(tmp_path / "named", 2, row_dim={"[2]": 1, "[3]": 1})
    assert result.remedy == "model_or_data", nanscope_lines()
    assert "finite without batch row 1" in nanscope_lines()
    with pytest.raises(ValueError, match="names 'hidden', which the batch has not"):
        one_step(tmp_path / "wrong", 2, row_dim={"hidden": 1})


def test_the_same_data_every_step_is_called_data_not_carried_state(tmp_path, nanscope_lines):
    """Full-batch training: the one batch, a NaN in one sample, every step."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(tmp_path), amp="fp32",
                               loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]),
                               config=nanscope.GuardConfig(fallback="off", rollback=False))
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    x[5, 2] = float("nan")
    for _ in range(3):
        guard.closure_step(lambda: F.mse_loss(model(x), y), batch=(x, y))
    lines = nanscope_lines()
    assert "is the same data again, reused every step" in lines, lines
    assert "State carried across steps" not in lines, lines
    guard.close()


class TinyDetector(nn.Module):
    """torchvision's detection call: images a list of (3, H, W) tensors of
    different sizes, targets a list of dicts (boxes, labels) per image."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 4)

    def forward(self, images, targets):
        loss = 0
        for image, target in zip(images, targets):
            features = self.backbone(image.unsqueeze(0)).mean((2, 3))
            loss = loss + ((self.head(features).squeeze(0) - target["boxes"].mean(0)) ** 2).mean()
        return loss / len(images)


def detection_batch(g):
    images = [torch.rand(3, 8 + i, 8, generator=g) for i in range(4)]
    targets = [{"boxes": torch.rand(1 + i % 2, 4, generator=g), "labels": torch.ones(1 + i % 2, dtype=torch.long)}
               for i in range(4)]
    return images, targets


def test_a_detection_batchs_nan_is_named_by_its_path_and_its_image(tmp_path, nanscope_lines):
    torch.manual_seed(0)
    model = TinyDetector()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32",
                               loss_fn=lambda m, b: m(*b))
    g = torch.Generator().manual_seed(0)
    images, targets = detection_batch(g)
    targets[3]["boxes"][0, 2] = float("nan")  # a NaN box coordinate of image 3
    result = guard.closure_step(lambda: model(images, targets), batch=(images, targets))
    assert result.skipped and result.remedy == "data", nanscope_lines()
    assert result.first_birth == "nan at input '[1][3].boxes' (input) in module '', batch row 3", result.first_birth
    box_snapshot = result.snapshot

    images, targets = detection_batch(g)
    images[2][1, 3, 3] = float("nan")  # a NaN pixel of image 2: its row is the image, not a colour channel
    result = guard.closure_step(lambda: model(images, targets), batch=(images, targets))
    assert result.first_birth == "nan at input '[0][2]' (input) in module '', batch row 2", result.first_birth
    assert "again (as step 0)" not in nanscope_lines(), "another image, another sample"
    guard.close()

    # The replay of the snapshot gives the same birth and cause as the run.
    report = nanscope.replay(box_snapshot, model=TinyDetector, loss=lambda m, b: m(*b), write=False)
    assert report.verdict == "data", report
    assert report.first_birth.sample == 3 and report.first_birth.phase == "input", report


def test_a_detection_step_the_model_breaks_is_searched_by_image(tmp_path, nanscope_lines):
    # An ordinary image whose boxes the model's own log cannot take: the row
    # search replaces one image (and its targets) by another's.
    torch.manual_seed(0)

    class LogBoxes(TinyDetector):
        def forward(self, images, targets):
            loss = 0
            for image, target in zip(images, targets):
                features = self.backbone(image.unsqueeze(0)).mean((2, 3))
                loss = loss + ((self.head(features).squeeze(0) - torch.log(target["boxes"]).mean(0)) ** 2).mean()
            return loss / len(images)

    model = LogBoxes()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(tmp_path / "run"), amp="fp32",
                               loss_fn=lambda m, b: m(*b))
    images, targets = detection_batch(torch.Generator().manual_seed(1))
    targets[1]["boxes"][0, 0] = 0.0  # a box at the image's edge: log(0)
    result = guard.closure_step(lambda: model(images, targets), batch=(images, targets))
    lines = nanscope_lines()
    assert result.skipped and result.remedy == "model_or_data", lines
    assert "finite without batch row 1 (each row tested by putting a copy of another row in its place" in lines, lines
    guard.close()
