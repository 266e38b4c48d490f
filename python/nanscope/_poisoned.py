"""The samples a run leaves out, for a DataLoader's loop: the run's poison
list (RUN_DIR/poisoned_samples.jsonl: each data set row a `data` verdict
blamed, written by the guard when the loop names its batches' rows with
guard.backward(loss, batch, rows=indices)) read by the same reader
nanscope-train uses, and a sampler that leaves its rows out."""

from . import _nanscope


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

        sampler = nanscope.LeaveOut(DistributedSampler(data), run_dir)
        loader = DataLoader(IndexedDataset(data), sampler=sampler, ...)
        for x, y, rows in loader:
            guard.backward(loss_fn(model(x), y), (x, y), rows=rows)
    """

    def __init__(self, sampler, run_dir):
        self.sampler = sampler
        self.run_dir = str(run_dir)
        self.left_out = frozenset()  # the rows this epoch leaves out (read at iter())

    def __len__(self):
        return len(self.sampler)

    def set_epoch(self, epoch):
        """DistributedSampler's: passed on."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        self.left_out = frozenset(s["row"] for s in poisoned_samples(self.run_dir))
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
