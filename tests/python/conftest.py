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
