"""What a terminal does to swarm's processes: Ctrl-Z on `swarm run` stops the whole run
(its children have sessions of their own, which the terminal's signals do not reach);
`swarm status --watch` cuts every line to the terminal's width; a second SIGTERM, SIGHUP
or Ctrl-C moments after the first leaves `swarm peer` and `swarm coordinator` to exit 0.
Real processes on loopback, each ended by its pid also when a test fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from swarmtest import ROOT, proc_stat, reap_run, wait_for

from swarm.coordinator.report import columns, format_table

# ---------------------------------------------------------------- Ctrl-Z on swarm run

# two peers, a budget the run spends in seconds once it is continued
SHORT = ["peers=2", "budget.env_steps=600", "dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0"]


def _threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass   # a thread that ended meanwhile
    return bool(states) and all(s == "T" for s in states)


def _cpu_ticks(pid: int) -> int:
    fields = proc_stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[11]) + int(fields[12])   # utime + stime, of all its threads


def _training(run_dir: Path) -> bool:
    """Whether both peers have written a metrics row (they are past their start)."""
    for r in range(2):
        rows = run_dir / f"peer{r}" / "metrics.csv"
        if not rows.exists() or len(rows.read_text().splitlines()) < 2:
            return False
    return True


def test_ctrl_z_on_swarm_run_stops_its_children_too_and_fg_goes_on(tmp_path):
    """SIGTSTP (what Ctrl-Z sends to the foreground job) stopped only `swarm run`: the
    coordinator, the fork server and the peers went on training in the background, and
    the run finished while the user thought it paused. Now each of them stops with it (no
    CPU used), and once it is continued they go on: the peers spend their budget, none
    taken for a crash nor restarted, exit 0."""
    args = [sys.executable, "-m", "swarm.cli", "run"]
    for s in SHORT:
        args += ["--set", s]
    said = tmp_path / "swarm-run.out"
    with open(said, "w") as f:
        # a process group of its own, in this session, as a shell's job: the kernel drops a
        # SIGTSTP of default action to an orphaned group (a session leader's), which nothing
        # would continue
        p = subprocess.Popen(args, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)),
                             stdout=f, stderr=subprocess.STDOUT, process_group=0)
    try:
        d = wait_for(lambda: next((r for r in tmp_path.glob("runs/*") if _training(r)), None), timeout=90,
                     what="both peers training")
        pids = json.loads((d / "pids.json").read_text())["children"]
        assert set(pids) == {"coordinator", "forkserver", "peer0", "peer1"}, pids
        os.kill(p.pid, signal.SIGTSTP)
        everyone = {"swarm run": p.pid, **pids}
        wait_for(lambda: all(_threads_stopped(pid) for pid in everyone.values()), timeout=20, interval=0.1,
                 what="swarm run and its children stopped: "
                 + ", ".join(f"{n} {(proc_stat(pid) or ['gone'])[0]}" for n, pid in everyone.items()))
        before = {n: _cpu_ticks(pid) for n, pid in everyone.items()}
        time.sleep(1.0)
        assert {n: _cpu_ticks(pid) for n, pid in everyone.items()} == before
        assert all(_threads_stopped(pid) for pid in everyone.values())
        os.kill(p.pid, signal.SIGCONT)   # fg
        p.wait(120)
    finally:
        reap_run(p, tmp_path)   # what a failed test left of the run
    out = said.read_text()
    assert p.returncode == 0, out
    rows = {r["id"]: r for r in json.loads((d / "summary.json").read_text())}
    assert [(rows[i]["reason"], rows[i]["restarts"]) for i in ("peer0", "peer1")] == [("budget", 0)] * 2, rows
    assert "exited with" not in out and "restarting" not in out, out


# ---------------------------------------------------------------- swarm status --watch

def _doc(run: str = "") -> dict:
    return {"run": run, "coordinator": "tcp://127.0.0.1:5555", "epoch": 1, "uptime_s": 5.0, "members": 1,
            "http": "http://127.0.0.1:40983/", "log": [],
            "peers": [{"id": "pa", "rank": 0, "state": "alive", "heartbeat_age_s": 0.1, "codec_ratio": None,
                       "env_steps_per_s": None, "rounds_per_s": None, "bytes_in_per_s": None,
                       "bytes_out_per_s": None, "staleness": None, "buffer_size": None,
                       "neighbours": ["pb"], "last_error": ""}]}


@pytest.mark.parametrize("width", [20, 80, 200])
@pytest.mark.parametrize("run", ["", "試験-\x1b[2J"])
def test_every_line_of_the_watch_table_is_cut_to_the_terminal(width, run):
    """The title, the header and its rule were not cut (96, 118 and 118 columns at any
    width): at 80 columns each wrapped over two rows while the member rows were cut, and
    the headings stood no longer over their columns."""
    lines = format_table(_doc(run), width=width).splitlines()
    assert max(columns(line) for line in lines) <= width, [(columns(line), line) for line in lines]
    head = next(line for line in lines if line.startswith("id "))
    rule, row = lines[lines.index(head) + 1], lines[lines.index(head) + 2]
    assert set(rule) == {"-"} and len(rule) == columns(head)
    if width >= 60:
        assert row.startswith("pa ")
        assert head.index("state") == row.index("alive")
        assert row[head.index("rank") + len("rank") - 1] == "0"   # right-aligned under its heading


# ---------------------------------------------------------------- a second signal at exit

def _signal_until_gone(p: subprocess.Popen, sig: int) -> None:
    """``sig`` to ``p``, then again every 10 ms until it has exited (an impatient supervisor,
    a closing terminal's two): some land while its leave is under way, some while the
    interpreter tears down."""
    p.send_signal(sig)
    for _ in range(1000):
        time.sleep(0.01)
        if p.poll() is not None:
            return
        p.send_signal(sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("who", ["peer", "coordinator"])
def test_a_second_signal_after_the_first_still_leaves_exit_0(procs, who, sig):
    """The loop's signal handlers went with the loop, and the interpreter put the signals'
    default actions back for its exit (100-300 ms): a second SIGTERM or SIGHUP then killed
    a process that had left cleanly (exit 143 or 129, 130 for a second Ctrl-C). They are
    ignored for the rest of its life now."""
    coord = procs.coordinator(None)
    target = coord
    if who == "peer":
        target = procs.start("peer", "--coordinator", coord.addr, "--id", "pa", name="peer")
        wait_for(lambda: "swarm peer pa on " in procs.log(target), timeout=30, what="the peer's first line")
    _signal_until_gone(target, sig)
    target.wait(30)
    assert target.returncode == 0, f"exit {target.returncode}; its log:\n{procs.log(target)}"
    if who == "peer":
        assert procs.log(target).splitlines()[-1] == "swarm peer pa leaving", procs.log(target)
