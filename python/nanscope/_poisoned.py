"""The samples a run leaves out, for a DataLoader's loop: the run's poison
list (RUN_DIR/poisoned_samples.jsonl: each data set row a `data` verdict
blamed, written by the guard when the loop names its batches' rows with
guard.backward(loss, batch, rows=indices)) read by the same reader
nanscope-train uses, a sampler that leaves its rows out, and for the Hugging
Face Trainer a data set that names each sample's row and leaves listed rows
out, with the collator that carries the rows to the loss."""

import os
import sys
from collections.abc import Mapping, MutableMapping

from . import _nanscope


def _listed_rows(run_dir, epoch_start=None):
    """The rows the run's poison list leaves out: every row listed so far, or
    those an epoch beginning at step `epoch_start` leaves out (nanscope-train's
    rule: listed two steps or more before it)."""
    return frozenset(_nanscope.rows_left_out_at(str(run_dir), sys.maxsize if epoch_start is None else epoch_start))


def poisoned_samples(run_dir):
    """The run's poison list: a list of dicts (row, step, rank, birth, why),
    one per line of RUN_DIR/poisoned_samples.jsonl ([] without the file).
    A line edited wrong is a ValueError naming the file and the line."""
    return _nanscope.poisoned_samples(str(run_dir))


class LeaveOut:
    """Wraps a sampler (RandomSampler, SequentialSampler, DistributedSampler,
    or any that yields data set rows) so each epoch leaves out the rows in the
    run's poison list, read again as the epoch begins (iter()).

    A listed row is replaced by the row drawn before it (or, first in the
    epoch, by the next row that is not listed), not dropped: the epoch keeps
    its length, so the ranks of a DistributedSampler keep the same number of
    batches and none waits for another at the epoch's end. A sample the loop
    met in this epoch is listed during it and left out from the next.

    guard: the StepGuard of several ranks' loop. The epoch then leaves out
    the rows listed two steps or more before it starts (nanscope-train's
    rule): by then every rank's line is on disk, so every rank leaves out the
    same rows, however quick it is to begin the epoch, and a resumed run the
    same as the run it resumes. Without it, every row listed so far.

        sampler = nanscope.LeaveOut(DistributedSampler(data), run_dir, guard=guard)
        loader = DataLoader(IndexedDataset(data), sampler=sampler, ...)
        for x, y, rows in loader:
            guard.backward(loss_fn(model(x), y), (x, y), rows=rows)
    """

    def __init__(self, sampler, run_dir, *, guard=None):
        if guard is not None and not hasattr(guard, "next_step"):
            raise TypeError(f"nanscope.LeaveOut: guard= takes the loop's nanscope.StepGuard, got {guard!r}")
        self.sampler = sampler
        self.run_dir = str(run_dir)
        self.guard = guard
        self.left_out = frozenset()  # the rows this epoch leaves out (read at iter())

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        """DistributedSampler's: passed on."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        self.left_out = _listed_rows(self.run_dir, self.guard.next_step if self.guard is not None else None)
        if not self.left_out:
            yield from self.sampler
            return
        rows = [int(row) for row in self.sampler]
        kept = [row for row in rows if row not in self.left_out]
        if not kept:
            raise ValueError(f"nanscope.LeaveOut: every row this sampler draws is in {self.run_dir}/"
                             "poisoned_samples.jsonl: none is left to train on (delete a line to restore its sample)")
        previous = kept[0]
        for row in rows:
            if row not in self.left_out:
                previous = row
            yield previous


# The key a sample of a _RowsNamed data set carries its data set row under,
# from the data set through the collator to the loss, which takes it out.
ROW_KEY = "nanscope_row"


class _PoisonList:
    """The run's poison list as a set of rows, read again when the file changes
    (its size or time): cheap enough to ask on every sample."""

    def __init__(self, run_dir):
        self.path = _nanscope.poison_list_path(str(run_dir))
        self.run_dir = str(run_dir)
        self._seen = None
        self.rows = frozenset()

    def current(self):
        try:
            status = os.stat(self.path)
            seen = (status.st_size, status.st_mtime_ns)
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            self._seen = seen
            self.rows = _listed_rows(self.run_dir) if seen else frozenset()
        return self.rows


class RowsNamed:
    """A map-style data set of dict samples (a Trainer's train_dataset), each
    sample with its data set row under ROW_KEY, so the batch names its rows;
    a row in the run's poison list is replaced by the nearest row before it
    that is not (wrapping round), read as each sample is: the sampler, its
    order, the epoch's length and a resumed epoch's skipped batches stay the
    Trainer's own. A sample that is not a dict passes as it is, unnamed."""

    def __init__(self, dataset, run_dir):
        self.dataset = dataset
        self._listed = _PoisonList(run_dir)

    def __len__(self):
        return len(self.dataset)

    def __getattr__(self, name):  # the data set's own attributes (column_names, ...)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def _kept_row(self, row):
        listed = self._listed.current()
        if row not in listed:
            return row
        n = len(self.dataset)
        for back in range(1, n):
            if (row - back) % n not in listed:
                return (row - back) % n
        raise ValueError(f"nanscope: every row of the data set is in {self._listed.path}: none is left to train on "
                         "(delete a line to restore its sample)")

    def __getitem__(self, row):
        kept = self._kept_row(int(row))
        sample = self.dataset[kept]
        if isinstance(sample, Mapping):
            sample = dict(sample)
            sample[ROW_KEY] = kept
        return sample


class RowsCollated:
    """A collator (the Trainer's data_collator) that takes ROW_KEY out of each
    sample, collates the rest as before, and puts the rows in the batch under
    ROW_KEY as a list of ints (take_rows takes them out again): not a tensor,
    which the Trainer would move to the device and the guard back, a host
    sync per micro-batch."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        rows = None
        if features and all(isinstance(f, Mapping) and ROW_KEY in f for f in features):
            rows = [f[ROW_KEY] for f in features]
            features = [{k: v for k, v in f.items() if k != ROW_KEY} for f in features]
        batch = self.collator(features)
        if rows is not None and isinstance(batch, MutableMapping):
            batch[ROW_KEY] = [int(row) for row in rows]
        return batch


def take_rows(batch):
    """The rows a RowsCollated batch carries, taken out of it (None without)."""
    return batch.pop(ROW_KEY, None) if isinstance(batch, MutableMapping) else None
