"""How `swarm run` (swarm/experiment/launch.py) ends, watches and restarts its children.

A crash is reported whenever it comes, and makes the exit code 1; a second Ctrl-C
hurries the end; a coordinator ended from outside is a crash (restarted under
restart_dead); SIGHUP (the terminal closed) ends the run as Ctrl-C does, unless
ignored (nohup); on a terminal each message starts a line of its own and the
progress line fits the width. Real `swarm run` processes where the timing allows
it, stand-in processes (as in test_run.py) where it does not.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from swarmtest import ROOT, freeze, reaped, wait_for
# the helpers of the other `swarm run` tests (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import LONG, _Exited, alive, finish, recorded_pids, run_dir_of, training

from swarm.experiment import load_spec
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import (Launch, _Child, _Interrupt, _Progress, _restart_crashed, _supervise,
                                     run_experiment)


def swarm_run_logged(cwd: Path, sets: list[str]) -> tuple[subprocess.Popen, Path]:
    """`swarm run` with its output in a file, to be read while it runs."""
    log = cwd / "swarm-run.out"
    args = [sys.executable, "-m", "swarm.cli", "run"] + [x for s in sets for x in ("--set", s)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    with open(log, "w") as f:
        p = subprocess.Popen(args, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    return p, log


def end_all(pids: dict[str, int]) -> None:
    """Whatever a failed test left of a run's children (SIGCONT first: one may be stopped)."""
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def test_a_crash_after_the_runs_deadline_is_reported(tmp_path):
    """restart_dead: peer0 frozen before the deadline and killed after it (it never wrote its
    summary) is not restarted, but reported with its pid, signal and log, and the exit code is 1."""
    pids: dict[str, int] = {}
    p = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "run"]
        + [x for s in LONG + ["restart_dead=true", "budget.max_seconds=12"] for x in ("--set", s)],
        cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with reaped(p):
            d = wait_for(lambda: training(tmp_path, 2), timeout=45, what="both peers training")
            pids = recorded_pids(d)
            freeze(pids["peer0"])
            # peer1 stops at the run's deadline and writes its summary: the time is up
            wait_for(lambda: (d / "peer1" / "summary.json").exists(), timeout=45, what="peer1's summary")
            os.kill(pids["peer0"], signal.SIGKILL)
            out = finish(p, 60)
    finally:
        end_all(pids)
    assert p.returncode == 1, out
    log = d / "logs" / "peer0.log"
    assert (f"peer0 (pid {pids['peer0']}) exited with signal 9; not restarting it: the run's time is up; "
            f"last lines of {log.relative_to(tmp_path)}") in out, out
    assert "restarting it once" not in out
    rows = {r["id"]: r for r in json.loads((d / "summary.json").read_text())}
    assert rows["peer0"]["reason"] == "crashed; not restarted (the run's time is up)", rows
    assert rows["peer1"]["reason"] == "time limit", rows
    assert recorded_pids(d)["peer0"] == pids["peer0"]     # no new process for it


def _spec(*sets: str):
    return load_spec(None, ["peers=2", *sets])


def _summary(run_dir: Path, r: int, reason: str) -> None:
    (run_dir / f"peer{r}").mkdir(parents=True, exist_ok=True)
    (run_dir / f"peer{r}" / "summary.json").write_text(json.dumps({"rank": r, "id": f"peer{r}", "reason": reason}))


class _Polled(_Exited):
    """An exited process that fails the test when the launcher's loop over it does not end."""

    polls = 0

    def poll(self):
        self.polls += 1
        if self.polls > 1000:
            pytest.fail("swarm run's supervision loop does not end")
        return self.returncode


@pytest.mark.parametrize("restart_dead", [False, True])
def test_a_crash_after_the_final_summary_is_reported_and_not_restarted(tmp_path, monkeypatch, restart_dead):
    """A peer that crashed after it wrote its summary (closing, at exit) has whole results: it
    is not restarted and the others are not ended, but the line says so and the exit code is 1."""
    spec = _spec(f"restart_dead={str(restart_dead).lower()}")
    monkeypatch.setattr(Launch, "start", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(Launch, "end", lambda *a, **k: pytest.fail("the others were ended"))
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    launch = Launch(tmp_path)
    (tmp_path / "p0.log").write_text("swarm peer peer0: ...\nSegmentation fault\n")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child(f"peer{r}", _Polled(rc), tmp_path / f"p{r}.log") for r, rc in ((0, -11), (1, 0))]
    for r in range(2):
        _summary(tmp_path, r, "budget")
    out = io.StringIO()
    code = _supervise(launch, spec, coord, peers, "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                      _Interrupt(), out)
    said = out.getvalue()
    assert code == 1, said
    assert ("peer0 (pid 0) exited with signal 11 after it wrote its summary (budget): its results are "
            "complete and it is not restarted") in said, said
    assert "Segmentation fault" in said and "peer1" not in said
    assert launch.given_up == {"peer0": "budget, then exited with signal 11"} and launch.restarts == {}


@pytest.mark.parametrize("restart_dead", [False, True])
def test_a_peer_stopped_from_outside_is_reported(tmp_path, monkeypatch, restart_dead):
    """A peer that someone else's SIGTERM stopped exits 0 with the summary of a stopped peer:
    `swarm run` took it as a budget spent (no line, exit code 0). Its results are whole, so
    it is not restarted and the others go on, but the line says so and the exit code is 1."""
    spec = _spec(f"restart_dead={str(restart_dead).lower()}")
    monkeypatch.setattr(Launch, "start", lambda *a, **k: pytest.fail("a process was started"))
    monkeypatch.setattr(Launch, "end", lambda *a, **k: pytest.fail("the others were ended"))
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    launch = Launch(tmp_path)
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child(f"peer{r}", _Polled(0), tmp_path / f"p{r}.log", started=time.time() - 5) for r in range(2)]
    _summary(tmp_path, 0, "stopped")
    _summary(tmp_path, 1, "budget")
    out = io.StringIO()
    code = _supervise(launch, spec, coord, peers, "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                      _Interrupt(), out)
    said = out.getvalue()
    assert code == 1, said
    assert "peer0 (pid 0) was stopped before its budget by a signal from outside swarm run" in said, said
    assert "peer1" not in said
    assert launch.given_up == {"peer0": "stopped from outside swarm run"} and launch.restarts == {}


def test_a_predecessors_summary_does_not_count(tmp_path, monkeypatch):
    """A summary older than the process (a predecessor's), or one with reason error (written
    on the way out of a failure), does not make a crash one after the final summary: each
    such peer is restarted as any crash before the deadline."""
    started = []
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer0", "state": "dead"}]})
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append(name) or "new")
    _summary(tmp_path, 0, "budget")
    _summary(tmp_path, 1, "error")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child("peer0", _Exited(), tmp_path / "p0.log", started=time.time() + 5),   # started after it
             _Child("peer1", _Exited(), tmp_path / "p1.log", started=time.time() - 5)]
    launch = Launch(tmp_path)
    _restart_crashed(launch, _spec("restart_dead=true"), coord, peers, "tcp://127.0.0.1:9", {}, io.StringIO())
    assert started == ["peer0", "peer1"] and launch.given_up == {}


def test_a_crash_waiting_for_its_restart_does_not_hold_up_a_solved_run(tmp_path, monkeypatch):
    """restart_dead and stop_when_solved: peer1 crashed and waits for the coordinator to declare
    it dead when peer0 solves the task. The run ends (it looped for ever), says that peer1 was
    not restarted, and exits 1."""
    spec = _spec("restart_dead=true", "budget.stop_when_solved=true")
    monkeypatch.setattr(Launch, "start", lambda *a, **k: pytest.fail("a process was started"))
    # the coordinator still holds peer1 as alive: its restart waits
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer1", "state": "alive"}]})
    _summary(tmp_path, 0, "solved")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child("peer0", _Polled(0), tmp_path / "p0.log"), _Child("peer1", _Polled(), tmp_path / "p1.log")]
    out = io.StringIO()
    code = _supervise(Launch(tmp_path), spec, coord, peers, "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                      _Interrupt(), out)
    said = out.getvalue()
    assert code == 1, said
    assert "peer1 is not restarted after all: the run is ending" in said, said


def test_a_coordinator_that_exits_0_is_restarted(tmp_path, monkeypatch):
    """restart_dead: the coordinator never ends by itself; an exit 0 (someone's SIGTERM) is
    restarted as a crash is (it was left down, and the run polled it in a busy loop)."""
    started = []
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append(name) or "new")
    coord = _Child("coordinator", _Exited(0), tmp_path / "c.log")
    peers = [_Child(f"peer{r}", _Exited(0), tmp_path / f"p{r}.log") for r in range(2)]
    out = io.StringIO()
    launch = Launch(tmp_path)
    assert _restart_crashed(launch, _spec("restart_dead=true"), coord, peers, "tcp://127.0.0.1:9", {}, out) == "new"
    assert started == ["coordinator"] and launch.restarts == {"coordinator": 1}
    assert "coordinator (pid 0) exited with code 0 (it never ends by itself" in out.getvalue()


def test_a_coordinator_ended_from_outside_ends_the_run(tmp_path):
    """Without restart_dead, a coordinator SIGTERMed by someone (exit 0) is a crash: reported,
    the peers ended (they write their results), exit code 1. It was not reported, and `swarm
    run` polled in a busy loop without a progress line until the peers' budgets ran out."""
    pids: dict[str, int] = {}
    p, log = swarm_run_logged(tmp_path, LONG)
    try:
        with reaped(p):
            d = wait_for(lambda: training(tmp_path, 2), timeout=45, what="both peers training")
            pids = recorded_pids(d)
            os.kill(pids["coordinator"], signal.SIGTERM)
            p.wait(60)
    finally:
        end_all(pids)
    out = log.read_text()
    assert p.returncode == 1, out
    assert f"coordinator (pid {pids['coordinator']}) exited with code 0 (it never ends by itself" in out, out
    assert "ending the other processes" in out
    for r in range(2):
        assert json.loads((d / f"peer{r}" / "summary.json").read_text())["reason"] == "stopped"
    assert not any(alive(pid) for pid in pids.values())


def test_a_second_ctrl_c_hurries_the_end(tmp_path):
    """A peer that does not end on SIGTERM (stopped here): the second Ctrl-C says that what is
    left is killed soon, and it is (it waited TERM_GRACE_S whatever the user pressed)."""
    pids: dict[str, int] = {}
    p, log = swarm_run_logged(tmp_path, LONG)
    try:
        with reaped(p):
            d = wait_for(lambda: training(tmp_path, 2), timeout=45, what="both peers training")
            pids = recorded_pids(d)
            freeze(pids["peer0"])
            p.send_signal(signal.SIGINT)
            wait_for(lambda: "interrupted;" in log.read_text(), timeout=20, what="the first Ctrl-C's line")
            p.send_signal(signal.SIGINT)
            p.wait(60)
    finally:
        end_all(pids)
    out = log.read_text()
    assert p.returncode == 130, out
    assert "swarm run: interrupted again; killing what has not ended within 2 s" in out, out
    assert not any(alive(pid) for pid in pids.values())
    assert json.loads((d / "peer1" / "summary.json").read_text())["reason"] == "stopped"
    assert run_dir_of(tmp_path) == d


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr in one does."""

    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: each as its last ``\\r`` redraws left it."""
    rows = []
    for row in text.split("\n"):
        shown: list[str] = []
        for part in row.split("\r"):
            shown[:len(part)] = part    # from column 0 again
        rows.append("".join(shown).rstrip())
    return rows


def test_a_message_starts_a_line_of_its_own_on_a_terminal(tmp_path, monkeypatch):
    """restart_dead, peer1 SIGKILLed while the progress line is on a terminal: the line that
    reports it was glued to the end of the progress line. It starts a line of its own, and the
    progress line is drawn again below it. (The run's time limit leaves room for a slow start
    before the kill; once the line is drawn again the run is ended as Ctrl-C does, not left
    to run out its time.)"""
    term = _Terminal()
    pids: dict[str, int] = {}
    failed: list[BaseException] = []
    entered: list[_Interrupt] = []
    interrupted = threading.Event()

    class _Seen(_Interrupt):
        """The run's Ctrl-C handler, kept where the killer can press Ctrl-C through it."""

        def __enter__(self) -> _Interrupt:
            entered.append(self)
            return super().__enter__()

    monkeypatch.setattr(launch_mod, "_Interrupt", _Seen)

    def message_at() -> int | None:
        """The row that starts with the report of peer1's death, once there is one."""
        said = f"swarm run: peer1 (pid {pids['peer1']}) exited with signal 9"
        return next((i for i, row in enumerate(screen(term.getvalue())) if row.startswith(said)), None)

    def kill_peer1() -> None:
        try:
            d = wait_for(lambda: training(tmp_path, 2), timeout=45, what="both peers training")
            pids.update(recorded_pids(d))
            os.kill(pids["peer1"], signal.SIGKILL)
            wait_for(lambda: (at := message_at()) is not None
                     and any(row.startswith("[") for row in screen(term.getvalue())[at + 1:]),
                     timeout=30, what="the progress line drawn again below the message")
        except BaseException as e:   # the assertions below say what is missing
            failed.append(e)
        finally:
            interrupted.set()
            for intr in entered:   # Ctrl-C, as the run's own handler takes it
                intr._handler(signal.SIGINT, None)

    killer = threading.Thread(target=kill_peer1)
    killer.start()
    try:
        run_experiment(None, [*LONG, "restart_dead=true", "budget.max_seconds=20"], runs_root=tmp_path / "runs",
                       stream=term)
    except KeyboardInterrupt:
        if not interrupted.is_set():
            raise   # not this test's
    finally:
        killer.join()
        end_all(pids)
    assert "peer1" in pids, failed
    said = f"swarm run: peer1 (pid {pids['peer1']}) exited with signal 9"
    assert said in term.getvalue(), term.getvalue()
    rows = screen(term.getvalue())
    at = next((i for i, row in enumerate(rows) if row.startswith(said)), None)
    assert at is not None, [row for row in rows if said in row]     # glued to the end of a progress line
    assert all(row.startswith("swarm run:") for row in rows if "swarm run:" in row), rows
    assert any(row.startswith("[") for row in rows[at + 1:]), rows   # drawn again below it
    assert not failed, failed


@pytest.mark.parametrize("output", ["file", "closed terminal"])
def test_sighup_ends_the_run_as_ctrl_c_does(tmp_path, output):
    """SIGHUP (its terminal closed) killed `swarm run` at once: no summary, and its peers
    ended by themselves later. It ends the run as Ctrl-C does: the peers write their results,
    summary.json and the table are written, exit code 130; also when the terminal is gone
    (every write to it fails)."""
    pids: dict[str, int] = {}
    master = -1
    if output == "file":
        p, log = swarm_run_logged(tmp_path, LONG)
    else:
        master, slave = os.openpty()
        p = subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", *[x for s in LONG for x in ("--set", s)]],
                             cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                             stdout=slave, stderr=slave)
        os.close(slave)

    def drained_and_training() -> Path | None:
        while master >= 0 and select.select([master], [], [], 0)[0]:
            os.read(master, 65536)  # a full terminal would block swarm run
        return training(tmp_path, 2)

    try:
        with reaped(p):
            d = wait_for(drained_and_training, timeout=45, what="both peers training")
            pids = recorded_pids(d)
            if master >= 0:
                os.close(master)    # the terminal window closes
                master = -1
            os.kill(p.pid, signal.SIGHUP)
            p.wait(60)
    finally:
        if master >= 0:
            os.close(master)
        end_all(pids)
    assert p.returncode == 130
    if output == "file":
        out = log.read_text()
        assert "swarm run: interrupted by SIGHUP (the terminal closed?); ending the peers" in out, out
        assert "mean return" in out and f"run folder: {d.relative_to(tmp_path)}" in out, out   # the table
    for r in range(2):
        assert json.loads((d / f"peer{r}" / "summary.json").read_text())["reason"] == "stopped"
    assert [row["reason"] for row in json.loads((d / "summary.json").read_text())] == ["stopped"] * 2
    assert not any(alive(pid) for pid in pids.values())


def test_the_progress_line_fits_a_narrow_terminal():
    """On a terminal narrower than the progress line (~100 columns), the line wrapped, and
    each redraw (\\r goes back to the start of its last row only) added a row. It is cut to
    the terminal's width. A real terminal (a pty) 60 columns wide."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
    term = open(slave, "w")
    try:
        progress = _Progress(_spec(), term)
        for _ in range(3):
            progress.update(None, 2)
        term.flush()
        got = b""
        while select.select([master], [], [], 0.5)[0]:
            got += os.read(master, 65536)
        drawn = got.decode().split("\r")
    finally:
        term.close()
        os.close(master)
    assert drawn[0] == "" and len(drawn) == 4 and drawn[1].startswith("[....................]   0%  steps 0/"), drawn
    assert all(len(line) < 60 for line in drawn), drawn


def test_a_run_started_with_nohup_goes_on_after_sighup(tmp_path):
    """`nohup swarm run`: SIGHUP stays ignored (only one not ignored ends the run). It comes
    once both peers are started (the launcher's handlers are in place by then), so the run's
    time limit need not leave room for them to start training first."""
    pids: dict[str, int] = {}
    log = tmp_path / "swarm-run.out"
    with open(log, "w") as f:
        p = subprocess.Popen(["nohup", sys.executable, "-m", "swarm.cli", "run",
                              *[x for s in [*LONG, "budget.max_seconds=6"] for x in ("--set", s)]],
                             cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                             stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def peers_started() -> Path | None:
        dirs = list((tmp_path / "runs").glob("cartpole-ring-*"))
        try:
            return dirs[0] if dirs and {"peer0", "peer1"} <= set(recorded_pids(dirs[0])) else None
        except OSError:   # pids.json not there yet (it is replaced whole, never seen half written)
            return None

    try:
        with reaped(p):
            d = wait_for(peers_started, timeout=45, what="both peers started")
            pids = recorded_pids(d)
            os.kill(p.pid, signal.SIGHUP)
            p.wait(60)
    finally:
        end_all(pids)
    out = log.read_text()
    assert p.returncode == 0 and "interrupted" not in out, out
    assert [row["reason"] for row in json.loads((d / "summary.json").read_text())] == ["time limit"] * 2


def test_swarm_run_v_passes_its_verbosity_to_its_children(tmp_path):
    """`swarm run -v` logged INFO itself, but started its coordinator and peers without -v:
    their INFO lines (the relay's, a peer's checkpoints) never reached logs/. (`swarm run -v`
    was refused too: -v went only before the command.)"""
    args = [sys.executable, "-m", "swarm.cli", "run", "-v"]
    for s in ["peers=1", "budget.env_steps=300", "dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0"]:
        args += ["--set", s]
    with reaped(subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) as p:
        out = finish(p, 120)
    assert p.returncode == 0, out
    logs = run_dir_of(tmp_path) / "logs"
    assert " swarm.experiment INFO peer0 training: 300 env steps" in (logs / "peer0.log").read_text()
    assert " swarm.coordinator INFO coordinator listening on " in (logs / "coordinator.log").read_text()


@pytest.mark.parametrize("verbose, flags", [(0, []), (1, ["-v"]), (2, ["-vv"]), (5, ["-vv"])])
def test_a_child_gets_the_runs_verbosity(tmp_path, monkeypatch, verbose, flags):
    started = []

    def popen(argv, **kw):
        started.append(argv)
        return _Exited()

    monkeypatch.setattr(launch_mod.subprocess, "Popen", popen)
    launch = Launch(tmp_path, verbose=verbose)
    launch.start("peer0", ["peer", "--rank", "0"])
    launch.close()
    assert started == [[sys.executable, "-P", "-m", "swarm.cli", *flags, "peer", "--rank", "0"]]


def test_a_peer_whose_start_fails_on_a_config_error_is_not_restarted(tmp_path, monkeypatch):
    """`swarm run --resume OLD --set dqn.hidden=[32]` under restart_dead: each peer's start
    failed on `swarm: error: checkpoint ...: 4610 parameters, the agent has 226` (a
    ConfigError, not a resume error) and was started again 20 times, a minute of futile
    restarts. A ConfigError's note in the log leaves it down at once; a peer whose takeover
    was refused (exit code 2 too) is still restarted."""
    from swarm.cli import CONFIG_ERROR_NOTE

    spec = _spec("restart_dead=true")
    launch = Launch(tmp_path / "new", resumed=tmp_path / "old")
    started = []
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": [{"id": "peer1", "state": "dead"}]})
    monkeypatch.setattr(Launch, "start", lambda self, name, args, env=None, fork=False: started.append(name) or "new")
    (tmp_path / "p0.log").write_text("swarm peer peer0: cartpole-ring, ...\nswarm: error: checkpoint "
                                     "old/peer0/ckpt/full-000001: 4610 parameters, the agent has 226\n"
                                     f"{CONFIG_ERROR_NOTE}\n")
    (tmp_path / "p1.log").write_text("swarm: error: peer1: no such member to take over\n")
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peers = [_Child(f"peer{r}", _Exited(2), tmp_path / f"p{r}.log") for r in range(2)]
    out = io.StringIO()
    _restart_crashed(launch, spec, coord, peers, "tcp://127.0.0.1:9", {}, out)
    assert started == ["peer1"]
    assert launch.given_up == {"peer0": "error; not restarted"} and launch.restarts == {"peer1": 1}
    said = out.getvalue()
    assert ("peer0 (pid 0) exited with code 2 on an error that a restart would meet again; "
            "not restarting it") in said, said
    assert "4610 parameters, the agent has 226" in said
