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
dropped, but one with more hops left than every earlier copy is passed on (not
applied): the first may have come the long way with too few to reach the peers
behind. A peer's copy then differs from the others' only in the order in which
it applied the gradients (Adam's update depends on it) and in what was lost: on
full queues (``stats.dropped``), and in a peer that died before it passed on
what it had. At a view that a member left, each peer sends its last turn's
messages again along the new routes (``stats.resent``; the numbers make the
repeats safe), which brings what was on the way through that member then; what
went into it earlier, between its death and that view, stays lost, and nothing
counts it. Peers that take turns apply them in one order (:meth:`take` with
``before``) and stay the same; parameter gossip (:class:`~swarm.gossip.Gossip`)
pulls back what drift is left.

The codec is one stream per origin: with ``ef+...`` the residual of what the
codec dropped stays at the origin and goes out with its next gradients, and
every peer applies exactly what was sent.

    relay = GradientRelay(peer, d, codec="ef+topk:0.15:values=fp16")   # on the peer's loop
    g = relay.publish(grad)        # any thread (calls take turns): sends; returns what to apply here
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

Peers that take turns stay the same only while each waits for every other. One
that falls out of step (frozen, restarted, or slower than a wait's timeout) is
no longer waited for, and its gradients reach the others after their turns went
past them. Given ``state`` (a function that returns this peer's copy: parameters,
optimizer and target network, as a body and arrays), the relay repairs that:

* a gradient or pass that comes after this peer's turn went past its clock is
  dropped (applying it late would put it in another place in each peer's order),
  and its origin is told so (``grad_late``, at most once a second per origin); the
  origin is out of step when the teller's turns are past its own last message (not
  when the teller itself fell behind and took old messages in late);
* every copy's parameter digests (:meth:`note_digest`) ride on its own messages,
  and a peer whose digest at some update count differs from the reference's (the
  lowest-ranked member it keeps step with) is out of step too;
* a peer out of step asks (``grad_sync``) the peer that told it, or the reference,
  for its copy; that peer sends it (``grad_state``) at one of its turn boundaries,
  with the clock up to which the copy holds every update and the gradients it has
  for later clocks. The asking peer waits for it before its next turn, adopts it
  (:meth:`snapshot`, :meth:`adopt`), keeps only what comes after that clock (the
  gradients it came with are dropped when their own messages come later), and,
  when the sender's turns had gone past its own, starts its turns again a round
  after the copy's clock: it tells the others so itself, and the sender's next
  message does too; they then wait for it again. From then on it applies the same
  updates in the same order.

    snap = relay.snapshot()          # training thread, between turns
    if snap is not None:
        agent.load_replica(snap.body, snap.arrays)   # the caller's copy; raises on a bad one
        relay.adopt(snap)                              # or relay.refuse(snap, why)
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Protocol

import msgpack
import numpy as np
import zmq

from .. import transport as tp
from .. import wire
from ..checks import MAX_GRAD, is_int, largest_abs, seconds
from ..compress import Encoded, get_codec, split_ef
from ..compress.sparse import _Sparse
from ..errors import ConfigError, EncodedTooLarge, GossipError, WireError
from ..link import Link, link_closed, link_problem
from ..transport import _EVENTS, _POLLIN   # ints: pyzmq's enums cost an operation per use
from ..wire import Message, shown
from . import topology as topo

__all__ = ["GradientRelay", "RelayStats", "Rider", "Snapshot", "GRAD", "GRAD_HELLO", "GRAD_LATE",
           "GRAD_SYNC", "GRAD_STATE"]

log = logging.getLogger("swarm.gossip.relay")

GRAD = wire.register_type("grad")
#: direct mode: "my inbox is at this endpoint" (body: ep, and r for a reply)
GRAD_HELLO = wire.register_type("grad_hello")
#: "your message at clock c came after my turn went past it; my turns are at clock at"
GRAD_LATE = wire.register_type("grad_late")
#: "send me your copy" (body: r, a request number; b, the clock of the asker's last message, or -1)
GRAD_SYNC = wire.register_type("grad_sync")
#: a copy at a turn boundary, or a refusal (see Snapshot and GradientRelay._serve)
GRAD_STATE = wire.register_type("grad_state")
_MAX_ENDPOINT = 256
#: Clocks remembered per origin for waits on turns of several updates (span > 1).
_RECENT_CLOCKS = 256
#: Updates in one message at most (publish(hold=True) sends when it has this many, or as
#: many as fit in one message under the link's limits when fewer do: see _fit).
_MAX_BUNDLE = 16
#: Header bytes kept free in a message for the relay's own body: ids, clocks, digest, up to
#: 64 announcements and _MAX_BUNDLE updates' codec meta take well under this.
_HEADER_ROOM = 64 * 1024
#: The least header a message has (ids, clocks, one update's meta): a gradient that does
#: not fit beside it can never be sent (ConfigError at construction).
_HEADER_MIN = 4 * 1024
#: Digest points remembered per peer, its own and each origin's (with state).
_DIGESTS = 64
#: Gradients that may go with a copy (those it does not hold yet); a peer with more refuses.
_MAX_COPY_PENDING = 256
#: Seconds between two grad_late notices to one origin, and after a request that failed.
_QUIET_S = 1.0
#: Message numbers remembered per origin below its highest (a copy that comes later counts as seen).
_SEQ_WINDOW = 4096
#: How far past this peer's clock, in microseconds, an origin's message number may be: origins
#: number their messages from their start time in microseconds, one a message (see _seq), so
#: only a clock set that much apart reaches it. A number beyond (a forged 2**64 - 1) would move
#: the origin's window there, and every later message of it would look old here for good.
_SEQ_AHEAD_US = 86_400 * 10**6
#: Origins outside the view (one that joined in a newer view can come before this peer's view
#: lists it) whose entries are kept until the next view, at most; more are refused.
_STRANGERS = 64
#: Peers announced (j) in one message at most: receivers refuse more.
_MAX_ANNOUNCE = 64
#: Notices, requests and copies waiting for the consumer's poll() at most; more are refused.
_SIDE_MAX = 1024
#: Messages sent again at a view change (see GradientRelay._resend) remembered, as (origin, number).
_RESENT_KEPT = 4096
#: Ids that left the view whose entries stay (copies of their messages may still come round).
_GONE = 16
#: Direct, with keys: gradients held on the inbox until the view lists their sender (see
#: _hold), at most this many and _HOLD_BYTES of them, each for at least _HOLD_S seconds (or
#: two heartbeats: a peer that missed a view has it again by then), as the peer's loop holds
#: its own messages (swarm.peer.peer.HELD_IN_S).
_HOLD_MAX = 256
_HOLD_BYTES = 64 * 1024 * 1024
_HOLD_S = 2.0
#: The largest clock (and update count) the relay sends: a signed 64-bit int, which the wire
#: carries (it refuses ints of 2**64 and more) with room for the sums of clocks made from it.
_MAX_CLOCK = 2**63 - 1
#: The dtypes the wire carries as they are (native byte order: those of wire.DTYPES)
_WIRE_DTYPES = frozenset(np.dtype(n) for n in wire.DTYPES)
#: Header bytes a message takes at most beside its body and its arrays' descriptors: the
#: envelope's keys, version, type, epoch and seq (the src's UTF-8 bytes come on top); and per
#: array, the bytes of its [dtype, shape] descriptor beside 9 per dimension (see _ride_fits)
_ENVELOPE_BYTES = 64
_DESC_BYTES = 16


def _vectors(body: dict[str, Any]) -> int:
    """The gradients a message carries (``vectors_out``): its last update unless it is a
    pass (``p``), and the earlier updates of its turn (``b``) that are not passes."""
    return int("p" not in body) + sum(e[1] is not None for e in body.get("b") or ())


@dataclass
class RelayStats:
    published: int = 0      # own gradients sent
    sent: int = 0           # messages sent, own and forwarded
    vectors_out: int = 0    # gradients in the messages sent, own and forwarded (a turn's go in one; a pass has none)
    received: int = 0       # others' gradients taken in (first copies)
    forwarded: int = 0      # sends that passed a gradient on
    duplicates: int = 0     # copies that came round another way (and the stale ones)
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
    rider_refused: int = 0     # rides left off own messages: the wire refused them beside the gradients
    rider_bytes_in: int = 0    # rider payload received from neighbours (not in bytes_in)
    riders_in: int = 0         # riders handed to this peer's rider
    direct_bytes_out: int = 0  # wire bytes sent on the consumer's own sockets (the peer's counters miss them)
    direct_bytes_in: int = 0   # wire bytes received on this peer's inbox (direct)
    late: int = 0              # with state: others' gradients and passes that came after this peer's turn passed them (dropped)
    resyncs: int = 0           # with state: copies adopted from another peer
    served: int = 0            # with state: copies sent to peers out of step
    resync_failed: int = 0     # with state: requests that timed out or were declined, copies refused
    held_in: int = 0           # direct, with keys: gradients held until the view listed their sender
    held_dropped: int = 0      # direct, with keys: such gradients dropped (hold full, waited too long, sender gone)
    unlisted: int = 0          # direct, with keys: gradients dropped from a sender the view no longer lists
    stale: int = 0             # of the duplicates, those over _SEQ_WINDOW behind their origin's newest (see _Seqs)
    reforwarded: int = 0       # of the duplicates, those with more hops left than every earlier copy: passed on
    resent: int = 0            # own messages of the last turn sent again at a view that a member left (see _resend)
    resent_old: int = 0        # of the duplicates, messages sent again of turns before this relay's first view
    late_resent: int = 0       # with state: grad_late notices about a clock this peer sent again, ignored (see _on_side)

    @property
    def mean_lag_s(self) -> float:
        """Mean seconds from a gradient's publication to its take(); NaN before any."""
        return self.lag_s / self.taken if self.taken else float("nan")


@dataclass
class Snapshot:
    """A copy that another peer sent at one of its turn boundaries (see the module doc).

    ``body`` and ``arrays`` are what the sender's ``state()`` returned: the caller
    checks and loads them (the relay checked only the frames' count and kinds).
    """

    src: str               # the peer that sent it
    clock: int             # the copy holds every update up to this clock, and none after
    next: int | None       # this peer's turns start again at this clock; None: they go on as they were
    why: str               # why this peer asked
    body: dict[str, Any]
    arrays: list[np.ndarray]
    _pending: list[tuple[int, str, np.ndarray]] = field(repr=False, default_factory=list)
    _clocks: dict[str, list[int]] = field(repr=False, default_factory=dict)


class Rider(Protocol):
    """What rides on a relay's own messages to its neighbours (see the module docstring)."""

    def ride(self) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """A body and arrays to send with this peer's next own message, or None.
        Called on the thread that publishes."""

    def arrive(self, src: str, body: dict[str, Any], arrays: list[np.ndarray]) -> None:
        """What rode on neighbour ``src``'s own message. Called on the thread that took that
        message in: the peer's loop, or with ``direct`` the consumer's for what came on its
        inbox (and the loop's for what still came through the peer: before the neighbour
        knew the inbox, or when it could not send there), so possibly on both threads; bad
        input is the rider's to count and drop: the gradients it came with are taken in all
        the same."""

    # Optional: ``refused()``, called (on the publishing thread) when the last ride could not
    # go beside the gradients (too large for a message): the rider may send it again, smaller.


class GradientRelay:
    """Publish this peer's gradients and collect everyone else's (see the module docstring).

    Build it on the link's event loop (it registers a handler there; elsewhere it
    raises :class:`~swarm.errors.ConfigError`). ``publish``
    may be called from any thread (calls take turns; with ``state``, the consumer's
    only); ``take`` from one consumer thread.

    Args:
        link: the peer (or a :class:`~swarm.gossip.sim.SimLink`).
        d: length of the gradient vector; one gradient, encoded, must fit in a message
            under the link's limits (a Peer's ``max_message_mb``), else ConfigError. A
            turn's updates that do not all fit in one go in several messages.
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
        direct: the consumer thread (the one that calls :meth:`take`, :meth:`wait`
            and :meth:`poll`) sends and receives the gradients on sockets
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
            before the peer closes. With keys, a gradient on the inbox from a sender
            that this peer's view does not list yet, sent from a newer view (a member
            that rejoined: the coordinator tells it first), waits until the view lists
            the sender, as the peer holds its own messages (``stats.held_in``; past
            256 of them or 64 MiB, after ``max(2 s, 2 heartbeats)``, or when a view as
            new does not list the sender it is dropped, and counted in ``held_dropped``).
        rider: sends what its ``ride()`` gives with each message of this peer's own
            (gradients or a pass) to the neighbours, and gets theirs through its
            ``arrive()`` (:class:`Rider`). Counted apart from the gradients' bytes.
        state: this peer's copy as ``(body, arrays)``, for a peer out of step to adopt
            (see the module doc); called on the consumer thread, between turns. With it
            the relay drops gradients that come after their turn, tells their origin,
            compares copies by their digests and brings a copy that fell out of step
            back in step. Only for peers that take turns (:meth:`wait` with ``first``
            and ``rounds = 1``) and change their copies by the relay's gradients alone.
        resync_timeout: seconds a peer out of step waits for the copy it asked for,
            before its turn goes on without it.
    """

    def __init__(self, link: Link, d: int, codec: str = "identity", *, topology: str | None = None,
                 edges: Any = None, max_pending: int = 1024, hops: int | None = None,
                 direct: bool = False, rider: Rider | None = None,
                 state: Callable[[], tuple[dict[str, Any], list[np.ndarray]]] | None = None,
                 resync_timeout: float = 5.0) -> None:
        if (problem := link_problem(link, send="send_nowait")) is not None:
            raise ConfigError(problem)
        if not is_int(d) or d < 1:
            raise ConfigError(f"d = {d!r}: the gradient length must be an int >= 1")
        if not is_int(max_pending) or max_pending < 1:
            raise ConfigError(f"max_pending = {max_pending!r}: must be an int >= 1")
        if hops is not None and (not is_int(hops) or hops < 1):
            raise ConfigError(f"hops = {hops!r}: must be an int >= 1 or None")
        d, max_pending, hops = int(d), int(max_pending), None if hops is None else int(hops)
        if topology is not None and (topology not in topo.TOPOLOGIES or topology in topo.TIME_VARYING):
            raise ConfigError(f"topology = {topology!r}: the relay needs a fixed graph, one of "
                              f"{', '.join(t for t in topo.TOPOLOGIES if t not in topo.TIME_VARYING)}")
        if not isinstance(codec, str):
            raise ConfigError(f"codec = {codec!r}: must be a codec spec such as 'ef+topk:0.15'")
        if rider is not None and not all(callable(getattr(rider, m, None)) for m in ("ride", "arrive")):
            raise ConfigError(f"rider = {rider!r}: needs ride() and arrive() methods (see Rider)")
        if state is not None and not callable(state):
            raise ConfigError(f"state = {state!r}: must be a function returning (body, arrays)")
        resync_timeout = seconds(resync_timeout, "resync_timeout")
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
        self._limits: wire.Limits = getattr(link, "limits", wire.DEFAULT_LIMITS)
        self._keep_frames = tp.keep_frames(self._limits)   # what poll()'s drain keeps of a message
        # one update's frames and bytes at most, and the updates one message carries
        self._update_frames, self._update_bytes, self._bundle = self._fit()
        # a header's bytes at most beside its body and descriptors (see _ride_fits); None where
        # the wire refuses this peer's id: the trial encode of _ride then says so, as ever
        self._envelope: int | None = None
        try:
            wire.encode(GRAD, link.id, limits=self._limits)
            self._envelope = _ENVELOPE_BYTES + len(link.id.encode())
        except WireError:
            pass
        self._loop = loop
        self._loop_thread = threading.get_ident()
        # Numbered from the time in microseconds: a peer restarted under the same id numbers
        # its gradients above any its earlier process sent, which the others remember and
        # would drop as copies (no process sends more than one a microsecond).
        self._seq = itertools.count(time.time_ns() // 1000)
        self._seen: dict[str, _Seqs] = {}   # origin -> the numbers of its messages that came
        self._strangers: set[str] = set()   # origins taken in that the view did not list (see _admit)
        # strangers' message numbers kept over the view that dropped their other entries, newest
        # last, at most _STRANGERS: a copy of a message taken in may still come (sent again at
        # that view, or the long way round), and without them it was applied a second time
        self._parked: collections.OrderedDict[str, _Seqs] = collections.OrderedDict()
        # (clock, origin, gradient, sent at)
        self._inbox: collections.deque[tuple[int, str, np.ndarray, float]] = collections.deque()
        self._max_pending = max_pending
        self._clocks: dict[str, int] = {}    # origin -> clock of its newest gradient here
        self._got: dict[str, set[int]] = {}  # origin -> clocks of its recent gradients and passes here
        self._brought: dict[str, set[int]] = {}   # origin -> clocks of its gradients that adopted copies brought
        self._complete: dict[str, int] = {}  # origin -> last clock of its newest turn waited for (with first)
        self._held: list[tuple[int, dict[str, Any] | None, list[np.ndarray]]] = []   # publish(hold=True)
        # this peer's own messages (body, gradient frames, view epoch when published) of its
        # turn going on (its last _MAX_BUNDLE) and of its last one: sent again at a view that
        # a member left (see _resend); written and read under _cond
        self._turn: collections.deque[tuple[dict[str, Any], list[np.ndarray], int]] = \
            collections.deque(maxlen=_MAX_BUNDLE)
        self._last_turn: tuple[tuple[dict[str, Any], list[np.ndarray], int], ...] = ()
        self._members = {m.id for m in link.view.members}   # the last view's, to see who left
        # the epoch of the first view listing this peer (None: none yet): what is sent again
        # of turns from before it is not applied here (see _predates)
        self._since: int | None = link.view.epoch if link.id in self._members else None
        self._resent_in: collections.OrderedDict[tuple[str, int, Any], None] = collections.OrderedDict()   # (origin, number, q)
        # the clocks of this peer's messages sent again (the newest _RECENT_CLOCKS), on the loop:
        # a grad_late about one is not about this peer's own lateness (see _on_side)
        self._resent_clocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._cond = threading.Condition()
        # publish takes it whole: the held updates, the codec's residual and scratch buffers,
        # the message numbers and the turn's bookkeeping are one stream, one call at a time
        self._publishing = threading.Lock()
        # direct: the PUSH sockets (and _outboxes) are used by publish, on any thread, and by
        # poll's forwarding on the consumer's; zmq sockets are not thread-safe
        self._sockets = threading.Lock()
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
        # direct, with keys: (until, message, its last frame, bytes) from senders the view
        # does not list yet, in arrival order (see _hold)
        self._held_in: collections.deque[tuple[float, Message, Any, int]] = collections.deque()
        self._held_bytes = 0
        self._held_epoch = -1                # the view's epoch when they were last looked at
        heartbeat_s = getattr(getattr(link, "config", None), "heartbeat_s", 0.0)
        self._hold_s = max(_HOLD_S, 2 * heartbeat_s)
        # with state: out-of-step repair (see the module doc)
        self._state, self._resync_timeout = state, resync_timeout
        self._taken_to = -1                   # take(before) went up to here: what comes below it is late
        self._boundary: int | None = None     # clock of this peer's last own message (its copy's, after adopt)
        self._sched: tuple[int, int, int] | None = None   # (every, first, span) of the last wait with first
        self._astray: set[str] = set()        # members the last wait did not keep step with
        self._side: collections.deque[Message] = collections.deque()   # notices, requests, copies (loop -> consumer)
        self._want: tuple[str, str] | None = None         # (peer, why): ask it for its copy at the next wait
        self._asked: tuple[str, int, float, str] | None = None   # (peer, request number, deadline, why)
        self._arrived: Snapshot | None = None
        self._deferred: list[tuple[str, int, int, float]] = []   # requests to serve at a later boundary
        self._quiet_until = 0.0               # no new request before this (monotonic)
        self._floor = -1                      # own clocks up to here belong to a copy already replaced
        self._noticed: dict[str, float] = {}  # origin -> when it was last told it is late
        self._announce: dict[str, int] = {}   # peer -> clock: its turns up to there passed (next own messages)
        self._unsent = 0                      # request number whose grad_sync could not be sent (set on the loop)
        self._digest_out: list[Any] | None = None
        self._own_digests: dict[int, str] = {}
        self._digests_in: dict[str, dict[int, str]] = {}
        self._digests_new = False
        self._checked = -1                    # digest points compared up to here
        self._rids = itertools.count(1)
        #: one entry per adopted copy: {src, clock, next, why}
        self.resynced: list[dict[str, Any]] = []
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()   # ids that left, oldest first
        # what is registered on the link, for close() to take off
        self._handlers: list[tuple[str, Callable[[Message], Any]]] = []
        self._view_callbacks: list[Callable[[Any], None]] = []
        self._closed = False
        self._peer_down = False   # closed because its peer closed (see _peer_gone)
        self._on(GRAD, self._on_grad)
        self._on_view(self._forget)
        self._on_view(self._resend)
        if state is not None:
            for t in (GRAD_LATE, GRAD_SYNC, GRAD_STATE):
                self._on(t, self._on_side)
        if direct:
            if not all(hasattr(link, n) for n in ("open_inbox", "open_outbox", "close_side", "key_check")):
                raise ConfigError(f"direct: {type(link).__name__} has no side channels; direct needs a Peer")
            self._inbox_sock, self._endpoint = link.open_inbox()
            self._on(GRAD_HELLO, self._on_hello)
            self._on_view(lambda _view: self._greet())
            self._greet()

    def _on(self, t: str, handler: Callable[[Message], Any]) -> None:
        self.link.on(t, handler)
        self._handlers.append((t, handler))

    def _on_view(self, callback: Callable[[Any], None]) -> None:
        self.link.on_view(callback)
        self._view_callbacks.append(callback)

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

        Bad input (a clock that is not an int from 0 to 2**63 - 1, a gradient that is
        not ``d`` finite floats of at most ``MAX_GRAD``, or whose decoded vector passes
        it: with ``ef+`` that adds the residual, and QSGD's levels can pass a block's
        largest entry) raises :class:`~swarm.errors.ConfigError` in the
        calling thread before anything changes: nothing is sent, and the codec's
        residual stays as it was. So does what the rider's ``ride()`` gives when the
        wire would refuse it beside the turn's updates (a body msgpack cannot pack, a
        dtype the wire does not carry, more arrays or bytes than a message may hold),
        with :class:`~swarm.errors.WireError`; a ride that is well formed but too large
        for the message is left off (the gradients go; ``stats.rider_refused``, and the
        rider's ``refused()`` is called). After :meth:`close`, or once the peer closed
        (which closes the relay), it raises :class:`~swarm.errors.GossipError`, and sends
        nothing.

        Calls from several threads take turns (a lock over the whole call: the codec's
        residual and buffers, the held updates and the message numbers are one stream);
        what ``hold`` keeps goes with the next publish without it, from whichever thread.
        With ``direct`` a call from another thread than the consumer's sends on the
        consumer's sockets too, taking turns with :meth:`poll`'s forwarding. With
        ``state`` call it from the consumer thread only, between its turns: it writes
        what :meth:`poll` reads there.
        """
        with self._publishing:
            return self._publish(grad, clock, hold)

    def _publish(self, grad: Any, clock: int, hold: bool) -> np.ndarray | None:
        if self._closed or self._peer_gone():
            raise self._closed_error()
        clock = _clock(clock)
        g = None if grad is None else self._gradient(grad)
        sends = not hold or len(self._held) + 1 >= self._bundle
        enc, out, codec = (None, None, self._codec) if g is None else self._encode(g)
        try:
            extra = self._ride(g is not None) if sends and self.rider is not None else None
        except BaseException:
            self._codec = codec   # the residual as it was: nothing is published
            raise
        # Nothing is refused from here on (the message fits the wire: see _fit and _ride),
        # so the counters and the held updates change only now.
        if enc is None:
            self._held.append((clock, None, []))
            self.stats.passed += 1
        else:
            # copies: the codec reuses its buffers
            self._held.append((clock, enc.meta, [np.array(f, copy=True) for f in enc.frames]))
            self.stats.published += 1
        if not sends:
            return out
        *held, (c, meta, frames) = self._held
        self._held = []
        body = self._body(c, {} if meta is None else meta)
        if meta is None:
            body["p"] = 1
        if self._state is not None:
            self._boundary = c
            if self._digest_out is not None:   # the newest digest point, once
                body["d"], self._digest_out = self._digest_out, None
            if self._announce:                 # peers whose turns start again later (see _serve)
                # at most _MAX_ANNOUNCE a message (receivers refuse more): the rest go on the next
                body["j"] = [[p, c] for p, c in itertools.islice(self._announce.items(), _MAX_ANNOUNCE)]
                for p, _ in body["j"]:
                    del self._announce[p]
        if held:   # earlier updates of the turn go first: [clock, meta (None: a pass), frame count]
            body["b"] = [[hc, hm, len(hf)] for hc, hm, hf in held]
            frames = [f for _, _, hf in held for f in hf] + frames
        if extra is not None:   # the rider's arrays go last: [its body, their count]
            body["x"] = [extra[0], len(extra[1])]
        # noted before it goes: a view that a member left, coming while it is sent (on the
        # loop, or on the old routes from this thread), sends it again (see _resend)
        with self._cond:
            self._turn.append((body, frames, self.link.view.epoch))
            if not hold:   # the turn ends here (a held update went because the message was full)
                self._last_turn, self._turn = tuple(self._turn), collections.deque(maxlen=_MAX_BUNDLE)
        self._send_own(body, frames, [] if extra is None else extra[1])
        return out

    def _fit(self) -> tuple[int, int, int]:
        """(frames, bytes, updates): one update's frames and at most its bytes on the wire,
        and how many updates one message carries under the link's limits (up to
        _MAX_BUNDLE). Measured on a fresh codec's encoding of ``d`` zeros: a codec gives
        the same frames for every vector of ``d``, but for a sparse codec's index codes,
        which grow with the spacing of the kept indices, by at most (d - 1) // 255 bytes.
        ConfigError when not even one update fits beside the smallest header (every
        publish would fail on the wire); one update per message when only that fits."""
        codec = get_codec(split_ef(self.codec_spec)[1])
        enc = codec.encode(np.zeros(self.d, np.float32))
        slack = (self.d - 1) // 255 if isinstance(codec, _Sparse) else 0
        frames, nbytes = max(1, len(enc.frames)), max(1, enc.nbytes + slack)
        lim = self._limits
        if frames > lim.max_frames or nbytes + _HEADER_MIN > lim.max_message_bytes:
            raise ConfigError(
                f"d = {self.d}: a gradient encoded by {self.codec_spec!r} takes up to {nbytes} bytes in "
                f"{frames} frames, more than a message on this link may carry ({lim.max_message_bytes} "
                f"bytes, {_HEADER_MIN} at least of them for the header, and {lim.max_frames} frames; a "
                f"Peer's max_message_mb sets the bytes): raise that limit or choose a codec that "
                f"compresses more")
        fit = min(_MAX_BUNDLE, lim.max_frames // frames, (lim.max_message_bytes - _HEADER_ROOM) // nbytes)
        return frames, nbytes, max(1, fit)

    def _ride(self, update: bool) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """What the rider gives to go with this publish's message, checked against what the
        wire leaves it beside the turn's updates (those held, and this one's when
        ``update``). What the wire refuses there does not go: the gradients go without it,
        ``stats.rider_refused`` counts it, and the rider's ``refused()`` (if it has one) is
        told, so that it can send it again, or less. What is not a ride at all (the rider's
        bug) is a WireError, before the relay changes anything."""
        got = self.rider.ride()
        if got is None:
            return None
        who = f"relay {self.link.id}: the rider's ride() gave"
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], dict)
                and isinstance(got[1], (list, tuple)) and all(isinstance(a, np.ndarray) for a in got[1])):
            raise WireError(f"{who} {type(got).__name__} {got!r:.80}, not None or (body dict, list of numpy "
                            f"arrays); nothing was published")
        body, arrays = got[0], list(got[1])
        held = [f for _, _, hf in self._held for f in hf]
        frames = len(held) + (self._update_frames if update else 0)
        lim = self._limits
        data = _nbytes(held) + (self._update_bytes if update else 0)
        # the header room of _fit: 64 KiB where the updates leave that much twice over, else
        # the least a header takes (a gradient near the limit still carries a small ride)
        room = _HEADER_ROOM if lim.max_message_bytes - data >= 2 * _HEADER_ROOM else _HEADER_MIN
        nbytes = data + room
        ride = {"x": [body, len(arrays)]}
        if self._ride_fits(ride, arrays, lim.max_frames - frames, lim.max_message_bytes - nbytes,
                           lim.max_header_bytes - room):
            return body, arrays
        left = replace(lim, max_frames=lim.max_frames - frames, max_message_bytes=lim.max_message_bytes - nbytes,
                       max_header_bytes=lim.max_header_bytes - room)
        try:
            wire.encode(GRAD, self.link.id, body=ride, arrays=arrays, limits=left)
        except WireError as e:
            try:   # with room enough, is it a message at all? If not, the rider has a bug
                wire.encode(GRAD, self.link.id, body=ride, arrays=arrays,
                            limits=replace(lim, max_frames=lim.max_frames + len(arrays),
                                           max_message_bytes=2**62, max_header_bytes=2**62))
            except WireError as bad:
                raise WireError(f"{who} what the wire refuses: {bad}; nothing was published") from None
            # Too large beside the gradients, and not fatal: a learner's publish would end training for a rider's oversized batch
            # (its first, which carries what came before learning_starts, say).
            (log.warning if not self.stats.rider_refused else log.debug)(
                "%s what the wire refuses beside the turn's updates (%d frames and up to %d bytes, %d more "
                "kept for the header): %s; the gradients go without it (stats.rider_refused)",
                who, frames, data, room, e)
            self.stats.rider_refused += 1
            refused = getattr(self.rider, "refused", None)
            if refused is not None:
                refused()
            return None
        return body, arrays

    def _ride_fits(self, ride: dict[str, Any], arrays: list[np.ndarray], frames: int, nbytes: int,
                   header: int) -> bool:
        """Whether the trial encode of _ride surely takes ``ride`` and ``arrays`` within
        ``frames`` frames, ``nbytes`` bytes and ``header`` header bytes, reckoned without
        building the message (the trial encode checks every array and packs and unpacks a
        whole header): arrays the wire carries as they are, a body that packs, that a
        receiver unpacks, and whose header, bounded from above, is within every limit.
        False when not sure: the trial encode then decides, and says what is wrong."""
        lim = self._limits
        if self._envelope is None or len(arrays) > frames:
            return False
        data, head = 0, self._envelope
        for a in arrays:
            if type(a) is not np.ndarray or a.dtype not in _WIRE_DTYPES or a.ndim > lim.max_ndim:
                return False
            data += a.nbytes
            head += _DESC_BYTES + 9 * a.ndim
        try:
            packed = msgpack.packb(ride, use_bin_type=True)
        except Exception:   # what msgpack refuses, the trial encode words (or raises again)
            return False
        head += len(packed)
        # no str, bin, list or map in a header is longer than the header
        if (head > header or data + head > nbytes
                or head > min(lim.max_str_len, lim.max_bin_len, lim.max_array_len, lim.max_map_len)):
            return False
        try:
            # what a receiver refuses of what msgpack packs (int keys, ext types, nesting past its
            # stack), with the ride as deep as in a header: the value of its "body" key
            wire.unpack_header(b"\x81\xa4body" + packed, lim)
        except WireError:
            return False
        return True

    def _closed_error(self) -> GossipError:
        if self._peer_down:
            return GossipError(f"relay {self.link.id}: its peer closed, so it sends and receives nothing any more; "
                               f"close a relay before its peer, and build a new one on a new peer")
        return GossipError(f"relay {self.link.id} is closed (it sends and receives nothing); build a new one")

    def _peer_gone(self) -> bool:
        """Whether the peer under this relay closed: then the relay closes too (once). A Peer
        says so in its state, and closes the inbox (direct): the relay's sockets then raised
        raw ZMQErrors, and a SyncPeer's loop, closed with it, ran nothing (see _to_loop)."""
        if not (self._peer_down or self._closed):
            s = self._inbox_sock
            if (s is not None and s.closed) or link_closed(self.link):
                self._peer_down = True
                self.close()
        return self._peer_down

    def _inbox_closed(self, e: zmq.ZMQError) -> GossipError:
        """The error for ``e``, which the inbox raised in :meth:`poll` or :meth:`wait`. An
        inbox that is gone (ENOTSOCK, ETERM) was closed by the peer's close, on its loop
        thread, after their entry checks: the relay closes, as there. Any other ZMQError
        is raised again."""
        if e.errno not in (zmq.ENOTSOCK, zmq.ETERM):
            raise e
        if not self._closed:   # the relay's own close() lets go of the inbox before closing it
            self._peer_down = True
            self.close()
        return self._closed_error()

    def _to_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Hand ``fn(*args)`` to the peer's loop from another thread; GossipError once that
        loop closed with its peer (nothing would ever run it)."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            if not self._loop.is_closed():
                raise
            self._peer_down = True
            self.close()
            raise self._closed_error() from None

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
        if not largest_abs(g) <= MAX_GRAD:   # False for NaN too
            raise ConfigError(f"gradient has NaN or infinite entries, or entries too large (above {MAX_GRAD:.3g}: "
                              "their squares overflow float32); not published")
        return g

    def _encode(self, g: np.ndarray) -> tuple[Encoded, np.ndarray, Any]:
        """The codec's encoding of ``g``, the vector it decodes to (what every peer applies),
        and the codec as it was before, to put back should the publish be refused later.
        That vector is checked as the gradient was: with ``ef+`` it is ``g`` plus the
        residual of earlier publishes, and QSGD decodes a block's entries as its norm times
        a level, past the block's largest entry, so a gradient within MAX_GRAD can decode
        past it. Receivers refuse such a vector (and FlatAdam does): ConfigError then, with
        nothing sent and the residual as it was, so that the copies stay the same."""
        # a shallow copy keeps the residual: encoding rebinds it to a new buffer and leaves
        # the old one whole (ErrorFeedback._start), so the copy is the codec as it was
        before = copy.copy(self._codec)
        enc, out = self._codec.encode_decoded(g)
        if not largest_abs(out) <= MAX_GRAD:
            self._codec = before
            raise EncodedTooLarge(f"gradient decodes with codec {self.codec_spec!r} to entries above {MAX_GRAD:.3g} "
                              f"(up to {largest_abs(out):.3g}; ef+ adds the residual of earlier publishes, and "
                              "qsgd's levels can pass a block's largest entry), which every peer would refuse; "
                              "not published (nothing sent, the residual unchanged): scale or clip gradients "
                              "well below that")
        return enc, out, before

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
                self._to_loop(self._publish_now, body, frames, extra, late)
        else:
            self._to_loop(self._publish_now, body, frames, extra)

    def take(self, before: int | None = None) -> list[np.ndarray]:
        """The other peers' gradients received since the last call.

        Without ``before``: all of them, in arrival order. With it: those published
        at a clock below ``before``, ordered by (clock, origin), and the later ones
        stay for a later call. Peers that take turns (:meth:`wait`) and, at each
        turn, apply ``take(before=their clock)`` and then their own gradient, apply
        every gradient in one global order, so their copies stay the same (as long
        as no two peers publish at the same clock: at most ``every`` peers).

        A ``before`` that is neither None nor a clock (an int from 0 to 2**63 - 1)
        raises :class:`~swarm.errors.ConfigError` and takes nothing.
        """
        if before is not None:
            before = _clock(before, "before")
        self.poll()
        now = time.time()
        with self._cond:   # the loop thread appends
            if before is None:
                items = list(self._inbox)
                self._inbox.clear()
            else:
                self._taken_to = max(self._taken_to, before)
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

        With ``state``, a peer out of step sends its request for a copy here, before
        its turn, and waits for the copy (up to ``resync_timeout``) instead of the
        others' gradients: False then means a copy came, to adopt before the turn
        (:meth:`snapshot`); the turn's clock may change with it.

        A clock that is not an int from 0 to 2**63 - 1, a timeout that is not a
        finite number of seconds >= 0, or parameters that are not ints raise
        ConfigError at once, as does, with ``state``, a wait without ``first`` or
        with ``rounds > 1`` (gradients then come after their turn by design, and the
        copies differ anyway). After :meth:`close`, or once the peer closed, it raises
        :class:`~swarm.errors.GossipError` at once (nothing can arrive any more), and
        so when the peer closes during the wait (from another thread).
        """
        if self._closed or self._peer_gone():
            raise self._closed_error()
        clock, timeout = _clock(clock), seconds(timeout)
        if not (is_int(every) and is_int(rounds) and is_int(span) and (first is None or is_int(first))):
            raise ConfigError(f"every = {every!r}, rounds = {rounds!r}, span = {span!r}, first = {first!r}: "
                              f"must be ints (first may be None)")
        if every < 1 or rounds < 1 or span < 1 or span > every or (span > 1 and first is None):
            raise ConfigError(f"every = {every}, rounds = {rounds}, span = {span}, first = {first}: need "
                              f"every, rounds >= 1 and 1 <= span <= every; a span > 1 needs first (the schedule)")
        if self._state is not None:
            if first is None or rounds != 1:
                raise ConfigError(f"first = {first}, rounds = {rounds}: a relay with state needs turns on a "
                                  f"schedule (first) and rounds = 1")
            self._sched = (every, first, span)
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if self._want is not None and self._asked is None:
                self._ask()
            if self._arrived is not None:
                return False   # a copy to adopt before this turn
            with self._cond:
                if self._asked is not None:
                    left = 0.05   # waiting for the copy: poll() keeps the request's deadline
                elif not self._behind(clock, every, rounds, first, span):
                    return True
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.stats.wait_timeouts += 1
                        self._behind(clock, every, rounds, first, span, give_up=True)
                        return False
                t0 = time.monotonic()
                if self._inbox_sock is None:
                    self._cond.wait(min(left, 0.05))   # also notices view changes
            if self._inbox_sock is not None:
                # direct: the inbox wakes us; what still comes through the loop, within 10 ms.
                # zmq_poll itself: Socket.poll builds and registers a new Poller at each call
                s = self._inbox_sock
                if s is None or s.closed:   # since poll() above: zmq_poll would poll fd 0 for its handle
                    self._peer_gone()
                    raise self._closed_error()
                try:
                    zmq.zmq_poll([(s, _POLLIN)], max(1, int(1000 * min(left, 0.01))))
                except zmq.ZMQError as e:   # the peer closed meanwhile
                    raise self._inbox_closed(e) from None
            self.stats.waited_s += time.monotonic() - t0

    def _behind(self, clock: int, every: int, rounds: int, first: int | None, span: int = 1,
                give_up: bool = False) -> list[str]:
        """The peers whose gradients from before ``clock`` (see :meth:`wait`) are not all here;
        ``give_up``: count their missing turns as passed from now on."""
        me = self.link.id
        behind: list[str] = []
        astray: list[str] = []
        for m in self.link.view.members:
            c = self._clocks.get(m.id)
            if m.id == me or (c is None and first is None):
                continue
            phase = m.rank * span + span - 1 if first is not None else c   # its turn's last clock
            last = clock - 1 - (clock - 1 - phase) % every     # its latest turn before `clock`
            need = last - (rounds - 1) * every
            if self._out_of_step(c, clock, need, every, rounds, first):
                self._complete[m.id] = need   # its turns until now count as passed
                astray.append(m.id)
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
        self._astray = set(astray)
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
        peer passes on. With ``state`` it also answers the other peers' requests for
        this peer's copy, and takes in the notices and copies for this one (with or
        without ``direct``): call it between turns, where the copy is whole.

        Once the peer closed (close the relay first), before the call or while it runs,
        it raises :class:`~swarm.errors.GossipError`, as :meth:`take`, :meth:`wait`,
        :meth:`publish` and :meth:`ready` do, and the relay is closed.
        """
        if self._peer_gone():
            raise self._closed_error()
        if self._side or self._deferred or self._asked is not None or self._digests_new:
            self._tend()
        s = self._inbox_sock
        if s is None:
            return 0
        if self.link.view.epoch != self._outbox_epoch:
            self._prune_outboxes()
        if self._held_in and (self.link.view.epoch != self._held_epoch or self._held_in[0][0] <= time.monotonic()):
            self._look_at_held(time.monotonic())
        n = 0
        limits = self._limits
        for frames in self._drain(s):
            n += 1
            src: Any = "?"
            nbytes = -1
            try:
                msg = wire.decode(frames, limits)
                src, nbytes = msg.src, msg.nbytes   # decode summed the frames' bytes
                self.stats.direct_bytes_in += nbytes
                if msg.t != GRAD:
                    raise WireError(f"{msg.t!r} message on the gradient inbox")
                # read before the key check: should a newer view come meanwhile, the
                # epochs differ and a message held on this one is looked at again at once
                view = self.link.view
                said = self.link.key_check(msg, tp.user_id(frames[-1]))
                if said is tp.KeyCheck.UNLISTED and msg.epoch > view.epoch:
                    self._hold(msg, frames[-1], nbytes)
                    continue
                if not self._from_key(msg, said):
                    continue
            except WireError as e:
                if nbytes < 0:   # not decoded: counted here
                    self.stats.direct_bytes_in += tp.frames_nbytes(frames)
                self.stats.rejected += 1
                self._bad(src, e)
                continue
            if self._held_in and self.link.view.epoch != self._held_epoch:
                self._look_at_held(time.monotonic())   # the held ones came first
            self._take_in(msg)
        self._regreet()
        return n

    def _drain(self, s: Any) -> Iterator[list[Any]]:
        """Consumer thread: the messages waiting on the inbox ``s`` (see :func:`swarm.transport.drain`)."""
        try:
            # ZMQ_EVENTS first: drain's first receive on an empty inbox would raise (an
            # exception per step costs more than the check); it checks before the others
            if s.getsockopt(_EVENTS) & _POLLIN:
                yield from tp.drain(s, keep=self._keep_frames)
        except zmq.ZMQError as e:   # the peer closed meanwhile
            raise self._inbox_closed(e) from None

    def _from_key(self, msg: Message, said: tp.KeyCheck) -> bool:
        """Consumer thread, as the peer's ROUTER does: whether to take in a gradient of
        whose sender the peer's key check said ``said``. One from a sender outside the view
        is dropped and counted in ``unlisted`` (most often a member that has just left: see
        ``Peer._from_key``); one from a listed src and another key raises :class:`WireError`."""
        if said is tp.KeyCheck.UNLISTED:
            self.stats.unlisted += 1
            log.debug("relay %s: gradient from %r, which view %d does not list: dropped", self.link.id, msg.src,
                      self.link.view.epoch)
        elif said is tp.KeyCheck.OTHER_KEY:
            raise WireError(f"src {msg.src!r} does not match the sender's CURVE key")
        return said is tp.KeyCheck.OK

    def _take_in(self, msg: Message) -> None:
        """Consumer thread: take in a gradient that came on the inbox, from its key's holder."""
        try:
            self._accept(msg, self._push_or_hand)
            self.stats.direct_in += 1
        except WireError as e:   # counted by _accept
            self._bad(msg.src, e)

    def _hold(self, msg: Message, frame: Any, nbytes: int) -> None:
        """Consumer thread, with keys: keep a gradient whose sender this peer's view does not
        list, though the sender's does (a newer view: the coordinator tells a member that
        joins or rejoins first), until the view lists it (:meth:`_look_at_held`). The peer's
        loop holds such messages that come through it; these came on the inbox, which it
        never sees. A member that was declared dead and came back (frozen a while; the
        same process, under its id) still knows the others' inboxes, and its first
        gradients come here so. Bounded: past the bounds it is dropped at once."""
        if len(self._held_in) >= _HOLD_MAX or self._held_bytes + nbytes > _HOLD_BYTES:
            self._unhold(msg, f"the hold for such senders is full ({_HOLD_MAX} messages, "
                              f"{_HOLD_BYTES >> 20} MiB)")
            return
        self._held_in.append((time.monotonic() + self._hold_s, msg, frame, nbytes))
        self._held_bytes += nbytes
        self.stats.held_in += 1

    def _look_at_held(self, now: float) -> None:
        """Consumer thread: take in, in arrival order, the held gradients whose sender the
        view lists now (once its key is checked); drop those whose sender a view as new as
        the one they were sent from does not list (it left, or was declared dead again),
        and those that waited longer than the hold time."""
        view = self.link.view
        self._held_epoch = view.epoch
        keep: collections.deque[tuple[float, Message, Any, int]] = collections.deque()
        for h in self._held_in:
            until, msg, frame, nbytes = h
            if view.member(msg.src) is not None:
                self._held_bytes -= nbytes
                try:
                    if self._from_key(msg, self.link.key_check(msg, tp.user_id(frame))):
                        self._take_in(msg)
                except WireError as e:
                    self.stats.rejected += 1
                    self._bad(msg.src, e)
            elif view.epoch >= msg.epoch:
                self._held_bytes -= nbytes
                self._unhold(msg, f"src {msg.src!r} is not in view {view.epoch}, as new as the one it "
                                  f"sent from ({msg.epoch})")
            elif until <= now:
                self._held_bytes -= nbytes
                self._unhold(msg, f"src {msg.src!r} was not in a view within {self._hold_s:.1f} s")
            else:
                keep.append(h)
        self._held_in = keep

    def _unhold(self, msg: Message, why: str) -> None:
        self.stats.held_dropped += 1
        self._bad(msg.src, WireError(f"gradient from a sender outside the view: {why}"))

    def ready(self, timeout: float) -> bool:
        """Direct mode, consumer thread: block until this peer knows every neighbour's
        inbox, or until ``timeout`` seconds passed; returns whether it got there.

        A neighbour's hello comes from its relay's constructor, after the relay handles
        gradients, so knowing its inbox means its relay exists. Call this before the
        first publish: a gradient sent earlier goes through the loop to a peer that may
        not handle gradients yet, and is lost there (and peers that take turns then wait
        a whole ``timeout`` of :meth:`wait` for it). Takes nothing in: what arrives
        meanwhile waits on the inbox. After :meth:`close`, or once the peer closed, it
        raises :class:`~swarm.errors.GossipError` at once.
        """
        if self._closed or self._peer_gone():
            raise self._closed_error()
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
                self._to_loop(self._greet, True)

    def close(self) -> None:
        """Stop relaying: take this relay's handlers off the link, so that it receives
        nothing more and, once dropped, is freed (the link held it until then); in
        direct mode, also close its own sockets. Call it from the consumer thread (or
        the loop), before the peer closes and before building another relay on the
        same peer, which otherwise both get every gradient. Closing twice does nothing.

        Off the loop, the handlers come off at the loop's next pass. A link without
        ``off``/``off_view`` (a test double; a Peer and a SimLink have them) keeps them.
        """
        with self._sockets:   # not while a publish on another thread sends on one
            for _, s in self._outboxes.values():
                self.link.close_side(s)
            self._outboxes.clear()
            # under the lock too: a publish that waited for it must find the relay closed,
            # not open a new outbox on it (_push)
            if self._inbox_sock is not None:
                self.link.close_side(self._inbox_sock)
                self._inbox_sock = None
        self._held_in.clear()
        self._held_bytes = 0
        if self._closed:
            return
        self._closed = True
        if threading.get_ident() == self._loop_thread:
            self._take_off()
            return
        try:
            self._loop.call_soon_threadsafe(self._take_off)
        except RuntimeError:   # the loop is closed: nothing runs the handlers any more
            self._take_off()

    def _take_off(self) -> None:
        off, off_view = getattr(self.link, "off", None), getattr(self.link, "off_view", None)
        if off is not None:
            for t, h in self._handlers:
                off(t, h)
        if off_view is not None:
            for cb in self._view_callbacks:
                off_view(cb)

    @property
    def pending(self) -> int:
        return len(self._inbox)

    # ------------------------------------------------------------ out-of-step repair (with state)

    def note_digest(self, updates: int, digest: str) -> None:
        """Consumer thread: this peer's copy has ``digest`` after ``updates`` updates. It
        goes with this peer's next message; peers whose copy differs at the same count
        from their reference's ask for a copy (see the module doc). No-op without state."""
        if self._state is None:
            return
        if not (is_int(updates) and 0 <= updates <= _MAX_CLOCK and isinstance(digest, str)
                and 0 < len(digest) <= 64):
            raise ConfigError(f"note_digest({updates!r}, {digest!r}): needs an update count (an int from 0 "
                              f"to 2**63 - 1: it goes on the wire) and a digest (str of 1 to 64 characters)")
        updates = int(updates)
        self._own_digests[updates] = digest
        if len(self._own_digests) > _DIGESTS:
            del self._own_digests[min(self._own_digests)]
        self._digest_out = [updates, digest]
        self._digests_new = True

    @property
    def resyncing(self) -> bool:
        """Whether this peer asked for a copy and has not adopted or given it up yet."""
        return self._asked is not None or self._arrived is not None

    def snapshot(self) -> Snapshot | None:
        """Consumer thread: the copy this peer asked for, once it came (checked: the
        frames' kinds, and that this peer's turns fit it); None otherwise. Load its
        ``body`` and ``arrays`` and call :meth:`adopt`, or :meth:`refuse` it."""
        return self._arrived

    def adopt(self, snap: Snapshot) -> None:
        """Consumer thread, after loading ``snap``'s copy: keep only the gradients after
        its clock, add those it came with, and take turns from its clock on (from
        ``snap.next`` when that is set: the caller's turns then start there). The
        messages of the gradients it came with may still be on their way here: those
        gradients are dropped then, as duplicates (the messages are passed on)."""
        if snap is not self._arrived or self._sched is None:
            raise ConfigError("adopt: not the copy that snapshot() returned, or adopted already")
        every, _, span = self._sched
        me, clock = self.link.id, snap.clock
        with self._cond:
            keep = [x for x in self._inbox if x[0] > clock]
            have = {(c, o) for c, o, _, _ in keep}
            now = time.time()
            for c, o, g in snap._pending:
                # before a jump, this peer's own turns count as passed
                if (c, o) not in have and not (snap.next is not None and o == me):
                    keep.append((c, o, g, now))
                    have.add((c, o))
                if o != me:   # its message, still on the way here, brings it again: a duplicate then
                    brought = self._brought.setdefault(o, set())
                    brought.add(c)
                    if len(brought) > 2 * _RECENT_CLOCKS:   # keep the newest
                        self._brought[o] = set(sorted(brought)[-_RECENT_CLOCKS:])
            self._inbox.clear()
            self._inbox.extend(keep)
            for o, cs in snap._clocks.items():
                if cs:
                    self._got.setdefault(o, set()).update(cs)
                    self._clocks[o] = max(self._clocks.get(o, -1), max(cs))
            for m in self.link.view.members:   # every turn up to the copy's clock is in it
                if m.id != me:
                    last = clock - (clock - (m.rank * span + span - 1)) % every
                    self._complete[m.id] = max(self._complete.get(m.id, last), last)
            self._taken_to = clock + 1
        self._floor = snap.next - 1 if snap.next is not None else max(clock, self._boundary or -1)
        self._boundary = clock
        self._own_digests.clear()
        self._digest_out, self._checked = None, -1
        self._asked = self._arrived = self._want = None
        if snap.next is not None:
            self._announce_back(snap.next - every + span - 1)
        self.stats.resyncs += 1
        self.resynced.append({"from": snap.src, "clock": clock, "next": snap.next, "why": snap.why})
        log.info("relay %s: adopted the copy of %r at clock %d (%d gradients after it)%s", me, snap.src, clock,
                 len(keep), f"; its turns start again at clock {snap.next}" if snap.next is not None else "")

    def _announce_back(self, upto: int) -> None:
        """Tell every peer that this one's turns up to ``upto`` passed and that it takes
        them again after: a pass at ``upto`` that names this peer in ``j``. The copy's
        sender says so too, on its next message, which reaches whoever goes past this
        peer's next turn first; but a sender whose run ends before that message never
        sends it, and the others would then not wait for this peer's turn."""
        body = self._body(upto, {})
        body["p"], body["j"] = 1, [[self.link.id, upto]]
        self._send_own(body, [], [])

    def refuse(self, snap: Snapshot, why: str) -> None:
        """Consumer thread: give up ``snap`` (the caller could not load it); nothing
        changes, and this peer may ask again a second later."""
        if snap is not self._arrived:
            return
        log.warning("relay %s: refused the copy of %r: %s; nothing changed", self.link.id, snap.src, why)
        self._fail()

    # ------------------------------------------------------------ plumbing

    def _routes(self) -> list[tuple[str, int]]:
        """(neighbour, hops) for a gradient of our own, from the current view.

        On a ring the two directions split the way round (to the right ceil((n-1)/2)
        hops, to the left the rest), so every peer gets exactly one copy; on other
        graphs each neighbour gets as many hops as our farthest peer is away, and
        copies that meet are dropped as duplicates (one with more hops left than
        every earlier copy is passed on, not applied: see _again). A view that a
        member left changes the routes, and the last turn goes again (_resend).
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
            h = n - 1
            if self.topology is not None and i >= 0:
                edges = topo.within(self.edges, n) if self.topology == "custom" else None
                try:
                    h = topo.eccentricity(self.topology, n, i, edges=edges)
                except ConfigError:
                    # a view the topology cannot take (a hypercube of 3 once a peer left):
                    # the peer links no neighbours until one it can. Raised from the view
                    # callback that resends the last turn, it ended every peer left.
                    pass
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
            self.stats.vectors_out += _vectors(body)
            self.stats.bytes_out += nbytes
            self.stats.rider_bytes_out += rider
            self.stats.forwarded += int(forwarding)
        else:
            self.stats.dropped += 1

    def _on_grad(self, msg: Message) -> None:
        self._accept(msg, self._send)   # on the loop: through the peer's ROUTER

    def _forget(self, view: Any) -> None:
        """On the loop, at a new view: drop what is kept per id for the ids that left it
        (a crashed peer comes back under a new id), all but the last ``_GONE`` to leave,
        whose gradients, copies and announcements may still be on their way."""
        present = {m.id for m in view.members}
        keyed: tuple[dict[str, Any], ...] = (self._seen, self._clocks, self._got, self._brought, self._complete,
                                             self._digests_in, self._noticed, self._endpoints, self._greeted)
        with self._cond:   # the consumer iterates some of them under it
            # origins taken in that this view does not list either: forged, or gone again; they
            # do not take the places of the ids that left it
            strangers, self._strangers = self._strangers - present, set()
            for pid in strangers:
                seen = self._seen.get(pid)
                if seen is not None:
                    self._parked[pid] = seen
                    self._parked.move_to_end(pid)
                for d in keyed:
                    d.pop(pid, None)
            while len(self._parked) > _STRANGERS:
                self._parked.popitem(last=False)
            for pid in present & self._parked.keys():   # listed now: a member's numbers, as they were
                self._seen.setdefault(pid, self._parked.pop(pid))
            for pid in present:
                self._gone.pop(pid, None)
            for pid in {k for d in keyed for k in d} - present:
                self._gone.setdefault(pid)
            while len(self._gone) > _GONE:
                pid, _ = self._gone.popitem(last=False)
                for d in keyed:
                    d.pop(pid, None)

    def _resend(self, view: Any) -> None:
        """On the loop, at a view that a member left or joined: send this peer's messages of its last
        turn again, once each, and those sent so far of the turn going on (publish(hold=True);
        its last _MAX_BUNDLE), along the new routes (without their ride), marked ``r`` and
        with the epoch of the view they were published in (``e``). Copies that went through the
        member that left, and that it had not passed on yet, are lost for the peers behind
        it; those that have the message drop this one as a copy (by its number), those
        whose turn went past it drop it as late without telling its origin, and those that
        joined after it was published do not apply it (see _predates). Only the last turn:
        what went into the member between its death and this view, before that turn, stays
        lost (nothing counts it).

        The clocks sent again are noted: a peer of an older release (which knows no ``r``)
        whose turn went past one tells its origin (grad_late), as of a first copy, and the
        origin ignores that (see _on_side). Such a peer that joined after the turn applies
        it, though its parameters, taken from the others, hold it (one of this release
        passes it on without applying it): its copy is off by that turn until the digests
        (with state) or parameter averaging bring it back. Leaving newcomers out of the
        resend was tried: a newcomer may be the only way to the peers behind it."""
        present = {m.id for m in view.members}
        # A member that joined moves routes too: on a ring, a copy on its way was passed by
        # the hops left of the old ring to the newcomer, where they ran out, and the peer
        # behind it never had that gradient (nothing counted it; its wait timed out).
        left, joined = self._members - present, bool(self._members) and bool(present - self._members)
        self._members = present
        if self._since is None and self.link.id in present:
            self._since = view.epoch
        if not (left or joined) or self._closed:
            return
        with self._cond:   # publish notes its messages under it, from any thread
            msgs = self._last_turn + tuple(self._turn)
            if left:   # after a join's they stay, for a leave that follows: they may go through it
                self._last_turn = ()
                self._turn.clear()   # the turn goes on; what was sent of it goes again only once
        if not msgs:
            return
        for body, _, _ in msgs:
            for c in [body["c"], *(hc for hc, _, _ in body.get("b", ()))]:
                self._resent_clocks[c] = None
                self._resent_clocks.move_to_end(c)
        while len(self._resent_clocks) > _RECENT_CLOCKS:
            self._resent_clocks.popitem(last=False)
        routes = self._routes()
        for body, frames, epoch in msgs:
            again = {k: v for k, v in body.items() if k != "x"}
            # q: the view that made this resend, so that the first copy of each resend is
            # passed on (_first_resent): one that a join made and that died in a member
            # that had died before it took the copy of the leave's resend that followed
            again["r"], again["e"], again["q"] = 1, epoch, view.epoch
            nbytes = _nbytes(frames)
            for dst, hops in routes:
                self._send(dst, dict(again, h=hops), frames, nbytes, forwarding=False)
            self.stats.resent += 1

    def _accept(self, msg: Message, send: Any) -> None:
        """Check, decode and queue a received gradient (or note a pass), hand what rode
        on it to the rider, and pass it on with ``send``."""
        b = msg.body
        arrays, ride, ride_arrays = list(msg.arrays), b.get("x"), []
        if ride is not None:   # a rider: [its body, the count of its arrays, which come last]
            if not (isinstance(ride, list) and len(ride) == 2 and isinstance(ride[0], dict)
                    and isinstance(ride[1], int) and 0 <= ride[1] <= len(arrays)):
                self.stats.rejected += 1
                raise WireError(f"grad from {shown(msg.src)}: x must be [body (dict), count of the last arrays]")
            cut = len(arrays) - ride[1]
            arrays, ride_arrays = arrays[:cut], arrays[cut:]
        nbytes = _nbytes(arrays)
        self.stats.bytes_in += nbytes
        origin, seq, hops, meta = b.get("o"), b.get("s"), b.get("h"), b.get("meta")
        if not (isinstance(origin, str) and _int(seq, 0) and isinstance(hops, int) and isinstance(meta, dict)):
            self.stats.rejected += 1
            raise WireError(f"grad from {shown(msg.src)}: body needs o (str), s (int >= 0), h (int) and meta (dict)")
        if seq > time.time_ns() // 1000 + _SEQ_AHEAD_US:
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: s is more than a day past this "
                            f"peer's clock in microseconds, from which origins number their messages (set the "
                            f"hosts' clocks)")
        if b.get("r", 1) != 1 or not _int(b.get("e", 0), 0) or not _int(b.get("q", 0), 0):   # copies seen before too
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: r must be 1 (sent again), and e and q "
                            f"view epochs (ints >= 0) when given")
        seen = self._seen.get(origin)   # checked again under the lock, before anything is queued
        if seen is None:
            seen = self._parked.get(origin)
        if origin == self.link.id or (seen is not None and seen.has(seq)):
            self._again(msg, None if origin == self.link.id else seen, arrays, nbytes, ride_arrays, send)
            return
        t, c = b.get("t"), b.get("c")
        if not _is_clock(c):   # publish sends no other (a wait or take(before) would misplace it)
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: c must be a clock, an int from 0 to "
                            f"2**63 - 1, got {shown(c)}")
        forward = arrays   # what goes on: the gradients, without the rider
        parts: list[tuple[int, dict[str, Any] | None, list[Any]]] = []   # (clock, meta or None, frames)
        extra = b.get("b")
        if extra is not None:   # earlier updates of the same turn (publish(hold=True)), first
            if not (isinstance(extra, list) and 0 < len(extra) < _MAX_BUNDLE
                    and all(isinstance(e, list) and len(e) == 3 and _is_clock(e[0])
                            and (e[1] is None or isinstance(e[1], dict)) and isinstance(e[2], int)
                            and (e[2] == 0 if e[1] is None else e[2] > 0) for e in extra)
                    and sum(e[2] for e in extra) <= len(arrays)):
                self.stats.rejected += 1
                raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: b must list up to "
                                f"{_MAX_BUNDLE - 1} [clock, meta or None, frame count] whose frames the message holds")
            at = 0
            for ec, em, nf in extra:
                parts.append((ec, em, arrays[at:at + nf]))
                at += nf
            arrays = arrays[at:]
        if "p" in b:   # a pass: a clock, no gradient
            if b["p"] != 1 or arrays or meta:
                self.stats.rejected += 1
                raise WireError(f"pass {shown(origin)}#{seq} from {shown(msg.src)}: needs p = 1, a clock c, "
                                f"empty meta and no arrays")
            parts.append((c, None, []))
        else:
            parts.append((c, meta, arrays))
        dg, ann = b.get("d"), b.get("j")
        if dg is not None and not (isinstance(dg, list) and len(dg) == 2 and _int(dg[0], 0)
                                   and isinstance(dg[1], str) and 0 < len(dg[1]) <= 64):
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: d must be [update count, digest (str)]")
        if ann is not None and not (isinstance(ann, list) and len(ann) <= _MAX_ANNOUNCE and all(
                isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and _int(e[1], 0) for e in ann)):
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: j must list up to "
                            f"{_MAX_ANNOUNCE} [peer id, clock]")
        back = -1   # the clock of a pass by which its origin says it is back in step (not late)
        if ann:
            back = max((c for pid, c in ann if pid == origin), default=-1)
        items: list[tuple[int, np.ndarray | None]] = []   # everything is checked before anything is queued
        for pc, pm, frames in parts:
            if pm is None:
                items.append((pc, None))
                continue
            try:
                g = self._decoder.decode(Encoded(pm, frames), self.d)
            except WireError:
                self.stats.rejected += 1
                raise
            # not finite, or past MAX_GRAD: FlatAdam refuses those, and the consumer's loop
            # (swarm run's peer) ended on the first one
            if g.shape != (self.d,) or not largest_abs(g) <= MAX_GRAD:
                self.stats.rejected += 1
                raise WireError(f"grad {shown(origin)}#{seq} from {shown(msg.src)}: not {self.d} finite values "
                                f"of at most {MAX_GRAD:.3g}")
            items.append((pc, g))
        # a sender's clock: not finite (-inf), it made the lag figures infinite for good
        sent_at = float(t) if isinstance(t, (int, float)) and math.isfinite(t) else time.time()
        again, late = False, -1
        with self._cond:   # with direct, the loop and the consumer thread both take gradients in
            seen = self._seen.get(origin)
            if seen is None:
                self._admit(origin, seq, msg.src)
                seen = self._parked.pop(origin, None)   # a stranger met before the last view
                if seen is None:
                    self._seen[origin] = _Seqs(seq, hops, msg.src == origin)
                else:
                    self._seen[origin] = seen
                    again = not seen.add(seq, hops, msg.src == origin)
            elif not seen.add(seq, hops, msg.src == origin):   # another thread took a copy in meanwhile
                again = True
            if not again:
                self._first_resent(origin, seq, b)
                if self._predates(b):
                    self.stats.duplicates += 1
                    self.stats.resent_old += 1
                else:
                    late = self._queue(origin, items, back, sent_at, self._seen[origin].top == seq)
                    self._note(origin, ann, dg)
                    self._cond.notify_all()
        if again:
            self._again(msg, seen, forward, nbytes, ride_arrays, send)
            return
        if late >= 0 and "r" not in b:   # a message sent again is late for the loss, not its origin
            self._notice(origin, late)
        if ride is not None and msg.src == origin and self.rider is not None:   # only the origin's copy
            self._arrive(origin, ride, ride_arrays)
        self._pass_on(msg, forward, nbytes, send)

    def _admit(self, origin: str, seq: int, src: str) -> None:
        """Under the lock, for an origin with no entries here: WireError when the view does not
        list it and _STRANGERS such origins are kept already. Each origin costs a few KiB
        (its numbers, clocks, turns), and any member can name any origin; one that joined in
        a newer view may come before this peer's view lists it, so a few are taken."""
        if self.link.view.member(origin) is not None or origin in self._gone or origin in self._strangers:
            return
        if len(self._strangers) >= _STRANGERS:
            self.stats.rejected += 1
            raise WireError(f"grad {shown(origin)}#{seq} from {shown(src)}: origin {shown(origin)} is not in "
                            f"this peer's view, and {_STRANGERS} such origins are kept until the next view already")
        self._strangers.add(origin)

    def _queue(self, origin: str, items: list[tuple[int, np.ndarray | None]], back: int, sent_at: float,
               newest: bool) -> int:
        """Under the lock: queue a new message's gradients and note its clocks; returns the
        largest clock of those that came late (-1: none). A gradient that a copy adopted
        from another peer brought (:meth:`adopt`) is in this peer's inbox or applied
        already: it is dropped as a duplicate (its message is still passed on).

        ``newest``: the message has its origin's highest number here; its clock becomes
        the origin's. Not the largest clock ever seen: one message with a wild clock (a
        bug, or a forgery in another origin's name) left that origin at or past every
        later wait's clock, out of step and not waited for, for the rest of the run."""
        late = -1
        brought = self._brought.get(origin, ())
        for pc, g in items:
            if g is not None and pc in brought:
                self.stats.duplicates += 1
            elif (self._state is not None and pc < self._taken_to
                    and not (g is None and pc == back)):
                # this peer's turn went past it: applied now, it would take another place
                # in this peer's order than in the others'
                self.stats.late += 1
                late = max(late, pc)
            elif g is None:
                self.stats.passes_in += 1
            else:
                if len(self._inbox) >= self._max_pending:
                    self._inbox.popleft()
                    self.stats.overflow += 1
                self._inbox.append((pc, origin, g, sent_at))
                self.stats.received += 1
            got = self._got.setdefault(origin, set())
            got.add(pc)
            if len(got) > 2 * _RECENT_CLOCKS:   # keep the newest
                self._got[origin] = set(sorted(got)[-_RECENT_CLOCKS:])
        if newest:   # an older message overtaken on the way holds older clocks
            self._clocks[origin] = max(pc for pc, _ in items)
        return late

    def _note(self, origin: str, ann: list[list[Any]] | None, dg: list[Any] | None) -> None:
        """Under the lock, with state: what a new message announces (``j``) and its digest."""
        if self._state is None:
            return
        for pid, c in ann or ():   # a peer that adopted a copy: its turns up to c passed
            # (one that this peer's view does not list, and that it keeps nothing for, would
            # only grow the entries: it is waited for once a view lists it, as a newcomer)
            if pid != self.link.id and (pid in self._clocks or self.link.view.member(pid) is not None):
                # set, not raised: a wait meanwhile may have counted its next turn as
                # passed too (it was out of step), and that turn is coming
                self._clocks[pid] = max(self._clocks.get(pid, -1), c)
                self._complete[pid] = c
        if dg is not None:
            ds = self._digests_in.setdefault(origin, {})
            ds[dg[0]] = dg[1]
            if len(ds) > _DIGESTS:
                del ds[min(ds)]
            self._digests_new = True

    def _arrive(self, origin: str, ride: list[Any], ride_arrays: list[np.ndarray]) -> None:
        assert self.rider is not None
        self.stats.rider_bytes_in += _nbytes(ride_arrays)
        self.stats.riders_in += 1
        self.rider.arrive(origin, ride[0], ride_arrays)

    def _pass_on(self, msg: Message, forward: list[np.ndarray], nbytes: int, send: Any) -> None:
        """Pass a message on with one hop less, away from where it came from (without its ride)."""
        b = msg.body
        hops, origin = b["h"], b["o"]
        if hops > 1:
            fwd = dict(b, h=hops - 1)
            fwd.pop("x", None)
            for dst in self.link.neighbours():
                if dst != msg.src and dst != origin:
                    send(dst, fwd, forward, nbytes, forwarding=True)

    def _predates(self, b: dict[str, Any]) -> bool:
        """Whether ``b`` was sent again (:meth:`_resend`) of a turn published before the
        first view listing this peer: a peer that joins starts from parameters that the
        others' earlier turns went into. It is passed on, not applied; before, a peer that
        joined took the members' last turns at the first view that one of them left. One
        without ``e`` (an older peer's) is applied as before."""
        e = b.get("e")
        return "r" in b and e is not None and (self._since is None or e < self._since)

    def _first_resent(self, origin: str, seq: int, b: dict[str, Any]) -> bool:
        """Under the lock: whether ``b`` is the first copy here of a message sent again
        (:meth:`_resend`). Its earlier copies went the old routes, through the member that
        left, so a copy seen before is passed on once more, whatever its hops. The last
        _RESENT_KEPT are remembered (one forgotten only costs a copy more)."""
        key = (origin, seq, b.get("q", 0))   # q: the resend's view (0 from a peer of an earlier release)
        if "r" not in b or key in self._resent_in:
            return False
        self._resent_in[key] = None
        if len(self._resent_in) > _RESENT_KEPT:
            self._resent_in.popitem(last=False)
        return True

    def _again(self, msg: Message, seen: _Seqs | None, forward: list[np.ndarray], nbytes: int,
               ride_arrays: list[np.ndarray], send: Any) -> None:
        """A message seen before (or this peer's own, ``seen`` None): a duplicate, not applied
        again. But when this copy has more hops left than every earlier one here, it is
        passed on: on a graph of several paths the first copy may have come the long way
        with fewer, and the peers behind this one, reached only through it, would never
        get the gradient. And the origin's own copy hands what rode on it to the rider,
        which a copy that came first the long way did not carry."""
        b = msg.body
        seq, origin = b["s"], b["o"]
        self._seen_before(seen, seq)
        if seen is None:
            return
        with self._cond:
            further, first_direct = seen.again(seq, b["h"], msg.src == origin)
            # a copy sent again at a view change goes round the member that left: passed on once
            further = self._first_resent(origin, seq, b) or further
        ride = b.get("x")
        if first_direct and ride is not None and self.rider is not None:
            self._arrive(origin, ride, ride_arrays)
        if further and b["h"] > 1:
            self.stats.reforwarded += 1
            self._pass_on(msg, forward, nbytes, send)

    def _seen_before(self, seen: _Seqs | None, seq: int) -> None:
        """Count a message dropped as seen. One too old for its origin's window may have
        been a first copy, held up on the way (see _Seqs): ``stale`` shows how often."""
        self.stats.duplicates += 1
        if seen is not None and seen.too_old(seq):
            self.stats.stale += 1

    def _on_side(self, msg: Message) -> None:
        """On the loop: check a notice, request or copy and queue it for the consumer."""
        b, src = msg.body, msg.src
        if msg.t == GRAD_LATE:
            if not (_int(b.get("c"), 0) and _int(b.get("at"), 0)):
                raise WireError(f"grad_late from {shown(src)}: c and at must be clocks (int >= 0)")
            if b["c"] in self._resent_clocks and "f" not in b:
                # from a peer older than r, whose turn went past a message sent again (one that
                # came before it was sent again is about the first copy): the lateness is the
                # lost first copy's, and that peer's copy lacks this one's gradient
                self.stats.late_resent += 1
                # %r for a sender's id, here and below: one with a line break forged a log line
                log.debug("relay %s: %r says the message at clock %d came late, which was sent again "
                          "(see _resend): ignored", self.link.id, src, b["c"])
                return
        elif msg.t == GRAD_SYNC:
            if not (_int(b.get("r"), 1) and _int(b.get("b"), -1)):
                raise WireError(f"grad_sync from {shown(src)}: needs r (int >= 1) and b (int >= -1)")
        else:
            self._check_copy(msg)
            asked = self._asked
            if asked is None or self._arrived is not None or src != asked[0] or b["r"] != asked[1]:
                # an answer to a request given up, or to none: not held for the consumer (a copy
                # is a whole state)
                log.debug("relay %s: a copy from %r that answers no request of this peer now: dropped",
                          self.link.id, src)
                return
        if len(self._side) >= _SIDE_MAX:
            raise WireError(f"{msg.t} from {shown(src)}: {_SIDE_MAX} notices, requests and copies wait for this peer's "
                            f"poll() already (the consumer calls it too rarely, or {shown(src)} sends too many)")
        self._side.append(msg)
        with self._cond:
            self._cond.notify_all()

    def _check_copy(self, msg: Message) -> None:
        """A grad_state's frames: a refusal {r, no}, or {r, c, n, app, na, po, g} with the
        copy's ``na`` arrays and, when ``po`` lists pending gradients, a (len(po), d)
        float32 array of them. Raises WireError saying what is wrong."""
        b, src, arrays = msg.body, msg.src, msg.arrays
        if not _int(b.get("r"), 1):
            raise WireError(f"grad_state from {shown(src)}: r must be a request number (int >= 1)")
        if "no" in b:
            if not isinstance(b["no"], str):
                raise WireError(f"grad_state from {shown(src)}: no must say why (str)")
            return
        c, n, app, na, po, g = (b.get(k) for k in ("c", "n", "app", "na", "po", "g"))
        # clocks as publish may send them (<= 2**63 - 1): one past it taken in, the next wait
        # on the training thread raised, and every gradient after was dropped as late
        if not (c == -1 or _is_clock(c)) or not (n is None or (_is_clock(n) and n > c)):
            raise WireError(f"grad_state from {shown(src)}: c must be a clock (0 to 2**63 - 1, or -1) and n None "
                            f"or a clock after c")
        if not isinstance(app, dict) or not _int(na, 0) or na > len(arrays):
            raise WireError(f"grad_state from {shown(src)}: app must be a map and na the count of its arrays "
                            f"(at most the {len(arrays)} sent)")
        if not (isinstance(po, list) and len(po) <= _MAX_COPY_PENDING
                and all(isinstance(e, list) and len(e) == 2 and _is_clock(e[0]) and e[0] > c
                        and isinstance(e[1], str) for e in po)):
            raise WireError(f"grad_state from {shown(src)}: po must list up to {_MAX_COPY_PENDING} "
                            f"[clock after c, origin]")
        if len(arrays) != na + (1 if po else 0):
            raise WireError(f"grad_state from {shown(src)}: {len(arrays)} arrays for na = {na} and {len(po)} pending")
        if po:
            a = arrays[na]
            if a.dtype != np.float32 or a.shape != (len(po), self.d) or not largest_abs(a) <= MAX_GRAD:
                raise WireError(f"grad_state from {shown(src)}: pending gradients must be {len(po)} x {self.d} finite "
                                f"float32 of at most {MAX_GRAD:.3g}, got {a.dtype} {a.shape}")
        if not (isinstance(g, dict) and all(isinstance(k, str) and isinstance(v, list) and len(v) <= 4 * _RECENT_CLOCKS
                                            and all(_is_clock(x) for x in v) for k, v in g.items())):
            raise WireError(f"grad_state from {shown(src)}: g must map origins to lists of clocks")

    def _tend(self) -> None:
        """Consumer thread: notices, requests and copies that came; a request's deadline;
        the digests compared."""
        while self._side:
            msg = self._side.popleft()
            b = msg.body
            if msg.t == GRAD_LATE:
                # about this copy (not one replaced since), from a peer whose turns went past
                # this one's last message (one that fell behind itself takes old ones in late)
                if b["c"] > self._floor and b["at"] > (-1 if self._boundary is None else self._boundary):
                    self._wish(msg.src, f"its message at clock {b['c']} came after the turn of {shown(msg.src)} "
                                        "went past it")
            elif msg.t == GRAD_SYNC:   # an asker waits for one copy at a time: its newest request
                self._deferred = [d for d in self._deferred if d[0] != msg.src]
                self._deferred.append((msg.src, b["r"], b["b"], time.monotonic() + self._resync_timeout))
            else:
                self._took_copy(msg)
        if self._deferred:
            self._serve_due()
        if self._asked is not None and self._arrived is None:
            if self._unsent == self._asked[1]:
                log.warning("relay %s: could not ask %r for its copy (no link to it now); its turns go on "
                            "out of step", self.link.id, self._asked[0])
                self._fail()
            elif time.monotonic() > self._asked[2]:
                log.warning("relay %s: %r sent no copy within %.1f s; its turns go on out of step",
                            self.link.id, self._asked[0], self._resync_timeout)
                self._fail()
        if self._digests_new:
            self._digests_new = False
            self._compare()

    def _fail(self) -> None:
        self.stats.resync_failed += 1
        self._asked = self._arrived = None
        self._quiet_until = time.monotonic() + _QUIET_S

    def _wish(self, dst: str, why: str) -> None:
        """Ask ``dst`` for its copy at the next wait (once at a time, not right after a failure)."""
        if (self._want is None and not self.resyncing and dst != self.link.id
                and time.monotonic() >= self._quiet_until):
            self._want = (dst, why)

    def _ask(self) -> None:
        assert self._want is not None
        (dst, why), self._want = self._want, None
        rid = next(self._rids)
        # noted before it goes: the loop keeps only the copy that answers it (see _on_side)
        self._asked = (dst, rid, time.monotonic() + self._resync_timeout, why)
        self._side_send(dst, GRAD_SYNC, {"r": rid, "b": -1 if self._boundary is None else self._boundary})
        log.info("relay %s: out of step (%s); asking %r for its copy", self.link.id, why, dst)

    def _serve_due(self) -> None:
        """Answer the requests whose asker's last message this peer's copy covers: a copy
        taken at a turn boundary at or after it (a peer in step gets there within a round)."""
        now, keep = time.monotonic(), []
        for src, rid, b, until in self._deferred:
            why = None
            if self.resyncing:
                why = "it is out of step itself"
            elif self._sched is None or self._boundary is None:
                why = "it has taken no turn yet"
            elif self.link.view.member(src) is None:
                why = "the asker is not in its view"
            elif self._boundary < b:
                if now < until:
                    keep.append((src, rid, b, until))
                    continue
                why = f"its turns did not reach clock {b} within {self._resync_timeout:.1f} s"
            if why is None:
                why = self._serve(src, rid, b)
            if why is not None:
                self._side_send(src, GRAD_STATE, {"r": rid, "no": why})
        self._deferred = keep

    def _serve(self, src: str, rid: int, b: int) -> str | None:
        """Send ``src`` this peer's copy; returns why not, or None. When this peer's turns
        went past the asker's next one, its turns start again a round after the copy's
        clock, and this peer's next message tells the others (``j``): whoever goes past
        that clock has that message first, so waits for its turn there. The asker says
        so too when it adopts the copy (:meth:`_announce_back`), for the case that this
        peer's run ends before its next message."""
        assert self._sched is not None and self._boundary is not None and self._state is not None
        every, first, span = self._sched
        clock = self._boundary
        m = self.link.view.member(src)
        assert m is not None
        with self._cond:
            pending = [(c, o, g) for c, o, g, _ in self._inbox if c > clock]
            clocks = {o: sorted(k for k in got if k > clock) for o, got in self._got.items() if o != src}
        if len(pending) > _MAX_COPY_PENDING:
            return f"it holds {len(pending)} gradients past its copy, more than {_MAX_COPY_PENDING}"
        body, arrays = self._state()
        nxt = None
        # With peers that share a phase (more than `every` has room for) the asker's next
        # turn is often one this peer took at the same clock while the asker waited: the
        # asker skips it all the same, and its turns run ahead of its steps (spec.py warns)
        if _turn_start(b, m.rank, every, first, span) <= clock:
            nxt = _turn_start(clock + every, m.rank, every, first, span)
        frames = [np.ascontiguousarray(a) for a in arrays]
        if pending:
            frames.append(np.stack([g for _, _, g in pending]))
        copy = {"r": rid, "c": clock, "n": nxt, "app": body, "na": len(arrays),
                "po": [[c, o] for c, o, _ in pending], "g": clocks}
        try:   # before anything changes: a copy the wire refuses is refused with a reason instead
            wire.encode(GRAD_STATE, self.link.id, body=copy, arrays=frames, limits=self._limits)
        except WireError as e:
            return f"its copy does not go in one message: {e} (a Peer's max_message_mb sets the limit)"
        if nxt is not None:
            upto = nxt - every + span - 1   # the last clock of its last turn that passed
            with self._cond:
                self._clocks[src] = max(self._clocks.get(src, -1), upto)
                self._complete[src] = upto
            self._announce[src] = upto
        self._side_send(src, GRAD_STATE, copy, frames)
        self.stats.served += 1
        log.info("relay %s: sent %r its copy at clock %d%s", self.link.id, src, clock,
                 f"; its turns start again at clock {nxt}" if nxt is not None else "")
        return None

    def _took_copy(self, msg: Message) -> None:
        """A copy (or a refusal) that came: kept for snapshot() when it answers this
        peer's request and its clocks fit this peer's turns."""
        b, asked = msg.body, self._asked
        if asked is None or self._arrived is not None or msg.src != asked[0] or b["r"] != asked[1]:
            return   # an answer to a request given up
        if "no" in b:
            log.info("relay %s: %r sent no copy: %.300r", self.link.id, msg.src, b["no"])
            self._fail()
            return
        me = self.link.view.member(self.link.id)
        if me is None or self._sched is None:
            log.warning("relay %s: a copy from %r, but this peer is not in its view", self.link.id, msg.src)
            self._fail()
            return
        every, first, span = self._sched
        n = _turn_start(-1 if self._boundary is None else self._boundary, me.rank, every, first, span)
        c, nxt = b["c"], b["n"]
        if (n <= c) if nxt is None else (n > nxt):
            log.warning("relay %s: the copy of %r at clock %d does not fit this peer's next turn at clock %d; "
                        "refused", self.link.id, msg.src, c, n)
            self._fail()
            return
        na, arrays = b["na"], list(msg.arrays)
        pending = [(pc, o, arrays[na][i]) for i, (pc, o) in enumerate(b["po"])]
        self._arrived = Snapshot(msg.src, c, nxt, asked[3], b["app"], arrays[:na], _pending=pending, _clocks=b["g"])

    def _reference(self) -> str | None:
        """The lowest-ranked member that this peer's last wait kept step with (maybe itself)."""
        members = [m for m in self.link.view.members if m.id not in self._astray]
        return min(members, key=lambda m: m.rank).id if members else None

    def _compare(self) -> None:
        """Compare this peer's digests with its reference's at the update counts both hold."""
        ref = self._reference()
        if ref is None or ref == self.link.id:
            return
        with self._cond:   # written where messages are taken in
            theirs = dict(self._digests_in.get(ref, {}))
        for u in sorted(u for u in theirs if u > self._checked and u in self._own_digests):
            self._checked = u
            if theirs[u] != self._own_digests[u]:
                self._wish(ref, f"its copy after {u} updates differs from {ref}'s")
                return

    def _notice(self, origin: str, clock: int) -> None:
        """Tell ``origin`` that its message at ``clock`` came late (at most once a second)."""
        now = time.monotonic()
        if now - self._noticed.get(origin, -math.inf) >= _QUIET_S:
            self._noticed[origin] = now
            # f: about a first copy (this release sends none about one sent again; an older one,
            # which knows no r, does: see _on_side)
            self._side_send(origin, GRAD_LATE, {"c": clock, "at": self._taken_to, "f": 1})

    def _side_send(self, dst: str, t: str, body: dict[str, Any], arrays: list[np.ndarray] | None = None) -> None:
        """Send a notice, request or copy through the peer's loop, from any thread."""
        if threading.get_ident() == self._loop_thread:
            self._side_now(dst, t, body, arrays or [])
        else:
            self._to_loop(self._side_now, dst, t, body, arrays or [])

    def _side_now(self, dst: str, t: str, body: dict[str, Any], arrays: list[np.ndarray]) -> None:
        try:
            sent = self.link.send_nowait(dst, t, body, arrays)
        except WireError as e:   # what the wire refuses after all (_serve checks a copy before it goes)
            log.warning("relay %s: cannot send %s to %r: %s", self.link.id, t, dst, e)
            sent = False
        if sent:
            return
        # no link to it now (one frozen a moment ago comes back with a new one)
        log.info("relay %s: %s to %r was not sent (unknown or full link)", self.link.id, t, dst)
        if t == GRAD_LATE:
            self._noticed.pop(dst, None)   # tell it at its next late message, not a second later
        elif t == GRAD_SYNC:
            self._unsent = body["r"]       # the asker gives up now, not at its deadline
            with self._cond:
                self._cond.notify_all()

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
            raise WireError(f"grad_hello from {shown(msg.src)}: ep must be tcp://HOST:PORT with a port in 1..65535")
        self._endpoints[msg.src] = ep
        if not msg.body.get("r") and self._endpoint:
            self.link.send_nowait(msg.src, GRAD_HELLO, {"ep": self._endpoint, "r": True})

    def _outbox(self, dst: str) -> Any:
        """Under ``_sockets``: the PUSH socket to ``dst``'s inbox, None while it is unknown."""
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
        with self._sockets:
            for dst in [d for d in self._outboxes if d not in keep]:
                self.link.close_side(self._outboxes.pop(dst)[1])

    def _push(self, dst: str, body: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
              forwarding: bool, rider: int = 0) -> bool:
        """Send on our own socket to ``dst``; False if it has none yet. From publish (any
        thread) and poll's forwarding (the consumer): they take turns on the sockets."""
        if self._inbox_sock is None:
            return False
        with self._sockets:
            if self._inbox_sock is None:   # closed while this waited for the lock
                return False
            return self._push_now(dst, body, arrays, nbytes, forwarding, rider)

    def _push_now(self, dst: str, body: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
                  forwarding: bool, rider: int) -> bool:
        s = self._outbox(dst)
        if s is None:
            return False
        frames = wire.encode(GRAD, self.link.id, epoch=self.link.view.epoch, seq=next(self._wire_seq),
                             body=body, arrays=arrays, limits=self._limits)
        if tp.try_send(s, frames):
            self.stats.sent += 1
            self.stats.vectors_out += _vectors(body)
            self.stats.direct_out += 1
            # every frame but the header is one of the arrays, whose bytes are nbytes + rider
            self.stats.direct_bytes_out += len(frames[0]) + nbytes + rider
            self.stats.bytes_out += nbytes
            self.stats.rider_bytes_out += rider
            self.stats.forwarded += int(forwarding)
        else:
            self.stats.dropped += 1
        return True

    def _push_or_hand(self, dst: str, body: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
                      forwarding: bool) -> None:
        if not self._push(dst, body, arrays, nbytes, forwarding):
            self._to_loop(self._send, dst, body, arrays, nbytes, forwarding)


class _Seqs:
    """The numbers of one origin's messages that came: its highest, and which of the
    ``_SEQ_WINDOW`` numbers below it (a byte per number, in a ring). An origin numbers
    its messages one after another (from the time, so a restarted process jumps
    ahead); a copy that comes round another way, possibly after later ones, is
    recognised while it is within the window, and one older than that counts as seen:
    it is dropped, never applied twice.

    Such a message need not be a copy, though: a first copy can be that late when the
    only way it had to this peer stalled while the origin's later messages came another
    way, e.g. on a forwarder frozen until after it was declared dead (the routes then go
    round it) that passes on what it held once it wakes; or on a graph of several
    paths, when the fast one dropped it on a full queue. Its gradient is then lost
    here: ``RelayStats.stale`` counts them (a gradient that late would be out of place
    if applied anyway, and with state it is dropped as late).

    A number's byte also holds the most hops left of its copies here (up to
    ``_HOPS_KEPT``: one with more counts as that many; a copy with that many reaches every
    peer of a graph no wider) and whether one came from the origin itself (``_DIRECT``):
    a later copy with more hops left than any before is passed on again (:meth:`again`),
    and the origin's own copy hands its rider's ride over even when a copy came first."""

    __slots__ = ("top", "flags")

    def __init__(self, seq: int, hops: int = 0, direct: bool = False) -> None:
        self.top, self.flags = seq, bytearray(_SEQ_WINDOW)
        self.flags[seq % _SEQ_WINDOW] = _mark(hops, direct)

    def has(self, seq: int) -> bool:
        if seq > self.top:
            return False
        return self.too_old(seq) or self.flags[seq % _SEQ_WINDOW] != 0

    def too_old(self, seq: int) -> bool:
        """Whether ``seq`` is below the window, where copies cannot be told from first copies."""
        return seq <= self.top - _SEQ_WINDOW

    def add(self, seq: int, hops: int = 0, direct: bool = False) -> bool:
        """Note ``seq`` (its copy has ``hops`` left; ``direct``: it came from the origin);
        False if it was seen already."""
        w, flags, top = _SEQ_WINDOW, self.flags, self.top
        if seq > top:
            # clear the flags of the numbers the window moves over (before top moves:
            # a reader on another thread may look without the lock)
            if seq - top > w:
                flags[:] = bytes(w)
            elif seq - top > 1:
                lo, hi = (top + 1) % w, seq % w
                if lo <= hi:
                    flags[lo:hi] = bytes(hi - lo)
                else:
                    flags[lo:] = bytes(w - lo)
                    flags[:hi] = bytes(hi)
            self.top = seq
        elif seq <= top - w or flags[seq % w]:
            return False
        flags[seq % w] = _mark(hops, direct)
        return True

    def again(self, seq: int, hops: int, direct: bool) -> tuple[bool, bool]:
        """Note another copy of ``seq``, seen already: (whether it has more hops left than
        any copy before, whether it is the first that came from the origin). Both False
        for a number below the window (nothing is known of it any more)."""
        if seq > self.top or self.too_old(seq):
            return False, False
        i = seq % _SEQ_WINDOW
        old = self.flags[i]
        if not old:
            return False, False
        new = _mark(hops, direct)
        further, first_direct = new & _HOPS > old & _HOPS, direct and not old & _DIRECT
        self.flags[i] = max(new & _HOPS, old & _HOPS) | ((old | new) & _DIRECT)
        return further, first_direct


#: A number's byte in _Seqs: 0 while not seen; else in its low bits (_HOPS) the most hops
#: left of its copies plus one (hops up to _HOPS_KEPT), and _DIRECT once a copy came from
#: the origin itself.
_DIRECT, _HOPS, _HOPS_KEPT = 0x80, 0x7F, 126


def _mark(hops: int, direct: bool) -> int:
    return (_DIRECT if direct else 0) | (min(max(hops, 0), _HOPS_KEPT) + 1)


def _int(x: Any, lo: int) -> bool:
    """Whether ``x`` is an int (not a bool) >= ``lo``."""
    return type(x) is int and x >= lo


def _is_clock(x: Any) -> bool:
    """Whether ``x`` is a clock that publish may have sent: an int from 0 to 2**63 - 1."""
    return type(x) is int and 0 <= x <= _MAX_CLOCK


def _turn_start(after: int, rank: int, every: int, first: int, span: int) -> int:
    """The first clock after ``after`` at which the member of ``rank`` starts a turn: turns
    start at the clocks >= ``first`` equal to rank · span modulo ``every``."""
    phase = rank * span % every
    start = after + 1 + (phase - after - 1) % every
    return start if start >= first else first + (phase - first) % every


def _nbytes(arrays: list[np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in arrays)


def _clock(clock: Any, name: str = "clock") -> int:
    """``clock`` as an int, or ConfigError: clocks count steps, from 0, and go on the wire."""
    if not is_int(clock) or not 0 <= clock <= _MAX_CLOCK:
        raise ConfigError(f"{name} = {clock!r}: must be an int from 0 to 2**63 - 1 (env steps, say)")
    return int(clock)
