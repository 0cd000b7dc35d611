"""The fork server after the swarm package changed on disk (an upgrade under a running
`swarm run`): a peer it would fork would mix the old modules it holds with new ones from
disk, so that peer starts as a fresh interpreter instead, with one line that says why."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from swarmtest import ROOT

from swarm.experiment import forkserver
from swarm.experiment.forkserver import Forked, source_fingerprint
from swarm.experiment.launch import Launch

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


def test_a_peer_is_started_afresh_once_the_package_changed_under_the_server(tmp_path, monkeypatch):
    """A real fork server that imported a copy of the package: it forks while the copy is as
    it was; once a module of the copy changes, the next start is a fresh interpreter that runs
    the new code (not a fork that would run the old), with one line naming the change, and
    so is every later one."""
    tree = tmp_path / "tree"
    package = copy_of_swarm(tree)
    monkeypatch.setenv("PYTHONPATH", str(tree))
    monkeypatch.setenv("SWARM_FORKSERVER", "1")
    monkeypatch.chdir(tmp_path)    # `python -m` looks in the working directory first
    out = io.StringIO()
    launch = Launch(tmp_path / "run", out=out)
    try:
        launch.preload()
        for name in ("a", "b"):    # unchanged: forked, each time
            c = launch.start(name, ["run", "--show"], fork=True)
            assert isinstance(c.proc, Forked), (name, (tmp_path / "run" / "logs" / "forkserver.log").read_text())
            assert c.proc.wait(60) == 0, c.log.read_text()
            assert "peers = " in c.log.read_text()
        # the upgrade: a module the server imported before its first fork
        with open(package / "experiment" / "spec.py", "a") as f:
            f.write("\nprint('spec.py as upgraded', flush=True)\n")
        for name in ("c", "d"):
            c = launch.start(name, ["run", "--show"], fork=True)
            assert isinstance(c.proc, subprocess.Popen), name
            assert c.proc.wait(60) == 0, c.log.read_text()
            assert "spec.py as upgraded" in c.log.read_text()
            assert "peers = " in c.log.read_text()
        said = [line for line in out.getvalue().splitlines() if "changed" in line]
        assert len(said) == 1, out.getvalue()
        assert said[0].startswith("swarm run: swarm's code changed since this run started"), said
        assert str(package / "experiment" / "spec.py") in said[0] and "fresh interpreter" in said[0], said
    finally:
        launch.close()
