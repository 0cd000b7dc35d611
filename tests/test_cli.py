"""How `swarm` commands end (swarm/cli.py): their last lines and exit codes, and a
coordinator that ends with the `swarm run` that started it. Real processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zmq
from swarmtest import ROOT, SWARM, alive, free_port, status, wait_for

from swarm import wire


def test_a_peer_prints_no_epoch_after_leaving(procs):
    """A view installed while the peer leaves (here one the coordinator sends right after the
    peer's leave, as happens when others leave at the same time) printed `epoch N` after
    `leaving`. A hand-made coordinator on a ROUTER socket makes the order certain."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        peer = procs.start("peer", "--coordinator", f"tcp://127.0.0.1:{port}", "--id", "p0", name="p0")
        view = None
        signalled = sent_late_view = False
        deadline = time.monotonic() + 30
        while peer.poll() is None and time.monotonic() < deadline:
            if view is not None and not signalled and "epoch 1:" in procs.log(peer):
                peer.send_signal(signal.SIGTERM)
                signalled = True
            if not router.poll(50):
                continue
            route, *frames = router.recv_multipart()
            msg = wire.decode(frames)
            if msg.t == "join":
                view = {"epoch": 1, "members": [["p0", msg.body["addr"], 0, ""]]}
                router.send_multipart([route, *wire.encode("welcome", "coord", epoch=1, body={"rank": 0, "epoch": 1})])
                router.send_multipart([route, *wire.encode("view", "coord", epoch=1, body=view)])
            elif msg.t == "leave":
                late = dict(view, epoch=2)     # a newer view, then the confirmation of the leave
                router.send_multipart([route, *wire.encode("view", "coord", epoch=2, body=late)])
                router.send_multipart([route, *wire.encode("bye", "coord", epoch=2, body={})])
                sent_late_view = True
        assert peer.wait(10) == 0, procs.log(peer)
    finally:
        router.close(0)
        ctx.term()
    assert sent_late_view, procs.log(peer)
    lines = procs.log(peer).splitlines()
    assert lines[-1] == "swarm peer p0 leaving", lines
    assert any(line.startswith("epoch 1:") for line in lines), lines


def test_status_watch_interrupted_before_its_first_redraw_exits_0(procs):
    """Ctrl-C ends `swarm status --watch` with 0 (docs/observability.md); one that came before
    the first redraw (importing the table code) exited 130. The command sends itself SIGINT
    as it starts, to land in that window every time."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, name="coord")
    code = textwrap.dedent(f"""
        import os, signal, sys
        from swarm import cli
        real = cli.cmd_status
        def cmd_status(args):
            os.kill(os.getpid(), signal.SIGINT)    # Ctrl-C before the watch draws anything
            return real(args)
        cli.cmd_status = cmd_status
        sys.exit(cli.main(["status", "--coordinator", "{addr}", "--watch"]))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""
    # and without --watch, Ctrl-C is still 130
    p = subprocess.run([sys.executable, "-c", code.replace(', "--watch"', "")], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 130, p.stderr


def test_status_json_with_watch_is_refused():
    """--watch redraws a table: with --json too, it silently drew the table, not JSON."""
    p = subprocess.run([*SWARM, "status", "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--json", "--watch"],
                       capture_output=True, text=True, timeout=20, cwd=ROOT)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("swarm: error: --json prints one reply and --watch redraws a table: choose one")


def test_a_coordinator_ends_with_its_killed_swarm_run(tmp_path):
    """The coordinator `swarm run` starts (SWARM_PARENT_PID set) ends when its swarm run is
    SIGKILLed, as the peers do; it ran on for good. A stand-in for swarm run starts it."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = dict(os.environ, SWARM_PARENT_PID=str(os.getpid()), PYTHONUNBUFFERED="1")
        with open({str(tmp_path / "coord.log")!r}, "w") as log:
            c = subprocess.Popen([sys.executable, "-m", "swarm.cli", "coordinator", "--bind", "{addr}"], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        print(c.pid, flush=True)
        time.sleep(600)
    """)
    lp = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    coord = 0
    try:
        coord = int(lp.stdout.readline())
        wait_for(lambda: status(addr, timeout=0.5), timeout=30, what="the coordinator answering")
        lp.kill()
        lp.wait()
        wait_for(lambda: not alive(coord), timeout=30, what="the coordinator ending after its swarm run")
    finally:
        if lp.poll() is None:
            lp.kill()
            lp.wait()
        lp.stdout.close()
        if coord and alive(coord):
            os.kill(coord, signal.SIGKILL)
    assert f"its swarm run (pid {lp.pid}) is gone; stopping" in (tmp_path / "coord.log").read_text()


def test_a_bad_swarm_parent_pid_is_an_error():
    p = subprocess.run([*SWARM, "coordinator", "--bind", f"tcp://127.0.0.1:{free_port()}"], capture_output=True,
                       text=True, timeout=20, cwd=ROOT, env=dict(os.environ, SWARM_PARENT_PID="x"))
    assert p.returncode == 2
    assert p.stderr.startswith("swarm: error: SWARM_PARENT_PID='x' is not a pid"), p.stderr


def test_a_peer_that_finished_no_episode_says_so(procs, tmp_path):
    """`swarm peer --spec` with a budget shorter than any CartPole episode: its last line
    said `mean return None`."""
    from swarm.experiment import load_spec
    from swarm.experiment.spec import save_resolved

    config = save_resolved(load_spec(None, ["peers=1", "budget.env_steps=5", "dqn.learning_starts=1",
                                            "dqn.batch_size=1"]), tmp_path)
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.coordinator(addr)
    peer = procs.start("peer", "--spec", str(config), "--rank", "0", "--coordinator", addr,
                       "--run-dir", str(tmp_path / "run"), name="peer0")
    assert peer.wait(60) == 0, procs.log(peer)
    assert procs.log(peer).splitlines()[-1] == ("swarm peer peer0 done (budget): 5 env steps, 0 rounds, "
                                                "no episode finished")


def test_a_closing_terminal_ends_a_peer_and_a_coordinator_cleanly(procs):
    """SIGHUP (the terminal of `swarm peer` or `swarm coordinator` closed) killed them on the
    spot: the peer did not leave, so its neighbours waited for the coordinator to declare it
    dead. Now it leaves as on Ctrl-C, and the coordinator closes; both exit 0."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.coordinator(addr)
    peer = procs.start("peer", "--id", "p0", "--coordinator", addr, name="p0")
    wait_for(lambda: "epoch" in procs.log(peer), timeout=30, what="the peer to join")
    peer.send_signal(signal.SIGHUP)
    assert peer.wait(30) == 0, procs.log(peer)
    assert procs.log(peer).splitlines()[-1] == "swarm peer p0 leaving", procs.log(peer)
    # it left (a peer killed on the spot stays alive in the table until its heartbeats are missed)
    assert [(m["id"], m["state"], m["cause"]) for m in status(addr)["members"]] == [("p0", "dead", "left")]
    coord.send_signal(signal.SIGHUP)
    assert coord.wait(30) == 0, procs.log(coord)


def test_a_closing_terminal_ends_a_training_peer_cleanly(procs, tmp_path):
    """`swarm peer --spec` on SIGHUP: it was killed mid-run (no summary, no final checkpoint);
    now it stops after the current step as on Ctrl-C and writes its results."""
    from swarm.experiment import load_spec
    from swarm.experiment.spec import save_resolved

    config = save_resolved(load_spec(None, ["peers=1", "budget.env_steps=1000000", "eval.every=0"]), tmp_path)
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.coordinator(addr)
    peer = procs.start("peer", "--spec", str(config), "--rank", "0", "--coordinator", addr,
                       "--run-dir", str(tmp_path / "run"), name="peer0")
    csv = tmp_path / "run" / "peer0" / "rounds.csv"
    wait_for(lambda: csv.is_file() and len(csv.read_text().splitlines()) > 2, timeout=60, what="training")
    peer.send_signal(signal.SIGHUP)
    assert peer.wait(30) == 0, procs.log(peer)
    assert "done (stopped)" in procs.log(peer).splitlines()[-1], procs.log(peer)
    assert json.loads((tmp_path / "run" / "peer0" / "summary.json").read_text())["reason"] == "stopped"


def test_a_coordinator_name_that_does_not_resolve_is_said_so(monkeypatch):
    """libzmq retries a host name it cannot resolve in silence, so a typo in --coordinator
    read as 'no coordinator answered ... is `swarm coordinator` running there?'. The
    error now names the host that does not resolve (`.invalid` never does, RFC 6761).
    The test's own lookups of the name went to the configured nameserver, off the machine:
    unresolved_hint's now go to a stand-in resolver, and the commands (whose libzmq looks
    the name up itself) run in a network namespace of their own, which has no route out."""
    import shutil
    import socket

    from swarm import transport
    from swarm.transport import unresolved_hint

    def getaddrinfo(host, *args, **kwargs):
        if host in ("127.0.0.1", "localhost"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(transport._socket, "getaddrinfo", getaddrinfo)
    bad = "tcp://no-such-host.invalid:5555"
    assert unresolved_hint(["tcp://127.0.0.1:5555", "tcp://localhost:5555"]) == ""
    assert unresolved_hint(["tcp://127.0.0.1:5555", bad]).startswith(
        "; no-such-host.invalid does not resolve to an IPv4 address")

    isolated = ["unshare", "--user", "--map-root-user", "--net"]
    if shutil.which("unshare") is None or subprocess.run([*isolated, "true"], capture_output=True,
                                                         timeout=30).returncode != 0:
        pytest.skip("the commands' own lookups need `unshare --user --net` (user and network namespaces) "
                    "to stay on this machine, and it is not available here")
    said = "no-such-host.invalid does not resolve to an IPv4 address"
    for args in (["status", "--coordinator", bad, "--timeout", "0.2"],
                 ["peer", "--id", "a", "--coordinator", bad, "--set", "peer.join_timeout_s=0.5"]):
        done = subprocess.run([*isolated, *SWARM, *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2, done
        assert said in done.stderr and "is `swarm coordinator` running there" not in done.stderr, done.stderr


def test_status_of_a_coordinator_reached_but_silent_says_so_and_does_not_blame_keys():
    """From another host at 600 ms RTT, `swarm status` with its default --timeout 2 failed
    every time (it needs ~2.2 s) with "no coordinator answered ... a coordinator started
    with --keys answers only a client with --keys": no keys were involved. Where the
    connection got through its handshake the error now says the coordinator was reached
    and to give it longer. Here a ZeroMQ ROUTER that never answers stands in for it."""
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        done = subprocess.run([*SWARM, "status", "--coordinator", f"tcp://127.0.0.1:{port}", "--timeout", "1"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 2, done
        assert "was reached (handshake done) but did not answer within 1.0 s" in done.stderr, done.stderr
        assert "--keys" not in done.stderr and "--timeout" in done.stderr, done.stderr
    finally:
        silent.close(0)
        ctx.term()

    free = free_port()   # nobody there: the old error, with its keys hint
    done = subprocess.run([*SWARM, "status", "--coordinator", f"tcp://127.0.0.1:{free}", "--timeout", "0.5"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "no coordinator answered" in done.stderr and "--keys" in done.stderr, done


def test_status_shows_a_member_not_linked_yet_as_a_dash():
    """`swarm status` printed `linked -1` (the table's "never") for a member that has not
    linked yet; the table shows `-`, and --json keeps -1."""
    from swarm.cli import format_status

    def row(pid: str, linked: int) -> dict:
        return {"id": pid, "rank": int(pid[1:]), "state": "alive", "heartbeat_age_s": 0.5, "linked_epoch": linked,
                "addr": f"tcp://127.0.0.1:700{pid[1:]}", "neighbours": []}

    st = {"coordinator": "tcp://127.0.0.1:5555", "epoch": 3, "uptime_s": 2.0,
          "view": {"members": [["p0"], ["p1"]]}, "members": [row("p0", 3), row("p1", -1)]}
    lines = format_status(st).splitlines()
    linked = lines[1].index("linked") + len("linked")   # the column's right edge
    assert [line[linked - 6:linked] for line in lines[3:]] == ["     3", "     -"], lines


def test_status_shows_the_mode_and_the_other_coordinators():
    """With standby coordinators, plain `swarm status` showed neither this one's mode nor
    how it sees the others (only --json and --watch did): a split brain went unseen."""
    from swarm.cli import format_status

    st = {"coordinator": "tcp://127.0.0.1:5555", "epoch": 3, "uptime_s": 2.0, "mode": "standby",
          "view": {"members": []}, "members": [],
          "others": [{"address": "tcp://127.0.0.1:5556", "state": "handshake failed", "epoch": 0,
                      "error": "it refused this coordinator's key", "answered_s_ago": None}]}
    assert format_status(st).splitlines()[1] == \
        "mode standby  tcp://127.0.0.1:5556: handshake failed (it refused this coordinator's key)"
    st.pop("others")
    assert format_status(st).splitlines()[1].startswith("id ")   # no line without other coordinators


def test_a_config_error_under_swarm_run_says_a_restart_would_not_help(capsys, monkeypatch):
    """A peer of `swarm run` (SWARM_PARENT_PID set) adds a line after the `swarm: error:` of a
    ConfigError, for `swarm run` to read from its log: no restart cures it. Any other error, and
    a ConfigError of a command run by hand, is one line as before."""
    from swarm import cli

    monkeypatch.delenv("SWARM_PARENT_PID", raising=False)
    assert cli.main(["run", "--set", "peers=0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["swarm: error: peers = 0: must be in [1, 1024]"]
    monkeypatch.setenv("SWARM_PARENT_PID", str(os.getpid()))
    assert cli.main(["run", "--set", "peers=0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["swarm: error: peers = 0: must be in [1, 1024]",
                                                    cli.CONFIG_ERROR_NOTE]
    assert cli.main(["status", "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--json", "--watch"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1     # a SwarmError, not a ConfigError


@pytest.mark.parametrize("argv, level", [
    (["eval", "nowhere"], "WARNING"),
    (["-v", "eval", "nowhere"], "INFO"),
    (["eval", "nowhere", "-v"], "INFO"),
    (["-v", "eval", "nowhere", "-v"], "DEBUG"),    # was INFO: the later -v replaced the earlier
    (["-vv", "status", "-v", "--coordinator", "tcp://127.0.0.1:1", "--json", "--watch"], "DEBUG"),
])
def test_v_before_and_after_the_command_add_up(argv, level):
    """`swarm -v eval -v` logged at INFO: the command's parser counted its -v in a namespace
    of its own, which replaced the count of those before the command. The child runs the
    command line and prints the logging level it set (eval and status then fail at once)."""
    code = "import logging, sys; from swarm.cli import main; c = main(sys.argv[1:]); " \
           "print(logging.getLevelName(logging.getLogger().level), c)"
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout.split() == [level, "2"], p.stderr
