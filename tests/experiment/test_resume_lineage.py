"""A run resumed from an old run folder: where a restarted peer resumes from, and which best.pt counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from swarmtest import ROOT, wait_for
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import Checkpointer, latest
from swarm.experiment.runner import run_peer

ONE = ["peers=1", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=0", "gossip.codec=identity",
       "gossip.step_size=1.0", "checkpoint.full_every_s=0", "checkpoint.incremental_every_steps=50"]


def _peer(addr: str, run_dir: Path, steps: int, resume_from: Path | None = None) -> dict:
    spec = load_spec(None, ONE + [f"budget.env_steps={steps}"])
    return run_peer(spec, 0, addr, run_dir, tensorboard=False, join_timeout=10, resume_from=resume_from)


def _killed(addr: str, run_dir: Path, steps: int, monkeypatch, resume_from: Path | None = None) -> dict:
    """A peer SIGKILLed at ``steps``: only its periodic checkpoints, no final one, no checkpoint.pt."""
    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "close", lambda self: None)
        s = _peer(addr, run_dir, steps, resume_from)
    (run_dir / "peer0" / "checkpoint.pt").unlink()
    return s


def _tear(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def test_a_restart_whose_checkpoints_here_are_all_damaged_goes_back_to_the_old_run(coordinator, tmp_path,
                                                                                     monkeypatch, caplog):
    """swarm run --resume OLD: a peer restarted into the new folder (--resume-from NEW, as
    restart_dead does once it has a checkpoint there) none of whose checkpoints there loads
    resumes from the old run's checkpoint, not from step 0; with none of those loading
    either it is an error (the old run's progress is not dropped in silence)."""
    old, new = tmp_path / "old", tmp_path / "new"
    _peer(coordinator, old, 200)                                   # ends with a full checkpoint at 200
    was = latest(old / "peer0" / "ckpt")
    first = _killed(coordinator, new, 330, monkeypatch, resume_from=old)
    assert first["resumed_from"] == str(was)
    ckpt = new / "peer0" / "ckpt"
    names = sorted(p.name for p in ckpt.iterdir())
    assert len(names) > 1 and all("-inc-" in n for n in names[1:]), names   # a full one and its increments
    _tear(ckpt / names[0] / "state.pt")                            # its increments need it too

    caplog.set_level("WARNING", logger="swarm.experiment")
    s = _peer(coordinator, new, 400, resume_from=new)
    assert s["resumed_from"] == str(was), s
    assert s["env_steps"] == 400 and len(s["resume_skipped"]) == len(names), s
    assert json.loads((new / "peer0" / "resumed.json").read_text())["env_steps"] == 200
    assert "resuming from the run it continues" in caplog.text

    # the record of the run it continues survives that restart: a second one falls back the same way
    assert json.loads((new / "peer0" / "resumed.json").read_text())["continues"] == str((old / "peer0").resolve())
    for p in ckpt.iterdir():
        _tear(p / "state.pt")
    _tear(new / "peer0" / "checkpoint.pt")   # the last resort in its folder, before the old run's
    s = _peer(coordinator, new, 450, resume_from=new)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 450, s

    # the old run's checkpoints unreadable too: an error naming both folders, not step 0
    for p in ckpt.iterdir():
        _tear(p / "state.pt")
    _tear(new / "peer0" / "checkpoint.pt")
    _tear(was / "state.pt")
    _tear(old / "peer0" / "checkpoint.pt")
    with pytest.raises(ConfigError, match="^resume: no checkpoint of peer0 in .*new/peer0 nor in .*old/peer0") as e:
        _peer(coordinator, new, 500, resume_from=new)
    assert f"checkpoint {was} cannot be read" in str(e.value) and str(old / "peer0" / "checkpoint.pt") in str(e.value)


def test_a_restart_in_a_run_that_continues_none_still_starts_from_step_0(coordinator, tmp_path, monkeypatch):
    """A fresh run's peer restarted into its folder with no checkpoint there that loads starts
    again from step 0, also when the folder held a record of another run resumed there before."""
    stale, run = tmp_path / "stale", tmp_path / "run"
    _peer(coordinator, stale, 120)
    (run / "peer0").mkdir(parents=True)      # a folder used before by a run that resumed from `stale`
    (run / "peer0" / "resumed.json").write_text(json.dumps({"continues": str((stale / "peer0").resolve())}))
    _killed(coordinator, run, 160, monkeypatch)   # a fresh start: it continues no other run
    ckpt = run / "peer0" / "ckpt"
    for p in ckpt.iterdir():
        _tear(p / "state.pt")
    s = _peer(coordinator, run, 200, resume_from=run)
    assert "resumed_from" not in s and s["env_steps"] == 200 and s["resume_skipped"], s


def test_a_best_pt_that_another_run_left_in_the_folder_does_not_count(coordinator, tmp_path):
    """swarm peer --resume OLD --run-dir X: a better best.pt that an unrelated run left in X
    neither counts as this peer's best nor survives: the old run's best.pt replaces it."""
    import torch

    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 120)
    torch.save({"eval_return": 50.0, "env_steps": 100}, old / "peer0" / "best.pt")
    (x / "peer0").mkdir(parents=True)
    torch.save({"eval_return": 400.0, "env_steps": 9000}, x / "peer0" / "best.pt")   # another run's
    s = _peer(coordinator, x, 160, resume_from=old)
    assert (s["best_eval_return"], s["best_eval_at"]) == (50.0, 100), s
    assert torch.load(x / "peer0" / "best.pt", weights_only=True)["eval_return"] == 50.0
    assert json.loads((x / "peer0" / "resumed.json").read_text())["continues"] == str((old / "peer0").resolve())


def test_carry_best_counts_a_best_pt_here_only_from_the_run_it_continues(tmp_path):
    """_carry_best: a best.pt already in the new folder counts (when better) only when that
    folder continues the same old run; any other is replaced by the old run's."""
    import torch

    from swarm.experiment.runner import _carry_best

    old, new, other = tmp_path / "old", tmp_path / "new", tmp_path / "other"
    for d in (old, new, other):
        d.mkdir()
    torch.save({"eval_return": 50.0, "env_steps": 300}, old / "best.pt")
    for continued, kept in [(old, (120.0, 700)), (other, (50.0, 300)), (None, (50.0, 300))]:
        torch.save({"eval_return": 120.0, "env_steps": 700}, new / "best.pt")
        summary: dict = {}
        _carry_best(old, new, summary, continued=continued)
        assert (summary["best_eval_return"], summary["best_eval_at"]) == kept, continued
        best = torch.load(new / "best.pt", weights_only=True)
        assert (best["eval_return"], best["env_steps"]) == kept, continued
    # another run's best.pt, and the old run has none: it does not count (the next evaluation replaces it)
    (old / "best.pt").unlink()
    torch.save({"eval_return": 120.0, "env_steps": 700}, new / "best.pt")
    summary = {}
    _carry_best(old, new, summary, continued=other)
    assert summary == {}


def test_continued_folder_reads_the_record_in_resumed_json(tmp_path):
    """The old run a folder continues is what its resumed.json records; a torn record is none."""
    from swarm.experiment.checkpoint import continued_folder

    d = tmp_path / "peer0"
    d.mkdir()
    assert continued_folder(d) is None
    (d / "resumed.json").write_text(json.dumps({"continues": "/somewhere/peer0", "env_steps": 3}))
    assert continued_folder(d) == Path("/somewhere/peer0")
    (d / "resumed.json").write_text('{"continues": "/some')
    assert continued_folder(d) is None


def test_swarm_run_resumed_restarts_a_peer_whose_new_checkpoints_are_damaged_from_the_old_runs(tmp_path):
    """End to end: `swarm run --resume OLD` with restart_dead; peer1 is SIGKILLed once it has a
    checkpoint in the new folder, which is then found torn: the restarted process resumes
    from OLD's checkpoint (the launcher gives it --resume-from NEW), not from step 0."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))

    def swarm_run(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", *args], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def runs() -> list[Path]:
        return sorted((tmp_path / "runs").glob("cartpole-ring-*"))

    tiny = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0",
            "buffer.capacity=2000"]
    p = swarm_run(*[a for s in tiny for a in ("--set", s)])
    try:
        out, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, out
    (old,) = runs()
    was = latest(old / "peer1" / "ckpt")
    sets = ["budget.env_steps=100000", "restart_dead=true", "checkpoint.full_every_s=0",
            "checkpoint.full_every_steps=200"]
    q = swarm_run("--resume", str(old), *[a for s in sets for a in ("--set", s)])
    try:
        def new_checkpoint() -> Path | None:
            new = [d for d in runs() if d != old]
            return new[0] if new and latest(new[0] / "peer1" / "ckpt") is not None else None

        new = wait_for(new_checkpoint, timeout=90, what="peer1's first checkpoint in the new folder")
        pid = json.loads((new / "pids.json").read_text())["children"]["peer1"]
        os.kill(pid, signal.SIGSTOP)          # no checkpoint after the damage
        for c in (new / "peer1" / "ckpt").iterdir():
            if (c / "state.pt").is_file():
                _tear(c / "state.pt")
        os.kill(pid, signal.SIGKILL)

        def decided() -> str | None:
            log = (new / "logs" / "peer1.log").read_text()
            return next((w for w in ("resuming from the run it continues", "starting again from step 0") if w in log),
                        None)

        assert wait_for(decided, timeout=90, what="peer1 restarted") == "resuming from the run it continues"
    finally:
        if q.poll() is None:
            q.send_signal(signal.SIGINT)      # it ends its children by their handles
            try:
                q.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                q.kill()
                q.communicate()
    s = json.loads((new / "peer1" / "summary.json").read_text())
    assert s["resumed_from"] == str(was) and s["resume_skipped"], s
    assert json.loads((new / "peer1" / "resumed.json").read_text())["continues"] == str((old / "peer1").resolve())
