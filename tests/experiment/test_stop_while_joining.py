"""A `swarm peer --spec` stopped (SIGTERM) while it waits for the others to join ends at
once, with a summary that says it was stopped; it used to sit out its join timeout, and
`swarm run` then killed it after its grace period (Ctrl-C during start-up took seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from swarmtest import ROOT, free_port, wait_for

from swarm.experiment import load_spec
from swarm.experiment.spec import save_resolved


def test_a_peer_waiting_for_the_others_stops_on_sigterm(tmp_path: Path):
    spec = save_resolved(load_spec(None, ["peers=2", "budget.env_steps=300"]), tmp_path / "spec")
    addr = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    sw = [sys.executable, "-m", "swarm.cli"]
    log = tmp_path / "peer.out"
    with open(tmp_path / "coord.out", "w") as c_out, open(log, "w") as p_out:
        coord = subprocess.Popen(sw + ["coordinator", "--bind", addr], env=env, stdout=c_out,
                                 stderr=subprocess.STDOUT)
        # rank 0 of 2, alone: it joins and waits (join_timeout 60 s) for rank 1
        peer = subprocess.Popen(sw + ["-v", "peer", "--spec", str(spec), "--rank", "0", "--coordinator", addr,
                                      "--run-dir", str(tmp_path / "run")],
                                env=env, stdout=p_out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "waiting for 2 peers" in log.read_text() or peer.poll() is not None, timeout=60,
                 what="peer0 joined and waiting")
        assert peer.poll() is None, log.read_text()[-3000:]
        peer.send_signal(signal.SIGTERM)
        try:
            rc = peer.wait(15)   # well under the 60 s it would wait for rank 1
        except subprocess.TimeoutExpired:
            raise AssertionError("peer0 still waiting for the others 15 s after SIGTERM:\n"
                                 + log.read_text()[-3000:]) from None
        out = log.read_text()
        assert rc == 0 and "Traceback" not in out, out[-3000:]
        assert "done (stopped): 0 env steps" in out, out[-3000:]
        summary = json.loads((tmp_path / "run" / "peer0" / "summary.json").read_text())
        assert summary["reason"] == "stopped" and summary["env_steps"] == 0, summary
    finally:
        for p in (peer, coord):
            if p.poll() is None:
                p.kill()
                p.wait()
