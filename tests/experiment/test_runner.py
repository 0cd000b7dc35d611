"""The peer-side runner in this process (no launcher): budget, stop, resume."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path

import pytest
from swarmtest import free_port, status, wait_for

from swarm.errors import ConfigError, SwarmError
from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer

ONE = ["peers=1", "budget.env_steps=200", "dqn.learning_starts=50", "dqn.batch_size=16",
       "eval.every=0", "gossip.codec=identity", "gossip.step_size=1.0"]


@pytest.fixture
def coordinator(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coordinator")
    wait_for(lambda: status(addr, 0.5), timeout=15, what="coordinator")
    return addr


def test_budget_then_resume_continues_from_the_checkpoint(coordinator, tmp_path):
    spec = load_spec(None, ONE)
    first = run_peer(spec, 0, coordinator, tmp_path / "a", tensorboard=False, join_timeout=10)
    assert first["reason"] == "budget" and first["env_steps"] == 200

    more = load_spec(None, ONE + ["budget.env_steps=300"])
    second = run_peer(more, 0, coordinator, tmp_path / "b", tensorboard=False, join_timeout=10,
                      resume_from=tmp_path / "a")
    assert second["reason"] == "budget" and second["env_steps"] == 300
    # the final full checkpoint: agent, optimizer, buffer and counters
    assert second["resumed_from"].endswith("peer0/ckpt/full-000001")
    assert json.loads((tmp_path / "b" / "peer0" / "resumed.json").read_text())["env_steps"] == 200
    rows = list(csv.DictReader(open(tmp_path / "b" / "peer0" / "metrics.csv")))
    assert rows and all(200 < int(r["env_steps"]) <= 300 for r in rows)
    # alone in its ring: every round says so instead of pretending to average
    rounds = list(csv.DictReader(open(tmp_path / "b" / "peer0" / "rounds.csv")))
    assert len(rounds) == 100 // more.gossip.interval and all(int(r["participants"]) == 0 for r in rounds)


def test_stop_event_ends_after_the_current_step_and_writes_everything(coordinator, tmp_path):
    spec = load_spec(None, ONE + ["budget.env_steps=1000000"])
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    try:
        s = run_peer(spec, 0, coordinator, tmp_path, stop=stop, tensorboard=False, join_timeout=10)
    finally:
        timer.cancel()
    assert s["reason"] == "stopped" and 0 < s["env_steps"] < 1000000
    saved = json.loads((tmp_path / "peer0" / "summary.json").read_text())
    assert saved["env_steps"] == s["env_steps"]
    assert (tmp_path / "peer0" / "checkpoint.pt").stat().st_size > 0


def test_bad_rank_and_missing_checkpoint_are_clear_errors(coordinator, tmp_path):
    spec = load_spec(None, ONE)
    with pytest.raises(ConfigError, match="rank = 3"):
        run_peer(spec, 3, coordinator, tmp_path, tensorboard=False)
    assert not (tmp_path / "peer3").exists()
    with pytest.raises(ConfigError, match="has no checkpoint"):
        run_peer(spec, 0, coordinator, tmp_path / "c", tensorboard=False, join_timeout=10,
                 resume_from=tmp_path / "nothing-here")


def test_a_restart_from_another_run_keeps_a_better_best_written_here(tmp_path):
    """A peer of a `swarm run --resume` run that died before its first checkpoint there
    restarts from the old run's checkpoint: that run's best.pt replaces the one its dead
    predecessor wrote in the new folder only when it is better (or that one cannot be read)."""
    import torch

    from swarm.experiment.runner import _carry_best

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    torch.save({"eval_return": 50.0, "env_steps": 300}, old / "best.pt")
    for there, kept in [(120.0, (120.0, 700)), (30.0, (50.0, 300)), (None, (50.0, 300)), (b"torn", (50.0, 300))]:
        if isinstance(there, bytes):
            (new / "best.pt").write_bytes(there)
        elif there is None:
            (new / "best.pt").unlink(missing_ok=True)
        else:
            torch.save({"eval_return": there, "env_steps": 700}, new / "best.pt")
        summary: dict = {}
        _carry_best(old, new, summary, continued=old)   # the new folder continues the old run
        assert (summary["best_eval_return"], summary["best_eval_at"]) == kept, (there, summary)
        best = torch.load(new / "best.pt", weights_only=True)
        assert (best["eval_return"], best["env_steps"]) == kept, there
    # with no best.pt in the old run, the one written here counts
    (old / "best.pt").unlink()
    torch.save({"eval_return": 20.0, "env_steps": 800}, new / "best.pt")
    summary = {}
    _carry_best(old, new, summary, continued=old)
    assert (summary["best_eval_return"], summary["best_eval_at"]) == (20.0, 800)
    # a foreign file in its own folder (a restart into it) is skipped, not a crash
    (new / "best.pt").write_bytes(b"torn")
    summary = {}
    _carry_best(new, new, summary)
    assert summary == {}


def test_heartbeat_figures_include_codec_ratio_staleness_and_last_error(coordinator, tmp_path):
    # Two peers in this process on a ring with top-10% deltas: the coordinator's
    # status must show each peer's codec ratio (wire bytes / dense bytes) and staleness.
    spec = load_spec(None, ONE + ["peers=2", "budget.env_steps=1000000", "gossip.codec=topk:0.1",
                                  "gossip.step_size=0.2", "gossip.interval=20", "buffer.replicas=1"])
    stop = threading.Event()
    out: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda r=r: out.update({r: run_peer(
        spec, r, coordinator, tmp_path, stop=stop, tensorboard=False, join_timeout=15)})) for r in (0, 1)]
    for t in threads:
        t.start()
    try:
        def figures():
            rows = [m.get("stats") or {} for m in status(coordinator, 0.5)["members"]]
            ok = [s for s in rows if (s.get("rounds") or 0) >= 3 and s.get("codec_ratio") is not None]
            return ok if len(ok) == 2 else None
        rows = wait_for(figures, timeout=60, what="two peers reporting codec ratios")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    for s in rows:
        # top-10% sends values and compact indices: well under dense, above the values alone
        assert 0.1 <= s["codec_ratio"] < 0.5, s
        assert s["staleness"] >= 0 and isinstance(s["last_error"], str)
        # buffer.replicas = 1: how many local items no neighbour has acknowledged yet
        assert isinstance(s["under_replicated"], int) and s["under_replicated"] >= 0, s
    assert {out[0]["reason"], out[1]["reason"]} == {"stopped"}


@pytest.mark.parametrize("their_steps,own_steps,expected", [
    (240, 0, False),      # the first peer of a fresh run, ahead but not yet learning: same network
    (260, 0, True),       # a late joiner, or a restart before the first checkpoint
    (1505, 1500, False),  # within one gossip interval
    (1520, 1500, True),   # a restart from a checkpoint behind its neighbours
])
def test_bootstrap_only_from_a_member_that_has_learned(monkeypatch, their_steps, own_steps, expected):
    """A member ahead by more than the gossip interval but not past dqn.learning_starts
    still holds the run's initial network: a fresh run's peers start a little apart."""
    from swarm.experiment import runner

    monkeypatch.setattr(runner, "_others", lambda *a: [{"id": "peer1", "stats": {"env_steps": their_steps}}])
    assert runner._should_bootstrap(["tcp://127.0.0.1:9"], None, "peer0", own_steps, 10, fallback=False,
                                    learning_starts=250) is expected


def test_a_peer_resumed_into_its_folder_drops_the_rows_it_trains_again(coordinator, tmp_path):
    """The rows a dead process logged past its checkpoint (and a row torn by the kill)
    are dropped before the resumed peer logs those env steps again: once each."""
    spec = load_spec(None, ONE + ["eval.every=100", "eval.episodes=1"])
    run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)   # final checkpoint at 200
    peer = tmp_path / "peer0"
    before = {}
    for name in ("metrics.csv", "rounds.csv", "evals.csv"):
        before[name] = (peer / name).read_bytes()
        with open(peer / name, newline="") as f:
            last = list(csv.DictReader(f))[-1]
        # what a process killed after that checkpoint had logged: two rows past it, then half a row
        with open(peer / name, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(last))
            w.writerows([dict(last, env_steps=210), dict(last, env_steps=250)])
            f.write("1.5,26")

    more = load_spec(None, ONE + ["eval.every=100", "eval.episodes=1", "budget.env_steps=300"])
    s = run_peer(more, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10, resume_from=tmp_path)
    assert s["env_steps"] == 300 and s["resumed_from"].endswith("full-000001")
    for name in ("metrics.csv", "rounds.csv", "evals.csv"):
        assert (peer / name).read_bytes().startswith(before[name]), name
        with open(peer / name, newline="") as f:
            steps = [int(r["env_steps"]) for r in csv.DictReader(f)]
        assert steps == sorted(set(steps)) and 200 < steps[-1] <= 300, (name, steps)
    rows = list(csv.DictReader(open(peer / "metrics.csv")))
    assert [int(r["episode"]) for r in rows] == list(range(1, len(rows) + 1))
    assert not list(peer.glob(".*.tmp"))


def test_dropping_rows_never_loses_those_kept(tmp_path, monkeypatch):
    """The rows are rewritten into a temporary file renamed over the old one: a crash
    before the rename leaves the old file as it was, and no temporary file behind."""
    import os

    from swarm.experiment import runner

    f = tmp_path / "metrics.csv"
    old = b"wall_s,env_steps,episode\r\n1.0,10,1\r\n2.0,20,2\r\n3.0,30,3\r\n"
    f.write_bytes(old)

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        runner._keep_rows_upto(f, 20)
    assert f.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]
    monkeypatch.undo()
    assert runner._keep_rows_upto(f, 20) == 1
    assert f.read_bytes() == b"wall_s,env_steps,episode\r\n1.0,10,1\r\n2.0,20,2\r\n"
    assert runner._keep_rows_upto(tmp_path / "none.csv", 20) == 0


def test_a_damaged_checkpoint_falls_back_to_an_older_one(coordinator, tmp_path, monkeypatch, caplog):
    """A checkpoint damaged after its commit is skipped with a warning naming it: the
    peer resumes from the next older one that loads (then from checkpoint.pt). Into
    its own folder (a restart) with none that loads it starts again from step 0;
    from another run folder that is an error naming each one."""
    import shutil

    from swarm.experiment.checkpoint import Checkpointer, load_newest

    sets = ONE + ["checkpoint.full_every_s=0", "checkpoint.incremental_every_steps=50"]
    with monkeypatch.context() as m:   # killed: no final checkpoint, only the periodic ones
        m.setattr(Checkpointer, "close", lambda self: None)
        run_peer(load_spec(None, sets + ["budget.env_steps=210"]), 0, coordinator, tmp_path / "dead",
                 tensorboard=False, join_timeout=10)
    ckpt = tmp_path / "dead" / "peer0" / "ckpt"
    # the newest increment and the one before it (its fall-back): each holds every row an older one does
    assert sorted(p.name for p in ckpt.iterdir()) == ["full-000001", "full-000001-inc-0002", "full-000001-inc-0003"]

    def copy(name: str, damage: list[str], keep_pt: bool = True) -> Path:
        d = shutil.copytree(tmp_path / "dead", tmp_path / name)
        for rel in damage:   # torn after the commit
            f = d / "peer0" / rel
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        if not keep_pt:      # SIGKILLed: no checkpoint.pt either
            (d / "peer0" / "checkpoint.pt").unlink()
        return d

    more = load_spec(None, sets + ["budget.env_steps=300"])
    # the newest increment torn, the one before it with a truncated buffer column: their full one
    a = copy("a", ["ckpt/full-000001-inc-0003/state.pt", "ckpt/full-000001-inc-0002/buffer/obs.npy"])
    caplog.set_level("WARNING", logger="swarm.experiment")
    s = run_peer(more, 0, coordinator, a, tensorboard=False, join_timeout=10, resume_from=a)
    assert s["resumed_from"].endswith("full-000001") and s["env_steps"] == 300, s
    assert json.loads((a / "peer0" / "resumed.json").read_text())["env_steps"] == 51
    assert [k.split(" cannot")[0].split(": ")[0] for k in s["resume_skipped"]] == [
        f"checkpoint {a / 'peer0' / 'ckpt' / n}" for n in ("full-000001-inc-0003", "full-000001-inc-0002")]
    assert "full-000001-inc-0003 cannot be read" in caplog.text and "obs" in caplog.text
    # numbering goes on past the damaged ones, which the next full checkpoint prunes as usual
    assert [p.name for p in (a / "peer0" / "ckpt").iterdir()] == ["full-000003"]
    assert load_newest(a / "peer0" / "ckpt")[0].counters["env_steps"] == 300

    # every checkpoint lost with its full one: checkpoint.pt (no buffer) is the last resort ...
    b = copy("b", ["ckpt/full-000001/state.pt"])
    s = run_peer(more, 0, coordinator, tmp_path / "b2", tensorboard=False, join_timeout=10, resume_from=b)
    assert s["resumed_from"] == str(b / "peer0" / "checkpoint.pt") and len(s["resume_skipped"]) == 3, s
    # ... and without it: into its own folder, from step 0 like a peer that had no checkpoint yet
    c = copy("c", ["ckpt/full-000001/state.pt"], keep_pt=False)
    s = run_peer(more, 0, coordinator, c, tensorboard=False, join_timeout=10, resume_from=c)
    assert "resumed_from" not in s and s["env_steps"] == 300 and len(s["resume_skipped"]) == 3, s
    assert "starting again from step 0" in caplog.text
    # ... numbering its new replay items past every id the dead process gave out (its
    # neighbours may hold those, and would drop new items that reuse them as duplicates)
    given = [q for p, q in load_newest(ckpt)[0].buffer.ids() if p == "peer0"]
    new = [q for p, q in load_newest(c / "peer0" / "ckpt")[0].buffer.ids() if p == "peer0"]
    assert given and new and min(new) > max(given), (max(given), min(new))
    # from another run folder, nothing that loads is an error that says why for each
    d = copy("d", ["ckpt/full-000001/state.pt", "checkpoint.pt"])
    with pytest.raises(ConfigError, match="no checkpoint of peer0 .* can be read") as e:
        run_peer(more, 0, coordinator, tmp_path / "d2", tensorboard=False, join_timeout=10, resume_from=d)
    assert str(e.value).count("cannot be read") == 4, e.value


def test_best_pt_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    # best.pt was written in place: a peer killed mid-write left a torn file, and with
    # it the best evaluation of the run
    import os

    from swarm.experiment.runner import _read_best, _save_whole

    path = tmp_path / "best.pt"
    _save_whole({"eval_return": 500.0, "env_steps": 3000}, path)
    assert _read_best(path) == (500.0, 3000)

    def killed(fd):   # half the file is written when the process "dies"
        os.ftruncate(fd, 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        _save_whole({"eval_return": 20.0, "env_steps": 4000}, path)
    assert _read_best(path) == (500.0, 3000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_a_peer_whose_launcher_is_gone_stops_before_200_steps(coordinator, tmp_path):
    """The launcher was looked for every 200 env steps only: a peer whose neighbours and
    coordinator went with its `swarm run` waited out a gossip round's timeout every 10 steps,
    so it ran on for 40 s. Now it is looked for once a second, the first time at the first
    step: a peer whose parent is not the launcher named stops at once."""
    import os
    not_my_parent = os.getpid()   # this test's process runs run_peer: its parent is pytest's parent
    spec = load_spec(None, ONE + ["budget.env_steps=150"])
    s = run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10, parent_pid=not_my_parent)
    assert s["reason"] == "launcher gone" and s["env_steps"] < 150, s


def test_a_peer_whose_launcher_is_gone_does_not_wait_for_the_others_to_join(coordinator, tmp_path):
    """While it waited for the spec's other peers to join, a peer never looked for its
    launcher: it waited out join_timeout (60 s by default) and failed with a PeerTimeout."""
    import os
    spec = load_spec(None, ONE + ["peers=2"])
    with pytest.raises(SwarmError, match="its launcher .* is gone; not waiting for the others to join"):
        run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=30, parent_pid=os.getpid())


def test_peers_started_with_one_odd_spec_refuse_only_the_odd_one(monkeypatch, caplog):
    """Each peer compares its spec with the others' once they joined. Started together,
    three with one spec and one with another, every one saw a spec that differs and all
    four exited. The spec that the most peers train stays (of as many, the lowest
    rank's): its peers go on with a warning, and only the odd one is refused."""
    from swarm.experiment import runner

    same, odd = {"dqn": "aaaa", "env": "bbbb"}, {"dqn": "cccc", "env": "bbbb"}

    def others_of(specs: dict[int, dict[str, str]], me: int) -> list[dict]:
        return [{"id": f"peer{r}", "rank": r, "stats": {"spec": s}} for r, s in specs.items() if r != me]

    def check(specs: dict[int, dict[str, str]], me: int) -> None:
        monkeypatch.setattr(runner, "_others", lambda *a: others_of(specs, me))
        runner._check_same_spec(["tcp://127.0.0.1:1"], None, f"peer{me}", specs[me], 0.0, me)

    three_and_one = {0: same, 1: odd, 2: same, 3: same}
    caplog.set_level("WARNING", logger="swarm.experiment")
    for me in (0, 2, 3):
        check(three_and_one, me)      # goes on
    assert "the spec differs at peer1 (dqn); this peer's is the one the most peers" in caplog.text
    with pytest.raises(ConfigError, match="peer1: the spec differs at peer0 \\(dqn\\), peer2 \\(dqn\\), peer3"):
        check(three_and_one, 1)
    # two against two: the lowest rank's spec stays
    two_and_two = {0: odd, 1: same, 2: same, 3: odd}
    check(two_and_two, 0)
    check(two_and_two, 3)
    for me in (1, 2):
        with pytest.raises(ConfigError, match=f"peer{me}: the spec differs at peer0 \\(dqn\\), peer3 \\(dqn\\)"):
            check(two_and_two, me)
