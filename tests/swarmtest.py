"""Test helpers: real processes on loopback, always reaped by pid."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Coroutine, Iterator


ROOT = Path(__file__).resolve().parents[1]
SWARM = [sys.executable, "-m", "swarm.cli"]


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999   # Linux's default


_EPHEMERAL = _ephemeral_ports()
_given: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now, for a process the test starts to bind.

    Taken outside the kernel's ephemeral range: a port from inside it (what binding port 0
    gives) is also where the outgoing connections of every test running beside this one
    take their local ports, so one of them could take it before the process binds it (a
    coordinator then exits "Address already in use" and the test times out waiting for
    it). Outside the range only another explicit bind can take it; each worker draws at
    random and never hands out a port twice."""
    low, high = _EPHEMERAL
    # 10000 up to the range, or above it where the range starts low
    span = (10000, low - 1) if low > 12000 else (high + 1, 65535)
    rng = random.Random(os.urandom(8))
    for _ in range(200):
        port = rng.randint(*span)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {span[0]}-{span[1]} after 200 tries")


class Procs:
    """Starts `swarm` subprocesses and ends each of them by its own pid."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, name: str = "proc", env: dict[str, str] | None = None) -> subprocess.Popen:
        e = dict(os.environ, PYTHONUNBUFFERED="1")
        e.update(env or {})
        with open(self.tmp / f"{name}-{len(self.procs)}.log", "w") as out:   # the child has its own copy
            p = subprocess.Popen([*SWARM, *args], stdout=out, stderr=subprocess.STDOUT, env=e, cwd=ROOT)
        p.log_path = out.name  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def log(self, p: subprocess.Popen) -> str:
        return Path(p.log_path).read_text()  # type: ignore[attr-defined]

    def coordinator(self, addr: str | None, *args: str, name: str = "coord", timeout: float = 30.0) -> subprocess.Popen:
        """Start ``swarm coordinator --bind addr ARGS`` and return once it answers a status
        query. A peer started before then waits only its join_timeout_s (5 s) for it,
        which a coordinator starting on a loaded machine can outlast (`swarm run` waits
        for its coordinator so too). With ``addr`` None it binds a free loopback port, and
        another one if a process of another test took that port first (free_port() only
        finds one free at the moment); the address is the process's ``addr``."""
        for _ in range(3 if addr is None else 1):
            at = addr or f"tcp://127.0.0.1:{free_port()}"
            p = self.start("coordinator", "--bind", at, *args, name=name)
            p.addr = at  # type: ignore[attr-defined]
            try:
                wait_for(lambda: p.poll() is None and status(at, 0.5), timeout, what=f"the coordinator at {at}")
                return p
            except AssertionError as e:
                failed = AssertionError(f"{e} (exit {p.poll()}); its log:\n{self.log(p)}")
                if addr is not None or "Address already in use" not in self.log(p):
                    raise failed from None
        raise failed

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)   # a stopped process cannot die of SIGTERM
                    p.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self.procs:
            try:
                p.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_sync_ring(procs: Procs, peers: list, n: int, prefix: str, *coordinator_args: str, **peer_kw) -> str:
    """A coordinator and ``n`` SyncPeers on a ring, appended to ``peers`` as each starts
    (the caller closes them, also those started before a failure), each seeing all
    ``n``; returns the coordinator's address."""
    from swarm.peer import SyncPeer
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--bind", addr, *coordinator_args, name="coord")   # with --keys no status() answers
    for r in range(n):
        peers.append(SyncPeer(coordinators=[addr], id=f"{prefix}{r}", rank=r, topology="ring",
                              join_timeout_s=20, **peer_kw).start())
    for sp in peers:
        sp.call(sp.peer.wait_view(lambda v: len(v.members) == n, timeout=20), timeout=25)
    return addr


class Clock:
    """A clock the test sets: ``clock.t = ...``; pass it where a component takes ``clock=``."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def until(pred, timeout: float = 5.0, what: str = "condition"):
    """Await ``pred()`` becoming true without blocking the loop the peers (or the
    coordinator) run on."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def status(addr: str, timeout: float = 2.0) -> dict:
    from swarm.cli import query_status

    return asyncio.run(query_status(addr, timeout))


def wait_for(pred, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # the process may still be starting
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state, ppid, pgrp, session,
    ...), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def children_of(pid: int, zombies: bool = False) -> list[int]:
    """The processes whose parent is ``pid`` (a /proc scan, no psutil); with ``zombies``,
    also those ended and not yet reaped."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (fields := proc_stat(int(d.name))) is not None:
            if int(fields[1]) == pid and (zombies or fields[0] != "Z"):
                found.append(int(d.name))
    return found


def freeze(pid: int, timeout: float = 10.0) -> None:
    """Stop process ``pid`` (SIGSTOP) and return once every thread of it has stopped.
    ``kill`` only queues the signal: the stop begins when one of its threads next runs,
    and on a loaded machine the others (libzmq's I/O threads) went on for a while, long
    enough to answer a connection that the test meant to be met by a frozen process."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: all(_thread_state(t) in "TtZX" for t in Path(f"/proc/{pid}/task").iterdir()), timeout,
             interval=0.002, what=f"every thread of process {pid} stopped")



def run_frozen(main: Coroutine[Any, Any, None], pid: int) -> None:
    """``asyncio.run(main)`` for a test that freezes process ``pid``: it is continued
    (SIGCONT) when ``main`` ends, also when it fails, so no frozen process outlives it."""
    try:
        asyncio.run(main)
    finally:
        os.kill(pid, signal.SIGCONT)

def _thread_state(task: Path) -> str:
    try:
        stat = (task / "stat").read_text()
    except OSError:   # the thread ended
        return "X"
    return stat[stat.rindex(")") + 2]   # after "pid (comm) ", whatever comm holds


async def start_ticking_peers(ids: list[str], coordinators: list[str]):
    """Start in-process Peers that count the "tick" messages they receive.

    Returns (peers, counts); the caller closes the peers. Used to show that the
    data path between peers goes on while coordinators die and come back.
    """
    import asyncio as _asyncio

    from swarm.peer import Peer

    peers = [Peer(id=i, coordinators=coordinators, join_timeout_s=10) for i in ids]
    got = {p.id: 0 for p in peers}
    for p in peers:
        p.on("tick", lambda m, me=p.id: got.__setitem__(me, got[me] + 1))
    await _asyncio.gather(*(p.start() for p in peers))
    await _asyncio.gather(*(p.wait_view(lambda v: len(v.members) == len(ids)) for p in peers))
    await _asyncio.gather(*(p.wait_linked() for p in peers))
    return peers, got


@contextlib.asynccontextmanager
async def linked_pair(ids: tuple[str, str] = ("a", "b"), **kw):
    """A coordinator on loopback and two peers, of ``ids``, linked to each other (``kw``
    goes to both Peers); yields (a, b), and closes the peers and the coordinator after."""
    from swarm.coordinator import Coordinator
    from swarm.peer import Peer

    async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
        a = Peer(id=ids[0], coordinators=[coord.address], heartbeat_s=0.2, **kw)
        b = Peer(id=ids[1], coordinators=[coord.address], heartbeat_s=0.2, **kw)
        try:
            await a.start()
            await b.start()
            for p in (a, b):
                await p.wait_view(lambda v: len(v.members) == 2, timeout=10)
                await p.wait_linked(timeout=10)
            yield a, b
        finally:
            await b.close()
            await a.close()


@contextlib.asynccontextmanager
async def keyed_trio(keys_dir: str):
    """A coordinator with CURVE keys from ``keys_dir`` (which holds the pairs
    "coordinator", "peer" and "leaver") and three peers in one view: b and c with the
    key "peer", a with "leaver"; yields (b, c, a), and closes what is still open after
    (a test may close a itself)."""
    from swarm.coordinator import Coordinator
    from swarm.peer import Peer

    coord = Coordinator(bind="tcp://127.0.0.1:*", keys_dir=keys_dir, http_bind="")
    peers = []
    try:
        await coord.start()
        for pid, key in (("b", "peer"), ("c", "peer"), ("a", "leaver")):
            peers.append(Peer(id=pid, coordinators=[coord.address], keys_dir=keys_dir, key_name=key))
            await peers[-1].start()
        b, c, a = peers
        await b.wait_view(lambda v: set(v.ids) == {"a", "b", "c"}, 10.0)
        yield b, c, a
    finally:
        for p in reversed(peers):
            await p.close()
        await coord.close()


async def tick_neighbours(peers) -> None:
    """One tick from every peer to each of its neighbours."""
    for p in peers:
        for n in p.neighbours():
            await p.send(n, "tick", {"from": p.id}, timeout=0.5)


def hold_views(peer):
    """Make ``peer`` collect the coordinator's views instead of installing them (its view
    then lags, as a member's does when the coordinator told a joiner first). Returns
    ``(views, release)``: the views held so far, and ``release(view)``, which installs
    ``view`` and lets later views through."""
    views: list = []
    install = peer._install
    peer._install = views.append

    def release(view) -> None:
        peer._install = install
        install(view)

    return views, release


def on_small_disk(tmp_path: Path, size: str, script: str, *args: str, env: dict[str, str] | None = None,
                  read_only_after: dict[str, str] | None = None) -> dict:
    """Run the Python ``script`` with a folder on a tmpfs of ``size`` (a real disk that
    fills) as its first argument, then ``args``, in a user and mount namespace of its own;
    returns the JSON it prints last, with its stderr as ``log``. With ``read_only_after``
    it first runs once with those environment variables on the disk writable (its output
    ignored), then again, with ``env``, once the disk is remounted read only. Skips where
    the machine does not allow such namespaces."""
    import shlex
    import shutil
    import textwrap

    import pytest

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a small disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    src = tmp_path / "child.py"
    src.write_text(textwrap.dedent(script))
    run = 'exec "$@"'
    if read_only_after is not None:
        first = " ".join(f"{k}={shlex.quote(v)}" for k, v in read_only_after.items())
        run = f'env {first} "$@" >/dev/null && mount -o remount,ro "$d" && {run}'
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
           f'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 77; d="$2"; shift 2; {run}', "sh", size, str(disk),
           sys.executable, str(src), str(disk), *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    except OSError as e:
        pytest.skip(f"cannot run unshare: {e}")
    if p.returncode == 77 or (p.returncode == 1 and p.stderr.startswith("unshare:")):
        pytest.skip(f"no user and mount namespaces here: {p.stderr.strip()}")
    # -7 / 135: SIGBUS (what a store into a memory-mapped file on a full disk gets)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["log"] = p.stderr
    return out


# ---------------------------------------------------------------- a host that vanished
# A host gone without a TCP reset (powered off, a cable pulled, a firewall that drops),
# played on loopback: a listener whose one accept-queue place is taken by a connection
# never accepted; the kernel drops further SYNs (where it does: `syns_dropped_when_full`).

def answered(addr: tuple[str, int], wait_s: float) -> bool:
    """Whether a connection to ``addr`` is answered (or refused) within ``wait_s``."""
    import select

    probe = socket.socket()
    try:
        probe.setblocking(False)
        probe.connect_ex(addr)
        return bool(select.select([], [probe], [], wait_s)[1])
    finally:
        probe.close()


def vanish(addr: tuple[str, int]) -> list[socket.socket]:
    """``addr``'s host vanishes: a listener there with its accept queue full (the sockets
    to close for the address to come back)."""
    host = socket.socket()
    sockets = [host]
    try:
        host.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        host.bind(addr)
        host.listen(0)
        sockets.append(socket.create_connection(addr, timeout=2))
    except OSError:
        for s in sockets:
            s.close()
        raise
    return sockets


class Forwarder:
    """Forwards ``listen`` (host, port) to ``target``; :meth:`vanish` makes ``listen`` a host
    that is gone: the forwarded connections go silent and stay open (no FIN, no reset), and
    new ones are never answered. :meth:`up` brings it back at the same address."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.server: asyncio.Server | None = None
        self.pumps: list[asyncio.Task] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.gone: list[socket.socket] = []   # what stands on the address while it is gone

    async def up(self) -> None:
        while self.gone:
            self.gone.pop().close()
        self.server = await asyncio.start_server(self._accept, *self.listen, reuse_address=True)

    async def _accept(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        self.writers.append(w_in)
        try:
            r_out, w_out = await asyncio.open_connection(*self.target)
        except OSError:
            w_in.transport.abort()
            return
        self.writers.append(w_out)
        self.pumps += self._carry(r_in, w_out, towards_target=True) + self._carry(r_out, w_in, towards_target=False)

    def _carry(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, towards_target: bool) -> list[asyncio.Task]:
        """The tasks that carry one direction of a connection (here: as it comes); a
        proxy that shapes its traffic overrides this."""
        return [asyncio.create_task(self._pump(r, w))]

    @staticmethod
    async def _pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

    def cut(self) -> None:
        """End every forwarded connection at once (a reset each side), as a dropped TCP
        connection is; the address stays up, so both ends can connect again."""
        for p in self.pumps:
            p.cancel()
        self.pumps.clear()
        while self.writers:
            self.writers.pop().transport.abort()

    def vanish(self) -> None:
        assert self.server is not None
        self.server.close()
        self.server = None
        for p in self.pumps:
            p.cancel()
        self.pumps.clear()
        self.gone = vanish(self.listen)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for p in self.pumps:
            p.cancel()
        for w in self.writers:
            w.transport.abort()
        while self.gone:
            self.gone.pop().close()


class SlowLink(Forwarder):
    """A TCP proxy on loopback that delays every byte by ``delay_s`` each way: a wide-area
    link with a round trip of 2 x ``delay_s``, no loss and no bandwidth limit."""

    def __init__(self, target: str, delay_s: float) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        super().__init__(("127.0.0.1", 0), (host, int(port)))
        self.delay_s = delay_s

    async def start(self) -> str:
        """Listen; return the address that reaches ``target`` through the link."""
        await self.up()
        return f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def _carry(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, towards_target: bool) -> list[asyncio.Task]:
        q: asyncio.Queue = asyncio.Queue()
        return [asyncio.create_task(self._read(r, q)), asyncio.create_task(self._write(q, w))]

    async def _read(self, r: asyncio.StreamReader, q: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await r.read(65536):
                q.put_nowait((loop.time() + self.delay_s, data))
        except OSError:
            pass
        q.put_nowait((loop.time() + self.delay_s, b""))   # the end of the stream, as late as the rest

    @staticmethod
    async def _write(q: asyncio.Queue, w: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                at, data = await q.get()
                await asyncio.sleep(max(0.0, at - loop.time()))
                if not data:
                    w.close()
                    return
                w.write(data)
                await w.drain()
        except OSError:
            pass


@contextlib.contextmanager
def reaped(p: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``p`` for the block, killed by its pid on the way out if it still runs (the block
    failed before it ended)."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_child(tmp_path: Path, source: str, *args: str, timeout: float = 120.0) -> tuple[int, str, str]:
    """Run ``source`` (a script, dedented) in a Python process of its own with this tree's
    swarm first on its path, from the tree's root; return its exit status, stdout and stderr
    (it is killed by its pid if the wait fails)."""
    src = tmp_path / "child.py"
    src.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=str(ROOT))   # this tree's swarm, not the one installed
    with reaped(subprocess.Popen([sys.executable, str(src), *args], cwd=ROOT, text=True, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)) as p:
        out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def reap_run(p: subprocess.Popen, root: Path) -> None:
    """The ``finally`` of a test that started ``swarm run`` as ``p`` with its runs under
    ``root``: every child its runs' ``pids.json`` lists that still runs is killed by its
    pid, then ``p`` if it still runs."""
    for pids in root.glob("runs/*/pids.json"):
        for pid in json.loads(pids.read_text())["children"].values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    if p.poll() is None:
        p.kill()
        p.wait()


def reap_all(procs: list[subprocess.Popen]) -> None:
    """End each of ``procs`` by its pid (killed if it still runs), wait for it and close
    its pipes: the ``finally`` of a test that started them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()


async def http(port: int, raw: bytes, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw request bytes to an HTTP server on loopback; return (status, headers, body)
    of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return code, headers, body
