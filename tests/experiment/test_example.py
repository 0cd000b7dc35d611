"""The README example: a peer embedded in a hand-written simulator loop."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np

from swarmtest import ROOT, free_port

EXAMPLE = ROOT / "examples" / "custom_simulator.py"


def test_every_rank_of_the_example_starts_from_one_network():
    # Before: each rank built its agent with seed=rank and no init_seed, so the ranks
    # started from different networks, which gossip averages into none of them.
    spec = importlib.util.spec_from_file_location("custom_simulator", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    agents = [example.learner(rank)[1] for rank in range(3)]
    for agent in agents[1:]:
        assert np.array_equal(agent.parameters(), agents[0].parameters())
    assert agents[0].rng.random() != agents[1].rng.random()   # exploration still differs by rank


def test_custom_simulator_example_learns_together(procs, tmp_path):
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.coordinator(addr, name="coordinator")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rooms = [subprocess.Popen([sys.executable, str(EXAMPLE), "--coordinator", addr, "--rank", str(r),
                               "--steps", "600", "--gossip-every", "50"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in rooms]
    finally:
        for p in rooms:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(rooms, outs)):
        assert p.returncode == 0, out
        assert "expect divergence" not in out, out   # the example's gossip step suits its codec
        m = re.search(rf"room{r}: 600 steps, 6 episodes, .* (\d+) gossip rounds, (\d+) with neighbours, "
                      r"(\d+) bytes sent, (\d+) transitions from neighbours", out)
        assert m, out
        rounds, joined, sent, received = map(int, m.groups())
        assert rounds == 12 and joined >= 1 and sent > 0 and received > 0
