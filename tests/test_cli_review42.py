"""The command line, forty-second review: spec and config files read with no bound, a
stdout that is not UTF-8, `swarm run`'s output that cannot be written, `swarm peer
--spec`'s start line before a refusal, and the key name with one key pair per host.
Real processes, files, FIFOs and sockets on loopback; each process is ended by its handle."""

from __future__ import annotations

import ast
import json
import os
import resource
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from swarmtest import ROOT, SWARM, reaped, wait_for
from test_cli_review import refused

from swarm import cli
from swarm.config import MAX_FILE_BYTES
from swarm.experiment.spec import load_spec, save_resolved

ENV = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
for _key in ("SWARM_PARENT_PID", "SWARM_COORDINATOR", "MASTER_ADDR", "SWARM_RANK", "SLURM_PROCID", "RANK",
             "TORCHELASTIC_RUN_ID"):
    ENV.pop(_key, None)
NOBODY = "tcp://127.0.0.1:9"   # never dialled: each command here is refused before it starts


def swarm(*args: str, cwd: Path, env: dict[str, str] | None = None, memory: int | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess:
    """``swarm ARGS`` run to its end (``memory``: an address-space limit in bytes, so that a
    command that reads without bound fails instead of taking the host's memory)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return subprocess.run([*SWARM, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**ENV, **(env or {})}, preexec_fn=None if memory is None else limit)


def one_error(p: subprocess.CompletedProcess) -> str:
    """The one `swarm: error:` line of a command that must exit 2 and print nothing else."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr[-3000:])
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarm: error: "), p.stderr[-3000:]
    assert p.stdout == "", p.stdout
    return lines[0]


# ------------------------------------------------------------ 1. a spec or config file read whole

@pytest.fixture
def too_big(tmp_path: Path) -> Path:
    """A file one byte over the limit (sparse: no disk taken), as a checkpoint or data set
    given by mistake."""
    f = tmp_path / "big.toml"
    with open(f, "wb") as out:
        out.truncate(MAX_FILE_BYTES + 1)
    return f


@pytest.mark.parametrize("args", [
    ["run", "{f}", "--show"],
    ["run", "{f}"],
    ["peer", "--spec", "{f}", "--rank", "0", "--coordinator", NOBODY],
    ["peer", "--config", "{f}", "--coordinator", NOBODY],
    ["coordinator", "--config", "{f}", "--bind", NOBODY],
])
def test_a_file_over_the_limit_is_refused_naming_it_and_the_limit(too_big, tmp_path, args):
    # it was read whole first (a 400 MB file took 823 MB), then refused as "not valid TOML"
    line = one_error(swarm(*(a.format(f=too_big) for a in args), cwd=tmp_path))
    assert line == (f"swarm: error: {too_big}: more than {MAX_FILE_BYTES} bytes, too big for a spec or config file "
                    "(the limit is 16 MiB); is it the file you meant?"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.toml"]   # nothing made


def test_a_device_that_never_ends_is_refused_after_the_limit(tmp_path):
    # /dev/zero was read until memory ran out: a MemoryError traceback (or the OOM killer)
    line = one_error(swarm("run", "/dev/zero", "--show", cwd=tmp_path, memory=2 << 30))
    assert line == (f"swarm: error: /dev/zero: more than {MAX_FILE_BYTES} bytes, too big for a spec or config "
                    "file (the limit is 16 MiB); is it the file you meant?"), line


def from_fifo(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    """``swarm ARGS`` with ``{f}`` a named pipe into which ``text`` is written once, as
    `<(make-spec)` gives it."""
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as out:   # waits for swarm to open it
            out.write(text)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        return swarm(*(a.format(f=fifo) for a in args), cwd=tmp_path)
    finally:
        if writer.is_alive():   # swarm never opened it: let the writer's open return
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join()


def test_a_spec_written_into_a_fifo_is_read(tmp_path):
    # what the fix leaves as it was: a spec from a named pipe (or `<(make-spec)`) is read; the
    # peer reads it once, and its rank past the spec's peers (3) shows that it did
    p = from_fifo(tmp_path, "peers = 3\r\n", "peer", "--spec", "{f}", "--rank", "3", "--coordinator", NOBODY)
    assert one_error(p) == "swarm: error: --rank 3: the spec has peers = 3, so ranks are 0..2"


def test_show_reads_a_spec_from_a_pipe_once(tmp_path):
    # show_spec read the file twice more after cmd_run's load: from a pipe those reads got
    # nothing, and --show printed the built-in default's peers = 4 for this spec's 3
    p = from_fifo(tmp_path, 'peers = 3\nname = "piped"\n', "run", "{f}", "--show")
    assert p.returncode == 0, p.stderr
    assert "\npeers = 3\n" in p.stdout and '\nname = "piped"\n' in p.stdout, p.stdout


# ------------------------------------------------------------ 2. a stdout that is not UTF-8

ASCII = {"PYTHONIOENCODING": "ascii"}


def test_keys_generate_ends_cleanly_on_an_ascii_stdout(tmp_path):
    # the keys were written, then its last line's em dash raised UnicodeEncodeError: exit 1,
    # and the same command again was refused ("exists; refusing to overwrite")
    p = swarm("keys", "generate", "kd", "--names", "coordinator,host1", cwd=tmp_path, env=ASCII)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.splitlines()[-1] == ("authorized public keys: kd/authorized/ - copy a host's NAME.key there "
                                         "to admit it"), p.stdout


def test_every_help_is_ascii():
    # `swarm launch --help` printed "nodes × this": a traceback on an ASCII stdout
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "cmd").choices
    for name, sub in [("swarm", parser), *commands.items()]:
        text = sub.format_help()
        assert text.isascii(), (name, [c for c in text if not c.isascii()])


def test_launch_help_prints_on_an_ascii_stdout(tmp_path):
    p = swarm("launch", "--help", cwd=tmp_path, env=ASCII)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "nodes x this" in " ".join(p.stdout.split())


def test_no_string_the_cli_writes_holds_a_character_beyond_ascii():
    # every string of swarm/cli.py but docstrings: each one reaches stdout or stderr
    tree = ast.parse((ROOT / "swarm" / "cli.py").read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and id(n) not in docs and not n.value.isascii()]
    assert found == []


def test_text_a_user_gave_is_written_escaped_on_an_ascii_stdout(tmp_path):
    # a spec's name beyond ASCII in `--show`'s first line: UnicodeEncodeError, exit 1
    (tmp_path / "spéc.toml").write_text("peers = 2\n")
    p = swarm("run", "spéc.toml", "--show", cwd=tmp_path, env=ASCII)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.splitlines()[0] == "# swarm run sp\\xe9c.toml, resolved", p.stdout[:200]


# ------------------------------------------------------------ 3. `swarm run` outlives its output

def test_a_run_whose_reader_left_goes_on_and_exits_with_the_runs_status(tmp_path):
    # README: a run whose stderr cannot be written goes on without printing and exits with the
    # run's status (it said: exits 1). `swarm run 2>&1 | head -1`:
    p = subprocess.Popen([*SWARM, "run", "--set", "peers=2", "--set", "budget.env_steps=600",
                          "--set", "dqn.learning_starts=100", "--set", "eval.every=300", "--set", "eval.episodes=1",
                          "--set", "buffer.capacity=2000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=ENV)
    with reaped(p):
        assert p.stdout.readline()
        p.stdout.close()   # the reader leaves, as `head -1` does
        assert p.wait(180) == 0
    (run,) = (tmp_path / "runs").iterdir()
    for r in range(2):
        assert json.loads((run / f"peer{r}" / "summary.json").read_text())["env_steps"] >= 600


# ------------------------------------------------------------ 4. `swarm peer --spec`'s start line

@pytest.fixture
def spec4(tmp_path: Path) -> str:
    return str(save_resolved(load_spec(None, ["peers=4", "budget.env_steps=600"]), tmp_path / "spec"))


@pytest.mark.parametrize("args, message", [
    (["--rank", "7"], "--rank 7: the spec has peers = 4, so ranks are 0..3"),
    (["--set", "peer.rank=4"], "peer.rank = 4: the spec has peers = 4, so ranks are 0..3"),
    (["--replace", "peer9"], "--replace peer9: the spec has peers = 4, so ranks are 0..3"),
])
def test_a_rank_past_the_specs_peers_is_refused_naming_where_it_came_from(spec4, tmp_path, args, message):
    # the start line ("... writing to run (pid N)") came first, then `rank = 7: ...`
    line = one_error(swarm("peer", "--spec", spec4, "--coordinator", NOBODY, "--run-dir", "run", *args,
                           cwd=tmp_path))
    assert line == f"swarm: error: {message}", line
    assert not (tmp_path / "run").exists()


def test_a_run_folder_that_cannot_be_made_is_refused_before_the_start_line(spec4, tmp_path):
    (tmp_path / "afile").write_text("")
    line = one_error(swarm("peer", "--spec", spec4, "--coordinator", NOBODY, "--rank", "0", "--run-dir", "afile",
                           cwd=tmp_path))
    assert line == ("swarm: error: --run-dir afile: cannot create afile/peer0 (Not a directory); pass a --run-dir "
                    "this process can write"), line


def test_the_start_line_comes_once_the_peers_folder_is_there(spec4, tmp_path):
    # what the fix leaves as it was: a peer that starts says so
    with socket.socket() as coord:   # takes the join and never answers: the peer waits in it
        coord.bind(("127.0.0.1", 0))
        coord.listen(8)
        p = subprocess.Popen([*SWARM, "peer", "--spec", spec4, "--rank", "2", "--run-dir", "run",
                              "--coordinator", "tcp://127.0.0.1:%d" % coord.getsockname()[1],
                              "--set", "peer.join_timeout_s=60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV)
        with reaped(p):
            line = p.stdout.readline()
            assert line.startswith("swarm peer peer2: cartpole-ring, 600 env steps, writing to run (pid "), line
            assert (tmp_path / "run" / "peer2").is_dir()
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "done (stopped)" in out, (out, err)


# ------------------------------------------------------------ 5. the key name, one key pair per host

@pytest.fixture
def host_keys(tmp_path: Path) -> Path:
    """docs/multihost.md's key folder: one pair per host, none named peer."""
    from swarm.transport import generate_keys

    generate_keys(str(tmp_path / "keys"), ["coordinator", "host1", "host2"])
    return tmp_path / "keys"


@pytest.fixture
def no_launcher_env(monkeypatch):
    for key in ("SWARM_COORDINATOR", "MASTER_ADDR", "SWARM_RANK", "SLURM_PROCID", "RANK", "SWARM_PARENT_PID"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("command", [["status"], ["peer"]])
def test_a_missing_default_key_pair_names_the_flag_and_the_pairs_there(host_keys, capsys, no_launcher_env, command):
    # it said: "keys/peer.key_secret does not exist; create keys with `swarm keys generate keys
    # --names peer`", a shared key the same doc warns against, and never named --key-name
    line = refused(capsys, [*command, "--keys", str(host_keys), "--coordinator", NOBODY])
    assert line == (f"swarm: error: keys: {host_keys}/peer.key_secret does not exist (--key-name peer, the "
                    "default); the folder has the key pairs host1, host2: pass --key-name with this host's"), line


@pytest.mark.parametrize("given, named_by", [
    (["--key-name", "host3"], "--key-name host3"),
    (["--set", "peer.key_name=host3"], "peer.key_name = 'host3'"),
])
def test_a_missing_key_pair_names_where_its_name_came_from(host_keys, capsys, no_launcher_env, given, named_by):
    line = refused(capsys, ["peer", "--keys", str(host_keys), "--coordinator", NOBODY, *given])
    assert line == (f"swarm: error: keys: {host_keys}/host3.key_secret does not exist ({named_by}); the folder "
                    "has the key pairs host1, host2: pass --key-name with this host's"), line


def test_a_folder_with_no_other_pair_says_how_to_make_one(tmp_path, capsys, no_launcher_env):
    from swarm.transport import generate_keys

    generate_keys(str(tmp_path / "keys"), ["coordinator"])   # the coordinator's secret is not suggested
    line = refused(capsys, ["status", "--keys", str(tmp_path / "keys"), "--coordinator", NOBODY])
    assert line == (f"swarm: error: keys: {tmp_path}/keys/peer.key_secret does not exist (--key-name peer, the "
                    f"default); create it with `swarm keys generate {tmp_path}/keys --names peer`"), line


# ------------------------------------------------------------ two swarms' peers in one folder

def test_a_second_peer_into_a_folder_a_live_peer_writes_is_refused(spec4, tmp_path):
    """Two swarms' `swarm peer --spec --rank 0` from one folder, each with its own coordinator,
    both went on into the default folder (run.json is written only once a coordinator
    admits the peer) and spliced their results; the second is now refused at once."""
    waiting = [*SWARM, "peer", "--spec", spec4, "--rank", "0", "--coordinator", NOBODY,
               "--set", "peer.join_timeout_s=120"]
    first = subprocess.Popen(waiting, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    with reaped(first):
        assert first.stdout.readline().startswith("swarm peer peer0: ")   # its folder is made and held
        second = swarm(*waiting[len(SWARM):], cwd=tmp_path, timeout=60)
        assert first.poll() is None
    folder = tmp_path / "runs" / "cartpole-ring-peer0" / "peer0"
    assert one_error(second) == (f"swarm: error: {folder.relative_to(tmp_path)}: another process (pid {first.pid}) "
                                 "writes peer0's results there now; pass --run-dir DIR for this run")
    # once the first has ended, its lock is gone: a third may start there
    third = subprocess.Popen(waiting, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    with reaped(third):
        assert third.stdout.readline().startswith("swarm peer peer0: ")


@pytest.mark.parametrize("command", [["coordinator", "--bind", "tcp://127.0.0.1:{port}"],
                                     ["peer", "--coordinator", NOBODY, "--set", "peer.join_timeout_s=60"]])
def test_coordinator_and_peer_raise_their_soft_fd_limit_to_the_hard_one(tmp_path, command):
    """Started with the common soft limit below the hard one, a coordinator (a peer) past it
    did not refuse connections: libzmq retried each accept, 1.5-2.5 cores, nothing logged."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here is {hard}: no room above a low soft one")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([*SWARM, *(a.format(port=port) for a in command)], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=low)
    with reaped(p):
        def soft() -> str:   # the process raises it first thing, before it binds or waits to join
            limits = Path(f"/proc/{p.pid}/limits").read_text()
            return next(ln.split()[3] for ln in limits.splitlines() if ln.startswith("Max open files"))
        wait_for(lambda: p.poll() is not None or soft() != "256", timeout=30, what="the raised limit")
        assert p.poll() is None, p.stdout.read()
        got = soft()
    expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert got == expected
