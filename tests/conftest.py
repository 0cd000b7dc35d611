"""Shared fixtures. Helpers live in swarmtest.py (importable from tests)."""

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
