"""Many peers in one process: an in-memory hub whose links implement :class:`~swarm.link.Link`.

This is what swarm means by an *inproc* simulation: instead of ZeroMQ
``inproc://`` sockets, every message goes through :func:`swarm.wire.encode`,
is copied into bytes (so byte counts are the real ones and the sender may
reuse its buffers), and :func:`swarm.wire.decode` on delivery, on the caller's
event loop. That keeps hundreds of peers (e.g. 256 at d = 1e5) cheap enough
for one machine, with the same gossip engine the real peers run.

Links can be slowed down: ``bandwidth_bps`` (bits per second, per directed
link: a message occupies its link for ``8·size/bandwidth`` seconds, queued
behind earlier ones) and ``latency_s`` (added to every delivery). Both are kept on
:func:`time.monotonic`, not the loop's clock, so a message is never delivered before
its time under uvloop either (whose clock and timers go by whole milliseconds).

>>> hub = SimHub(topology="ring")
>>> links = hub.add_many(16)
>>> engines = [Gossip(l, x, topology="ring") for l, x in zip(links, xs)]
>>> results = await run_rounds(engines, 10)
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import logging
import math
import time
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import wire
from ..checks import is_int, is_real, rng_seed, seconds
from ..errors import ConfigError, WireError
from ..link import Handler, Member, View
from ..peer.peer import check_handler_type
from . import topology as topo

__all__ = ["SimHub", "SimLink", "run_rounds", "consensus_error"]

log = logging.getLogger(__name__)


class SimLink:
    """One peer's link in a :class:`SimHub` (implements :class:`swarm.link.Link`)."""

    def __init__(self, hub: "SimHub", peer_id: str):
        self._hub = hub
        self._id = peer_id
        self._handlers: dict[str, Handler] = {}
        self._view_cbs: list[Callable[[View], None]] = []
        self._seq = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def view(self) -> View:
        return self._hub.view

    def neighbours(self) -> list[str]:
        """Neighbour ids under the hub's topology (round 0 for time-varying ones).

        A custom graph may name more positions than the view has (peers still
        joining): the members link what they can, as a :class:`~swarm.peer.Peer` does;
        a view the topology cannot take (a hypercube of 3) gives none, as a Peer's does."""
        hub = self._hub
        ids = hub.view.ids
        i = hub.view.index(self._id)
        if i < 0:
            return []
        try:
            edges = topo.within(hub.edges, len(ids)) if hub.topology == "custom" else None
            pos = topo.neighbours(hub.topology, len(ids), i, 0, edges=edges, seed=hub.seed)
        except ConfigError:   # a view the topology cannot take (a hypercube of 3): none, as a Peer has
            return []
        return [ids[j] for j in pos]

    async def send(self, dst: str, t: str, body: dict[str, Any] | None = None,
                   arrays: Sequence[np.ndarray] = (), *, timeout: float | None = None) -> bool:
        """Queue a message for ``dst``; False if ``dst`` is not alive or its link is full."""
        self._seq += 1
        return self._hub._send(self._id, dst, t, body, arrays, self._seq)

    def send_nowait(self, dst: str, t: str, body: dict[str, Any] | None = None,
                    arrays: Sequence[np.ndarray] = ()) -> bool:
        """:meth:`send` for callers that must not yield (the hub never waits anyway)."""
        self._seq += 1
        return self._hub._send(self._id, dst, t, body, arrays, self._seq)

    def on(self, t: str, handler: Handler) -> None:
        """Register the handler for message type ``t`` (one per type, last wins), as
        :meth:`swarm.peer.Peer.on` does: ``t`` is registered in the process's wire types,
        and swarm's own protocol types are refused (WireError)."""
        if not callable(handler):
            raise ConfigError(f"sim link {self._id}: on({t!r}, {handler!r:.80}): the handler must be callable")
        check_handler_type(t, f"sim link {self._id}")
        self._handlers[t] = handler

    def on_view(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` whenever the hub installs a new view."""
        self._view_cbs.append(callback)

    def off(self, t: str, handler: Handler) -> bool:
        """Undo :meth:`on` (what a closed Gossip, relay or federation calls); False if
        ``handler`` is not the one registered for ``t``."""
        if self._handlers.get(t) != handler:
            return False
        del self._handlers[t]
        return True

    def off_view(self, callback: Callable[[View], None]) -> bool:
        """Undo one :meth:`on_view`; False if ``callback`` was not registered."""
        if callback not in self._view_cbs:
            return False
        i = self._view_cbs.index(callback)
        self._view_cbs = self._view_cbs[:i] + self._view_cbs[i + 1:]
        return True


class SimHub:
    """An in-memory network of :class:`SimLink` s with one shared membership view.

    Parameters: ``topology``/``edges``/``seed`` (what :meth:`SimLink.neighbours`
    reports; ``seed`` in ``[0, 2**32)``), ``bandwidth_bps`` and ``latency_s`` (link
    emulation, None/0 = off), ``queue_limit`` (messages in flight per directed link
    before ``send`` returns False; None = unbounded). All are checked here, so a bad
    one fails at construction rather than at the first ``neighbours()``.
    """

    def __init__(self, *, topology: str = "ring", edges: Any = None, seed: int = 0,
                 bandwidth_bps: float | None = None, latency_s: float = 0.0,
                 queue_limit: int | None = None):
        if not isinstance(topology, str) or topology not in topo.TOPOLOGIES:
            raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(topo.TOPOLOGIES)}")
        if topology == "custom":
            if edges is not None and not isinstance(edges, (str, bytes)) and hasattr(edges, "__iter__"):
                edges = list(edges)   # kept for every view: a generator would be spent by the check below
            topo.within(edges, 0)     # pairs of positions; each view uses those it has
        seed = rng_seed(seed)
        if bandwidth_bps is not None and not (is_real(bandwidth_bps) and 0 < bandwidth_bps < math.inf):
            raise ConfigError(f"bandwidth_bps must be a finite number > 0 or None, got {bandwidth_bps!r}")
        latency_s = seconds(latency_s, "latency_s")
        if queue_limit is not None and not (is_int(queue_limit) and queue_limit >= 1):
            raise ConfigError(f"queue_limit must be an integer >= 1 or None, got {queue_limit!r}")
        self.topology, self.edges, self.seed = topology, edges, seed
        self.bandwidth_bps = None if bandwidth_bps is None else float(bandwidth_bps)
        self.latency_s = latency_s
        self.queue_limit = None if queue_limit is None else int(queue_limit)
        self.view = View(0, ())
        self.links: dict[str, SimLink] = {}
        self._next_rank = 0
        self._free_at: dict[tuple[str, str], float] = defaultdict(float)
        self._in_flight: dict[tuple[str, str], int] = defaultdict(int)
        # per directed link: the messages on their way, a heap of (due, order, frames) so that
        # they leave in due order as the loop's timers had them (with one latency_s, the order
        # sent), and the link's one timer (loop, due, handle); another loop's (a later
        # asyncio.run) is replaced, not waited for
        self._due: dict[tuple[str, str], list[tuple[float, int, list]]] = defaultdict(list)
        self._timers: dict[tuple[str, str], tuple[asyncio.AbstractEventLoop, float, asyncio.TimerHandle]] = {}
        self._order = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self.bytes_sent = 0
        self.messages_sent = 0
        self.dropped = 0
        self.undeliverable = 0
        self.link_bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.errors: list[BaseException] = []
        self._pool: defaultdict[int, list[np.ndarray]] = defaultdict(list)  # size -> free buffers
        self._closed = False

    # ------------------------------------------------------------ membership

    def add(self, peer_id: str) -> SimLink:
        """Add one peer and install the new view."""
        return self.add_many([peer_id])[0]

    def add_many(self, peers: int | Iterable[str]) -> list[SimLink]:
        """Add peers (a count gives ids ``p000``, ``p001`` ...) under one new view.

        Every id is checked before anything changes: a refused batch adds no one.
        An empty batch installs no view."""
        if is_int(peers):
            if peers < 0:
                raise ConfigError(f"peers: a count of peers must be >= 0, got {peers!r}")
            ids = [f"p{self._next_rank + k:03d}" for k in range(int(peers))]
        elif isinstance(peers, (str, bytes)) or not hasattr(peers, "__iter__"):
            # a str would add one peer per character
            raise ConfigError(f"peers must be a count or a list of peer ids, got {peers!r}")
        else:
            ids = list(peers)
        seen: set[str] = set()
        for pid in ids:
            if not isinstance(pid, str) or not pid or pid in self.links or pid in seen:
                raise ConfigError(f"peer id {pid!r} is empty, not a string, already in the hub, "
                                  f"or named twice in the batch")
            seen.add(pid)
        if not ids:
            return []
        out = []
        members = list(self.view.members)
        for pid in ids:
            link = self.links[pid] = SimLink(self, pid)
            members.append(Member(pid, f"inproc://{pid}", self._next_rank))
            self._next_rank += 1
            out.append(link)
        self._install(members)
        return out

    def remove(self, peer_id: str) -> None:
        """A peer dies: it leaves the view, and messages to or from it are dropped."""
        if peer_id not in self.links:
            raise ConfigError(f"peer {peer_id!r} is not in the hub")
        del self.links[peer_id]
        self._install([m for m in self.view.members if m.id != peer_id])

    def _install(self, members: list[Member]) -> None:
        self.view = View(self.view.epoch + 1, tuple(sorted(members, key=lambda m: m.rank)))
        for link in list(self.links.values()):
            for cb in link._view_cbs:
                cb(self.view)

    # ------------------------------------------------------------ transport

    def _send(self, src: str, dst: str, t: str, body: Any, arrays: Sequence[np.ndarray], seq: int) -> bool:
        if self._closed or src not in self.links or dst not in self.links:
            self.undeliverable += 1
            return False
        key = (src, dst)
        if self.queue_limit is not None and self._in_flight[key] >= self.queue_limit:
            self.dropped += 1
            return False
        # copied: the receiver must not see the sender's later writes
        frames = [f if isinstance(f, bytes) else self._copy(f)
                  for f in wire.encode(t, src, epoch=self.view.epoch, seq=seq, body=body, arrays=arrays)]
        size = sum(memoryview(f).nbytes for f in frames)
        self.bytes_sent += size
        self.messages_sent += 1
        self.link_bytes[key] += size
        self._in_flight[key] += 1
        loop = asyncio.get_running_loop()
        if self.bandwidth_bps is None and self.latency_s == 0:
            loop.call_soon(self._deliver, key, frames)
        else:
            # not loop.time(): uvloop's goes by whole ms, floored
            start = max(time.monotonic(), self._free_at[key])
            done = start + (8.0 * size / self.bandwidth_bps if self.bandwidth_bps else 0.0)
            self._free_at[key] = done
            heapq.heappush(self._due[key], (done + self.latency_s, next(self._order), frames))
            self._arm(key, loop)
        return True

    def _arm(self, key: tuple[str, str], loop: asyncio.AbstractEventLoop) -> None:
        """Set ``key``'s timer for the first message due on it, unless it is set for that
        already (one timer per link, so a timer firing early cannot let a later message
        overtake an earlier one)."""
        due = self._due[key][0][0]
        armed = self._timers.get(key)
        if armed is not None:
            if armed[0] is loop and armed[1] <= due:
                return
            armed[2].cancel()
        self._timers[key] = (loop, due, loop.call_later(due - time.monotonic(), self._on_time, key, loop))

    def _on_time(self, key: tuple[str, str], loop: asyncio.AbstractEventLoop) -> None:
        """Deliver, in order, what is due on ``key``. uvloop rounds a timer's delay to
        whole ms (one under 0.5 ms is none), so the timer may fire early: then it is set again."""
        del self._timers[key]
        queue = self._due[key]
        try:
            while queue and queue[0][0] <= time.monotonic():
                self._deliver(key, heapq.heappop(queue)[2])
        finally:   # a failed delivery must not strand the messages behind it
            if queue:
                self._arm(key, loop)

    def _copy(self, frame: Any) -> np.ndarray:
        """A private copy of ``frame`` in a recycled buffer.

        Fresh buffers of a few hundred kB cost more in page faults than the copy
        (bytes() of 400 kB: ~260 µs; into a warm buffer: ~25 µs). A buffer goes
        back to the pool when the last array decoded from it is gone (the
        finalizer watches a view that every decoded array keeps alive).
        """
        src = np.frombuffer(frame, np.uint8) if not isinstance(frame, np.ndarray) \
            else frame.reshape(-1).view(np.uint8)
        n = src.nbytes
        free = self._pool.get(n)
        buf = free.pop() if free else np.empty(n, np.uint8)
        np.copyto(buf, src)
        view = buf[:]
        weakref.finalize(view, self._pool[n].append, buf)
        return view

    def _deliver(self, key: tuple[str, str], frames: list[bytes]) -> None:
        self._in_flight[key] -= 1
        link = self.links.get(key[1])
        # closed: a delivery scheduled before close() would start a handler nobody cancels
        if self._closed or link is None or key[0] not in self.links:
            self.undeliverable += 1
            return
        try:
            msg = wire.decode(frames)
        except WireError as e:
            self.undeliverable += 1
            log.debug("sim: dropped malformed message %s -> %s: %s", *key, e)
            return
        handler = link._handlers.get(msg.t)
        if handler is None:
            self.undeliverable += 1
            return
        try:
            out = handler(msg)
        except Exception as e:  # a handler bug must show in tests, not vanish
            self.errors.append(e)
            log.exception("sim: handler for %s failed", msg.t)
            return
        if inspect.isawaitable(out):
            task = asyncio.ensure_future(out)
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())

    async def close(self) -> None:
        """Cancel handler tasks still running; messages still on their way are dropped,
        and ``send`` returns False from now on."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def run_rounds(engines: Sequence[Any], rounds: int, *,
                     until: Callable[[], bool] | None = None) -> list[list[Any]]:
    """Run ``rounds`` rounds of every engine concurrently; stop early when ``until()``
    is true after a round. Returns the results, one list per round.

    When one engine's round fails (or this call is cancelled), the other engines'
    rounds are cancelled and awaited before the failure is raised: none is left
    running on its own."""
    out = []
    for _ in range(rounds):
        out.append(await _one_round(engines))
        if until is not None and until():
            break
    return out


async def _one_round(engines: Sequence[Any]) -> list[Any]:
    tasks: list[asyncio.Future] = []
    try:
        for e in engines:
            tasks.append(asyncio.ensure_future(e.round()))
        return list(await asyncio.gather(*tasks))
    finally:
        # plain gather raises the first failure and leaves the siblings running
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def consensus_error(xs: Sequence[np.ndarray], scale: float | None = None) -> float:
    """``sqrt(Σ_i ‖x_i − x̄‖²)``, divided by ``scale`` if given (pass the initial
    value to get the relative error)."""
    a = np.stack([np.asarray(x, np.float64) for x in xs])
    e = float(np.sqrt(((a - a.mean(0)) ** 2).sum()))
    return e / scale if scale else e
