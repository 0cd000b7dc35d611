"""A peer's folder on a disk that fails it before the peer trains, and a new run resumed
from the same checkpoint into a folder that already holds one.

A fresh start, a resume or a restart that cannot write its folder before it trains (its
records run.json and resumed.json, the copy of best.pt, its CSV files) is a ConfigError
naming the file and the cause, which `swarm peer` reports without a traceback and which
`swarm run` does not restart. The disks are real: a small tmpfs in a user and mount
namespace of the test's own (skipped where the machine does not allow one), as in
test_runner_disk.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture
from experiment.test_runner_disk import FILL
from swarmtest import on_small_disk

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.spec import save_resolved
from swarm.experiment.checkpoint import latest
from swarm.experiment.runner import run_peer

ONE = ["peers=1", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=0", "gossip.codec=identity",
       "gossip.step_size=1.0", "checkpoint.full_every_s=0", "checkpoint.incremental_every_steps=50"]

# The child's start: the disk (argv[1]), what it runs, and how it reports a call.
START = FILL + """
    import contextlib, io, json, logging, os, sys, traceback
    from pathlib import Path
    import swarm.experiment.runner as runner
    from swarm.experiment import load_spec, save_resolved

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    disk = Path(sys.argv[1])
    run = disk / "run"
    out = run / "peer0"

    def call(f, *a, **kw):
        try:
            return f(*a, **kw)
        except Exception as e:   # what run_peer raised, whatever it is
            return {"raised": type(e).__name__, "message": str(e), "at": traceback.format_exc()[-1500:]}

    def files():
        return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.is_file() and p.suffix == ".json"}
"""

# A fresh start (rank 0, spec settings argv[2]) into a disk with no room left: run_peer
# itself, then `swarm peer` as `swarm run` starts one (SWARM_PARENT_PID set), whose exit
# code and stderr it prints. The coordinator is never reached: the record comes first.
FRESH = START + """
    sets = json.loads(sys.argv[2])
    config = disk / "config.json"
    if os.environ.get("PHASE") != "read-only":   # the disk is still writable
        out.mkdir(parents=True)
        save_resolved(load_spec(None, sets), config)
    if os.environ.get("PHASE") == "setup":   # a run used the folder before: its records stay
        (out / "run.json").write_text(json.dumps({"run": "0123456789abcdef", "continues": []}))
        (out / "resumed.json").write_text(json.dumps({"continues": "/elsewhere/peer0"}))
        raise SystemExit(0)
    if os.environ.get("PHASE") != "read-only":
        fill(disk)
    before = files()
    got = call(runner.run_peer, load_spec(None, sets), 0, "tcp://127.0.0.1:9", run, tensorboard=False,
               join_timeout=1)
    from swarm.cli import main
    err = io.StringIO()
    os.environ["SWARM_PARENT_PID"] = str(os.getpid())
    with contextlib.redirect_stderr(err):
        rc = call(main, ["peer", "--spec", str(config), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9",
                         "--run-dir", str(run)])
    print(json.dumps({"returned": got, "cli": rc, "stderr": err.getvalue(), "unchanged": files() == before,
                      "left": sorted(p.name for p in out.iterdir())}))
"""


def _fresh(tmp_path: Path, read_only: bool = False) -> dict:
    sets = json.dumps(ONE + ["budget.env_steps=100"])
    if read_only:
        return on_small_disk(tmp_path, "4m", FRESH, sets, env={"PHASE": "read-only"},
                             read_only_after={"PHASE": "setup"})
    return on_small_disk(tmp_path, "4m", FRESH, sets)


@pytest.mark.parametrize("read_only", [False, True], ids=["full", "read-only"])
def test_a_fresh_start_that_cannot_record_its_run_is_a_config_error_that_swarm_run_does_not_restart(
        tmp_path, read_only):
    """The old runner raised the OSError of run.json's write out of run_peer: `swarm peer`
    died with a traceback (exit 1), and `swarm run` restarted it, up to 20 times."""
    from swarm.cli import CONFIG_ERROR_NOTE
    from swarm.experiment.launch import _lasting_error

    got = _fresh(tmp_path, read_only)
    cause = "Read-only file system" if read_only else "No space left on device"
    r = got["returned"]
    assert r.get("raised") == "ConfigError", r
    path = tmp_path / "disk" / "run" / "peer0" / "run.json"
    assert r["message"].startswith("run folder ") and f"cannot write {path} ({cause}); make room" in r["message"], r
    # swarm peer: one line that says so, exit code 2, and the note that ends swarm run's restarts
    assert got["cli"] == 2 and "Traceback" not in got["stderr"], got["stderr"]
    assert f"swarm: error: {r['message']}" in got["stderr"] and CONFIG_ERROR_NOTE in got["stderr"], got["stderr"]
    log = tmp_path / "peer0.log"
    log.write_text(got["stderr"])
    assert _lasting_error(log)
    # the folder's records are as they were (on the full disk: none), and no temporary file is left
    assert got["unchanged"] and not [n for n in got["left"] if n.endswith(".tmp")], got["left"]
    if read_only:
        assert {"run.json", "resumed.json"} <= set(got["left"]), got["left"]


# A peer (rank 0 of the coordinator argv[2], spec settings argv[4]) resumed from OLD
# (argv[3], on the ordinary disk) into the disk argv[1]. argv[5] says when its disk has no
# more room: "start", before it starts; "restart", once it has started, been killed before
# its first checkpoint there (no final one, no checkpoint.pt) and is started again as the
# launcher restarts it, with --resume-from OLD; "limit", the same but with a file size
# limit (RLIMIT_FSIZE) of 16 KiB instead of a full disk; "own", the same for a fresh run
# (not resumed), started again with --resume-from its own run folder.
RESUMED = START + """
    import resource, signal
    coordinator, old, sets, how = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
    spec = load_spec(None, sets)

    def peer(resume_from):
        return call(runner.run_peer, spec, 0, coordinator, run, tensorboard=False, join_timeout=20,
                    resume_from=resume_from)

    first = None
    if how == "start":
        out.mkdir(parents=True)
    else:
        close = runner.Checkpointer.close
        runner.Checkpointer.close = lambda self: None
        first = peer(None if how == "own" else old)
        runner.Checkpointer.close = close
        (out / "checkpoint.pt").unlink()
    before = files()
    if how == "limit":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails, not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    else:
        fill(disk)
    got = peer(run if how == "own" else old)
    print(json.dumps({"first": first, "returned": got, "unchanged": files() == before, "before": before,
                      "left": sorted(p.name for p in out.iterdir())}))
"""

SETS = ONE + ["budget.env_steps=260", "checkpoint.incremental_every_steps=1000"]


def _old_run(coordinator: str, tmp_path: Path) -> Path:
    """OLD: a run of 200 env steps with a best evaluation (best.pt, 64 KiB), on the ordinary disk."""
    import torch

    old = tmp_path / "old"
    run_peer(load_spec(None, ONE + ["budget.env_steps=200"]), 0, coordinator, old, tensorboard=False,
             join_timeout=10)
    torch.save({"eval_return": 50.0, "env_steps": 100, "pad": torch.zeros(1 << 14)}, old / "peer0" / "best.pt")
    return old


def _on_disk(coordinator: str, tmp_path: Path, old: Path, how: str) -> dict:
    return on_small_disk(tmp_path, "8m", RESUMED, coordinator, str(old), json.dumps(SETS), how)


def test_a_resume_into_a_full_disk_is_a_config_error_and_says_its_summary_is_not_on_disk(coordinator, tmp_path):
    """The old runner raised the OSError of run.json's write once the checkpoint had loaded.
    With no summary.json in the folder it then writes one that says why it ended, which
    does not fit either: its log line says that this process's figures are on no disk (it
    said that further failures would be counted in summary.json, the file that failed)."""
    got = _on_disk(coordinator, tmp_path, _old_run(coordinator, tmp_path), "start")
    r = got["returned"]
    assert r.get("raised") == "ConfigError", r
    assert f"cannot write {tmp_path / 'disk' / 'run' / 'peer0' / 'run.json'} (No space left on device)" \
        in r["message"], r
    assert got["unchanged"] and got["left"] == [], got["left"]
    line = next(ln for ln in got["log"].splitlines() if "cannot write summary.json (" in ln)
    assert line.endswith("none is left, and this process's figures are not on disk"), line
    assert "only counted" not in line


@pytest.mark.parametrize("how, file, cause", [
    ("restart", "resumed.json", "No space left on device"),   # its record of the checkpoint it restarts from
    ("limit", "best.pt", "File too large"),                   # the copy of OLD's best evaluation
    ("own", "metrics.csv", "No space left on device"),        # its CSV rows past the step it starts again from
])
def test_a_restart_that_cannot_write_its_folder_before_it_trains_is_a_config_error(coordinator, tmp_path, how,
                                                                                    file, cause):
    """A peer restarted (as restart_dead does) onto a disk that is full, or under a file size
    limit: the first file it cannot write before it trains is a ConfigError that names it
    (swarm run does not restart it again: it would meet the same); the old runner raised
    the OSError, so swarm run restarted it, 20 times. Its records stay as they were."""
    old = _old_run(coordinator, tmp_path)
    got = _on_disk(coordinator, tmp_path, old, how)
    assert got["first"]["reason"] == "budget", got["first"]
    r = got["returned"]
    assert r.get("raised") == "ConfigError", r
    assert f"cannot write {tmp_path / 'disk' / 'run' / 'peer0' / file} ({cause})" in r["message"], r
    assert got["unchanged"] and {"run.json", "metrics.csv"} <= set(got["left"]), (got["before"], got["left"])
    if how != "own":
        assert json.loads(got["before"]["resumed.json"])["continues"] == str((old / "peer0").resolve())


def _peer(addr: str, run_dir: Path, steps: int, **kw) -> dict:
    spec = load_spec(None, ONE + [f"budget.env_steps={steps}"])
    return run_peer(spec, 0, addr, run_dir, tensorboard=False, join_timeout=10, **kw)


def test_a_new_run_resumed_from_the_same_checkpoint_into_a_reused_folder_is_told_apart(coordinator, tmp_path):
    """`--resume OLD --run-dir X` twice, OLD unchanged: the second goes on with the first's
    run (as the same command run again after a crash does), from X's newer checkpoint.
    Told that it is a new run (run_peer's new_run), it starts one from OLD's checkpoint:
    a run id of its own, X's CSV files and best.pt not the first run's."""
    import csv

    import torch

    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 200)
    was = latest(old / "peer0" / "ckpt")
    _peer(coordinator, x, 330, resume_from=old)
    run1 = json.loads((x / "peer0" / "run.json").read_text())
    torch.save({"eval_return": 400.0, "env_steps": 300, **run1}, x / "peer0" / "best.pt")   # the first run's best

    newer = latest(x / "peer0" / "ckpt")
    again = _peer(coordinator, x, 360, resume_from=old)              # the same command again
    assert again["resumed_from"] == str(newer) != str(was), again
    assert json.loads((x / "peer0" / "run.json").read_text()) == run1
    assert again["best_eval_return"] == 400.0, again

    new = _peer(coordinator, x, 260, resume_from=old, new_run=True)
    assert new["resumed_from"] == str(was) and new["env_steps"] == 260, new
    run2 = json.loads((x / "peer0" / "run.json").read_text())
    assert run2["run"] != run1["run"] and run2["continues"] == run1["continues"], (run1, run2)
    resumed = json.loads((x / "peer0" / "resumed.json").read_text())
    assert resumed["run"] == run2["run"] and resumed["checkpoint"] == str(was), resumed
    assert "best_eval_return" not in new, new   # the first run's best.pt does not count; OLD has none
    steps = [int(r["env_steps"]) for r in csv.DictReader(open(x / "peer0" / "metrics.csv"))]
    assert steps and all(200 < s <= 260 for s in steps), steps   # only the new run's rows
    # and a restart of the new run goes on with it, not with the first run's checkpoints in X
    later = _peer(coordinator, x, 300, resume_from=x)
    assert later["resumed_from"] == str(x / "peer0" / "ckpt" / new["last_checkpoint"]), later
    assert json.loads((x / "peer0" / "run.json").read_text()) == run2


def test_new_run_into_its_own_folder_is_refused_before_anything_changes(coordinator, tmp_path):
    """A resume from the run folder it writes into, or a replacement of a member, goes on
    with the run there: new_run with it is a ConfigError that changes no file."""
    x = tmp_path / "x"
    _peer(coordinator, x, 120)

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(x)): p.read_bytes() for p in sorted(x.rglob("*")) if p.is_file()}

    before = files()
    with pytest.raises(ConfigError, match=r"^new_run \(--new-run\): peer0 resumes from its own run folder, so it goes on"):
        _peer(coordinator, x, 200, resume_from=x, new_run=True)
    assert files() == before


def test_new_run_on_the_command_line_goes_with_resume(tmp_path):
    """`swarm peer --new-run` without `--resume` is refused, naming both flags (a start
    without a resume is a new run anyway), before anything is written."""
    import subprocess
    import sys

    from swarmtest import ROOT
    spec = save_resolved(load_spec(None, ["peers=1", "budget.env_steps=300"]), tmp_path / "spec")
    res = subprocess.run([sys.executable, "-m", "swarm.cli", "peer", "--spec", str(spec), "--rank", "0",
                          "--coordinator", "tcp://127.0.0.1:9", "--run-dir", str(tmp_path / "x"), "--new-run"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 2 and "--new-run goes with --resume" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "x").exists()
