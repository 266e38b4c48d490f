"""Poison samples remembered in Python: a loop that names its batches' data
set rows (guard.backward(loss, batch, rows=...), closure_step(..., rows=...))
gets a `data` verdict's samples listed in RUN_DIR/poisoned_samples.jsonl, and
nanscope.LeaveOut leaves them out of every later epoch; the list is the one
nanscope-train reads, and a line edited wrong is a ValueError."""
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

import nanscope

CORRUPT_ROW = 5


class Rows(Dataset):
    """A data set whose items carry their row: (x, y, row)."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.x[CORRUPT_ROW] = float("nan")  # a corrupt record, met every epoch

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def guarded_model(run_dir):
    """A seeded classifier, its SGD and a bf16 guard whose loss_fn re-runs (x, y) micro-batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = nanscope.StepGuard(model, optimizer, run_dir=str(run_dir), amp="bf16",
                               loss_fn=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]), log=False)
    return model, optimizer, guard


def train(run_dir, sampler_of, epochs=3, form="watched"):
    """The loop over `epochs`; the steps it skipped, per epoch."""
    model, optimizer, guard = guarded_model(run_dir)
    data = Rows()
    sampler = sampler_of(data, run_dir)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    skipped = []
    for epoch in range(epochs):
        skipped.append(0)
        for x, y, rows in loader:
            if form == "watched":
                with guard.autocast():
                    loss = F.cross_entropy(model(x), y)
                guard.backward(loss, (x, y), rows=rows)
                result = guard.step()
                optimizer.zero_grad()
            else:
                result = guard.closure_step(lambda: F.cross_entropy(model(x), y), (x, y), rows=rows)
            skipped[-1] += not result.counted
            if result.listed_samples:
                assert result.listed_samples == [CORRUPT_ROW]
    guard.close()
    return skipped


@pytest.mark.parametrize("form", ["watched", "closure"])
def test_a_corrupt_sample_is_skipped_once_and_left_out_of_later_epochs(tmp_path, form):
    plain = train(tmp_path / "plain", lambda data, run_dir: RandomSampler(data), form=form)
    assert plain == [1, 1, 1], "without LeaveOut the sample comes back every epoch"
    left_out = train(tmp_path / "left-out", lambda data, run_dir: nanscope.LeaveOut(RandomSampler(data), run_dir),
                     form=form)
    assert left_out == [1, 0, 0]
    listed = nanscope.poisoned_samples(tmp_path / "left-out")
    assert [s["row"] for s in listed] == [CORRUPT_ROW]
    assert "the batch holds a non-finite value" in listed[0]["why"]
    # One JSON object per line: what json (and nanscope-train) reads.
    lines = (tmp_path / "left-out" / "poisoned_samples.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["row"] == CORRUPT_ROW


def test_a_loop_that_names_no_rows_lists_nothing(tmp_path):
    def unnamed(data, run_dir):
        return nanscope.LeaveOut(RandomSampler(data), run_dir)
    model, optimizer, guard = guarded_model(tmp_path)
    data = Rows()
    for x, y, _ in DataLoader(data, batch_size=8, sampler=unnamed(data, tmp_path)):
        guard.backward(F.cross_entropy(model(x), y), (x, y))
        assert guard.step().listed_samples == []
        optimizer.zero_grad()
    guard.close()
    assert nanscope.poisoned_samples(tmp_path) == []


def test_ranks_keep_their_lengths_and_never_draw_a_listed_row(tmp_path):
    (tmp_path / "poisoned_samples.jsonl").write_text('{"row": 3, "step": 1}\n{"row": 10, "step": 2, "note": "mine"}\n')
    data = Rows(32)
    drawn = []
    for rank in range(2):
        sampler = nanscope.LeaveOut(DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=1),
                                    tmp_path)
        sampler.set_epoch(4)
        rows = list(sampler)
        assert len(rows) == len(sampler) == 16, "an epoch keeps its length on every rank"
        assert not {3, 10} & set(rows)
        drawn += rows
    assert len(set(drawn)) == 30, "every other row is drawn (one rank draws a kept row twice per listed row)"


def test_given_the_guard_an_epoch_leaves_out_what_was_listed_two_steps_before_it_as_every_rank_does(tmp_path):
    """Several ranks: a row listed at the step just before an epoch begins may
    not be on disk yet when a quick rank begins it; with guard= every rank
    leaves out what was listed two steps or more before the epoch, as
    nanscope-train's epochs do, so all of them agree whatever their timing."""
    (tmp_path / "poisoned_samples.jsonl").write_text('{"row": 3, "step": 1}\n{"row": 10, "step": 4}\n')
    model, optimizer, guard = guarded_model(tmp_path / "g")
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    left_out = []
    for _ in range(7):
        sampler = nanscope.LeaveOut(range(16), tmp_path, guard=guard)
        rows = list(sampler)
        left_out.append(sorted(sampler.left_out))
        assert len(rows) == 16 and not sampler.left_out & set(rows)
        guard.backward(F.cross_entropy(model(x), y), (x, y))
        guard.step()
        optimizer.zero_grad()
    guard.close()
    # Epochs beginning at steps 0 to 6: row 3 (step 1) from step 3, row 10 (step 4) from step 6.
    assert left_out == [[], [], [], [3], [3], [3], [3, 10]], left_out
    unguarded = nanscope.LeaveOut(range(16), tmp_path)
    list(unguarded)
    assert sorted(unguarded.left_out) == [3, 10], "without the guard: every row listed so far"
    with pytest.raises(TypeError, match="guard="):
        nanscope.LeaveOut(range(16), tmp_path, guard=object())


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "poisoned_samples.jsonl").write_text('{"row": "five", "step": 1}\n')
    with pytest.raises(ValueError, match="line 1"):
        nanscope.poisoned_samples(tmp_path)
    with pytest.raises(ValueError, match="poisoned_samples.jsonl"):
        list(nanscope.LeaveOut(range(4), tmp_path))
    model = nn.Linear(4, 3)
    guard = nanscope.StepGuard(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=str(tmp_path / "g"),
                               log=False)
    x = torch.randn(2, 4)
    with pytest.raises(TypeError, match="rows="):
        guard.closure_step(lambda: model(x).sum(), x, rows=[0.5, 1.5])
    guard.close()
    (tmp_path / "poisoned_samples.jsonl").write_text('{"row": 0, "step": 1}\n{"row": 1, "step": 1}\n')
    with pytest.raises(ValueError, match="none is left"):
        list(nanscope.LeaveOut(range(2), tmp_path))


def test_a_step_of_micro_batches_lists_the_row_of_the_one_it_diagnosed(tmp_path):
    model, optimizer, guard = guarded_model(tmp_path)
    data = Rows()
    first, second = [0, 1, 2, 3], [4, CORRUPT_ROW, 6, 7]  # the corrupt row is in the second micro-batch
    for rows in (first, second):
        x, y = data.x[rows], data.y[rows]
        with guard.autocast():
            loss = F.cross_entropy(model(x), y) / 2
        guard.backward(loss, (x, y), rows=rows)
    result = guard.step()
    guard.close()
    assert not result.counted
    assert result.listed_samples == [CORRUPT_ROW], "the second micro-batch's batch row 1 is data set row 5"
    assert [s["row"] for s in nanscope.poisoned_samples(tmp_path)] == [CORRUPT_ROW]
    # Its snapshot keeps that micro-batch with its own data set rows.
    h5py = pytest.importorskip("h5py")
    with h5py.File(result.snapshot, "r") as f:
        assert list(f["batch/rows"][:]) == second
