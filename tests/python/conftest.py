"""Shared fixtures: the tools the tests run (paths from CTest's environment)."""
import os

import pytest


@pytest.fixture
def tool():
    def path(name):
        value = os.environ.get(name)
        if not value:
            pytest.skip(f"{name} not set (run through CTest)")
        return value
    return path


@pytest.fixture
def nanscope_lines(caplog):
    """nanscope's lines since the last call, joined: the records of the logging
    module's logger "nanscope", where the guard's lines go in Python."""
    import logging
    caplog.set_level(logging.INFO, logger="nanscope")
    seen = 0

    def lines():
        nonlocal seen
        records = [r for r in caplog.records if r.name == "nanscope"]
        new, seen = records[seen:], len(records)
        return "\n".join(r.getMessage() for r in new)
    return lines


@pytest.fixture(scope="session")
def rank_pools(tmp_path_factory):
    """Gloo ranks that stay up for the session's multi-rank scenarios (rank_pool.py)."""
    from rank_pool import RankPools
    pools = RankPools(tmp_path_factory.mktemp("ranks"))
    yield pools
    pools.close()


@pytest.fixture
def run_ranks(rank_pools):
    """run_ranks(where, engine, form, fault, options=None, world=2, **settings):
    each rank's out of sharded_worker.run, its run directory
    where/ENGINE-FORM-FAULT-WORLD/run, the guard's options {"fallback": "off"}
    unless given, its lines logged under "log"."""
    def run(where, engine, form, fault, options=None, world=2, **settings):
        run_dir = where / f"{engine}-{form}-{fault}-{world}" / "run"
        run_dir.parent.mkdir(parents=True)
        return rank_pools.run("sharded", world, 300, run_dir=str(run_dir), engine=engine, form=form, fault=fault,
                              log=True, guard_options=options or {"fallback": "off"}, **settings)
    return run


@pytest.fixture
def bf16_cancellation_model():
    """A model whose step fails in bf16 only, in one module: bf16 keeps 8
    bits, so (h + 256) - 256 is 0 for |h| < 1 in 'cancel', and its log -inf.
    Called, it returns a fresh model (fc1, cancel, fc2)."""
    import torch
    import torch.nn as nn

    class Cancel(nn.Module):
        def forward(self, h):
            return torch.log(((h + 256.0) - 256.0).abs())

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.cancel, self.fc2 = nn.Linear(6, 16), Cancel(), nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(self.cancel(self.fc1(x)))
    return Model
