"""`swarm run --resume` draws its progress line from the resumed peers' step counts: they go
on from their checkpoints, so the line starts there, not at 0 (swarm/experiment/launch.py).

`swarm run` is a real subprocess (coordinator and peers on loopback), ended by its handle.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

# tests/ is on the path: a tiny `swarm run` (2 peers, 600 env steps each) to resume
from experiment.test_run import finish, run_dir_of, tiny_run  # noqa: F401 - a fixture
from swarmtest import ROOT, reaped


def test_a_resumed_runs_progress_line_starts_from_the_peers_steps(tiny_run, tmp_path):  # noqa: F811
    """Before the fix, the first line of `swarm run --resume OLD` read "0%  steps 0/6000" (no
    peer had reported yet) although each peer went on from 600 steps; in a log file that
    line stood for 5 s and the point the peers started from was never shown."""
    ran_in, returncode, out = tiny_run
    assert returncode == 0, out
    old = run_dir_of(ran_in)
    args = [sys.executable, "-m", "swarm.cli", "run", "--resume", str(old), "--set", "budget.env_steps=1500"]
    with reaped(subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1",
                                                               PYTHONPATH=str(ROOT)),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, 90)
    assert p.returncode == 0, out
    drawn = [re.search(r"steps (\S+)/(\d+)", line) for line in out.splitlines() if line.startswith("[")]
    assert drawn and all(m and m[2] == "3000" for m in drawn), out
    counts = [int(m[1]) for m in drawn if m[1] != "-"]
    # each peer goes on from 600: any sum of the peers that have reported is at least that
    assert all(n >= 600 for n in counts), out
    # the first counts are drawn when they come, in a log file too: the run's starting point
    assert len(counts) >= 2 and counts[0] < 3000 and counts[-1] == 3000, out


def test_a_resumed_runs_line_waits_for_every_peers_count():
    """Before the fix the line summed whichever peers had reported: on a resume, peer0's 600
    alone read "steps 600/2400" while peer1 had 600 too. Now the count is "-" until every
    peer has reported (or one has ended), and a fresh run's line is as it was."""
    from swarm.experiment import load_spec
    from swarm.experiment.launch import _Progress

    spec = load_spec(None, ["peers=2", "budget.env_steps=1200"])

    def member(rid, steps):
        return {"id": rid, "stats": {"env_steps": steps, "rounds": 1}}

    out = io.StringIO()
    progress = _Progress(spec, out, resumed=True)
    progress.update({"members": []}, 2)
    progress.update({"members": [member("peer0", 600), {"id": "peer1", "stats": {}}]}, 2)
    progress.update({"members": [member("peer0", 610), member("peer1", 600)]}, 2)
    lines = out.getvalue().splitlines()
    # the log file's first line, and the line at once when every count is in (not 5 s later)
    assert len(lines) == 2 and "   -  steps -/2400" in lines[0] and "50%  steps 1210/2400" in lines[1], lines

    out = io.StringIO()
    progress = _Progress(spec, out, resumed=True)
    progress.update({"members": [member("peer0", 600)]}, 1)   # peer1 ended before it reported
    assert "25%  steps 600/2400" in out.getvalue(), out.getvalue()

    out = io.StringIO()
    _Progress(spec, out).update({"members": []}, 2)
    assert "0%  steps 0/2400" in out.getvalue(), out.getvalue()
