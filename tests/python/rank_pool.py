"""Pools of Gloo ranks (rank_server.py), started once for a pytest session
and reused by every multi-rank scenario of its tests: one pool per world
size. A scenario's answers come back within a time limit; a pool that missed
it, or whose rank failed, is ended (its peers may wait in a collective) and
the next scenario starts a new one."""
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

SERVER = Path(__file__).parent / "rank_server.py"


class RankPool:
    def __init__(self, world, where):
        where.mkdir(parents=True)
        env = dict(os.environ, STORE=str(where / "store"), OMP_NUM_THREADS="1")
        self.log_paths = [where / f"rank-{rank}.log" for rank in range(world)]
        self.logs = [open(path, "w") for path in self.log_paths]
        self.procs = [subprocess.Popen([sys.executable, str(SERVER), str(rank), str(world)], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.logs[rank])
                      for rank in range(world)]
        self.pending = [b""] * world

    def run(self, function, timeout, **args):
        """Each rank's out of rank_server.RUNS[function](**args), in rank order."""
        request = (json.dumps({"function": function, "args": args}) + "\n").encode()
        for rank, p in enumerate(self.procs):
            try:
                p.stdin.write(request)
                p.stdin.flush()
            except BrokenPipeError:
                raise AssertionError(f"rank {rank} ended; its stderr ends:\n{self._stderr(rank)}") from None
        deadline = time.monotonic() + timeout
        answers = [json.loads(self._line(rank, deadline)) for rank in range(len(self.procs))]
        errors = [f"rank {rank}:\n{a['error'][-3000:]}" for rank, a in enumerate(answers) if "error" in a]
        if errors:
            raise AssertionError("\n".join(errors))
        return [a["out"] for a in answers]

    def _line(self, rank, deadline):
        proc, fd = self.procs[rank], self.procs[rank].stdout.fileno()
        while b"\n" not in self.pending[rank]:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            chunk = os.read(fd, 1 << 16) if ready else b""
            if not chunk:
                state = "ended" if proc.poll() is not None else "gave no answer in time"
                raise AssertionError(f"rank {rank} {state}; its stderr ends:\n{self._stderr(rank)}")
            self.pending[rank] += chunk
        line, _, self.pending[rank] = self.pending[rank].partition(b"\n")
        return line

    def _stderr(self, rank):
        return self.log_paths[rank].read_text(errors="replace")[-3000:]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()

    def kill(self):
        for p in self.procs:
            p.kill()
            p.wait()
        for log in self.logs:
            log.close()


class RankPools:
    """A pool per world size, started at its first scenario."""

    def __init__(self, where):
        self.where, self.pools, self.started = where, {}, 0

    def run(self, function, world, timeout, **args):
        pool = self.pools.get(world)
        if pool is None:
            self.started += 1
            pool = self.pools[world] = RankPool(world, self.where / f"pool-{self.started}-world-{world}")
        try:
            return pool.run(function, timeout, **args)
        except BaseException:
            del self.pools[world]
            pool.kill()
            raise

    def close(self):
        for pool in self.pools.values():
            pool.close()
