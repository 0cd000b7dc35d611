"""A run resumed from an old run folder: where a restarted peer resumes from, and which best.pt counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from swarmtest import ROOT, freeze, wait_for
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.errors import ConfigError, PeerTimeout
from swarm.experiment import load_spec, save_resolved
from swarm.experiment.checkpoint import Checkpointer, latest
from swarm.experiment.runner import run_peer

ONE = ["peers=1", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=0", "gossip.codec=identity",
       "gossip.step_size=1.0", "checkpoint.full_every_s=0", "checkpoint.incremental_every_steps=50"]


def _peer(addr: str, run_dir: Path, steps: int, resume_from: Path | None = None, sets: tuple[str, ...] = ()) -> dict:
    spec = load_spec(None, ONE + [f"budget.env_steps={steps}", *sets])
    return run_peer(spec, 0, addr, run_dir, tensorboard=False, join_timeout=10, resume_from=resume_from)


def _killed(addr: str, run_dir: Path, steps: int, monkeypatch, resume_from: Path | None = None,
            sets: tuple[str, ...] = ()) -> dict:
    """A peer SIGKILLed at ``steps``: only its periodic checkpoints, no final one, no checkpoint.pt."""
    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "close", lambda self: None)
        s = _peer(addr, run_dir, steps, resume_from, sets)
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


def test_the_best_pt_a_resume_copies_still_counts_after_a_restart_of_the_new_run(tmp_path):
    """The copy of the old run's best.pt in the new folder carried the old run's id, so a
    restart of the new run into its own folder took it for another run's: the next
    evaluation, however poor, would replace the old run's best policy. The copy is the
    new run's best so far, and is stamped so."""
    import torch

    from swarm.experiment.checkpoint import Lineage
    from swarm.experiment.runner import _carry_best

    old, new = tmp_path / "old" / "peer0", tmp_path / "new" / "peer0"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    before = Lineage.new()
    torch.save({"eval_return": 500.0, "env_steps": 9000, **before.record()}, old / "best.pt")
    run = Lineage.new(((str(old.resolve()), before.id),))
    first: dict = {}
    _carry_best(old, new, first, continued=None, run=run)            # the resume from old
    assert first == {"best_eval_return": 500.0, "best_eval_at": 9000}
    assert torch.load(new / "best.pt", weights_only=True)["run"] == run.id
    again: dict = {}
    _carry_best(new, new, again, continued=new, run=run)             # swarm run restarts it into new
    assert again == {"best_eval_return": 500.0, "best_eval_at": 9000}


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


def _two_peers(addr: str, run_dir: Path, sets: list[str]) -> list[dict]:
    """A finished run of two peers in this process (threads): its config.json as `swarm run`
    writes it, and each peer's folder with its checkpoints. Their summaries."""
    spec = load_spec(None, sets)
    save_resolved(spec, run_dir)
    stop = threading.Event()
    done: dict[int, dict | BaseException] = {}

    def peer(rank: int) -> None:
        try:
            done[rank] = run_peer(spec, rank, addr, run_dir, stop=stop, tensorboard=False, join_timeout=30)
        except BaseException as e:
            done[rank] = e

    threads = [threading.Thread(target=peer, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    stop.set()   # after a failure or a hang, the other peer stops too
    for t in threads:
        t.join(30)
    errors = [e for e in done.values() if isinstance(e, BaseException)]
    if errors:
        raise errors[0]
    assert len(done) == 2 and not any(t.is_alive() for t in threads), done
    return [done[r] for r in range(2)]


def test_swarm_run_resumed_restarts_a_peer_whose_new_checkpoints_are_damaged_from_the_old_runs(coordinator,
                                                                                               tmp_path):
    """End to end: `swarm run --resume OLD` with restart_dead; peer1 is SIGKILLed once it has a
    checkpoint in the new folder, which is then found torn: the restarted process resumes
    from OLD's checkpoint (the launcher gives it --resume-from NEW), not from step 0. (OLD is
    a finished run of two peers in this process: only its folder counts.)"""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))

    def swarm_run(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", *args], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def runs() -> list[Path]:
        return sorted((tmp_path / "runs").glob("cartpole-ring-*"))

    tiny = ["peers=2", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0",
            "buffer.capacity=2000"]
    old = tmp_path / "old"
    assert all(s["reason"] == "budget" for s in _two_peers(coordinator, old, tiny))
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
        freeze(pid)          # no checkpoint after the damage
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


def test_a_restart_follows_the_chain_of_resumed_runs_past_a_damaged_middle_one(coordinator, tmp_path, monkeypatch):
    """a, then b resumed from a, then c resumed from b: a restart into c whose checkpoints there
    and in b all fail to load resumes from a's, the run that b continued, not an error."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _peer(coordinator, a, 200)
    was = latest(a / "peer0" / "ckpt")
    _killed(coordinator, b, 330, monkeypatch, resume_from=a)
    _killed(coordinator, c, 460, monkeypatch, resume_from=b)
    for d in (b, c):
        for p in (d / "peer0" / "ckpt").iterdir():
            _tear(p / "state.pt")
    s = _peer(coordinator, c, 500, resume_from=c)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 500, s


def test_a_restart_of_a_fresh_run_never_resumes_another_runs_checkpoints_left_in_the_folder(coordinator, tmp_path,
                                                                                             monkeypatch):
    """A fresh run in a folder that another run used (its ckpt/ and best.pt still there), killed
    before its own first checkpoint and restarted into the folder (--resume-from X, as the
    launcher does when X has a checkpoint), starts again from step 0: the other run's
    checkpoints and best evaluation are not its own."""
    import torch

    x = tmp_path / "x"
    _peer(coordinator, x, 200)                                     # another run: full-000001 at 200
    torch.save({"eval_return": 400.0, "env_steps": 150}, x / "peer0" / "best.pt")
    theirs = latest(x / "peer0" / "ckpt")
    # a fresh run, killed before its first checkpoint
    _killed(coordinator, x, 100, monkeypatch, sets=("checkpoint.incremental_every_steps=1000",))
    assert latest(x / "peer0" / "ckpt") == theirs
    s = _peer(coordinator, x, 100, resume_from=x)
    assert "resumed_from" not in s and s["env_steps"] == 100, s
    assert "best_eval_return" not in s, s
    assert any("another run" in w for w in s["resume_skipped"]), s


def test_a_resume_into_a_folder_with_newer_checkpoints_of_the_same_run_goes_on_from_them(coordinator, tmp_path,
                                                                                          monkeypatch):
    """swarm peer --resume OLD --run-dir X run again after it was killed (as the launcher restarts
    one, or a person reruns the same command): X's newer checkpoints of that run are where it
    goes on from, not OLD's again, and X's files are continued."""
    import csv

    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 200)
    _killed(coordinator, x, 330, monkeypatch, resume_from=old)
    newer = latest(x / "peer0" / "ckpt")
    at = json.loads((newer / "manifest.json").read_text())["counters"]["env_steps"]
    assert at > 200
    s = _peer(coordinator, x, 400, resume_from=old)
    assert s["resumed_from"] == str(newer) and s["env_steps"] == 400, s
    rows = list(csv.DictReader(open(x / "peer0" / "metrics.csv")))
    episodes = [int(r["episode"]) for r in rows]
    assert min(int(r["env_steps"]) for r in rows) <= at and episodes == sorted(set(episodes)), episodes
    assert json.loads((x / "peer0" / "resumed.json").read_text())["continues"] == str((old / "peer0").resolve())


def test_a_second_run_resumed_into_a_reused_folder_is_not_taken_for_the_first(coordinator, tmp_path, monkeypatch):
    """Run 1 resumed OLD's run into X and left checkpoints there; OLD was then used by another
    run, and run 2 resumed that one into X too. Run 2, killed before its first checkpoint and
    restarted into X, resumes from OLD's run it continues, not from run 1's checkpoints in X:
    the same folders, but another run."""
    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 200)
    _killed(coordinator, x, 330, monkeypatch, resume_from=old)     # run 1: checkpoints in X
    _peer(coordinator, old, 120)                                   # OLD used again by another run
    now = latest(old / "peer0" / "ckpt")
    _killed(coordinator, x, 150, monkeypatch, resume_from=old)     # run 2: killed before its first
    s = _peer(coordinator, x, 200, resume_from=x)
    assert s["resumed_from"] == str(now) and s["env_steps"] == 200, s


def test_a_resume_that_fails_leaves_the_folder_it_writes_into_as_it_was(coordinator, tmp_path):
    """swarm peer --resume OLD --run-dir X with nothing in OLD that loads is an error that
    changes none of X's files: not its checkpoint.pt, not the record of the run X holds,
    which a restart into X goes on with, not the summary.json of the run that wrote it."""
    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, x, 120)
    (old / "peer0").mkdir(parents=True)
    (old / "peer0" / "checkpoint.pt").write_bytes(b"torn")

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(x)): p.read_bytes() for p in sorted(x.rglob("*")) if p.is_file()}

    before = files()
    with pytest.raises(ConfigError, match="no checkpoint of peer0 in .*old/peer0 can be read"):
        _peer(coordinator, x, 200, resume_from=old)
    assert files() == before
    was = latest(x / "peer0" / "ckpt")
    s = _peer(coordinator, x, 160, resume_from=x)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 160, s


def test_checkpoints_from_before_run_ids_still_resume(coordinator, tmp_path, monkeypatch):
    """A folder written before run ids (no run.json, manifests and checkpoint.pt without a run)
    is known by its folder, as before: a restart into it resumes from its checkpoints, a run
    resumed from it continues it, and a restart of that run falls back to it."""
    import torch

    legacy, new = tmp_path / "legacy", tmp_path / "new"
    _peer(coordinator, legacy, 200)
    (legacy / "peer0" / "run.json").unlink()
    for p in (legacy / "peer0" / "ckpt").iterdir():
        m = json.loads((p / "manifest.json").read_text())
        del m["run"], m["continues"]
        (p / "manifest.json").write_text(json.dumps(m))
    ck = torch.load(legacy / "peer0" / "checkpoint.pt", weights_only=False)
    del ck["run"], ck["continues"]
    torch.save(ck, legacy / "peer0" / "checkpoint.pt")
    was = latest(legacy / "peer0" / "ckpt")

    s = _peer(coordinator, new, 330, resume_from=legacy)
    assert s["resumed_from"] == str(was), s
    rec = json.loads((new / "peer0" / "run.json").read_text())
    assert rec["continues"] == [[str((legacy / "peer0").resolve()), None]], rec
    for p in (new / "peer0" / "ckpt").iterdir():
        _tear(p / "state.pt")
    _tear(new / "peer0" / "checkpoint.pt")
    s = _peer(coordinator, new, 360, resume_from=new)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 360, s

    was = latest(legacy / "peer0" / "ckpt")   # unchanged: the legacy folder was only read
    s = _peer(coordinator, legacy, 250, resume_from=legacy)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 250, s
    assert not (legacy / "peer0" / "run.json").exists()


def test_a_resume_that_fails_once_the_agent_is_built_keeps_the_folders_summary_and_ids(coordinator, tmp_path):
    """swarm peer --resume OLD --run-dir X whose spec's network does not fit OLD's checkpoint
    fails after it built its agent over OLD's replay buffer: X's summary.json and ids.json
    stay those of the run that wrote them (not an error summary of a process that trained
    nothing, nor the ids of OLD's buffer)."""
    old, x = tmp_path / "old", tmp_path / "x"
    rep = ("buffer.sharing=false", "buffer.replicas=1")   # ids.json, with no neighbour to replicate to
    _peer(coordinator, old, 200, sets=rep)
    _peer(coordinator, x, 120, sets=rep)
    peer = x / "peer0"
    before = {n: (peer / n).read_bytes() for n in ("summary.json", "ids.json", "run.json")}
    with pytest.raises(ConfigError, match="parameters, the agent has"):
        _peer(coordinator, x, 300, resume_from=old, sets=(*rep, "dqn.hidden=[16]"))
    assert {n: (peer / n).read_bytes() for n in before} == before
    # and into its own folder: the same
    with pytest.raises(ConfigError, match="parameters, the agent has"):
        _peer(coordinator, x, 300, resume_from=x, sets=(*rep, "dqn.hidden=[16]"))
    assert {n: (peer / n).read_bytes() for n in before} == before


def test_a_fresh_start_in_a_reused_folder_drops_the_record_of_the_resume_there_with_its_run(coordinator, tmp_path):
    """A fresh start into a folder where another run was resumed replaces run.json at once;
    the resumed.json of that other run goes with it, also when the fresh start fails before
    it trains (its join timed out), so that the folder never records a new run beside
    another run's resume."""
    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 120)
    _peer(coordinator, x, 160, resume_from=old)
    assert json.loads((x / "peer0" / "resumed.json").read_text())["continues"] == str((old / "peer0").resolve())
    two = load_spec(None, ONE + ["budget.env_steps=200", "peers=2"])   # rank 1 never comes
    with pytest.raises(PeerTimeout, match="1 of the spec's 2 peers joined"):
        run_peer(two, 0, coordinator, x, tensorboard=False, join_timeout=1)
    assert json.loads((x / "peer0" / "run.json").read_text())["continues"] == []
    assert not (x / "peer0" / "resumed.json").exists()


def test_a_checkpoint_pt_holding_nan_is_a_config_error_that_swarm_run_does_not_restart(procs, coordinator, tmp_path):
    """swarm peer (as swarm run starts one) resumed from a folder whose only checkpoint,
    checkpoint.pt, holds NaN: every start would fail the same way, so it is a ConfigError
    naming the file, with the line that tells swarm run not to start it again."""
    import shutil

    import torch

    from swarm.cli import CONFIG_ERROR_NOTE
    from swarm.experiment import save_resolved
    from swarm.experiment.launch import _lasting_error

    old = tmp_path / "old"
    _peer(coordinator, old, 120)
    shutil.rmtree(old / "peer0" / "ckpt")
    ck_path = old / "peer0" / "checkpoint.pt"
    ck = torch.load(ck_path, weights_only=False)
    key = next(iter(ck["agent"]["q"]))
    ck["agent"]["q"][key].view(-1)[0] = float("nan")
    torch.save(ck, ck_path)
    config = save_resolved(load_spec(None, ONE + ["budget.env_steps=200"]), tmp_path / "config.json")
    p = procs.start("peer", "--spec", str(config), "--rank", "0", "--coordinator", coordinator,
                    "--run-dir", str(tmp_path / "new"), "--resume-from", str(old), name="peer",
                    env={"SWARM_PARENT_PID": str(os.getpid())})
    assert p.wait(timeout=120) == 2, procs.log(p)
    log = procs.log(p)
    assert f"{ck_path}: DQN checkpoint q.{key} has NaN or infinite entries" in log, log
    assert CONFIG_ERROR_NOTE in log and _lasting_error(Path(p.log_path)), log


def test_a_restart_whose_newest_checkpoint_holds_nan_goes_back_to_the_run_it_continues(coordinator, tmp_path,
                                                                                         monkeypatch):
    """Run NEW resumed from OLD; training diverged just before NEW's final checkpoint (its
    target net NaN), the only one left in NEW's ckpt/, and no checkpoint.pt. A restart into
    NEW passes over it for OLD's checkpoint, as it does for a damaged one (it raised the
    NaN checkpoint's ConfigError without looking further)."""
    old, new = tmp_path / "old", tmp_path / "new"
    _peer(coordinator, old, 200)
    was = latest(old / "peer0" / "ckpt")
    real_close = Checkpointer.close

    def diverged(self):
        self.agent.target_flat[3] = float("nan")
        return real_close(self)

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "close", diverged)
        _peer(coordinator, new, 230, resume_from=old)   # its first periodic checkpoint would be at 250
    (new / "peer0" / "checkpoint.pt").unlink()
    ckpt = new / "peer0" / "ckpt"
    assert [p.name for p in ckpt.iterdir() if not p.name.startswith(".")] == [latest(ckpt).name]
    r = _peer(coordinator, new, 400, resume_from=new)
    assert r["resumed_from"] == str(was), r
    assert any("NaN or infinite" in s for s in r["resume_skipped"]), r["resume_skipped"]
    assert r["env_steps"] == 400


def test_a_restart_whose_ckpt_folder_cannot_be_listed_is_an_error_not_a_resume_from_older(coordinator, tmp_path,
                                                                                           monkeypatch):
    """Only a checkpoint holding NaN is passed over for the runs it continues: a ckpt/
    that cannot be listed stays the error it is (resuming from OLD would drop NEW's
    newer checkpoints in silence). Simulated: as root, chmod would not stop the listing."""
    import swarm.experiment.checkpoint as ckmod

    old, new = tmp_path / "old", tmp_path / "new"
    _peer(coordinator, old, 200)
    _killed(coordinator, new, 330, monkeypatch, resume_from=old)
    real = ckmod.committed

    def committed(root):
        if Path(root) == new / "peer0" / "ckpt":
            raise ConfigError(f"checkpoint folder {root} cannot be listed (Permission denied); "
                              "give this process read access to it")
        return real(root)

    monkeypatch.setattr(ckmod, "committed", committed)
    with pytest.raises(ConfigError, match="cannot be listed"):
        _peer(coordinator, new, 400, resume_from=new)
