"""`swarm run`: one experiment on this host — a coordinator, N peers, one progress bar.

:func:`run_experiment` resolves the spec, makes ``runs/<name>-<YYYYmmdd-HHMMSS>/``
with ``config.json``, starts ``swarm coordinator`` and one ``swarm peer --spec``
process per rank (their output goes to ``logs/``; the peers are forked from a
fork server that imported torch once, :mod:`swarm.experiment.forkserver`, where it
answers, else started as fresh interpreters), and polls the coordinator
for the figures the peers put on their heartbeats to draw one progress line.
Whatever happens — the budget is spent, Ctrl-C, a child crashes — it ends
every process it started, by its handle, and then writes the plots and a
summary table.

Run folder::

    config.json         the resolved spec (loads back with load_spec)
    warnings.txt        what `swarm run` warned of before it started (Spec.warnings), if anything
    pids.json           the processes this run started (``forkserver``: the peers' parent)
    logs/               coordinator.log, peer{r}.log (a restarted process appends to its predecessor's;
                        warnings and errors, and with `swarm run -v` INFO lines too, -vv DEBUG),
                        forkserver.log (what the fork server said: empty unless an import failed,
                        or a forked peer failed before its output went to its own log)
    peer{r}/            metrics.csv, rounds.csv, evals.csv, tb/, ckpt/, checkpoint.pt, best.pt, summary.json
    plots/              returns.png, bytes_per_round.png, consensus.png
    summary.json        the summary table as JSON (each row with ``restarts``)
    restarts.json       with ``restart_dead``: restarts per process, coordinator included

With ``restart_dead = true`` in the spec, a peer that crashes is started again
(once per crash) as soon as the coordinator has declared it dead: with
``--replace peer{r}`` it takes its old rank, resumes from its newest checkpoint
in this run folder (in a resumed run, before its first one here, from the old
run's) and bootstraps its parameters from its neighbours. A peer that crashes
again after ``MAX_RESTARTS`` restarts in a row, or whose start failed on a configuration
error (another start would meet it again: a resume from the old run that cannot be
done, a checkpoint that does not fit the spec), or that cannot be started again at all
(an OSError of its spawn: too many open files, no memory, the python binary gone; its
row's ``reason`` has the error), is left down with a line that says so; the others go
on, and the run's exit code is 1.
``budget.max_seconds`` limits the whole run: the launcher passes every peer the
run's end in ``SWARM_RUN_ENDS`` (a restarted one gets what is left), and no peer is
restarted once the run's time is up. The time is elapsed time (the host's monotonic
clock, one for all its processes): a step of the wall clock changes nothing.
A coordinator that dies is started again on the same address, and its status page (whose
URL `swarm run` prints once the coordinator answers) on the port it first bound; where
another process took that port meanwhile, the page moves to a new one and its URL is
printed again. The peers re-register with it. It too is left down after ``MAX_RESTARTS``
restarts in a row (e.g. another process took its port: every start fails to bind), or
at once on a configuration error or a spawn that fails, with a line that says so;
without it no peer could rejoin nor be restarted, so the run then ends (the peers write
their results first) and its exit code is 1.

A crash is any end of a process that the launcher did not cause, whenever it
comes (a peer that exits 0 has spent its budget, unless its summary says a signal
from outside stopped it: that one is reported, not restarted; the coordinator never
ends by itself, so its exit 0 is someone's SIGTERM). Each is reported with the process,
its exit code or signal and its log, and each that no restart makes good makes
the run's exit code 1. A peer that crashed after it wrote its final
``summary.json`` (while it closed its sockets, or at exit) has whole results: it
is not restarted, the others go on, and its row's ``reason`` reads e.g.
``budget, then exited with signal 11``. Any other crash ends the run without
``restart_dead``; with it, a peer is restarted as above unless the run's time is
up or the run is ending (a peer solved the task), and then its row reads
``crashed; not restarted (...)``. A child that has not left :data:`TERM_GRACE_S`
after the launcher's SIGTERM is killed, with a line that says so; a peer killed so
may have been cut short in its results: its row's ``reason`` reads ``killed by
swarm run after 15 s`` (``budget, then killed by ...`` when it wrote its summary
first) and the run's exit code is 1.

Ctrl-C, SIGTERM and SIGHUP (its terminal closed; not when started with it ignored, as
by ``nohup``) end the run cleanly: the peers write their results, then the summary,
and the exit code is 130. One that comes while the run starts stops it starting peers
(also one whose fork waits for the fork server's answer, as the first waits for its
imports: that peer is not started) and those started are ended; the others' rows read
``not started (interrupted)``. One that comes while the run ends its processes for another
reason (a crash) or once every peer has ended (while it writes the summary and the
plots) lets it finish, and the exit code is the peers' outcome; the last line says
whether a process was killed before it had left. A second Ctrl-C or SIGTERM gives the
children :data:`HURRY_S` more seconds, not :data:`TERM_GRACE_S`, whatever ends them.
Ctrl-Z (SIGTSTP; SIGTTIN, SIGTTOU) stops the whole run, not only `swarm run`: it stops its
children (SIGSTOP: they have sessions of their own, which the terminal's signals do not
reach), then itself, and continues them when it is continued (``fg``, ``bg``). They stop
and go on together: no budget is spent unseen, and no process is taken for a crash (a
connection whose ZMTP heartbeats ran out in the stop is made again as they go on: the
coordinator may log a peer declared dead, then re-joined). A `swarm run` killed (SIGKILL)
while stopped leaves them stopped until they are continued (``kill -CONT``, pids.json).
``summary.json``, ``pids.json``, ``warnings.txt`` and the plots are written whole (a
temporary file renamed) or not at all; one that cannot be written (a full disk) is
said, and the run goes on (``pids.json``: the launcher ends its children by their
handles) or still prints its table and keeps its exit code. On a terminal the progress
line is drawn in place, cut to the terminal's width, and each message clears it first,
so that it starts a line of its own; output that cannot be written (a closed terminal) is
dropped, and the run ends as it would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import csv
import json
import math
import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO
from urllib.parse import urlsplit

from ..errors import ConfigError, SwarmError
from .runner import DIGEST_EVERY, RESUMED_FROM, check_resume_kept, in_the_way, peer_dir, resume_point
from .spec import CheckpointSpec, Spec, check_env_for_peers, load_spec, save_resolved

if TYPE_CHECKING:
    from .forkserver import ForkServer, Forked

__all__ = ["run_experiment", "RunResult", "Launch", "write_plots", "summarize", "new_run_dir"]

#: seconds a child gets to leave after SIGTERM before it is killed
TERM_GRACE_S = 15.0
#: after a second Ctrl-C: seconds the children still get before they are killed
HURRY_S = 2.0
#: seconds between polls of the children and the coordinator
POLL_S = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_run_dir(root: Path, name: str) -> Path:
    """Create and return a fresh folder ``root/NAME-YYYYmmdd-HHMMSS`` (``-1``, ``-2``, ...
    when a run of that name started the same second); a clear SwarmError when it cannot."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SwarmError(f"cannot create the run folder {root / f'{name}-{stamp}'}: "
                         f"{in_the_way(root / f'{name}-{stamp}', e)}") from None
    for i in range(100):
        d = root / (f"{name}-{stamp}" if i == 0 else f"{name}-{stamp}-{i}")
        try:
            d.mkdir()   # only its own "exists" says that the name is taken
            return d
        except FileExistsError:
            continue
        except OSError as e:  # e.g. the folder is read-only
            raise SwarmError(f"cannot create the run folder {d}: {e.strerror or e}") from None
    raise SwarmError(f"cannot make a fresh run folder under {root} for {name!r}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + t for t in text[-lines:]) or "    (empty log)"


@dataclass
class _Child:
    name: str
    #: a Popen, or a peer forked by the fork server (which answers the same calls)
    proc: subprocess.Popen | Forked
    log: Path
    ended_by_us: bool = False
    #: its exit 0 was looked into (see :func:`_stopped_from_outside`)
    exit_read: bool = False
    #: time.time() when it was started: a summary.json older than that is a predecessor's
    started: float = field(default_factory=time.time)

    def how(self) -> str:
        """How it ended: ``signal 9`` or ``code 2``."""
        rc = self.proc.returncode
        if getattr(self.proc, "lost", ""):
            return f"an unknown status ({self.proc.lost})"
        return f"signal {-rc}" if rc < 0 else f"code {rc}"

    def exited(self) -> str:
        """``peer1 (pid 123) exited with signal 9``."""
        said = f"{self.name} (pid {self.proc.pid}) exited with {self.how()}"
        if self.name == "coordinator" and self.proc.returncode == 0:
            said += " (it never ends by itself: a SIGTERM from outside swarm run?)"
        return said


@dataclass
class Launch:
    """The processes of one run, and how to end them (all by handle)."""

    run_dir: Path
    children: list[_Child] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    #: restarts in a row: of processes that died within :data:`SERVED_S` of their start
    #: (what :data:`MAX_RESTARTS` limits; one that served longer starts the count again)
    in_a_row: dict[str, int] = field(default_factory=dict)
    #: peers that crashed and were not restarted, or crashed after their final summary -> why
    #: (their summary row's ``reason``); any makes the run's exit code 1
    given_up: dict[str, str] = field(default_factory=dict)
    #: time.monotonic() at which budget.max_seconds runs out for the run (None: no limit);
    #: not the wall clock, which a step (NTP, a VM resumed) would move
    deadline: float | None = None
    #: the run folder this run resumes (swarm run --resume), else None
    resumed: Path | None = None
    #: each child gets this many ``-v`` (``swarm run -v``): 1 logs INFO to its log file, 2 DEBUG
    verbose: int = 0
    #: where the launcher's own lines about its children go (a child killed, a pids.json
    #: that could not be written); None: stderr
    out: TextIO | None = None
    #: children killed because they had not left in their time after SIGTERM -> why (a
    #: peer's summary row's ``reason``); a peer among them makes the run's exit code 1
    killed: dict[str, str] = field(default_factory=dict)
    #: the URL of the coordinator's status page, as its answers give it ("" until one does);
    #: a restarted coordinator serves it on the same port
    page: str = ""

    #: the fork server that starts the peers (:meth:`preload`), else None
    forks: ForkServer | None = None

    def preload(self) -> None:
        """Start the fork server, which imports what a peer needs while the coordinator
        starts; :meth:`start` with ``fork=True`` then forks the peers from it."""
        # (imported here: `python -m swarm.experiment.forkserver` would find it imported already)
        from .forkserver import ForkServer, enabled  # noqa: PLC0415

        if enabled():
            (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
            self.forks = ForkServer(self.run_dir / "logs" / "forkserver.log", dict(os.environ, PYTHONUNBUFFERED="1"))
            self._note_pids()

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None, fork: bool = False,
              stop: Callable[[], bool] | None = None) -> _Child | None:
        """Start ``swarm ARGS`` as ``name``: with ``fork`` from the fork server where it
        answers (its peers import nothing), else as a fresh ``python -m swarm.cli`` of the
        package this process runs (:func:`~swarm.experiment.forkserver.child_command`). None,
        with nothing started, when ``stop()`` came true (Ctrl-C) while the fork server's
        answer was awaited (see :meth:`ForkServer.fork`)."""
        log_path = self.run_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", SWARM_PARENT_PID=str(os.getpid()), **(env or {}))
        # A session of their own: Ctrl-C in the terminal reaches only `swarm run`,
        # which then ends each child in order (peers first, so they can leave cleanly).
        loud = ["-" + "v" * min(self.verbose, 2)] if self.verbose > 0 else []
        # A restarted child appends: the log of the process it replaces says why that one died.
        # The child writes through its own copy of the descriptor, so the launcher closes its
        # copy at once (kept open, each restart held one more until the run ended).
        from ..buffer.persist import no_link  # noqa: PLC0415 - numpy: off `swarm run --show`'s path

        with open(log_path, "a" if any(c.name == name for c in self.children) else "w", opener=no_link) as f:
            p: Any = None
            if fork and self.forks is not None:
                # its parent is the server: the peer watches that one (which ends with us)
                forking = self.forks.forking
                p = self.forks.fork([*loud, *args], dict(env, SWARM_PARENT_PID=str(self.forks.pid)), log_path, name,
                                    stop)
                if p is None and stop is not None and stop():
                    return None
                if p is None and forking and self.forks.changed:
                    print(f"swarm run: swarm's code changed since this run started ({self.forks.changed}): {name} "
                          "and every peer started after it are fresh interpreters, which run the new code "
                          "(a fork of the run's fork server would mix it with the old)",
                          file=self.out or sys.stderr, flush=True)
            if p is None:
                from .forkserver import child_command  # noqa: PLC0415 - see preload

                argv, fresh = child_command("swarm.cli", env)
                p = subprocess.Popen([*argv, *loud, *args], stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=fresh, start_new_session=True)
        c = _Child(name, p, log_path)
        self.children.append(c)
        self._note_pids()
        return c

    def _note_pids(self) -> None:
        """:meth:`_write_pids`, or a warning where it cannot be written (a full disk): the
        child has started, and the run ends it by its handle whatever pids.json lists."""
        try:
            self._write_pids()
        except OSError as e:
            print(f"swarm run: warning: cannot write {self.run_dir / 'pids.json'}: {e.strerror or e}; it may not "
                  "list every process of this run (swarm run ends them all the same)",
                  file=self.out or sys.stderr, flush=True)

    def _write_pids(self) -> None:
        pids = {c.name: c.proc.pid for c in self.children}
        if self.forks is not None:
            pids["forkserver"] = self.forks.pid
        from .checkpoint import write_json  # noqa: PLC0415 - numpy: off `swarm run --show`'s path

        # replaced whole: it is read while the run goes on (to clean up after a killed launcher)
        write_json(self.run_dir / "pids.json", {"launcher": os.getpid(), "children": pids}, indent=None)

    def end(self, children: list[_Child] | None = None, grace: float = TERM_GRACE_S,
            hurry: Callable[[], bool] | None = None) -> None:
        """SIGTERM each running child, wait up to ``grace`` s, then SIGKILL what is left,
        each with a line (on :attr:`out`) and its reason in :attr:`killed`. Once ``hurry()``
        is true (a second Ctrl-C) they get at most :data:`HURRY_S` more."""
        todo = [c for c in (self.children if children is None else children) if c.proc.poll() is None]
        for c in todo:
            c.ended_by_us = True
            try:
                c.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        told = time.monotonic()
        deadline = told + grace
        hurried = False
        for c in todo:
            while c.proc.poll() is None:
                now = time.monotonic()
                if hurry is not None and deadline > now + HURRY_S and hurry():
                    deadline, hurried = now + HURRY_S, True
                if now >= deadline:
                    c.proc.kill()
                    # said, and kept for its row: else it reads as a crash, with no word of why
                    after = " (interrupted again)" if hurried else ""
                    self.killed[c.name] = f"killed by swarm run after {deadline - told:.0f} s{after}"
                    print(f"swarm run: {c.name} (pid {c.proc.pid}) did not leave within {deadline - told:.0f} s; "
                          f"killed{after}", file=self.out or sys.stderr, flush=True)
                    break
                try:
                    c.proc.wait(min(POLL_S, deadline - now))
                except subprocess.TimeoutExpired:
                    pass
            c.proc.wait()

    def signal_all(self, sig: int) -> None:
        """``sig`` to each child that has not ended, and to the fork server, at once. Called
        from a signal handler (:class:`_Interrupt`), which may run inside a poll of the fork
        server's answers: so by pid, with none of the polls that ``send_signal`` makes first."""
        procs = [c.proc for c in self.children] + ([self.forks.proc] if self.forks is not None else [])
        for p in procs:
            # Unreaped (returncode None; the fork server holds a forked peer's pid until told),
            # the pid is still this child's. A forked peer whose server died is init's to reap,
            # and its pid may be another's by now: left alone.
            if p.returncode is None and (isinstance(p, subprocess.Popen) or self.forks.alive):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    def close(self) -> None:
        """End every child (immediately), then the fork server."""
        self.end(grace=2.0)
        if self.forks is not None:
            self.forks.close()


class _Interrupt:
    """SIGINT/SIGTERM/SIGHUP to `swarm run`: the first asks for a clean stop, a second
    SIGINT or SIGTERM hurries it.

    SIGHUP (the terminal closed) never hurries: a closing terminal may send it twice (the
    kernel to the foreground job, the shell to each of its jobs), which says nothing about
    how long the user will wait. A SIGHUP ignored when `swarm run` started (``nohup swarm
    run``) stays ignored.

    SIGTSTP (Ctrl-Z), SIGTTIN and SIGTTOU (a background job that reads the terminal, or
    writes it under ``stty tostop``) stop the whole run: ``pause`` (:meth:`Launch.signal_all`)
    stops the children, which have sessions of their own and so do not get the terminal's
    signals, then `swarm run` stops itself as that signal would have, and once it is
    continued (``fg``, ``bg``, SIGCONT) it continues them. One ignored when `swarm run`
    started stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)

    def __init__(self, out: TextIO | None = None, pause: Callable[[int], None] | None = None) -> None:
        self.count = 0
        self._pause = pause
        #: the first signal's name, e.g. ``SIGHUP``; None before any
        self.first: str | None = None
        self._old: dict[int, Any] = {}
        self._out = out
        self._said = False
        #: set once every child has ended: a second signal then stops the ending at once
        self.ending = False
        #: seconds the run spent stopped (Ctrl-Z until fg): start-up's deadlines move by them
        self.stopped_s = 0.0

    def hurry(self) -> bool:
        """True after a second signal: the children get :data:`HURRY_S` more (said once)."""
        if self.count > 1 and not self._said and self._out is not None:
            self._said = True
            print(f"swarm run: interrupted again; killing what has not ended within {HURRY_S:.0f} s",
                  file=self._out, flush=True)
        return self.count > 1

    def what(self) -> str:
        """``interrupted`` (Ctrl-C), or e.g. ``interrupted by SIGHUP (the terminal closed?)``."""
        if self.first in (None, "SIGINT"):
            return "interrupted"
        return f"interrupted by {self.first}" + (" (the terminal closed?)" if self.first == "SIGHUP" else "")

    def __enter__(self) -> "_Interrupt":
        # Python lets only the main thread set handlers; signals reach only that thread too,
        # so a run started from another thread has nothing to catch.
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue
                self._old[sig] = signal.signal(sig, self._handler)
            for sig in self.STOPS if self._pause is not None else ():
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._stop)
        return self

    def _stop(self, signum: int, frame: Any) -> None:
        # SIGSTOP, which no child can catch: the coordinator, the fork server and the peers
        # stop and go on together, so that none runs on while the others are silent.
        self._pause(signal.SIGSTOP)
        signal.signal(signum, signal.SIG_DFL)
        stopped = time.monotonic()
        try:
            # stops this process here, until it is continued. Not in an orphaned process
            # group (its shell gone), where the kernel drops the signal, as for any program:
            # the children are then continued at once
            os.kill(os.getpid(), signum)
        finally:
            self.stopped_s += time.monotonic() - stopped
            signal.signal(signum, self._stop)
            self._pause(signal.SIGCONT)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.count == 0:
            self.first = signal.Signals(signum).name
        elif signum == signal.SIGHUP:
            return
        self.count += 1
        if self.ending and self.count > 1:
            # the peers have ended and the ending (table, summary.json, plots) runs: a second
            # Ctrl-C or SIGTERM gives it up (its files are written whole or not at all)
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        for sig, h in self._old.items():
            signal.signal(sig, h)


def _status(addr: str) -> dict[str, Any] | None:
    from ..cli import query_status  # noqa: PLC0415 - cli imports this module lazily too

    def query() -> dict[str, Any] | None:
        # a loop of its own that is never made the thread's: asyncio.run would leave the
        # caller's thread with no current loop (a script's get_event_loop() then fails)
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(query_status(addr, timeout=1.0))
        except SwarmError:
            return None
        finally:
            loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return query()
    # Called from a running event loop (a notebook cell, async code), where asyncio.run
    # refuses to start another: the query gets a thread and a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(query).result()


class _Output:
    """Where `swarm run` writes: its progress line and its message lines (``print(...,
    file=out)``).

    On a terminal the progress line is drawn again in place (``\\r``) and left without a
    newline; a message first clears it, so that each message starts on a line of its own,
    and the next update draws the progress line below it. Once writing fails (the terminal
    closed: EIO; the reader of a pipe left: EPIPE) nothing more is written: the run goes on
    or ends as it would, and its results are in the run folder all the same.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        #: the width of the progress line the terminal shows now (0: none)
        self.drawn = 0
        #: why writing stopped (None: it has not). A process without stderr (fd 2 closed,
        #: pythonw, a windowed app: ``sys.stderr`` is None) writes nothing from the start
        self.failed: Exception | None = None if stream is not None else OSError("no stream to write to")
        try:   # a caller's sink may have no isatty(), or one that raises (closed: ValueError)
            self.tty = bool(stream.isatty()) if stream is not None else False
        except Exception:
            self.tty = False

    def write(self, text: str) -> int:
        """A message (or part of one), below the progress line's last figures."""
        if text:
            self._clear()
            self._put(text)
        return len(text)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as e:   # ValueError: a stream closed under us
                self.failed = e

    def draw(self, line: str) -> None:
        """The progress line: in place on a terminal, else as a line of its own."""
        if self.tty:
            # A line that wraps cannot be drawn again in place (\r goes back to the start of
            # its last row only): each update would add a row. It is cut to the width instead.
            line = line[:max(1, self._columns() - 1)]
            self._put("\r" + line.ljust(self.drawn))
            self.drawn = len(line)
        else:
            self._put(line + "\n")
        self.flush()

    def end_line(self) -> None:
        """Leave the progress line on the terminal as it is, and go on below it."""
        if self.drawn:
            self._put("\n")
            self.drawn = 0
            self.flush()

    def _columns(self) -> int:
        """The terminal's width; a large number when it is not known."""
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 10_000
        except (AttributeError, OSError, ValueError):   # no file behind the stream
            return 10_000

    def _clear(self) -> None:
        if self.drawn:
            self._put("\r" + " " * self.drawn + "\r")
            self.drawn = 0

    def _put(self, text: str) -> None:
        if self.failed is None:
            try:
                self.stream.write(text)
            except (OSError, ValueError) as e:   # ValueError: a stream closed under us
                self.failed = e


class _Progress:
    """One line on stderr: env steps / budget, mean return, rounds, bytes.

    The steps are the peers' own counts: a resumed run's peers go on from their
    checkpoints'. With ``resumed`` the count is "-" (not 0) until every peer has reported
    (or one has ended), and the first line with it is drawn at once, in a log file too.
    """

    def __init__(self, spec: Spec, stream: TextIO = sys.stderr, *, resumed: bool = False) -> None:
        self.spec = spec
        #: messages go here too (print(..., file=progress.out)): each on a line of its own
        self.out = stream if isinstance(stream, _Output) else _Output(stream)
        self.last: dict[str, dict[str, Any]] = {}   # peer id -> last stats seen (kept after it leaves)
        self._printed = 0.0
        self.t0 = time.monotonic()
        # A fresh run's peers start at 0; a resumed run's are known once they report.
        self._counted = not resumed

    def update(self, st: dict[str, Any] | None, alive: int) -> None:
        if st is not None:
            for m in st.get("members", []):
                s = m.get("stats") or {}
                if isinstance(s, dict) and "env_steps" in s:
                    self.last[m["id"]] = s
        # A member's stats come as it sent them (any process may join): a figure that is no
        # finite number counts as none, and the others' still make the line.
        budget = self.spec.budget.env_steps * self.spec.peers
        steps = sum(_tally(s.get("env_steps")) for s in self.last.values())
        rets = [r for r in (_figure(s.get("mean_return")) for s in self.last.values()) if r is not None]
        rounds = sum(_tally(s.get("rounds")) for s in self.last.values())
        mb = sum(_tally(s.get("bytes_out")) for s in self.last.values()) / 1e6
        frac = min(1.0, steps / budget) if budget else 0.0
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        ret = f"{sum(rets) / len(rets):6.1f}" if rets else "     -"
        # a resumed peer not heard from yet has steps that a partial sum would leave out
        counted = self._counted or len(self.last) >= self.spec.peers or alive < self.spec.peers
        first, self._counted = counted and not self._counted, counted
        done = f"{frac:4.0%}  steps {steps}" if counted else "   -  steps -"
        line = (f"[{bar}] {done}/{budget}  return {ret}  rounds {rounds}  "
                f"sent {mb:.2f} MB  peers {alive}/{self.spec.peers}  {time.monotonic() - self.t0:4.0f} s")
        now = time.monotonic()
        # a log file gets a line now and then, not a \r stream; and a resumed run's first
        # counts at once, as they are where its peers start from
        if self.out.tty or first or now - self._printed >= 5.0:
            self._printed = now
            self.out.draw(line)

    def final(self, run_dir: Path) -> None:
        """Draw the line once more from the peers' summary.json files: their last
        heartbeat may predate their last steps, and the table below shows the end."""
        for r in range(self.spec.peers):
            try:
                s = json.loads((peer_dir(run_dir, r) / "summary.json").read_text())
            except (OSError, ValueError):
                continue    # crashed: its last heartbeat stands
            self.last[str(s.get("id", f"peer{r}"))] = {
                "env_steps": s.get("env_steps", 0), "mean_return": s.get("final_mean_return"),
                "rounds": s.get("rounds", 0), "bytes_out": s.get("bytes_out", 0)}
        self._printed = 0.0     # a log file gets this line too
        self.update(None, 0)

    def done(self) -> None:
        """Keep the last progress line; what follows goes below it."""
        self.out.end_line()


def _figure(v: Any) -> float | None:
    """A figure of a member's stats: ``v`` as a float if it is a finite int or float (not a
    bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:   # an int too large for a float
        return None
    return x if math.isfinite(x) else None


def _tally(v: Any) -> int:
    """A count of a member's stats (steps, rounds, bytes): a :func:`_figure` >= 0, else 0
    (a negative one pulled the progress line's sums down)."""
    x = _figure(v)
    return int(x) if x is not None and x > 0 else 0


def _wait_coordinator(launch: Launch, coord: _Child, addr: str, timeout: float = 20.0,
                      intr: _Interrupt | None = None) -> dict[str, Any] | None:
    """Wait until the coordinator answers at ``addr`` and return its status; return None
    early once ``intr`` has counted a signal (the caller then starts nothing more). The time
    the run spent stopped (Ctrl-Z, :class:`_Interrupt`) does not count: the coordinator was
    stopped with it, and a run continued past the deadline failed (exit 2)."""
    deadline = time.monotonic() + timeout
    stopped = intr.stopped_s if intr is not None else 0.0
    while time.monotonic() < deadline + (intr.stopped_s - stopped if intr is not None else 0.0):
        if intr is not None and intr.count:
            return None
        if coord.proc.poll() is not None:
            raise SwarmError(f"the coordinator exited with {coord.how()} before it "
                             f"answered; its log ({coord.log}):\n{_tail(coord.log)}")
        if (st := _status(addr)) is not None:
            return st
        time.sleep(0.1)
    raise SwarmError(f"the coordinator did not answer at {addr} within {timeout:.0f} s; log {coord.log}")


@dataclass
class RunResult:
    """What :func:`run_experiment` returns: how the run ended and where its results are."""

    #: 0: every peer spent its budget (or the task was solved); 1: a process crashed, at any
    #: time (with ``restart_dead``: a peer or the coordinator was left down, see :data:`MAX_RESTARTS`,
    #: or a peer crashed after the run's time was up or after its final summary; the stream has the tail of its
    #: log, ``run_dir/logs/`` all of it, and its summary row's ``reason`` says so), or a peer
    #: was killed because it had not left :data:`TERM_GRACE_S` after its SIGTERM
    exit_code: int
    #: the run folder, ``runs_root/<name>-<YYYYmmdd-HHMMSS>/``
    run_dir: Path
    #: one dict per peer, as in ``run_dir/summary.json``: ``rank``, ``id``, ``reason`` (budget,
    #: solved, stopped, ...), ``env_steps``, ``final_mean_return``, ``eval_return``,
    #: ``best_eval_return``, ``rounds``, ``bytes_out``, ``cpu_s``, ``restarts``, ...
    summary: list[dict[str, Any]]


def run_experiment(spec_path: str | Path | Spec | None, overrides: list[str] | None = None,
                   resume: str | Path | None = None, *, runs_root: str | Path = "runs",
                   stream: TextIO | None = None, verbose: int = 0) -> RunResult:
    """Run a whole experiment on this host and return its :class:`RunResult`.

    ``spec_path`` is a spec file, a :class:`Spec` (changed in code, e.g. with
    ``dataclasses.replace``; it is checked as a file is) or None for the default;
    ``overrides`` (``"a.b=v"`` strings) apply on top. A bad spec raises
    :class:`~swarm.errors.ConfigError` before anything starts, and so do replay buffers
    (``buffer.capacity`` times ``peers``) that cannot fit in this host's available memory;
    settings that do nothing in the run (:meth:`Spec.warnings`) are warned of on
    ``stream`` before anything starts, and kept in ``warnings.txt``. A crashed peer or
    coordinator is no exception: the others are ended and ``exit_code`` is 1.
    Ctrl-C (SIGINT, or SIGTERM, or SIGHUP unless it is ignored) ends every process,
    writes the results, then raises :class:`KeyboardInterrupt` (``swarm run`` exits
    with 130); one that comes once every peer has ended lets it write the summary and
    plots, and it returns as it would have.

    The progress line and the summary table go to ``stream`` (default stderr);
    ``io.StringIO()`` keeps them out of the terminal. ``verbose`` (``swarm run -v``) goes
    to the coordinator and the peers as their ``-v``: 1 adds their INFO log lines to their
    logs in ``logs/``, 2 DEBUG too. It blocks until the run ends,
    from any thread, in or out of a running event loop.

    ``resume`` is a previous run folder: its ``config.json`` is the spec (overrides
    apply on top) and each peer starts from its newest checkpoint there
    (``peer{r}/ckpt/``, or ``peer{r}/checkpoint.pt``; with neither, from the run that its
    run there continues). One that asks for another env, another ``seed`` or ``dqn.hidden``
    (the checkpoints hold the network and random streams they made), other replay-buffer
    settings than the buffers in ``ckpt/`` keep, other ``peers``, or a ``budget.env_steps``
    that every peer's checkpoint has reached, raises :class:`~swarm.errors.ConfigError`
    before anything starts; one that only some have reached is warned of.

    The run folder is made in ``runs_root``. It and ``resume`` may start with ``~``, the
    user's home folder, as in a shell.

        >>> r = run_experiment(None, ["peers=2", "budget.env_steps=2000"], stream=io.StringIO())  # doctest: +SKIP
        >>> r.exit_code, r.run_dir, [p["final_mean_return"] for p in r.summary]  # doctest: +SKIP
        (0, PosixPath('runs/cartpole-ring-20250101-120000'), [127.6, 136.7])
    """
    # messages start on a line of their own; a stream that fails (a closed terminal) is left alone
    out = _Output(stream or sys.stderr)
    prev: Path | None = None
    if resume is not None:
        prev = Path(resume).expanduser()
        if spec_path is not None:
            raise ConfigError("give either a spec or a run folder to resume, not both")
        try:
            if not prev.is_dir():
                raise ConfigError(f"resume: {prev}: no such folder")
            if not (prev / "config.json").is_file():
                raise ConfigError(f"resume: {prev} has no config.json; is it a run folder?")
        except OSError as e:   # is_dir() raises for a folder this user may not enter, or a name too long
            raise ConfigError(f"resume: {e.filename}: {e.strerror}") from None
        spec_path = prev / "config.json"
    try:
        spec = load_spec(spec_path, overrides)
    except ConfigError as e:
        if prev is None:
            raise
        raise _refused_config(spec_path, list(overrides or []), e) from None
    check_env_for_peers(spec.env)
    _check_memory(spec)
    from .forkserver import enabled  # noqa: PLC0415 - see Launch.preload

    enabled()   # a bad SWARM_FORKSERVER is refused before anything is made
    notes: list[str] = []   # a resume's warnings (peers at their budget already), with the spec's
    if prev is not None:
        _check_resume_env(prev, spec)
        _check_resume_peers(prev, spec)
        # each peer's checkpoint in prev, else in the run that its run there continues
        # (one resumed and ended before its first checkpoint), as run_peer looks for it
        points = [resume_point(prev, r) for r in range(spec.peers)]
        missing = [r for r, p in enumerate(points) if p is None]
        if missing:
            raise _no_checkpoint(prev, spec, missing)
        check_resume_kept(prev, spec, range(spec.peers))   # every peer's, before anything starts
        notes = _resume_budget(prev, spec, points)
    run_dir = new_run_dir(Path(runs_root).expanduser(), spec.name)
    try:
        config = save_resolved(spec, run_dir)
        if prev is not None:
            # before anything starts: the peers record the run they continue (run.json) only
            # once started, and a resume of this run interrupted before then resumes from
            # prev's checkpoints (resume_sources), not "start it again" from step 0
            from .checkpoint import write_json  # noqa: PLC0415 - numpy: off `swarm run --show`'s path

            write_json(run_dir / RESUMED_FROM, {"resumed_from": str(prev.resolve())}, indent=1)
    except OSError:   # a full disk: no run folder without its config.json (a resume of it is refused)
        with contextlib.suppress(OSError):
            (run_dir / "config.json").unlink(missing_ok=True)
            run_dir.rmdir()
        raise
    peers = f"{spec.peers} peer{'s' if spec.peers != 1 else ''}"
    print(f"swarm run: {spec.name}: {peers} on a {spec.gossip.topology.replace('_', ' ')} graph, {spec.env}, "
          f"codec {spec.gossip.codec}, {spec.budget.env_steps} env steps each -> {run_dir}", file=out, flush=True)
    _warn(spec, run_dir, out, "swarm run", notes)

    launch = Launch(run_dir, resumed=prev, verbose=verbose, out=out)
    code = 0
    progress = _Progress(spec, out, resumed=prev is not None)
    with _Interrupt(out, pause=launch.signal_all) as intr:
        try:
            addr = f"tcp://127.0.0.1:{_free_port()}"
            launch.preload()
            coord = launch.start("coordinator", _coordinator_args(spec, addr))
            _note_page(launch, _wait_coordinator(launch, coord, addr, intr=intr), progress)
            again = ["--resume-from", str(prev)] if prev is not None else []
            if spec.budget.max_seconds:
                launch.deadline = time.monotonic() + spec.budget.max_seconds
            # The peers stop at the run's deadline, not max_seconds after their own start
            # (importing torch and joining take seconds of the run's time).
            peers = []
            for r in range(spec.peers):
                if intr.count:
                    break   # interrupted: _supervise ends the peers started so far
                peer = launch.start(f"peer{r}", _peer_args(config, r, addr, run_dir) + again,
                                    env=_deadline_env(launch), fork=True, stop=lambda: intr.count > 0)
                if peer is None:
                    break   # interrupted while its fork waited for the fork server: not started
                peers.append(peer)
            code = _supervise(launch, spec, coord, peers, addr, progress, intr, out)
        finally:
            progress.done()
            # Peers first (they leave through the coordinator), then the coordinator.
            launch.end([c for c in launch.children if c.name != "coordinator"], grace=TERM_GRACE_S,
                       hurry=intr.hurry)
            launch.close()

        # The ending (the table, summary.json, the plots: about a second) stays under the
        # handlers: a signal now, with every peer ended, lets it finish (no summary.json or
        # plot cut short) and the exit code is the peers' outcome, as the run's results are.
        from .checkpoint import write_json  # noqa: PLC0415 - numpy: off `swarm run --show`'s path
        intr.ending = True
        # signals counted so far came while the run ended its processes (and may have hurried them)
        settled = intr.count
        started = {c.name: c for c in launch.children}   # the last process of each name
        rows = summarize(run_dir, spec, {name: c.proc.returncode for name, c in started.items()})
        for r, row in enumerate(rows):
            rid = row.get("id", "")
            row["restarts"] = launch.restarts.get(rid, 0)
            if rid in launch.given_up:
                row["reason"] = launch.given_up[rid]
            elif rid in launch.killed:
                # a summary it wrote before it hung on its way out has whole figures: say both
                done = _finished(run_dir, r, started[rid])
                row["reason"] = f"{done}, then {launch.killed[rid]}" if done else launch.killed[rid]
            elif rid not in started:
                row["reason"] = "not started (interrupted)"
        killed = [name for name in launch.killed if name != "coordinator"]
        if killed and code == 0:
            code = 1   # a peer killed may have been cut short in its results, as a crash

        def save(name: str, obj: Any, indent: int) -> None:
            try:
                write_json(run_dir / name, obj, indent=indent)   # whole or not at all
            except OSError as e:   # a full disk: the table still shows the results, and the code stands
                print(f"swarm run: cannot write {run_dir / name}: {e.strerror or e}", file=out, flush=True)

        if spec.restart_dead:
            save("restarts.json", launch.restarts, 1)
        save("summary.json", rows, 2)
        print(_table(rows), file=out)
        g = spec.gossip
        if g.exchange == "gradients":
            for line in _relay_ending(rows, spec):
                print(line, file=out)
        plots = _plots(run_dir, out)
        if plots is not None:
            print(f"plots: {run_dir / 'plots'}  ({', '.join(p.name for p in plots)})", file=out)
        if intr.count and code != 130:
            when = "while the run ended its processes" if settled else "once the peers had ended"
            one = len(killed) == 1
            whole = (f"{', '.join(killed)} {'was' if one else 'were'} killed before {'it' if one else 'they'} had "
                     f"left: {'its' if one else 'their'} results may be incomplete" if killed
                     else "the run's results are whole")
            print(f"swarm run: {intr.what()} {when}; {whole}", file=out)
        print(f"run folder: {run_dir}", file=out, flush=True)
        if any(r.get("best_eval_return") is not None for r in rows):
            print(f"replay the best policies: swarm eval {run_dir}", file=out, flush=True)
        if code == 130:
            raise KeyboardInterrupt   # a script's loop over runs stops here too
    return RunResult(code, run_dir, rows)


def _warn(spec: Spec, run_dir: Path, out: Any, who: str, notes: list[str] | None = None) -> None:
    """Say the settings that do nothing in this run (:meth:`Spec.warnings`), after ``notes``
    (a resume's), on ``out``, and keep them in ``run_dir/warnings.txt``."""
    warned = [*(notes or []), *spec.warnings()]
    for line in warned:
        print(f"{who}: warning: {line}", file=out, flush=True)
    if warned:
        from ..buffer.persist import write_synced  # noqa: PLC0415 - numpy: off `swarm run --show`'s path
        from .checkpoint import write_whole  # noqa: PLC0415

        text = "".join(f"{line}\n" for line in warned).encode()
        write_whole(run_dir / "warnings.txt", lambda tmp: write_synced(tmp, text))   # whole or not at all


def _replay_bytes(capacity: int, obs_size: int, replicas: int = 0) -> int:
    """About how many bytes one peer's replay buffer of DQN transitions holds.

    The columns, slot bookkeeping, sum-tree and id index are committed when the buffer is
    made (docs/buffer.md, "Memory is committed up front"); with ``replicas`` the
    replication bookkeeping grows to its size as the ring fills.

        >>> _replay_bytes(50_000, 4)   # CartPole-v1's 4 numbers an observation: 5.9 MB
        5897152
    """
    columns = 2 * 4 * obs_size + 8 + 4 + 4      # float32 obs and next_obs, int64 action, reward, done
    slots = 8 + 4 + 8 + 8                        # ticket, origin, seq, time
    tree = 8 * 2 * 2 ** max(1, (capacity - 1).bit_length())   # float64 heap over a power of two of leaves
    index = 4 * 2 ** max(4, (4 * capacity - 1).bit_length())  # int32 table of at least 4x capacity
    replication = (17 + 2 * replicas + 8) * capacity if replicas else 0
    return (columns + slots) * capacity + tree + index + replication


#: Where the memory check reads /proc and the cgroup file systems (tests point them at a
#: folder of fake files).
PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: cgroup v1 writes "no limit" as a number near 2**63 (the page counter's maximum)
_NO_CGROUP_LIMIT = 2**60


def _host_memory() -> int | None:
    """Bytes this host can give new processes (MemAvailable; else all of its memory); None
    when neither can be read."""
    try:
        with open(PROC_ROOT / "meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _read_number(path: Path) -> int | None:
    """The number a cgroup file holds; None when it is missing, unreadable or not a number
    (cgroup v2's ``max``: no limit)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _reclaimable(stat: Path, key: str) -> int:
    """The ``key`` line of a cgroup's memory.stat (its inactive page cache, which the kernel
    drops before it kills anything); 0 when it cannot be read."""
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_memory() -> tuple[int, int] | None:
    """``(limit, used)`` bytes of the tightest memory limit on this process: its cgroup's or
    an ancestor's (a container's ``memory.max``), cgroup v2 or v1; ``used`` leaves out the
    inactive page cache. None where no limit is set or none can be read.

    Past that limit the OOM killer ends the process, whatever /proc/meminfo says the host
    has free.
    """
    try:
        lines = (PROC_ROOT / "self" / "cgroup").read_text().splitlines()
    except (OSError, ValueError):
        return None
    # (mount, the process's cgroup under it, limit file, usage file, memory.stat key)
    where: list[tuple[Path, str, str, str, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            where.append((CGROUP_ROOT, path, "memory.max", "memory.current", "inactive_file"))
        elif "memory" in controllers.split(","):
            where.append((CGROUP_ROOT / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file"))
    best: tuple[int, int] | None = None
    for mount, path, limit_file, usage_file, key in where:
        rel = [p for p in path.split("/") if p]
        if ".." in rel:     # a cgroup outside this namespace's view: only the mount's own is ours
            rel = []
        # without a cgroup namespace the mount may show this cgroup as its root and the path
        # be missing under it; walking up to the mount reads the limit there
        for depth in range(len(rel), -1, -1):
            d = mount.joinpath(*rel[:depth])
            limit = _read_number(d / limit_file)
            if limit is None or limit >= _NO_CGROUP_LIMIT:
                continue
            usage = _read_number(d / usage_file)
            if usage is None:
                continue
            used = max(0, usage - _reclaimable(d / "memory.stat", key))
            if best is None or limit - used < best[0] - best[1]:
                best = (limit, used)
    return best


def _available_memory() -> int | None:
    """Bytes this process can give new processes: the host's (:func:`_host_memory`), or
    less where a cgroup limits its memory (:func:`_cgroup_memory`); None when neither can
    be read."""
    host, cgroup = _host_memory(), _cgroup_memory()
    if cgroup is None:
        return host
    room = max(0, cgroup[0] - cgroup[1])
    return room if host is None else min(host, room)


def _size(n: float) -> str:
    """``1.2 GB``: bytes in decimal units."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} EB"


def _refused_config(config: Path, overrides: list[str], e: ConfigError) -> ConfigError:
    """The error of ``swarm run --resume`` when the spec does not load. One that the old
    run's ``config.json`` causes (a value an older swarm took, as ``gossip.round_timeout_s
    = 5000`` before the limit of 3600) names that file and the ``--set`` that overrides
    the value. One that an override causes is left as it is: the file loads without the
    overrides (a cross-check between a key set and one in the file may name either), or
    the error names a key that an override sets."""
    msg = str(e)
    try:
        load_spec(config)
        return e
    except ConfigError as alone:
        refused_alone = str(alone)
    key = re.match(r"([A-Za-z_][\w.]*) = ", msg)   # the key a field's check or validate() names first
    if key is not None:
        if any(k and k in msg for k in (o.split("=", 1)[0].strip() for o in overrides)):
            return e   # it names a key that an override sets: the override's
        return ConfigError(f"resume: {config}: {msg}; that run's config.json holds a value this swarm refuses: "
                           f"override it with --set {key.group(1)}=VALUE")
    if refused_alone == msg and str(config) not in msg:   # no key to tell by (an unknown key, a torn file)
        return ConfigError(f"resume: {config}: {msg}")
    return e


def _check_resume_env(prev: Path, spec: Spec) -> None:
    """Refuse to resume the run in ``prev`` on an env (``--set env=...``) whose observations or
    number of actions differ from that run's: every peer's checkpoint and replay buffer hold
    the old env's, and each peer would fail on its own, after the launch."""
    from ..config import read_file  # noqa: PLC0415
    from ..rl.train import make_env  # noqa: PLC0415 - gymnasium, not torch

    old = read_file(prev / "config.json").get("env", Spec().env)
    if old == spec.env:
        return

    def sizes(env_id: Any) -> tuple[tuple[int, ...] | None, int | None]:
        try:
            env = make_env(env_id)
        except ConfigError as e:
            raise ConfigError(f"resume: {prev} trained env = {old!r} and this run asks for env = {spec.env!r}; "
                              f"cannot compare them: {e}") from None
        try:
            shape = getattr(env.observation_space, "shape", None)
            n = getattr(env.action_space, "n", None)
            return (None if shape is None else tuple(shape)), (None if n is None else int(n))
        finally:
            env.close()

    was, now = sizes(old), sizes(spec.env)
    if was != now:
        def say(s: tuple[tuple[int, ...] | None, int | None]) -> str:
            return f"observations of shape {s[0]}, {s[1]} actions"
        raise ConfigError(f"resume: {prev} trained env = {old!r} ({say(was)}), but env = {spec.env!r} has "
                          f"{say(now)}: the peers' checkpoints and replay buffers hold the old env's; resume "
                          f"with env = {old!r}, or start a new run")


def _no_checkpoint(prev: Path, spec: Spec, missing: list[int]) -> ConfigError:
    """The error of ``swarm run --resume prev`` where the peers ``missing`` (ranks of
    ``spec``) have no checkpoint in ``prev`` nor in the runs that their runs there continue
    (:func:`~swarm.experiment.runner.resume_point`): a fresh run killed before its first
    full checkpoint (``checkpoint.full_every_s`` after its start, by default) has none at
    all, and a resume with more peers than that run had has none for the ranks it adds."""
    from ..config import read_file, to_dict  # noqa: PLC0415
    from .runner import resume_sources  # noqa: PLC0415

    old = read_file(prev / "config.json")
    had = old.get("peers", Spec().peers)
    older = sorted({str(f.parent) for r in missing for f, _ in resume_sources(peer_dir(prev, r))[1:]})
    nor = f" (nor has {', '.join(older)}, the run it continues)" if older else ""
    if all(r in missing for r in range(min(had, spec.peers))):
        ck = {**to_dict(CheckpointSpec()), **old.get("checkpoint", {})}
        return ConfigError(f"resume: no peer of {prev} has a checkpoint (ckpt/ or checkpoint.pt){nor}: that run ended "
                           f"before its first one (checkpoint.full_every_s = {ck['full_every_s']:g} and "
                           f"checkpoint.full_every_steps = {ck['full_every_steps']} in its config.json), so there is "
                           f"nothing to resume; start it again with swarm run {prev / 'config.json'} (a lower "
                           "checkpoint.full_every_s or a checkpoint.full_every_steps makes the first checkpoint "
                           "come sooner)")
    if had != spec.peers:
        return ConfigError(f"resume: {prev} has no checkpoint for peer(s) {missing}: that run had peers = {had}, "
                           f"and peers = {spec.peers} must match it")
    return ConfigError(f"resume: {prev} has no checkpoint for peer(s) {missing}{nor}: they ended before their first "
                       f"one, and a resume needs every peer's; start the run again with swarm run "
                       f"{prev / 'config.json'}")


#: float32 copies of its Q-network's parameters a DQN peer holds for its whole run: the
#: agent's online and target networks, gradient, Adam's two moments and its scratch
#: (swarm/rl/dqn.py, FlatAdam). Computing a gradient and saving a checkpoint take more
#: for a while, so a run needs at least this much.
AGENT_COPIES = 6
#: and the gossip engine's, besides one per neighbour whose parameters it mixes in: the
#: public copy of its own parameters, the delta buffer and the parameters before a mix
#: (swarm/gossip/engine.py; with the identity codec: two snapshots and the pre-mix copy)
GOSSIP_COPIES = 3


def _check_resume_peers(prev: Path, spec: Spec) -> None:
    """Refuse to resume the run in ``prev`` with fewer peers than it had: the ranks left out
    would be dropped with their training (more have no checkpoint: :func:`_no_checkpoint`)."""
    from ..config import read_file  # noqa: PLC0415

    had = read_file(prev / "config.json").get("peers", Spec().peers)
    if spec.peers < had:
        raise ConfigError(f"resume: {prev} had peers = {had}, and peers = {spec.peers} must match it: a resume goes "
                          f"on with every peer of that run, and peer(s) {list(range(spec.peers, had))} would be "
                          f"left out; resume with peers = {had}, or start a new run")


def _resume_budget(prev: Path, spec: Spec, points: list[Path]) -> list[str]:
    """The peers whose checkpoint (in ``points``) is at or past ``budget.env_steps`` already,
    to warn of: they end at once. With every peer there it is a ConfigError instead, before
    anything starts: the run would start a swarm to train nothing, and its config.json
    would record a budget it never kept.

    A checkpoint's env steps are its manifest's (``ckpt/``); a peer that resumes from
    ``checkpoint.pt`` is not counted (reading it takes torch, which `swarm run` leaves to
    its peers)."""
    from .checkpoint import committed  # noqa: PLC0415

    def steps(folder: Path) -> int | None:
        for ck in committed(folder / "ckpt"):   # newest first; one that cannot be read is passed over, as on load
            try:
                n = json.loads((ck / "manifest.json").read_text())["counters"]["env_steps"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            return n if isinstance(n, int) else None
        return None

    budget = spec.budget.env_steps
    done = {r: n for r, n in enumerate(map(steps, points)) if n is not None and n >= budget}
    if not done:
        return []
    said = ", ".join(f"peer{r} {n}" for r, n in done.items())
    if len(done) == len(points):
        raise ConfigError(f"resume: {prev}'s peers already did their env steps ({said}); budget.env_steps = "
                          f"{budget} leaves nothing to train: raise budget.env_steps (--set "
                          f"budget.env_steps=N, N above {max(done.values())})")
    return [f"resume: peer(s) {list(done)} of {prev} already did their env steps ({said}), "
            f"budget.env_steps = {budget}: they end at once, without training"]


def _q_parameters(obs_size: int, hidden: list[int], n_actions: int) -> int:
    """The parameters of DQN's Q-network (:class:`swarm.rl.dqn.QNetwork`, an MLP of linear
    layers with biases), counted without torch, which `swarm run` itself does not import.

        >>> _q_parameters(4, [64, 64], 2)   # the default network on CartPole-v1
        4610
    """
    widths = [obs_size, *hidden, n_actions]
    return sum((w_in + 1) * w_out for w_in, w_out in zip(widths, widths[1:]))


def _network_copies(spec: Spec) -> list[int]:
    """How many float32 copies of its Q-network's parameters each peer holds
    (:data:`AGENT_COPIES`, :data:`GOSSIP_COPIES` and one per neighbour it mixes in, in
    the topology's first round), by rank."""
    from ..gossip.topology import senders  # noqa: PLC0415 - numpy only, as the spec's checks import it

    g = spec.gossip
    if spec.peers == 1:
        return [AGENT_COPIES]   # no neighbour: the engine makes none of its copies
    return [AGENT_COPIES + GOSSIP_COPIES + len(senders(g.topology, spec.peers, r, edges=g.edges or None,
                                                       seed=spec.seed))
            for r in range(spec.peers)]


def _check_memory(spec: Spec) -> None:
    """Refuse a run whose replay buffers and Q-networks cannot fit in this host's memory (in
    a container, its cgroup's limit: :func:`_available_memory`), before it starts anything:
    each peer would fail on its own, after the launch, allocating its buffer or network, or
    be killed by the OOM killer. The error names ``dqn.hidden`` where the networks take
    more than the buffers, else ``buffer.capacity``."""
    import gymnasium  # noqa: PLC0415 - load_spec has imported it already

    b = spec.buffer
    env = gymnasium.make(spec.env)    # load_spec made it once: it can be made
    try:
        obs_size = math.prod(env.observation_space.shape)
        n_actions = int(env.action_space.n)    # load_spec checked that it is Discrete
    finally:
        env.close()
    each = _replay_bytes(b.capacity, obs_size, b.replicas if b.sharing else 0)
    buffers = each * spec.peers
    params = _q_parameters(obs_size, spec.dqn.hidden, n_actions)
    copies = _network_copies(spec)
    networks = 4 * params * sum(copies)
    available = _available_memory()
    if available is None or buffers + networks <= available:
        return
    cgroup = _cgroup_memory()
    limit = (f", or raise this process's cgroup memory limit ({_size(cgroup[0])}, {_size(cgroup[1])} of it "
             "in use)" if cgroup is not None and cgroup[0] - cgroup[1] <= available else "")
    more = f"more than the {_size(available)} of memory this host has available"
    if networks > buffers:
        held = f"{min(copies)}" if min(copies) == max(copies) else f"{min(copies)} to {max(copies)}"
        if spec.peers > 1:
            holds = (f"each peer holds {held} copies (online and target networks, gradient, Adam's two moments and "
                     "its scratch, and gossip's copies of its own parameters and its neighbours'): "
                     f"{_size(buffers + networks)} for the {spec.peers} peers with their replay buffers")
        else:
            holds = (f"the peer holds {held} copies (online and target networks, gradient, Adam's two moments and "
                     f"its scratch): {_size(buffers + networks)} with its replay buffer")
        raise ConfigError(f"dqn.hidden = {spec.dqn.hidden}: a Q-network of {params:,} parameters takes "
                          f"{_size(4 * params)} a copy (float32), and {holds}, {more}; lower dqn.hidden"
                          + (" or peers" if spec.peers > 1 else "") + limit)
    per = f"{each / b.capacity:.0f} bytes a transition of {spec.env}"
    what = (f"the replay buffers of the {spec.peers} peers would take about {_size(buffers)} "
            f"({_size(each)} each, {per})" if spec.peers > 1 else
            f"the peer's replay buffer would take about {_size(each)} ({per})")
    if buffers <= available:   # the networks tip it over
        what += f", and {'their Q-networks' if spec.peers > 1 else 'its Q-network'} another {_size(networks)}"
    raise ConfigError(f"buffer.capacity = {b.capacity}: {what}, {more}; lower buffer.capacity"
                      + (" or peers" if spec.peers > 1 else "") + limit)


def _deadline_env(launch: Launch) -> dict[str, str] | None:
    """A peer's environment for budget.max_seconds: the run's end on the monotonic clock,
    which the peers on this host share (not the wall clock, which may step)."""
    if launch.deadline is None:
        return None
    return {"SWARM_RUN_ENDS": repr(launch.deadline)}


def _coordinator_args(spec: Spec, addr: str, page_port: int = 0) -> list[str]:
    """`swarm coordinator` at ``addr`` with its status page on loopback port ``page_port``
    (0: a free one)."""
    # the status page's title and the `run` label of /metrics name the experiment
    # quoted: a name such as 123 or 1e5 is a string, not a TOML number
    return ["coordinator", "--bind", addr, "--set", f"coordinator.run_name={json.dumps(spec.name)}",
            "--set", f'coordinator.http_bind="127.0.0.1:{page_port}"']


def _page_port(url: str) -> int:
    """The port of the status page at ``url`` where this host can bind it again now (a
    restarted coordinator serves its page there: a scrape target or an open browser tab
    keeps working), else 0: none known yet, or another process took it."""
    port = urlsplit(url).port if url else None
    if not port:
        return 0
    with socket.socket() as s:
        # as the coordinator binds it: the old page's connections in TIME_WAIT do not count
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


def _note_page(launch: Launch, st: dict[str, Any] | None, progress: _Progress) -> None:
    """Print the status page's URL where the coordinator's answer ``st`` gives one that
    ``launch`` has not said yet: its first, or a restarted coordinator's on a new port."""
    url = (st or {}).get("http") or ""
    if not url or url == launch.page:
        return
    said = (f"coordinator {st.get('coordinator')}, status page {url} (/metrics for Prometheus)" if not launch.page
            else f"the coordinator's status page is now at {url} (it was at {launch.page})")
    launch.page = url
    progress.done()   # below the progress line's last figures
    print(f"swarm run: {said}", file=progress.out, flush=True)


def _peer_args(config: Path, rank: int, addr: str, run_dir: Path) -> list[str]:
    return ["peer", "--spec", str(config), "--rank", str(rank), "--coordinator", addr, "--run-dir", str(run_dir)]


#: restarts in a row (each dead within SERVED_S of its start) per peer, and of the coordinator,
#: before `swarm run` lets it stay dead (one that crashes at once would loop: a coordinator
#: whose address another process took meanwhile)
MAX_RESTARTS = 20
#: How `swarm peer` reports a resume that cannot be done (no checkpoint of the old run loads,
#: or one does not fit the spec): a ConfigError, so the note follows it, but this line says
#: enough by itself (the files do not change between starts).
_RESUME_ERROR = "swarm: error: resume: "
#: how long a crashed peer's restart waits for the coordinator to declare it dead
RESTART_WAIT_S = 30.0
#: a process that ran this long before it died is not in a crash loop: its restarts count
#: towards MAX_RESTARTS afresh (a long chaos run kills the coordinator every minute or so)
SERVED_S = 60.0


def _lasting_error(log: Path) -> bool:
    """Whether a child's log ends in an error that every start of it would meet again: a
    ConfigError (a checkpoint that does not fit the spec, a resume that cannot be done, a
    config.json changed under the run), which a child of `swarm run` follows with
    ``cli.CONFIG_ERROR_NOTE``. Exit code 2 alone says no more than "a SwarmError", which a
    restart may well cure (a refused takeover, a join that timed out, an address in use)."""
    from ..cli import CONFIG_ERROR_NOTE  # noqa: PLC0415 - cli imports this module lazily too

    last = _tail(log, 3)
    return CONFIG_ERROR_NOTE in last or _RESUME_ERROR in last


def _finished(run_dir: Path, rank: int, c: _Child) -> str | None:
    """The ``reason`` of the summary.json that process ``c`` wrote on its way out (budget,
    time limit, ...), or None: it wrote none (or the one of a failure, reason ``error``)."""
    path = peer_dir(run_dir, rank) / "summary.json"
    try:
        if path.stat().st_mtime < c.started:
            return None     # a predecessor's
        reason = json.loads(path.read_text()).get("reason")
    except (OSError, ValueError, AttributeError):
        return None
    return None if reason in (None, "error") else str(reason)


def _crashed_after_summary(launch: Launch, r: int, c: _Child, out: TextIO) -> bool:
    """A peer that crashed after it wrote its final summary (while it closed its sockets, or
    at exit): its results are whole, so it is not restarted nor are the others ended, but it
    is a crash all the same and the run's exit code is 1. Returns whether ``c`` is one."""
    done = _finished(launch.run_dir, r, c)
    if done is None:
        return False
    launch.given_up[c.name] = f"{done}, then exited with {c.how()}"
    print(f"swarm run: {c.exited()} after it wrote its summary ({done}): its results are complete and it "
          f"is not restarted, but the run counts it as a crash; last lines of {c.log}:\n{_tail(c.log)}",
          file=out, flush=True)
    return True


def _stopped_from_outside(launch: Launch, peers: list[_Child], progress: _Progress, out: TextIO) -> None:
    """Peers that exited 0 because a signal from outside swarm run stopped them (their
    summary's reason is ``stopped``; swarm run signals a peer only while it ends it): their
    results are whole, so they are not restarted and the others go on, but the run did not
    train as it was told to, so each is said and makes the exit code 1."""
    for r, c in enumerate(peers):
        if c.exit_read or c.ended_by_us or c.proc.poll() != 0 or c.name in launch.given_up:
            continue
        c.exit_read = True
        if _finished(launch.run_dir, r, c) == "stopped":
            launch.given_up[c.name] = "stopped from outside swarm run"
            progress.done()
            print(f"swarm run: {c.name} (pid {c.proc.pid}) was stopped before its budget by a signal from "
                  f"outside swarm run (its results are complete; not restarting it)", file=out, flush=True)


def _left_down(launch: Launch, c: _Child, out: TextIO) -> bool:
    """restart_dead: whether crashed ``c`` (a peer or the coordinator) stays down, because its
    start failed on an error that every start would meet again or it crashed again after
    :data:`MAX_RESTARTS` restarts. If so, says why with the last lines of its log and records
    it in ``given_up``."""
    if c.proc.returncode == 2 and _lasting_error(c.log):
        launch.given_up[c.name] = "error; not restarted"
        print(f"swarm run: {c.exited()} on an error that a restart would meet again; not "
              f"restarting it; last lines of {c.log}:\n{_tail(c.log)}", file=out, flush=True)
        return True
    if time.time() - c.started >= SERVED_S:
        launch.in_a_row[c.name] = 0   # it served a while: not a crash loop (chaos kills it now and then)
    if launch.in_a_row.get(c.name, 0) >= MAX_RESTARTS:
        launch.given_up[c.name] = f"crashed; not restarted after {MAX_RESTARTS} restarts"
        print(f"swarm run: {c.exited()} after {MAX_RESTARTS} restarts (the limit); not restarting "
              f"it again; last lines of {c.log}:\n{_tail(c.log)}", file=out, flush=True)
        return True
    return False


def _count_restart(launch: Launch, name: str) -> None:
    """``name`` is started again: one more restart, and one more in a row."""
    launch.restarts[name] = launch.restarts.get(name, 0) + 1
    launch.in_a_row[name] = launch.in_a_row.get(name, 0) + 1


def _restart_crashed(launch: Launch, spec: Spec, coord: _Child, peers: list[_Child], addr: str,
                     pending: dict[int, float], out: TextIO, ending: bool = False) -> _Child:
    """restart_dead: start a dead coordinator again at once, and each crashed peer once the
    coordinator lets its id be taken over. Returns the (possibly new) coordinator.

    Not restarted, each with a line and a ``given_up`` reason (the run's exit code is 1): a
    peer or coordinator that :func:`_left_down` leaves down or whose restart cannot be spawned
    (:func:`_start_failed`; for the coordinator, :func:`_supervise` then ends the run), a
    peer that crashed after its final summary (see :func:`_crashed_after_summary`),
    and any peer that crashed once the run's time is up, while ``ending`` (the others are
    ending) or with the coordinator left down.
    """
    now = time.monotonic()
    # The coordinator never ends by itself: an exit 0 is a SIGTERM from someone else.
    if (coord.proc.poll() is not None and not coord.ended_by_us and "coordinator" not in launch.given_up
            and not _left_down(launch, coord, out)):
        port = _page_port(launch.page)
        again = f"starting it again on {addr}"
        if port:
            again += f", its status page at {launch.page}"
        elif launch.page:   # the new URL is said once it answers (_note_page)
            again += f"; another process took the port of its status page ({launch.page}): the page moves to a new one"
        print(f"swarm run: {coord.exited()}; {again}", file=out, flush=True)
        try:
            coord = launch.start("coordinator", _coordinator_args(spec, addr, port))
            _count_restart(launch, "coordinator")
        except OSError as e:
            _start_failed(launch, coord, e, out)
    late = launch.deadline is not None and time.monotonic() >= launch.deadline
    why = ("the run's time is up" if late else "the run is ending" if ending
           else "the coordinator is down" if "coordinator" in launch.given_up else "")
    if why:
        # No restart once the run's time is up, it is ending, or the coordinator is left down:
        # the other peers are ending too.
        for r in sorted(pending):
            c = peers[r]
            launch.given_up[c.name] = f"crashed; not restarted ({why})"
            print(f"swarm run: {c.name} is not restarted after all: {why}; last lines of {c.log}:\n"
                  f"{_tail(c.log)}", file=out, flush=True)
        pending.clear()
    for r, c in enumerate(peers):
        name = f"peer{r}"
        if r in pending or c.proc.poll() in (None, 0) or c.ended_by_us or name in launch.given_up:
            continue
        if _crashed_after_summary(launch, r, c, out):
            continue
        if why:
            launch.given_up[name] = f"crashed; not restarted ({why})"
            print(f"swarm run: {c.exited()}; not restarting it: {why}; last lines of {c.log}:\n{_tail(c.log)}",
                  file=out, flush=True)
        elif not _left_down(launch, c, out):
            print(f"swarm run: {c.exited()}; restarting it once the coordinator has declared it dead "
                  f"(its log: {c.log})", file=out, flush=True)
            pending[r] = now
    if not pending:
        return coord
    st = _status(addr)
    members = {m["id"]: m for m in (st or {}).get("members", [])}
    for r in list(pending):
        m = members.get(f"peer{r}")
        if st is None or (m is not None and m.get("state") != "dead" and now - pending[r] < RESTART_WAIT_S):
            continue  # the coordinator is down, or still holds the old process as a live member
        del pending[r]
        name = f"peer{r}"
        # A member the coordinator knows is taken over (same rank); after a coordinator
        # restart the id is unknown to it and a plain join with the same rank does.
        # A coordinator restarted between that status and the join does not know the id and
        # refuses the takeover: the last attempt's log says so, and a plain join is right then.
        refused = "no such member to take over" in _tail(peers[r].log, 3)
        extra = ["--replace", name] if m is not None and not refused else []
        from .checkpoint import latest  # noqa: PLC0415

        if latest(peer_dir(launch.run_dir, r) / "ckpt") is not None:
            extra += ["--resume-from", str(launch.run_dir)]
        elif launch.resumed is not None:   # died before its first checkpoint here: back to the old run's
            extra += ["--resume-from", str(launch.resumed)]
        config = launch.run_dir / "config.json"
        # budget.max_seconds limits the whole run: the new process gets what is left of it.
        try:
            peers[r] = launch.start(name, _peer_args(config, r, addr, launch.run_dir) + extra,
                                    env=_deadline_env(launch), fork=True)
            _count_restart(launch, name)
        except OSError as e:
            _start_failed(launch, peers[r], e, out)
    return coord


def _start_failed(launch: Launch, c: _Child, e: OSError, out: TextIO) -> None:
    """restart_dead: crashed ``c`` could not be started again (an OSError of the spawn: too
    many open files, no memory, the python binary or the log folder gone). It is left down
    as after :data:`MAX_RESTARTS`, with a line and the error in its ``given_up`` reason (the
    run goes on: the error, left to rise, ended it with a traceback and no summary)."""
    why = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    launch.given_up[c.name] = f"crashed; not restarted (its restart failed: {why})"
    print(f"swarm run: cannot start {c.name} again: {why}; leaving it down; last lines of {c.log}:\n"
          f"{_tail(c.log)}", file=out, flush=True)


def _supervise(launch: Launch, spec: Spec, coord: _Child, peers: list[_Child], addr: str,
               progress: _Progress, intr: _Interrupt, out: TextIO) -> int:
    t0 = time.monotonic()
    limit = spec.budget.max_seconds
    stopping = False
    pending: dict[int, float] = {}   # rank -> when its crash was seen (restart_dead)
    while True:
        if intr.count:
            progress.done()
            print(f"swarm run: {intr.what()}; ending the peers (they write their metrics first)", file=out,
                  flush=True)
            launch.end([c for c in peers], hurry=intr.hurry)
            return 130
        if spec.restart_dead:
            coord = _restart_crashed(launch, spec, coord, peers, addr, pending, out, ending=stopping)
            if "coordinator" in launch.given_up:
                # Left down: no peer could rejoin nor a crashed one be restarted, so the run ends
                # as a coordinator crash without restart_dead ends it.
                progress.done()
                print("swarm run: the coordinator is down for good; ending the peers (they write their "
                      "results first)", file=out, flush=True)
                launch.end(peers, hurry=intr.hurry)
                return 1
        _stopped_from_outside(launch, peers, progress, out)
        # Without restart_dead a crash ends the run, whenever it comes (the coordinator never
        # ends by itself: an exit 0 is a SIGTERM from someone else; a peer's 0 is its budget spent).
        for r, c in [(-1, coord), *enumerate(peers)]:
            rc = c.proc.poll()
            if (spec.restart_dead or rc is None or (rc == 0 and c is not coord) or c.ended_by_us
                    or c.name in launch.given_up):
                continue
            progress.done()
            if c is not coord and _crashed_after_summary(launch, r, c, out):
                continue    # its results are whole: the others go on
            print(f"swarm run: {c.exited()}; last lines of {c.log}:\n{_tail(c.log)}", file=out, flush=True)
            print("swarm run: ending the other processes (they write their results first)", file=out, flush=True)
            launch.end([p for p in peers if p is not c], hurry=intr.hurry)
            return 1
        alive = sum(p.proc.poll() is None for p in peers) + len(pending)
        if spec.budget.stop_when_solved and not stopping and alive < len(peers) and _solved(launch.run_dir, peers):
            # One peer's greedy policy solved the task: the swarm has its model.
            stopping = True
            progress.done()
            print("swarm run: a peer solved the task; ending the others", file=out, flush=True)
            launch.end(peers, hurry=intr.hurry)
            continue
        if alive == 0:
            if _unseen_crash(launch, peers):
                continue    # the last one crashed after the checks above polled it: they take it now
            # and one stopped from outside that exited 0 since _stopped_from_outside polled it
            _stopped_from_outside(launch, peers, progress, out)
            progress.final(launch.run_dir)
            return 1 if launch.given_up else 0   # a peer left down is a crash, as without restart_dead
        if limit and not stopping and time.monotonic() - t0 > limit + 30.0:
            # Peers stop themselves at the limit; this is the backstop for one that does not.
            stopping = True
            print(f"swarm run: budget.max_seconds = {limit} passed; ending the peers", file=out, flush=True)
            launch.end(peers, hurry=intr.hurry)
        # a coordinator that is down (being restarted) shows nothing new: the last figures stand
        st = _status(addr) if coord.proc.poll() is None else None
        _note_page(launch, st, progress)   # a restarted coordinator's page on a new port
        progress.update(st, alive)
        time.sleep(POLL_S)


def _unseen_crash(launch: Launch, peers: list[_Child]) -> bool:
    """Whether a peer has crashed that :func:`_supervise` has not dealt with yet (reported,
    restarted or given up on): one that ended between the poll of its checks and the count
    of live peers. Once every peer has ended, their codes no longer change."""
    return any(c.proc.poll() not in (None, 0) and not c.ended_by_us and c.name not in launch.given_up
               for c in peers)


def _solved(run_dir: Path, peers: list[_Child]) -> bool:
    for r, c in enumerate(peers):
        if c.proc.poll() == 0:
            try:
                if json.loads((peer_dir(run_dir, r) / "summary.json").read_text()).get("reason") == "solved":
                    return True
            except (OSError, ValueError):
                pass
    return False


# ------------------------------------------------------------------ results

def read_csv(path: Path) -> list[dict[str, str]]:
    """The whole rows of one of a run folder's CSV files (empty when it is missing). A row
    cut short is left out: a peer killed mid-flush, or on a full disk, leaves its last line
    without its newline or its last fields, and so is one that is not UTF-8 (damaged)."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")   # a byte that is not UTF-8 reads as U+FFFD
    except OSError:
        return []
    text = text[:text.rfind("\n") + 1]   # up to the last newline: a line after it is cut short
    return [row for row in csv.DictReader(io.StringIO(text))
            if None not in row.values() and not any("\ufffd" in str(v) for v in row.values())]


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _count(v: Any) -> int:
    """A counter from a CSV field: 0 where it is empty or not a finite number."""
    x = _num(v)
    return int(x) if math.isfinite(x) else 0


def _peer_folders(run_dir: Path) -> dict[int, Path]:
    """The peers' folders in ``run_dir`` by rank: only ``peer{r}`` as a peer names it, not a
    user's ``peer0-old/`` nor ``peer01`` (peer1's?), nor ``peer²`` (str.isdigit, but no int)."""
    found = (re.fullmatch(r"peer(0|[1-9][0-9]*)", p.name) for p in run_dir.glob("peer*") if p.is_dir())
    return {int(m[1]): run_dir / m[0] for m in found if m}


def summarize(run_dir: str | Path, spec: Spec | None = None,
              exits: dict[str, int | None] | None = None) -> list[dict[str, Any]]:
    """One row per peer from its ``summary.json``, or from its other files when it has none (it
    crashed, or its summary.json could not be written: a peer that trains removes an earlier
    process's first, so that one is not shown as its figures): see :func:`_row_from_files`.
    ``exits``: the exit status of each peer's last process by id, where known; a peer that
    exited 0 without one is not said to have crashed."""
    run_dir = Path(run_dir)
    ranks = (range(spec.peers) if spec
             else sorted(_peer_folders(run_dir)))
    rows = []
    for r in ranks:
        d = peer_dir(run_dir, r)
        try:
            s = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            s = _row_from_files(d, r)
            if (exits or {}).get(f"peer{r}") == 0:   # it ended cleanly: its log says why the file is not there
                s["reason"] = f"no summary.json (not written: see logs/peer{r}.log)"
        rows.append(s)
    return rows


def _row_from_files(d: Path, r: int) -> dict[str, Any]:
    """The row of peer ``r``, whose folder ``d`` has no summary.json, from what it wrote as it
    went. metrics.csv has a row per finished episode only (one may run 500 steps), so the
    steps and rounds are the furthest of its, rounds.csv's and evals.csv's last rows; the
    last evaluation is evals.csv's, and the best the one in ``best.pt`` (as `swarm eval`
    plays it; one another run left in the folder does not count), else evals.csv's highest."""
    from .checkpoint import read_lineage  # noqa: PLC0415 - numpy: off `swarm run --show`'s path
    from .runner import _read_best  # noqa: PLC0415

    eps, rounds, evals = (read_csv(d / f) for f in ("metrics.csv", "rounds.csv", "evals.csv"))
    last = eps[-1] if eps else {}
    mean = _num(last.get("mean_return"))
    s: dict[str, Any] = {
        "rank": r, "id": f"peer{r}", "reason": "no summary (crashed, or a full disk?)",
        "env_steps": max(_count(rows[-1].get("env_steps")) if rows else 0 for rows in (eps, rounds, evals)),
        "final_mean_return": mean if math.isfinite(mean) else None,
        "rounds": max(_count(last.get("rounds")), _count(rounds[-1].get("round")) if rounds else 0),
        "bytes_out": _count(last.get("bytes_out"))}
    scored = [(x, _count(e.get("env_steps"))) for e in evals if math.isfinite(x := _num(e.get("eval_return")))]
    if evals and math.isfinite(_num(evals[-1].get("eval_return"))):
        s["eval_return"] = _num(evals[-1]["eval_return"])
    # read only where there is one: reading it imports torch
    best = _read_best(d / "best.pt", read_lineage(d).id) if (d / "best.pt").is_file() else None
    if best is None:   # the first of the highest, as the peer kept it: a later one replaced it only by doing better
        best = max(scored, key=lambda e: e[0], default=None)
    if best is not None:
        s.update(best_eval_return=best[0], best_eval_at=best[1])
    return s


def _relay_ending(rows: list[dict[str, Any]], spec: Spec) -> list[str]:
    """What the ending of a run with ``gossip.exchange = gradients`` says of the peers'
    copies (``rows``: the peers' summaries): where their digests part, or who took
    another's copy and whether the copies were seen to agree after it."""
    d = spec.dqn
    shared = (f"peers share turns (dqn.train_every = {d.train_every} with peers = {spec.peers})"
              if spec.peers > d.train_every else None)
    split = _first_divergence(rows)
    if split is not None:
        return [_divergence_line(split, spec.gossip, shared)]
    # A peer's digests start afresh at each copy it takes (runner's adopt): the counts
    # compared all come after every peer's last copy. None compared is no agreement
    # (r2 of the 49th review: peer1 kept only counts past peer0's last one).
    seen = ("the copies agree from then on" if _compared_digests(rows) else
            "no digest count after its last copy was held by every peer (short of the last two), so the "
            "copies were not compared after it")
    said = []
    for row in rows:
        took = (row.get("relay") or {}).get("resynced") or []
        if not took:
            continue
        n, src = len(took), ", ".join(sorted({str(t.get("from")) for t in took}))
        if shared is None:
            said.append(f"swarm run: {row.get('id')} fell out of step with the relay's turns and took another "
                        f"peer's copy {n} time{'s' * (n != 1)} (from {src}); {seen}")
            continue
        # not a peer out of step: shared turns part the copies at each turn (spec.py's warning)
        moved = sum(t.get("next") is not None for t in took)
        said.append(f"swarm run: {row.get('id')}'s copy kept parting from the others' as {shared}: it took "
                    f"another peer's copy {n} time{'s' * (n != 1)} (from {src})"
                    + (f", {moved} of which moved its turns ahead of its env steps (its last turns then reach "
                       "no peer)" if moved else "") + f"; {seen}")
    return said


def _divergence_line(split: int, g: Any, shared: str | None = None) -> str:
    """What the ending says where the peers' relay digests part at update ``split`` (a
    run with ``gossip.exchange = gradients``; ``g`` its spec's gossip section; ``shared``
    says that peers share turns, when they do)."""
    where = f"swarm run: the peers' parameters differ from update {split} on (summary.json, relay digests)"
    if shared is not None and not g.average:
        return (f"{where}: {shared}, and such peers apply each other's gradients in different orders, so their "
                "copies part at each turn, whatever copies they take")
    if g.average:
        # averaging mixes each copy with lagging estimates of its neighbours': the copies
        # part whether or not a peer fell out of step (spec.py, gossip.average)
        return (f"{where}, as they do with gossip.average = true: averaging mixes each copy with lagging "
                "estimates of its neighbours' (gossip.average = false keeps them the same)")
    # with relay_staleness 1, a copy out of step takes another's (docs/gossip.md)
    return (f"{where}: a peer fell out of step with the relay's turns (frozen, restarted or timed out) and its "
            "gradients were applied late; "
            + ("it did not take another peer's copy before the run ended" if g.relay_staleness == 1
               else "with gossip.relay_staleness > 1 nothing brings the copies back together"))


def _first_divergence(rows: list[dict[str, Any]]) -> int | None:
    """With relayed gradients: the first update count at which the peers' parameter
    digests (``relay.digests`` in their summaries) differ, None if they agree.

    The last two digest points all peers reached are left out: a peer that stopped
    first may have taken its last gradients with it, which is no fault of the relay.
    They are cut by count, not by position: a peer that ran on far longer kept only
    one in 2^j of its older digests (see ``runner._thin_digests``), and the last two
    counts the peers share could lie far before the end of the shorter one.
    """
    digests = [(r.get("relay") or {}).get("digests") for r in rows]
    return next((u for u in _compared_digests(rows) if len({g[str(u)] for g in digests}) > 1), None)


def _compared_digests(rows: list[dict[str, Any]]) -> list[int]:
    """The update counts at which :func:`_first_divergence` compares the peers' digests:
    those every peer holds, less the last two points; none for fewer than two peers."""
    digests = [(r.get("relay") or {}).get("digests") for r in rows]
    if len(digests) < 2 or not all(isinstance(g, dict) and g for g in digests):
        return []
    top = min(max(int(u) for u in g) for g in digests) - 2 * DIGEST_EVERY
    return sorted(int(u) for u in digests[0] if all(u in g for g in digests) and int(u) <= top)


def _table(rows: list[dict[str, Any]]) -> str:
    """The summary table; ``eval`` is the last greedy evaluation, ``best eval`` the
    highest and the env step it came at (its parameters are in ``peer{r}/best.pt``)."""
    head = (f"{'peer':<7} {'steps':>8} {'mean return':>12} {'eval':>7} {'best eval':>14} {'rounds':>7} "
            f"{'MB sent':>8} {'CPU s':>7}  end")
    lines = [head, "-" * len(head)]
    for s in rows:
        ret = s.get("final_mean_return")
        ev = s.get("eval_return")
        best = s.get("best_eval_return")
        cpu = s.get("cpu_s")
        best_s = f"{best:.1f} @ {s.get('best_eval_at', '?')}" if best is not None else "-"
        end = s.get("reason", "")
        skipped = s.get("skipped")
        if isinstance(skipped, int) and skipped > 0:   # a peer that learned nothing still ends "budget"
            end += f" ({skipped} updates skipped: loss or gradient not finite)"
        lines.append(f"{s.get('id', '?'):<7} {s.get('env_steps', 0):>8} "
                     f"{(f'{ret:.1f}' if ret is not None and math.isfinite(ret) else '-'):>12} "
                     f"{(f'{ev:.1f}' if ev is not None else '-'):>7} {best_s:>14} {s.get('rounds', 0):>7} "
                     f"{s.get('bytes_out', 0) / 1e6:>8.2f} {(f'{cpu:.1f}' if cpu else '-'):>7}  {end}")
    return "\n".join(lines)


def _plots(run_dir: Path, out: TextIO) -> list[Path] | None:
    """:func:`write_plots`, or None with a line saying why there are none (matplotlib
    missing; a full disk: the table and the exit code stand)."""
    try:
        return write_plots(run_dir)
    except ImportError:
        print("no plots: matplotlib is not installed (pip install 'matplotlib>=3.8')", file=out)
    except OSError as e:
        print(f"no plots: cannot write them in {run_dir / 'plots'}: {e.strerror or e}", file=out)
    return None


def write_plots(run_dir: str | Path) -> list[Path]:
    """PNG plots of a run folder: return per peer against env steps, gossip bytes per
    round, and the disagreement proxy per round. Returns the files written."""
    # Figures without pyplot: no backend to choose, so a notebook's or a script's own
    # matplotlib settings stay as they were.
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency (the `plots` extra)

    run_dir = Path(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    peers = [folder for _, folder in sorted(_peer_folders(run_dir).items())]
    written = []

    written.append(_save(_returns_figure(peers), out / "returns.png"))

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for p in peers:
        rows = read_csv(p / "rounds.csv")
        if rows:
            ax.plot([_num(r["round"]) for r in rows], [_num(r["bytes_out"]) / 1e3 for r in rows], label=p.name)
    ax.set(xlabel="gossip round", ylabel="kB sent per round (parameter deltas, relayed gradients)",
           title="bytes per round")
    _log_scale(ax)
    _legend(ax)
    written.append(_save(fig, out / "bytes_per_round.png"))

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    plotted = False
    for p in peers:
        rows = [r for r in read_csv(p / "rounds.csv") if r.get("disagreement")]
        if rows:
            ax.plot([_num(r["round"]) for r in rows], [_num(r["disagreement"]) for r in rows], label=p.name)
            plotted = True
    ax.set(xlabel="gossip round", ylabel="RMS move per round / step size",
           title="consensus: distance to the neighbourhood average")
    if plotted:
        _log_scale(ax)
        ax.legend(fontsize=8)
    else:   # gossip.average = false, or no round averaged with anybody
        ax.text(0.5, 0.5, "no parameter averaging in this run", ha="center", va="center",
                transform=ax.transAxes)
    written.append(_save(fig, out / "consensus.png"))
    return written


def _returns_figure(peers: list[Path]) -> Any:
    """returns.png's figure: each peer's mean return (metrics.csv) and its greedy
    evaluations (evals.csv, dots) against env steps; ``peers`` are the peer folders."""
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency (the `plots` extra)

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for p in peers:
        rows = read_csv(p / "metrics.csv")
        if rows:
            ax.plot([_num(r["env_steps"]) for r in rows], [_num(r["mean_return"]) for r in rows], label=p.name)
        ev = read_csv(p / "evals.csv")
        if ev:
            # in the colour of the peer's line; a peer without one (no episode ended) has
            # its dots in the legend instead
            style = {"color": ax.lines[-1].get_color()} if rows else {"label": f"{p.name} eval"}
            ax.plot([_num(r["env_steps"]) for r in ev], [_num(r["eval_return"]) for r in ev], "o", ms=3, **style)
    ax.set(xlabel="env steps (per peer)", ylabel="return (mean of last 10 episodes; dots: greedy eval)",
           title="return per peer")
    _legend(ax)
    return fig


def _log_scale(ax: Any) -> None:
    """A log y axis where a line has a value above 0: of zeros alone (a run whose gossip
    sent nothing, rounds that moved nobody) matplotlib could draw none, and warns."""
    if any(y > 0 for line in ax.lines for y in line.get_ydata()):
        ax.set_yscale("log")


def _legend(ax: Any) -> None:
    """A legend of the labelled lines (and dots); a plot with none, of a run that logged
    nothing, says so."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)


def _save(fig: Any, path: Path) -> Path:
    from .checkpoint import write_whole  # noqa: PLC0415

    from ..buffer.persist import write_synced  # noqa: PLC0415

    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    # synced, then renamed over path: a process killed meanwhile leaves no half a PNG, and
    # a crash after the rename no empty one
    write_whole(path, lambda tmp: write_synced(tmp, png.getvalue()))
    return path
