"""The figures a run reports and the processes it starts (review 43).

- rounds.csv's and TensorBoard's per-round ``bytes_out`` count the relayed gradients
  too when the parameters are also averaged (swarm/experiment/runner.py);
- summary.json's and the heartbeat's ``buffer_size`` are the replay buffer as it is,
  not as it was at the last episode's end (runner.py);
- `swarm run --resume RUN --set seed=N` with another seed is refused (launch.py);
- the plots of a run whose gossip sent nothing warn of nothing (launch.write_plots);
- the coordinator, the fork server and the peers import the swarm package that `swarm
  run` itself runs, not a ``swarm.py`` or another checkout in the working directory
  (launch.py, forkserver.py);
- the hints for the optional extras name what to install (the name ``swarm`` on PyPI
  is another project).

Peers are threads of this process beside a real coordinator process on loopback, or a
real `swarm run` subprocess, ended by its handle.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
# tests/ is on the path: a coordinator process for in-process peers, and `swarm run`'s ending
from experiment.test_run import finish
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import ROOT, reaped, status, wait_for

from swarm.errors import ConfigError, SwarmError
from swarm.experiment import forkserver, load_spec
from swarm.experiment.launch import run_experiment, write_plots
from swarm.experiment.runner import run_peer
from swarm.experiment.spec import save_resolved


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _peers(spec, coordinator: str, run_dir: Path, **kw) -> dict[int, dict]:  # noqa: F811
    """Run every peer of ``spec`` as a thread of this process to its end; their summaries."""
    out: dict[int, dict] = {}
    stop = threading.Event()
    threads = [threading.Thread(target=lambda r=r: out.update({r: run_peer(
        spec, r, coordinator, run_dir, stop=stop, join_timeout=30, **kw)})) for r in range(spec.peers)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(120)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(out) == list(range(spec.peers)), out
    return out


# ---------------------------------------------------------------- 1. bytes per round


def test_round_bytes_out_counts_the_relayed_gradients_when_the_parameters_are_averaged_too(coordinator,  # noqa: F811
                                                                                           tmp_path):
    """gossip.exchange = gradients with gossip.average = true: before the fix each rounds.csv
    row's (and TensorBoard's) bytes_out was the averaging round's own deltas only, while
    bytes_in beside it and summary.json's gossip_bytes_out counted the relayed gradients
    too: the rows summed to about a fifth of what the peer sent."""
    spec = load_spec(None, ONE + ["peers=2", "budget.env_steps=400", "gossip.exchange=gradients",
                                  "gossip.sync=async", "gossip.average=true", "gossip.interval=20",
                                  "gossip.round_timeout_s=30", "dqn.train_every=4"])
    summaries = _peers(spec, coordinator, tmp_path)
    for r, s in summaries.items():
        rows = _rows(tmp_path / f"peer{r}" / "rounds.csv")
        assert len(rows) == s["rounds"] > 0 and all(row["gossip_round"] for row in rows), rows[:3]
        sent = sum(int(row["bytes_out"]) for row in rows)
        relayed = s["relay"]["bytes_out"]
        averaged = s["gossip_bytes_out"] - relayed   # the averaging rounds' deltas (and answers)
        assert relayed > 0 and averaged > 0, s
        # the rows add up to the totals as of the last round (summary.json's are those at the end):
        # the relay's gradients are in them, not only the averaging's deltas
        assert averaged < sent <= s["gossip_bytes_out"], (sent, averaged, relayed)
        if importlib.util.find_spec("tensorboard") is not None:   # TensorBoard's gossip/bytes_out is the same
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            ea = EventAccumulator(str(tmp_path / f"peer{r}" / "tb"), size_guidance={"scalars": 0})
            ea.Reload()
            assert sum(e.value for e in ea.Scalars("gossip/bytes_out")) == sent


# ---------------------------------------------------------------- 2. the buffer's size

# MountainCar's episodes are 200 steps (a random policy never reaches the flag): within one,
# no episode ends
LONG_EPISODES = ONE + ["env=MountainCar-v0", "buffer.capacity=100000"]


def test_summary_buffer_size_is_the_buffer_at_the_end(coordinator, tmp_path):  # noqa: F811
    """Before the fix summary.json's buffer_size was len(buffer) at the last episode's end:
    0 here, where the run ends inside its first episode with 150 transitions stored."""
    s = run_peer(load_spec(None, LONG_EPISODES + ["budget.env_steps=150"]), 0, coordinator, tmp_path,
                 tensorboard=False, join_timeout=30)
    assert s["reason"] == "budget" and s["episodes"] == 0, s
    saved = json.loads((tmp_path / "peer0" / "summary.json").read_text())
    assert s["buffer_size"] == saved["buffer_size"] == 150, saved


def test_heartbeat_buffer_size_is_the_buffer_now(coordinator, tmp_path):  # noqa: F811
    """Before the fix the heartbeat's buffer_size (the status page, /metrics'
    swarm_peer_buffer_items) moved only at episode ends: 0 for a whole 200-step episode,
    then 200 for the next. A lone peer stores one transition per env step, before the
    step's count goes up, and the heartbeat reads the count first."""
    spec = load_spec(None, LONG_EPISODES + ["budget.env_steps=1000000"])
    stop = threading.Event()
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(run_peer(spec, 0, coordinator, tmp_path, stop=stop,
                                                            tensorboard=False, join_timeout=30)))
    t.start()
    try:
        def figures() -> dict | None:
            rows = [m.get("stats") or {} for m in status(coordinator, 0.5)["members"]]
            return next((s for s in rows if (s.get("env_steps") or 0) > 0), None)
        seen = wait_for(figures, timeout=60, what="the peer's heartbeat figures")
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive() and out.get("reason") == "stopped", out
    assert seen["env_steps"] <= seen["buffer_size"] <= out["env_steps"], seen


# ---------------------------------------------------------------- 3. a resume's seed


@pytest.fixture
def finished_run(coordinator, tmp_path) -> Path:  # noqa: F811
    """A one-peer run folder as `swarm run` leaves it: config.json and peer0's checkpoints."""
    run_dir = tmp_path / "old"
    spec = load_spec(None, ONE)
    save_resolved(spec, run_dir)
    s = run_peer(spec, 0, coordinator, run_dir, tensorboard=False, join_timeout=30)
    assert s["reason"] == "budget", s
    return run_dir


@pytest.mark.parametrize("ckpt", [True, False], ids=["full-checkpoints", "checkpoint.pt-only"])
def test_resume_refuses_another_seed_before_it_starts(finished_run, tmp_path, ckpt):
    """Before the fix `--set seed=7` on a resume was taken silently: the new config.json said
    seed 7 while the network and the agent's random streams went on from the checkpoints
    (seed 0's). A peer that left only checkpoint.pt restores them too (and starts a new
    buffer), so the seed is refused there as well."""
    if not ckpt:
        shutil.rmtree(finished_run / "peer0" / "ckpt")
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as e:
        run_experiment(None, ["seed=7", "budget.env_steps=300"], resume=finished_run, runs_root=runs,
                       stream=io.StringIO())
    msg = str(e.value)
    assert "seed = 0" in msg and "seed = 7" in msg and str(finished_run) in msg, msg
    assert not runs.exists()   # nothing was made, nothing started


def test_resume_refuses_seed_and_buffer_changes_in_one_error(finished_run, tmp_path):
    """The seed is one of the settings the checkpoints keep, beside the replay buffer's:
    one error names every one that changed."""
    with pytest.raises(ConfigError) as e:
        run_experiment(None, ["seed=7", "buffer.alpha=0.3"], resume=finished_run, runs_root=tmp_path / "runs",
                       stream=io.StringIO())
    assert "seed = 7" in str(e.value) and "buffer.alpha = 0.3" in str(e.value), e.value


# ---------------------------------------------------------------- 4. plots of nothing sent


def test_plots_of_a_run_that_sent_no_bytes_warn_of_nothing(tmp_path):
    """A one-peer run's rounds send nothing (bytes_out 0 in every row), and a round that
    moved nobody has a disagreement of 0: before the fix the bytes plot took a log scale
    anyway and matplotlib warned 'Data has no positive values, and therefore cannot be
    log-scaled' at the end of every such run."""
    pytest.importorskip("matplotlib")
    peer = tmp_path / "peer0"
    peer.mkdir()
    (peer / "metrics.csv").write_text("env_steps,mean_return\n100,20\n200,25\n")
    (peer / "rounds.csv").write_text("round,bytes_out,disagreement\n1,0,0\n2,0,0\n3,0,0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = write_plots(tmp_path)
    assert [p.name for p in written] == ["returns.png", "bytes_per_round.png", "consensus.png"]
    assert all(p.stat().st_size > 0 for p in written)


# ---------------------------------------------------------------- 5. the children's package


def _swarm_run(cwd: Path, env: dict[str, str], *head: str) -> tuple[subprocess.Popen, str]:
    """`python HEAD... run` of a tiny one-peer run in ``cwd``, to its end; (process, output)."""
    args = [sys.executable, *head, "run", "--set", "peers=1", "--set", "budget.env_steps=200",
            "--set", "dqn.learning_starts=50", "--set", "eval.every=0"]
    with reaped(subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)) as p:
        out = finish(p, 120)
    return p, out


def _logs(cwd: Path) -> dict[str, str]:
    (run_dir,) = (cwd / "runs").iterdir()
    return {f.name: f.read_text() for f in (run_dir / "logs").iterdir()}


@pytest.mark.parametrize("forks", ["1", "0"], ids=["forkserver", "fresh-peers"])
def test_a_swarm_py_in_the_working_directory_is_not_what_the_children_import(tmp_path, forks):
    """Before the fix the children started as `python -m swarm.cli` (and the fork server as
    `python -m swarm.experiment.forkserver`), which puts the working directory first on
    sys.path: a user's own swarm.py there was imported in place of the package, and the run
    died at once (exit 2, "__path__ attribute not found on 'swarm'"). The launcher here runs
    as the installed `swarm` command does, with the working directory off its path."""
    (tmp_path / "swarm.py").write_text("import sys\nprint('a swarm.py of the user', file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p, out = _swarm_run(tmp_path, dict(env, PYTHONUNBUFFERED="1", SWARM_FORKSERVER=forks), "-P", "-m", "swarm.cli")
    assert p.returncode == 0, out
    logs = _logs(tmp_path)
    assert {"coordinator.log", "peer0.log"} <= logs.keys(), logs.keys()
    assert not [name for name, text in logs.items() if "a swarm.py of the user" in text], logs


def test_a_source_tree_run_as_python_m_swarm_runs_its_own_code_in_every_process(tmp_path):
    """A source tree that no one installed, run from its root as `python -m swarm`: every
    process of the run imports that tree's package (the launcher gives its children the
    folder that holds its own package on PYTHONPATH), not another installed one. Here this
    checkout is installed (editable) in the interpreter, and a copy of it is the tree; the
    copy says where it was imported from."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "swarm", tree / "swarm", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tree / "swarm" / "__init__.py", "a") as f:
        f.write("\nimport sys as _sys\nprint(f'swarm imported from {__file__}', file=_sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p, out = _swarm_run(tree, dict(env, PYTHONUNBUFFERED="1", SWARM_FORKSERVER="1"), "-m", "swarm")
    assert p.returncode == 0, out
    logs = _logs(tree)
    mark = f"swarm imported from {tree / 'swarm' / '__init__.py'}"
    assert mark in out                                   # the launcher
    assert mark in logs["coordinator.log"], logs["coordinator.log"]
    # the peer is forked from the fork server, which imported the package for it
    assert mark in logs["forkserver.log"] or mark in logs["peer0.log"], logs


@pytest.mark.skipif(not forkserver.enabled(), reason="no pidfds here (Linux 5.3 and later)")
def test_a_peer_is_started_afresh_once_the_package_changed_under_the_server(tmp_path):
    """The fork server after the swarm package changed on disk (an upgrade under a running
    `swarm run`), as test_review42_forkserver's test of it, with a launcher that itself runs
    a copy of the package (there the test process was the launcher, which ran this checkout,
    and its children the copy: the children now run the launcher's package): it forks while
    the copy is as it was; once a module of it changes, the next start is a fresh interpreter
    that runs the new code, with one line naming the change."""
    tree = tmp_path / "tree"
    package = tree / "swarm"
    shutil.copytree(ROOT / "swarm", package, ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "launcher.py"
    script.write_text(f"""
import io, subprocess, sys
from pathlib import Path
import swarm
from swarm.experiment.forkserver import Forked
from swarm.experiment.launch import Launch
assert Path(swarm.__file__).parent == Path({str(package)!r}), swarm.__file__
out = io.StringIO()
launch = Launch(Path({str(tmp_path / 'run')!r}), out=out)
try:
    launch.preload()
    kinds = []
    for name in ("a", "b", "c", "d"):
        if name == "c":   # the upgrade: a module the server imported before its first fork
            with open(Path({str(package)!r}) / "experiment" / "spec.py", "a") as f:
                f.write("\\nprint('spec.py as upgraded', flush=True)\\n")
        c = launch.start(name, ["run", "--show"], fork=True)
        assert c.proc.wait(60) == 0, c.log.read_text()
        kinds.append((type(c.proc).__name__, "spec.py as upgraded" in c.log.read_text(),
                      "peers = " in c.log.read_text()))
    print(kinds)
    print(out.getvalue())
finally:
    launch.close()
""")
    env = dict({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, PYTHONPATH=str(tree),
               SWARM_FORKSERVER="1")
    p = subprocess.run([sys.executable, "-P", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    kinds, *said = p.stdout.splitlines()
    assert kinds == str([("Forked", False, True)] * 2 + [("Popen", True, True)] * 2), p.stdout
    said = [line for line in said if "changed" in line]
    assert len(said) == 1 and said[0].startswith("swarm run: swarm's code changed since this run started"), said
    assert str(package / "experiment" / "spec.py") in said[0] and "fresh interpreter" in said[0], said


# ---------------------------------------------------------------- 6. what to install


def test_the_hints_name_what_to_install_not_the_pypi_name_swarm(monkeypatch):
    """`pip install 'swarm[ray]'` on a node without swarm installs Swarm 0.0.2 from PyPI, a
    2018 game: the hints name the packages themselves."""
    from swarm.experiment import ray_launch

    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError
    with pytest.raises(SwarmError) as e:
        ray_launch._ray()
    assert "pip install 'ray>=2.9'" in str(e.value), e.value
    for path in [*(ROOT / "swarm").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        assert "pip install 'swarm" not in text and "pip install swarm" not in text, path
