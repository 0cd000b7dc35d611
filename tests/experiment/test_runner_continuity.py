"""A peer that continues its own folder continues its figures: rounds.csv's round, the
CSVs' wall and CPU seconds, and TensorBoard without the dead process's steps past its
checkpoint."""

from __future__ import annotations

import csv
import time

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.experiment import load_spec
from swarm.experiment.checkpoint import load_newest
from swarm.experiment.runner import ROUND_FIELDS, _Logs, run_peer

ONE = ["peers=1", "budget.env_steps=200", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=100",
       "eval.episodes=1", "gossip.codec=identity", "gossip.step_size=1.0"]


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_peer_resumed_into_its_folder_continues_its_figures(coordinator, tmp_path):  # noqa: F811
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    first = run_peer(load_spec(None, ONE), 0, coordinator, tmp_path, join_timeout=10)   # final checkpoint at 200
    peer = tmp_path / "peer0"
    rounds = _rows(peer / "rounds.csv")
    # round: the run's count, as metrics.csv's rounds (it was the gossip engine's number, from 2)
    assert [int(r["round"]) for r in rounds] == list(range(1, first["rounds"] + 1))
    assert all(r["gossip_round"].isdigit() for r in rounds)   # the engine's, kept beside it
    ck = load_newest(peer / "ckpt")[0].counters
    assert 0 < ck["cpu_s"] and 0 < ck["wall_s"] <= first["wall_s"] + 0.001   # (rounded to ms)
    # what a process killed after that checkpoint had logged to TensorBoard (its CSV rows
    # past the checkpoint go: test_runner's test_a_peer_resumed_into_its_folder_drops_...)
    time.sleep(1.1)   # event files are named by the second they were opened in
    dead = SummaryWriter(str(peer / "tb"))
    for step in (210, 250):
        dead.add_scalar("episode/return", -1.0, step)
    dead.close()
    time.sleep(1.1)

    more = load_spec(None, ONE + ["budget.env_steps=300"])
    second = run_peer(more, 0, coordinator, tmp_path, join_timeout=10, resume_from=tmp_path)
    assert second["env_steps"] == 300 and second["resumed_from"].endswith("full-000001")
    rounds = _rows(peer / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == list(range(1, second["rounds"] + 1))
    # wall_s and cpu_s go on from the checkpoint's as the counter columns do
    episodes, evals = _rows(peer / "metrics.csv"), _rows(peer / "evals.csv")
    for name, rows in (("metrics.csv", episodes), ("rounds.csv", rounds), ("evals.csv", evals)):
        walls = [float(r["wall_s"]) for r in rows]
        assert walls == sorted(walls), (name, walls)
        assert all(float(r["wall_s"]) >= ck["wall_s"] for r in rows if int(r["env_steps"]) > 200), name
    assert [int(r["env_steps"]) for r in evals] == [100, 200, 300]
    assert float(evals[2]["cpu_s"]) >= ck["cpu_s"] >= float(evals[1]["cpu_s"])
    # TensorBoard holds each episode once, as metrics.csv does: not the dead process's too
    ea = EventAccumulator(str(peer / "tb"), size_guidance={"scalars": 0})
    ea.Reload()
    assert [e.step for e in ea.Scalars("episode/return")] == [int(r["env_steps"]) for r in episodes]
    assert [e.step for e in ea.Scalars("eval/return")] == [100, 200, 300]


def test_a_file_an_earlier_version_wrote_is_continued_with_its_own_columns(tmp_path):
    """Its rows must line up with its header: one more value per row than columns, and
    pandas refuses the file."""
    old = ["round", "env_steps", "wall_s", "participants", "missing", "bytes_out", "bytes_in", "waited_s",
           "disagreement", "shared_items"]   # before gossip_round
    (tmp_path / "rounds.csv").write_text(",".join(old) + "\r\n" + ",".join(["1"] * len(old)) + "\r\n")
    logs = _Logs(tmp_path, tensorboard=False, append=True, upto=10)
    logs.rounds.writerow({**{f: 2 for f in ROUND_FIELDS}, "gossip_round": 2})
    logs.close()
    with open(tmp_path / "rounds.csv", newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == old and [len(x) for x in lines[1:]] == [len(old), len(old)]
    assert _rows(tmp_path / "metrics.csv") == []   # a new file: this version's columns
    assert (tmp_path / "metrics.csv").read_text().startswith("wall_s,env_steps,")


def test_tensorboard_events_reach_the_writer_within_its_flush_period_without_a_flush(tmp_path, monkeypatch):
    """Scalars wait to be handed to the writer together, but not longer than the writer's
    own flush period: a live TensorBoard lags no more than with one add_scalar each."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from swarm.experiment import runner

    now = [1000.0]
    monkeypatch.setattr(runner.time, "time", lambda: now[0])
    logs = runner._Logs(tmp_path, tensorboard=True)
    try:
        logs.scalars(1, {"a": 1.0})
        now[0] += runner._TB_WAIT_S
        logs.scalars(2, {"a": 2.0})   # the first has waited the period: both go now
        logs.tb.file_writer.flush()    # the writer's file, not ours
        acc = EventAccumulator(str(tmp_path / "tb"))
        acc.Reload()
        assert [(e.step, e.value) for e in acc.Scalars("a")] == [(1, 1.0), (2, 2.0)]
    finally:
        logs.close()
