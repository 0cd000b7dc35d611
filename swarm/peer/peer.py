"""The peer: one ROUTER in, one DEALER per neighbour out, a membership client.

State machine::

    new ──start()──▶ joining ──welcome+view──▶ running ──close()──▶ leaving ──▶ closed
                        │                                                        ▲
                        └────────── no coordinator before the deadline ─────────┘ (MembershipError)

Inbound traffic from every neighbour arrives on the ROUTER; replies travel on
the replier's own DEALER to the sender, so DEALERs only ever send and the
receive loop polls two sockets (plus link monitors) whatever the degree.
Handlers registered with :meth:`Peer.on` receive decoded messages (until
:meth:`Peer.off`); gossip and the replay federation plug in that way without
touching this file, and take theirs off in their ``close()``.

The peer never owns the event loop; run it inside yours, or use
:class:`swarm.peer.SyncPeer` from blocking code. It belongs to the loop that ran
:meth:`Peer.start`, as its sockets do: its coroutines awaited on another loop raise
:class:`SwarmError` (hand them over with ``asyncio.run_coroutine_threadsafe``).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import errno
import inspect
import itertools
import logging
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .. import transport as tp
from .. import wire
from ..checks import seconds
from ..config import PeerConfig, from_dict, to_dict
from ..errors import ConfigError, MembershipError, PeerTimeout, SwarmError, TransportError, WireError
from ..link import Handler, View
from ..tasks import supervise
from ..transport import _EVENTS, _POLLIN   # ints: pyzmq's enums cost an operation per use
from ..wire import Limits, Message

log = logging.getLogger("swarm.peer")

__all__ = ["Peer", "PeerState", "PeerCounters"]

#: seconds between heartbeats that carry the peer's figures (``stats``); the
#: coordinator keeps the last ones, and its rates span seconds anyway
HEARTBEAT_STATS_S = 1.0

#: a link to a member that is not a neighbour (any more) is closed once nothing was
#: sent on it, nor waits to be, for this long, or for twice the links' ZMTP heartbeat
#: interval plus timeout if that is longer: by then what was queued on it has
#: normally left, or the link has broken (and dropped it) anyway
SPARE_LINK_IDLE_S = 5.0

#: types the peer answers itself (hello, ping; join and status, which only a coordinator
#: takes, with a refusal) or that only come from the coordinator: a handler registered
#: for one would never be called
RESERVED_TYPES: frozenset[str] = wire.PROTOCOL_TYPES - {"pong"}

#: types :meth:`Peer.send` refuses: the membership types, which no peer reads, and
#: the link check (``hello``/``hello_ack``, which the peer sends itself; a forged ack
#: would mark a link checked). ``ping`` may be sent: the receiver answers ``pong``.
UNSENDABLE_TYPES: frozenset[str] = RESERVED_TYPES - {"ping"}

#: bytes of messages held for members that our view does not list yet (see
#: :meth:`Peer.send`), all destinations together; a send past it is dropped at once
HELD_MAX_BYTES = 64 * 1024 * 1024

#: senders outside our view that spoke from a newer view, remembered for
#: :meth:`Peer.send` (forgotten once our view catches up); bounded under a flood of ids
AHEAD_MAX = 1024

#: With keys, a message whose sender is not in our view but that came from a newer
#: view (a member that just joined: the coordinator told it first) is held until a
#: view lists the sender and its key can be checked: for at least this many seconds
#: (or two heartbeats, after which a peer that missed a view has it again). The
#: coordinator's views normally reach all members within milliseconds.
HELD_IN_S = 2.0

#: such messages held at once, all senders together (and HELD_MAX_BYTES of them); a
#: holder of a listed key who claims new epochs under made-up ids fills this and no
#: more, and each of them costs O(1) on arrival
HELD_IN_MAX = 1024

#: After a coordinator refused this peer's key, or found ``--keys`` on one side only,
#: libzmq never dials that address again: the peer does, this many seconds after the
#: refusal, twice as long after each further one, up to REDIAL_MAX_S. A coordinator
#: fixed later (its ``authorized/``, its ``--keys``, a restart) takes the peer back.
REDIAL_MIN_S = 0.5
REDIAL_MAX_S = 10.0
#: seconds to read the greeting of a coordinator that closes our handshakes (its mechanism
#: tells whether it runs with keys, see tp.zmtp_mechanism)
GREETING_S = 2.0

#: seconds a coordinator's host has to answer a connection (SYN to SYN-ACK): the
#: coordinator's CONNECT_TIMEOUT_S for its dials to the others (a third of libzmq's 30 s
#: handshake timeout, which these sockets keep too), not imported: that module brings
#: the coordinator's HTTP server with it. Without it a dial to a host that vanished
#: without a TCP reset (powered off, a cable pulled, a firewall that drops) was left to
#: the OS, which sends the SYN again ever further apart and gives up after about 127 s:
#: a coordinator back on that host (restarted there, the cable plugged back) had the
#: peer only at the next SYN, up to a minute later. The cost: a coordinator whose
#: network takes longer than this to answer a connection is never reached.
COORD_CONNECT_TIMEOUT_S = 10.0

#: seconds a neighbour's host has to answer a data link's (or the relay's outbox's,
#: :meth:`Peer.open_outbox`) connection (SYN to SYN-ACK):
#: the same wait, for the same reason, as COORD_CONNECT_TIMEOUT_S. A neighbour that the
#: coordinator keeps in the view while its address drops our SYNs (a firewall or a route
#: between the two hosts only; a restart there that reached us in one view, none without
#: it in between) keeps its link, whose redial was left to the OS: back after 20 s, it had
#: our sends again 16 s later (the kernel's next SYN; up to a minute), and they returned
#: False until then; now within seconds (1 s measured). Within each attempt the kernel sends
#: the SYN again (1 s in, then every 1 to 4 s), and libzmq dials again after at most 1 s
#: (``RECONNECT_IVL_MAX``), so a lost SYN costs what it did. Not link_timeout_s: that
#: bounds silence on a connection that was made (300 ms by default), below the kernel's
#: first SYN retry.
#: A link that has had no handshake for this long (since it was made, or since its
#: connection dropped) is one whose neighbour cannot be reached: its host had the time a
#: host has to answer a connection, and did not. That is logged once at WARNING (and its
#: return once), counted (``unreachable``, in heartbeats and ``swarm status``), and sends on
#: it fail at once instead of waiting out their timeout on its full queue. Before, a
#: neighbour whose inbound path was cut while the coordinator still reached it (its probe
#: goes over the neighbour's own connection) went unnoticed, and each gossip round waited
#: ``send_timeout`` on it (a lockstep ring fell from ~9 to ~1.3 rounds a second).
LINK_CONNECT_TIMEOUT_S = COORD_CONNECT_TIMEOUT_S

#: seconds of silence after which the relay's outbox (:meth:`Peer.open_outbox`) drops a
#: connection (ZMTP heartbeat timeout, at least ``link_timeout_s``). Not the data links'
#: 300 ms: a receiver whose inbox queue is full reads nothing, so its libzmq answers no
#: ping, and a cut connection loses the gradients the PUSH had written into it (a 3 s
#: stall of a receiver of 4 kB gradients lost ~200 at 300 ms, none at 10 s; a 1 MB
#: gradient on a 10 Mbit/s link takes longer than 300 ms to drain). 10 s still finds a
#: host that vanished (TCP would take ~15 min).
OUTBOX_TIMEOUT_S = 10.0

#: seconds between two tracebacks logged for the same failure: the same handler or
#: callback raising the same type of error. The first is logged in full; those that come
#: within this time are counted (``handler_errors``) and not logged, and the next
#: traceback logged says how many there were. A sender that trips a buggy handler with
#: every message does not fill the log with a traceback per message.
FAILURE_LOG_S = 10.0

#: what a coordinator socket's monitor reports: a connection accepted, a lost one, and how
#: handshakes end
_COORD_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                 | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                 | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _coord_handshake_error(event: int, value: int, keyed: bool) -> tuple[str, bool]:
    """Why a handshake with a coordinator failed ("" when the event says nothing
    certain), and whether libzmq gave up on the address (it never dials it again)."""
    if not tp.handshake_refused(event, value):
        # a handshake that timed out (a frozen coordinator), or one a dying process cut short
        return "", False
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"it refused this peer's key (ZAP status {value}): this host's NAME.key is not in the "
                "coordinator's authorized/"), True
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return _mechanism_mismatch(keyed), True
        return f"CURVE protocol error {value:#x}: other keys", True
    # it closed the connection in the handshake: it could not open our hello, sealed for
    # another coordinator key, or it found the other mechanism before we did
    if keyed:
        return ("it closes the connection in the CURVE handshake: most likely it runs with another "
                "coordinator key pair than this peer's coordinator.key, or without --keys"), False
    return "it closes the connection in the handshake: most likely it runs with --keys", False


def _mechanism_mismatch(keyed: bool) -> str:
    """What a coordinator or neighbour with the other security mechanism than this peer's is."""
    return ("it runs without --keys and this peer with them" if keyed
            else "it runs with --keys and this peer without them")


@dataclass
class _Dial:
    """How the attempts to reach one address go: a coordinator's, a data link's or an
    outbox's. A handshake refused for good (libzmq never dials that address again) sets
    a redial after a backoff, REDIAL_MIN_S doubling up to REDIAL_MAX_S; each caller logs
    a failure once, until a handshake succeeds, in its own words."""

    failure: str = ""           # the handshake failure last logged; "" since one succeeded
    closes: int = 0             # handshakes it closed in a row (one may be a dying process)
    redial_at: float = 0.0      # when the peer dials again; 0: libzmq dials by itself
    backoff: float = REDIAL_MIN_S
    # since the start: handshakes that succeeded, and how often a connection made so then
    # dropped (the join's error tells a link too slow for the heartbeat timeout by them)
    handshakes: int = 0
    drops: int = 0
    # since the start, whether a connection was accepted (TCP), and whether a handshake was
    # refused (transport.handshake_refused): accepted, with no handshake that ended nor
    # was refused, what listens there never answers one (a frozen process, or not ZeroMQ)
    tcp_accepted: bool = False
    ever_refused: bool = False
    up: bool = False            # a handshake succeeded and its connection has not dropped since

    def refused(self, why: str, now: float) -> bool:
        """A handshake failed for ``why`` and libzmq gave the address up: dial it again
        after the backoff, which doubles. Whether ``why`` is new: the caller logs it then."""
        self.redial_at = now + self.backoff
        self.backoff = min(2 * self.backoff, REDIAL_MAX_S)
        if why == self.failure:
            return False
        self.failure = why
        return True

    def succeeded(self) -> "_Dial":
        """The dial after a handshake succeeded: no failure, no redial, the backoff from
        the start, and what happened since the start kept (one more handshake). A new
        object: a coordinator's greeting probe tells by it that a handshake succeeded
        meanwhile. The caller logs "succeeds again" where ``failure`` was set."""
        return _Dial(handshakes=self.handshakes + 1, drops=self.drops, tcp_accepted=self.tcp_accepted,
                     ever_refused=self.ever_refused, up=True)


#: what a data link's monitor reports: a lost connection (a suspicion), and how its
#: handshakes end: a neighbour that refused our key is one libzmq never dials again (its
#: ``authorized/`` may list the key later), so the peer does, as for a coordinator
#: (REDIAL_MIN_S, doubling, up to REDIAL_MAX_S); and how its connection attempts go (one
#: begun, accepted, or ended without a connection), which says why a neighbour cannot be
#: reached (see LINK_CONNECT_TIMEOUT_S)
_LINK_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED
                | zmq.EVENT_CLOSED)
#: the same for the relay's outbox (:meth:`Peer.open_outbox`), less the lost connections
_OUTBOX_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
#: seconds between two looks of an outbox at how its handshakes ended (at its owner's sends)
OUTBOX_LOOK_S = 0.1


def _link_refusal(event: int, value: int, keyed: bool) -> str:
    """Why a neighbour refused the handshake of a link or an outbox, after which libzmq
    never dials it again; "" for an event that is no such refusal."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"it refused this peer's key (ZAP status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return _mechanism_mismatch(keyed)
        if keyed:
            return f"CURVE protocol error {value:#x}: it holds another key pair than the view gives it"
        return f"ZMTP protocol error {value:#x}"
    return ""


def _refusal_text(curve: tp.Curve | None, pid: str, why: str) -> str:
    """``why``, and for a refused key what to copy where."""
    if curve is None or not why.startswith("it refused this peer's key"):
        return why
    key = curve.public_file if curve.public_file.is_file() else curve.public_file.parent / "authorized" / \
        curve.public_file.name   # a host's folder holds its secret and authorized/, maybe not NAME.key
    return (f"{why}: {pid}'s key folder (its --keys) must list this peer's public key in its "
            f"authorized/: copy {key} there")


_SEND = zmq.Socket.send
_SNDMORE = int(zmq.SNDMORE)


class _OutboxWatch:
    """How the handshakes of one outbox end (see :class:`_Outbox`); a plain object, as
    setting an attribute of a zmq socket costs a search of its class's options."""

    __slots__ = ("peer_id", "pid", "endpoint", "curve", "events", "dial", "look_at", "more")

    def __init__(self, peer_id: str, pid: str, endpoint: str, curve: tp.Curve | None,
                 events: zmq.Socket) -> None:
        self.peer_id, self.pid, self.endpoint, self.curve = peer_id, pid, endpoint, curve
        self.events = events         # the monitor's PAIR socket
        self.dial = _Dial()
        self.look_at = 0.0
        self.more = 0                # the last frame sent has more to come: not between messages

    def look(self, s: zmq.Socket, now: float) -> None:
        """Take the monitor's events: log a refusal once, and dial again when due."""
        self.look_at = now + OUTBOX_LOOK_S
        d = self.dial
        while True:
            try:
                frames = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:   # Again: none left
                break
            ev = parse_monitor_message(frames)
            if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if d.failure:
                    log.warning("peer %s: the handshake with %s's inbox at %s succeeds again",
                                self.peer_id, self.pid, self.endpoint)
                d = self.dial = d.succeeded()
                continue
            why = _link_refusal(ev["event"], ev["value"], keyed=self.curve is not None)
            if why and d.refused(why, now):
                log.error("peer %s: the handshake with %s's inbox at %s (the direct gradient relay) fails: "
                          "%s. Dialling it again, every %g s at most, until it succeeds", self.peer_id,
                          self.pid, self.endpoint, _refusal_text(self.curve, self.pid, why), REDIAL_MAX_S)
        if d.redial_at and now >= d.redial_at:
            d.redial_at = 0.0
            try:
                s.disconnect(self.endpoint)
            except zmq.ZMQError:
                pass    # libzmq may have dropped the endpoint already
            try:
                s.connect(self.endpoint)
            except zmq.ZMQError as e:    # it connected before: not expected
                log.warning("peer %s: cannot dial %s's inbox at %s again: %s", self.peer_id, self.pid,
                            self.endpoint, e.strerror)


class _Outbox(zmq.Socket):
    """The PUSH socket :meth:`Peer.open_outbox` hands out: a plain socket that also
    follows how its handshakes end. An inbox that refused our key (its host's
    ``authorized/`` lacks it) is one libzmq never dials again; at its owner's sends
    (between messages, at most every OUTBOX_LOOK_S) this socket logs the refusal once
    and dials again with the links' backoff, so a key copied in later takes effect.
    Only its owner's thread touches it and its monitor (it closes both)."""

    _watch: _OutboxWatch | None = None

    def follow(self, peer_id: str, pid: str, endpoint: str, curve: tp.Curve | None) -> None:
        self._watch = _OutboxWatch(peer_id, pid, endpoint, curve, self.get_monitor_socket(_OUTBOX_EVENTS))

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kw: Any) -> Any:
        w = self._watch
        if w is None:
            return _SEND(self, data, flags, copy, track, **kw)
        if not w.more:
            now = time.monotonic()
            if now >= w.look_at:
                w.look(self, now)
        out = _SEND(self, data, flags, copy, track, **kw)
        w.more = flags & _SNDMORE
        return out

    def close(self, linger: int | None = None) -> None:
        w, self._watch = self._watch, None
        if w is not None:
            if not self.closed:
                try:
                    self.disable_monitor()
                except zmq.ZMQError:
                    pass
            w.events.close(0)
        super().close(linger)


class PeerState(enum.Enum):
    NEW = "new"
    JOINING = "joining"
    RUNNING = "running"
    LEAVING = "leaving"
    CLOSED = "closed"


@dataclass
class PeerCounters:
    """What the peer's transport did; reported on heartbeats and in `swarm status`."""

    msgs_in: int = 0
    msgs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped_out: int = 0        # sends dropped: queue full past the deadline
    unknown_dst: int = 0        # sends to a peer that is not in the view (or cannot be linked)
    held: int = 0               # sends held until the view lists dst (it spoke from a newer view)
    held_in: int = 0            # with keys, inbound messages held until the view lists their sender
    malformed: int = 0          # inbound messages that failed a wire check
    unlisted: int = 0           # with keys, inbound messages dropped: their src is not in the view
    handler_errors: int = 0     # handlers that raised
    unhandled: int = 0          # valid messages of a type nobody handles
    suspicions: int = 0         # link breaks reported to the coordinator
    rejoins: int = 0
    unreachable: int = 0        # now: members (neighbours) its links cannot reach (see LINK_CONNECT_TIMEOUT_S)


@dataclass
class _Link:
    sock: zmq.asyncio.Socket
    plain: zmq.Socket
    monitor: zmq.asyncio.Socket | None
    addr: str
    hello_sent: float = 0.0
    used: float = 0.0     # when a message was last sent on it (monotonic)
    waiting: int = 0      # sends waiting for room in its queue
    dial: _Dial = field(default_factory=_Dial)   # how its handshakes go (a refused one is dialled again)
    # since when it has had no handshake (made, or its connection dropped, since the last); 0: up
    down_since: float = 0.0
    dialled: float = 0.0      # when its latest connection attempt began
    why: str = ""             # how its latest attempt went, for the log: refused, not answered ...
    unreachable: bool = False   # down for longer than LINK_CONNECT_TIMEOUT_S: logged, sends fail at once


@dataclass
class _Held:
    """Messages for a sender that our view does not list yet, kept until it does."""
    epoch: int   # the view it spoke from: once ours is that new, it is listed or gone
    msgs: list[tuple[float, list[Any], int]] = field(default_factory=list)   # (deadline, frames, bytes)


@dataclass
class _HeldIn:
    """With keys, a message from a sender that our view does not list yet."""
    deadline: float
    msg: Message
    key: str     # the CURVE key it came with, checked once a view lists msg.src


def _cancelled_by_callback() -> bool:
    """Whether a CancelledError being handled came from user code (a handler, a view or
    stats callback that awaited a cancelled future, or raised it), not from a
    cancellation of the running task: that one must go on up, the other is the
    callback's error. A receive loop that let it through ended, and the peer went on
    without reading another message."""
    task = asyncio.current_task()
    return task is not None and not task.cancelling()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as seen (no "exception was never retrieved" at gc)."""
    if not task.cancelled():
        task.exception()


def _outgoing(e: WireError) -> WireError:
    """Mark ``e`` as this process's own refusal of what it was about to send or
    register (see :func:`_is_outgoing`); returns it."""
    e._swarm_outgoing = True   # type: ignore[attr-defined]
    return e


def _is_outgoing(e: WireError) -> bool:
    """Whether a WireError came from the peer's own outgoing calls (a send the wire
    refuses, a handler for a reserved type) rather than from a check of what a sender
    sent. Raised out of a handler, only the latter is the sender's fault: swarm's own
    handlers refuse bad remote content with a plain WireError, and that stays malformed."""
    return getattr(e, "_swarm_outgoing", False) is True


def check_handler_type(t: str, who: str) -> None:
    """Refuse a handler for one of swarm's own protocol types (WireError); register ``t``."""
    if type(t) is str and t in RESERVED_TYPES:
        raise _outgoing(WireError(f"{who}: {t!r} is a swarm protocol type that the peer handles "
                                  f"itself; no handler can be registered for {sorted(RESERVED_TYPES)} "
                                  f"(on_view is called for each new view)"))
    try:
        wire.register_type(t)
    except WireError as e:
        raise _outgoing(e)


def check_plain(fn: Any, what: str, hint: str = "") -> None:
    """Refuse (ConfigError) an async function where the peer calls a plain one and does
    not await what it returns: its coroutine would never run (and a wait_view predicate's
    coroutine, being truthy, ended the wait at once)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        raise ConfigError(f"{what}: {fn!r:.80} is an async function, and nothing would await it; "
                          f"pass a plain function{hint}")


def _check_id(pid: Any, peer_id: str, call: str) -> None:
    """Refuse (ConfigError) a destination that is no peer id (``call``: "send(dst", say):
    one that is not hashable raised a raw TypeError from the lookups."""
    if not isinstance(pid, str):
        raise ConfigError(f"peer {peer_id}: {call}={pid!r:.80}): must be a peer id (a str), as in view.ids")


def _check_sendable(t: Any, peer_id: str) -> None:
    """Refuse a send of one of swarm's own types that only the peer or the coordinator
    sends (WireError); the peer's own hello, hello_ack and pong do not come this way."""
    if type(t) is str and t in UNSENDABLE_TYPES:
        raise _outgoing(WireError(f"peer {peer_id}: {t!r} is a swarm protocol type that only the peer or "
                                  f"the coordinator sends; user code cannot send {sorted(UNSENDABLE_TYPES)} "
                                  f"('ping' may be sent: the receiver answers 'pong')"))


#: numbers the Peers of this process that take the default id
_default_ids = itertools.count(1)


def _count_default_ids_again() -> None:
    """In a child made by fork, whose pid is its own: its first Peer is HOST-PID."""
    global _default_ids
    _default_ids = itertools.count(1)


os.register_at_fork(after_in_child=_count_default_ids_again)


def _default_id() -> str:
    """HOST-PID for the first Peer of this process made without an id, HOST-PID-2,
    -3, ... for later ones: two agents of one simulator, or a notebook cell run again,
    were refused the join as one peer id alive twice."""
    n = next(_default_ids)
    return f"{socket.gethostname()}-{os.getpid()}" + (f"-{n}" if n > 1 else "")


def _own_context() -> zmq.asyncio.Context:
    """A peer's own context. libzmq allows 1,023 sockets per context unless told more, and
    a link takes three (its DEALER and its monitor's two ends): a full topology ran out
    at ~340 members. Here as many as the process may open files, up to libzmq's limit."""
    ctx = zmq.asyncio.Context(io_threads=1)
    soft = tp.fd_limit()
    try:
        want = min(ctx.get(zmq.SOCKET_LIMIT), 65536 if soft is None else soft)
        if want > ctx.get(zmq.MAX_SOCKETS):
            ctx.set(zmq.MAX_SOCKETS, want)
    except zmq.ZMQError:
        pass   # the default stands
    return ctx


class Peer:
    """A swarm peer: joins through a coordinator, links to its neighbours.

    >>> async with Peer(coordinators=["tcp://127.0.0.1:5555"]) as peer:
    ...     peer.on("hi", lambda msg: print(msg.src, msg.body))
    ...     for n in peer.neighbours():
    ...         await peer.send(n, "hi", {"x": 1})

    Keyword arguments override fields of :class:`swarm.config.PeerConfig`.
    """

    def __init__(self, config: PeerConfig | None = None, *, context: zmq.asyncio.Context | None = None,
                 limits: Limits | None = None, **overrides: Any) -> None:
        if config is not None and not isinstance(config, PeerConfig):
            raise ConfigError(f"Peer(config={config!r:.80}): the first argument must be a PeerConfig "
                              f"(swarm.load_config, or PeerConfig(...)); give options as keywords, "
                              f"e.g. Peer(coordinators=['tcp://HOST:PORT']) or Peer(**options)")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError(f"Peer(limits={limits!r:.80}): must be a swarm.wire.Limits, or None "
                              f"(max_message_mb sets the limit)")
        if context is not None and not isinstance(context, zmq.asyncio.Context):
            raise ConfigError(f"Peer(context={context!r:.80}): must be a zmq.asyncio.Context, or None "
                              f"(the peer makes its own)")
        cfg = config or PeerConfig()
        if isinstance(overrides.get("coordinators"), str):
            overrides["coordinators"] = [overrides["coordinators"]]
        try:
            cfg = replace(cfg, **overrides)
        except TypeError as e:
            raise SwarmError(f"unknown Peer option: {e}") from None
        cfg = from_dict(PeerConfig, to_dict(cfg), prefix="peer")   # the checks a config file gets
        if not cfg.coordinators:
            raise MembershipError("no coordinator address: pass coordinators=[...] (the swarm command also reads "
                                  "SWARM_COORDINATOR; the Python API reads no environment variable)")
        self.config = cfg
        self.id = cfg.id or _default_id()
        self.limits = limits or Limits(max_message_bytes=cfg.max_message_mb * 1024 * 1024)
        self._keep_frames = tp.keep_frames(self.limits)
        self.counters = PeerCounters()
        # bytes of the message that the last send() or send_nowait() returning True queued or
        # held (header and frames, as counters.bytes_out counts them): the gossip engine reads
        # it as the call returns, before it yields, to count what really went (its seq included)
        self.sent_nbytes = 0
        self.state = PeerState.NEW
        self.address = ""
        self.rank = cfg.rank
        self.incarnation = time.time_ns()
        self._stats: Callable[[], dict[str, Any]] | None = None
        self._own_ctx = context is None
        # its own is made by start(): a peer built and never started holds nothing (a
        # context is a file, and one never termed warns when collected)
        self._ctx: zmq.asyncio.Context | None = context
        self._link_failures = 0          # links that could not be opened (no sockets left)
        self._link_failure_logged = -math.inf
        self._view = View(0)
        self._neighbours: list[str] = []
        # views of a size the topology takes no neighbours in, in a row: since when (0: the
        # last view fits), the last one's error, and whether it was warned of (_check_shape)
        self._unfit_since = 0.0
        self._unfit_why = ""
        self._unfit_warned = False
        self._links: dict[str, _Link] = {}
        self._pending_hello: set[str] = set()
        self._ahead: dict[str, int] = {}       # non-member sender -> the newer epoch it spoke from
        self._held: dict[str, _Held] = {}      # messages for such senders, until the view lists them
        self._held_bytes = 0
        # with keys, inbound messages from senders our view does not list yet, in arrival
        # order, and those a new view listed, for the receive loop to check and dispatch
        self._held_in: collections.deque[_HeldIn] = collections.deque()
        self._released: collections.deque[_HeldIn] = collections.deque()
        self._held_in_bytes = 0     # of both
        self._held_in_s = max(HELD_IN_S, 2 * cfg.heartbeat_s)
        self._linked_epoch = -1
        self._linked = asyncio.Event()
        self._handlers: dict[str, list[Handler]] = {}
        self._side: list[zmq.Socket] = []   # side-channel sockets (open_inbox, open_outbox)
        self._view_callbacks: list[Callable[[View], None]] = []
        self._seq = itertools.count()
        # (what failed, error type) -> [when its traceback was last logged, failures not logged since]
        self._failures: dict[tuple[str, type], list[Any]] = {}
        self._welcome: asyncio.Future[dict[str, Any]] | None = None
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._recv_task: asyncio.Task[Any] | None = None   # the loop that runs handlers
        self._closer: asyncio.Task[None] | None = None      # a close() a handler started
        self._bye: asyncio.Future[None] | None = None       # the coordinator's answer to our leave
        self._failure: BaseException | None = None
        self._poll_dirty = True
        self._wake = asyncio.Event()      # set by the watched sockets' fds and by _sockets_changed
        self._fired: set[int] = set()     # fds to look at in the next pass (their reader fired)
        self._coord_lost = False          # the active coordinator's connection dropped; rotate
        self._check_all = True            # the next pass looks at every socket
        self._loop: asyncio.AbstractEventLoop | None = None
        self._readers: dict[int, Any] = {}   # fd -> socket registered with the loop
        self._last_suspect: dict[str, float] = {}
        self._bad_addrs: set[tuple[str, str]] = set()   # (member, address) that cannot be dialled
        self._link_redial_at = math.inf   # the earliest redial of a link whose neighbour refused it
        self._join_sent = 0.0
        self._rejoining = False
        self._bad = tp.BadInput(f"peer {self.id}")
        self._router: zmq.asyncio.Socket | None = None
        self._coords: list[zmq.asyncio.Socket] = []        # one DEALER per coordinator address
        self._coord_monitors: list[zmq.asyncio.Socket] = []
        self._dials: list[_Dial] = []                       # how dialling each of them goes
        self._probes: set[asyncio.Task] = set()              # greetings read for a close's cause
        self._active = 0                                    # which coordinator we talk to
        self._rotated = 0.0
        self._heard = 0.0            # last message from the coordinator we talk to
        self._standby_since = 0.0    # since when it answers "standby"
        self._coord_out = 0.0        # since when the peer has had no coordinator (logged once)
        self._standby_heard: set[str] = set()   # coordinators that answered "standby" (the join's error names them)
        self._curve: tp.Curve | None = None

    # ------------------------------------------------------------------ public

    @property
    def view(self) -> View:
        return self._view

    @property
    def stats(self) -> Callable[[], dict[str, Any]] | None:
        """Extra figures for heartbeats: a plain function that returns a dict, called on
        the peer's loop once per :data:`HEARTBEAT_STATS_S` (None: the counters only).
        Its errors are counted and logged as a view callback's; figures that cannot
        go on the wire count as one, and that heartbeat goes without them."""
        return self._stats

    @stats.setter
    def stats(self, fn: Callable[[], dict[str, Any]] | None) -> None:
        if fn is not None and not callable(fn):   # else it fails at each heartbeat, on the peer's loop
            raise ConfigError(f"peer {self.id}: stats = {fn!r:.80}: must be a function that returns a dict, "
                              f"or None")
        check_plain(fn, f"peer {self.id}: stats = ...")
        self._stats = fn

    @property
    def epoch(self) -> int:
        return self._view.epoch

    def neighbours(self) -> list[str]:
        """Neighbour ids in the current view, from the peer's topology ([] once closed)."""
        return list(self._neighbours)

    def on(self, t: str, handler: Handler) -> None:
        """Call ``handler(msg)`` for each message of type ``t`` (sync or async).

        Handlers run one at a time on the peer's receive loop, in the order messages
        arrive, and an async one is awaited there: until it returns, the peer reads no
        message, the coordinator's views included. A handler that waits for something
        only a later message brings (a view that lists the sender, a reply) waits out
        its timeout; hand such work to a task or a queue instead.

        A handler refuses a message as malformed by raising :class:`WireError`: it is
        counted as ``malformed`` and logged as one from the sender (at most once per
        sender per 10 s). Anything else it raises (a ValueError or a SwarmError
        included, a CancelledError that is not a cancellation of the peer's loop, and
        a WireError of its own outgoing calls: a :meth:`send` or :meth:`on` this peer
        refused) is the handler's error: counted as ``handler_errors`` and logged with
        its traceback (the first in full, then at most one per :data:`FAILURE_LOG_S`
        for the same handler and type of error, saying how many were not logged);
        the peer goes on with the next message.

        The types of swarm's own protocol that the peer handles itself (hello, ping
        and the membership types: :data:`RESERVED_TYPES`) are refused with a
        :class:`WireError`; ``pong``, the answer to a ping, may be handled.
        """
        # checked first: check_handler_type registers t in the process's wire types
        if not callable(handler):   # else it fails on each message, on the peer's loop
            raise ConfigError(f"peer {self.id}: on({t!r}, {handler!r:.80}): the handler must be callable")
        check_handler_type(t, f"peer {self.id}")
        # a new list, as off() makes: a dispatch running over the old one (a handler that
        # registers another) does not call the new handler for the message in hand
        self._handlers[t] = [*self._handlers.get(t, ()), handler]

    def off(self, t: str, handler: Handler) -> bool:
        """Stop calling ``handler`` for messages of type ``t`` (undo one :meth:`on`);
        False if it was not registered for ``t``.

        The peer holds what it calls: an object that registered handlers (a
        :class:`~swarm.gossip.Gossip`, say) stays alive and keeps handling messages
        until they are taken off, which its ``close()`` does. Call it on the peer's loop.
        """
        handlers = self._handlers.get(t, [])
        if handler not in handlers:
            return False
        # a new list: a dispatch running over the old one (a handler that closes its
        # owner) goes on unchanged
        i = handlers.index(handler)
        rest = handlers[:i] + handlers[i + 1:]
        if rest:
            self._handlers[t] = rest
        else:
            del self._handlers[t]
        return True

    def on_view(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` each time a new view is installed: a plain function
        (an async one is refused with :class:`ConfigError`; it may start a task)."""
        if not callable(callback):   # else it fails at each new view, on the peer's loop
            raise ConfigError(f"peer {self.id}: on_view({callback!r:.80}): the callback must be callable")
        check_plain(callback, f"peer {self.id}: on_view(...)", " (it may start a task for async work)")
        self._view_callbacks = [*self._view_callbacks, callback]   # a new list: see on()

    def off_view(self, callback: Callable[[View], None]) -> bool:
        """Stop calling ``callback`` for new views (undo one :meth:`on_view`); False if
        it was not registered."""
        if callback not in self._view_callbacks:
            return False
        i = self._view_callbacks.index(callback)
        self._view_callbacks = self._view_callbacks[:i] + self._view_callbacks[i + 1:]
        return True

    # -- side channels: plain sockets that one thread outside the peer's loop owns

    def open_inbox(self) -> tuple[zmq.Socket, str]:
        """A PULL socket for a thread outside the peer's loop to read by itself, and the
        endpoint to give its senders (:meth:`open_outbox`).

        It is bound on this peer's host, checks senders' keys as the peer's ROUTER
        does, and has the same message size limit; what arrives is wire frames
        (:func:`swarm.wire.decode`). Messages on it do not wake the peer's loop: a
        training thread that polls it between steps takes them in without a
        thread switch per message (:class:`swarm.gossip.GradientRelay` with
        ``direct``). Only the thread that reads it may use it; it closes it before the
        peer closes (the peer closes any left open).
        """
        if self.state is PeerState.CLOSED:
            raise SwarmError(f"peer {self.id} is closed")
        cfg = self.config
        if not (self.address.startswith("tcp://") and cfg.bind.startswith("tcp://")):
            raise ConfigError(f"peer {self.id}: side channels need a tcp address, this peer has {self.address!r}")
        # bound where the ROUTER is bound, named as the ROUTER is advertised
        bind_host = cfg.bind[len("tcp://"):].rsplit(":", 1)[0]
        advertised_host = self.address[len("tcp://"):].rsplit(":", 1)[0]
        try:
            s = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PULL)
        except zmq.ZMQError as e:
            raise self._no_socket("an inbox", e) from None
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        s.setsockopt(zmq.RCVHWM, max(1000, cfg.data_hwm))
        if self._curve is not None:
            self._curve.server(s)
        self._side.append(s)
        # its port is not the one --bind gave: the error says which it is
        what = f"peer {self.id}: " + (f"peer.inbox_port = {cfg.inbox_port} (the gradient relay's inbox)"
                                      if cfg.inbox_port else "the gradient relay's inbox")
        try:
            port = tp.bind(s, f"tcp://{bind_host}:{cfg.inbox_port or '*'}", what).rsplit(":", 1)[1]
        except TransportError:
            self.close_side(s)
            raise
        return s, f"tcp://{advertised_host}:{port}"

    def open_outbox(self, pid: str, endpoint: str) -> zmq.Socket | None:
        """A PUSH socket to member ``pid``'s inbox at ``endpoint``, secured as links are
        (with keys: only the holder of ``pid``'s key in the view can take the
        connection; one whose ``authorized/`` refuses this peer's key is logged once and
        dialled again at the owner's sends, with a backoff, until it admits it). None when ``pid`` is not in the view or has no key, this peer
        is closed, or ``endpoint`` (which ``pid`` sent) is not ``tcp://HOST:PORT``: that
        is logged once. The caller's thread owns it, as for :meth:`open_inbox`. Raises
        :class:`TransportError` when the context has no socket left for it (as does
        :meth:`open_inbox`).
        """
        _check_id(pid, self.id, "open_outbox(pid")
        m = self._view.member(pid) if self.state is not PeerState.CLOSED else None
        if m is None or (self._curve is not None and not m.key):
            return None
        why = tp.member_address_error(endpoint)
        if why:
            self._unlinkable(pid, endpoint, f"inbox endpoint {why}")
            return None
        cfg = self.config
        try:
            s = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PUSH, socket_class=_Outbox)
        except zmq.ZMQError as e:
            raise self._no_socket(f"an outbox to {pid}", e) from None
        s.setsockopt(zmq.LINGER, tp.DATA_LINGER_MS)   # not 0: see transport.DATA_LINGER_MS
        s.setsockopt(zmq.SNDHWM, cfg.data_hwm)
        # a connection gone silent (its host vanished without a reset) is dropped and
        # dialled again within OUTBOX_TIMEOUT_S, not kept until TCP gives up (about 15
        # min), and a dial that is not answered is not left to the OS's SYN retries, as
        # for a data link. What the PUSH had not written out yet waits for the new connection.
        tp.heartbeats(s, cfg.link_heartbeat_s, max(cfg.link_timeout_s, OUTBOX_TIMEOUT_S))
        s.setsockopt(zmq.CONNECT_TIMEOUT, int(LINK_CONNECT_TIMEOUT_S * 1000))
        self._side.append(s)   # before its monitor: closed with the peer if nobody else closes it
        if self._curve is not None:
            self._curve.client(s, m.key)
            try:
                # only a keyed inbox refuses a handshake that libzmq then never dials again
                s.follow(self.id, pid, endpoint, self._curve)
            except zmq.ZMQError as e:   # its monitor's sockets: left open, it held term() for ever
                self.close_side(s)
                raise self._no_socket(f"an outbox to {pid}", e) from None
        try:
            tp.connect(s, endpoint)
        except TransportError as e:   # what the check lets through and libzmq still refuses
            self.close_side(s)
            self._unlinkable(pid, endpoint, str(e))
            return None
        return s

    def close_side(self, s: zmq.Socket) -> None:
        """Close a side-channel socket (from the thread that owns it), with its own
        linger (an outbox's is ``transport.DATA_LINGER_MS``)."""
        s.close()
        if s in self._side:
            self._side.remove(s)

    def key_check(self, msg: wire.Message, key: str) -> tp.KeyCheck:
        """With keys, what the view says of the sender of ``msg``, which came with ``key``
        (:func:`swarm.transport.user_id` of its last frame): its src is listed with that
        key (``OK``; always so without keys), not listed (``UNLISTED``: nothing to check
        the key against), or listed with another key (``OTHER_KEY``: a forgery). The
        ROUTER and a relay inbox check senders with it."""
        if self._curve is None:
            return tp.KeyCheck.OK
        m = self._view.member(msg.src)
        if m is None:
            return tp.KeyCheck.UNLISTED
        return tp.KeyCheck.OK if m.key == key else tp.KeyCheck.OTHER_KEY

    async def __aenter__(self) -> "Peer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        """Bind, join through the coordinator and wait for the first view."""
        if self.state is not PeerState.NEW:
            raise SwarmError(f"peer {self.id} is {self.state.value}; start() only once")
        self.state = PeerState.JOINING
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        try:
            if self._ctx is None:
                self._ctx = _own_context()
            self._router = tp.router(self._ctx, limits=self.limits, hwm=max(1000, cfg.data_hwm))
            if cfg.keys_dir:
                self._curve = tp.Curve(cfg.keys_dir, cfg.key_name)
                self._curve.start(self._ctx)
                self._curve.server(self._router)
            # also with peer.advertise, which only names it
            bound = tp.bind(self._router, cfg.bind, f"peer {self.id}: peer.bind")
            self.address = cfg.advertise or tp.advertised(bound)
            for addr in cfg.coordinators:
                c = tp.dealer(self._ctx, limits=self.limits, hwm=64, immediate=True,
                              heartbeat_s=cfg.link_heartbeat_s, heartbeat_timeout_s=cfg.link_timeout_s,
                              connect_timeout_s=COORD_CONNECT_TIMEOUT_S)
                self._coords.append(c)   # kept at once: a socket left open makes close() wait for ever
                if self._curve is not None:
                    self._curve.client(c, self._curve.coordinator_public)
                self._coord_monitors.append(c.get_monitor_socket(_COORD_EVENTS))
                self._dials.append(_Dial())
                tp.connect(c, addr)
        except BaseException as e:
            # whatever failed (a bad address, a value libzmq refused, Ctrl-C), what was
            # made is closed, and close() then returns at once
            self._close_sockets()
            self.state = PeerState.CLOSED
            if isinstance(e, zmq.ZMQError):   # no socket left: as a link says it
                raise self._no_socket("its sockets", e) from None
            raise
        self._welcome = asyncio.get_running_loop().create_future()
        self._rotated = time.monotonic()
        self._runner = asyncio.create_task(self._run(), name=f"peer-{self.id}")
        # one deadline for the welcome and the view that lists us (wire.md, section 5)
        deadline = time.monotonic() + cfg.join_timeout_s
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns the result when a cancel
            # lands in the pass its awaitable ends in, and the caller's cancel is lost
            async with asyncio.timeout(cfg.join_timeout_s):
                welcome = await asyncio.shield(self._welcome)
            while self._view.index(self.id) < 0:
                self._raise_failure()
                if self._closing():
                    raise self._closed_while_starting()
                if time.monotonic() > deadline:
                    raise MembershipError(f"peer {self.id}: welcomed, but no view that lists it arrived within "
                                          f"join_timeout_s = {cfg.join_timeout_s} s")
                await asyncio.sleep(0.005)
        except MembershipError:   # the welcome came, the view did not
            await self._abort()
            raise
        except asyncio.TimeoutError:
            await self._abort()
            if self._standby_heard:
                # they are up, and none is active: e.g. coordinators that cannot talk to each
                # other (different keys) stay standbys rather than split the swarm in two
                raise MembershipError(
                    f"peer {self.id}: no coordinator at {', '.join(cfg.coordinators)} took the join within "
                    f"{cfg.join_timeout_s} s: {', '.join(sorted(self._standby_heard))} answered as standby "
                    "and none is active; `swarm status --coordinator ADDR --json` shows why (its "
                    "\"others\")") from None
            if self.counters.malformed:
                raise MembershipError(
                    f"peer {self.id}: no coordinator at {', '.join(cfg.coordinators)} took the join within "
                    f"{cfg.join_timeout_s} s, and {self.counters.malformed} malformed message(s) from them "
                    "were dropped (the log says why): is that a swarm coordinator of this version?") from None
            failed = [f"{addr}: {d.failure}" for addr, d in zip(cfg.coordinators, self._dials) if d.failure]
            if failed:
                raise MembershipError(
                    f"peer {self.id}: no coordinator answered at {', '.join(cfg.coordinators)} within "
                    f"{cfg.join_timeout_s} s: the handshake fails with {'; with '.join(failed)}") from None
            reached = [(addr, d) for addr, d in zip(cfg.coordinators, self._dials) if d.handshakes]
            if reached:
                raise MembershipError(f"peer {self.id}: no coordinator took the join within {cfg.join_timeout_s} s: "
                                      + "; ".join(self._reached(addr, d) for addr, d in reached)) from None
            # connected, and no handshake ended, nor was refused (with keys on one side only it is)
            silent = [addr for addr, d in zip(cfg.coordinators, self._dials) if d.tcp_accepted and not d.ever_refused]
            if silent:
                raise MembershipError(
                    f"peer {self.id}: no coordinator answered at {', '.join(cfg.coordinators)} within "
                    f"{cfg.join_timeout_s} s: " + "; ".join(tp.silent_hint(addr) for addr in silent)) from None
            raise MembershipError(
                f"peer {self.id}: no coordinator answered at {', '.join(cfg.coordinators)} within "
                f"{cfg.join_timeout_s} s" + (tp.unresolved_hint(cfg.coordinators) or (
                    "; is `swarm coordinator` running there"
                    # a coordinator with keys drops a client without them in silence
                    + (", with keys that list this peer's?" if cfg.keys_dir
                       else "? (one started with --keys ignores a peer without them)")))) from None
        except BaseException:
            await self._abort()
            raise
        if self._closing():   # a close() in another task as the view came: it does not run
            await self._abort()
            raise self._closed_while_starting()
        self.rank = int(welcome["rank"])
        self.state = PeerState.RUNNING

    async def close(self, timeout: float = 1.0) -> None:
        """Leave the swarm (the coordinator relinks the neighbours at once) and close.

        ``timeout``: seconds to wait for the coordinator to confirm the leave (None:
        without a deadline).

        Awaited from a handler, it starts the leave and returns at once, the peer
        LEAVING: the handler runs on the receive loop, the only reader of the
        confirmation, so the rest of the close runs in a task of its own once the
        handler returns. :meth:`wait_stopped` returns when the peer is closed. (A view
        callback is a plain function, which cannot await it.)

        From another event loop than the peer's it raises :class:`SwarmError`, as the
        other coroutines do, and changes nothing; a closed peer returns at once there
        too, and one whose loop was closed under it (its tasks never run again) closes
        its sockets at once, without the leave.
        """
        seconds(timeout, none_ok=True)
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop() and self.state is not PeerState.CLOSED:
            if not loop.is_closed():
                raise self._other_loop("close()")
            self._close_now()
            return
        if self._recv_task is not None and asyncio.current_task() is self._recv_task:
            if self._closer is None and self.state is not PeerState.CLOSED:
                self._closer = asyncio.create_task(self.close(timeout), name=f"peer-{self.id}-close")
                self._closer.add_done_callback(_retrieve)   # a failure is the peer's: wait_stopped raises it
                await asyncio.sleep(0)   # the closer sends the leave before the handler goes on
            return
        if self.state is PeerState.NEW:   # never started: nothing to close
            self.state = PeerState.CLOSED
            return
        if self.state is PeerState.CLOSED:
            return
        if self._welcome is not None and not self._welcome.done():
            # a start() in another task waits for the welcome: it ends now, and says why
            self._welcome.set_exception(self._closed_while_starting())
        bye = self._bye
        if self.state is PeerState.LEAVING and bye is not None and not bye.done():
            # another close() waits for the leave's confirmation: wait with it (closing the
            # sockets now could drop the leave, and left that one waiting for ever)
            await asyncio.wait([bye], timeout=timeout)
        try:
            if self.state is PeerState.RUNNING and self._runner and not self._runner.done():
                self.state = PeerState.LEAVING
                self._bye = asyncio.get_running_loop().create_future()
                # with the final figures: the last heartbeat's may be a second old (and none
                # follows a leave), and the coordinator keeps what a member last sent
                self._send_with_stats("leave", {"inc": self.incarnation})
                try:
                    async with asyncio.timeout(timeout):   # not wait_for: it can lose a cancel (start())
                        await self._bye
                except TimeoutError:
                    log.info("peer %s: coordinator did not confirm the leave within %.1f s", self.id, timeout)
        except BaseException:
            # Cancelled (a caller's deadline shorter than ``timeout``) or interrupted while
            # the leave waits for its confirmation: close at once all the same. Left open,
            # the sockets and the context hung the process in the next gc (in the
            # context's __del__).
            self._stop.set()
            self._close_now()
            raise
        await self._abort()
        if self._failure is not None:
            raise self._failure

    async def send(self, dst: str, t: str, body: dict[str, Any] | None = None,
                   arrays: Sequence[np.ndarray] = (), *, timeout: float | None = None) -> bool:
        """Send one message to peer ``dst`` (an id in the view).

        Returns True once the message is queued for ``dst``, not when it arrives.
        Returns False, and counts it, when ``dst`` is unknown (``unknown_dst``; so
        is every send once the peer is closed) or its queue stays full past
        ``timeout`` seconds (None: do not wait) or until it leaves the view
        (``dropped_out``); at once, whatever ``timeout``, when ``dst`` cannot be
        reached: its link has had no handshake for :data:`LINK_CONNECT_TIMEOUT_S`
        (``dropped_out``; logged, and counted in ``unreachable``). Arrays of 64 KiB
        or more (``swarm.transport.ZERO_COPY_MIN``) go out without a copy and are
        read when the message leaves the queue, which
        may be several sends later behind a slow receiver: do not modify them after
        this call. Smaller ones are copied on send.

        A reply to a member that just joined: the coordinator may tell it of the new
        view before us, so its message can come before the view that lists it. With
        a ``timeout``, a send to a sender outside our view whose message came from a
        newer view than ours is held (``held``) and True returned at once: it goes
        when a view lists ``dst``, and is dropped (``unknown_dst``) if a view as new
        as the one ``dst`` spoke from does not list it, after ``timeout`` seconds, or
        at close; if the queue to ``dst`` is full then, as ``dropped_out``. Nothing
        waits for the view, so a handler can reply (the peer reads views on the
        loop that runs handlers). At most ``data_hwm`` messages per destination and
        :data:`HELD_MAX_BYTES` in all are held; past that, False at once
        (``unknown_dst``). Any other ``dst`` outside the view (a neighbour that just
        died) is still False at once.

        Raises :class:`WireError`, and sends nothing, for a message a receiver would
        drop as malformed (see :func:`swarm.wire.encode`), including one larger than
        this peer's own ``max_message_mb``: the peers of a swarm normally share it,
        and a receiver drops what exceeds its limit; and for a type of swarm's own
        protocol that only the peer or the coordinator sends (:data:`UNSENDABLE_TYPES`;
        ``ping`` may be sent, and the receiver answers ``pong``); :class:`ConfigError`
        for a ``dst`` that is not a str.
        """
        self._check_loop("send()")
        seconds(timeout, none_ok=True)
        _check_id(dst, self.id, "send(dst")
        _check_sendable(t, self.id)
        sent, link, frames = self._try_send(dst, t, body, arrays, hold=timeout)
        if sent or link is None:
            return sent
        if timeout and not link.unreachable:   # an unreachable dst would only cost the timeout
            deadline = time.monotonic() + timeout
            link.waiting += 1    # a link in use, neighbour or not
            try:
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        await link.sock.poll(int(left * 1000) + 1, zmq.POLLOUT)
                    except (asyncio.CancelledError, zmq.ZMQError):
                        # Closing a socket cancels the polls waiting on it: dst left the view
                        # while its queue was full, and the message is dropped like any other.
                        # A cancellation of this task itself goes on up.
                        task = asyncio.current_task()
                        if not link.sock.closed or (task is not None and task.cancelling()):
                            raise
                        break
                    if link.sock.closed:
                        # closed while this task waited to resume (a view dropped dst): its
                        # plain shadow holds only libzmq's pointer, which the next socket
                        # made may get again, so a send through it could reach another peer
                        break
                    if tp.try_send(link.plain, frames):
                        self._count_out(frames)
                        return True
            finally:
                link.waiting -= 1
                link.used = time.monotonic()
        self.counters.dropped_out += 1
        return False

    def send_nowait(self, dst: str, t: str, body: dict[str, Any] | None = None,
                    arrays: Sequence[np.ndarray] = ()) -> bool:
        """:meth:`send` without waiting, for callers on the peer's loop that must not
        yield (no task per message): False, and counted, when ``dst`` is unknown (a
        message is never held for it) or cannot be reached, the peer is closed or the
        queue is full;
        :class:`WireError` and :class:`ConfigError` as for :meth:`send`."""
        _check_id(dst, self.id, "send_nowait(dst")
        _check_sendable(t, self.id)
        return self._send_now(dst, t, body, arrays)

    def _send_now(self, dst: str, t: str, body: dict[str, Any] | None = None,
                  arrays: Sequence[np.ndarray] = ()) -> bool:
        sent, link, _ = self._try_send(dst, t, body, arrays)
        if not sent and link is not None:
            self.counters.dropped_out += 1
        return sent

    def _try_send(self, dst: str, t: str, body: dict[str, Any] | None, arrays: Sequence[np.ndarray],
                  hold: float | None = None) -> tuple[bool, _Link | None, list[Any]]:
        """Queue the message on ``dst``'s link: (sent, the link, the frames); a ``dst``
        outside the view is held for up to ``hold`` seconds where :meth:`_hold` can."""
        self._raise_failure()
        try:
            frames = wire.encode(t, self.id, epoch=self._view.epoch, seq=next(self._seq), body=body,
                                 arrays=arrays, limits=self.limits)
        except WireError as e:
            raise _outgoing(e)
        # closed: the view is stale and the context gone, so no link can be made
        link = self._link(dst) if self.state is not PeerState.CLOSED else None
        if link is None:
            if hold and self._hold(dst, frames, hold):
                return True, None, frames
            self.counters.unknown_dst += 1
            return False, None, []
        link.used = time.monotonic()
        if not link.unreachable and tp.try_send(link.plain, frames):
            self._count_out(frames)
            return True, link, frames
        return False, link, frames

    def _hold(self, dst: str, frames: list[Any], timeout: float) -> bool:
        """Keep a message for ``dst``, outside our view, until a view lists it (see
        :meth:`send`): only if ``dst`` spoke from a newer view than ours, within the
        bounds. True if held."""
        since = self._ahead.get(dst)
        if since is None or since <= self._view.epoch or self.state is not PeerState.RUNNING:
            return False
        held = self._held.get(dst)
        nbytes = tp.frames_nbytes(frames)
        if (held is not None and len(held.msgs) >= self.config.data_hwm) \
                or self._held_bytes + nbytes > HELD_MAX_BYTES:
            return False
        if held is None:
            held = self._held[dst] = _Held(since)
        held.msgs.append((time.monotonic() + timeout, frames, nbytes))
        self._held_bytes += nbytes
        self.counters.held += 1
        self.sent_nbytes = nbytes
        return True

    def _release_held(self, view: View) -> None:
        """A new view: send what was held for the members it lists; drop what was held
        for those it should list by now and does not."""
        for dst in list(self._held):
            held = self._held[dst]
            listed = view.member(dst) is not None
            if not listed and view.epoch < held.epoch:
                continue   # our view still lags the one dst spoke from
            del self._held[dst]
            link = self._link(dst) if listed else None
            for _, frames, nbytes in held.msgs:
                self._held_bytes -= nbytes
                if link is None:
                    self.counters.unknown_dst += 1
                elif tp.try_send(link.plain, frames):
                    self._count_out(frames)
                    link.used = time.monotonic()
                else:
                    self.counters.dropped_out += 1

    def _expire_held(self, now: float) -> None:
        """Drop the held messages whose send timeout passed (all of them at close)."""
        for dst in list(self._held):
            held = self._held[dst]
            keep = [m for m in held.msgs if m[0] > now]
            for _, _, nbytes in (m for m in held.msgs if m[0] <= now):
                self._held_bytes -= nbytes
                self.counters.unknown_dst += 1
            if keep:
                held.msgs = keep
            else:
                del self._held[dst]

    async def wait_linked(self, timeout: float | None = 5.0) -> None:
        """Wait until every neighbour of the current view has answered our hello
        (``timeout`` None: without a deadline). Raises the peer's failure, or
        :class:`SwarmError` once it is closed (a :meth:`close` in another task), at once,
        when it would wait."""
        self._check_loop("wait_linked()")
        seconds(timeout, none_ok=True)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        # woken by the event, or every 50 ms to see a close or a failure meanwhile
        while not self._linked.is_set():
            self._raise_stopped()
            left = deadline - time.monotonic()
            if left <= 0:
                if self.id not in self._view.ids:   # no neighbours to wait for: it is not a member
                    raise PeerTimeout(f"peer {self.id}: not in the current view (epoch {self._view.epoch}) "
                                      f"within {timeout} s: not joined yet, or declared dead and rejoining")
                raise PeerTimeout(f"peer {self.id}: neighbours {sorted(self._pending_hello)} "
                                  f"did not answer within {timeout} s")
            try:   # woken by the event: linked, if only for a moment (a new view may clear it)
                async with asyncio.timeout(min(left, 0.05)):   # not wait_for: it can lose a cancel (start())
                    await self._linked.wait()
                return
            except TimeoutError:
                pass

    async def wait_view(self, predicate: Callable[[View], bool], timeout: float | None = 5.0) -> View:
        """Wait until the installed view satisfies ``predicate``, a plain function
        (``timeout`` None: without a deadline). Raises the peer's failure, or
        :class:`SwarmError` once it is closed (a :meth:`close` in another task), at
        once, when it would wait."""
        self._check_loop("wait_view()")
        check_plain(predicate, f"peer {self.id}: wait_view(...)")
        seconds(timeout, none_ok=True)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while not predicate(self._view):
            self._raise_stopped()
            if time.monotonic() > deadline:
                raise PeerTimeout(f"peer {self.id}: view condition not met within {timeout} s "
                                  f"(epoch {self._view.epoch}, members {self._view.ids})")
            await asyncio.sleep(0.005)
        return self._view

    async def wait_stopped(self) -> None:
        """Return when the peer stops running: after :meth:`close`, or when it fails
        (a refused rejoin, a broken socket), whose error it then raises."""
        self._check_loop("wait_stopped()")
        if self._runner is not None:
            # not an await of the runner: a close cut short cancels it, and that raised
            # CancelledError in every task waiting here, which nobody had cancelled
            await asyncio.wait([self._runner])
        closer = self._closer
        if closer is not None and closer is not asyncio.current_task():
            await asyncio.wait([closer])   # a close() a handler started: until the sockets are closed
        self._raise_failure()

    # ---------------------------------------------------------------- internals

    def _closing(self) -> bool:
        """Whether close() was called (or a failed start is closing the peer)."""
        return self._stop.is_set() or self.state in (PeerState.LEAVING, PeerState.CLOSED)

    def _closed_while_starting(self) -> SwarmError:
        return SwarmError(f"peer {self.id} was closed while starting: close() was called before the join "
                          f"was done")

    def _reached(self, addr: str, d: _Dial) -> str:
        """Why coordinator ``addr``, whose handshake succeeded, did not take the join."""
        if not d.drops:
            return (f"{addr} was reached but did not answer in time: busy or far away (peer.join_timeout_s = "
                    f"{self.config.join_timeout_s:g} s)")
        # the ZMTP heartbeat (a PING answered within the timeout) cannot cross a link whose
        # round trip is longer: each connection is closed before the welcome arrives
        return (f"{addr} was reached ({d.handshakes} handshake{'s' * (d.handshakes != 1)}) but the connection "
                f"dropped {d.drops} time{'s' * (d.drops != 1)} before the join was taken: its ZMTP heartbeat "
                f"timeout peer.link_timeout_s = {self.config.link_timeout_s:g} s may be shorter than the link's "
                f"round trip needs; raise it, and the coordinator's coordinator.zmtp_timeout_s likewise "
                f"(docs/multihost.md, \"Long round trips\")")

    def _check_loop(self, what: str) -> None:
        """Raise :meth:`_other_loop`'s error when ``what`` runs on another event loop than
        the one that started the peer (none yet: any)."""
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            raise self._other_loop(what)

    def _other_loop(self, what: str) -> SwarmError:
        """The error for a coroutine awaited on another event loop than the one that
        started the peer: its zmq sockets are not thread-safe, and a future it waits on
        would be set from the peer's loop, which does not wake another loop."""
        return SwarmError(f"peer {self.id}: {what} was awaited on another event loop than the one the peer was "
                          f"started in, which owns its sockets; run it there: from another thread "
                          f"asyncio.run_coroutine_threadsafe(coro, peer_loop).result(), or use swarm.SyncPeer "
                          f"from blocking code")

    def _raise_stopped(self) -> None:
        """For the waits: raise the peer's failure, or SwarmError once it is closing or
        closed (they waited for ever, or ran out their timeout, for a view or link that
        could no longer come). Sends do not: they count and return False."""
        self._raise_failure()
        if self._closing():
            raise SwarmError(f"peer {self.id} is closed (close() was called): nothing more to wait for")

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._runner is not None and self._runner.done() and not self._stop.is_set():
            raise SwarmError(f"peer {self.id} stopped unexpectedly")

    async def _abort(self) -> None:
        """Stop the loops (cancelled if they take more than 2 s) and close everything.

        The sockets and the context are closed whatever the loops ended with (a
        failure, which ``_run`` keeps; a cancellation by the loop's clean-up; a
        SystemExit the loop raised already), and also when this task is itself
        cancelled or interrupted meanwhile, which then goes on up."""
        self._stop.set()
        try:
            if self._runner is not None and not self._runner.done():
                # asyncio.wait, not an await of the runner: that raised what it ended with
                await asyncio.wait([self._runner], timeout=2.0)
        finally:
            self._close_now()

    def _close_now(self) -> None:
        """Cancel the loops if they still run, close the sockets and the context, drop
        what was held: the peer is closed (again: nothing)."""
        if self.state is PeerState.CLOSED:
            return
        # a loop closed under the peer runs none of its tasks again, and refuses to cancel them
        if self._loop is None or not self._loop.is_closed():
            runner = self._runner
            if runner is not None:
                if not runner.done():
                    runner.cancel()
                else:
                    _retrieve(runner)   # seen here: no "exception was never retrieved" at gc
            for probe in list(self._probes):
                probe.cancel()
            bye = self._bye
            if bye is not None and not bye.done():   # a close() waiting for it returns
                bye.set_result(None)
        self._close_sockets()
        self._expire_held(math.inf)   # what was held for a view that never came is dropped
        self._expire_held_in(math.inf)
        self._neighbours = []
        self._pending_hello = set()
        self.state = PeerState.CLOSED

    def _close_sockets(self) -> None:
        self._unwatch_all()
        for link in self._links.values():
            self._close_link(link)
        self._links.clear()
        for i, c in enumerate(self._coords):   # a start() that failed may have made no monitor for it
            try:
                c.disable_monitor()
            except zmq.ZMQError:
                pass
            if i < len(self._coord_monitors):
                self._coord_monitors[i].close(0)
            c.close(0)
        if self._router is not None:
            self._router.close(0)
        self._router = None
        self._coords, self._coord_monitors = [], []
        for side in self._side:   # their owners should have closed them; term() waits for every socket
            if not side.closed:
                side.close()   # with its own linger, as close_side
        self._side.clear()
        if self._curve is not None:
            self._curve.stop()
            self._curve = None
        if self._own_ctx and self._ctx is not None:
            self._ctx.term()

    def _close_link(self, link: _Link) -> None:
        if link.monitor is not None:
            try:
                link.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._unwatch(link.monitor)
            link.monitor.close(0)
        # with the linger tp.dealer gave it (transport.DATA_LINGER_MS): with 0, libzmq aborted
        # the process when the neighbour closed its end as the link was part way through a message
        link.sock.close()
        self._sockets_changed()

    async def _run(self) -> None:
        # cancelled with no close() (a program that never closed it): its sockets go at once
        self._failure = await supervise([self._recv_loop(), self._timer_loop()], self._stop,
                                        on_cancel=self._close_now)
        if self._failure is not None:
            log.error("peer %s failed: %r", self.id, self._failure)
            if self._welcome is not None and not self._welcome.done():
                self._welcome.set_exception(self._failure)

    def _count_out(self, frames: list[Any]) -> None:
        self.sent_nbytes = tp.frames_nbytes(frames)
        self.counters.msgs_out += 1
        self.counters.bytes_out += self.sent_nbytes

    def _send_coord(self, t: str, body: dict[str, Any], to: int | None = None) -> bool:
        if not self._coords:
            return False
        frames = wire.encode(t, self.id, epoch=self._view.epoch, body=body)
        sent = tp.try_send(tp.shadow(self._coords[self._active if to is None else to]), frames)
        # A send can take the fd's edge for a reply already queued: look again.
        self._look_everywhere()
        return sent

    def _rotate(self, why: str) -> None:
        """Talk to the next coordinator address (failover to a standby) and join there."""
        now = time.monotonic()
        if not self._coord_out and self.state is PeerState.RUNNING:
            # once per outage, until a welcome: with one address, nothing else says it
            self._coord_out = now
            addr = self.config.coordinators[self._active]
            lost = (f"lost its connection to coordinator {addr}" if why == "connection lost"
                    else f"coordinator {addr} {why}")
            log.warning("peer %s: %s; the view cannot change until it is back%s", self.id, lost,
                        "; is it running?" if len(self._coords) < 2 else
                        f" or {self.config.coordinators[(self._active + 1) % len(self._coords)]} takes over")
        if len(self._coords) < 2:
            self._coord_lost = False
            return
        if now - self._rotated < 0.1:
            return   # just rotated or welcomed; a lost connection is retried by the timer loop
        self._rotated = now
        self._coord_lost = False
        self._standby_since = 0.0
        self._active = (self._active + 1) % len(self._coords)
        log.info("peer %s: coordinator %s (%s); trying %s", self.id, why,
                 self.config.coordinators[self._active - 1], self.config.coordinators[self._active])
        self._rejoining = True
        self._join()

    def _join(self) -> None:
        if self.state in (PeerState.LEAVING, PeerState.CLOSED):
            # close() sent leave: a "rejoin" answer to a late heartbeat, a rotation or the
            # timer's re-join took the peer back into the view (two view changes, and
            # neighbours linking to a peer about to be gone)
            return
        self._join_sent = time.monotonic()
        # The rank asked for, not the one given: a rank the coordinator picked is only
        # wished back ("was"), as one that joined while this peer was frozen may hold it
        body = {"addr": self.address, "rank": self.config.rank, "inc": self.incarnation,
                "last_epoch": self._view.epoch}
        if self.config.rank < 0 and self.rank >= 0:
            body["was"] = self.rank
        if self.config.replace and self.state is PeerState.JOINING:
            body["replace"] = True
        self._send_coord("join", body)

    # -- receive

    async def _recv_loop(self) -> None:
        # The loop watches each socket's ZMQ_FD with add_reader, registered once per
        # socket set. (zmq.asyncio's Poller registers and unregisters every fd on each
        # poll: most of this thread's CPU when messages come one by one.) The fd is
        # edge-triggered: a pass checks ZMQ_EVENTS of the sockets whose fd fired, and
        # of those that had messages in the last pass (drains are batched), until
        # none has any; then it waits for a wake-up. A changed socket set, a send on a
        # coordinator socket (which can take an edge) and a timer every 0.1 s (in
        # case an edge was lost anyway) make a pass look at every socket.
        loop = asyncio.get_running_loop()
        self._recv_task = asyncio.current_task()
        self._join()
        watched: list[tuple[int, Any, zmq.Socket, Callable[[zmq.Socket], Any]]] = []
        try:
            while True:
                if self._released:
                    await self._dispatch_released()
                if self._poll_dirty:
                    self._poll_dirty = False
                    watched = self._watch()
                    self._check_all = True
                self._wake.clear()
                if self._check_all:
                    self._check_all = False
                    due = watched
                else:
                    due = [w for w in watched if w[0] in self._fired]
                self._fired.clear()
                busy = False
                for fd, sock, plain, handle in due:
                    # .closed of the socket itself: a shadow does not know it was closed
                    try:
                        ready = not sock.closed and plain.getsockopt(_EVENTS) & _POLLIN
                    except zmq.ZMQError:
                        continue
                    if ready:
                        busy = True
                        self._fired.add(fd)   # at most a batch was drained: look again
                        r = handle(plain)
                        if r is not None:
                            await r
                if busy:
                    await asyncio.sleep(0)   # let other tasks run between passes
                    continue
                timer = loop.call_later(0.1, self._look_everywhere)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
        finally:
            self._unwatch_all()

    def _on_fd(self, fd: int) -> None:
        self._fired.add(fd)
        self._wake.set()

    def _look_everywhere(self) -> None:
        self._check_all = True
        self._wake.set()

    def _watch(self) -> list[tuple[int, Any, zmq.Socket, Callable[[zmq.Socket], Any]]]:
        """(fd, socket, its plain shadow, handler) for every socket the receive loop reads,
        with their fds registered with the loop."""
        self._unwatch_all()
        socks: list[tuple[Any, Callable[[zmq.Socket], Any]]] = [(self._router, self._drain_router)]
        for i, c in enumerate(self._coords):
            socks.append((c, lambda p, i=i: self._drain_coord(p, i)))
        for i, m in enumerate(self._coord_monitors):
            socks.append((m, lambda p, i=i: self._drain_coord_monitor(p, i)))
        for pid, link in self._links.items():
            if link.monitor is not None:
                socks.append((link.monitor, lambda p, m=link.monitor, pid=pid: self._on_monitor(m, pid)))
        watched = []
        for sock, handle in socks:
            if sock is None or sock.closed:
                continue
            fd = sock.getsockopt(zmq.FD)
            self._loop.add_reader(fd, self._on_fd, fd)
            self._readers[fd] = sock
            watched.append((fd, sock, tp.shadow(sock), handle))
        return watched

    def _unwatch(self, sock: Any) -> None:
        """Stop watching ``sock``; call it before closing the socket (a closed fd
        cannot be unregistered, and its number may be reused)."""
        if self._loop is None or sock is None or sock.closed:
            return
        fd = sock.getsockopt(zmq.FD)
        if self._readers.pop(fd, None) is not None:
            self._loop.remove_reader(fd)

    def _unwatch_all(self) -> None:
        if self._loop is not None:
            for fd in list(self._readers):
                self._loop.remove_reader(fd)
        self._readers.clear()

    async def _drain_router(self, plain: zmq.Socket) -> None:
        for frames in tp.drain(plain, keep=self._keep_frames):
            if self._released:   # a view listed held senders: their messages came first
                await self._dispatch_released()
            msg = self._on_router(frames)
            if msg is not None:
                await self._dispatch(msg)

    # -- with keys: messages from senders that our view does not list yet

    def _hold_in(self, msg: Message, key: str) -> None:
        """Keep ``msg``, from a sender outside our view that spoke from a newer view, until
        a view lists the sender (:meth:`_release_held_in`), within the bounds; past
        them it is dropped as malformed at once, as it was before holding."""
        if len(self._held_in) + len(self._released) >= HELD_IN_MAX \
                or self._held_in_bytes + msg.nbytes > HELD_MAX_BYTES:
            self._drop_in(msg, f"src {msg.src!r} is not in the view and the hold for such senders is full "
                               f"({HELD_IN_MAX} messages, {HELD_MAX_BYTES >> 20} MiB)")
            return
        # one hold time for all: the deque stays in deadline order
        self._held_in.append(_HeldIn(time.monotonic() + self._held_in_s, msg, key))
        self._held_in_bytes += msg.nbytes
        self.counters.held_in += 1

    def _drop_in(self, msg: Message, why: str | None) -> None:
        """Count a message from a sender outside the view as malformed (logged with ``why``)."""
        self.counters.malformed += 1
        if why is not None:
            # one reason for all senders (the reason counts are bounded, ids are not)
            self._bad(msg.src, WireError(f"sender outside the view: {why}"))

    def _release_held_in(self, view: View) -> None:
        """A new view: pass on, in arrival order, the held messages of the senders it
        lists (the receive loop checks their keys and dispatches them before it reads
        anything else); drop those of senders that a view as new as the one they
        spoke from does not list."""
        keep: collections.deque[_HeldIn] = collections.deque()
        for h in self._held_in:
            if view.member(h.msg.src) is not None:
                self._released.append(h)
            elif view.epoch >= h.msg.epoch:
                self._held_in_bytes -= h.msg.nbytes
                self._drop_in(h.msg, f"src {h.msg.src!r} is not in view {view.epoch}, "
                                     f"as new as the one it spoke from ({h.msg.epoch})")
            else:
                keep.append(h)
        self._held_in = keep
        if self._released:
            self._wake.set()   # when the view came from elsewhere than the receive loop

    async def _dispatch_released(self) -> None:
        """Check the key of each message a new view released, and handle it."""
        while self._released:
            h = self._released.popleft()
            self._held_in_bytes -= h.msg.nbytes
            if self._from_key(h.msg, self.key_check(h.msg, h.key)):   # a later view may have dropped it
                await self._dispatch(h.msg)

    def _expire_held_in(self, now: float) -> None:
        """Drop the held inbound messages whose sender no view listed in time (all of
        them, and those released but not handled yet, at close)."""
        while self._held_in and self._held_in[0].deadline <= now:
            h = self._held_in.popleft()
            self._held_in_bytes -= h.msg.nbytes
            self._drop_in(h.msg, None if now == math.inf else
                          f"src {h.msg.src!r} was not in a view within {self._held_in_s} s")
        if now == math.inf:
            while self._released:
                self._held_in_bytes -= self._released.popleft().msg.nbytes
                self.counters.malformed += 1

    def _drain_coord(self, plain: zmq.Socket, i: int) -> None:
        for frames in tp.drain(plain, keep=self._keep_frames):
            self._on_coord(frames, i)

    def _drain_coord_monitor(self, plain: zmq.Socket, i: int) -> None:
        for frames in tp.drain(plain, keep=self._keep_frames):
            ev = parse_monitor_message([f.bytes for f in frames])
            if ev["event"] == zmq.EVENT_CONNECTED:
                self._dials[i].tcp_accepted = True
            elif ev["event"] == zmq.EVENT_DISCONNECTED:
                d = self._dials[i]
                if d.up:
                    d.up, d.drops = False, d.drops + 1
                if i == self._active:
                    # Remembered until the rotation happens: within 0.1 s of a welcome or of
                    # the last rotation _rotate declines, and the event comes only once (a
                    # peer that had just joined stayed with a dead coordinator for good).
                    self._coord_lost = True
            else:
                self._on_coord_handshake(i, ev["event"], ev["value"])
        if self._coord_lost:
            self._rotate("connection lost")

    def _on_coord_handshake(self, i: int, event: int, value: int) -> None:
        """Follow how the handshakes with coordinator ``i`` end: log a failure once (until
        one succeeds), and dial again, with a backoff, an address libzmq gave up on."""
        d, addr = self._dials[i], self.config.coordinators[i]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if d.failure:
                log.warning("peer %s: the handshake with coordinator %s succeeds again", self.id, addr)
            self._dials[i] = d.succeeded()
            waiting = self._welcome is not None and not self._welcome.done()
            if i == self._active and d.handshakes and not waiting:
                # a connection that dropped and is back: the coordinator probed this peer on
                # the route that went with it and found it gone, so it holds it dead until
                # it hears from it (a heartbeat_s on, or never for a peer welcomed but not
                # yet listed). Joined again at once, and until a welcome answers
                self._rejoining = True
            if i == self._active and (waiting or self._rejoining):
                # the join sent before this connection was up went nowhere (IMMEDIATE: nothing
                # queues for a coordinator not connected); say it now, not at the next resend
                # 250 ms on. A second join of this incarnation only refreshes the member.
                self._join()
            return
        why, gave_up = _coord_handshake_error(event, value, keyed=self._curve is not None)
        d.ever_refused = d.ever_refused or bool(why)
        d.closes = d.closes + 1 if why and not gave_up else 0
        if gave_up:
            if d.refused(why, time.monotonic()):
                self._log_dial_failure(addr, why, gave_up)
        elif why and d.closes >= 2 and not d.failure:
            # A close in the handshake counts from the second in a row (the first may be a
            # coordinator going down), and never over a precise reason: a mechanism
            # mismatch, for one, also shows as a close when the coordinator saw it first
            # (most times, on loopback), so its greeting is read for the mechanism it
            # names, and the close's guess stands meanwhile.
            d.failure = why
            probe = asyncio.get_running_loop().create_task(self._read_greeting(i, d, addr))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

    async def _read_greeting(self, i: int, d: _Dial, addr: str) -> None:
        """Log why coordinator ``i`` closes this peer's handshakes: the mechanism its
        greeting names, where that is not this peer's, else the guess in ``d.failure``."""
        theirs = await tp.zmtp_mechanism(addr, GREETING_S)
        if self._closing() or i >= len(self._dials) or self._dials[i] is not d:   # or a handshake succeeded
            return
        keyed = self._curve is not None
        if theirs not in ("NULL", "CURVE"):
            pass   # no greeting: the guess stands
        elif theirs != ("CURVE" if keyed else "NULL"):
            d.failure = _mechanism_mismatch(keyed)
        elif keyed:   # both have keys, and it could not open our hello: sealed for another key
            d.failure = ("it closes the connection in the CURVE handshake: most likely it runs with another "
                         "coordinator key pair than this peer's coordinator.key")
        else:         # no keys on either side: not a matter of keys
            d.failure = "it closes the connection in the handshake, though it runs without --keys as this peer does"
        self._log_dial_failure(addr, d.failure, False)

    def _log_dial_failure(self, addr: str, why: str, gave_up: bool) -> None:
        again = f"Dialling it again, every {REDIAL_MAX_S:g} s at most," if gave_up else "libzmq dials it again"
        # a join gives up on its deadline: "until it succeeds" would be contradicted seconds later
        until = (f"until the join deadline (peer.join_timeout_s = {self.config.join_timeout_s:g} s)"
                 if self.state is PeerState.JOINING else "until it succeeds")
        log.error("peer %s: the handshake with coordinator %s fails: %s. %s %s", self.id, addr, why, again, until)

    def _redial(self, now: float) -> None:
        """Dial again the coordinator addresses and the links whose redial is due."""
        for c, d, addr in zip(self._coords, self._dials, self.config.coordinators):
            if d.redial_at and now >= d.redial_at:
                d.redial_at = 0.0
                try:
                    c.disconnect(addr)
                except zmq.ZMQError:
                    pass    # libzmq may have dropped the endpoint already
                tp.connect(c, addr)
        if now >= self._link_redial_at:   # and the links a neighbour refused
            due = math.inf
            for pid, link in self._links.items():
                d = link.dial
                if d.redial_at and now >= d.redial_at:
                    d.redial_at = 0.0
                    try:
                        link.sock.disconnect(link.addr)
                    except zmq.ZMQError:
                        pass
                    try:
                        tp.connect(link.sock, link.addr)
                    except TransportError as e:   # it connected before: not expected
                        log.warning("peer %s: cannot dial neighbour %s again: %s", self.id, pid, e)
                elif d.redial_at:
                    due = min(due, d.redial_at)
            self._link_redial_at = due

    def _sockets_changed(self) -> None:
        """A link was opened or closed: rebuild the receive loop's poller now.

        Links change inside the receive loop (a new view) but also in :meth:`send`
        (a reply to a peer we had no link to), when the loop may be waiting in its poll.
        """
        self._poll_dirty = True
        self._wake.set()   # the receive loop rebuilds its socket set first

    def _on_router(self, frames: list[zmq.Frame]) -> Message | None:
        """Decode a message from the ROUTER and check its sender: the message to
        handle, or None (dropped, or held until a view lists its sender)."""
        try:
            route, msg = tp.decode_routed(frames, self.limits)
        except WireError as e:
            self.counters.malformed += 1
            self._bad(frames[0].bytes if frames else b"?", e, tp.peer_address(frames[-1]) if frames else None)
            return None
        msg.route = route
        if self._curve is not None:
            # with keys, a message must come from the key its src holds in the view
            key = tp.user_id(frames[-1])
            said = self.key_check(msg, key)
            if said is tp.KeyCheck.UNLISTED and msg.epoch > self._view.epoch:
                # A sender from a newer view than ours may have just joined: keep its
                # message until a view lists it. A hello is not kept, nor counted as
                # malformed: the joiner says it again until it is answered.
                if msg.t == "hello":
                    log.debug("peer %s: hello from %r before a view lists it", self.id, msg.src)
                else:
                    self._hold_in(msg, key)
                return None
            if not self._from_key(msg, said):
                return None
        return msg

    def _from_key(self, msg: Message, said: tp.KeyCheck) -> bool:
        """With keys: whether to handle ``msg``, of whose sender :meth:`key_check` said
        ``said``. A src outside the view is dropped and counted in ``unlisted``, not as
        malformed: most often a member that has just left, whose last messages come from
        the view it held; its key is gone from ours, so nothing tells a forgery from them
        (they were logged as forgeries). A listed src from another key is refused as
        malformed."""
        if said is tp.KeyCheck.UNLISTED:
            self.counters.unlisted += 1
            log.debug("peer %s: %s from %r, which view %d does not list: dropped", self.id, msg.t, msg.src,
                      self._view.epoch)
        elif said is tp.KeyCheck.OTHER_KEY:
            self.counters.malformed += 1
            self._bad(msg.src, WireError(f"src {msg.src!r} does not match the sender's CURVE key"))
        return said is tp.KeyCheck.OK

    async def _dispatch(self, msg: Message) -> None:
        """Handle a message that passed the wire checks (and, with keys, the key check)."""
        self.counters.msgs_in += 1
        self.counters.bytes_in += msg.nbytes
        if msg.epoch > self._view.epoch and self._view.member(msg.src) is None:
            # It holds a newer view than ours, one that lists it (it just joined, and the
            # coordinator told it first): a reply to it is held until ours does (send).
            if len(self._ahead) >= AHEAD_MAX:
                self._ahead.clear()
            self._ahead[msg.src] = msg.epoch
        t = msg.t
        if t == "hello":
            # ack on our own DEALER to the sender (it is in the view, or it is not a peer of
            # ours; one that joined before our view lists it says hello again)
            self._answer(msg, "hello_ack", {"e": msg.body.get("e")})
            return
        if t == "hello_ack":
            if msg.src in self._pending_hello and msg.body.get("e") == self._view.epoch:
                self._pending_hello.discard(msg.src)
                self._check_linked()
            return
        if t == "ping":
            self._answer(msg, "pong", msg.body)
            return
        handlers = self._handlers.get(t)
        if not handlers:
            if t in ("join", "status"):   # a coordinator's (reserved: no handler takes them)
                self._not_a_coordinator(msg)
            else:
                self.counters.unhandled += 1
            return
        for h in handlers:
            try:
                r = h(msg)
                if asyncio.iscoroutine(r):
                    await r
            except WireError as e:
                if _is_outgoing(e):
                    # its own send (or on) was refused: the handler's error, not the sender's
                    self._callback_failed(f"handler for {t!r}")
                    continue
                # bad content in a well-formed envelope: the handler refused it. Only
                # WireError says so: a ValueError or SwarmError is the handler's own
                # error (a bug, a refused call), not the sender's
                self.counters.malformed += 1
                self._bad(msg.src, e)
            except asyncio.CancelledError:
                if not _cancelled_by_callback():
                    raise
                self._callback_failed(f"handler for {t!r}")
            except Exception:
                self._callback_failed(f"handler for {t!r}")

    def _callback_failed(self, what: str, how: str = "failed") -> None:
        """Count and log (with its traceback) the error of a handler or a callback that
        is being handled (``what`` ``how``: "handler for 'x'" "failed"); the peer goes
        on. The same failure again within :data:`FAILURE_LOG_S` of its last traceback
        is counted, not logged."""
        self.counters.handler_errors += 1
        key = (f"{what} {how}", type(sys.exc_info()[1]))
        now = time.monotonic()
        seen = self._failures.get(key)
        if seen is not None and now - seen[0] < FAILURE_LOG_S:
            seen[1] += 1
            return
        if len(self._failures) >= 1024:   # bounded, whatever types of errors user code makes
            self._failures.clear()
        self._failures[key] = [now, 0]
        if seen is not None and seen[1]:
            log.exception("peer %s: %s %s (%d more times with %s since the last traceback, %.0f s ago, "
                          "not logged)", self.id, what, how, seen[1], key[1].__name__, now - seen[0])
        else:
            log.exception("peer %s: %s %s", self.id, what, how)

    def _answer(self, msg: Message, t: str, body: dict[str, Any]) -> None:
        """Answer a hello or a ping; an echo that no longer fits under our limits
        (the sender's header was near them) is dropped like a malformed message."""
        try:
            self._send_now(msg.src, t, body)   # not send(): user code may not send hello_ack
        except WireError as e:
            self.counters.malformed += 1
            self._bad(msg.src, e)

    def _not_a_coordinator(self, msg: Message) -> None:
        """Answer a ``join`` or a ``status``, which only a coordinator takes, with a refusal
        that says why: they come from a client given this peer's address for its
        coordinator's (both print tcp://HOST:PORT), which otherwise waited out its timeout
        and blamed that. On the ROUTER, by the asker's route: it has no address of its own."""
        why = (f"{self.address} is a swarm peer, not a coordinator; its coordinator is "
               f"{self.config.coordinators[self._active]}")
        t, body = ("refuse", {"reason": why}) if msg.t == "join" else ("status_reply", {"error": why})
        frames = [msg.route, *wire.encode(t, self.id, epoch=self._view.epoch, body=body)]
        if tp.try_send(tp.shadow(self._router), frames):
            self._count_out(frames)

    def _on_coord(self, frames: list[zmq.Frame], i: int = 0) -> None:
        try:
            msg = wire.decode(frames, self.limits)
        except WireError as e:
            self.counters.malformed += 1
            self._bad("coordinator", e)
            return
        t, body = msg.t, msg.body
        if i == self._active:
            self._heard = time.monotonic()
        try:
            if t == "welcome":
                rank = body["rank"]
                if type(rank) is not int or rank < 0:
                    # checked before start() is handed it: there, a bad one left the peer half-started
                    raise ValueError(f"rank {wire.shown(rank)} is not an int >= 0")
                self._rejoining = False
                self._rotated = time.monotonic()
                self._standby_since = 0.0
                if self._welcome is not None and not self._welcome.done():
                    self._welcome.set_result(body)
                self.rank = rank
                if self._coord_out:
                    epoch = body.get("epoch")
                    log.warning("peer %s: coordinator %s answers again after %.0f s (rejoined, epoch %s)", self.id,
                                self.config.coordinators[i], time.monotonic() - self._coord_out,
                                epoch if type(epoch) is int else "?")
                    self._coord_out = 0.0
            elif t == "refuse":
                err = MembershipError(f"peer {self.id}: coordinator refused the join: {body.get('reason')}")
                if self._welcome is not None and not self._welcome.done():
                    self._welcome.set_exception(err)
                elif i == self._active and self.state is PeerState.RUNNING:
                    # A rejoin refused: another process took this peer's id or the rank it
                    # pinned (peer.rank) while it was frozen or cut off. Retrying cannot
                    # succeed, and going on would feed its neighbours under an id that is
                    # no longer its own: the peer fails.
                    raise MembershipError(f"{err}; another process holds this peer's place in the swarm "
                                          f"now, so this one stops")
                else:
                    log.error("%s", err)
            elif t == "view":
                if "base" in body:
                    # a delta: only against the view we hold; otherwise our next heartbeat
                    # shows that we lag and the coordinator sends the full view
                    if body["base"] == self._view.epoch:
                        self._install(self._view.apply(body))
                else:
                    self._install(View.from_wire(body))
            elif t == "rejoin" and i == self._active:
                # the coordinator restarted or declared us dead: join again, keep gossiping
                if time.monotonic() - self._join_sent > 0.1:
                    self.counters.rejoins += 1
                    self._rejoining = True
                    self._join()
            elif t == "probe":
                self._send_coord("probe_ack", {"nonce": body.get("nonce"), "inc": self.incarnation}, to=i)
            elif t == "standby":
                # that coordinator is not active (yet: it may be taking over from a dead
                # primary, so keep asking it for a while before trying the next address)
                if i < len(self.config.coordinators):
                    self._standby_heard.add(self.config.coordinators[i])
                if i == self._active:
                    now = time.monotonic()
                    if not self._standby_since:
                        self._standby_since = now
                        self._rejoining = True
                    elif now - self._standby_since > 2 * self.config.coordinator_timeout_s:
                        self._rotate("is a standby")
            elif t == "bye":
                fut = self._bye
                if fut is not None and not fut.done():
                    fut.set_result(None)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
            # IndexError: a member entry of fewer than three items; OverflowError: int(inf)
            self.counters.malformed += 1
            self._bad("coordinator", WireError(f"bad {t} body: {e!r}"))

    def _on_monitor(self, sock: zmq.asyncio.Socket, pid: str) -> None:
        plain = tp.shadow(sock)
        while True:
            try:
                frames = plain.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            ev = parse_monitor_message(frames)
            link = self._links.get(pid)
            if link is None or link.monitor is not sock:
                return   # a link closed since (its events are stale)
            event, now = ev["event"], time.monotonic()
            if event == zmq.EVENT_DISCONNECTED:
                link.down_since = link.down_since or now
                if link.dial.redial_at:
                    pass   # the end of a handshake it refused: it is alive, and dialled again
                elif pid in self._view.ids and now - self._last_suspect.get(pid, 0) > 0.2:
                    self._last_suspect[pid] = now
                    self.counters.suspicions += 1
                    self._send_coord("suspect", {"id": pid})
            elif event == zmq.EVENT_CONNECT_DELAYED:
                link.dialled = now
            elif event == zmq.EVENT_CONNECTED:
                link.why = "its address takes the connection, but no ZeroMQ handshake completes"
            elif event == zmq.EVENT_CLOSED:
                # an attempt that ended without a connection: at once (a reset, no route), or
                # at the connect timeout (nothing answered)
                link.why = ("its address refuses the connection (nothing listens there, or a firewall rejects it)"
                            if now - link.dialled < LINK_CONNECT_TIMEOUT_S / 2 else
                            f"its address does not answer a connection within {LINK_CONNECT_TIMEOUT_S:g} s")
            else:
                self._on_link_handshake(pid, link, event, ev["value"])

    def _on_link_handshake(self, pid: str, link: _Link, event: int, value: int) -> None:
        """Follow how the handshakes of the link to ``pid`` end: log a refusal once (until
        one succeeds), and dial it again with a backoff (libzmq gave the address up); a
        success after :meth:`_check_reach` found ``pid`` unreachable is logged once."""
        d = link.dial
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if d.failure:
                log.warning("peer %s: the handshake with neighbour %s at %s succeeds again", self.id, pid,
                            link.addr)
            if link.unreachable:
                log.warning("peer %s: reaches %s at %s again, after %.0f s", self.id, pid, link.addr,
                            time.monotonic() - link.down_since)
            link.dial = d.succeeded()
            link.down_since, link.why, link.unreachable = 0.0, "", False
            self._count_unreachable()
            return
        why = _link_refusal(event, value, keyed=self._curve is not None)
        if not why:
            return
        new = d.refused(why, time.monotonic())
        self._link_redial_at = min(self._link_redial_at, d.redial_at)
        if new:
            log.error("peer %s: the handshake with neighbour %s at %s fails: %s. Dialling it again, every "
                      "%g s at most, until it succeeds", self.id, pid, link.addr,
                      _refusal_text(self._curve, pid, why), REDIAL_MAX_S)

    # -- view and links

    def _install(self, view: View) -> None:
        if view.epoch <= self._view.epoch:
            return  # fencing: an older view never replaces a newer one
        self._view = view
        idx = view.index(self.id)
        if idx < 0:
            # declared dead (we were frozen or cut off): ask to come back
            if self.state is PeerState.RUNNING and time.monotonic() - self._join_sent > 0.1:
                self.counters.rejoins += 1
                self._join()
            self._neighbours = []
        else:
            from ..gossip import topology as topo
            n, cfg = len(view.members), self.config
            try:
                edges = topo.within(cfg.edges, n) if cfg.topology == "custom" else None
                pos = topo.neighbours(cfg.topology, n, idx, edges=edges)
                if not pos and n > 1 and cfg.topology == "custom":
                    # as an unfit view: fine while peers join, a warning once it lasts
                    self._unfit_since = self._unfit_since or time.monotonic()
                    self._unfit_why = (f"epoch {view.epoch}: peer.edges give position {idx} of {n} no "
                                       "neighbour (edges are over positions in the view, members sorted "
                                       "by rank, not over ranks)")
                else:
                    self._unfit_since, self._unfit_warned = 0.0, False
            except ConfigError as e:
                # the view stands all the same (it says who is alive; the rest of this
                # installs it): no neighbours until one the topology takes, such as a
                # hypercube of 3 while its peers join. Before, half-installed, it counted as
                # a malformed message. Only one that lasts is a warning (_check_shape)
                log.info("peer %s: epoch %d: %s; no neighbours until a view it can take",
                         self.id, view.epoch, e)
                self._unfit_since = self._unfit_since or time.monotonic()
                self._unfit_why = f"epoch {view.epoch}: {e}"
                pos = []
            self._neighbours = [view.members[j].id for j in pos]
        ids = set(view.ids)
        for pid in [p for p in self._links if p not in ids or view.member(p).addr != self._links[p].addr]:
            self._close_link(self._links.pop(pid))
        # only members are suspected: one bookkeeping entry per member, not per id ever seen
        self._last_suspect = {p: t for p, t in self._last_suspect.items() if p in ids}
        # held replies first, so that up to data_hwm of them fit a new link's queue
        # (a hello that finds it full is said again 100 ms later)
        self._release_held(view)
        if self._held_in:
            self._release_held_in(view)
        self._pending_hello = set(self._neighbours)
        self._linked.clear()
        now = time.monotonic()
        for pid in self._neighbours:
            link = self._link(pid)
            if link is not None:
                self._hello(link, now)
            elif (pid, view.member(pid).addr) in self._bad_addrs:
                # it can never answer: waiting for it would stall wait_linked for ever
                self._pending_hello.discard(pid)
        self._check_linked()
        self._ahead = {p: e for p, e in self._ahead.items() if e > view.epoch}
        for cb in self._view_callbacks:
            try:
                cb(view)
            except asyncio.CancelledError:
                if not _cancelled_by_callback():
                    raise
                self._callback_failed("view callback")
            except Exception:
                self._callback_failed("view callback")

    def _check_linked(self) -> None:
        if not self._pending_hello and self._linked_epoch != self._view.epoch and self._view.index(self.id) >= 0:
            self._linked_epoch = self._view.epoch
            self._linked.set()
            self._send_coord("linked", {"e": self._view.epoch})

    def _link(self, pid: str) -> _Link | None:
        link = self._links.get(pid)
        if link is not None:
            return link
        m = self._view.member(pid)
        if m is None:
            return None
        cfg = self.config
        if self._curve is not None and not m.key:
            log.warning("peer %s: %s has no CURVE key in the view; not linking", self.id, pid)
            return None
        why = tp.member_address_error(m.addr)
        if why:
            self._unlinkable(pid, m.addr, why)
            return None
        s = None
        try:
            # send-only: what a neighbour sends back on it is never read, so libzmq holds none of it
            s = tp.dealer(self._ctx, limits=self.limits, hwm=cfg.data_hwm, heartbeat_s=cfg.link_heartbeat_s,
                          heartbeat_timeout_s=cfg.link_timeout_s, connect_timeout_s=LINK_CONNECT_TIMEOUT_S,
                          send_only=True)
            if self._curve is not None:
                self._curve.client(s, m.key)
            mon = s.get_monitor_socket(_LINK_EVENTS)
        except zmq.ZMQError as e:
            # no sockets left (the context's or the process's limit), or a key libzmq refuses:
            # this neighbour stays unlinked for now (sends to it are dropped, a later send or
            # view tries again); raised, it ended the receive loop and the peer with it
            if s is not None:
                s.close(0)
            self._link_failed(pid, e)
            return None
        try:
            tp.connect(s, m.addr)
        except TransportError as e:   # what the check lets through and libzmq still refuses
            self._close_link(_Link(s, tp.shadow(s), mon, m.addr))
            self._unlinkable(pid, m.addr, str(e))
            return None
        now = time.monotonic()
        link = _Link(s, tp.shadow(s), mon, m.addr, used=now, down_since=now)
        self._links[pid] = link
        self._sockets_changed()
        return link

    def _link_failed(self, pid: str, e: zmq.ZMQError) -> None:
        self._link_failures += 1
        now = time.monotonic()
        if now - self._link_failure_logged >= 10.0:
            self._link_failure_logged = now
            log.warning("peer %s: cannot open a link to %s: %s%s; it stays unlinked for now, sends to it are "
                        "dropped (%d such failures so far)", self.id, pid, e, self._sockets_hint(e),
                        self._link_failures)

    def _sockets_hint(self, e: zmq.ZMQError) -> str:
        """Which limit a ZMQError from opening a socket met: the process's on open files
        (``ulimit -n``) where that is the lower one (each socket holds a file, so the
        context's on sockets cannot be met first), else the context's. Without a context
        (start() could not make its own) it was the files."""
        if e.errno != errno.EMFILE:
            return ""
        sockets = self._ctx.get(zmq.MAX_SOCKETS) if self._ctx is not None else None
        files = tp.fd_limit()
        if sockets is None or (files is not None and files <= sockets):
            return f" (this process may open {files} files, ulimit -n, and a link takes about four)"
        return f" (this context allows {sockets} sockets, and a link takes three)"

    def _no_socket(self, what: str, e: zmq.ZMQError) -> TransportError:
        """The error for ``what`` (a socket, with its monitor) that libzmq would not open:
        no sockets left in the context or the process, most often."""
        hint = self._sockets_hint(e)
        if hint:
            hint += ("; close what else uses the context, or raise the limit (the process's open files, "
                     "ulimit -n; with context=, also the context's zmq.MAX_SOCKETS)")
        return TransportError(f"peer {self.id}: cannot open {what}: {e.strerror}{hint}")

    def _unlinkable(self, pid: str, addr: str, why: str) -> None:
        """A neighbour whose address cannot be dialled (a view from an old coordinator, which
        admitted any): logged once per address; it stays unlinked, and sends to it are
        dropped as to a peer outside the view."""
        if (pid, addr) not in self._bad_addrs:
            if len(self._bad_addrs) > 4096:    # bounded under a flood of ids
                self._bad_addrs.clear()
            self._bad_addrs.add((pid, addr))
            log.warning("peer %s: not linking to %s: %s", self.id, pid, why)

    # -- timers

    async def _timer_loop(self) -> None:
        cfg = self.config
        tick = min(0.05, cfg.heartbeat_s)   # joins and hellos are retried at this pace
        last_hb = last_stats = 0.0
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self._held:
                self._expire_held(now)
            if self._held_in:
                self._expire_held_in(now)
            self._redial(now)
            if self._coord_lost:
                self._rotate("connection lost")
            waiting = self._welcome is not None and not self._welcome.done()
            if (waiting or self._rejoining) and \
                    now - max(self._rotated, self._heard) > self.config.coordinator_timeout_s:
                self._rotate(f"did not answer for {self.config.coordinator_timeout_s:g} s")
            if waiting:
                if now - self._join_sent > 0.25:
                    self._join()
                continue
            if self._rejoining and now - self._join_sent > 0.25:
                self._join()
            self._resend_hellos(now)
            self._check_reach(now)
            self._check_shape(now)
            if now - last_hb < cfg.heartbeat_s or self.state is PeerState.LEAVING:
                continue   # leaving: a beat after the leave reads as a dead member's, answered "rejoin"
            last_hb = now
            self._close_spare_links(now)
            body: dict[str, Any] = {"inc": self.incarnation, "linked": self._linked_epoch}
            if now - last_stats >= HEARTBEAT_STATS_S:
                # the figures ride on one heartbeat a second; the others are bare
                # liveness beats (a coordinator of 1,000 members decodes 4,000 a second)
                last_stats = now
                self._send_with_stats("heartbeat", body)
            else:
                self._send_coord("heartbeat", body)

    def _send_with_stats(self, t: str, body: dict[str, Any]) -> None:
        """Send ``t`` (a heartbeat, the leave) to the coordinator with the peer's figures
        in ``stats``: every counter, as PeerCounters says (handler errors were seen only in
        the log), the neighbours, those it cannot reach, and what the stats callback adds.
        Figures that cannot go on the wire are the callback's error: ``t`` goes without them."""
        c = self.counters
        body["stats"] = {**asdict(c), "nbrs": self._neighbours,
                         "unreachable_ids": [pid for pid, link in self._links.items() if link.unreachable]}
        if self._stats is not None:
            # its errors as a view callback's: counted, a traceback at most every
            # FAILURE_LOG_S (a full one each second, for ever, filled the log)
            try:
                body["stats"].update(self._stats())
            except asyncio.CancelledError:
                if not _cancelled_by_callback():
                    raise
                self._callback_failed("stats callback")
            except Exception:
                self._callback_failed("stats callback")
        try:
            self._send_coord(t, body)
        except WireError:
            # one wording for the heartbeat and the leave: the same failure, logged once per FAILURE_LOG_S
            self._callback_failed("stats callback", "returned figures that cannot go on the wire (heartbeat "
                                                    "stats dropped; so are the leave's)")
            body.pop("stats", None)
            self._send_coord(t, body)

    def _close_spare_links(self, now: float) -> None:
        """Close the links to members that are no longer neighbours (the view changed,
        or a reply or a time-varying topology opened them) once they fall idle: a
        peer keeps about as many links as it has neighbours, however often the view
        changes."""
        cfg = self.config
        idle = max(SPARE_LINK_IDLE_S, 2 * (cfg.link_heartbeat_s + cfg.link_timeout_s))
        keep = set(self._neighbours)
        for pid in [p for p, link in self._links.items()
                    if p not in keep and not link.waiting and now - link.used > idle]:
            self._close_link(self._links.pop(pid))

    def _check_reach(self, now: float) -> None:
        """Log once (and count) each link that has had no handshake for
        :data:`LINK_CONNECT_TIMEOUT_S`: its member cannot be reached, and sends to it
        fail at once until a handshake succeeds (:meth:`_on_link_handshake`). Why the view
        still lists it depends on the coordinator: one this peer's connection reaches
        reaches the member too (over the member's own connection); one that does not
        answer (killed, frozen) reaches nobody, and drops no member that died or froze.
        Not by when this peer last heard it: a coordinator sends a member nothing while
        the view stands still."""
        for pid, link in self._links.items():
            if link.down_since and not link.unreachable and now - link.down_since > LINK_CONNECT_TIMEOUT_S:
                link.unreachable = True
                why = link.dial.failure or link.why or "its address does not answer a connection"
                if self._dials[self._active].up:
                    listed = f"The view still lists {pid} (the coordinator reaches it over its own connection): check"
                else:
                    listed = (f"The coordinator {self.config.coordinators[self._active]} does not answer either, so "
                              f"the view cannot drop {pid} if it died or froze; if {pid} runs, check")
                log.warning("peer %s: cannot reach %s at %s for %.0f s: %s. %s that its address (its peer.advertise) "
                            "takes connections from this host. Sends to it fail at once until it answers",
                            self.id, pid, link.addr, now - link.down_since, why, listed)
        self._count_unreachable()

    def _check_shape(self, now: float) -> None:
        """Warn once when the views have been of sizes the topology takes no neighbours
        in (a hypercube of 3) for ``join_timeout_s`` in a row. While peers join such views
        come and go (3 on the way to 4), logged at INFO only: a healthy start of every
        hypercube swarm warned on each peer; one that lasts does not mend by itself."""
        if self._unfit_since and not self._unfit_warned and now - self._unfit_since > self.config.join_timeout_s:
            self._unfit_warned = True
            log.warning("peer %s: no neighbours for %.0f s: %s; start or stop peers for a size it takes, or "
                        "choose another topology", self.id, now - self._unfit_since, self._unfit_why)

    def _count_unreachable(self) -> None:
        self.counters.unreachable = sum(link.unreachable for link in self._links.values())

    def _resend_hellos(self, now: float) -> None:
        """Neighbours that have not answered hello yet: say it again."""
        for pid in list(self._pending_hello):
            link = self._links.get(pid)
            if link is not None and now - link.hello_sent > 0.1:
                self._hello(link, now)

    def _hello(self, link: _Link, now: float) -> None:
        link.hello_sent = now
        frames = wire.encode("hello", self.id, epoch=self._view.epoch, body={"e": self._view.epoch})
        if tp.try_send(link.plain, frames):
            self._count_out(frames)   # as the receiver counts it in msgs_in
