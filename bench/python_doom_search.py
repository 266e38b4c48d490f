"""The dooming-step search on the planted cases of tests/python/test_doom_search.py:
a glitched count at step P dooms the run d steps later (transformer and RNN,
d = 1, 10, 100), an LR spike, and a failure of the batch's own. Prints, per
case, the step and rows named, whether that is right, and the search's replays,
steps run and seconds (from the run's `doom` event), then the same cases
searched after the run (nanscope.find_dooming_step from a checkpoint saved
before step 40), then the recovery's final loss against today's rollback and
a clean run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_doom_search.py"""
import pathlib
import re
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "python"))
import test_doom_search as cases  # noqa: E402

torch.set_num_threads(1)


def doom_event(run_dir):
    """The run's doom event text, read with h5py (run.h5's /events)."""
    import h5py
    with h5py.File(pathlib.Path(run_dir) / "run" / "run.h5", "r") as f:
        kinds = [k.decode().rstrip("\x00") for k in f["events/kind"][()]]
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in f["events/text"][()]]
    return next((t for k, t in zip(kinds, texts) if k == "doom"), "")


def main():
    print(f"{'case':<28} {'fails at':>8} {'named':<24} {'right':<5} {'replays':>7} {'steps run':>9} {'seconds':>8}")
    poison = 45
    rows = []
    for trunk in ("transformer", "rnn"):
        for d in (1, 10, 100):
            rows.append((f"{trunk}, d={d}", trunk, {"poison": poison, "trigger": poison + d, "echo": poison}, poison + d,
                         f"step {poison}, batch row 3"))
    rows.append(("rnn, LR spike, d=10", "rnn", {"spike": 50, "trigger": 60, "echo": 50}, 60, "step 50"))
    rows.append(("transformer, own batch", "transformer", {"own_fault": 60}, 60, "no earlier step"))
    for name, trunk, plan, k, expected in rows:
        with tempfile.TemporaryDirectory() as tmp:
            results = cases.train(pathlib.Path(tmp), trunk, plan, k + 1, rollback=False)
            event = doom_event(tmp)
        named = results[k].doomed_by
        m = re.search(r"(\d+) replays from the state after step \d+, (\d+) steps run, ([\d.e+-]+) s", event)
        replays, steps, seconds = m.groups() if m else ("?", "?", "?")
        print(f"{name:<28} {k:>8} {named:<24} {str(named == expected):<5} {replays:>7} {steps:>9} {seconds:>8}")

    print()
    print("after the run, from the user's checkpoint before step 40:")
    print(f"{'case':<28} {'fails at':>8} {'named':<24} {'right':<5} {'replays':>7} {'steps run':>9} {'seconds':>8}")
    for name, trunk, plan, k, expected in rows:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            checkpoint = cases.train_with_checkpoint(tmp, trunk, plan, k + 1, checkpoint_step=40)
            found = cases.search_after(tmp, trunk, plan, checkpoint, 40, progress=False)
        named = (f"step {found.step}" + (f", batch row {found.rows[0]}" if len(found.rows) == 1 else "")
                 if found.outcome == "dooming_step" else found.outcome.replace("_", " "))
        print(f"{name:<28} {found.failing_step:>8} {named:<24} {str(named == expected):<5} {found.replays:>7} "
              f"{found.steps_run:>9} {found.seconds:>8.2g}")

    def final_loss(results):
        tail = [r.loss for r in results[-20:] if r.counted]
        return sum(tail) / len(tail)
    plan, steps = {"poison": poison, "trigger": poison + 10, "echo": poison}, 120
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        doom = final_loss(cases.train(tmp / "doom", "rnn", plan, steps, doom_search=True))
        rollback = final_loss(cases.train(tmp / "rollback", "rnn", plan, steps, doom_search=False))
        clean = final_loss(cases.train(tmp / "clean", "rnn", {"trigger": poison + 10, "echo": poison}, steps,
                                       doom_search=False))
    print(f"final loss over the last 20 steps of {steps} (rnn, d=10): recovery by the dooming step "
          f"{doom:.4f}, today's rollback {rollback:.4f}, clean run {clean:.4f}")


if __name__ == "__main__":
    main()
