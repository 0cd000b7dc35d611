"""The `swarm` processes' lives at their edges: closed or failing standard streams,
signals while a peer waits to join, and a signal while `swarm run` writes its results.
Real processes and signals, loopback only; each process is ended by its pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
from swarmtest import ROOT, SWARM, free_port, reaped, status, wait_for

from swarm.experiment import load_spec
from swarm.experiment.spec import save_resolved

ENV = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
ENV.pop("SWARM_PARENT_PID", None)
needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@contextlib.contextmanager
def silent_coordinator() -> Iterator[socket.socket]:
    """A loopback listener that takes connections and never answers: a peer that joins it
    waits (up to its join timeout) inside its start."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(120)
    try:
        yield s
    finally:
        s.close()


def test_a_coordinator_with_stdout_closed_ends_cleanly(tmp_path: Path):
    """`swarm coordinator >&-`: uvloop took fd 1 for its own and aborted at exit (SIGABRT,
    exit 134) closing it; fds 0-2 that are closed get /dev/null first."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    with open(tmp_path / "err", "w") as err:
        p = subprocess.Popen(["bash", "-c", 'exec "$@" >&-', "bash", *SWARM, "coordinator", "--bind", addr],
                             env=ENV, stderr=err, cwd=ROOT)
    with reaped(p):
        wait_for(lambda: status(addr, timeout=0.5), timeout=30, what="the coordinator answering")
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
    assert rc == 0, (tmp_path / "err").read_text()


def test_swarm_run_with_stderr_closed_gets_to_its_checks(tmp_path: Path):
    """`swarm run 2>&-` found sys.stderr None and ended on an AttributeError (exit 1, said
    nowhere) before it looked at its arguments; now it answers as with stderr open (2)."""
    p = subprocess.run(["bash", "-c", 'exec "$@" 2>&-', "bash", *SWARM, "run", "--resume", str(tmp_path / "none")],
                       env=ENV, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2, p
    assert list(tmp_path.iterdir()) == []


def test_a_spec_peer_waiting_for_its_coordinator_stops_on_ctrl_c(tmp_path: Path):
    """A `swarm peer --spec` whose coordinator does not answer sat out its join timeout
    after Ctrl-C (60 s here); it stops at once, as one stopped while it waits for the
    others does: exit 0, a summary that says `stopped`."""
    spec = save_resolved(load_spec(None, ["peers=2", "budget.env_steps=300"]), tmp_path / "spec")
    with silent_coordinator() as coord, open(tmp_path / "peer.out", "w") as out:
        addr = "tcp://127.0.0.1:%d" % coord.getsockname()[1]
        p = subprocess.Popen([*SWARM, "peer", "--spec", str(spec), "--rank", "0", "--coordinator", addr,
                              "--run-dir", str(tmp_path / "run"), "--set", "peer.join_timeout_s=60"],
                             env=ENV, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        with reaped(p):
            conn, _ = coord.accept()    # it is joining now
            conn.close()
            p.send_signal(signal.SIGINT)
            try:
                rc = p.wait(30)   # well under its 60 s join timeout
            except subprocess.TimeoutExpired:
                raise AssertionError("still joining 30 s after Ctrl-C:\n"
                                     + (tmp_path / "peer.out").read_text()) from None
    log = (tmp_path / "peer.out").read_text()
    assert rc == 0 and "Traceback" not in log, log
    assert "swarm peer peer0 done (stopped): 0 env steps" in log, log
    summary = json.loads((tmp_path / "run" / "peer0" / "summary.json").read_text())
    assert summary["reason"] == "stopped" and summary["env_steps"] == 0, summary


def test_a_peer_waiting_for_its_coordinator_stops_on_sigterm(tmp_path: Path):
    """A plain `swarm peer` still joining had no handlers yet: SIGTERM killed it (143)."""
    with silent_coordinator() as coord:
        addr = "tcp://127.0.0.1:%d" % coord.getsockname()[1]
        p = subprocess.Popen([*SWARM, "peer", "--id", "waiter", "--coordinator", addr,
                              "--set", "peer.join_timeout_s=60"],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        with reaped(p):
            conn, _ = coord.accept()
            conn.close()
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
    assert p.returncode == 0, (out, err)
    assert out == "swarm peer waiter: stopped before it joined\n" and err == "", (out, err)


@needs_dev_full
def test_output_that_cannot_be_written_ends_without_a_traceback(tmp_path: Path):
    """stdout on a full disk gave a raw traceback; stderr that fails turned an error's
    exit 2 into 1."""
    def run(args: list[str], redirect: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "bash", *SWARM, *args], env=ENV,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    nobody = f"tcp://127.0.0.1:{free_port()}"
    for args in (["run", "--show"], ["status", "--coordinator", nobody, "--timeout", "0.3", "--watch"]):
        p = run(args, ">/dev/full")
        assert p.returncode == 1, (args, p.stderr)
        assert p.stderr == "swarm: cannot write to stdout (No space left on device); output lost\n", (args, p.stderr)
    p = run(["status", "--coordinator", nobody, "--timeout", "0.3"], "2>/dev/full")
    assert p.returncode == 2 and p.stdout == "", p


def test_a_peer_whose_reader_left_goes_on_and_leaves_cleanly(procs, tmp_path: Path):
    """`swarm peer | head -1`: each later view logged a BrokenPipeError traceback ("view
    callback failed"), and the peer exited 1 at its leave."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    wait_for(lambda: status(addr, timeout=0.5), timeout=30, what="the coordinator answering")
    with open(tmp_path / "reader.err", "w") as err:
        p = subprocess.Popen([*SWARM, "peer", "--id", "reader", "--coordinator", addr], env=ENV,
                             stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    with reaped(p):
        assert p.stdout.readline().startswith("swarm peer reader on ")
        p.stdout.close()    # the reader leaves, as `head -1` does
        procs.start("peer", "--id", "other", "--coordinator", addr, name="other")

        def seen_two() -> bool:
            st = status(addr, timeout=0.5)
            me = [m for m in st["members"] if m["id"] == "reader"]
            return len(st["view"]["members"]) == 2 and me and me[0]["linked_epoch"] == st["epoch"]
        wait_for(seen_two, timeout=30, what="the reader peer linked in the view with the other")
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
    err = (tmp_path / "reader.err").read_text()
    assert rc == 0 and err == "", err


@pytest.mark.parametrize("signals", [1, 2])
def test_a_signal_while_swarm_run_writes_its_results_lets_it_finish(tmp_path: Path, signals: int):
    """SIGTERM once every peer had ended (while `swarm run` drew its plots) killed it (143):
    no "run folder:" line, the plots cut short. It now finishes them, and the exit code is
    the peers' (0); a second signal there gives the ending up (130; nothing could stop it),
    with summary.json whole. The run sends itself the signals as it starts on the plots."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        from swarm import cli
        from swarm.experiment import launch
        real = launch.write_plots
        def write_plots(run_dir):
            for _ in range({signals}):
                os.kill(os.getpid(), signal.SIGTERM)
            return real(run_dir)
        launch.write_plots = write_plots
        sys.exit(cli.main(["run", "--set", "peers=2", "--set", "budget.env_steps=300", "--set", "eval.every=0"]))
    """)
    p = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=tmp_path)
    with reaped(p):
        out, _ = p.communicate(timeout=240)
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = json.loads((run_dir / "summary.json").read_text())
    assert [r["reason"] for r in rows] == ["budget", "budget"], rows
    if signals == 2:
        assert p.returncode == 130 and "run folder:" not in out, out[-3000:]
        assert not list(run_dir.rglob(".*.tmp")), list(run_dir.rglob(".*.tmp"))
        return
    assert p.returncode == 0, out[-3000:]
    assert "swarm run: interrupted by SIGTERM once the peers had ended; the run's results are whole" in out, out[-3000:]
    assert f"run folder: {run_dir.relative_to(tmp_path)}" in out, out[-3000:]
    assert sorted(f.name for f in (run_dir / "plots").iterdir()) == ["bytes_per_round.png", "consensus.png",
                                                                     "returns.png"]
