"""Review 45: the error a peer's heartbeat shows (``last_error``: the status page, ``swarm
status``) is not a start-up round. Peers start about a second apart, so the first one's
first rounds find no neighbour's gossip engine yet (docs/gossip.md): that showed as its
error for the whole of a healthy run, and a run of one peer showed ``alone in the view``
all along. A round with nobody after this process's first round that mixed is still
shown, named as rounds.csv's ``round`` column names it, until a round mixes again.

Peers are threads of this process; the coordinator is a real process on loopback.
"""

from __future__ import annotations

import csv
import re
import threading

from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import status, wait_for

from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer

PAIR = ONE + ["peers=2", "budget.env_steps=1000000", "gossip.interval=20"]


def _figures(addr: str, pid: str) -> dict:
    """The figures the coordinator holds for ``pid`` (empty before its first)."""
    return next((m.get("stats") or {} for m in status(addr, 0.5)["members"] if m["id"] == pid), {})


def _until(addr: str, pid: str, cond, what: str, timeout: float = 60.0) -> dict:
    """Wait for ``pid``'s figures to meet ``cond``; return them, or fail with the last ones seen."""
    seen: list[dict] = [{}]

    def met() -> dict | None:
        seen[0] = _figures(addr, pid)
        return seen[0] if seen[0] and cond(seen[0]) else None

    try:
        return wait_for(met, timeout=timeout, interval=0.1, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; {pid}'s last figures: rounds {seen[0].get('rounds')}, rounds_ok "
                             f"{seen[0].get('rounds_ok')}, last_error {seen[0].get('last_error')!r}") from None


def _round_named(error: str) -> int | None:
    m = re.match(r"round (\d+): ", error or "")
    return int(m.group(1)) if m else None


def _peer(spec, rank: int, addr: str, run_dir, stop: threading.Event, out: dict, **kw) -> threading.Thread:
    t = threading.Thread(name=f"peer{rank}", target=lambda: out.update({rank: run_peer(
        spec, rank, addr, run_dir, stop=stop, tensorboard=False, join_timeout=60, **kw)}))
    t.start()
    return t


def test_start_up_rounds_are_no_error_a_later_failure_is_until_rounds_mix_again(coordinator, tmp_path,
                                                                                monkeypatch):
    from swarm.rl import train

    # peer1 builds its env (and then its gossip engine) only once peer0 has run rounds with
    # nobody: the skew of two peers that start apart, made certain
    release, real, held = threading.Event(), train.make_env, []

    def make_env(*args, **kw):
        if threading.current_thread().name == "peer1" and not held:
            held.append(True)
            release.wait(120)
        return real(*args, **kw)

    monkeypatch.setattr(train, "make_env", make_env)
    spec = load_spec(None, PAIR)
    stops = [threading.Event(), threading.Event(), threading.Event()]
    out: dict[int, dict] = {}
    threads = [_peer(spec, 0, coordinator, tmp_path, stops[0], out),
               _peer(spec, 1, coordinator, tmp_path, stops[1], out)]
    try:
        _until(coordinator, "peer0", lambda s: (s.get("rounds") or 0) >= 3, "peer0's first rounds, alone")
        release.set()
        # it mixed (disagreement is measured only then), and shows no error for its start
        s = _until(coordinator, "peer0", lambda s: s.get("disagreement") is not None,
                   "peer0 mixing with peer1")
        s = _until(coordinator, "peer0", lambda s: s.get("last_error") == "",
                   "no error shown for peer0's start-up rounds")
        assert 0 < s["rounds_ok"] < s["rounds"], s   # its rounds with nobody still count

        # peer1 leaves: peer0's rounds with nobody are now an error, named by rounds.csv's count
        stops[1].set()
        threads[1].join(60)
        assert not threads[1].is_alive() and out[1]["reason"] == "stopped", out.get(1)
        s = _until(coordinator, "peer0", lambda s: _round_named(s.get("last_error")) == s["rounds"],
                   "peer0's error naming its latest round")
        failed = _round_named(s["last_error"])
        assert "alone in the view" in s["last_error"] or "no neighbour" in s["last_error"], s

        # peer1 back (restarted into its folder): the error clears once a round mixes
        threads.append(_peer(spec, 1, coordinator, tmp_path, stops[2], out, resume_from=tmp_path))
        ok_before = s["rounds_ok"]
        s = _until(coordinator, "peer0", lambda s: s.get("last_error") == "" and s["rounds_ok"] > ok_before,
                   "peer0's error cleared by a round that mixed")
        assert s["rounds_ok"] < s["rounds"], s   # the rounds with nobody are still counted
    finally:
        release.set()
        for stop in stops:
            stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert out[0]["reason"] == "stopped", out[0]
    with open(tmp_path / "peer0" / "rounds.csv") as f:
        rows = {int(r["round"]): r for r in csv.DictReader(f)}
    assert rows[failed]["participants"] == "0", rows[failed]   # the round the error named went alone


def test_a_run_of_one_peer_shows_no_error_for_its_rounds_alone(coordinator, tmp_path):
    spec = load_spec(None, ONE + ["budget.env_steps=1000000"])
    stop, out = threading.Event(), {}
    t = _peer(spec, 0, coordinator, tmp_path, stop, out)
    try:
        s = _until(coordinator, "peer0", lambda s: (s.get("rounds") or 0) >= 3, "peer0's rounds")
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive() and out[0]["reason"] == "stopped", out.get(0)
    assert s["last_error"] == "", s   # alone by design: nothing went wrong
    assert s["rounds_ok"] == 0, s


def test_an_error_of_another_kind_shows_again_once_a_rounds_is_cleared():
    # a round that mixed with nobody after a disk error took its place, and the next round
    # that mixed cleared it: the disk error, which still stood, was shown no more
    from swarm.experiment.runner import _State
    from swarm.gossip.engine import RoundResult

    state = _State()
    state.rounds = 1
    state.round_done(RoundResult(round=0, participants=["b"]))
    state.error("cannot write metrics.csv: No space left on device")
    state.rounds = 2
    state.round_done(RoundResult(round=1, reason="no neighbour's state arrived in time"))
    assert state.last_error == "round 2: no neighbour's state arrived in time"
    state.rounds = 3
    state.round_done(RoundResult(round=2, participants=["b"]))
    assert state.last_error == "cannot write metrics.csv: No space left on device"
