"""The fork server after the swarm package changed on disk (an upgrade under a running
`swarm run`): a peer it would fork would mix the old modules it holds with new ones from
disk, so that peer starts as a fresh interpreter instead, with one line that says why
(tests/experiment/test_review43_figures.py runs that with a launcher that runs a copy of
the package: the launcher's children import the launcher's package)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from swarmtest import ROOT

from swarm.experiment import forkserver
from swarm.experiment.forkserver import source_fingerprint

pytestmark = pytest.mark.skipif(not forkserver.enabled(), reason="no pidfds here (Linux 5.3 and later)")


def copy_of_swarm(to: Path) -> Path:
    """A copy of the swarm package that this test owns (its parent goes on PYTHONPATH)."""
    shutil.copytree(ROOT / "swarm", to / "swarm", ignore=shutil.ignore_patterns("__pycache__"))
    return to / "swarm"


def test_the_fingerprint_changes_with_any_source_file_and_only_with_one(tmp_path):
    package = copy_of_swarm(tmp_path)
    first = source_fingerprint(package)
    assert "checks.py" in first and os.path.join("experiment", "forkserver.py") in first
    # bytecode is not source: an import that writes __pycache__ changes nothing
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "checks.cpython-311.pyc").write_bytes(b"x")
    assert source_fingerprint(package) == first
    for change in ("edited", "added", "removed"):
        if change == "edited":
            with open(package / "checks.py", "a") as f:
                f.write("\n# upgraded\n")
        elif change == "added":
            (package / "gossip" / "new_module.py").write_text("")
        else:
            (package / "wire.py").unlink()
        now = source_fingerprint(package)
        assert now != first, change
        first = now
