"""What a run's outputs say of its traffic and results: a crashed peer's table row (from its
files), the gossip engine's bytes out (as the link sent them), and a peer's final counters
(one snapshot in summary.json, checkpoint.pt, the last checkpoint and its leave)."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import numpy as np
import torch

# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import status

import swarm.experiment.runner as runner
import swarm.gossip
from swarm.coordinator import Coordinator
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import Lineage, write_lineage
from swarm.experiment.launch import _table, summarize
from swarm.experiment.runner import EPISODE_FIELDS, EVAL_FIELDS, ROUND_FIELDS, TRAFFIC_KEYS, peer_dir
from swarm.gossip import Gossip
from swarm.peer import Peer


# ------------------------------------------------------------------ a crashed peer's row

def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def _crashed_peer(run_dir: Path, evals: list[tuple[int, float]]) -> tuple[Path, Lineage]:
    """peer0's folder as a peer killed at env step ~800 leaves it: no summary.json; its last
    episode ended at step 739 (round 73), its last gossip round was round 80 at step 800."""
    d = peer_dir(run_dir, 0)
    d.mkdir(parents=True)
    run = Lineage.new()
    write_lineage(d, run)
    _write_csv(d / "metrics.csv", EPISODE_FIELDS, [
        {"wall_s": 9.1, "env_steps": 739, "episode": 19, "episode_return": 41.0, "mean_return": 37.9,
         "rounds": 73, "bytes_out": 190_000}])
    _write_csv(d / "rounds.csv", ROUND_FIELDS, [
        {"round": r, "env_steps": 10 * r, "wall_s": 0.13 * r, "participants": 2, "missing": 0, "bytes_out": 604,
         "bytes_in": 608} for r in (79, 80)])
    _write_csv(d / "evals.csv", EVAL_FIELDS, [
        {"wall_s": 5.9, "cpu_s": 1.0, "env_steps": at, "eval_return": ret} for at, ret in evals])
    return d, run


def test_a_crashed_peers_row_has_its_furthest_steps_and_rounds_and_its_evaluations(tmp_path):
    # The row took metrics.csv's last row alone: 739 steps, 73 rounds, no eval nor best
    # eval ("-" in the table), so summary.json had no best and no "swarm eval" hint came.
    d, run = _crashed_peer(tmp_path, [(500, 19.0)])
    runner._save_whole({"eval_return": 19.0, "env_steps": 500, **run.record()}, d / "best.pt")
    rows = summarize(tmp_path, load_spec(None, ["peers=1"]))
    assert len(rows) == 1
    row = rows[0]
    assert (row["env_steps"], row["rounds"]) == (800, 80), row
    assert row["eval_return"] == 19.0 and (row["best_eval_return"], row["best_eval_at"]) == (19.0, 500), row
    assert row["final_mean_return"] == 37.9 and row["reason"].startswith("no summary"), row
    assert "19.0 @ 500" in _table(rows), _table(rows)


def test_a_crashed_peers_best_is_its_runs_best_pt_else_its_highest_evaluation(tmp_path):
    d, run = _crashed_peer(tmp_path, [(300, 12.0), (500, 19.0), (700, 19.0), (800, 15.5)])
    spec = load_spec(None, ["peers=1"])
    # none: evals.csv's highest, the first of two (a later one replaced it only by doing better)
    row = summarize(tmp_path, spec)[0]
    assert row["eval_return"] == 15.5 and (row["best_eval_return"], row["best_eval_at"]) == (19.0, 500), row
    # another run's best.pt left in the folder does not count ...
    runner._save_whole({"eval_return": 30.0, "env_steps": 300, **Lineage.new().record()}, d / "best.pt")
    row = summarize(tmp_path, spec)[0]
    assert (row["best_eval_return"], row["best_eval_at"]) == (19.0, 500), row
    # ... this run's does, also one it carried from the run it continues (not in evals.csv)
    runner._save_whole({"eval_return": 25.0, "env_steps": 400, **run.record()}, d / "best.pt")
    row = summarize(tmp_path, spec)[0]
    assert (row["best_eval_return"], row["best_eval_at"]) == (25.0, 400), row


# ------------------------------------------------------------------ gossip bytes out

async def _gossip(n: int, rounds: int) -> list[tuple[Peer, Gossip]]:
    """``n`` real Peers (a coordinator on loopback) on a ring, lockstep, identity codec, with
    386 parameters each: ``rounds`` rounds, each of which must mix with every neighbour and
    drop nothing. Returns the peers and engines, closed."""
    async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
        peers = [Peer(id=f"p{i}", coordinators=[coord.address], heartbeat_s=0.2, topology="ring")
                 for i in range(n)]
        engines: list[Gossip] = []
        try:
            for p in peers:
                await p.start()
            for p in peers:
                await p.wait_view(lambda v: len(v.members) == n, timeout=10)
                await p.wait_linked(timeout=10)
            engines = [Gossip(p, np.full(386, float(i), np.float32), round_timeout=10.0)
                       for i, p in enumerate(peers)]
            for _ in range(rounds):
                for res in await asyncio.gather(*(g.round() for g in engines)):
                    assert res.ok and not res.dropped and not res.missing, res
        finally:
            for g in engines:
                g.close()
            for p in reversed(peers):
                await p.close()
    return list(zip(peers, engines))


def test_the_bytes_a_gossip_engine_counts_out_are_those_its_receiver_counts_in():
    # The sender counted each message encoded without its seq (1 byte), the receiver the
    # message as it came: 2 bytes with a seq past 127, 3 past 255, and so on: after 300
    # rounds a's bytes out fell short of b's bytes in by a byte or two a message.
    (a, ga), (b, gb) = asyncio.run(asyncio.wait_for(_gossip(2, 300), 120))
    assert a.counters.msgs_out > 256 and b.counters.msgs_out > 256   # seqs past 255: 3 bytes
    assert ga.stats.bytes_out == gb.stats.bytes_in > 300 * 386 * 4, (ga.stats, gb.stats)
    assert gb.stats.bytes_out == ga.stats.bytes_in, (ga.stats, gb.stats)


def test_a_loss_free_swarms_gossip_bytes_in_sum_to_its_bytes_out():
    # three peers, each sending to both others: the received total came out the larger
    got = asyncio.run(asyncio.wait_for(_gossip(3, 150), 120))
    sent, received = sum(g.stats.bytes_out for _, g in got), sum(g.stats.bytes_in for _, g in got)
    assert sent == received > 3 * 2 * 150 * 386 * 4, (sent, received)


# ------------------------------------------------------------------ a peer's final counters

def test_summary_json_checkpoint_pt_the_last_checkpoint_and_the_leave_hold_one_snapshot(
        coordinator, tmp_path, monkeypatch):
    # Traffic goes on after training ends: the peer receives until it closes. Here one more
    # gossip message (and a federation ack sent for it) comes in as the final checkpoint is
    # taken, after summary.json's figures were. summary.json said gossip_bytes_in X, the
    # last ckpt/ entry and checkpoint.pt X + 1618, and the coordinator had later figures again.
    engines: list[Gossip] = []

    class Seen(Gossip):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            engines.append(self)

    close = runner.Checkpointer.close

    def late_message(self):
        (g,) = engines
        g.stats.bytes_in += 1618          # as the engine's handler counts a state that came
        g.link.counters.bytes_in += 1618  # ... and the peer's receive loop
        g.link.counters.bytes_out += 90   # an ack for it
        return close(self)

    monkeypatch.setattr(swarm.gossip, "Gossip", Seen)   # run_peer imports it when it runs
    monkeypatch.setattr(runner.Checkpointer, "close", late_message)
    s = runner.run_peer(load_spec(None, ONE), 0, coordinator, tmp_path, tensorboard=False, join_timeout=10)
    out = peer_dir(tmp_path, 0)
    summary = json.loads((out / "summary.json").read_text())
    final = {k: summary[k] for k in TRAFFIC_KEYS}
    assert {k: s[k] for k in TRAFFIC_KEYS} == final, (s, final)
    assert engines[0].stats.bytes_in == final["gossip_bytes_in"] + 1618   # it came after the snapshot
    pt = torch.load(out / "checkpoint.pt", weights_only=True, map_location="cpu")
    assert {k: pt["counters"][k] for k in TRAFFIC_KEYS} == final, (pt["counters"], final)
    manifest = json.loads((out / "ckpt" / summary["last_checkpoint"] / "manifest.json").read_text())
    assert {k: manifest["counters"][k] for k in TRAFFIC_KEYS} == final, (manifest["counters"], final)
    # the coordinator keeps the figures its leave carried
    (row,) = [m for m in status(coordinator)["members"] if m["id"] == "peer0"]
    assert {k: row["stats"][k] for k in TRAFFIC_KEYS} == final, (row, final)
