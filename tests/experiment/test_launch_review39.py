"""`swarm run` (swarm/experiment/launch.py) when something comes at a bad moment: a
member's figures that are not numbers, a full disk while a peer is restarted or while the
run writes its summary, Ctrl-C while the peers end after a crash or while the run starts,
a peer that does not leave when told, a peer stopped from outside that ends between two
polls, a coordinator killed by a signal before it answered. Real processes where they are
quick to have (a small `swarm run` in this process, a Python that ignores SIGTERM),
stand-ins for the children (as in test_launch.py) where a real run would take too long.
"""

from __future__ import annotations

import errno
import io
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from experiment.test_launch_races import _Ends
from experiment.test_run import _Exited, alive
from swarmtest import freeze, reaped, wait_for

from swarm.errors import SwarmError
from swarm.experiment import checkpoint
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import (Launch, _Child, _Interrupt, _Progress, _supervise, _wait_coordinator,
                                     run_experiment)
from swarm.experiment.spec import load_spec

FULL = OSError(errno.ENOSPC, "No space left on device")
#: a small run of one peer (its peers are ended by the stand-in supervision of each test)
ONE = ["peers=1", "eval.every=0"]


def stubborn() -> subprocess.Popen:
    """A process that ignores SIGTERM (a peer stuck on its way out), once it does."""
    p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()
    return p


def press_twice_once_ended(intr: _Interrupt, child: _Child) -> threading.Thread:
    """Ctrl-C twice, as the run's own handler takes it, once `swarm run` has begun to end
    ``child`` (so the presses come while it waits for it to leave)."""
    def press() -> None:
        try:
            wait_for(lambda: child.ended_by_us, timeout=60, what=f"{child.name} told to end")
        finally:
            intr._handler(signal.SIGINT, None)
            intr._handler(signal.SIGINT, None)

    t = threading.Thread(target=press)
    t.start()
    return t


def ended(run_dir: Path) -> None:
    """Every process the run recorded has ended."""
    pids = json.loads((run_dir / "pids.json").read_text())["children"]
    assert not [name for name, pid in pids.items() if alive(pid)], pids


# -- 1. the progress line ------------------------------------------------------------------


@pytest.mark.parametrize("bad, steps", [
    ({"env_steps": "lots"}, 100),
    ({"env_steps": 10, "mean_return": "high", "rounds": "many"}, 110),
    ({"env_steps": 10, "mean_return": None, "rounds": None, "bytes_out": None}, 110),
    ({"env_steps": float("nan"), "mean_return": float("inf"), "bytes_out": [1, 2]}, 100),
    ({"env_steps": True, "rounds": {"n": 1}}, 100),
    ({"env_steps": -10**6, "rounds": -5, "bytes_out": -1e9}, 100),   # counts below 0 pulled the sums down
])
def test_a_members_figures_that_are_not_numbers_are_left_out_of_the_progress_line(bad, steps):
    """The launcher kept a member's stats whatever their types (the coordinator passes on
    strings and lists as a member sent them): a string env_steps raised ValueError in the
    progress line, a string mean_return or a None rounds TypeError; it left the supervision,
    every peer was ended and `swarm run` stopped with a traceback (no table, summary.json
    nor plots). A figure that is no finite number now counts as none."""
    spec = load_spec(None, ["peers=2"])
    out = io.StringIO()
    good = {"env_steps": 100, "mean_return": 20.0, "rounds": 3, "bytes_out": 2_000_000}
    _Progress(spec, out).update({"members": [{"id": "peer0", "stats": good}, {"id": "intruder", "stats": bad}]}, 2)
    line = out.getvalue()
    assert f"steps {steps}/{2 * spec.budget.env_steps}  return   20.0  rounds 3  sent 2.00 MB  peers 2/2" in line, line


# -- 2. a full disk ----------------------------------------------------------------------


def test_a_peer_restarted_on_a_full_disk_is_started_with_a_warning(tmp_path, monkeypatch):
    """restart_dead: pids.json is written again on each start. On a full disk its OSError
    left the supervision after the new peer had started: `swarm run` died with a traceback,
    without a summary. Now a line says that pids.json could not be written, and the run goes
    on (the restarted peer, here a real `swarm --help`, ends by itself)."""
    def full(path, obj, indent):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "write_json", full)
    monkeypatch.setattr(launch_mod, "_status", lambda addr: {"members": []})   # peer0 forgotten: restarted at once
    monkeypatch.setattr(launch_mod, "_peer_args", lambda *args: ["--help"])
    monkeypatch.setattr(launch_mod, "POLL_S", 0.01)
    spec = load_spec(None, ["peers=1", "restart_dead=true"])
    out = io.StringIO()
    launch = Launch(tmp_path, out=out)
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    peer = _Child("peer0", _Ends(1), tmp_path / "logs" / "peer0.log")
    try:
        code = _supervise(launch, spec, coord, [peer], "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                          _Interrupt(), out)
    finally:
        launch.close()
    said = out.getvalue()
    assert code == 0, said
    assert launch.restarts == {"peer0": 1} and [c.proc.returncode for c in launch.children] == [0], said
    assert (f"swarm run: warning: cannot write {tmp_path / 'pids.json'}: No space left on device; it may not "
            "list every process of this run (swarm run ends them all the same)") in said, said


@pytest.mark.parametrize("code", [0, 130])
def test_the_ending_on_a_full_disk_still_prints_the_table_and_keeps_the_exit_code(tmp_path, monkeypatch, code):
    """summary.json that did not fit on the disk raised OSError before the table was
    printed, and plots that did not fit raised it past ``except ImportError``: `swarm run`
    ended with a traceback (exit 1), also in place of a pending Ctrl-C's 130. Now each says
    what could not be written, and the table and the exit code are as they would be."""
    real = checkpoint.write_json

    def full(path, obj, indent):
        if Path(path).name in ("summary.json", "restarts.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, obj, indent)

    def plots(run_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(run_dir) / "plots" / "returns.png"))

    monkeypatch.setattr(checkpoint, "write_json", full)
    monkeypatch.setattr(launch_mod, "write_plots", plots)
    # the run ends as soon as its peer started (the ending ends it, as any ending does)
    monkeypatch.setattr(launch_mod, "_supervise", lambda *args: code)
    out = io.StringIO()
    if code == 130:
        with pytest.raises(KeyboardInterrupt):
            run_experiment(None, [*ONE, "restart_dead=true"], runs_root=tmp_path / "runs", stream=out)
    else:
        assert run_experiment(None, [*ONE, "restart_dead=true"], runs_root=tmp_path / "runs",
                              stream=out).exit_code == code
    said = out.getvalue()
    (d,) = (tmp_path / "runs").iterdir()
    for name in ("restarts.json", "summary.json"):
        assert f"swarm run: cannot write {d / name}: No space left on device" in said, said
    assert f"no plots: cannot write them in {d / 'plots'}: No space left on device" in said, said
    assert "mean return" in said and f"run folder: {d}" in said, said   # the table and what follows it
    assert not (d / "summary.json").exists()
    ended(d)


# -- 3. Ctrl-C while the peers end after a crash --------------------------------------------


def test_ctrl_c_twice_while_the_peers_end_after_a_crash_is_not_called_harmless(tmp_path, monkeypatch):
    """peer0 crashes and peer1 does not leave (frozen) while `swarm run` ends it. Two Ctrl-Cs
    then killed peer1 2 s later, yet the ending said "interrupted once the peers had ended;
    the run's results are whole". Now the kill is said as such, and so is the interruption."""
    supervise = launch_mod._supervise
    pressed: list[threading.Thread] = []

    def crash_then_supervise(launch, spec, coord, peers, *rest):
        intr = rest[-2]
        freeze(peers[1].proc.pid)
        peers[0].proc.kill()
        pressed.append(press_twice_once_ended(intr, peers[1]))
        return supervise(launch, spec, coord, peers, *rest)

    monkeypatch.setattr(launch_mod, "_supervise", crash_then_supervise)
    out = io.StringIO()
    try:
        result = run_experiment(None, ["peers=2", "eval.every=0"], runs_root=tmp_path / "runs", stream=out)
    finally:
        for t in pressed:
            t.join()
    said = out.getvalue()
    assert result.exit_code == 1, said
    assert "once the peers had ended" not in said, said
    assert "swarm run: interrupted again; killing what has not ended within 2 s" in said, said
    assert re.search(r"swarm run: peer1 \(pid \d+\) did not leave within \d+ s; killed \(interrupted again\)",
                     said), said
    assert ("swarm run: interrupted while the run ended its processes; peer1 was killed before it had left: "
            "its results may be incomplete") in said, said
    rows = {r["id"]: r for r in result.summary}
    assert re.fullmatch(r"killed by swarm run after \d+ s \(interrupted again\)", rows["peer1"]["reason"]), rows
    ended(result.run_dir)


# -- 4. a peer that does not leave -----------------------------------------------------------


def test_a_child_that_does_not_leave_is_killed_with_a_line(tmp_path):
    """A child still there TERM_GRACE_S after its SIGTERM was SIGKILLed without a word (its
    row then read "no summary (crashed, or a full disk?)")."""
    out = io.StringIO()
    launch = Launch(tmp_path, out=out)
    with reaped(stubborn()) as p:
        launch.children.append(_Child("peer0", p, tmp_path / "peer0.log"))
        launch.end(grace=1.0)
    assert p.returncode == -signal.SIGKILL
    assert out.getvalue() == f"swarm run: peer0 (pid {p.pid}) did not leave within 1 s; killed\n"
    assert launch.killed == {"peer0": "killed by swarm run after 1 s"}


def test_a_peer_killed_at_the_end_of_a_run_makes_the_exit_code_1(tmp_path, monkeypatch):
    """Its budget spent (exit code 0), the run ends its peer, which does not leave (frozen):
    it was killed silently, its row read "no summary (crashed, or a full disk?)" and the exit
    code stayed 0, though its results may be cut short."""
    monkeypatch.setattr(launch_mod, "TERM_GRACE_S", 1.0)

    def frozen_peer(launch, spec, coord, peers, *rest):
        freeze(peers[0].proc.pid)
        return 0

    monkeypatch.setattr(launch_mod, "_supervise", frozen_peer)
    out = io.StringIO()
    result = run_experiment(None, ONE, runs_root=tmp_path / "runs", stream=out)
    said = out.getvalue()
    assert result.exit_code == 1, said
    assert re.search(r"swarm run: peer0 \(pid \d+\) did not leave within 1 s; killed\n", said), said
    assert [r["reason"] for r in result.summary] == ["killed by swarm run after 1 s"]
    assert [r["reason"] for r in json.loads((result.run_dir / "summary.json").read_text())] == \
        ["killed by swarm run after 1 s"]
    ended(result.run_dir)


# -- 5. Ctrl-C while the run starts ---------------------------------------------------------


def test_ctrl_c_while_waiting_for_the_coordinator_starts_no_peer(tmp_path, monkeypatch):
    """Ctrl-C while `swarm run` waited for its coordinator (which does not answer here) did
    nothing until the wait ran out (20 s): then it failed, or, had the coordinator answered,
    started every peer only to end it. Now it stops waiting, starts no peer, and each row
    says so."""
    entered: list[_Interrupt] = []

    class _Seen(_Interrupt):
        def __enter__(self) -> _Interrupt:
            entered.append(self)
            return super().__enter__()

    def ctrl_c_then_no_answer(addr):
        if not entered[0].count:
            entered[0]._handler(signal.SIGINT, None)
        return None

    monkeypatch.setattr(launch_mod, "_Interrupt", _Seen)
    monkeypatch.setattr(launch_mod, "_status", ctrl_c_then_no_answer)
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        run_experiment(None, ["peers=2", "eval.every=0"], runs_root=tmp_path / "runs", stream=out)
    said = out.getvalue()
    (d,) = (tmp_path / "runs").iterdir()
    assert set(json.loads((d / "pids.json").read_text())["children"]) <= {"coordinator", "forkserver"}, said
    assert "swarm run: interrupted; ending the peers" in said, said
    assert [r["reason"] for r in json.loads((d / "summary.json").read_text())] == ["not started (interrupted)"] * 2
    ended(d)


def test_a_second_ctrl_c_hurries_the_end_of_a_solved_run(tmp_path, monkeypatch):
    """peer0 solved the task and `swarm run` ends peer1, which does not leave: a second
    Ctrl-C meanwhile did not hurry it (it was given TERM_GRACE_S, 15 s, whatever the user
    pressed), as the module promises."""
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    spec = load_spec(None, ["peers=2", "budget.stop_when_solved=true"])
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer0" / "summary.json").write_text(json.dumps({"rank": 0, "id": "peer0", "reason": "solved"}))
    out = io.StringIO()
    launch = Launch(tmp_path, out=out)
    coord = _Child("coordinator", _Exited(), tmp_path / "c.log", ended_by_us=True)
    intr = _Interrupt(out)
    with reaped(stubborn()) as p:
        peers = [_Child("peer0", _Ends(0), tmp_path / "p0.log"), _Child("peer1", p, tmp_path / "p1.log")]
        presser = press_twice_once_ended(intr, peers[1])
        try:
            code = _supervise(launch, spec, coord, peers, "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                              intr, out)
        finally:
            presser.join()
    said = out.getvalue()
    assert code == 130, said
    assert "swarm run: a peer solved the task; ending the others" in said, said
    assert "swarm run: interrupted again; killing what has not ended within 2 s" in said, said
    assert p.returncode == -signal.SIGKILL


# -- 6. a peer stopped from outside, between two polls ---------------------------------------


def test_the_last_peer_stopped_from_outside_between_two_polls_is_reported(tmp_path, monkeypatch):
    """It runs when the check for a peer stopped from outside polls it and has ended (exit 0,
    summary reason "stopped") when the live peers are counted: the run said nothing and
    exited 0, as if it had spent its budget."""
    monkeypatch.setattr(launch_mod, "POLL_S", 0.01)
    monkeypatch.setattr(launch_mod, "_status", lambda addr: None)
    spec = load_spec(None, ["peers=1"])
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer0" / "summary.json").write_text(json.dumps({"rank": 0, "id": "peer0", "reason": "stopped"}))
    launch = Launch(tmp_path)
    coord = _Child("coordinator", _Ends(None), tmp_path / "coordinator.log")
    peer = _Child("peer0", _Ends(None, None, 0), tmp_path / "peer0.log", started=time.time() - 10)
    out = io.StringIO()
    code = _supervise(launch, spec, coord, [peer], "tcp://127.0.0.1:9", _Progress(spec, io.StringIO()),
                      _Interrupt(), out)
    said = out.getvalue()
    assert code == 1, said
    assert "peer0 (pid 4242) was stopped before its budget by a signal from outside swarm run" in said, said
    assert launch.given_up == {"peer0": "stopped from outside swarm run"}


# -- 7. a coordinator that dies before it answers ---------------------------------------------


def test_a_coordinator_killed_by_a_signal_before_it_answered_is_said_so(tmp_path):
    """It read "the coordinator exited with code -11": a signal, said as a negative code."""
    launch = Launch(tmp_path)
    with reaped(subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                                 stderr=subprocess.DEVNULL)) as p:
        p.wait(30)
        coord = _Child("coordinator", p, tmp_path / "coordinator.log")
        with pytest.raises(SwarmError) as e:
            _wait_coordinator(launch, coord, "tcp://127.0.0.1:9")
    assert str(e.value).startswith("the coordinator exited with signal 11 before it answered; its log ("), e.value
