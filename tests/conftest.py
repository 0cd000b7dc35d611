"""Shared fixtures. Helpers live in swarmtest.py (importable from tests)."""

import sys
from pathlib import Path

import pytest
from swarmtest import Procs


@pytest.fixture
def procs(tmp_path: Path):
    """Start `swarm` subprocesses; every one is ended by its pid at teardown."""
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.fixture(autouse=True)
def _denormals_back():
    """A test that trains in this process flushes denormals on its thread
    (swarm.rl.flat.flush_denormals); later tests get IEEE floats back (hypothesis
    refuses to run without subnormals)."""
    yield
    flat = sys.modules.get("swarm.rl.flat")
    if flat is not None and getattr(flat._thread, "flushed", False):
        sys.modules["torch"].set_flush_denormal(False)
        flat._thread.flushed = False
