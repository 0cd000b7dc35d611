"""Command-line input that ended in a Python traceback (exit 1), or was taken for something
else, instead of one `swarm: error:` line (exit 2) that names what was wrong: paths this
user may not look at, integers too long for int(), a reply that is not a status table,
--help to a full disk, and empty values taken for left-out ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import zmq
# the stand-ins for what a command starts, and the one-line refusal (tests/ is on the path)
from test_cli_review import Started, nothing_starts, refused  # noqa: F401 - nothing_starts is a fixture

from swarm import cli, wire
from swarm.config import MAX_RANK, apply_overrides, load_config, read_file
from swarm.errors import ConfigError

BIG = "1" * 4301   # one digit past what int() reads from text


# ------------------------------------------------------------ 1. paths that cannot be looked at

@pytest.fixture
def too_long(tmp_path) -> Path:
    """A path whose last name is longer than a file name may be: every stat of it raises
    ENAMETOOLONG, as one under a folder this user may not enter raises EACCES."""
    return tmp_path / ("x" * 300)


@pytest.mark.parametrize("argv", [["eval", "{p}"], ["eval", "{p}/best.pt"], ["keys", "generate", "{p}"],
                                  ["run", "--resume", "{p}"]])
def test_a_path_that_cannot_be_looked_at_is_an_error_naming_it(too_long, capsys, argv):
    # pathlib's is_dir/exists raise on ENAMETOOLONG and EACCES: a traceback, exit 1
    line = refused(capsys, [a.format(p=too_long) for a in argv])
    assert str(too_long) in line and "File name too long" in line, line[:200]


def test_generate_keys_in_a_path_that_cannot_be_looked_at_is_a_config_error(too_long):
    # the library call raised OSError, not a SwarmError
    from swarm.transport import generate_keys

    with pytest.raises(ConfigError, match=r"^keys: .*xxx.*: File name too long"):
        generate_keys(str(too_long), ["peer"])


def test_resuming_from_a_path_that_cannot_be_looked_at_is_a_config_error(too_long):
    # run_experiment raised OSError, not a SwarmError
    from swarm.experiment.launch import run_experiment

    with pytest.raises(ConfigError, match=r"^resume: .*xxx.*: File name too long"):
        run_experiment(None, resume=str(too_long))


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="needs setpriv to drop root")
@pytest.mark.parametrize("argv", [["eval", "{d}/run"], ["keys", "generate", "{d}/keys"],
                                  ["run", "--resume", "{d}/run"]])
def test_a_folder_this_user_may_not_enter_is_an_error_not_a_traceback(tmp_path, argv):
    # as an ordinary user, paths under a folder it may not enter: PermissionError traceback, exit 1
    locked = tmp_path / "locked"
    (locked / "run" / "peer0").mkdir(parents=True)
    as_user: list[str] = []
    if os.geteuid() == 0:   # root enters anything: run it as nobody, kept out of root's mode-700 folder
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = subprocess.run([*as_user, sys.executable, "-c", "import swarm"], capture_output=True,
                               timeout=60, cwd="/")
        if probe.returncode != 0:   # a checkout (or venv) in a folder only root may enter
            pytest.skip("user nobody cannot run this checkout's Python")
        locked.chmod(0o700)
    else:
        locked.chmod(0o000)
    try:
        p = subprocess.run([*as_user, sys.executable, "-m", "swarm", *[a.format(d=locked) for a in argv]],
                           capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        locked.chmod(0o700)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("swarm: error: ") and f"{locked}" in err[0] \
        and ": Permission denied" in err[0], err


# ------------------------------------------------------------ 2. integers past int()'s limit

def test_an_integer_too_long_for_int_in_a_set_value_is_a_config_error():
    # tomllib raised the ValueError of int(): a traceback
    with pytest.raises(ConfigError, match=r"^--set peer\.rank: .*more than 4300 digits"):
        apply_overrides({}, [f"peer.rank={BIG}"])


@pytest.mark.parametrize("suffix, text", [(".toml", f"[peer]\nrank = {BIG}\n"),
                                          (".json", f'{{"peer": {{"rank": {BIG}}}}}')])
def test_an_integer_too_long_for_int_in_a_file_is_a_config_error(tmp_path, suffix, text):
    # json and tomllib raised the ValueError of int(): a traceback
    path = tmp_path / f"big{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{path}: .*more than 4300 digits"):
        read_file(path)


@pytest.mark.parametrize("env, argv, said", [
    ({"SWARM_RANK": BIG}, ["peer", "--coordinator", "tcp://127.0.0.1:5555"], "SWARM_RANK="),
    ({"SLURM_PROCID": BIG}, ["peer", "--coordinator", "tcp://127.0.0.1:5555"], "SLURM_PROCID="),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": BIG}, ["peer", "--coordinator", "tcp://127.0.0.1:5555",
                                                  "--spec", "{spec}"], "SLURM_NTASKS="),
    ({"MASTER_ADDR": "localhost", "SWARM_COORDINATOR_PORT": BIG}, ["status"], "SWARM_COORDINATOR_PORT="),
    ({"SWARM_PARENT_PID": BIG}, ["coordinator"], "SWARM_PARENT_PID="),
    ({}, ["peer", "--coordinator", "tcp://127.0.0.1:5555", "--set", f"peer.rank={BIG}"], "--set peer.rank"),
    ({}, ["run", "--show", "--set", f"peers={BIG}"], "--set peers"),
    ({}, ["run", "--show", "{big}"], "big.toml"),
])
def test_an_integer_too_long_for_int_is_an_error_naming_where_it_came_from(nothing_starts, capsys, monkeypatch,
                                                                           tmp_path, env, argv, said):
    # each passed an isdigit() check (or none), then int() raised ValueError: a traceback
    spec, big = tmp_path / "spec.toml", tmp_path / "big.toml"
    spec.write_text("peers = 2\n")
    big.write_text(f"peers = {BIG}\n")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = refused(capsys, [a.format(spec=spec, big=big) for a in argv])
    assert said in line, line[:300]


# ------------------------------------------------------------ 3. a reply that is not a status table

def _table(**changes) -> dict:
    row = {"id": "p0", "rank": 0, "state": "alive", "heartbeat_age_s": 0.5, "linked_epoch": 1,
           "addr": "tcp://127.0.0.1:7000", "neighbours": []}
    st = {"coordinator": "tcp://127.0.0.1:5555", "epoch": 1, "uptime_s": 1.0, "view": {"members": [["p0"]]},
          "members": [row], "log": [[1.0, "join", "p0"]]}
    st.update(changes)
    return st


@pytest.fixture
def answering():
    """A ROUTER on loopback that answers every request with ``reply["t"]`` and ``reply["body"]``:
    set them, then point `swarm status` at ``reply["addr"]``."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    reply = {"t": "status_reply", "body": _table(),
             "addr": f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"}
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if router.poll(50):
                ident, *_ = router.recv_multipart()
                router.send_multipart([ident, *wire.encode(reply["t"], "fake", body=reply["body"])])

    t = threading.Thread(target=serve)
    t.start()
    try:
        yield reply
    finally:
        stop.set()
        t.join(10)
        router.close()
        ctx.term()


NOT_TABLES = {
    "empty": ("status_reply", {}),
    "row of an id only": ("status_reply", _table(members=[{"id": 1}])),
    "row without heartbeat_age_s": ("status_reply", _table(members=[
        {k: v for k, v in _table()["members"][0].items() if k != "heartbeat_age_s"}])),
    "a log time past localtime": ("status_reply", _table(log=[[1e300, "join", "p0"]])),
    "uptime as text": ("status_reply", _table(uptime_s="1")),
    "members not a list": ("status_reply", _table(members={"p0": {}})),
    "a row's rank missing": ("status_reply", _table(members=[{**_table()["members"][0], "rank": None}])),
    "bytes in it": ("status_reply", _table(coordinator=b"x")),
    "a log entry cut short": ("status_reply", _table(log=[[1.0, "join"]])),
    "not a status reply": ("welcome", _table()),
}


@pytest.mark.parametrize("extra", [[], ["--json"]])
@pytest.mark.parametrize("case", NOT_TABLES)
def test_status_refuses_a_reply_that_is_not_a_status_table(answering, capsys, case, extra):
    # KeyError 'coordinator', KeyError 'heartbeat_age_s', ValueError of a format, TypeError of
    # json.dumps: tracebacks; a reply of another type was printed as a table
    answering["t"], answering["body"] = NOT_TABLES[case]
    line = refused(capsys, ["status", "--coordinator", answering["addr"], "--timeout", "5", *extra])
    assert "answered with something that is not a status table" in line, line[:300]


def test_status_watch_shows_a_reply_that_is_not_a_status_table(answering, capsys, monkeypatch):
    # --watch ended with KeyError 'members' (a traceback), not the line it shows for any error
    answering["body"] = {}

    def ctrl_c(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", ctrl_c)   # Ctrl-C after the first redraw
    assert cli.main(["status", "--coordinator", answering["addr"], "--timeout", "5", "--watch"]) == 0
    assert "not a status table" in capsys.readouterr().out


def test_status_still_prints_a_status_table(answering, capsys):
    assert cli.main(["status", "--coordinator", answering["addr"], "--timeout", "5"]) == 0
    assert capsys.readouterr().out.startswith("coordinator tcp://127.0.0.1:5555  epoch 1")


# ------------------------------------------------------------ 4. peer.edges

def test_peer_edges_past_the_largest_rank_are_refused():
    # taken, and then refused by the topology once a view came: a peer with no neighbours
    with pytest.raises(ConfigError, match=rf"^peer\.edges: \[0, {2**32}\] .*at most {MAX_RANK}"):
        load_config(None, ["peer.topology=custom", f"peer.edges=[[0, {2**32}]]"])
    assert load_config(None, ["peer.topology=custom", f"peer.edges=[[0, {MAX_RANK}]]"]).peer.edges == [[0, MAX_RANK]]


# ------------------------------------------------------------ 5. --help to a full disk

@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_help_to_a_full_disk_exits_1():
    # argparse swallowed the OSError of --help's output: exit 0, nothing said
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "swarm", "run", "--help"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.startswith("swarm: cannot write to stdout"), p.stderr[-2000:]


# ------------------------------------------------------------ 6. --show's header

def test_show_writes_a_spec_file_that_loads_whatever_the_command_line(capsys, tmp_path):
    # a newline in SPEC or a --set broke out of the header comment: the file did not load
    spec = tmp_path / "a\nb.toml"
    spec.write_text("peers = 3\n")
    assert cli.main(["run", "--show", str(spec), "--set", "dqn.hidden=[64,\n64]"]) == 0
    shown = tmp_path / "shown.toml"
    shown.write_text(capsys.readouterr().out)
    data = tomllib.loads(shown.read_text())
    assert data["peers"] == 3 and data["dqn"]["hidden"] == [64, 64]
    assert json.dumps("dqn.hidden=[64,\n64]") in shown.read_text().splitlines()[0]


# ------------------------------------------------------------ 7. errors that name what was given

def test_a_rank_past_the_largest_from_a_variable_names_the_variable(nothing_starts, capsys, monkeypatch):
    # the error named peer.rank, which the user never set, and not SWARM_RANK
    monkeypatch.setenv("SWARM_RANK", str(MAX_RANK + 1))
    line = refused(capsys, ["peer", "--coordinator", "tcp://127.0.0.1:5555"])
    assert line.startswith(f"swarm: error: SWARM_RANK='{MAX_RANK + 1}' "), line
    assert line.endswith(f"a rank (peer.rank) is in 0..{MAX_RANK}"), line


@pytest.mark.parametrize("value", ["2024-06-01", "12:30:00", "2024-06-01T12:30:00"])
def test_a_date_or_time_given_for_text_says_to_quote_it(value):
    # "expected a string, got datetime.date(2024, 6, 1)" without the hint a number gets
    with pytest.raises(ConfigError, match=r"expected a string, got datetime\..*; quote it to give it as text"):
        load_config(None, [f"coordinator.run_name={value}"])


# ------------------------------------------------------------ 8. empty values

def test_eval_of_an_empty_path_is_refused(capsys, monkeypatch, tmp_path):
    # Path("") is ".": `swarm eval "$RUN"` with RUN unset played the policies in the current folder
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, ["eval", ""])
    assert "PATH '' is empty" in line, line


@pytest.mark.parametrize("names", ["", " ", ","])
def test_keys_generate_with_empty_names_is_refused(capsys, tmp_path, names):
    # `--names "$N"` with N unset made only the coordinator's key pair
    line = refused(capsys, ["keys", "generate", str(tmp_path / "k"), "--names", names])
    assert f"--names {names!r}" in line, line
    assert not (tmp_path / "k").exists()


def test_launch_with_an_empty_ray_address_is_refused(capsys, monkeypatch):
    # `--ray "$ADDR"` with ADDR unset used RAY_ADDRESS or started a local Ray
    from swarm.experiment import ray_launch

    def started(*args, **kwargs):
        raise Started(args)

    monkeypatch.setattr(ray_launch, "launch_ray", started)
    line = refused(capsys, ["launch", "--ray", "", "spec.toml"])
    assert "--ray '' is empty" in line, line
    with pytest.raises(Started) as got:   # --ray alone still means RAY_ADDRESS or a local Ray
        cli.main(["launch", "--ray"])
    assert got.value.args[0][:3] == (None, [], None)


# ------------------------------------------------------------ 9. refused later, or silently replaced

@pytest.mark.parametrize("argv", [["--bind", "ipc:///tmp/swarm-x"], ["--bind", "inproc://x"],
                                  ["--set", "coordinator.bind=ipc:///tmp/swarm-x"]])
def test_a_coordinator_address_no_peer_can_dial_is_refused(nothing_starts, capsys, argv):
    # it started, and every peer and `swarm status` refused its address
    line = refused(capsys, ["coordinator", *argv])
    assert "is not tcp://HOST:PORT" in line and ("--bind" in line if argv[0] == "--bind" else "coordinator.bind"
                                                  in line), line


@pytest.mark.parametrize("setting, said", [("peer.topology=grid", "disagrees with the spec's gossip.topology"),
                                           ("peer.id=mine", "with --spec a peer's id is peer{RANK}")])
def test_a_peer_setting_the_spec_replaces_is_refused(nothing_starts, capsys, tmp_path, setting, said):
    # --topology and --id were refused, while the same --set was silently replaced by the spec's
    spec = tmp_path / "spec.toml"
    spec.write_text("peers = 2\n")
    line = refused(capsys, ["peer", "--coordinator", "tcp://127.0.0.1:5555", "--rank", "0", "--spec", str(spec),
                            "--set", setting])
    assert f"--set {setting.split('=')[0]}" in line and said in line, line
