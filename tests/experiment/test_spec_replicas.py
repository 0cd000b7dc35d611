"""buffer.replicas against the topology: a peer replicates to its own neighbours only."""

import pytest

from swarm.errors import ConfigError
from swarm.experiment.spec import load_spec

ID = ["gossip.codec=identity"]


@pytest.mark.parametrize("overrides, rank, degree", [
    (["buffer.replicas=3"], 0, 2),                                              # ring of 4: 2 each
    (["peers=9", "gossip.topology=grid", "buffer.replicas=3"], 0, 2),           # a corner of 3x3
    (["peers=5", "gossip.topology=grid", "buffer.replicas=2"], 2, 1),           # 3+2: rank 2 has only 1
    (["peers=3", "gossip.topology=custom", "gossip.edges=[[0, 1], [1, 2]]", "buffer.replicas=2"], 0, 1),
    (["peers=5", "gossip.topology=random_pairing", "buffer.replicas=1"], None, 0),   # one sits out
])
def test_replicas_beyond_a_peers_neighbours_are_refused_naming_the_key_and_the_count(overrides, rank, degree):
    with pytest.raises(ConfigError) as info:
        load_spec(None, ID + overrides)
    msg = str(info.value)
    assert msg.startswith("buffer.replicas = ") and f"has {degree} neighbour" in msg, msg
    if rank is not None:
        assert f"rank {rank} " in msg, msg


@pytest.mark.parametrize("overrides", [
    ["buffer.replicas=2"],                                                      # ring of 4
    ["peers=9", "gossip.topology=grid", "buffer.replicas=2"],
    ["peers=8", "gossip.topology=hypercube", "buffer.replicas=3"],
    ["peers=4", "gossip.topology=full", "buffer.replicas=3"],
    ["buffer.sharing=false", "buffer.replicas=3"],                              # no federation: unused
])
def test_replicas_within_every_peers_neighbours_load(overrides):
    load_spec(None, ID + overrides)


def test_the_replication_waits_are_spec_keys_checked_together():
    spec = load_spec(None, ["buffer.replicas=1", "buffer.ack_timeout_s=5", "buffer.ack_timeout_max_s=60"])
    assert (spec.buffer.ack_timeout_s, spec.buffer.ack_timeout_max_s) == (5.0, 60.0)
    with pytest.raises(ConfigError, match=r"buffer.ack_timeout_max_s = 1 is below buffer.ack_timeout_s = 5"):
        load_spec(None, ["buffer.ack_timeout_s=5", "buffer.ack_timeout_max_s=1"])
    with pytest.raises(ConfigError, match=r"buffer.ack_timeout_s"):
        load_spec(None, ["buffer.ack_timeout_s=0"])
