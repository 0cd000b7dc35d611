"""`swarm run --show` says the spec's warnings (:meth:`Spec.warnings`) as `swarm run` does,
on stderr: stdout stays the spec, a file that loads back (`swarm run --show > my.toml`)."""

from __future__ import annotations

import os
import subprocess
import sys

from swarmtest import ROOT

from swarm.experiment import load_spec


def show(tmp_path, sets: list[str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "swarm.cli", "run", "--show"] + [a for s in sets for a in ("--set", s)]
    return subprocess.run(args, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)


def test_show_prints_the_warnings_on_stderr_and_only_the_spec_on_stdout(tmp_path):
    sets = ["budget.env_steps=500", "buffer.replicas=2", "buffer.sharing=false", "name=warned"]
    warned = load_spec(None, sets).warnings()
    assert len(warned) == 2     # eval.every above the budget; replicas without sharing
    p = show(tmp_path, sets)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [f"swarm run: warning: {line}" for line in warned]
    assert "warning" not in p.stdout
    f = tmp_path / "warned.toml"
    f.write_text(p.stdout)
    assert load_spec(f) == load_spec(None, sets)
    assert not (tmp_path / "runs").exists()


def test_show_of_a_spec_without_warnings_says_nothing_on_stderr(tmp_path):
    sets = ["peers=2"]
    assert load_spec(None, sets).warnings() == []
    p = show(tmp_path, sets)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    f = tmp_path / "plain.toml"
    f.write_text(p.stdout)
    assert load_spec(f) == load_spec(None, sets)
