"""Review 46, the experiment side: where `swarm run`'s status page is, the docstring
examples that started a run, and a peer's run folder under a ``runs`` link to nowhere.

Under `swarm run` with ``restart_dead`` a restarted coordinator served its status page on a
new random port (the ZMQ address was kept), so a Prometheus target set to the first URL
was down for the rest of the run, and `swarm run` never printed the URL (it was only in
logs/coordinator.log). Running the doctests of swarm.experiment (`pytest
--doctest-modules`, `python -m doctest`) started a real training run and left runs/ in the
current folder. `swarm peer --spec` whose default run folder lies under a ``runs`` link to
a missing target said only "(File exists)".
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from urllib.parse import urlsplit

from swarmtest import ROOT, SWARM, free_port, reaped, status, wait_for
# the helpers of the other `swarm run` tests (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_launch import end_all, swarm_run_logged
from experiment.test_run import LONG, recorded_pids, training

from swarm.experiment import load_spec, save_resolved

# --------------------------------------------------------------------- the status page of `swarm run`


def _metrics(url: str) -> str:
    return urllib.request.urlopen(url + "metrics", timeout=5).read().decode()


def _listen(port: int) -> socket.socket | None:
    """A socket listening on loopback ``port``, once the process that had it let it go; None until then."""
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past the scrapes' TIME_WAIT
        s.bind(("127.0.0.1", port))
        s.listen()
        return s
    except OSError:
        s.close()
        return None


def test_a_restarted_coordinator_keeps_its_status_page_and_swarm_run_says_where(tmp_path):
    """The coordinator killed twice under restart_dead: first it comes back with its page at the
    URL `swarm run` printed; then, its port taken meanwhile, on a new one, which is said."""
    d = taken = None
    p, log = swarm_run_logged(tmp_path, LONG + ["restart_dead=true"])
    try:
        with reaped(p):
            d = wait_for(lambda: training(tmp_path, 2), timeout=60, what="both peers training")
            addr = re.search(r"swarm coordinator on (tcp://\S+) ", (d / "logs" / "coordinator.log").read_text())[1]
            url = status(addr)["http"]
            first = recorded_pids(d)["coordinator"]
            os.kill(first, signal.SIGKILL)
            st = wait_for(lambda: recorded_pids(d)["coordinator"] != first and status(addr, 0.5), 60,
                          what="the coordinator restarted")
            # a scrape target set to the first URL still answers
            assert st["http"] == url, (st["http"], url)
            assert "swarm_epoch{" in _metrics(url)

            # another process takes the page's port while the coordinator is down (the
            # launcher frozen meanwhile, so that it restarts only once the port is taken)
            os.kill(p.pid, signal.SIGSTOP)
            try:
                os.kill(recorded_pids(d)["coordinator"], signal.SIGKILL)
                taken = wait_for(lambda: _listen(urlsplit(url).port), 20, what="the old page's port free")
            finally:
                os.kill(p.pid, signal.SIGCONT)
            moved = wait_for(lambda: re.search(r"swarm run: the coordinator's status page is now at (http://\S+/) "
                                               rf"\(it was at {re.escape(url)}\)", log.read_text()), 60,
                             what="the new URL said")[1]
            assert moved != url and status(addr)["http"] == moved and "swarm_epoch{" in _metrics(moved)
            p.send_signal(signal.SIGINT)
            p.wait(60)
        out = log.read_text()
        assert p.returncode == 130, out
        # the banner names the page, and each restart where it is
        assert f"swarm run: coordinator {addr}, status page {url} (/metrics for Prometheus)\n" in out, out
        assert f"exited with signal 9; starting it again on {addr}, its status page at {url}\n" in out, out
        assert (f"exited with signal 9; starting it again on {addr}; another process took the port of its status "
                f"page ({url}): the page moves to a new one\n") in out, out
    finally:
        if d is not None:
            end_all(recorded_pids(d))   # what a failure left of its children, the restarted ones too
        if taken is not None:
            taken.close()


# --------------------------------------------------------------------- the doctests

#: the modules of swarm.experiment whose examples a doctest run collects (ray_launch's need Ray), and the CLI's
MODULES = ["swarm.experiment", "swarm.experiment.launch", "swarm.experiment.spec", "swarm.experiment.runner",
           "swarm.experiment.checkpoint", "swarm.experiment.forkserver", "swarm.cli"]


def test_the_docstring_examples_run_as_doctests_and_start_nothing(tmp_path):
    code = textwrap.dedent(f"""
        import doctest, importlib, json
        print(json.dumps({{m: doctest.testmod(importlib.import_module(m), optionflags=doctest.ELLIPSIS).failed
                          for m in {MODULES!r}}}))
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    failed = json.loads(p.stdout.splitlines()[-1])
    left = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.glob("*/*"))
    assert failed == dict.fromkeys(MODULES, 0) and left == [], f"{failed}; left behind: {left}\n{p.stdout[-4000:]}"
    assert os.listdir(tmp_path) == []   # no runs/ folder, nothing else


# --------------------------------------------------------------------- a runs link to nowhere


def test_swarm_peer_names_a_runs_link_whose_target_is_missing(tmp_path):
    spec = save_resolved(load_spec(None, ["peers=1"]), tmp_path / "spec.json")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    target = tmp_path / "scratch-not-mounted" / "runs"
    (cwd / "runs").symlink_to(target)
    p = subprocess.run([*SWARM, "peer", "--spec", str(spec), "--rank", "0", "--coordinator",
                        f"tcp://127.0.0.1:{free_port()}"], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        f"swarm: error: run folder runs/cartpole-ring-peer0 (the default --run-dir): cannot create "
        f"runs/cartpole-ring-peer0/peer0 (runs is a symbolic link to {target}, which does not exist); pass a "
        "--run-dir this process can write"), p.stderr[-3000:]
    assert os.listdir(cwd) == ["runs"] and not target.parent.exists()   # nothing made
