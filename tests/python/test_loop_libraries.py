"""The guard in the loops of the libraries people drive their training with:
Hugging Face Accelerate and PyTorch-Ignite (Debian's python3-accelerate and
python3-torch-ignite; the LibTorch 2.14 lane has them). samples/python's loops
are run as written, and again as their authors wrote them (the lines marked
"nanscope" undone): the plain loop is what the guard is measured against."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "python"
sys.path.insert(0, str(SAMPLES))
from toy_task import FAULTY_SAMPLE as FAULT_SAMPLE  # noqa: E402  (the samples' own module)

BATCH_SIZE, BATCHES = 4, 16  # the samples' batch size and batches per epoch
FAULT_BATCH, FAULT_ROW = FAULT_SAMPLE // BATCH_SIZE, FAULT_SAMPLE % BATCH_SIZE

needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason="Accelerate is not installed (python3-accelerate: the LibTorch 2.14 lane)")
needs_ignite = pytest.mark.skipif(importlib.util.find_spec("ignite") is None,
                                  reason="Ignite is not installed (python3-torch-ignite: the LibTorch 2.14 lane)")


def undone(sample):
    """The sample as its library's users write it, and how many lines nanscope
    changed: a line marked '# nanscope (was: CODE)' goes back to CODE, a line
    marked '# nanscope' goes."""
    plain, changed = [], 0
    for line in sample.read_text().splitlines():
        was = re.search(r"  # nanscope \(was: (.*)\)$", line)
        if was:
            indent = line[:len(line) - len(line.lstrip())]
            plain.append(indent + was.group(1))
            changed += 1
        elif line.endswith("  # nanscope"):
            changed += 1
        else:
            plain.append(line)
    return "\n".join(plain) + "\n", changed


def run(script, *args, env=None, tmp_path=None, plain=False):
    if plain:
        text, _ = undone(script)
        script = tmp_path / ("plain_" + script.name)
        script.write_text(text)
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=_python_path(), **(env or {})))


def _python_path():
    """The samples' own modules (toy_task) for a loop run from elsewhere, and nanscope."""
    return os.pathsep.join(p for p in (str(SAMPLES), os.environ.get("PYTHONPATH")) if p)


def lines_of(output, pattern):
    return [m.groupdict() for m in re.finditer(pattern, output, re.MULTILINE)]


@pytest.mark.parametrize("sample", ["accelerate_loop.py", "ignite_loop.py"])
def test_the_loop_adopts_nanscope_in_at_most_six_changed_lines(sample):
    plain, changed = undone(SAMPLES / sample)
    assert 0 < changed <= 6, changed
    code = "\n".join(line.split("#")[0] for line in plain.splitlines())
    assert "nanscope" not in code and "guard" not in code  # nothing of nanscope left in the plain loop


# --- Accelerate

ACCELERATE_LINE = r"^batch (?P<i>\d+): loss (?P<loss>\S+), lr (?P<lr>\S+), skipped (?P<skipped>True|False)$"


def _boundary(batch, accumulation):
    """The last micro-batch of the step `batch` belongs to."""
    return (batch // accumulation + 1) * accumulation - 1


def _check_accelerate_iterations(iterations, accumulation, skipped_at, schedulers_per_step=1):
    """Accelerate's own view of the run: optimizer_step_was_skipped is true on
    the skipped step's boundary and nowhere else, and the prepared scheduler
    advanced on every other boundary only."""
    assert [int(it["i"]) for it in iterations] == list(range(len(iterations)))
    assert [it["skipped"] == "True" for it in iterations] == [i == skipped_at for i in range(len(iterations))]
    steps = 0
    for i, it in enumerate(iterations):
        if (i + 1) % accumulation == 0 and i != skipped_at:
            steps += schedulers_per_step
        assert float(it["lr"]) == pytest.approx(1e-2 * 0.9 ** steps, rel=1e-4), (i, it)


@needs_accelerate
@pytest.mark.parametrize("accumulation, fault, birth", [
    (1, "blank", "nan at aten::div (forward) in module 'norm', batch row {row}"),
    (2, "blank", "nan at aten::div (forward) in module 'norm', micro-batch {micro}, batch row {row}"),
    (4, "nan", "nan at input (input) in module '', micro-batch {micro}, batch row {row}"),
])
def test_an_accelerate_loop_names_the_birth_and_skips_on_the_accumulation_boundary(tmp_path, accumulation, fault,
                                                                                   birth):
    sample = SAMPLES / "accelerate_loop.py"
    guarded = run(sample, tmp_path / "run", accumulation, fault, env={"OMP_NUM_THREADS": "1"})
    assert guarded.returncode == 0, guarded.stderr
    step, micro = FAULT_BATCH // accumulation, FAULT_BATCH % accumulation
    expected = f"step {step}: first birth: " + birth.format(micro=micro, row=FAULT_ROW)
    assert expected in guarded.stderr, guarded.stderr
    assert len(re.findall("first birth", guarded.stderr)) == 1, guarded.stderr
    iterations = lines_of(guarded.stdout, ACCELERATE_LINE)
    assert len(iterations) == BATCHES, guarded.stdout
    _check_accelerate_iterations(iterations, accumulation, _boundary(FAULT_BATCH, accumulation))
    assert "weights finite: True" in guarded.stdout
    assert iterations[-1]["loss"] != "nan"
    assert list((tmp_path / "run" / "snapshots").glob("step-*.h5")), "the failed step's snapshot"

    # The loop as Accelerate's users write it: its NaN reaches the weights,
    # and Accelerate says no step was skipped.
    plain = run(sample, tmp_path / "plain-run", accumulation, fault, tmp_path=tmp_path, plain=True,
                env={"OMP_NUM_THREADS": "1"})
    assert plain.returncode == 0, plain.stderr
    plain_iterations = lines_of(plain.stdout, ACCELERATE_LINE)
    assert not any(it["skipped"] == "True" for it in plain_iterations)
    assert "weights finite: False" in plain.stdout
    assert plain_iterations[-1]["loss"] == "nan"
    assert not (tmp_path / "plain-run").exists()


LAUNCH = """
import os, runpy, sys
import torch.distributed as dist
rank = int(sys.argv[1])
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@needs_accelerate
def test_an_accelerate_loop_over_two_processes_skips_on_both_and_only_the_sick_rank_snapshots(tmp_path):
    """What `accelerate launch` starts on CPU, over Gloo: the prepared model is
    DistributedDataParallel and each rank reads every other batch, so the
    planted sample reaches rank 1 alone."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCH)
    # A file store, not a port picked ahead (another process may take it before rank 0 listens).
    env = dict(os.environ, STORE=str(tmp_path / "store"), OMP_NUM_THREADS="1", PYTHONPATH=_python_path())
    accumulation = 2
    procs = [subprocess.Popen([sys.executable, str(launcher), str(rank), str(SAMPLES / "accelerate_loop.py"),
                               str(tmp_path / "run"), str(accumulation), "blank"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    sick_batch = FAULT_BATCH // 2  # rank 1's own batches are 1, 3, 5, ...: the planted one is its third
    step, micro = sick_batch // accumulation, sick_batch % accumulation
    assert (f"step {step}: first birth: nan at aten::div (forward) in module 'norm', micro-batch {micro}, "
            f"batch row {FAULT_ROW}") in outputs[1][1], outputs[1][1]
    # Rank 0 re-ran nothing; its line gives rank 1's birth, with that rank.
    assert (f"step {step}: first birth: nan at aten::div (forward) in module 'norm', micro-batch {micro}, "
            f"batch row {FAULT_ROW}, on rank 1; born on rank(s) 1, not on rank 0 (run-rank-1.h5 has the rest)") \
        in outputs[0][1], outputs[0][1]
    # accelerator.print prints on the main process: rank 0's view, which the ranks share.
    iterations = lines_of(outputs[0][0], ACCELERATE_LINE)
    assert len(iterations) == BATCHES // 2, outputs[0][0]
    _check_accelerate_iterations(iterations, accumulation, _boundary(sick_batch, accumulation), schedulers_per_step=2)
    assert "weights finite: True" in outputs[0][0]
    snapshots = sorted(p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").rglob("step-*.h5"))
    assert snapshots == [f"snapshots/rank-1/step-{step:07d}.h5"], snapshots


@needs_accelerate
def test_accelerate_misuse_is_refused_with_a_message(tmp_path):
    script = tmp_path / "misuse.py"
    script.write_text(f"""
import torch, torch.nn as nn
from accelerate import Accelerator
import nanscope
accelerator = Accelerator(mixed_precision="bf16", cpu=True)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
prepared_model, prepared_optimizer = accelerator.prepare(model, optimizer)
for make in (lambda: nanscope.StepGuard(prepared_model, optimizer, accelerator=accelerator, run_dir=r"{tmp_path}/a"),
             lambda: nanscope.StepGuard(prepared_model, prepared_optimizer, accelerator=accelerator, amp="fp16",
                                        run_dir=r"{tmp_path}/b")):
    try:
        make()
        print("accepted")
    except (TypeError, ValueError) as e:
        print(type(e).__name__ + ": " + str(e))
""")
    result = run(script)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()[-2:]
    assert first.startswith("TypeError: ") and "accelerator.prepare" in first, first
    assert second.startswith("ValueError: ") and "mixed_precision='bf16'" in second, second


# --- Ignite

IGNITE_LINE = r"^iteration (?P<i>\d+): loss (?P<loss>\S+), running (?P<running>\S+)$"


@needs_ignite
@pytest.mark.parametrize("fault, birth", [
    ("nan", "nan at input (input) in module '', batch row {row}"),
    ("blank", "nan at aten::div (forward) in module 'norm', batch row {row}"),
])
def test_an_ignite_engine_names_the_birth_skips_and_trains_on_where_terminate_on_nan_ended_it(tmp_path, fault, birth):
    sample = SAMPLES / "ignite_loop.py"
    guarded = run(sample, tmp_path / "run", fault, env={"OMP_NUM_THREADS": "1"})
    assert guarded.returncode == 0, guarded.stderr
    assert f"step {FAULT_BATCH}: first birth: " + birth.format(row=FAULT_ROW) in guarded.stderr, guarded.stderr
    iterations = lines_of(guarded.stdout, IGNITE_LINE)
    assert len(iterations) == 2 * BATCHES, guarded.stdout  # both epochs: the planted sample comes twice
    nan_iterations = [int(it["i"]) for it in iterations if it["loss"] == "nan"]
    assert nan_iterations == [FAULT_BATCH + 1, BATCHES + FAULT_BATCH + 1], guarded.stdout  # Ignite counts from 1
    assert all(it["running"] != "nan" for it in iterations), "the running average left the skipped iterations out"
    assert f"stopped after iteration {2 * BATCHES}; weights finite: True" in guarded.stdout

    plain = run(sample, tmp_path / "plain-run", fault, tmp_path=tmp_path, plain=True, env={"OMP_NUM_THREADS": "1"})
    assert plain.returncode == 0, plain.stderr
    assert "contains NaN or Inf. Stop training" in plain.stderr, plain.stderr
    assert f"stopped after iteration {FAULT_BATCH + 1};" in plain.stdout, plain.stdout


def _ignite_trainer(tmp_path, poison, **options):
    """An Engine whose update is the watched step, over 12 batches of which
    those in `poison` hold a NaN sample (row 2)."""
    from ignite.engine import Engine

    import nanscope

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = []
    for i in range(12):
        x, y = torch.randn(4, 4), torch.randint(0, 2, (4,))
        if i in poison:
            x[2, 1] = float("nan")
        batches.append((x, y))
    loss_of = torch.nn.functional.cross_entropy

    def update(engine, batch):
        optimizer.zero_grad()
        loss = loss_of(model(batch[0]), batch[1])
        guard.backward(loss, batch)
        guard.step(optimizer)
        return loss.item()

    trainer = Engine(update)
    guard = nanscope.StepGuard(model, optimizer, run_dir=tmp_path / "run", amp="bf16", log=False,
                               loss_fn=lambda m, b: loss_of(m(b[0]), b[1]), **options)
    return trainer, guard, model, batches


@needs_ignite
def test_ignite_handlers_see_the_skipped_iteration_for_what_it_was(tmp_path):
    from ignite.engine import Events
    from ignite.handlers import Checkpoint, DiskSaver, TerminateOnNan
    from ignite.metrics import RunningAverage

    import nanscope

    trainer, guard, model, batches = _ignite_trainer(tmp_path, poison={4})
    terminate = TerminateOnNan()
    trainer.add_event_handler(Events.ITERATION_COMPLETED, terminate)
    guard.attach(trainer)
    # Attached after the guard: found when the run starts.
    RunningAverage(output_transform=lambda loss: loss).attach(trainer, "running_loss")
    checkpoint = Checkpoint({"model": model, "guard": guard}, DiskSaver(str(tmp_path / "ckpt"), require_empty=False),
                            n_saved=None, filename_prefix="it")
    trainer.add_event_handler(Events.ITERATION_COMPLETED, checkpoint)
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(
        (e.state.iteration, e.state.step_result.skipped, e.state.metrics["running_loss"])))
    skipped = []
    trainer.add_event_handler(nanscope.GuardEvents.STEP_SKIPPED, lambda e: skipped.append(
        (e.state.iteration, e.state.step_result.first_birth)))

    trainer.run(batches, max_epochs=1)
    assert trainer.state.iteration == 12, "TerminateOnNan left the skipped iteration to the guard"
    assert skipped == [(5, "nan at input (input) in module '', batch row 2")], skipped
    assert [s for _, s, _ in seen] == [i == 5 for i in range(1, 13)]
    assert all(running == running for _, _, running in seen), "no NaN in the running average"
    assert seen[4][2] == seen[3][2], "the skipped iteration left the running average as it was"
    assert trainer.has_event_handler(terminate, Events.ITERATION_COMPLETED)  # Ignite still finds it
    # The checkpoint of the skipped iteration holds the weights as they were before it.
    saved = {int(re.search(r"_(\d+)\.pt$", p.name).group(1)): p for p in (tmp_path / "ckpt").glob("it_checkpoint_*.pt")}
    assert sorted(saved) == list(range(1, 13))
    before, at = (torch.load(saved[i], weights_only=False)["model"] for i in (4, 5))
    assert all(torch.equal(before[k], at[k]) for k in before)
    assert torch.load(saved[12], weights_only=False)["guard"]["applied_steps"] == 11


@needs_ignite
def test_the_step_that_stops_the_run_terminates_the_engine(tmp_path, nanscope_lines):
    import nanscope

    trainer, guard, _, batches = _ignite_trainer(tmp_path, poison=set(range(3, 12)),
                                                 config=nanscope.GuardConfig(fallback="off", max_nonfinite_run=3))
    guard.attach(trainer)
    trainer.run(batches, max_epochs=1)
    assert trainer.state.step_result.stop, "the guard stopped the run"
    assert trainer.state.iteration < 12, "and the engine with it"
    assert "terminating the engine" in nanscope_lines()


@needs_ignite
def test_attach_refuses_what_is_no_engine_and_a_second_guard(tmp_path):
    trainer, guard, _, _ = _ignite_trainer(tmp_path, poison=set())
    with pytest.raises(TypeError, match="ignite.engine.Engine"):
        guard.attach(object())
    guard.attach(trainer)
    with pytest.raises(ValueError, match="one guard per engine"):
        guard.attach(trainer)
    json.dumps(guard.state_dict())  # what a Checkpoint handler saves is plain data
