"""Relayed gradients with peers that share turns (``dqn.train_every < peers``): what
`swarm run` warns of before it starts, and what its ending says of the copies
(swarm/experiment/spec.py's warnings, launch.py's ending; docs/gossip.md, "One order
everywhere" and "Out of step").

The 49th review's run r2 (2 peers, ``train_every = 1``, ``average = false``, 3,000
steps): peer1 took peer0's copy 105 times, its digests kept only the counts past
peer0's last one, and the ending said "the copies agree from then on" with nothing
compared; 72 of the copies moved its turns ahead of its env steps, which the warning
did not say, and with averaging on the warning promised copies that no peer takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from swarmtest import ROOT, reaped

from swarm.experiment import load_spec
from swarm.experiment.launch import _compared_digests, _first_divergence, _relay_ending

# the other `swarm run` tests' helper (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import finish

SHARED = ["peers=2", "gossip.exchange=gradients", "dqn.train_every=1", "budget.env_steps=250",
          "dqn.learning_starts=50", "dqn.batch_size=16", "dqn.hidden=[16]", "buffer.capacity=2000",
          "eval.every=0"]


def shared_turns_warning(*overrides: str) -> str:
    (said,) = [w for w in load_spec(None, SHARED + list(overrides)).warnings() if "share turns" in w]
    return said


def r2_rows() -> list[dict]:
    """Summaries like r2's: peer0's digests at 100 .. 10,700, peer1's only at 10,800 and
    10,900 (it started them afresh at its last copy, at update 10,700), 105 copies."""
    took = [{"from": "peer0", "clock": 100 * i, "next": 100 * i + 3 if i % 3 else None, "why": "digest"}
            for i in range(1, 106)]
    return [{"id": "peer0", "relay": {"digests": {str(u): "a" for u in range(100, 10_800, 100)}, "resynced": []}},
            {"id": "peer1", "relay": {"digests": {"10800": "b", "10900": "c"}, "resynced": took}}]


def test_the_ending_claims_no_agreement_where_no_digest_after_the_copies_was_compared():
    rows = r2_rows()
    assert _first_divergence(rows) is None and _compared_digests(rows) == []
    said = "\n".join(_relay_ending(rows, load_spec(None, SHARED + ["gossip.average=false"])))
    assert "agree" not in said, said
    assert "not compared" in said and "105 times (from peer0)" in said, said
    # the cause named is the shared turns, not a peer that fell out of step
    assert "peers share turns (dqn.train_every = 1 with peers = 2)" in said and "out of step" not in said, said
    assert "70 of which moved its turns ahead of its env steps" in said, said


def test_the_ending_claims_agreement_only_after_a_digest_compared_equal():
    # turns of their own (train_every = peers): one copy, then equal digests at counts
    # both hold, short of the last two points
    spec = load_spec(None, SHARED + ["gossip.average=false", "dqn.train_every=2"])
    took = [{"from": "peer0", "clock": 500, "next": None, "why": "digest"}]
    after = {str(u): f"d{u}" for u in range(600, 1_100, 100)}
    rows = [{"id": "peer0", "relay": {"digests": {**{str(u): "x" for u in range(100, 600, 100)}, **after}}},
            {"id": "peer1", "relay": {"digests": dict(after), "resynced": took}}]
    (said,) = _relay_ending(rows, spec)
    assert said.endswith("took another peer's copy 1 time (from peer0); the copies agree from then on"), said
    # the same counts held, but only the last two points, which are not compared
    rows[1]["relay"]["digests"] = {"900": "d900", "1000": "d1000"}
    (said,) = _relay_ending(rows, spec)
    assert "agree" not in said and "not compared" in said, said


def test_a_divergence_under_shared_turns_is_blamed_on_them():
    spec = load_spec(None, SHARED + ["gossip.average=false"])
    rows = [{"id": "peer0", "relay": {"digests": {str(u): "a" for u in range(100, 1_100, 100)}}},
            {"id": "peer1", "relay": {"digests": {**{str(u): "a" for u in range(100, 1_100, 100)}, "400": "b"}}}]
    (said,) = _relay_ending(rows, spec)
    assert "differ from update 400 on" in said and "peers share turns" in said, said
    assert "fell out of step" not in said and "did not take another peer's copy" not in said, said


def test_the_shared_turns_warning_says_what_a_repair_does_to_the_peer_that_takes_it():
    # r2: 72 of 105 copies moved peer1's turns ahead of its env steps (144 in all), and its
    # last turns' 286 gradients and 144 transitions went out after peer0 had ended
    repaired = shared_turns_warning("gossip.average=false")
    assert "ahead of its env steps" in repaired and "reach no peer" in repaired, repaired
    assert "the copies end apart" in repaired, repaired


def test_the_shared_turns_warning_promises_a_repair_only_where_one_is_taken():
    repaired = shared_turns_warning("gossip.average=false")
    assert "repaired by taking a whole copy" in repaired, repaired
    averaged = shared_turns_warning("gossip.sync=async")   # gossip.average = true, the default
    assert "repaired" not in averaged and "only parameter averaging pulls them together" in averaged, averaged
    stale = shared_turns_warning("gossip.average=false", "gossip.relay_staleness=2")
    assert "repaired" not in stale and "nothing brings them back together" in stale, stale
    for said in (repaired, averaged, stale):
        assert said.startswith("dqn.train_every = 1 with gossip.exchange = gradients and peers = 2: peers share "
                               "turns") and said.endswith("set dqn.train_every = 2 (a turn per peer) for copies "
                                                          "that stay the same"), said


def test_a_swarm_run_with_shared_turns_says_no_more_of_its_copies_than_its_digests_show(tmp_path):
    """A real `swarm run` (2 peers on loopback, relayed gradients, a turn shared at every
    step, no averaging): peer1 takes copies over and over; the ending may say the copies
    agree only where a digest count after every copy was compared and equal."""
    argv = [sys.executable, "-m", "swarm.cli", "run", "--set", "gossip.average=false"]
    argv += [a for s in SHARED for a in ("--set", s)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with reaped(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, 120)
    assert p.returncode == 0, out
    (run,) = (tmp_path / "runs").glob("cartpole-ring-*")
    rows = json.loads((run / "summary.json").read_text())
    took = [r["id"] for r in rows if r["relay"]["resynced"]]
    assert took, rows   # with a turn shared at every step, the copies part at each digest check
    compared, split = _compared_digests(rows), _first_divergence(rows)
    agreed = [line for line in out.splitlines() if "agree" in line]
    if split is None and compared:
        assert len(agreed) == len(took), out
    else:   # no count after the copies compared (r2), or compared and different
        assert agreed == [], (compared, split, out)
    ending = [line for line in out.splitlines() if "took another peer's copy" in line or "differ from" in line]
    assert ending and all("peers share turns" in line for line in ending), out
    (warned,) = [line for line in out.splitlines() if "peers share turns" in line and "warning" in line]
    assert "repaired by taking a whole copy" in warned and "ahead of its env steps" in warned, warned
