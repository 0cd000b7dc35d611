"""The researcher's experiment scripts keep what they measured and count each seed once.

compare_runs.py wrote results.csv and table.md only after its last run: a sweep cut short
(Ctrl-C, a `timeout`, one failed run) kept nothing, a second call into the same --out
replaced the first call's table, and results.csv named each run folder relative to the
caller's working directory. Every script that takes --seeds ran a repeated seed again and
counted it twice. eval_schedules.py stopped its isolated learner at the first solve on the
coarsest schedule, before a schedule that does not divide it had one (the seed was then
left out as "not solved"), and read a swarm ratio off runs shorter than the schedule.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from swarmtest import wait_for

from swarm.experiment.launch import read_csv
from swarm.rl.train import StepInfo

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
#: two variants of two peers and 500 env steps each: the smallest sweep
SWEEP = ["codec", "--only", "identity", "fp16", "--steps", "500", "--set", "peers=2", "--out", "out"]


def _start(script: str, *args: str, cwd: Path) -> subprocess.Popen:
    """scripts/<script>.py in ``cwd``, in a process group of its own (its pid is the group id)."""
    return subprocess.Popen([sys.executable, str(SCRIPTS / f"{script}.py"), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _end(p: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """The script's output once it ends; it and whatever of its group still runs are killed
    when it overruns ``timeout`` or the test fails."""
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if p.returncode is None:
            p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _run(script: str, *args: str, cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
    return _end(_start(script, *args, cwd=cwd), timeout)


def test_compare_runs_keeps_each_finished_run_and_a_rerun_adds_only_the_missing_ones(tmp_path):
    out = tmp_path / "out"
    p = _start("compare_runs", *SWEEP, cwd=tmp_path)
    try:   # a `timeout` as the second run starts
        wait_for(lambda: (out / "runs" / "fp16-0").is_dir() or p.poll() is not None, timeout=300,
                 interval=0.2, what="the second run")
        p.send_signal(signal.SIGTERM)
    finally:
        cut = _end(p, 120)
    assert cut.returncode == 143, cut.stderr[-3000:]
    rows = read_csv(out / "results.csv")
    assert [(r["variant"], r["seed"]) for r in rows] == [("identity", "0")], cut.stdout
    first = rows[0]["run_dir"]   # relative to --out: the folder can move
    assert not Path(first).is_absolute() and (out / first / "config.json").is_file(), first
    assert "| identity |" in (out / "table.md").read_text()

    res = _run("compare_runs", *SWEEP, cwd=tmp_path)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert "identity seed 0: in out/results.csv already, not run again" in res.stdout, res.stdout
    rows = read_csv(out / "results.csv")
    assert [(r["variant"], r["seed"]) for r in rows] == [("identity", "0"), ("fp16", "0")]
    assert rows[0]["run_dir"] == first and (out / rows[1]["run_dir"] / "config.json").is_file()
    assert len(list((out / "runs" / "identity-0").iterdir())) == 1   # not run again
    table = (out / "table.md").read_text()
    assert "| identity |" in table and "| fp16 |" in table
    assert set(json.loads(res.stdout.splitlines()[-1])["variants"]) == {"identity", "fp16"}

    # another comparison's settings in the same folder: refused, and nothing changed
    before = {f: (out / f).read_bytes() for f in ("results.csv", "table.md", "settings.json")}
    res = _run("compare_runs", *SWEEP, "--set", "dqn.lr=0.004", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "--out out: holds a comparison of other settings" in res.stderr and "dqn.lr=0.004" in res.stderr
    assert {f: (out / f).read_bytes() for f in before} == before
    assert sorted(os.listdir(out / "runs")) == ["fp16-0", "identity-0"]
    assert len(list((out / "runs" / "fp16-0").iterdir())) == 2   # the one cut short and the one finished


@pytest.mark.parametrize("script,args", [
    ("compare_runs", ["codec", "--only", "fp16", "--steps", "500", "--set", "peers=2", "--seeds", "0", "0"]),
    ("eval_schedules", ["--seeds", "0", "0", "--every", "250", "--schedules", "250", "--episodes", "1",
                        "--isolated-steps", "250", "--swarm-steps", "250"]),
    ("learning_bound", ["--seeds", "1", "0", "1", "--actors", "1", "--max-steps", "200", "--eval-every", "200",
                        "--eval-episodes", "1", "--set", "learning_starts=100"]),
    ("bench_learning", ["--seeds", "1", "0", "1", "--max-steps", "260", "--eval-every", "260",
                        "--eval-episodes", "1", "--skip-dense", "--skip-alone", "--set", "peers=2"]),
    ("dqn_isolated", ["--seeds", "2", "2", "--steps", "200"]),
])
def test_a_repeated_seed_is_refused(script, args, tmp_path):
    """A repeated seed ran again and counted as another seed in every mean."""
    res = _run(script, *args, cwd=tmp_path, timeout=180)
    assert res.returncode == 2 and "Traceback" not in res.stderr, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert "--seeds repeats seed" in res.stderr, res.stderr
    assert os.listdir(tmp_path) == []   # compare_runs made no folder


def _load_script(name: str):
    """scripts/<name>.py as a module (with scripts/ on the path for what it imports)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def test_eval_schedules_runs_the_isolated_learner_until_every_schedule_has_a_solve():
    """A learner whose greedy policy first solves at 2,000 steps, on the 1,000 grid: the
    run stopped there, before the 750 grid had a solve (2,250), and the seed was left out
    as not solved. The stop rule, with evaluations that solve at chosen steps."""
    es = _load_script("eval_schedules")
    solves_at = {2000, 2250}
    evals: list[tuple[int, float]] = []
    on_step = es.until_every_schedule_solves(250, [750, 1000], lambda step: 500.0 if step in solves_at else 9.0,
                                             evals)
    stopped = next(t for t in range(1, 10_001) if on_step(StepInfo(t, 1.0, False, False, None, None)))
    assert stopped == 2250, evals   # before: 2000
    assert es.first_solves(evals, [750, 1000]) == {750: 2250, 1000: 2000}
    assert [t for t, _ in evals] == list(range(250, 2251, 250))


def test_eval_schedules_refuses_swarm_steps_below_the_coarsest_schedule(tmp_path):
    """The swarm was never evaluated on the 1,000 grid, was counted at 300 and read 0.40x."""
    res = _run("eval_schedules", "--seeds", "0", "--schedules", "1000", "--swarm-steps", "300", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "--swarm-steps 300 is below the coarsest schedule, 1000" in res.stderr, res.stderr
