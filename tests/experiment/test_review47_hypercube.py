"""A `swarm run` on a hypercube ends as any run does (review 47). When the first peer
ended its budget and left, the others' view was a hypercube of 3, their next gossip
round raised ConfigError, and they exited with code 2, "a configuration error", the run
with 1, though the spec was fine (4 peers)."""

from __future__ import annotations

import json

from experiment.test_review47_resume import swarm


def test_a_hypercube_run_ends_every_peer_on_its_budget(tmp_path):
    out = swarm(tmp_path, *(a for s in ["peers=4", "gossip.topology=hypercube", "budget.env_steps=600",
                                        "dqn.learning_starts=100", "dqn.batch_size=32", "dqn.hidden=[32]",
                                        "eval.every=0", "buffer.capacity=2000", "name=hc"]
                            for a in ("--set", s)), timeout=180)
    (run,) = (tmp_path / "runs").glob("hc-*")
    ends = [json.loads((run / f"peer{r}" / "summary.json").read_text())["reason"] for r in range(4)]
    assert ends == ["budget"] * 4, out
