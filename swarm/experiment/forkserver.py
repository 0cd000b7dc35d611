"""A fork server for `swarm run`'s peers: torch is imported once per run, not once per peer.

A peer process spends ~2.7 s of CPU importing torch before it does anything (and its
pages of torch are its own). `swarm run` therefore starts one fork server per run, while
the coordinator starts: it imports what a peer needs (torch, gymnasium, swarm's runner)
and then forks each peer (``swarm peer --spec ...``) from itself. The peer runs
:func:`swarm.cli.main` as ``python -m swarm.cli`` would, in a session of its own, with the
launcher's environment, its log on stdout and stderr, /dev/null on stdin. It starts in
milliseconds and shares the server's imported pages until it writes them: a 4-peer run's
peers and server came to 376 MB of PSS, against 748 MB for 4 fresh interpreters (RSS
~1 GB either way), and 10-11 s of CPU against 17-22 s for a 500-step run.

The launcher talks to the server through its stdin and stdout, one JSON object a line:

- launcher -> server: ``{"argv": [...], "env": {...}, "log": PATH, "name": NAME}`` forks
  a peer (``swarm ARGV``, named ``swarm NAME`` in ps);
  ``{"reap": PID}`` reaps one whose end the launcher has taken note of;
  ``{"cancel": true}`` gives up the last fork: the launcher stopped waiting for its answer
  (and started that peer otherwise, or not at all: Ctrl-C), so the server kills the child
  it forked for it, which it then reports as any child's end.
- server -> launcher: ``{"pid": PID}`` (or ``{"error": ...}``, or ``{"changed": WHAT}``,
  below) for each fork, in order; ``{"exit": PID, "returncode": RC}`` when a child ends (RC
  as Popen's: -N for signal N).

The server reaps a child only when told (``reap``): until then the ended child holds its
pid, so the launcher's signals (through a pidfd, besides) can never reach another process
that took the number. Each peer's ``SWARM_PARENT_PID`` is the server's pid: a peer stops
once the server is gone, and the server ends when its stdin closes, which the launcher's
end closes, also a SIGKILLed launcher's. So a server killed mid-run ends the run: its
peers stop and write their results (reason ``launcher gone``), the launcher says each
"exited with an unknown status" (the server took their statuses with it) and exits 1.
Where the server cannot start or answer (nor a pidfd be had), `swarm run` starts the peer
as before, a fresh ``python -m swarm.cli``, and asks that server for no more forks (the
peers it has go on); ``SWARM_FORKSERVER=0`` makes it always do so.

The server forks only while swarm's source on disk is what it imported. It takes
:func:`source_fingerprint` of the package it runs from before it imports anything, and again
before each fork (a stat of each ``.py`` file: under a millisecond). Once they differ (the
install was upgraded under a long run, ``git pull`` in an editable one), a fork would run the
old modules it holds beside new ones that the peer imports from disk later (swarm imports
some lazily), and fail in ways that name neither version (``ImportError: cannot import
name ...`` from a file that has it). So the server answers ``{"changed": WHAT}`` (the files
that differ) and forks nothing; `swarm run` logs one line that names them and starts that
peer, and every later one, as a fresh interpreter, which runs the new code whole.

A forked peer's ``/proc/PID/cmdline`` and ``environ`` are the server's (``python -m
swarm.experiment.forkserver``); its name (``ps -o comm``, top) is ``swarm peer{r}``, and
``pids.json`` in the run folder maps each name to its pid.

This module imports nothing heavy at the top: the launcher side needs none of it.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["ForkServer", "Forked", "child_command", "enabled", "source_fingerprint"]

#: seconds the launcher waits for the server's answer to a fork (the first waits for its imports)
ANSWER_S = 60.0
#: seconds between the launcher's looks at ``stop`` (Ctrl-C) while it waits for that answer
STOP_S = 0.1
#: the modules a peer imports, imported once in the server
PRELOAD = ("swarm.cli", "swarm.experiment.runner", "swarm.rl", "swarm.peer", "torch", "gymnasium", "uvloop")
#: the returncode of a forked peer whose end was not reported (its fork server died first,
#: or did not say within REPORT_S)
LOST = 255


#: seconds a child that has ended waits for the server's report of how, before it is ``lost``
REPORT_S = 5.0
#: the folder that holds the swarm package this process runs: site-packages, or the root
#: of a source tree run as ``python -m swarm``
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def child_command(module: str, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``python -m MODULE`` (one of swarm's) with
    the very swarm package this process runs. ``-m`` alone puts the working directory first
    on the child's path, so a ``swarm.py`` or another checkout of swarm there would be
    imported in its place: ``-P`` (Python 3.11) keeps it off, and the folder that holds this
    process's package goes first on ``PYTHONPATH`` (a source tree that no one installed, run
    as ``python -m swarm`` from its root, is then found as well) unless it is a site-packages
    folder, which the child has anyway (first, it would put whatever else it holds before
    the standard library)."""
    command = [sys.executable, "-P", "-m", module]
    if PACKAGE_ROOT in _site_dirs():
        return command, dict(env)
    path = env.get("PYTHONPATH")
    return command, {**env, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + path if path else PACKAGE_ROOT}


def _site_dirs() -> set[str]:
    import site  # noqa: PLC0415 - only when a child is started

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {str(Path(d).resolve()) for d in dirs}


def enabled() -> bool:
    """Whether `swarm run` forks its peers (``SWARM_FORKSERVER`` unset, empty or ``1``; ``0``
    says no), and this system lets it watch them (pidfds: Linux 5.3 and later, not blocked
    by seccomp). Another value is a ConfigError."""
    value = os.environ.get("SWARM_FORKSERVER", "").strip()
    if value not in ("", "0", "1"):
        from ..errors import ConfigError  # noqa: PLC0415 - this module imports nothing of swarm's at the top

        raise ConfigError(f"SWARM_FORKSERVER={value!r}: use 1 (fork the peers from one process that "
                          "imported torch) or 0 (start each peer as a fresh interpreter)")
    if value == "0" or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def source_fingerprint(package: Path) -> dict[str, tuple[int, int]]:
    """Each ``.py`` file under ``package`` (its path relative to it) -> its (mtime_ns, size):
    what any edit, upgrade, new or removed module changes, and an import (which writes
    only ``__pycache__``) does not."""
    found = {}
    for path in package.rglob("*.py"):
        try:
            st = path.stat()
        except OSError:
            continue   # removed while we looked (an upgrade under way): absent, as it now is
        found[str(path.relative_to(package))] = (st.st_mtime_ns, st.st_size)
    return found


def _differences(package: Path, then: dict[str, tuple[int, int]], now: dict[str, tuple[int, int]]) -> str:
    """The files that differ between two fingerprints of ``package``, for a line of the log."""
    changed = sorted(name for name in then.keys() | now.keys() if then.get(name) != now.get(name))
    more = f" and {len(changed) - 1} more file{'s' if len(changed) > 2 else ''}" if len(changed) > 1 else ""
    return f"{package / changed[0]}{more}"


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` is readable within ``timeout`` s (poll: any fd number, unlike select)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0.0, timeout) * 1000))


# -- the launcher's side ------------------------------------------------------------------


class ForkServer:
    """The launcher's handle on its fork server (started at once; it imports in the background)."""

    def __init__(self, log: Path, env: dict[str, str] | None = None) -> None:
        argv, env = child_command("swarm.experiment.forkserver", os.environ if env is None else env)
        with open(log, "w") as f:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f,
                                         env=env, start_new_session=True)
        self.pid = self.proc.pid
        #: pid -> returncode, of children that ended and that no handle has taken yet
        self.exits: dict[int, int] = {}
        self._answers: list[dict[str, Any]] = []
        self._buf = b""
        #: whether the server is there to talk to (its stdout has not ended)
        self.alive = True
        #: whether it is asked for forks: not after one went unanswered or unwatchable, nor
        #: once swarm's source changed since it imported it
        self.forking = True
        #: the files of swarm's source that changed since the server imported it (its
        #: answer to a fork it then refused), else ""
        self.changed = ""
        #: fork answers still to come for requests given up on, and the children they name
        self._late = 0
        self._unwanted: set[int] = set()
        #: children with a handle that has not taken their end yet (a report of another, e.g.
        #: of one declared lost before the server said how it ended, is dropped)
        self.watched: set[int] = set()

    def fork(self, argv: list[str], env: dict[str, str], log: Path, name: str = "",
             stop: Callable[[], bool] | None = None) -> "Forked | None":
        """Start ``swarm ARGV`` as a child of the server, called ``swarm NAME`` in ps and
        top (its command line is the server's); None when the server cannot, and the caller
        then starts the process otherwise. After a fork that went unanswered or could not
        be watched, or that it refused because swarm's source changed since it imported it
        (:attr:`changed` says which files), this server is asked for no more (the children
        it has go on); after one it answered with an error (``os.fork`` failed, say for want
        of memory), it is asked again at the next call. ``stop`` is looked at every :data:`STOP_S` while the
        answer is awaited: once it is true (Ctrl-C) the fork is given up as after
        :data:`ANSWER_S`, and None returned."""
        if not self.forking or not self._send({"argv": argv, "env": env, "log": str(log), "name": name}):
            return None
        deadline = time.monotonic() + ANSWER_S
        while not self._answers and self.alive:
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop()):
                break
            # in slices: a signal's handler runs inside the poll, which then goes on waiting
            self.collect(left if stop is None else min(left, STOP_S))
        if not self._answers:
            # No answer within a minute (a sick machine), or Ctrl-C came: the caller starts
            # the peer afresh, or not at all.
            # The server kills the child it still forks: a launcher whose peers are all Popens
            # may never read the late answer, and that child would run beside its replacement.
            self.forking = False
            self._late += self._send({"cancel": True})
            return None
        answer = self._answers.pop(0)
        if "changed" in answer:
            # a fork would mix the modules the server holds with the new ones on disk
            self.forking = False
            self.changed = answer["changed"]
            return None
        if "pid" not in answer:
            return None
        pid = answer["pid"]
        try:
            # exact: the server keeps the child's pid (a zombie, once it ends) until told to reap
            pidfd = os.pidfd_open(pid)
        except OSError:
            self.forking = False
            self._unwant(pid)    # no way to watch it: the caller starts the peer afresh
            return None
        return Forked(self, pid, pidfd, argv)

    def _unwant(self, pid: int) -> None:
        """Kill a child no handle will watch (safe by pid: the server holds it unreaped)."""
        self.watched.discard(pid)
        if self.exits.pop(pid, None) is not None:
            self.reap(pid)   # it has ended already, and said so
            return
        self._unwanted.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _send(self, msg: dict[str, Any]) -> bool:
        if not self.alive:
            return False
        try:
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):
            self.alive = False
            return False

    def collect(self, timeout: float = 0.0) -> None:
        """Take in what the server has said, waiting up to ``timeout`` s for a first word."""
        if not self.alive:
            return
        fd = self.proc.stdout.fileno()
        while _readable(fd, timeout):
            timeout = 0.0
            data = os.read(fd, 65536)
            if not data:
                self.alive = False   # it died: the children it had are reparented and watched by pidfd
                break
            self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if "exit" in msg:
                    if msg["exit"] in self._unwanted:
                        self._unwanted.discard(msg["exit"])
                        self.reap(msg["exit"])
                    elif msg["exit"] in self.watched:
                        self.exits[msg["exit"]] = msg["returncode"]
                elif self._late:
                    self._late -= 1
                    if "pid" in msg:
                        self._unwant(msg["pid"])
                else:
                    if "pid" in msg:
                        # watched from its answer on: its end may come in this same read, before
                        # fork() takes the answer (a peer that fails at once), and would be dropped
                        self.watched.add(msg["pid"])
                    self._answers.append(msg)

    def reap(self, pid: int) -> None:
        self._send({"reap": pid})

    def close(self) -> None:
        """End the server (its stdin closes) and wait for it; it ends no child of its own."""
        self.alive = False
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class Forked:
    """A peer forked by the server, with the calls `swarm run` makes of a Popen: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``terminate``."""

    def __init__(self, server: ForkServer, pid: int, pidfd: int, args: list[str]) -> None:
        self.server, self.pid, self.args = server, pid, args
        self._pidfd: int | None = pidfd
        self.returncode: int | None = None
        #: why it ended without a report (returncode LOST), else "": its fork server died
        #: first, or did not say within REPORT_S (stopped, stuck)
        self.lost = ""
        self._ended_at: float | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self.server.collect()
        code = self.server.exits.pop(self.pid, None)
        if code is None and _readable(self._pidfd, 0):
            # it has ended; how, only the server can say
            now = time.monotonic()
            if self._ended_at is None:
                self._ended_at = now
            if not self.server.alive:
                code, self.lost = LOST, "the fork server that started it died first"
            elif now - self._ended_at > REPORT_S:
                code, self.lost = LOST, f"its fork server did not say within {REPORT_S:.0f} s"
        if code is not None:
            self.returncode = code
            self.server.watched.discard(self.pid)
            self.server.reap(self.pid)
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            # the server tells how it ended; without the server, the pidfd tells that it did
            if self.server.alive:
                self.server.collect(left)
            else:
                _readable(self._pidfd, left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


# -- the server's side --------------------------------------------------------------------


def _serve(orders: int, answers: int, package: Path, source: dict[str, tuple[int, int]]) -> dict[str, Any] | None:
    """Fork a child for each order until ``orders`` closes (then return None), while
    ``package`` has the ``source`` fingerprint it had when the server imported it. In a
    child, return its order (the server's descriptors closed), for :func:`_child` to run."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    told: set[int] = set()
    last: int | None = None   # the child of the last fork order (None: it failed)
    buf = b""

    def say(msg: dict[str, Any]) -> None:
        os.write(answers, json.dumps(msg).encode() + b"\n")

    while True:
        ready = select.select([orders, wake_r], [], [], 1.0)[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
        if orders in ready:
            data = os.read(orders, 65536)
            if not data:
                return None   # the launcher is done, or dead: its children watch their parent (us)
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                order = json.loads(line)
                if "reap" in order:
                    if order["reap"] in children:
                        os.waitpid(order["reap"], 0)
                        children.discard(order["reap"])
                        told.discard(order["reap"])
                    continue
                if "cancel" in order:
                    # the launcher gave up waiting for the last fork's answer and started that
                    # peer otherwise: its child must not run beside it (safe by pid: unreaped)
                    if last in children:
                        os.kill(last, signal.SIGKILL)
                    continue
                now = source_fingerprint(package)
                if now != source:
                    last = None
                    say({"changed": _differences(package, source, now)})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as e:
                    last = None
                    say({"error": f"fork: {e}"})
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (orders, answers, wake_r, wake_w):
                        os.close(fd)
                    return order
                children.add(pid)
                last = pid
                say({"pid": pid})
        for pid in children - told:
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if ended is not None:
                told.add(pid)
                rc = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
                say({"exit": pid, "returncode": rc})


def _child(order: dict[str, Any]) -> int:
    """Become ``swarm ARGV`` as ``python -m swarm.cli`` would, in a session of its own."""
    os.setsid()
    if order.get("name"):
        # what ps -o comm and top show (15 bytes at most)
        with open("/proc/self/comm", "w") as f:
            f.write(f"swarm {order['name']}"[:15])
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.environ.clear()
    os.environ.update(order["env"])
    sys.argv = [sys.argv[0], *order["argv"]]
    from swarm.__main__ import main  # noqa: PLC0415 - preloaded

    return main()


def main() -> int:
    orders, answers = os.dup(0), os.dup(1)
    # what an import prints goes to the log, not into the answers; stdin is no one's
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # before the imports: a change while they run is then seen at the first fork
    package = Path(__file__).resolve().parents[1]
    source = source_fingerprint(package)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as e:   # noqa: BLE001 - the peer imports it again, and says what fails
            print(f"swarm fork server: cannot preload {name}: {e}", file=sys.stderr, flush=True)
    # the imported objects move out of the collector's sight: a child's collections would
    # otherwise visit (and so copy) every page that holds them
    gc.freeze()
    order = _serve(orders, answers, package, source)
    return 0 if order is None else _child(order)


if __name__ == "__main__":
    sys.exit(main())

