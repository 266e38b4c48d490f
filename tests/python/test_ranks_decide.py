"""Several ranks decide as one process does (docs/recovery.md): with
fallback='auto', the rank whose batch failed diagnoses the step (a sharded
model's ranks re-run it together) and every rank carries out that remedy. Two
and four Gloo ranks on CPU, FSDP2, FSDP1 and DDP, the faults of
sharded_worker.py; a compiled FSDP2 model's compiled-only fault."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14):
    pytest.skip("FSDP2 and FSDP1 train on CPU over Gloo from torch 2.14", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
import sharded_worker  # noqa: E402


@pytest.mark.parametrize("engine, world, form", [("fsdp2", 2, "closure"), ("fsdp1", 2, "closure"),
                                                 ("fsdp2", 4, "closure"), ("ddp", 4, "closure"),
                                                 ("ddp", 2, "watched")])
def test_auto_fallback_on_a_data_fault_is_a_skip_on_every_rank_as_in_one_process(tmp_path, tool, run_ranks, engine,
                                                                                 world, form):
    """fallback='auto': rank 1's blank sample is 0/0 in fp32 too and the step
    is finite without it. Rank 1 diagnoses the step (a sharded model's ranks
    re-run it together), and every rank takes its remedy: data, a skip and
    nothing more (no fp32, no LR cut), ending with the weights of the plain
    loop that dropped that update by hand (FSDP2, FSDP1, and DDP, whose own
    buckets average the gradients in the guarded loop too)."""
    guarded = run_ranks(tmp_path, engine, form, "forward", {"fallback": "auto"}, world=world)
    (tmp_path / "reference").mkdir()
    reference = run_ranks(tmp_path / "reference", engine, "plain", "forward", {"fallback": "off"}, world=world)
    assert len(guarded) == world
    for rank, out in enumerate(guarded):
        results = out["results"]
        assert [r["skipped"] for r in results] == [s == sharded_worker.FAULT_STEP for s in range(sharded_worker.STEPS)]
        assert [r["remedy"] for r in results] == ["model_or_data" if s == sharded_worker.FAULT_STEP else "none"
                                                  for s in range(sharded_worker.STEPS)], rank
        assert {r["amp"] for r in results} == {"bf16"}, rank
        assert results[-1]["lr"] == pytest.approx(1e-2), rank
        assert f"finite without batch row {sharded_worker.BLANK_ROW}, an ordinary sample" in out["log"], rank
        assert out["weights"] == reference[rank]["weights"], f"rank {rank}'s weights differ from the reference run's"
    # Every rank's run file names rank 1 as the first non-finite one and its remedy.
    run_dir = tmp_path / f"{engine}-{form}-forward-{world}" / "run"
    report = json.loads(subprocess.run([tool("NANSCOPE_REPORT"), str(run_dir), "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    assert sorted(run["rank"] for run in report["runs"]) == list(range(world))
    for run in report["runs"]:
        events = {e["kind"]: e["text"] for e in run["events"]}
        assert events["first_nonfinite"] == "1", (run["rank"], events)
        assert events["remedy"].startswith("model_or_data: rank 1: non-finite"), (run["rank"], events)
        assert "fallback" not in events, (run["rank"], events)


COMPILED_WORKER = r'''
import json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
sys.path.insert(0, os.environ["TESTS"])
from test_compile import CorruptingBackend, GeluNet, _gelu_batch, _gelu_loss
import nanscope

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2)
torch.manual_seed(0)
net = GeluNet()
# The root alone sharded: Dynamo compiles its forward (it traces no module sharded on its own).
model = torch.compile(fully_shard(net), backend=CorruptingBackend())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
guard = nanscope.StepGuard(model, optimizer, run_dir=sys.argv[2], amp="bf16", config=nanscope.GuardConfig(fallback="auto"),
                           loss_fn=_gelu_loss)
results = []
for step in range(4):
    # Rank 1's step 2 holds the large sample the wrong GELU makes NaN; rank 0's batches stay small.
    batch = _gelu_batch(step if rank == 1 else step + 10)
    r = guard.closure_step(lambda: _gelu_loss(model, batch), batch=batch)
    results.append({"skipped": r.skipped, "remedy": r.remedy, "amp": r.amp, "first_birth": r.first_birth})
guard.close()
print(json.dumps(results), flush=True)
dist.destroy_process_group()
'''


def test_a_compiled_sharded_models_compiled_only_fault_is_the_compilers_on_every_rank(tmp_path):
    """torch.compile over an FSDP2 model whose (deliberately wrong) compiled
    GELU makes rank 1's step 2 NaN: every rank re-runs it eagerly (finite),
    then compiled once more together, and every rank skips it as the
    compiler's fault, keeping bf16; the line says the region was not searched."""
    worker = tmp_path / "worker.py"
    worker.write_text(COMPILED_WORKER)
    env = dict(os.environ, STORE=str(tmp_path / "store"), OMP_NUM_THREADS="1", TESTS=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(tmp_path / "run")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outs, logs = [], []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
        logs.append(err)
    for rank, results in enumerate(outs):
        assert [r["skipped"] for r in results] == [False, False, True, False], rank
        assert results[2]["remedy"] == "compiler", (rank, results[2])
        assert {r["amp"] for r in results} == {"bf16"}, rank
    birth = outs[1][2]["first_birth"]
    assert birth.startswith("finite when run eagerly, non-finite compiled"), birth
    assert "compiled re-run on every rank" in logs[1] and "its region is not searched on a sharded model" in logs[1]
