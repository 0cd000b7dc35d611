"""`run_experiment` from a researcher's own script: in this process, with real peers.

Each run is tiny (2 peers, 300 env steps); after it, no child of this process may
be left and the caller's signal handlers must be back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from swarmtest import ROOT, alive, children_of, wait_for

from swarm.errors import ConfigError
from swarm.experiment import RunResult, load_spec, run_experiment
from swarm.experiment.launch import read_csv, write_plots

TINY = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32",
        "eval.every=0", "buffer.capacity=2000"]


def test_a_script_runs_changed_specs_one_after_another(tmp_path):
    """A Spec changed with dataclasses.replace runs as given, twice in one process; the
    result names the run folder and holds each peer's summary."""
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    spec = load_spec(None, TINY)
    results = []
    for seed in (3, 4):
        log = io.StringIO()
        r = run_experiment(dataclasses.replace(spec, seed=seed), runs_root=tmp_path, stream=log)
        assert isinstance(r, RunResult) and r.exit_code == 0, log.getvalue()
        assert r.run_dir.parent == tmp_path and load_spec(r.run_dir / "config.json").seed == seed
        assert [p["id"] for p in r.summary] == ["peer0", "peer1"]
        assert all(p["env_steps"] == 300 and p["reason"] == "budget" and p["restarts"] == 0 for p in r.summary)
        assert r.summary == json.loads((r.run_dir / "summary.json").read_text())
        assert f"run folder: {r.run_dir}" in log.getvalue()
        assert children_of(os.getpid()) == []
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        results.append(r)
    assert results[0].run_dir != results[1].run_dir
    assert spec.seed == 0    # the spec given is left as it is


def test_a_spec_changed_out_of_range_is_refused_before_anything_starts(tmp_path):
    spec = load_spec(None, TINY)
    with pytest.raises(ConfigError, match=r"peers = 0: must be in \[1, 1024\]"):
        run_experiment(dataclasses.replace(spec, peers=0), runs_root=tmp_path / "runs")
    with pytest.raises(ConfigError, match="budget.env_steps = -1: must be > 0"):
        load_spec(dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, env_steps=-1)))
    assert load_spec(spec, ["seed=7"]).seed == 7 and spec.seed == 0
    assert not (tmp_path / "runs").exists()


def test_runs_in_a_running_event_loop_off_the_main_thread(tmp_path):
    """As from a notebook cell (a running event loop) and from a worker thread, where
    signal handlers cannot be set."""
    got: list = []

    async def cell() -> RunResult:
        return run_experiment(None, TINY, runs_root=tmp_path, stream=io.StringIO())

    def worker() -> None:
        try:
            got.append(asyncio.run(cell()))
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            got.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join(120)
    assert not t.is_alive()
    (r,) = got
    assert isinstance(r, RunResult), r
    assert r.exit_code == 0 and [p["env_steps"] for p in r.summary] == [300, 300]
    assert children_of(os.getpid()) == []


SWEEP = """
import io, sys
from swarm.experiment import run_experiment
for seed in (0, 1):
    try:
        r = run_experiment(None, sys.argv[2:] + [f"seed={seed}"], runs_root=sys.argv[1], stream=io.StringIO())
    except KeyboardInterrupt:
        print("sweep stopped", flush=True)
        sys.exit(3)
    print("run returned", r.exit_code, flush=True)
"""


def test_ctrl_c_stops_a_scripts_sweep(tmp_path):
    """Ctrl-C ends the run's processes and reaches the script as KeyboardInterrupt,
    so its loop does not go on to the next run."""
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    runs = tmp_path / "runs"
    long = ["peers=2", "budget.env_steps=200000", "dqn.learning_starts=100", "eval.every=0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, str(script), str(runs), *long], env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def training() -> Path | None:
            for d in runs.glob("*"):
                if all(len(read_csv(d / f"peer{r}" / "metrics.csv")) > 0 for r in range(2)):
                    return d
            return None

        d = wait_for(training, timeout=60, what="both peers training")
        pids = json.loads((d / "pids.json").read_text())["children"]
        p.send_signal(signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the sweep went on after Ctrl-C: {[x.name for x in runs.iterdir()]}")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)   # it ends the run it is in, children included
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
    assert p.returncode == 3 and "sweep stopped" in out and "run returned" not in out, out
    assert [x.name for x in runs.iterdir()] == [d.name]
    assert (d / "summary.json").exists()
    for name, pid in pids.items():
        assert not alive(pid), f"{name} (pid {pid}) outlived Ctrl-C"


def test_plots_leave_the_callers_matplotlib_backend(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    peer = tmp_path / "peer0"
    peer.mkdir()
    (peer / "metrics.csv").write_text("env_steps,mean_return\n10,9.0\n20,11.0\n")
    (peer / "rounds.csv").write_text("round,bytes_out,disagreement\n1,100,0.5\n2,120,0.25\n")
    before = matplotlib.get_backend()
    matplotlib.use("pdf")
    try:
        written = write_plots(tmp_path)
        assert matplotlib.get_backend() == "pdf"
    finally:
        matplotlib.use(before)
    assert [p.name for p in written] == ["returns.png", "bytes_per_round.png", "consensus.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
