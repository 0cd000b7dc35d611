"""run_experiment where its output has nowhere usual to go: a process without stderr
(fd 2 closed, pythonw, a windowed app: ``sys.stderr`` is None) and a caller's stream that
is not a file. Both raised AttributeError (or the sink's own error) before anything
started; a run goes ahead without printing where it cannot, as the CLI's does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from swarmtest import ROOT

from swarm.experiment import run_experiment

TINY = ["peers=1", "budget.env_steps=200", "dqn.learning_starts=100", "dqn.batch_size=32",
        "eval.every=0", "buffer.capacity=1000"]


def test_a_run_in_a_process_without_stderr_goes_ahead(tmp_path):
    code = textwrap.dedent(f"""
        import json, sys
        sys.stderr = None   # as Python sets it when fd 2 is closed
        from swarm.experiment import run_experiment
        r = run_experiment(None, {TINY!r}, runs_root={str(tmp_path / "runs")!r})
        print(json.dumps({{"exit": r.exit_code, "dir": str(r.run_dir)}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["exit"] == 0
    assert json.loads((Path(out["dir"]) / "peer0" / "summary.json").read_text())["env_steps"] == 200


class _WriteOnly:
    """A sink with write and flush only (no isatty, no fileno)."""

    def __init__(self) -> None:
        self.text: list[str] = []

    def write(self, s: str) -> int:
        self.text.append(s)
        return len(s)

    def flush(self) -> None:
        pass


class _ClosedTty(_WriteOnly):
    def isatty(self) -> bool:   # what a closed stream's raises
        raise ValueError("I/O operation on closed file")


@pytest.mark.parametrize("sink", [_WriteOnly, _ClosedTty])
def test_a_run_writes_to_a_stream_that_is_not_a_file(sink, tmp_path):
    s = sink()
    r = run_experiment(None, TINY, runs_root=tmp_path / "runs", stream=s)
    assert r.exit_code == 0 and r.summary[0]["env_steps"] == 200, r
    assert str(r.run_dir) in "".join(s.text)   # the summary's path, as on a terminal
