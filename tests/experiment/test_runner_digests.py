"""The parameter digests a relay peer keeps for summary.json: bounded, and still enough
for the launcher to find where the copies began to differ."""

from __future__ import annotations

import pytest

from swarm.experiment import load_spec
from swarm.experiment.launch import _first_divergence
from swarm.experiment.runner import DIGEST_EVERY, run_peer
from experiment.test_runner import coordinator  # noqa: F401 - a fixture


def kept(points: int, recent: int, differ_from: int | None = None, tag: str = "") -> dict[str, str]:
    """The summary digests of a copy after ``points`` digest points, thinned as the
    runner thins them; from point ``differ_from`` on its digests are its own."""
    from swarm.experiment.runner import _thin_digests
    d: dict[int, str] = {}
    for p in range(1, points + 1):
        u = p * DIGEST_EVERY
        d[u] = f"{p}{tag if differ_from is not None and p >= differ_from else ''}"
        if p % recent == 0:
            _thin_digests(d, u, recent)
    return {str(u): h for u, h in d.items()}


def test_the_digests_kept_are_bounded_and_keep_every_recent_point():
    # before: one entry per DIGEST_EVERY updates for the whole run (200,000 after 20
    # million updates, 9.5 MB of summary.json)
    recent, points = 10, 100_000
    d = sorted(int(u) // DIGEST_EVERY for u in kept(points, recent))
    assert len(d) <= recent * (3 + (points // (2 * recent)).bit_length()), len(d)
    assert d[-2 * recent:] == list(range(points - 2 * recent + 1, points + 1))   # the last 2·recent, all
    for p in d:   # older ones, the fewer the older: one in 2^j at ages in [2^j, 2^(j+1))·recent
        j = max(0, ((points - p) // recent).bit_length() - 1)
        assert p % (1 << j) == 0, p
    assert len([p for p in d if p <= points // 2]) >= recent   # the first half is not gone


@pytest.mark.parametrize("split", [17, 3_001, 19_985])
def test_the_launcher_still_finds_where_the_copies_began_to_differ(split):
    recent, points = 10, 20_000
    same = [kept(points, recent), kept(points - 1, recent)]   # one stopped a point earlier
    assert _first_divergence([{"relay": {"digests": g}} for g in same]) is None
    rows = [{"relay": {"digests": kept(points, recent)}},
            {"relay": {"digests": kept(points - 1, recent, differ_from=split, tag="x")}}]
    found = _first_divergence(rows) // DIGEST_EVERY
    if points - split < 2 * recent:      # exactly among the last 2·recent points
        assert found == split, found
    else:                                # else within 1/recent of how long before the end
        assert split <= found <= split + (points - split) // recent, (split, found)


def test_a_relay_peer_writes_a_bounded_digest_history_to_its_summary(coordinator, tmp_path, monkeypatch):
    """A real peer (gradient exchange, alone): a digest every update, thinned every 2
    points, so that a short run keeps far fewer than its updates."""
    from swarm.experiment import runner
    monkeypatch.setattr(runner, "DIGEST_EVERY", 1)
    monkeypatch.setattr(runner, "DIGESTS_RECENT", 2, raising=False)   # (absent before: no bound)
    spec = load_spec(None, ["peers=1", "budget.env_steps=700", "dqn.learning_starts=50", "dqn.batch_size=16",
                            "dqn.train_every=1", "dqn.updates_per_train=1", "eval.every=0",
                            "gossip.exchange=gradients", "gossip.sync=async", "gossip.average=false"])
    s = run_peer(spec, 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
    assert s["reason"] == "budget", s
    counts = sorted(int(u) for u in s["relay"]["digests"])
    updates = counts[-1]
    assert updates >= 500, counts            # a digest at each update: before, 500 or more kept
    assert len(counts) <= 2 * (3 + (updates // 4).bit_length()), (len(counts), counts)
    assert counts[-4:] == list(range(updates - 3, updates + 1)), counts


def test_the_launcher_finds_the_divergence_when_one_peer_ran_far_longer():
    # the last two counts the peers shared were taken by position: with the longer
    # peer's history thinned, they lay 16 points before the shorter one's end, and a
    # divergence between them went unreported
    recent = 10
    rows = [{"relay": {"digests": kept(100, recent)}},
            {"relay": {"digests": kept(300, recent, differ_from=70, tag="x")}}]
    found = _first_divergence(rows)
    assert found is not None and 70 <= found // DIGEST_EVERY <= 98, found
    same = [{"relay": {"digests": kept(100, recent)}}, {"relay": {"digests": kept(300, recent)}}]
    assert _first_divergence(same) is None


def test_the_ending_does_not_blame_a_peer_out_of_step_when_averaging_parts_the_copies():
    # With gossip.average = true (the default), averaging mixes each copy with lagging
    # estimates of its neighbours', so the digests part in every run: the ending blamed a
    # peer that "fell out of step with the relay's turns" while every relay counted no
    # late, stale or timed-out turn.
    from swarm.experiment.launch import _divergence_line
    from swarm.experiment.spec import GossipSpec

    averaged = _divergence_line(300, GossipSpec(exchange="gradients", sync="async"))
    assert "from update 300 on" in averaged and "gossip.average = true" in averaged
    assert "out of step" not in averaged
    plain = _divergence_line(300, GossipSpec(exchange="gradients", average=False))
    assert "fell out of step" in plain and "did not take another peer's copy" in plain
    stale = _divergence_line(300, GossipSpec(exchange="gradients", average=False, relay_staleness=2))
    assert "relay_staleness > 1 nothing brings" in stale
