"""Gradient relay: every peer gets every peer's gradients, passed on by neighbours.

Parameter averaging (:class:`~swarm.gossip.Gossip`) lets each peer take its own
updates and pulls the copies together afterwards: each peer still has to take
about as many updates as one learner would (docs/rl.md, "What limits the
swarm"). With a relay the swarm shares the updates themselves. A peer computes a
gradient on its own batch, compresses it, applies the decompressed gradient to its
own parameters and publishes it; every other peer applies the very same vector
when it arrives. So n peers that each compute one gradient in n steps move like one
learner that takes one update per step, at a 1/n of the gradient work each.

Messages go only to neighbours (ring, grid, ... as the peer's topology says). A
peer that receives a gradient for the first time passes it on, unchanged (the
compressed frames, not re-encoded), to its other neighbours, with one hop less;
copies that come round another way are recognised by (origin, number) and
dropped. A peer's copy then differs from the others' only in the order in which
it applied the gradients (Adam's update depends on it) and in what was lost on
full queues. Peers that take turns apply them in one order (:meth:`take` with
``before``) and stay the same; parameter gossip (:class:`~swarm.gossip.Gossip`)
pulls back what drift is left.

The codec is one stream per origin: with ``ef+...`` the residual of what the
codec dropped stays at the origin and goes out with its next gradients, and
every peer applies exactly what was sent.

    relay = GradientRelay(peer, d, codec="ef+topk:0.15:values=fp16")   # on the peer's loop
    g = relay.publish(grad)        # any thread: sends; returns what to apply here
    for g in relay.take():         # the others' gradients, in arrival order
        apply(g)

Peers that take turns wait at each turn for the others' earlier gradients and apply
them in one global order, (clock, origin), before their own; their copies then stay
the same:

    relay.wait(clock, timeout)           # the others' gradients from before `clock` are here
    for g in relay.take(before=clock):   # in (clock, origin) order
        apply(g)
    apply(relay.publish(grad, clock))    # then this peer's own

A peer that takes no update at its turn (a non-finite gradient it will not
send, a rate limiter holding its update back) publishes ``None``: a pass, a
message with the clock and no gradient, so that the others do not wait for one.
A turn of several updates numbers them with consecutive clocks and sends them
in one message: ``publish(g, clock, hold=True)`` for all but the last; the others
``wait(..., span=updates)`` for every one of them.

Other data can ride on a peer's own messages to its neighbours (a ``rider``:
:class:`~swarm.buffer.Federation` sends each peer's new replay items so, one
message a turn instead of rounds of their own). Only the origin's copies carry
it: a neighbour hands it to its own rider and passes the gradients on without it.

    relay = GradientRelay(peer, d, codec=..., rider=fed)   # fed = Federation(buf, peer, ride=True)

With ``direct=True`` the training thread sends and receives the gradients on
sockets of its own (a PULL inbox, a PUSH per neighbour) instead of through the
peer's event loop, and calls :meth:`poll` between its steps to take them in:

    relay = GradientRelay(peer, d, codec=..., direct=True)   # on the peer's loop
    relay.ready(timeout=10.0)            # training thread: every neighbour's relay is up
    relay.poll()                         # training thread, every step
    ...
    relay.close()                        # training thread, before the peer closes
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import zmq

from .. import transport as tp
from .. import wire
from ..checks import is_int, seconds
from ..compress import Encoded, get_codec, split_ef
from ..errors import ConfigError, WireError
from ..link import Link
from ..wire import Message
from . import topology as topo

__all__ = ["GradientRelay", "RelayStats", "Rider", "GRAD", "GRAD_HELLO"]

GRAD = wire.register_type("grad")
#: direct mode: "my inbox is at this endpoint" (body: ep, and r for a reply)
GRAD_HELLO = wire.register_type("grad_hello")
_MAX_ENDPOINT = 256
#: Clocks remembered per origin for waits on turns of several updates (span > 1).
_RECENT_CLOCKS = 256
#: Updates in one message at most (publish(hold=True) sends when it has this many).
_MAX_BUNDLE = 16


@dataclass
class RelayStats:
    published: int = 0      # own gradients sent
    sent: int = 0           # messages sent, own and forwarded
    received: int = 0       # others' gradients taken in (first copies)
    forwarded: int = 0      # sends that passed a gradient on
    duplicates: int = 0     # copies that came round another way
    dropped: int = 0        # sends refused (unknown neighbour, full queue)
    overflow: int = 0       # received gradients dropped because take() lagged
    rejected: int = 0       # malformed or non-finite gradients
    bytes_out: int = 0      # payload bytes sent, own and forwarded
    bytes_in: int = 0       # payload bytes received, duplicates included
    lag_s: float = 0.0      # summed wall-clock seconds from publish to take() (same-host clocks)
    taken: int = 0          # gradients handed out by take()
    waited_s: float = 0.0   # seconds spent in wait()
    wait_timeouts: int = 0  # wait() calls that gave up
    direct_out: int = 0     # sends that went on the consumer thread's own sockets (direct)
    direct_in: int = 0      # gradients taken in from this peer's inbox (direct)
    passed: int = 0         # own turns passed without a gradient (publish(None))
    passes_in: int = 0      # others' passes taken in (first copies)
    rider_bytes_out: int = 0   # rider payload sent with own messages (not in bytes_out)
    rider_bytes_in: int = 0    # rider payload received from neighbours (not in bytes_in)
    riders_in: int = 0         # riders handed to this peer's rider
    direct_bytes_out: int = 0  # wire bytes sent on the consumer's own sockets (the peer's counters miss them)
    direct_bytes_in: int = 0   # wire bytes received on this peer's inbox (direct)

    @property
    def mean_lag_s(self) -> float:
        """Mean seconds from a gradient's publication to its take(); NaN before any."""
        return self.lag_s / self.taken if self.taken else float("nan")


class Rider(Protocol):
    """What rides on a relay's own messages to its neighbours (see the module docstring)."""

    def ride(self) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """A body and arrays to send with this peer's next own message, or None.
        Called on the thread that publishes."""

    def arrive(self, src: str, body: dict[str, Any], arrays: list[np.ndarray]) -> None:
        """What rode on neighbour ``src``'s own message. Called on the thread that takes
        messages in (the consumer's with ``direct``); bad input is the rider's to count
        and drop: the gradients it came with are taken in all the same."""


class GradientRelay:
    """Publish this peer's gradients and collect everyone else's (see the module docstring).

    Build it on the link's event loop (it registers a handler there; elsewhere it
    raises :class:`~swarm.errors.ConfigError`). ``publish``
    may be called from any thread; ``take`` from one consumer thread.

    Args:
        link: the peer (or a :class:`~swarm.gossip.sim.SimLink`).
        d: length of the gradient vector.
        codec: codec spec of the published gradients; ``ef+X`` keeps X's error
            feedback residual at the origin.
        max_pending: received gradients kept for :meth:`take`; older ones are dropped
            (and counted) beyond it, so a stalled consumer cannot grow memory.
        topology, edges: the peers' neighbour graph (what ``link.neighbours()``
            follows); a gradient then starts with as many hops as this peer's farthest
            peer is away (on a ring, each direction half the way round), so that no
            copy travels further than it must. A time-varying topology is refused: its
            round-0 graph need not reach everyone.
        hops: how far a gradient travels, overriding ``topology``. Without either, the
            number of peers in the view less one, which reaches every peer of a
            connected graph (with copies that come round the long way dropped).
        direct: the consumer thread (the one that calls :meth:`publish`, :meth:`take`,
            :meth:`wait` and :meth:`poll`) sends and receives the gradients on sockets
            of its own (:meth:`~swarm.peer.Peer.open_inbox`), not through the
            peer's loop. Through the loop a gradient costs the receiving process
            two thread switches and a pass of the loop: about 440 us of CPU against
            270 direct and 170 for raw pyzmq (``scripts/bench_relay.py``); the
            consumer takes them in between its own steps instead. Neighbours tell each other their
            inbox endpoints through the peer; until a neighbour's is known, its
            gradients go through the loop as without ``direct`` (:meth:`ready` waits
            until every neighbour's is, before the first gradient). Only with a
            :class:`~swarm.peer.Peer` on tcp; call :meth:`poll` every step or so (a
            gradient is passed on to the next neighbour only then) and :meth:`close`
            before the peer closes.
        rider: sends what its ``ride()`` gives with each message of this peer's own
            (gradients or a pass) to the neighbours, and gets theirs through its
            ``arrive()`` (:class:`Rider`). Counted apart from the gradients' bytes.
    """

    def __init__(self, link: Link, d: int, codec: str = "identity", *, topology: str | None = None,
                 edges: Any = None, max_pending: int = 1024, hops: int | None = None,
                 direct: bool = False, rider: Rider | None = None) -> None:
        if not isinstance(d, int) or d < 1:
            raise ConfigError(f"d = {d!r}: the gradient length must be an int >= 1")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending = {max_pending!r}: must be an int >= 1")
        if hops is not None and (not isinstance(hops, int) or hops < 1):
            raise ConfigError(f"hops = {hops!r}: must be an int >= 1 or None")
        if topology is not None and (topology not in topo.TOPOLOGIES or topology in topo.TIME_VARYING):
            raise ConfigError(f"topology = {topology!r}: the relay needs a fixed graph, one of "
                              f"{', '.join(t for t in topo.TOPOLOGIES if t not in topo.TIME_VARYING)}")
        if not isinstance(codec, str):
            raise ConfigError(f"codec = {codec!r}: must be a codec spec such as 'ef+topk:0.15'")
        if rider is not None and not all(callable(getattr(rider, m, None)) for m in ("ride", "arrive")):
            raise ConfigError(f"rider = {rider!r}: needs ride() and arrive() methods (see Rider)")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigError("GradientRelay must be constructed on the peer's event loop (in a "
                              "coroutine running there, e.g. through SyncPeer.call): it registers "
                              "its handlers there") from None
        self.link, self.d, self.codec_spec, self.hops = link, d, codec, hops
        self.topology, self.edges, self.rider = topology, edges, rider
        self._routes_cache: tuple[int, list[tuple[str, int]]] | None = None   # (view epoch, routes)
        self._codec = get_codec(codec)              # the origin's stream (with its residual)
        self._decoder = get_codec(split_ef(codec)[1])
        self._loop = loop
        self._loop_thread = threading.get_ident()
        # Numbered from the time in microseconds: a peer restarted under the same id numbers
        # its gradients above any its earlier process sent, which the others remember and
        # would drop as copies (no process sends more than one a microsecond).
        self._seq = itertools.count(time.time_ns() // 1000)
        self._seen: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        # (clock, origin, gradient, sent at); a gradient without a clock counts as clock -1
        self._inbox: collections.deque[tuple[int, str, np.ndarray, float]] = collections.deque()
        self._max_pending = max_pending
        self._clocks: dict[str, int] = {}    # origin -> clock of its newest gradient here
        self._got: dict[str, set[int]] = {}  # origin -> clocks of its recent gradients and passes here
        self._complete: dict[str, int] = {}  # origin -> last clock of its newest turn waited for (with first)
        self._held: list[tuple[int, dict[str, Any] | None, list[np.ndarray]]] = []   # publish(hold=True)
        self._cond = threading.Condition()
        self.stats = RelayStats()
        self._bad = tp.BadInput(f"relay {link.id}")
        # direct mode: the consumer thread's own sockets, and the neighbours' inboxes
        self._inbox_sock: Any = None
        self._endpoint = ""
        self._endpoints: dict[str, str] = {}               # neighbour -> its inbox (set on the loop)
        self._outboxes: dict[str, tuple[str, Any]] = {}     # consumer: neighbour -> (endpoint, PUSH socket)
        self._outbox_epoch = -1
        self._greeted: dict[str, str] = {}                 # loop: neighbour -> its address when greeted
        self._regreet_at = 0.0
        self._wire_seq = itertools.count()
        link.on(GRAD, self._on_grad)
        if direct:
            if not all(hasattr(link, n) for n in ("open_inbox", "open_outbox", "close_side", "sender_ok")):
                raise ConfigError(f"direct: {type(link).__name__} has no side channels; direct needs a Peer")
            self._inbox_sock, self._endpoint = link.open_inbox()
            link.on(GRAD_HELLO, self._on_hello)
            link.on_view(lambda _view: self._greet())
            self._greet()

    # ------------------------------------------------------------ API

    def publish(self, grad: Any, clock: int = 0, hold: bool = False) -> np.ndarray | None:
        """Encode ``grad``, send it to the neighbours, and return the decoded vector,
        which is what every peer applies: apply it here too.

        ``clock`` is the publisher's progress (its env steps, say); receivers can
        :meth:`wait` for it. ``grad = None`` passes the turn at ``clock``: the others
        learn the clock and apply nothing; returns None. ``hold = True`` encodes it
        now but sends it with the next publish without ``hold``, in one message (a
        turn of several updates: one message per turn, not per update; each keeps
        its clock).

        Bad input (a clock that is not an int >= 0, a gradient that is not ``d``
        finite floats) raises :class:`~swarm.errors.ConfigError` before anything
        changes: nothing is sent, and the codec's residual stays as it was.
        """
        clock = _clock(clock)
        out = None
        if grad is None:
            self._held.append((clock, None, []))
            self.stats.passed += 1
        else:
            g = self._gradient(grad)
            enc, out = self._codec.encode_decoded(g)
            # copies: the codec reuses its buffers
            self._held.append((clock, enc.meta, [np.array(f, copy=True) for f in enc.frames]))
            self.stats.published += 1
        if hold and len(self._held) < _MAX_BUNDLE:
            return out
        *held, (c, meta, frames) = self._held
        self._held = []
        body = self._body(c, {} if meta is None else meta)
        if meta is None:
            body["p"] = 1
        if held:   # earlier updates of the turn go first: [clock, meta (None: a pass), frame count]
            body["b"] = [[hc, hm, len(hf)] for hc, hm, hf in held]
            frames = [f for _, _, hf in held for f in hf] + frames
        extra = self.rider.ride() if self.rider is not None else None
        if extra is not None:   # the rider's arrays go last: [its body, their count]
            body["x"] = [extra[0], len(extra[1])]
        self._send_own(body, frames, [] if extra is None else list(extra[1]))
        return out

    def _gradient(self, grad: Any) -> np.ndarray:
        """``grad`` as a flat float32 vector, checked: floats, length ``d``, all finite."""
        try:
            a = np.asarray(grad)
        except (TypeError, ValueError, RuntimeError) as e:   # ragged lists, tensors that need grad, ...
            raise ConfigError(f"gradient must be an array of floats, got {type(grad).__name__}: {e}") from None
        if a.dtype.kind != "f":
            raise ConfigError(f"gradient of dtype {a.dtype}; it must be floating-point")
        g = a.astype(np.float32, copy=False).reshape(-1)
        if g.size != self.d:
            raise ConfigError(f"gradient of length {g.size}; this relay carries {self.d}")
        if not np.isfinite(g).all():
            raise ConfigError("gradient has NaN or infinite entries; not published")
        return g

    def _body(self, clock: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The header of a message of this peer's own: origin, number, time, clock, codec meta."""
        return {"o": self.link.id, "s": next(self._seq), "t": time.time(), "c": clock, "meta": meta}

    def _send_own(self, body: dict[str, Any], frames: list[np.ndarray], extra: list[np.ndarray]) -> None:
        """Send a message of this peer's own (a gradient or a pass, and a rider's ``extra``
        arrays) from any thread."""
        if threading.get_ident() == self._loop_thread:
            self._publish_now(body, frames, extra)
        elif self._inbox_sock is not None:   # direct: send here, and what cannot go yet through the loop
            n, rn = _nbytes(frames), _nbytes(extra)
            late = [(dst, hops) for dst, hops in self._routes()
                    if not self._push(dst, dict(body, h=hops), frames + extra, n, forwarding=False, rider=rn)]
            if late:
                self._loop.call_soon_threadsafe(self._publish_now, body, frames, extra, late)
        else:
            self._loop.call_soon_threadsafe(self._publish_now, body, frames, extra)

    def take(self, before: int | None = None) -> list[np.ndarray]:
        """The other peers' gradients received since the last call.

        Without ``before``: all of them, in arrival order. With it: those published
        at a clock below ``before``, ordered by (clock, origin), and the later ones
        stay for a later call. Peers that take turns (:meth:`wait`) and, at each
        turn, apply ``take(before=their clock)`` and then their own gradient, apply
        every gradient in one global order, so their copies stay the same (as long
        as no two peers publish at the same clock: at most ``every`` peers).
        """
        self.poll()
        now = time.time()
        with self._cond:   # the loop thread appends
            if before is None:
                items = list(self._inbox)
                self._inbox.clear()
            else:
                items = sorted((x for x in self._inbox if x[0] < before), key=lambda x: (x[0], x[1]))
                if len(items) < len(self._inbox):
                    keep = [x for x in self._inbox if x[0] >= before]
                    self._inbox.clear()
                    self._inbox.extend(keep)
                else:
                    self._inbox.clear()
        for _, _, _, t in items:
            self.stats.lag_s += max(0.0, now - t)
        self.stats.taken += len(items)
        return [g for _, _, g, _ in items]

    def wait(self, clock: int, timeout: float, *, every: int = 1, rounds: int = 1,
             first: int | None = None, span: int = 1) -> bool:
        """Block until this peer has every gradient that the others computed before
        ``clock``, less their last ``rounds - 1`` rounds, or until ``timeout`` seconds
        passed; returns whether it got there.

        Each peer publishes one gradient every ``every`` clock ticks, at a fixed
        phase. Called before computing a gradient, ``rounds = 1`` makes the peers
        take turns: each gradient is computed with all the others' gradients before
        it applied, as one learner would. On a busy host a gradient takes
        milliseconds to arrive, several steps; waiting is wall time, not CPU spent
        here (though on a host that peers share, a peer that sleeps wakes to cold
        caches). A peer that left the view is not waited for, nor one out of step:
        more than a round behind (a wait gave up on it; frozen, restarted), or
        already at or past ``clock`` (it went on without this peer), until it is
        back within a round; its gradients then come late, and the copies differ.

        Without ``first``, a peer's phase is read from its latest gradient, and a
        peer that has not published yet is not waited for. With it, every peer
        publishes at the clocks ``>= first`` that equal its rank modulo ``every``
        (the schedule of :meth:`swarm.rl.DQNAgent.learns_at` with phase = rank), and
        is waited for from its first turn on. A peer that takes no update at a turn
        must pass it (``publish(None, clock)``); one that publishes nothing holds the
        others up for ``timeout`` once, until its next gradient.

        ``span``: with ``first``, each turn is ``span`` consecutive clocks, from rank ·
        span (modulo ``every``): a peer that takes several updates in its turn numbers
        them so, and is waited for until the last of them is here.

        A clock that is not an int >= 0, a timeout that is not a finite number of
        seconds >= 0, or parameters that are not ints raise ConfigError at once.
        """
        clock, timeout = _clock(clock), seconds(timeout)
        if not (is_int(every) and is_int(rounds) and is_int(span) and (first is None or is_int(first))):
            raise ConfigError(f"every = {every!r}, rounds = {rounds!r}, span = {span!r}, first = {first!r}: "
                              f"must be ints (first may be None)")
        if every < 1 or rounds < 1 or span < 1 or span > every or (span > 1 and first is None):
            raise ConfigError(f"every = {every}, rounds = {rounds}, span = {span}, first = {first}: need "
                              f"every, rounds >= 1 and 1 <= span <= every; a span > 1 needs first (the schedule)")
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            with self._cond:
                if not self._behind(clock, every, rounds, first, span):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stats.wait_timeouts += 1
                    self._behind(clock, every, rounds, first, span, give_up=True)
                    return False
                t0 = time.monotonic()
                if self._inbox_sock is None:
                    self._cond.wait(min(left, 0.05))   # also notices view changes
            if self._inbox_sock is not None:
                # direct: the inbox wakes us; what still comes through the loop, within 10 ms
                self._inbox_sock.poll(max(1, int(1000 * min(left, 0.01))))
            self.stats.waited_s += time.monotonic() - t0

    def _behind(self, clock: int, every: int, rounds: int, first: int | None, span: int = 1,
                give_up: bool = False) -> list[str]:
        """The peers whose gradients from before ``clock`` (see :meth:`wait`) are not all here;
        ``give_up``: count their missing turns as passed from now on."""
        me = self.link.id
        behind = []
        for m in self.link.view.members:
            c = self._clocks.get(m.id)
            if m.id == me or (c is None and first is None):
                continue
            phase = m.rank * span + span - 1 if first is not None else c   # its turn's last clock
            last = clock - 1 - (clock - 1 - phase) % every     # its latest turn before `clock`
            need = last - (rounds - 1) * every
            if self._out_of_step(c, clock, need, every, rounds, first):
                self._complete[m.id] = need   # its turns until now count as passed
                continue
            if first is None:
                if c is None or c < need:
                    behind.append(m.id)
                continue
            if need < first:
                continue
            # Every update of every turn since the last one found complete (at the first
            # wait, the latest turn only): a later turn, or a later update of a turn, can
            # overtake an earlier one on the way (a message still going through the loop
            # when the neighbour's inbox became known), and the newest clock alone would
            # end the wait while one is missing.
            got = self._got.get(m.id, set())
            t = self._complete.get(m.id, need - every) + every
            while t <= need and all(k in got for k in range(t - span + 1, t + 1)):
                t += every
            if t <= need:
                behind.append(m.id)
                if give_up:   # a lost turn holds up one wait, not every later one
                    t = need + every
            self._complete[m.id] = t - every
        return behind

    @staticmethod
    def _out_of_step(c: int | None, clock: int, need: int, every: int, rounds: int, first: int | None) -> bool:
        """Whether a peer whose newest clock here is ``c`` is out of step with this one, and
        not waited for: more than a round behind the turn ``need`` waited for (a peer that
        waits at each turn has waited for its previous turn, so only a wait that gave up on
        it, or a peer frozen or restarted, leaves it so), or already at or past this peer's
        ``clock`` (it takes its turns after this one's only when it gave up on this peer:
        this one was frozen, restarted or away, and what it missed is not coming). Waiting
        would hold up every turn for a whole timeout, and bring neither back in step."""
        if c is None:   # never heard from: behind only once its second turn is due
            return first is not None and need - every >= first
        return c < need - every or c >= clock + (rounds - 1) * every

    def poll(self) -> int:
        """Direct mode: take in the gradients waiting on this peer's inbox (and pass on
        those that travel further); returns how many messages came. A no-op without
        ``direct``. Call it from the consumer thread about every step: :meth:`take`
        and :meth:`wait` call it too, but a neighbour farther on waits for what this
        peer passes on.
        """
        s = self._inbox_sock
        if s is None:
            return 0
        if self.link.view.epoch != self._outbox_epoch:
            self._prune_outboxes()
        n = 0
        limits = getattr(self.link, "limits", wire.DEFAULT_LIMITS)
        # ZMQ_EVENTS first: an empty receive would raise (an exception per step costs
        # more than the check)
        while n < tp.DRAIN_BATCH and s.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = s.recv_multipart(copy=False)
            n += 1
            self.stats.direct_bytes_in += tp.frames_nbytes(frames)
            src: Any = "?"
            try:
                msg = wire.decode(frames, limits)
                src = msg.src
                if msg.t != GRAD:
                    raise WireError(f"{msg.t!r} message on the gradient inbox")
                if not self.link.sender_ok(msg, frames[-1]):
                    raise WireError(f"src {msg.src!r} does not match the sender's CURVE key")
            except WireError as e:
                self.stats.rejected += 1
                self._bad(src, e)
                continue
            try:
                self._accept(msg, self._push_or_hand)
                self.stats.direct_in += 1
            except WireError as e:   # counted by _accept
                self._bad(src, e)
        self._regreet()
        return n

    def ready(self, timeout: float) -> bool:
        """Direct mode, consumer thread: block until this peer knows every neighbour's
        inbox, or until ``timeout`` seconds passed; returns whether it got there.

        A neighbour's hello comes from its relay's constructor, after the relay handles
        gradients, so knowing its inbox means its relay exists. Call this before the
        first publish: a gradient sent earlier goes through the loop to a peer that may
        not handle gradients yet, and is lost there (and peers that take turns then wait
        a whole ``timeout`` of :meth:`wait` for it). Takes nothing in: what arrives
        meanwhile waits on the inbox.
        """
        if self._inbox_sock is None:
            raise ConfigError("ready() is for direct mode (GradientRelay(..., direct=True))")
        deadline = time.monotonic() + seconds(timeout)
        while any(d not in self._endpoints for d in self.link.neighbours()):
            if time.monotonic() >= deadline:
                return False
            self._regreet()
            time.sleep(0.005)
        return True

    def _regreet(self) -> None:
        """Consumer thread: greet again, at most every 0.5 s, the neighbours whose inbox we
        do not know (our hello may have come before their relay existed)."""
        now = time.monotonic()
        if now > self._regreet_at:
            self._regreet_at = now + 0.5
            if any(d not in self._endpoints for d in self.link.neighbours()):
                self._loop.call_soon_threadsafe(self._greet, True)

    def close(self) -> None:
        """Direct mode: close this relay's own sockets (from the consumer thread, before
        the peer closes). Gradients then go through the peer's loop."""
        for _, s in self._outboxes.values():
            self.link.close_side(s)
        self._outboxes.clear()
        if self._inbox_sock is not None:
            self.link.close_side(self._inbox_sock)
            self._inbox_sock = None

    @property
    def pending(self) -> int:
        return len(self._inbox)

    # ------------------------------------------------------------ plumbing

    def _routes(self) -> list[tuple[str, int]]:
        """(neighbour, hops) for a gradient of our own, from the current view.

        On a ring the two directions split the way round (to the right ceil((n-1)/2)
        hops, to the left the rest), so every peer gets exactly one copy; on other
        graphs each neighbour gets as many hops as our farthest peer is away, and
        copies that meet are dropped as duplicates.
        """
        view = self.link.view
        if self._routes_cache is not None and self._routes_cache[0] == view.epoch:
            return self._routes_cache[1]
        nbrs = self.link.neighbours()
        n, i = len(view.members), view.index(self.link.id)
        if self.hops is not None:
            routes = [(dst, self.hops) for dst in nbrs]
        elif self.topology == "ring" and n >= 3 and i >= 0:
            right, left = view.members[(i + 1) % n].id, view.members[(i - 1) % n].id
            split = {right: n // 2, left: (n - 1) // 2}
            routes = [(dst, split.get(dst, 1)) for dst in nbrs]
        else:
            if self.topology is None or i < 0:
                h = n - 1
            else:
                edges = topo.within(self.edges, n) if self.topology == "custom" else None
                h = topo.eccentricity(self.topology, n, i, edges=edges)
            routes = [(dst, max(1, h)) for dst in nbrs]
        self._routes_cache = (view.epoch, routes)
        return routes

    def _publish_now(self, body: dict[str, Any], frames: list[np.ndarray], extra: list[np.ndarray],
                     routes: list[tuple[str, int]] | None = None) -> None:
        n, rn = _nbytes(frames), _nbytes(extra)
        for dst, hops in self._routes() if routes is None else routes:
            self._send(dst, dict(body, h=hops), frames + extra, n, forwarding=False, rider=rn)

    def _send(self, dst: str, body: dict[str, Any], frames: list[np.ndarray], nbytes: int,
              forwarding: bool, rider: int = 0) -> None:
        if self.link.send_nowait(dst, GRAD, body, frames):
            self.stats.sent += 1
            self.stats.bytes_out += nbytes
            self.stats.rider_bytes_out += rider
            self.stats.forwarded += int(forwarding)
        else:
            self.stats.dropped += 1

    def _on_grad(self, msg: Message) -> None:
        self._accept(msg, self._send)   # on the loop: through the peer's ROUTER

    def _accept(self, msg: Message, send: Any) -> None:
        """Check, decode and queue a received gradient (or note a pass), hand what rode
        on it to the rider, and pass it on with ``send``."""
        b = msg.body
        arrays, ride = list(msg.arrays), b.get("x")
        if ride is not None:   # a rider: [its body, the count of its arrays, which come last]
            if not (isinstance(ride, list) and len(ride) == 2 and isinstance(ride[0], dict)
                    and isinstance(ride[1], int) and 0 <= ride[1] <= len(arrays)):
                self.stats.rejected += 1
                raise WireError(f"grad from {msg.src}: x must be [body (dict), count of the last arrays]")
            cut = len(arrays) - ride[1]
            arrays, ride_arrays = arrays[:cut], arrays[cut:]
        nbytes = _nbytes(arrays)
        self.stats.bytes_in += nbytes
        origin, seq, hops, meta = b.get("o"), b.get("s"), b.get("h"), b.get("meta")
        if not (isinstance(origin, str) and isinstance(seq, int) and isinstance(hops, int)
                and isinstance(meta, dict)):
            self.stats.rejected += 1
            raise WireError(f"grad from {msg.src}: body needs o (str), s, h (int) and meta (dict)")
        key = (origin, seq)
        if origin == self.link.id or key in self._seen:
            self.stats.duplicates += 1
            return
        t, c = b.get("t"), b.get("c")
        forward = arrays   # what goes on: the gradients, without the rider
        parts: list[tuple[Any, dict[str, Any] | None, list[Any]]] = []   # (clock, meta or None, frames)
        extra = b.get("b")
        if extra is not None:   # earlier updates of the same turn (publish(hold=True)), first
            if not (isinstance(extra, list) and 0 < len(extra) < _MAX_BUNDLE and isinstance(c, int)
                    and all(isinstance(e, list) and len(e) == 3 and isinstance(e[0], int)
                            and (e[1] is None or isinstance(e[1], dict)) and isinstance(e[2], int)
                            and (e[2] == 0 if e[1] is None else e[2] > 0) for e in extra)
                    and sum(e[2] for e in extra) <= len(arrays)):
                self.stats.rejected += 1
                raise WireError(f"grad {origin}#{seq} from {msg.src}: b must list up to {_MAX_BUNDLE - 1} "
                                f"[clock, meta or None, frame count] whose frames the message holds")
            at = 0
            for ec, em, nf in extra:
                parts.append((ec, em, arrays[at:at + nf]))
                at += nf
            arrays = arrays[at:]
        if "p" in b:   # a pass: a clock, no gradient
            if b["p"] != 1 or arrays or meta or not isinstance(c, int):
                self.stats.rejected += 1
                raise WireError(f"pass {origin}#{seq} from {msg.src}: needs p = 1, a clock c, "
                                f"empty meta and no arrays")
            parts.append((c, None, []))
        else:
            parts.append((c, meta, arrays))
        items: list[tuple[Any, np.ndarray | None]] = []   # everything is checked before anything is queued
        for pc, pm, frames in parts:
            if pm is None:
                items.append((pc, None))
                continue
            try:
                g = self._decoder.decode(Encoded(pm, frames), self.d)
            except WireError:
                self.stats.rejected += 1
                raise
            if g.shape != (self.d,) or not np.isfinite(g).all():
                self.stats.rejected += 1
                raise WireError(f"grad {origin}#{seq} from {msg.src}: not {self.d} finite values")
            items.append((pc, g))
        sent_at = float(t) if isinstance(t, (int, float)) else time.time()
        with self._cond:   # with direct, the loop and the consumer thread both take gradients in
            if key in self._seen:
                self.stats.duplicates += 1
                return
            self._seen[key] = None
            if len(self._seen) > 64 * self._max_pending:
                self._seen.popitem(last=False)
            for pc, g in items:
                if g is None:
                    self.stats.passes_in += 1
                else:
                    if len(self._inbox) >= self._max_pending:
                        self._inbox.popleft()
                        self.stats.overflow += 1
                    self._inbox.append((pc if isinstance(pc, int) else -1, origin, g, sent_at))
                    self.stats.received += 1
                if isinstance(pc, int):
                    if pc > self._clocks.get(origin, -1):
                        self._clocks[origin] = pc
                    got = self._got.setdefault(origin, set())
                    got.add(pc)
                    if len(got) > 2 * _RECENT_CLOCKS:   # keep the newest
                        self._got[origin] = set(sorted(got)[-_RECENT_CLOCKS:])
            self._cond.notify_all()
        if ride is not None and msg.src == origin and self.rider is not None:   # only the origin's copy
            self.stats.rider_bytes_in += _nbytes(ride_arrays)
            self.stats.riders_in += 1
            self.rider.arrive(origin, ride[0], ride_arrays)
        if hops > 1:   # pass it on, away from where it came from
            fwd = dict(b, h=hops - 1)
            fwd.pop("x", None)
            for dst in self.link.neighbours():
                if dst != msg.src and dst != origin:
                    send(dst, fwd, forward, nbytes, forwarding=True)

    # ------------------------------------------------------------ direct mode

    def _greet(self, missing_only: bool = False) -> None:
        """On the loop: tell neighbours where this peer's inbox is (each once per address
        it has; ``missing_only``: again to those whose inbox we do not know)."""
        view = self.link.view
        for dst in self.link.neighbours():
            m = view.member(dst)
            if m is None:
                continue
            again = missing_only and dst not in self._endpoints
            if again or self._greeted.get(dst) != m.addr:
                if self.link.send_nowait(dst, GRAD_HELLO, {"ep": self._endpoint, "r": False}):
                    self._greeted[dst] = m.addr

    def _on_hello(self, msg: Message) -> None:
        ep = msg.body.get("ep")
        if not isinstance(ep, str) or len(ep) > _MAX_ENDPOINT or tp.member_address_error(ep):
            raise WireError(f"grad_hello from {msg.src}: ep must be tcp://HOST:PORT with a port in 1..65535")
        self._endpoints[msg.src] = ep
        if not msg.body.get("r") and self._endpoint:
            self.link.send_nowait(msg.src, GRAD_HELLO, {"ep": self._endpoint, "r": True})

    def _outbox(self, dst: str) -> Any:
        """Consumer thread: the PUSH socket to ``dst``'s inbox, None while it is unknown."""
        ep = self._endpoints.get(dst)
        if ep is None:
            return None
        cur = self._outboxes.get(dst)
        if cur is not None:
            if cur[0] == ep:
                return cur[1]
            self.link.close_side(cur[1])   # it came back at another address
            del self._outboxes[dst]
        s = self.link.open_outbox(dst, ep)
        if s is not None:
            self._outboxes[dst] = (ep, s)
        return s

    def _prune_outboxes(self) -> None:
        self._outbox_epoch = self.link.view.epoch
        keep = set(self.link.neighbours())
        for dst in [d for d in self._outboxes if d not in keep]:
            self.link.close_side(self._outboxes.pop(dst)[1])

    def _push(self, dst: str, body: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
              forwarding: bool, rider: int = 0) -> bool:
        """Consumer thread: send on our own socket to ``dst``; False if it has none yet."""
        if self._inbox_sock is None:
            return False
        s = self._outbox(dst)
        if s is None:
            return False
        frames = wire.encode(GRAD, self.link.id, epoch=self.link.view.epoch, seq=next(self._wire_seq),
                             body=body, arrays=arrays)
        if tp.try_send(s, frames):
            self.stats.sent += 1
            self.stats.direct_out += 1
            self.stats.direct_bytes_out += tp.frames_nbytes(frames)
            self.stats.bytes_out += nbytes
            self.stats.rider_bytes_out += rider
            self.stats.forwarded += int(forwarding)
        else:
            self.stats.dropped += 1
        return True

    def _push_or_hand(self, dst: str, body: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
                      forwarding: bool) -> None:
        if not self._push(dst, body, arrays, nbytes, forwarding):
            self._loop.call_soon_threadsafe(self._send, dst, body, arrays, nbytes, forwarding)


def _nbytes(arrays: list[np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in arrays)


def _clock(clock: Any) -> int:
    """``clock`` as an int, or ConfigError: clocks count steps, from 0."""
    if not is_int(clock) or clock < 0:
        raise ConfigError(f"clock = {clock!r}: must be an int >= 0 (env steps, say)")
    return int(clock)
