"""Public APIs given arguments of the wrong type or range (review 48, API fuzzing): each
is refused at the entry with an error that names the argument, or, for numpy's numbers,
taken as the Python number it stands for."""

import asyncio
import dataclasses
import json
import math
import tomllib

import numpy as np
import pytest
import torch

from swarm import Peer
from swarm.buffer import RateLimiter
from swarm.compress import CODECS, MAX_N, get_codec, split_ef
from swarm.config import PeerConfig, apply_overrides, from_dict, to_dict, to_toml
from swarm.coordinator import MemberTable
from swarm.errors import ConfigError, MembershipError, ReplayError, WireError
from swarm.experiment import load_spec
from swarm.experiment.spec import DEFAULT_SPEC
from swarm.link import View
from swarm.rl import QNetwork
from swarm.rl.train import evaluate, run_agent

# -- 1. numpy scalars in config and spec fields


def test_a_spec_changed_in_code_takes_numpy_ints_as_plain_ints():
    # a sweep over np.arange(...) seeds: "seed: expected an integer, got np.int64(0)"
    spec = load_spec(dataclasses.replace(DEFAULT_SPEC, seed=np.int64(3), peers=np.int64(2)))
    assert type(spec.seed) is int and spec.seed == 3
    assert type(spec.peers) is int and spec.peers == 2
    json.dumps(to_dict(spec))   # config.json stays plain


def test_config_fields_take_numpy_numbers_as_plain_python_ones():
    cfg = from_dict(PeerConfig, {"heartbeat_s": np.float32(0.5), "data_hwm": np.int64(8),
                                 "max_message_mb": np.uint16(4)})
    assert (type(cfg.heartbeat_s), type(cfg.data_hwm), type(cfg.max_message_mb)) == (float, int, int)
    assert (cfg.heartbeat_s, cfg.data_hwm, cfg.max_message_mb) == (0.5, 8, 4)
    back = tomllib.loads(to_toml(cfg))
    assert (back["heartbeat_s"], back["data_hwm"]) == (0.5, 8)


@pytest.mark.parametrize("value", [np.bool_(True), True, np.float64(8.0), "8"])
def test_an_int_field_still_refuses_what_is_not_an_integer(value):
    with pytest.raises(ConfigError, match="data_hwm: expected an integer"):
        from_dict(PeerConfig, {"data_hwm": value})


@pytest.mark.parametrize("value", [np.bool_(False), np.float32("nan")])
def test_a_float_field_still_refuses_bools_and_nan(value):
    with pytest.raises(ConfigError, match="heartbeat_s"):
        from_dict(PeerConfig, {"heartbeat_s": value})


def test_peer_keywords_take_numpy_numbers():
    async def make():
        return Peer(heartbeat_s=np.float32(0.5), data_hwm=np.int64(16), coordinators=["tcp://127.0.0.1:1"])

    peer = asyncio.run(make())   # built, never started: no sockets to close
    assert type(peer.config.heartbeat_s) is float and peer.config.heartbeat_s == 0.5
    assert type(peer.config.data_hwm) is int and peer.config.data_hwm == 16


# -- 4. Codec.ratio(n)

BAD_N = [-1, 2.5, True, math.inf, b"ab", MAX_N + 1, None, "1000", np.float64(1000.0)]


@pytest.mark.parametrize("family", sorted(CODECS))
@pytest.mark.parametrize("ef", ["", "ef+"])
def test_ratio_refuses_an_n_that_is_no_vector_length(family, ef):
    spec = family + (":0.1" if family in ("topk", "randomk") else "")
    codec = get_codec(ef + spec)
    for n in BAD_N:
        # was 0.67 for -1, 2.0 for 2.5, an OverflowError for inf, a 59.5 GiB array of b"..."'s shape
        with pytest.raises(ConfigError, match=r"ratio's n must be an int in \[0, "):
            codec.ratio(n)
    # a numpy integer is a length: np.uint8(255) overflowed TopK's uint8 arithmetic
    assert codec.ratio(np.uint8(255)) == codec.ratio(255)
    assert codec.ratio(np.int64(1000)) == codec.ratio(1000)


# -- 6. Codec.decode(enc, n)


@pytest.mark.parametrize("spec", ["int8", "identity", "topk:0.5", "ef+topk:0.5"])
def test_decode_blames_a_bad_n_on_the_caller_not_the_payload(spec):
    codec = get_codec(spec)
    enc = codec.encode(np.ones(8, np.float32))
    for n in ["8", 8.0, torch.tensor([8, 8]), -1, True]:
        # "8": "WireError: payload is for n=8, expected n=8"; a tensor: RuntimeError
        with pytest.raises(ConfigError, match="decode's n must be an int >= 0 or None") as e:
            codec.decode(enc, n)
        assert not isinstance(e.value, WireError)
    assert codec.decode(enc, np.int64(8)).shape == (8,)
    assert codec.decode(enc, None).shape == (8,)
    with pytest.raises(WireError, match="payload is for n=8, expected n=9"):   # the payload's fault
        codec.decode(enc, 9)


# -- 5. MemberTable.join


def _state(t):
    return ([(m.id, m.addr, m.rank, m.incarnation, m.route, m.state, m.key) for m in t.members.values()],
            t.view_bytes, t.epoch)


@pytest.mark.parametrize("args, kw, match", [
    ((None, "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),
    ((1.5, "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),
    ((b"b", "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),
    (((), "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),
    ((2**70, "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),   # was msgpack's OverflowError
    (("", "tcp://127.0.0.1:2", 1, 1), {}, "peer_id must be a non-empty str"),
    (("b", None, 1, 1), {}, "addr and key must be strs"),
    (("b", "tcp://127.0.0.1:2", 1, 1), {"key": None}, "addr and key must be strs"),
    (("b", "tcp://127.0.0.1:2", 0.5, 1), {}, "rank, incarnation and last_epoch must be ints"),
    (("b", "tcp://127.0.0.1:2", math.nan, 1), {}, "rank, incarnation and last_epoch must be ints"),
    (("b", "tcp://127.0.0.1:2", True, 1), {}, "rank, incarnation and last_epoch must be ints"),
    (("b", "tcp://127.0.0.1:2", 1, "inc"), {}, "rank, incarnation and last_epoch must be ints"),
    (("b", "tcp://127.0.0.1:2", 1, 1), {"last_epoch": 9.5}, "rank, incarnation and last_epoch must be ints"),
])
def test_a_join_with_a_bad_argument_is_refused_and_changes_nothing(args, kw, match):
    t = MemberTable(0)
    t.join("a", "tcp://127.0.0.1:1", 0, 1, b"r1")
    t.publish()
    before = _state(t)
    with pytest.raises(MembershipError, match=match):
        t.join(*args, b"r2", **kw)
    assert _state(t) == before
    # the next view is the one before, and one every peer takes in (a bad member in it
    # made View.from_wire refuse it whole)
    view = t.publish()
    assert View.from_wire(view.to_wire()).members == view.members
    assert [m.id for m in view.members] == ["a"] and view.epoch == before[2] + 1


def test_a_join_with_numpy_ints_publishes_a_view_peers_take():
    t = MemberTable(0)
    t.join("a", "tcp://127.0.0.1:1", np.int64(0), np.int64(1), b"r1", last_epoch=np.int32(3))
    t.join("b", "tcp://127.0.0.1:2", np.int64(-1), np.uint32(1), b"r2")
    view = View.from_wire(t.publish().to_wire())
    assert [(m.id, m.rank) for m in view.members] == [("a", 0), ("b", 1)]
    assert all(type(m.rank) is int and type(m.incarnation) is int for m in t.members.values())


# -- 7. RateLimiter.from_state


@pytest.mark.parametrize("state, match", [
    ({}, "min_size"),
    ({"min_size": 1}, "samples_per_insert"),
    ({"min_size": 1, "samples_per_insert": None, "tolerance": 1.0, "inserted": 0}, "'sampled'"),
    ([], "must be a dict.*got list"),
    (None, "must be a dict.*got NoneType"),
])
def test_limiter_from_state_names_what_is_missing(state, match):
    with pytest.raises(ReplayError, match=match):
        RateLimiter.from_state(state)


def test_limiter_from_state_still_takes_its_own_state():
    r = RateLimiter(4, 2.0, 8.0)
    r.inserted, r.sampled = 10, 3
    assert RateLimiter.from_state(r.state()).state() == r.state()


# -- 8. split_ef


@pytest.mark.parametrize("spec", [None, 1, 1.5, b"ef+topk", ["ef+topk"], {"ef": 1}, np.int64(1)])
def test_split_ef_refuses_what_is_not_a_spec(spec):
    with pytest.raises(ConfigError, match="codec spec must be a string"):
        split_ef(spec)


# -- 9. public helpers given the wrong kind of container or object


class _Net:
    pass


WRONG = [None, 5, "x"]
#: (call with the value, the argument's name, the wrong values: 5 is a width QNetwork takes)
CASES = {
    "apply_overrides data": (lambda v: apply_overrides(v, ["peer.heartbeat_s=0.1"]), "data", WRONG),
    "to_toml derived": (lambda v: to_toml(PeerConfig(), derived=v), "derived", [["x"], 5, "x"]),   # None: none
    "to_toml obj": (lambda v: to_toml(v), "obj", WRONG),
    "Spec.validate env": (lambda v: dataclasses.replace(load_spec(), env=v).validate(), "env", WRONG),
    "evaluate agent": (lambda v: evaluate("CartPole-v1", v), "agent", WRONG),
    "run_agent agent": (lambda v: run_agent("CartPole-v1", v, 5), "agent", WRONG),
    "QNetwork obs_dim": (lambda v: QNetwork(v, 2, [8]), "obs_dim", [None, -5, "x"]),
    "QNetwork n_actions": (lambda v: QNetwork(4, v, [8]), "n_actions", [None, -5, "x"]),
    "QNetwork hidden": (lambda v: QNetwork(4, 2, v), "hidden", WRONG),
}


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_public_helper_names_the_argument_of_the_wrong_type(case, which):
    call, name, values = CASES[case]
    with pytest.raises((ConfigError, TypeError, ReplayError)) as e:
        call(values[which])
    assert name in str(e.value)


def test_qnetwork_refuses_a_negative_width_before_torch_does():
    # was torch's "Trying to create tensor with negative dimension -1"
    with pytest.raises(ConfigError, match="obs_dim and n_actions must be ints >= 1"):
        QNetwork(-1, 2, [8])
    with pytest.raises(ConfigError, match="hidden must be a list of layer widths"):
        QNetwork(4, 2, [8, 0])
    assert QNetwork(np.int64(4), 2, [np.int64(8)])(torch.zeros(3, 4)).shape == (3, 2)


# ------------------------------------------------------------ Gossip's numbers, suggested_gamma, Snapshot


def test_gossip_takes_numpy_numbers_for_its_settings_as_python_ones():
    from swarm.gossip import Gossip
    from swarm.gossip.sim import SimHub

    link = SimHub(topology="ring").add_many(3)[0]
    g = Gossip(link, np.zeros(10, np.float32), gamma=np.float32(0.5), max_staleness=np.int64(2),
               round_timeout=np.float32(1.0), send_timeout=np.float16(1), sync="bounded")
    try:
        assert (g.gamma, g.max_staleness, g.round_timeout, g.send_timeout) == (0.5, 2, 1.0, 1.0)
        assert [type(v) for v in (g.gamma, g.max_staleness, g.round_timeout, g.send_timeout)] == \
            [float, int, float, float]
    finally:
        g.close()
    for kw, what in ((dict(gamma=np.bool_(True)), "gamma"), (dict(max_staleness=True), "max_staleness"),
                     (dict(max_staleness=np.float64(2.0)), "max_staleness"), (dict(gamma="fast"), "gamma")):
        with pytest.raises(ConfigError, match=what):
            Gossip(link, np.zeros(10, np.float32), **kw)


@pytest.mark.parametrize(("lr", "mu", "what"), [(0, 0.9, "outer_lr"), (-1.0, 0.9, "outer_lr"),
                                                (math.nan, 0.9, "outer_lr"), (math.inf, 0.9, "outer_lr"),
                                                (0.7, 2.0, "outer_momentum"), (0.7, math.nan, "outer_momentum"),
                                                (0.7, True, "outer_momentum")])
def test_suggested_gamma_names_a_bad_outer_setting(lr, mu, what):
    from swarm.gossip import suggested_gamma

    with pytest.raises(ConfigError, match=what):
        suggested_gamma("topk:0.1", lr, mu)
    assert 0 < suggested_gamma("topk:0.1", np.float32(0.7), np.float64(0.9)) <= 1


def test_a_snapshot_of_what_is_no_buffer_is_refused(tmp_path):
    from swarm.buffer import Snapshot

    with pytest.raises(ReplayError, match="buf must be a ReplayBuffer, got NoneType"):
        Snapshot(None, tmp_path / "snap")
    assert not (tmp_path / "snap").exists()


def test_a_spec_changed_in_code_with_numpy_numbers_is_written_as_python_ones(tmp_path):
    # to_toml wrote `step_size = np.float64(0.25)` (no TOML), save_resolved raised a bare
    # TypeError for np.int64 (own-diff review)
    from swarm.experiment.spec import save_resolved

    spec = load_spec(None, ["peers=2"])
    spec.gossip.step_size = np.float64(0.25)
    spec.seed = np.int64(3)
    spec.dqn.hidden = [np.int64(32), 32]
    spec.validate()
    text = to_toml(spec)
    back = tomllib.loads(text)
    assert back["gossip"]["step_size"] == 0.25 and back["seed"] == 3 and back["dqn"]["hidden"] == [32, 32]
    saved = json.loads(save_resolved(spec, tmp_path).read_text())
    assert (saved["gossip"]["step_size"], saved["seed"], saved["dqn"]["hidden"]) == (0.25, 3, [32, 32])
    assert load_spec(tmp_path / "config.json").seed == 3
