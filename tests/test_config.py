"""Config loading: every error names the key and the value."""

from __future__ import annotations

import json
import math

import pytest

from swarm.cli import _env_rank, env_coordinator
from swarm.config import PeerConfig, load_config
from swarm.errors import ConfigError, SwarmError


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[peer]\ntopology = "grid"\nheartbeat_s = 0.1\n')
    cfg = load_config(f, ["peer.rank=3", "coordinator.probe_timeout_s=0.5"])
    assert cfg.peer.topology == "grid" and cfg.peer.heartbeat_s == 0.1 and cfg.peer.rank == 3
    assert cfg.coordinator.probe_timeout_s == 0.5
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"peer": {"coordinators": ["tcp://h:1"]}}))
    assert load_config(j).peer.coordinators == ["tcp://h:1"]


@pytest.mark.parametrize("override,match", [
    (["peer.heartbeat_s=-1"], r"peer\.heartbeat_s = -1: must be > 0"),
    (["peer.heartbeat_s=fast"], r"peer\.heartbeat_s: expected a number, got 'fast'"),
    (["peer.bogus=1"], r"unknown key peer\.bogus"),
    (["nope.x=1"], r"unknown key nope"),
    (["peer.rank=1.5"], r"peer\.rank: expected an integer"),
    (["peer.coordinators=5"], r"peer\.coordinators: expected a list"),
    (["peer"], r"expected KEY=VALUE"),
    (["peer.topology=foo"], r"peer\.topology = 'foo': unknown; choose one of ring"),
    (["peer.topology=custom"], r"peer\.edges: topology = custom needs an edge list"),
    (["peer.edges=[[0, 1]]"], r"peer\.edges is only used with topology = custom"),
    (["peer.topology=custom", "peer.edges=[[1, 1]]"], r"peer\.edges: \[1, 1\] is not a pair of two different"),
])
def test_errors_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, override)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("peer = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    yaml = tmp_path / "s.yaml"
    yaml.write_text("peer:\n  rank: 1\n")
    with pytest.raises(ConfigError, match=r"s\.yaml: a \.yaml file; settings files are TOML"):
        load_config(yaml)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"bin\.toml: not a text file \(byte 0 is not UTF-8\)"):
        load_config(binary)


def test_launcher_environment():
    assert env_coordinator({"SWARM_COORDINATOR": "tcp://a:1, tcp://b:2"}) == ["tcp://a:1", "tcp://b:2"]
    assert env_coordinator({"MASTER_ADDR": "10.0.0.1"}) == ["tcp://10.0.0.1:5555"]
    assert env_coordinator({}) == []
    assert _env_rank({"SWARM_RANK": "4", "RANK": "1"}) == ("SWARM_RANK='4'", 4)
    assert _env_rank({"SLURM_PROCID": "2"}) == ("SLURM_PROCID='2'", 2)
    assert _env_rank({"RANK": "7"}) == ("RANK='7'", 7)
    assert _env_rank({}) is None
    with pytest.raises(SwarmError, match="SWARM_RANK='x'"):
        _env_rank({"SWARM_RANK": "x"})


def test_a_torchrun_worker_under_srun_takes_rank_not_slurm_procid():
    # `srun torchrun ...`: every worker of a node inherits its srun task's SLURM_PROCID;
    # all of them asked for rank 0 and all but one were refused
    worker = {"SLURM_PROCID": "0", "RANK": "3", "LOCAL_RANK": "3", "TORCHELASTIC_RUN_ID": "none"}
    assert _env_rank(worker) == ("RANK='3'", 3)
    assert _env_rank({**worker, "SWARM_RANK": "5"}) == ("SWARM_RANK='5'", 5)           # SWARM_RANK still first
    assert _env_rank({"SLURM_PROCID": "1", "RANK": "3"}) == ("SLURM_PROCID='1'", 1)    # not a torchrun worker: Slurm's
    with pytest.raises(SwarmError, match="RANK=-1 must be >= 0"):
        _env_rank({**worker, "RANK": "-1"})


def test_peer_config_is_a_dataclass_with_help():
    import dataclasses
    for f in dataclasses.fields(PeerConfig):
        assert f.metadata.get("help"), f.name


def test_to_toml_round_trips_with_help_comments(tmp_path):
    from swarm.config import SwarmConfig, to_toml

    cfg = load_config(None, ["peer.topology=grid", "peer.coordinators=['tcp://127.0.0.1:5555']"])
    text = to_toml(cfg)
    f = tmp_path / "swarm.toml"
    f.write_text(text)
    assert load_config(f) == cfg != SwarmConfig()
    assert "[peer]\n" in text and "# neighbour topology for links" in text
    assert all(len(line) <= 88 for line in text.splitlines() if line.startswith("#"))


def test_peer_keyword_settings_get_the_same_checks():
    from swarm import Peer

    for kw, match in [({"topology": "foo"}, r"peer\.topology = 'foo'"), ({"rank": -5}, r"peer\.rank = -5"),
                      ({"heartbeat_s": 0.0}, r"peer\.heartbeat_s = 0\.0: must be > 0")]:
        with pytest.raises(ConfigError, match=match):
            Peer(coordinators=["tcp://127.0.0.1:5555"], **kw)

    p = Peer(coordinators=["tcp://127.0.0.1:5555"], topology="custom", edges=[[0, 1], [1, 2]])
    assert p.config.edges == [[0, 1], [1, 2]]


@pytest.mark.parametrize("override,match", [
    # libzmq's own bounds: past them setsockopt failed when the first socket was made
    ("peer.data_hwm=2147483648", r"peer\.data_hwm = 2147483648: must be in 1\.\.2147483647"),
    ("peer.max_message_mb=1048577", r"peer\.max_message_mb = 1048577: must be in 1\.\.1048576 \(1 TiB\)"),
    ("peer.max_message_mb=10000000000000", r"peer\.max_message_mb = 10000000000000: must be in 1\.\.1048576"),
    ("peer.link_timeout_s=6554", r"peer\.link_timeout_s = 6554: must be in 0\.001\.\.6553 s"),
    ("peer.link_heartbeat_s=1e7", r"peer\.link_heartbeat_s = 10000000\.0: must be in 0\.001\.\.6553 s"),
    ("coordinator.zmtp_timeout_s=6554", r"coordinator\.zmtp_timeout_s = 6554: must be in 0\.001\.\.6553 s"),
    ("coordinator.zmtp_heartbeat_s=6554", r"coordinator\.zmtp_heartbeat_s = 6554: must be in 0\.001\.\.6553 s"),
])
def test_settings_that_become_socket_options_have_libzmqs_bounds(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])
    # the largest value allowed is taken
    key, value = override.split("=")
    largest = {"data_hwm": "2147483647", "max_message_mb": "1048576"}.get(key.split(".")[1], "6553")
    cfg = load_config(None, [f"{key}={largest}"])
    assert getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1]) == int(largest)


def test_peer_keyword_settings_get_libzmqs_bounds():
    from swarm import Peer

    for kw, match in [({"data_hwm": 2**31}, r"peer\.data_hwm = 2147483648: must be in 1\.\.2147483647"),
                      ({"max_message_mb": 10**13}, r"peer\.max_message_mb = 10000000000000: must be in 1\.\.1048576"),
                      ({"link_timeout_s": 7000.0}, r"peer\.link_timeout_s = 7000\.0: must be in 0\.001\.\.6553 s")]:
        with pytest.raises(ConfigError, match=match):
            Peer(coordinators=["tcp://127.0.0.1:5555"], **kw)


@pytest.mark.parametrize("override", ["peer.link_heartbeat_s=0.0004", "coordinator.zmtp_timeout_s=0.0009"])
def test_a_zmtp_heartbeat_below_a_millisecond_is_refused_not_turned_off(override):
    # libzmq counts milliseconds: 0.4 ms became 0, which turns heartbeats off in silence
    with pytest.raises(ConfigError, match=r"must be in 0\.001\.\.6553 s"):
        load_config(None, [override])


@pytest.mark.parametrize("kw,match", [({"tick_s": math.nan}, r"coordinator\.tick_s: must be finite"),
                                      ({"max_members": 0}, r"coordinator\.max_members = 0: must be in 1\.\.100000"),
                                      ({"zmtp_timeout_s": 7000}, r"coordinator\.zmtp_timeout_s = 7000: must be in")])
def test_coordinator_keyword_settings_get_the_same_checks(kw, match):
    # Coordinator(**overrides) took any value a config file would have refused
    from swarm import Coordinator

    with pytest.raises(ConfigError, match=match):
        Coordinator(**kw)


@pytest.mark.parametrize("name", ["run-\udcff", "two\nlines", "x" * 201])
def test_a_run_name_the_page_cannot_show_is_refused(name):
    # a lone surrogate (a non-UTF-8 byte in argv) was taken, and every request for the
    # status page and /metrics then failed with a traceback (UnicodeEncodeError)
    from swarm.config import load_config

    with pytest.raises(ConfigError, match="coordinator.run_name"):
        load_config(None, [f"coordinator.run_name={name}"])   # as argv gives it


def test_an_http_port_of_thousands_of_digits_is_a_config_error():
    from swarm.config import load_config

    with pytest.raises(ConfigError, match="coordinator.http_bind"):
        load_config(None, [f'coordinator.http_bind="127.0.0.1:{"9" * 5000}"'])


_R = 2147483647   # MAX_RANK


@pytest.mark.parametrize("at, key, value, past, match", [
    ("coordinator.zmtp_heartbeat_s=0.001", "coordinator.zmtp_heartbeat_s", 0.001,
     "coordinator.zmtp_heartbeat_s=0.0009", r"^coordinator\.zmtp_heartbeat_s = 0\.0009: must be in 0\.001\.\.6553 s"),
    ("coordinator.http_bind='127.0.0.1:65535'", "coordinator.http_bind", "127.0.0.1:65535",
     "coordinator.http_bind='127.0.0.1:65536'", r"^coordinator\.http_bind = '127\.0\.0\.1:65536': must be HOST:PORT"),
    ("coordinator.max_members=100000", "coordinator.max_members", 100000,
     "coordinator.max_members=100001", r"^coordinator\.max_members = 100001: must be in 1\.\.100000$"),
    (f"peer.rank={_R}", "peer.rank", _R, f"peer.rank={_R + 1}", rf"^peer\.rank = {_R + 1}: must be in -1\.\.{_R}$"),
    (f"peer.edges=[[0, {_R}]]", "peer.edges", [[0, _R]], f"peer.edges=[[0, {_R + 1}]]",
     rf"^peer\.edges: \[0, {_R + 1}\] names a position past the largest; positions are at most {_R}$"),
    ("peer.id=" + "p" * 256, "peer.id", "p" * 256, "peer.id=" + "p" * 257,
     r"^peer\.id = 'p{257}': must be at most 256 characters \(a message's sender id\)"),
    ("coordinator.run_name=" + "r" * 200, "coordinator.run_name", "r" * 200, "coordinator.run_name=" + "r" * 201,
     r"^coordinator\.run_name = 'r{201}': must be at most 200 printable characters$"),
    ("peer.inbox_port=65535", "peer.inbox_port", 65535, "peer.inbox_port=65536",
     r"^peer\.inbox_port = 65536: must be in 0\.\.65535$"),
], ids=["zmtp_heartbeat_s", "http_bind", "max_members", "rank", "edges", "id", "run_name", "inbox_port"])
def test_each_inclusive_limit_is_taken_at_the_limit_and_refused_one_past(at, key, value, past, match):
    # the value an error message calls allowed ("must be in -1..2147483647") must be allowed
    extra = ["peer.topology='custom'"] if key == "peer.edges" else []
    section, name = key.split(".")
    assert getattr(getattr(load_config(None, [at, *extra]), section), name) == value
    with pytest.raises(ConfigError, match=match):
        load_config(None, [past, *extra])
