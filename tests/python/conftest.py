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
