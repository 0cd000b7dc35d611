"""Two experiment scripts started at once on one host each keep to their own run.

compare_runs.py made its default output folder ``runs/compare-<experiment>-<time>`` with
``exist_ok=True``: two started in the same second (seeds in parallel) wrote one folder, and
its results.csv, table.md and compare.png held one of them. chaos.py with a shared --root
took the first new ``runs/chaos-*`` folder holding a pids.json for its own run, which could
be the other invocation's: its kills and freezes hit the other run's processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from swarmtest import wait_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def _run(script: str, *args: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    """Run scripts/<script>.py in ``cwd`` (with ``env``, else this one's) to its end, in a process
    group of its own that is killed with whatever it left running, also when the test fails or
    it overruns."""
    p = subprocess.Popen([sys.executable, str(SCRIPTS / f"{script}.py"), *args], cwd=cwd, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # the group is the script's: its pid is the group id
        except ProcessLookupError:
            pass
        if p.returncode is None:
            p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_compare_runs_takes_a_folder_of_its_own_when_another_comparison_has_that_name(tmp_path):
    """Another comparison started in the same second holds the default folder (made here
    beforehand for every second the script could start in): this one adds -1 and leaves
    the other's results as they were."""
    now = time.time()
    others = []
    for t in range(int(now) - 5, int(now) + 300):
        d = tmp_path / "runs" / f"compare-codec-{time.strftime('%Y%m%d-%H%M%S', time.localtime(t))}"
        d.mkdir(parents=True)
        (d / "results.csv").write_text("another comparison's results\n")
        others.append(d)
    res = _run("compare_runs", "codec", "--only", "fp16", "--steps", "500", "--set", "peers=2",
               cwd=tmp_path, timeout=280)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    out = tmp_path / json.loads(res.stdout.strip().splitlines()[-1])["out"]
    assert out.parent == tmp_path / "runs" and out not in others and out.name.endswith("-1"), out
    assert f"results: {out.relative_to(tmp_path)}" in res.stdout
    assert [d for d in others if (d / "results.csv").read_text() != "another comparison's results\n"] == []
    assert [d for d in others if set(os.listdir(d)) != {"results.csv"}] == []
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0].startswith("variant,seed,") and len(rows) == 2 and rows[1].startswith("fp16,0,"), rows


def test_compare_runs_refuses_a_default_folder_it_cannot_create_naming_out(tmp_path):
    (tmp_path / "runs").write_text("a file\n")
    res = _run("compare_runs", "codec", "--only", "fp16", "--steps", "500", cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "cannot create the run folder runs/compare-codec-" in res.stderr and "--out" in res.stderr, res.stderr
    assert (tmp_path / "runs").read_text() == "a file\n" and os.listdir(tmp_path) == ["runs"]


def _load_chaos():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chaos", SCRIPTS / "chaos.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPTS))
    return mod


def test_chaos_takes_the_run_folder_its_own_launcher_made(tmp_path):
    """Another invocation's run folder (its launcher a live process, its children another)
    appears in the shared --root after this one lists the root and before its own launcher
    has written its pids.json: start_run took that folder. It now takes the one whose
    pids.json names its own launcher."""
    chaos = _load_chaos()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    got: dict = {}

    def start() -> None:
        try:
            got["run"] = chaos.start_run(tmp_path, ["peers=2", "seed=0", "name=chaos", "budget.env_steps=400",
                                                    "eval.every=0"])
        except BaseException as e:
            got["error"] = e

    starter = threading.Thread(target=start, name="start_run")
    try:
        starter.start()
        # its log is made after it lists the root and before it starts the launcher
        wait_for(lambda: (tmp_path / "swarm-run-0.log").exists(), timeout=60, what="start_run's log")
        assert not list(tmp_path.glob("runs/*/pids.json")), "the launcher was faster than the test"
        decoy = tmp_path / "runs" / "chaos-20000101-000000"
        decoy.mkdir(parents=True)
        (decoy / "pids.json").write_text(json.dumps({"launcher": other.pid,
                                                     "children": {"coordinator": other.pid}}))
        starter.join(120)
        assert not starter.is_alive()
        if "error" in got:
            raise got["error"]
        p, run = got["run"]
        try:
            assert run != decoy, "start_run took another invocation's run folder"
            assert json.loads((run / "pids.json").read_text())["launcher"] == p.pid
        finally:
            chaos.end_run(p)
    finally:
        starter.join(120)
        if "run" in got:
            chaos.end_run(got["run"][0])
        other.kill()
        other.wait()
