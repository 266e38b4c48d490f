"""One rank of a pool of Gloo ranks on CPU that runs the tests' multi-rank
scenarios one after another (rank_pool.py sends them), so that a test pays
for a run, not for starting the ranks: a rank's start (Python, torch,
nanscope and the process group) took 4 of the 5 s of a whole sharded run.

usage: rank_server.py RANK WORLD   (env STORE: the process group's file)
Reads one JSON request a line on stdin: {"function": a name in RUNS, "args": {...}},
the keyword arguments of that run function but the rank. Answers
one JSON line on stdout: {"out": ...} with the nanscope lines the run logged
under "log", or {"error": the traceback}. Ends at the end of stdin."""
import contextlib
import datetime
import io
import json
import os
import sys
import traceback

import torch.distributed as dist

import ddp_worker
import doom_ranks_worker
import sharded_worker

RUNS = {"sharded": sharded_worker.run, "doom": doom_ranks_worker.run, "ddp_skip": ddp_worker.skip_run,
        "ddp_auto_fallback": ddp_worker.auto_fallback_run, "ddp_leave_out": ddp_worker.leave_out_run,
        "ddp_collectives": ddp_worker.collectives_run}


def main():
    rank, world = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=1800))
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        log = io.StringIO()  # the guard's lines reach sys.stderr as it is at each line
        try:
            with contextlib.redirect_stderr(log):
                out = RUNS[request["function"]](rank=rank, **request["args"])
            answer = {"out": dict(out, log=log.getvalue())}
        except Exception:  # noqa: BLE001 (the test shows it)
            answer = {"error": log.getvalue() + traceback.format_exc()}
        sys.stderr.write(log.getvalue())
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
