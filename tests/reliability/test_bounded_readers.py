"""Every reader of a file from outside is bounded by that file.

A corrupt run file, snapshot, checkpoint or data file is given to every
program that reads its kind: nanscope-report, nanscope-view, nanscope-replay,
nanscope-train (--init, --resume, --data) and Python's nanscope.replay. Each
must end within the readers' bound (format/src/rehearsal.hpp: a fixed
allowance plus a multiple of the file's size in memory, a fixed CPU time),
with exit 0 (it read the file) or 2 and one line naming the file; never a
crash, a hang or memory past that bound, whatever the file's bytes declare.
Each run's peak resident memory (its rehearsals' included) may exceed the
same program's on a good file of the kind by 512 MiB at most, and its CPU
time by 30 s; it runs under an address-space limit 4 GiB above the good
run's, which only keeps the machine safe (a tight limit would make a
reader's allocations fail, bounding it by the limit instead of by itself).

The files are the kept fuzz inputs (tests/fuzz/crashers/KIND/: crashes inside
HDF5, and inputs that made HDF5 allocate gigabytes or spin), and copies of a
good file of each kind written here with one size field made huge
(size_mutants.py: object header, local heap, fractal heap and B-tree sizes).
"""
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
CRASHERS = HERE.parent / "fuzz" / "crashers"
MiB = 1 << 20
HEADROOM = 512 * MiB  # what a bad file may cost beyond the program on a good one
# An address-space limit only keeps this machine safe: under a tight one a
# reader's allocations would fail and it would be bounded by the limit, not
# by itself, so the limit is far above the bound asserted.
SAFETY_CAP = 4096 * MiB
CPU_HEADROOM = 30  # s: the rehearsal's CPU bound for a small file (20 s), and a margin
WALL_LIMIT = 300  # s: only a hang comes near it, on however busy a machine


def tool(name):
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} not set (run through CTest)")
    return value


def bad_files(kind):
    return sorted(p for p in (CRASHERS / kind).iterdir() if p.is_file())


class Cost:
    """A program run to its end: exit status, stderr, peak memory (its own and
    its children's: a reader's rehearsals are forked children) and CPU time."""

    def __init__(self, args, address_space=None, env=None):
        def limit():
            if address_space:
                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        started = time.monotonic()
        # Files, not pipes: nothing read here while it runs, so nothing may block it.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                subprocess.Popen(args, stdout=out, stderr=err, env=env, preexec_fn=limit) as proc:
            status_file = f"/proc/{proc.pid}/status"
            self.peak_vm = 0
            # Its own address space, read from /proc while it runs (a peak only grows).
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                try:
                    fields = dict(line.split(":", 1) for line in open(status_file))
                    self.peak_vm = max(self.peak_vm, int(fields["VmPeak"].split()[0]) * 1024)
                except (OSError, KeyError, ValueError):
                    pass
                if time.monotonic() - started > WALL_LIMIT:
                    proc.kill()
                    pytest.fail(f"{args} ran past {WALL_LIMIT} s")
                time.sleep(0.005)
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.returncode = proc.returncode
            out.seek(0)
            err.seek(0)
            self.stdout = out.read().decode(errors="replace")
            self.stderr = err.read().decode(errors="replace")
        # wait4's usage is the process's and its reaped children's together.
        self.peak_rss = usage.ru_maxrss * 1024
        self.cpu = usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A real run of each kind: run.h5, a snapshot, a checkpoint, a data file."""
    root = tmp_path_factory.mktemp("good")
    run = root / "run"
    subprocess.run([tool("NANSCOPE_TRAIN"), "--model", "mlp", "--hidden", "8", "--steps", "12", "--batch-size", "4",
                    "--amp", "bf16", "--fault", "nonfinite_input@5:1", "--checkpoint-every", "6", "--quiet",
                    "--threads", "1", "--run-dir", str(run)], check=True, capture_output=True)
    data = root / "data.h5"
    import h5py
    import numpy as np
    with h5py.File(data, "w") as f:
        f["inputs"] = np.arange(24 * 16, dtype=np.float32).reshape(24, 16)
        f["targets"] = np.arange(24, dtype=np.int64) % 4
    return {"run_file": run / "run.h5", "snapshot": next((run / "snapshots").glob("*.h5")),
            "checkpoint": run / "checkpoint.h5", "data_file": data, "run_dir": run}


# The viewer reads its files before it opens its window; without a display it
# then exits 1, having said what it could not read.
NO_DISPLAY = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
NO_WINDOW = "cannot open a window"


def readers(kind, good, file, scratch):
    """(name, argv, path) of every program that reads `file` as a `kind`, each given it as a user would
    (at `path`: the file itself, or its copy in a run directory)."""
    train = [tool("NANSCOPE_TRAIN"), "--model", "mlp", "--hidden", "8", "--steps", "1", "--batch-size", "4",
             "--quiet", "--threads", "1"]
    # A Python reader's error is an exception: ValueError for a bad file.
    python_replay = [sys.executable, "-c",
                     "import sys, torch, nanscope\n"
                     "try:\n"
                     "    nanscope.replay(sys.argv[1], model=lambda: torch.nn.Linear(16, 4),\n"
                     "                    loss=lambda m, b: m(b[0]).sum(), write=False)\n"
                     "except ValueError as e:\n"
                     "    print(e, file=sys.stderr)\n"
                     "    sys.exit(2)\n", str(file)]
    if kind == "run_file":
        resumed = scratch / "resume"
        shutil.copytree(good["run_dir"], resumed)
        shutil.copyfile(file, resumed / "run.h5")
        yield "nanscope-report", [tool("NANSCOPE_REPORT"), str(file)], file
        yield "nanscope-view", [tool("NANSCOPE_VIEW"), str(file)], file
        yield "nanscope-train --resume", [tool("NANSCOPE_TRAIN"), "--resume", str(resumed), "--quiet"], resumed / "run.h5"
    elif kind == "snapshot":
        yield "nanscope-replay", [tool("NANSCOPE_REPLAY"), str(file), "--no-write"], file
        yield "nanscope-view", [tool("NANSCOPE_VIEW"), str(file)], file
        in_run = scratch / "run"
        shutil.copytree(good["run_dir"], in_run)
        snapshot = next((in_run / "snapshots").glob("*.h5"))
        shutil.copyfile(file, snapshot)
        yield "nanscope-report", [tool("NANSCOPE_REPORT"), str(in_run)], snapshot
        if os.environ.get("PYTHONPATH"):
            yield "nanscope.replay", python_replay, file
    elif kind == "checkpoint":
        yield "nanscope-train --init", train + ["--init", str(file), "--run-dir", str(scratch / "init")], file
        resumed = scratch / "resume"
        shutil.copytree(good["run_dir"], resumed)
        shutil.copyfile(file, resumed / "checkpoint.h5")
        yield "nanscope-train --resume", [tool("NANSCOPE_TRAIN"), "--resume", str(resumed), "--quiet"], \
            resumed / "checkpoint.h5"
    elif kind == "data_file":
        yield "nanscope-train --data", train + ["--data", str(file), "--run-dir", str(scratch / "data")], file


KINDS = ["run_file", "snapshot", "checkpoint", "data_file"]
KEPT = [(kind, path) for kind in KINDS if (CRASHERS / kind).is_dir() for path in bad_files(kind)]
MUTANTS_PER_FIELD = 2  # of each kind of size field: the first ones in the file


@pytest.fixture(scope="module")
def mutants(good, tmp_path_factory):
    """Size-field mutants of each kind's good file, as this lane's HDF5 writes it."""
    sys.path.insert(0, str(HERE))
    import size_mutants
    made = {}
    for kind in KINDS:
        out = tmp_path_factory.mktemp(f"mutants-{kind}")
        per_field = {}
        for name, data in size_mutants.mutants(good[kind].read_bytes()):
            field = name.split("-")[0]
            if per_field.setdefault(field, 0) < MUTANTS_PER_FIELD:
                per_field[field] += 1
                (out / f"{name}.h5").write_bytes(data)
        made[kind] = sorted(out.iterdir())
    return made


@pytest.fixture(scope="module")
def baseline(good, tmp_path_factory):
    """baseline(kind, reader): that reader's cost on the good file of its kind
    (peak VM, peak RSS, CPU), measured for a kind the first time it is asked
    (CTest runs each kind in a process of its own)."""
    costs = {}

    def cost_of(kind, reader):
        if not any(k == kind for k, _ in costs):
            scratch = tmp_path_factory.mktemp(f"baseline-{kind}")
            for name, argv, _ in readers(kind, good, good[kind], scratch):
                costs[(kind, name)] = Cost(argv, env=NO_DISPLAY)
        return costs[(kind, reader)]
    return cost_of


@pytest.mark.parametrize("kind,path", KEPT, ids=[f"{k}/{p.name}" for k, p in KEPT])
def test_a_kept_fuzz_input_costs_its_readers_a_bounded_amount(kind, path, good, baseline, tmp_path):
    check_readers(kind, path, good, baseline, tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_size_field_costs_the_readers_a_bounded_amount(kind, mutants, good, baseline, tmp_path):
    assert mutants[kind] or kind == "data_file", f"no size field found to mutate in the {kind}"
    for i, path in enumerate(mutants[kind]):
        check_readers(kind, path, good, baseline, tmp_path / str(i))


def check_readers(kind, path, good, baseline, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size
    for name, argv, given in readers(kind, good, path, tmp_path):
        base = baseline(kind, name)
        cost = Cost(argv, address_space=base.peak_vm + SAFETY_CAP, env=NO_DISPLAY)
        what = f"{name} on {kind}/{path.name} ({size} bytes)"
        lines = [line for line in cost.stderr.splitlines() if line.strip() and NO_WINDOW not in line]
        if name == "nanscope-view":  # exit 1: no window; a file it could not read is a line of its own
            assert cost.returncode == 1 and NO_WINDOW in cost.stderr, f"{what}: exit {cost.returncode}\n{cost.stderr}"
            # Its own lines; a windowing library may add one about the session
            # (GLFW's Wayland backend without XDG_RUNTIME_DIR in a chroot).
            own = [line for line in lines if line.startswith(f"{name}:")]
            assert all(str(given) in line for line in own), f"{what}: {lines}"
        else:
            assert cost.returncode in (0, 2), f"{what}: exit {cost.returncode}\n{cost.stderr[-2000:]}"
        if cost.returncode == 2:
            assert lines, f"{what}: exit 2 without a word"
            assert str(given) in lines[-1], f"{what}: the last line does not name {given}: {lines[-1]}"
            assert "Traceback" not in cost.stderr, f"{what}: {cost.stderr[-2000:]}"
        assert cost.peak_rss <= base.peak_rss + HEADROOM, \
            f"{what}: {cost.peak_rss / MiB:.0f} MiB resident against {base.peak_rss / MiB:.0f} MiB on a good file"
        assert cost.cpu <= base.cpu + CPU_HEADROOM, \
            f"{what}: {cost.cpu:.1f} s of CPU against {base.cpu:.1f} s on a good file"
