"""Settings and flags that passed the checks and then failed late, far from their cause
(in every peer, at the join, or not at all): each is now refused at start, with one line
that names the key, flag or variable. Nothing here starts a process: what would start
one is replaced by a stand-in that fails the test if it is reached."""

from __future__ import annotations

import pytest

from swarm import cli, wire
from swarm.config import load_config
from swarm.errors import ConfigError, SwarmError
from swarm.experiment.spec import load_spec


class Started(Exception):
    """Raised by the stand-ins: the command went on to start something (not a SwarmError,
    so that it is not taken for a refusal)."""


@pytest.fixture
def nothing_starts(monkeypatch):
    """Every command's start replaced by a stand-in that raises Started; no coordinator
    address nor rank from the environment."""
    import swarm.coordinator
    import swarm.experiment.launch
    import swarm.experiment.runner
    import swarm.peer

    def started(*args, **kwargs):
        raise Started(args)

    for module, name in ((swarm.coordinator, "Coordinator"), (swarm.peer, "Peer"),
                         (swarm.experiment.launch, "run_experiment"), (swarm.experiment.runner, "run_peer"),
                         (cli, "query_status")):
        monkeypatch.setattr(module, name, started)
    for key in ("SWARM_COORDINATOR", "MASTER_ADDR", "SWARM_COORDINATOR_PORT", "SWARM_RANK", "SLURM_PROCID",
                "RANK", "TORCHELASTIC_RUN_ID", "SWARM_PARENT_PID"):
        monkeypatch.delenv(key, raising=False)


def refused(capsys, argv: list[str]) -> str:
    """The one error line of ``swarm ARGV``, which must exit 2 before starting anything."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("swarm: error: "), err
    return err[0]


# ------------------------------------------------------------ 1. buffer.rate

@pytest.mark.parametrize("rate", ["0.5", "0.001", "0.999"])
def test_a_buffer_rate_below_one_transition_a_second_is_refused(rate):
    # the token bucket's burst is one second of rate and must hold a whole item:
    # every peer died at start with "burst must be >= 1 item"
    with pytest.raises(ConfigError, match=rf"^buffer\.rate = {rate}: must be 0 \(unbounded\) or >= 1"):
        load_spec(None, [f"buffer.rate={rate}"])


@pytest.mark.parametrize("rate", ["0", "1", "2.5"])
def test_a_buffer_rate_of_0_or_at_least_1_loads(rate):
    assert load_spec(None, [f"buffer.rate={rate}"]).buffer.rate == float(rate)


def test_the_rate_a_spec_allows_makes_a_token_bucket():
    from swarm.buffer.limiter import TokenBucket

    assert TokenBucket(load_spec(None, ["buffer.rate=1"]).buffer.rate).burst == 1


# ------------------------------------------------------------ 2. dqn.hidden

def test_a_hidden_width_beyond_the_bound_is_refused():
    # a 2**40 width passed, and every peer then failed to allocate 17 TB
    with pytest.raises(ConfigError, match=r"^dqn\.hidden = \[64, 1099511627776\]: .* widths, each at most 65536"):
        load_spec(None, ["dqn.hidden=[64, 1099511627776]"])
    assert load_spec(None, ["dqn.hidden=[65536]"]).dqn.hidden == [65536]


# ------------------------------------------------------------ 3. MASTER_ADDR

@pytest.mark.parametrize("host", ["bad host", "a/b", "a,b", "*", "0.0.0.0", "0", "-x"])
def test_a_master_addr_that_cannot_be_dialled_is_refused(host):
    with pytest.raises(SwarmError, match=rf"^MASTER_ADDR={host!r}"):
        cli.env_coordinator({"MASTER_ADDR": host})


def test_a_good_master_addr_still_gives_its_address():
    assert cli.env_coordinator({"MASTER_ADDR": "node-1.cluster"}) == ["tcp://node-1.cluster:5555"]


# ------------------------------------------------------------ 4. SWARM_COORDINATOR

@pytest.mark.parametrize("value, why", [
    (",", "no address in it"),
    (" ", "no address in it"),
    ("tcp://a:1,,tcp://b:1", "an empty entry"),
    ("tcp://a:1,", "an empty entry"),
    ("tcp://a:1, tcp://a:1", "'tcp://a:1' is listed twice"),
])
def test_swarm_coordinator_with_an_empty_entry_or_a_duplicate_is_refused(value, why):
    # "," gave no address, and then "no coordinator: ... or set SWARM_COORDINATOR" although
    # it was set (and a MASTER_ADDR also set was ignored in silence)
    with pytest.raises(SwarmError, match=rf"^SWARM_COORDINATOR={value!r}: {why}"):
        cli.env_coordinator({"SWARM_COORDINATOR": value, "MASTER_ADDR": "10.0.0.1"})


def test_swarm_coordinator_lists_still_load():
    assert cli.env_coordinator({"SWARM_COORDINATOR": "tcp://a:1, tcp://b:2"}) == ["tcp://a:1", "tcp://b:2"]
    assert cli.env_coordinator({"SWARM_COORDINATOR": "", "MASTER_ADDR": "h"}) == ["tcp://h:5555"]


# ------------------------------------------------------------ 5. deep nesting, suffix case

@pytest.mark.parametrize("suffix, text", [(".json", "[" * 100_000), (".toml", "a = " + "[" * 100_000)])
def test_a_file_nested_too_deeply_is_a_config_error(tmp_path, suffix, text):
    f = tmp_path / f"deep{suffix}"
    f.write_text(text)
    with pytest.raises(ConfigError, match=f"{f}: nested too deeply"):
        load_config(f)


def test_a_set_value_nested_too_deeply_is_a_config_error(nothing_starts, capsys):
    line = refused(capsys, ["coordinator", "--set", "x=" + "[" * 5000])
    assert line.startswith("swarm: error: --set x: the value is nested too deeply"), line[:200]


def test_a_json_file_with_an_upper_case_suffix_is_read_as_json(tmp_path):
    f = tmp_path / "s.JSON"
    f.write_text('{"peers": 2}')
    assert load_spec(f).peers == 2


# ------------------------------------------------------------ 6. empty values

@pytest.mark.parametrize("argv, flag", [
    (["run", ""], "SPEC"),
    (["run", "--resume", ""], "--resume"),
    (["keys", "generate", ""], "DIR"),
    (["coordinator", "--config", ""], "--config"),
    (["coordinator", "--bind", ""], "--bind"),
    (["coordinator", "--others", ""], "--others"),
    (["peer", "--coordinator", "tcp://127.0.0.1:5555", "--bind", ""], "--bind"),
    (["peer", "--coordinator", "tcp://127.0.0.1:5555", "--id", ""], "--id"),
    (["peer", "--coordinator", "tcp://127.0.0.1:5555", "--id", " "], "--id"),
    (["peer", "--coordinator", "tcp://127.0.0.1:5555", "--spec", ""], "--spec"),
    (["peer", "--coordinator", "tcp://127.0.0.1:5555", "--config", ""], "--config"),
    (["peer", "--coordinator", ""], "--coordinator"),
    (["status", "--coordinator", ""], "--coordinator"),
])
def test_an_empty_value_is_refused_not_taken_as_left_out(nothing_starts, capsys, tmp_path, monkeypatch,
                                                          argv, flag):
    # `swarm run "$SPEC"` with SPEC unset ran the built-in default; `swarm keys generate ""`
    # wrote keys into the current folder
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, argv)
    assert line.startswith(f"swarm: error: {flag} {argv[-1]!r} is empty"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("load", [load_config, load_spec])
def test_an_empty_path_is_refused_by_the_loaders(load):
    with pytest.raises(ConfigError, match="empty"):
        load("")


# ------------------------------------------------------------ 7. coordinator and status addresses

@pytest.mark.parametrize("others", ["tcp://127.0.0.1:0", "tcp://[::1]:5555", "tcp://0.0.0.0:5555",
                                    "tcp://a:1,tcp://a:1"])
def test_a_coordinator_refuses_the_others_a_peer_would_refuse(nothing_starts, capsys, others):
    # it started and watched nothing
    assert f"--others {others!r}: " in refused(capsys, ["coordinator", "--others", others])


def test_a_coordinator_refuses_bad_others_from_its_config(nothing_starts, capsys):
    line = refused(capsys, ["coordinator", "--set", "coordinator.others=['tcp://127.0.0.1:0']"])
    assert "coordinator.others = ['tcp://127.0.0.1:0']: " in line, line


def test_status_refuses_an_address_a_peer_would_refuse(nothing_starts, capsys):
    # it waited out its timeout, then suggested a --keys problem
    line = refused(capsys, ["status", "--coordinator", "tcp://127.0.0.1:0"])
    assert "--coordinator 'tcp://127.0.0.1:0': 'tcp://127.0.0.1:0' is not tcp://HOST:PORT" in line, line


# ------------------------------------------------------------ 8. peer id and rank bounds

def test_the_id_bound_is_the_wire_bound():
    from swarm.config import MAX_PEER_ID

    assert MAX_PEER_ID == wire.MAX_SRC_LEN


def test_peer_id_and_rank_are_bounded_in_the_config():
    from swarm.config import MAX_PEER_ID, MAX_RANK

    with pytest.raises(ConfigError, match=rf"^peer\.id = 'aaaa.*: must be at most {MAX_PEER_ID} characters"):
        load_config(None, [f"peer.id={'a' * (MAX_PEER_ID + 1)}"])
    with pytest.raises(ConfigError, match=rf"^peer\.rank = {MAX_RANK + 1}: must be in -1\.\.{MAX_RANK}"):
        load_config(None, [f"peer.rank={MAX_RANK + 1}"])
    cfg = load_config(None, [f"peer.id={'a' * MAX_PEER_ID}", f"peer.rank={MAX_RANK}"]).peer
    assert len(cfg.id) == MAX_PEER_ID and cfg.rank == MAX_RANK


@pytest.mark.parametrize("argv, env, key", [
    (["--id", "a" * 300], {}, "peer.id = "),
    (["--replace", "a" * 300], {}, "peer.id = "),
    (["--rank", str(10**30)], {}, "peer.rank = "),
    # the variable that gave it, which is what the user set (docs/multihost.md)
    ([], {"SWARM_RANK": str(2**31)}, f"SWARM_RANK='{2**31}' is out of range: a rank (peer.rank) is in 0.."),
])
def test_a_peer_checks_its_id_and_rank_from_flags_and_variables(nothing_starts, capsys, monkeypatch,
                                                                argv, env, key):
    # they failed only at the join, with messages that named neither
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = refused(capsys, ["peer", "--coordinator", "tcp://127.0.0.1:5555", *argv])
    assert line.startswith(f"swarm: error: {key}"), line[:200]
