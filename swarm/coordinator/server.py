"""The coordinator: membership and failover, never on the data path.

Protocol (see docs/wire.md for the envelope)::

    peer → coord   join {addr, rank, inc, last_epoch}   → welcome {rank, epoch} | refuse {reason}
    peer → coord   heartbeat {inc, linked, stats}        → rejoin {} if unknown/dead/other incarnation
    peer → coord   leave {inc, stats}                    → bye {}
    peer → coord   suspect {id}                          (a neighbour's link broke)
    coord → peer   probe {nonce}                         → probe_ack {nonce, inc}
    coord → peer   view {epoch, members}                 (on every change, and to a peer that lags)
    peer → coord   linked {e}                            (all neighbours of epoch e answered hello)
    any  → coord   status {}                             → status_reply {...}

Failure detection, fastest first:

1. the TCP connection of a peer closes (crash) or its ZMTP heartbeat times out
   (frozen process): the ROUTER's monitor reports the connection's fd, which
   maps to the peers that speak on it; a probe to a route that is gone fails
   at once → dead;
2. a neighbour reports a broken link (``suspect``) → direct probe → dead if
   there is no answer within ``probe_timeout_s``;
3. no heartbeat for ``heartbeat_timeout_s`` → the same probe.

A live but slow peer refutes a suspicion by answering the probe or by its next
heartbeat. Each death is logged at WARNING with its cause. A join under the id of
a live member whose connection has closed (its process restarted) goes unanswered
until that member's probe has settled; the joiner asks again meanwhile (every
250 ms). The coordinator keeps nothing it cannot rebuild: after a restart it
answers unknown heartbeats with ``rejoin``, gathers re-joins for
``rejoin_grace_s`` and continues the epochs above the highest one peers report.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import time
from dataclasses import replace
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .. import transport as tp
from .. import wire
from ..config import CoordinatorConfig, from_dict, to_dict
from ..errors import MembershipError, SwarmError, WireError
from ..wire import Limits
from ..tasks import supervise
from .http import StatusServer
from .report import bound_stats
from .table import ALIVE, DEAD, SUSPECT, MemberRecord, MemberTable

log = logging.getLogger("swarm.coordinator")

_NOBLOCK = int(zmq.NOBLOCK)
#: what a watch socket's monitor reports: how the last attempt to reach another coordinator went
_WATCH_EVENTS = (zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED
                 | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                 | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
#: seconds another coordinator has to complete a handshake (libzmq's default). One that
#: accepts the connection but says nothing for this long (a stopped or frozen process:
#: its kernel still accepts) is taken as down, not as one with other keys
HANDSHAKE_TIMEOUT_S = 30.0
#: seconds another coordinator's host has to answer a connection (SYN to SYN-ACK). Without
#: it a host that vanished without a TCP reset (powered off, a cable pulled, a firewall that
#: drops) kept the dial pending until the OS gave up (about 127 s on Linux), and a standby
#: that its failed handshakes held back stayed held back as long. A third of
#: HANDSHAKE_TIMEOUT_S, the connect being the first of the handshake's round trips: room for
#: three lost SYNs (Linux sends one again after 1, 3 and 7 s), and ten times the default
#: takeover_s, within which a live coordinator has to answer a status anyway. The cost: a
#: network slower than this to answer a connection has its coordinator taken as down (and
#: libzmq dials again at once)
CONNECT_TIMEOUT_S = HANDSHAKE_TIMEOUT_S / 3
#: how long the greeting of another coordinator that closes this one's handshakes is
#: waited for (:meth:`Coordinator._read_greeting`)
GREETING_S = 2.0
#: the highest ``last_epoch`` a join may report: a view a microsecond for 146,000
#: years, and far enough below the wire's 64-bit limit that later epochs still fit
MAX_LAST_EPOCH = 2**62
#: seconds of messages one wake-up handles before the deaths it noticed are probed and
#: views published: a batch of 256 status requests against a table of 4,096 records of
#: stats (~60 ms a reply) held both back for 15 s
DRAIN_BUDGET_S = 0.05
#: seconds a built ``status`` reply is sent again to later askers (at least: a reply that
#: took longer than a twentieth of this to build is kept 5 times as long as it took),
#: unless the membership changed since (a join, a death, a new view or epoch, a takeover,
#: a message refused as malformed):
#: that shows in the next reply. Built anew, each of a flood of requests cost a whole
#: reply (~60 ms at 4,096 records with stats, ~2-6 ms at 256); so at most one is built per window, and its
#: figures (heartbeat ages, stats, suspicions) are at most that old. The status page keeps
#: its document as long (StatusServer.cache_s)
STATUS_CACHE_S = 0.25
#: members whose death is logged one by one per second at most. Past them a death storm
#: (a switch that failed under a rack of peers, a client that joined thousands of ids on
#: one connection and closed it) is counted, and the count logged once a second:
#: `swarm status` lists each dead member with its cause
DEATH_LINES_PER_S = 20
#: the limits a view is encoded under: what a peer decodes by default (a 4 MiB header,
#: lists of up to 100,000). A view past them could not be sent (its encoding fails), so
#: the table refuses a join that would make one (MemberTable.max_view_bytes)
VIEW_LIMITS = wire.DEFAULT_LIMITS

__all__ = ["Coordinator"]


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int:
    v = body.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise WireError(f"{key} must be an integer, got {wire.shown(v)}")
    return v


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v or len(v) > 512:
        raise WireError(f"{key} must be a non-empty string, got {wire.shown(v)}")
    return v


def _keep_stats(rec: MemberRecord, stats: Any, now: float) -> None:
    """Keep the figures a member sent (a heartbeat's ``stats``, or its leave's), if they are
    a map: a bounded copy (strings cut, maps to their first 64 items, about 8 KiB in all),
    so that each member's share of a status reply is small. A map of more items is cut,
    not dropped: dropped whole, a peer's figures froze at the last that fitted."""
    if stats is not None and type(stats) is dict:
        rec.stats, rec.stats_at = bound_stats(stats), now


def _handshake_error(event: int, value: int, keyed: bool) -> tuple[str, bool]:
    """What a failed handshake with another coordinator says, and whether libzmq gave up
    on the address (after a refused key or a mechanism mismatch it never dials again).
    A handshake that timed out is not one of these (see HANDSHAKE_TIMEOUT_S)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"it refused this coordinator's key (ZAP status {value}): not in its authorized/", True
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return _mechanism_mismatch(keyed), True
        return f"CURVE protocol error {value:#x}: other keys", True
    if value in (errno.EPIPE, errno.ECONNRESET):
        # the other side closed the connection in the handshake: it could not decrypt our hello,
        # sealed for another coordinator key, or it found the other mechanism before we did
        # (most times, on loopback): a guess, until _read_greeting says which
        if keyed:
            return ("it closed the connection in the CURVE handshake: most likely it runs with another "
                    "coordinator key pair, or without --keys"), False
        return "it closed the connection in the handshake: most likely it runs with --keys", False
    return f"the handshake failed ({errno.errorcode.get(value, value)})", False


def _mechanism_mismatch(keyed: bool) -> str:
    """What another coordinator with the other security mechanism than this one's is."""
    return ("it runs without --keys and this coordinator with them" if keyed
            else "it runs with --keys and this coordinator without them")


def _closed_because(theirs: str, keyed: bool) -> str:
    """Why another coordinator closed this one's handshakes, from the mechanism its
    greeting names (:func:`swarm.transport.zmtp_mechanism`); "" where it named none."""
    if theirs not in ("NULL", "CURVE"):
        return ""
    if theirs != ("CURVE" if keyed else "NULL"):
        return _mechanism_mismatch(keyed)
    if keyed:   # both have keys, and it could not open our hello: sealed for another key
        return "it closed the connection in the CURVE handshake: most likely it runs with another coordinator key pair"
    return "it closed the connection in the handshake, though it runs without --keys as this one does"


class Coordinator:
    """Membership table, failure detector and view publisher.

    In a coroutine::

        async with Coordinator(bind="tcp://127.0.0.1:5555") as coord:
            await coord.closed()      # serve until close() or a failure
    """

    def __init__(self, config: CoordinatorConfig | None = None, *,
                 context: zmq.asyncio.Context | None = None, limits: Limits | None = None,
                 name: str = "coordinator", **overrides: Any) -> None:
        cfg = config or CoordinatorConfig()
        try:
            cfg = replace(cfg, **overrides)
        except TypeError as e:
            raise SwarmError(f"unknown Coordinator option: {e}") from None
        # the checks a config file gets (a NaN tick_s or a zero max_members got through)
        cfg = from_dict(CoordinatorConfig, to_dict(cfg), prefix="coordinator")
        self.config = cfg
        self.name = name
        self.limits = limits or Limits(max_header_bytes=1024 * 1024, max_message_bytes=4 * 1024 * 1024)
        lim = self.limits
        self._keep_frames = tp.keep_frames(lim)
        # the heartbeat fast path unpacks under the same limits as wire.decode
        self._max_header = min(lim.max_header_bytes, lim.max_message_bytes)
        self.table = MemberTable(max_members=cfg.max_members, max_view_bytes=self._view_room(name))
        self.address = ""
        self.started = 0.0
        self.malformed = 0
        self.heartbeats = 0        # heartbeats received from members (for the achieved rate)
        self._own_ctx = context is None
        self._ctx = context or zmq.asyncio.Context(io_threads=1)
        self._router: zmq.asyncio.Socket | None = None
        self._plain: zmq.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._events: zmq.Socket | None = None
        #: fd of a connection → {id: the route it had on that connection}: a close probes
        #: every id that still has that route (one connection may carry many ids)
        self._fds: dict[int, dict[str, bytes]] = {}
        #: (id, route) of closed connections, to probe once the messages read with the
        #: close are handled (_recv_loop), and when the first of them was queued. Keys of
        #: a dict, in the order read: a join under one of those ids looks its own up
        self._closing: dict[tuple[str, bytes], None] = {}
        self._closing_at = 0.0
        #: fd → routes of the connection that closed on it (None: none known, no id nor status), for
        #: the closes read while the router may still hold messages of theirs (a join and
        #: the close read in one wake-up): an id mapped on such an fd, with one of those
        #: routes or any where none was known, is probed with the closes (_map_fd)
        self._closed_fds: dict[int, set[bytes] | None] = {}
        #: fd → the route of the last status request on it: the close of a connection that
        #: only asked (a `swarm status`) then names its route, and a member whose new
        #: connection takes its fd in the same batch is not probed for it
        self._askers: dict[int, bytes] = {}
        self._dirty = False
        self._grace_until = 0.0
        self._nonce = itertools.count(1)
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._bad = tp.BadInput(name)
        self._curve: tp.Curve | None = None
        self._key = ""
        # failover between coordinators: only the active one hands out views
        self.mode = "standby" if cfg.others else "active"
        self._others: dict[str, dict[str, Any]] = {}
        self._watch: dict[str, zmq.asyncio.Socket] = {}   # a DEALER to each of the others
        self._watch_monitors: dict[str, zmq.asyncio.Socket] = {}
        self._held_back = False      # logged that a failed handshake keeps this standby from taking over
        self._probes: set[asyncio.Task[None]] = set()   # greetings read for a close's cause
        self._alone_warned: set[str] = set()
        # ranks coordinators of equal address: hosts that each bind tcp://0.0.0.0:5555 all
        # report that address, and would each find themselves the lowest
        self._token = os.urandom(8).hex()
        self._no_active_since = 0.0
        #: when this one's loops last ran (_check_stall), and when one that was active found
        #: that they had stalled (frozen, swapped out): for probe_timeout_s, and until the others
        #: have answered since, it neither probes nor declares deaths, and with others it
        #: publishes no view either (0.0: not held)
        self._ran_at = 0.0
        self._stalled_at = 0.0
        self._thawed_at = 0.0   # when it last found its loops had stalled (held or not)
        #: the others whose first connection attempt has not yet ended: its handshake
        #: neither succeeded nor failed, its connect neither made nor refused nor timed out
        self._first_dials: set[str] = set()
        self._last_publish = 0.0
        self._forgot = 0.0
        self._scanned = 0.0
        self._suspects: set[str] = set()
        #: the second of death lines under way (DEATH_LINES_PER_S): when it began, the lines
        #: logged in it, and the deaths counted past them
        self._deaths_since = 0.0
        self._deaths_logged = 0
        self._deaths_unlogged = 0
        self._published_at: dict[int, float] = {}
        self._http: StatusServer | None = None
        self._view_cache: tuple[Any, list[Any] | None] | None = None
        self._view_addrs: tuple[Any, dict[str, str]] | None = None
        #: the last status reply: (built at, what it was built of, frames), and what it cost
        self._status_cache: tuple[float, tuple[Any, ...], list[Any]] | None = None
        self._status_cost = 0.0
        self.http_url = ""

    async def __aenter__(self) -> "Coordinator":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        cfg = self.config
        self._router = tp.router(self._ctx, limits=self.limits, hwm=10_000,
                                 heartbeat_s=cfg.zmtp_heartbeat_s, heartbeat_timeout_s=cfg.zmtp_timeout_s)
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            if cfg.keys_dir:
                self._curve = tp.Curve(cfg.keys_dir, cfg.key_name)
                self._curve.start(self._ctx)
                self._curve.server(self._router)
            self.address = tp.bind(self._router, cfg.bind, "coordinator.bind")
            for addr in cfg.others:   # a bad address fails here, before anyone is told we are up
                # ZMTP heartbeats, as a peer's coordinator connection has: a connection whose
                # state a partition lost (a NAT or firewall that dropped the flow) was kept open
                # for good, and two active coordinators never heard each other again
                d = tp.dealer(self._ctx, limits=self.limits, hwm=4, immediate=True, connect_timeout_s=CONNECT_TIMEOUT_S,
                              heartbeat_s=cfg.zmtp_heartbeat_s, heartbeat_timeout_s=cfg.zmtp_timeout_s)
                d.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_TIMEOUT_S * 1000))
                self._watch[addr] = d
                if self._curve is not None:
                    self._curve.client(d, self._curve.coordinator_public)
                self._watch_monitors[addr] = d.get_monitor_socket(_WATCH_EVENTS)
                tp.connect(d, addr)
        except BaseException:
            # whatever failed (a bad address, Ctrl-C, a caller's deadline), what was made is
            # closed: left open, the context's __del__ hung the process at the next gc
            self._shutdown()
            raise
        self._plain = tp.shadow(self._router)
        self._events = tp.shadow(self._monitor)
        if cfg.http_bind:
            try:
                self._http = StatusServer(self, cfg.http_bind, run=cfg.run_name)
                await self._http.start()
            except BaseException:   # as above; a cancel (a deadline, a TaskGroup) is one too
                if self._http._server is not None:   # listening already: no client yet to wait for
                    self._http._server.close()
                self._http = None
                self._shutdown()
                raise
            self.http_url = self._http.url
        self.started = self._ran_at = time.monotonic()
        self._grace_until = self.started + cfg.rejoin_grace_s
        self._runner = asyncio.create_task(self._run(), name="coordinator")
        log.info("coordinator listening on %s", self.address)

    async def closed(self) -> None:
        """Wait until the coordinator stops; re-raise its failure if it had one."""
        if self._runner is not None:
            await asyncio.shield(self._runner)
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        """Stop the loops (cancelled if they take more than 2 s), close the status page,
        the sockets and the context; re-raise the coordinator's failure if it had one.

        The sockets and the context are closed whatever the loops ended with and also
        when this task is cancelled or interrupted meanwhile (which then goes on up):
        left open, the context's ``__del__`` hung the process at the next gc."""
        self._stop.set()
        try:
            if self._runner is not None and not self._runner.done():
                # asyncio.wait, not an await of the runner: that raised what it ended with
                await asyncio.wait([self._runner], timeout=2.0)
                if not self._runner.done():
                    self._runner.cancel()
            for probe in list(self._probes):
                probe.cancel()
            if self._http is not None:
                await self._http.close()
        finally:
            self._shutdown()
        if self._failure is not None:
            raise self._failure

    def _shutdown(self) -> None:
        for s in (self._monitor, self._router, *self._watch_monitors.values(), *self._watch.values()):
            if s is not None:
                s.close(0)
        self._monitor = self._router = None
        self._watch.clear()
        self._watch_monitors.clear()
        if self._curve is not None:
            self._curve.stop()
            self._curve = None
        if self._own_ctx:
            self._ctx.term()
            self._own_ctx = False

    async def _run(self) -> None:
        loops = [self._recv_loop(), self._tick_loop()]
        if self.config.others:
            loops.append(self._watch_loop())
        if self._http is not None:
            loops.append(self._http.run())
        # cancelled with no close() (a program that never closed it): its sockets go at once
        self._failure = await supervise(loops, self._stop, on_cancel=self._shutdown)
        if self._failure is not None:
            log.error("coordinator failed: %r", self._failure)

    # ------------------------------------------------------------- sending

    def _send(self, route: bytes, t: str, body: dict[str, Any]) -> bool:
        frames = [route] + wire.encode(t, self.name, epoch=self.table.epoch, body=body)
        return tp.try_send(self._plain, frames)

    @staticmethod
    def _view_room(name: str) -> int:
        """Bytes a view's member entries may take: a view message under VIEW_LIMITS, less
        its envelope at the largest epochs (and an array header of the longest form)."""
        top = 2**63 - 1
        envelope = len(wire.encode("view", name, epoch=top, body={"epoch": top, "members": []})[0]) + 4
        return min(VIEW_LIMITS.max_header_bytes, VIEW_LIMITS.max_message_bytes) - envelope

    def _encode_view(self, body: dict[str, Any], epoch: int) -> list[Any]:
        """A view message (whole or a change) as frames that every send shares: one buffer
        for all routes, not a copy per send. Raises WireError past VIEW_LIMITS."""
        return tp.shared(wire.encode("view", self.name, epoch=epoch, body=body, limits=VIEW_LIMITS))

    def _view_frames(self) -> list[Any] | None:
        """The current view, encoded once per view: at 1,000 members it is tens of
        kB, and lagging peers ask for it again on every heartbeat. None if it cannot
        be encoded (logged once per view): the coordinator goes on without sending it
        rather than end. Admission keeps views within VIEW_LIMITS (see _view_room)."""
        view = self.table.view
        if self._view_cache is None or self._view_cache[0] is not view:
            try:
                frames: list[Any] | None = self._encode_view(view.to_wire(), view.epoch)
            except WireError as e:
                log.error("epoch %d: the view of %d members cannot be encoded, so it is not sent: %s",
                          view.epoch, len(view.members), e)
                frames = None
            self._view_cache = (view, frames)
        return self._view_cache[1]

    def _listed(self, peer_id: str, addr: str) -> bool:
        """Whether the current view lists ``peer_id`` at ``addr``: a dict built once per
        view, where a scan of the view for every join made a join storm quadratic."""
        view = self.table.view
        if self._view_addrs is None or self._view_addrs[0] is not view:
            self._view_addrs = (view, {m.id: m.addr for m in view.members})
        return self._view_addrs[1].get(peer_id) == addr

    def _send_view(self, route: bytes) -> None:
        """The whole current view to one route (a joiner, a lagging member)."""
        frames = self._view_frames()
        if frames is not None:
            tp.try_send(self._plain, [route] + frames)

    def _publish(self) -> None:
        self._dirty = False
        base = self.table.view
        # whether the members got the previous view (it may not have encoded): a change
        # from one they never had would be of no use to them
        base_sent = self._view_cache is not None and self._view_cache[0] is base and self._view_cache[1] is not None
        view = self.table.publish()
        self._last_publish = time.monotonic()
        self._published_at[view.epoch] = self._last_publish
        if len(self._published_at) > 4096:
            for e in sorted(self._published_at)[:2048]:
                del self._published_at[e]
        full = self._view_frames()
        # members that held the previous view get only the change (a few bytes instead
        # of the whole list); those that joined since get the whole view. A change too
        # large for a message (the list and the ids that left) goes as the whole view
        delta = None
        if base.epoch and base_sent and full is not None:
            try:
                delta = self._encode_view(view.delta(base), view.epoch)
            except WireError:
                pass
        had = {m.id for m in base.members}
        sent: set[tuple[bytes, bool]] = set()
        for m in self.table.alive():
            use_delta = delta is not None and m.id in had
            frames = delta if use_delta else full
            # one message of each kind per connection: ids that share a route (one client
            # joining many) get one copy, not one per id
            if frames is not None and (m.route, use_delta) not in sent:
                sent.add((m.route, use_delta))
                tp.try_send(self._plain, [m.route] + frames)
        log.info("epoch %d: %d members", view.epoch, len(view.members))

    def _publish_due(self, now: float) -> bool:
        """Publish changes at once in a small swarm; a large one gets at most one view
        per ~0.1 ms × members (0.1 s at 1,000), so a join storm is not a view storm."""
        if not self._dirty or self.mode != "active" or now < self._grace_until:
            return False
        if self._stalled_at and self.config.others:   # a standby may have taken over (_check_stall)
            return False
        return now - self._last_publish >= min(0.1, 1e-4 * len(self.table.view.members))

    def _probe(self, pid: str, cause: str) -> None:
        m = self.table.get(pid)
        if m is None or m.state == DEAD:
            return
        nonce = next(self._nonce)
        if not self._send(m.route, "probe", {"nonce": nonce}):
            # the route is gone: the connection closed, nobody is there to answer
            self._declare_dead(pid, cause, "the probe found its connection closed")
            return
        if m.state == ALIVE:
            m.state = SUSPECT
            m.probe_deadline = time.monotonic() + self.config.probe_timeout_s
            m.cause = cause
            self._suspects.add(pid)
        m.probe_nonce = nonce

    def _declare_dead(self, pid: str, cause: str, how: str) -> None:
        """Mark member ``pid`` dead of ``cause`` (what the table records and status shows),
        found out ``how``, and log it at WARNING: once per death, up to DEATH_LINES_PER_S
        lines a second. Its peers log only the new epoch, so a live member taken for dead
        (a slow link, a loaded host) showed nowhere but in `swarm status`."""
        if not self.table.mark_dead(pid, cause):
            return
        self._dirty = True
        self._count_deaths(time.monotonic())
        if self._deaths_logged < DEATH_LINES_PER_S:
            self._deaths_logged += 1
            # the id is a sender's: shown cut and escaped; the cause is ours (a suspecter's
            # id is a member's, printable since its join) but may be long
            log.warning("member %s declared dead: %s (%.160s)", wire.shown(pid), how, cause)
        else:
            self._deaths_unlogged += 1

    def _count_deaths(self, now: float) -> None:
        """Begin a new second of death lines once one has passed, logging how many deaths
        the last one counted past DEATH_LINES_PER_S."""
        if now - self._deaths_since < 1.0:
            return
        if self._deaths_unlogged:
            log.warning("%d more members declared dead in %.1f s, not logged one by one: `swarm status` "
                        "lists each with its cause", self._deaths_unlogged, now - self._deaths_since)
        self._deaths_since, self._deaths_logged, self._deaths_unlogged = now, 0, 0

    # ------------------------------------------------------------- receiving

    async def _recv_loop(self) -> None:
        """Wake on readiness, then drain both sockets with non-blocking receives.

        The wait is a one-shot reader on the sockets' ZMQ_FDs (no per-wake-up
        poller objects). ZMQ_FD is edge-triggered with respect to messages, so
        the sockets' EVENTS are checked before every wait, and the readers are
        armed only while waiting: the FD stays readable until libzmq processes
        its commands, and a level-triggered reader left armed during the
        batching pause below would spin the loop.
        """
        loop = asyncio.get_running_loop()
        router, mon = self._plain, self._events
        fds = (router.getsockopt(zmq.FD), mon.getsockopt(zmq.FD))
        pollin = zmq.POLLIN
        while True:
            self._check_stall(time.monotonic())
            self._read_closes()
            n = self._drain_router() if router.getsockopt(zmq.EVENTS) & pollin else 0
            # probed after the messages: what a member sent before its connection closed (a
            # leave, from one that stopped waiting for its bye) is read first, as it came,
            # also behind more than a batch of others' (under a flood, after 1 s at most).
            # An id that has moved to another connection since is not probed: it is there
            drained = n < tp.DRAIN_BATCH
            if self.mode != "active":
                self._closing.clear()   # a standby serves no members: their closes are another's to probe
            if self._closing and not self._stalled_at and (drained or time.monotonic() - self._closing_at > 1.0):
                closing, self._closing = self._closing, {}
                for pid, route in closing:
                    m = self.table.get(pid)
                    if m is not None and m.route == route:
                        self._probe(pid, "disconnected")
                if not drained:
                    # a flood that is never drained: the closed connections' messages still
                    # queued go unattributed (heartbeat timeout), but _closed_fds stays bounded
                    self._closed_fds.clear()
            if drained:
                # every message sent before the closes read so far has been handled: libzmq
                # queues a connection's messages before it reports the connection's close
                self._closed_fds.clear()
            if self._publish_due(time.monotonic()):
                self._publish()
            if n >= tp.DRAIN_BATCH:
                await asyncio.sleep(0)     # more is queued: let the other tasks run, then go on
                continue
            pause = self._batch_pause(n)
            if pause:
                # A large swarm's heartbeats trickle in one by one; a short pause lets
                # them queue so that one wake-up handles many. It also keeps libzmq's
                # pipes non-empty, so its IO thread signals this thread less often.
                await asyncio.sleep(pause)
                continue
            # The FDs are edge-triggered, and a send on the router (a welcome, a view, from
            # this task or another) can take the edge of a message that came meanwhile:
            # it would then wait unread until the next message (a join got no welcome, 1
            # run in 20). So look again before waiting, and wake every 0.1 s in any case.
            if (router.getsockopt(zmq.EVENTS) | mon.getsockopt(zmq.EVENTS)) & pollin:
                continue
            fut = loop.create_future()

            def ready(fut: asyncio.Future[None] = fut) -> None:
                if not fut.done():
                    fut.set_result(None)

            for fd in fds:
                loop.add_reader(fd, ready)
            timer = loop.call_later(0.1, ready)
            try:
                await fut
            finally:
                timer.cancel()
                for fd in fds:
                    loop.remove_reader(fd)

    def _batch_pause(self, n: int) -> float:
        """Seconds to let messages gather after a wake-up that handled ``n`` (0: wait
        for readiness). In a swarm of more than 64 members, while messages keep
        coming, the socket is drained at most 100 times a second: up to 10 ms of
        latency on a join or leave, for a several-fold cut in wake-ups (at 1,000
        members, 40 heartbeats a wake-up instead of one or two). Members are the
        view's: the table also keeps up to MAX_DEAD dead records, which send nothing."""
        if n == 0 or len(self.table.view.members) <= 64:
            return 0.0
        return 0.01

    def _drain_router(self) -> int:
        """Handle up to DRAIN_BATCH queued messages for up to DRAIN_BUDGET_S; return how
        many, or DRAIN_BATCH when the time ran out first (more may be queued)."""
        recv = self._plain.recv
        now = time.monotonic()    # one clock reading per batch: they all arrived within ms
        fast = self._fast_heartbeat if self.mode == "active" else None
        clock, until = time.monotonic, now + DRAIN_BUDGET_S
        for n in range(tp.DRAIN_BATCH):
            if n and clock() > until:
                return tp.DRAIN_BATCH
            try:
                route = recv(_NOBLOCK)                 # a ROUTER always delivers the routing id first
            except zmq.Again:
                return n
            frame = recv(_NOBLOCK, copy=False)
            if frame.more:                             # arrays or junk: the general path
                # past what the limits allow, read and dropped (decode refuses the message):
                # a Frame object per frame of millions of empty ones took ~1 GiB and ~6 s
                self._on_message(route, tp.recv_rest(recv, frame, self._keep_frames), now)
            elif fast is None or not fast(route, frame, now):
                self._on_message(route, [frame], now)
        return tp.DRAIN_BATCH

    def _fast_heartbeat(self, route: bytes, frame: zmq.Frame, now: float) -> bool:
        """Handle a well-formed heartbeat without building a Message; False if it is not one.

        A pure accelerator for the one message that arrives 4 times a second from
        every member: it accepts only what wire.decode would accept, and anything
        else (another type, a malformed header) goes the general way, which
        decodes it again and reports what was wrong.
        """
        buf = frame.buffer
        if buf.nbytes > self._max_header:
            return False
        try:
            h = wire.unpack_header(buf, self.limits)
        except WireError:
            return False
        if type(h) is not dict or h.get("t") != "heartbeat" or h.get("v") != wire.VERSION:
            return False
        src, epoch, body = h.get("src"), h.get("epoch", 0), h.get("body", {})
        if (type(src) is not str or not src or len(src) > 256 or type(epoch) is not int
                or type(h.get("seq", 0)) is not int or type(body) is not dict or h.get("arrays", []) != []):
            return False
        inc = body.get("inc")
        if type(inc) is not int:
            return False
        self._heartbeat(route, src, epoch, inc, body.get("stats"), frame, now)
        return True

    def _read_closes(self) -> None:
        """Take every disconnect the monitor has queued: the ids of each closed connection
        wait in ``_closing`` to be probed. The fds are forgotten at once: libzmq reports a
        disconnect before it closes the fd, so once the queue is read, a connection that
        gets one of those fds back has a mapping no queued disconnect can take (_map_fd).
        Each closed fd is kept in ``_closed_fds`` until the router is drained: messages the
        connection sent before it closed may still be queued behind the close."""
        mon = self._events
        while mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            for frames in tp.drain(mon):
                ev = parse_monitor_message([f.bytes for f in frames])
                if ev["event"] != zmq.EVENT_DISCONNECTED:
                    continue
                fd = int(ev["value"])
                ids = self._fds.pop(fd, None)
                known = set(ids.values()) if ids else set()
                if (asker := self._askers.pop(fd, None)) is not None:
                    known.add(asker)
                routes = self._closed_fds.get(fd, set())
                self._closed_fds[fd] = None if not known or routes is None else routes | known
                if ids:
                    if not self._closing:
                        self._closing_at = time.monotonic()
                    self._closing.update(dict.fromkeys(ids.items()))

    def _map_fd(self, pid: str, route: bytes, frame: zmq.Frame) -> None:
        """Remember that ``pid`` speaks on ``route``, the connection ``frame`` came on, so
        that its close probes ``pid``. The queued disconnects are read first: one of them
        may be of an earlier connection with the same fd, which closed in this batch. A
        message that came on a closed connection (a join read with its close) queues
        ``pid`` to be probed as the close's own ids are."""
        self._read_closes()
        fd = tp.srcfd(frame)
        self._fds.setdefault(fd, {})[pid] = route
        routes = self._closed_fds.get(fd, set())
        if routes is None or route in routes:
            # sent on a connection whose close was read before this message: its ids are
            # probed once the batch is handled. Where the closed one's route is not known (it
            # sent no id and no status), this may be a new connection that got its fd: then
            # the probe is answered
            if not self._closing:
                self._closing_at = time.monotonic()
            self._closing[(pid, route)] = None

    def _join_waits(self, pid: str, inc: int) -> bool:
        """Whether a join of ``pid`` as incarnation ``inc`` waits: another incarnation holds
        the id, alive, on a connection whose close has been read (its probe due or out).
        Due, it is probed now, not again by the receive loop: where libzmq has dropped the
        route already the send fails, the holder is declared dead at once and the join
        goes on."""
        old = self.table.get(pid)
        if old is None or old.state == DEAD or old.incarnation == inc:
            return False
        self._read_closes()
        if (pid, old.route) in self._closing:
            del self._closing[(pid, old.route)]
            self._probe(pid, "disconnected")
        elif not (old.state == SUSPECT and old.cause == "disconnected"):
            return False
        return old.state != DEAD

    def _forget_fds(self) -> None:
        """Drop the fd entries of ids that are dead, forgotten or on another connection: a
        close would probe none of them, and a connection that joins id after id (a client
        of many, a hostile one) would otherwise grow its entry as long as it stays open."""
        for fd, ids in list(self._fds.items()):
            for pid, route in list(ids.items()):
                m = self.table.get(pid)
                if m is None or m.state == DEAD or m.route != route:
                    del ids[pid]
            if not ids:
                del self._fds[fd]

    def _on_message(self, route: bytes, frames: list[zmq.Frame], now: float) -> None:
        try:
            msg = wire.decode(frames, self.limits)
            self._key = tp.user_id(frames[-1]) if self._curve is not None else ""
            self._handle(route, msg, frames[-1], now)
        except WireError as e:
            self.malformed += 1
            self._bad(route, e, tp.peer_address(frames[-1]))

    def _from_member(self, rec: MemberRecord, frame: zmq.Frame) -> bool:
        """Whether a message about live member ``rec`` came from the CURVE key it joined
        with (always true without keys). Its incarnation cannot serve: status shows it."""
        return self._curve is None or tp.user_id(frame) == rec.key

    def _heartbeat(self, route: bytes, src: str, epoch: int, inc: int, stats: Any, frame: zmq.Frame,
                   now: float) -> None:
        rec = self.table.get(src)
        if rec is not None and rec.state != DEAD and not self._from_member(rec, frame):
            # the fast path calls this outside _on_message: count and log it here
            self.malformed += 1
            self._bad(route, WireError(f"heartbeat for {src!r} from a CURVE key that is not the member's"),
                      tp.peer_address(frame))
            return
        if rec is None or rec.state == DEAD or rec.incarnation != inc:
            self._send(route, "rejoin", {})
            return
        if route != rec.route:   # a new connection (the peer reconnected): map its fd
            rec.route = route
            self._map_fd(src, route, frame)
        rec.last_heartbeat = now
        self.heartbeats += 1
        if rec.state == SUSPECT:
            rec.state, rec.cause = ALIVE, ""
        # peers send their figures on some heartbeats only (once a second); the others
        # are bare liveness beats and the last figures stay
        _keep_stats(rec, stats, now)
        if (epoch < self.table.view.epoch and now >= self._grace_until and now - rec.view_sent > 0.25
                and now - self._published_at.get(epoch + 1, 0.0) > 0.2):
            # a lagging peer (it missed a delta, not a heartbeat that crossed the newest
            # view on the wire): the full view, at most 4 times a second
            rec.view_sent = now
            self._send_view(route)

    def _handle(self, route: bytes, msg: wire.Message, frame: zmq.Frame, now: float) -> None:
        t, body, src = msg.t, msg.body, msg.src
        if t == "status":
            brief = body.get("brief") is True
            # Closes first (as _map_fd): a request read after its own connection's close would
            # leave an entry no later close pops, naming a route a new connection's fd is not
            self._read_closes()
            fd = tp.srcfd(frame)
            if fd not in self._closed_fds:
                self._askers[fd] = route
            if brief and not self.config.others:
                self._watched_alone(body.get("from"))
            if brief:
                self._send(route, "status_reply", self.brief())
            else:
                tp.try_send(self._plain, [route] + self._status_frames(src))
            return
        if self.mode != "active":
            # a standby hands out nothing; the peer tries its next coordinator address
            self._send(route, "standby", {"epoch": self.table.epoch})
            return
        if t == "join":
            try:
                rank, inc, last = _int(body, "rank", -1), _int(body, "inc"), _int(body, "last_epoch", 0)
                was = _int(body, "was", -1)   # a rejoin's old rank, when it asks for none
                if last > MAX_LAST_EPOCH:
                    # taken as the table's epoch: one more, over 64 bits, could not be sent
                    raise WireError(f"last_epoch {last} is over {MAX_LAST_EPOCH}")
            except WireError as e:
                # malformed as any bad message (counted, logged), and answered as a bad addr
                # is: the joiner learns why instead of waiting out its join timeout
                self._send(route, "refuse", {"reason": f"malformed join: {e}"})
                raise
            addr = body.get("addr")
            why = tp.dial_address_error(addr)
            if why:
                # neighbours dial it: in the view, a junk address fails the link in each of them
                self.malformed += 1
                self._bad(route, WireError(f"join of {src!r}: addr {why}"), tp.peer_address(frame))
                self._send(route, "refuse", {"reason": f"addr {why}; a peer must advertise an address "
                                                       "its neighbours can connect to (peer.advertise)"})
                return
            if not src.isprintable():
                # every member logs the ids in its views: a line break in one forged log lines
                self.malformed += 1
                self._bad(route, WireError(f"join of {src!r}: the id is not printable"), tp.peer_address(frame))
                self._send(route, "refuse", {"reason": f"peer id {src!r} holds characters that are not "
                                                       "printable (line breaks, control characters)"})
                return
            if self._join_waits(src, inc):
                # a process restarted under its id, its join read with (or just after) the
                # close of its predecessor's connection: refused as a duplicate of a member
                # that is gone, it failed for good. The joiner asks again every 0.25 s, and is
                # answered once the probe has settled whether the other one is gone
                return
            try:
                # with CURVE, the key a peer is known by is the one it authenticated with
                rec = self.table.join(src, addr, rank, inc, route, last_epoch=last, now=now, key=self._key,
                                      replace=body.get("replace") is True, was=was)
            except MembershipError as e:
                self._send(route, "refuse", {"reason": str(e)})
                return
            self._map_fd(src, route, frame)
            self._send(route, "welcome", {"rank": rec.rank, "epoch": self.table.epoch})
            if self._listed(src, addr) and self.table.epoch == self.table.view.epoch:
                self._send_view(route)
            else:
                # new to the view, or a member's repeated join named a later epoch than the
                # view's (another coordinator served it since): the view it holds is newer
                # than ours, so everyone gets a new one above it
                self._dirty = True
            return
        if t == "heartbeat":
            self._heartbeat(route, src, msg.epoch, _int(body, "inc"), body.get("stats"), frame, now)
            return
        rec = self.table.get(src)
        if rec is None or rec.state == DEAD:
            if t in ("linked", "suspect", "probe_ack"):
                self._send(route, "rejoin", {})
            elif t == "leave":
                self._send(route, "bye", {})
            return
        if not self._from_member(rec, frame):
            raise WireError(f"{t} for {src!r} from a CURVE key that is not the member's")
        if t in ("suspect", "linked") and route != rec.route:
            # only the member's own connection may speak for it (a spoofed src cannot)
            raise WireError(f"{t} for {src!r} from a connection that is not the member's")
        if t == "leave":
            if _int(body, "inc") != rec.incarnation:
                raise WireError(f"leave for {src!r} with a foreign incarnation")
            # its final figures (a peer of an older release sends none): the last
            # heartbeat's may be a second old, and none follows
            _keep_stats(rec, body.get("stats"), now)
            if self.table.mark_dead(src, "left"):
                self._dirty = True
            self._send(route, "bye", {})
        elif t == "suspect":
            target = _str(body, "id")
            # Not while a stall holds (no probes then, _check_stall): a swarm stopped together
            # (Ctrl-Z on swarm run) thaws with its links timed out, and each suspect's probe
            # found the old connection closed and declared a live member dead before its
            # re-join on the new one was read. One dead indeed fails its heartbeats after.
            if target != src and (m := self.table.get(target)) is not None and m.state == ALIVE \
                    and not self._stalled_at:
                self._probe(target, f"suspected by {src}")
        elif t == "probe_ack":
            if 0 < _int(body, "nonce") <= rec.probe_nonce and _int(body, "inc") == rec.incarnation:
                if route != rec.route:   # answered on a new connection: its close is the member's now
                    rec.route = route
                    self._map_fd(src, route, frame)
                rec.last_heartbeat = now
                if rec.state == SUSPECT:
                    rec.state, rec.cause = ALIVE, ""
        elif t == "linked":
            e = _int(body, "e")
            if e > rec.linked_epoch:
                rec.linked_epoch, rec.linked_at = e, time.time()
        else:
            raise WireError(f"message type {t!r} is not for the coordinator")

    # ------------------------------------------------------------- timers

    def _check_stall(self, now: float) -> None:
        """Notice that this one's loops did not run (a frozen process, a swapped-out host)
        for more than ``zmtp_timeout_s``, after which its members drop their connections
        to it (its ZMTP heartbeats' TTL), or ``takeover_s``, after which a standby may have
        taken over, by its own clock, which every loop reads first. The members' silence
        in that time was not theirs: their heartbeat and probe deadlines move on by it,
        and an active one holds (no probes, no deaths; with other coordinators no views
        either) until :meth:`_hold_over`. A lone one publishes meanwhile: a join is not
        held up by a hiccup of its loops past ``zmtp_timeout_s``.
        Without the hold, the closes of their old connections, read at the thaw, were
        probed at once, found the routes gone, and live members were declared dead before
        their re-joins on the new connections were read (views without them went out,
        every peer re-linked); with other coordinators, every member that had moved to a
        standby was, and an empty view took the swarm back on a tie of epochs."""
        gap, self._ran_at = now - self._ran_at, now
        if self._stalled_at and self._hold_over(now):
            self._stalled_at = 0.0
        if gap <= min(self.config.zmtp_timeout_s, self.config.takeover_s):
            return
        self._thawed_at = now
        for m in self.table.members.values():
            m.last_heartbeat += gap
            m.probe_deadline += gap
        held = ""
        if self.mode == "active":
            self._stalled_at = now
            held = (f"; its members have {self.config.probe_timeout_s:g} s (probe_timeout_s) to come back on "
                    "new connections before it probes them")
            if self.config.others:
                held += ", and it asks the other coordinators before it serves again"
        log.warning("coordinator %s: its loops did not run for %.1f s (a stopped process or an overloaded host)%s",
                    self.address, gap, held)

    def _hold_over(self, now: float) -> bool:
        """Whether the hold that a stall began (``_stalled_at``) is over: the members whose
        connections closed while this one stalled have had a probe's time
        (``probe_timeout_s``) to speak on their new ones, and each other coordinator has
        answered since (and :meth:`_decide` has weighed it) or stayed silent ``takeover_s``.
        A lone coordinator waits only the first."""
        held = now - self._stalled_at
        return held >= self.config.probe_timeout_s and (
            held >= self.config.takeover_s or all(o["seen"] > self._stalled_at for o in self._others.values()))

    async def _tick_loop(self) -> None:
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.tick_s)
            now = time.monotonic()
            self._check_stall(now)
            self._count_deaths(now)
            if self.mode != "active" or self._stalled_at:
                continue
            if now - self._scanned >= min(0.25, cfg.heartbeat_timeout_s / 10):
                # silent members: a scan of the whole table, a few times a second
                self._scanned = now
                for m in list(self.table.members.values()):
                    if m.state == ALIVE and now - m.last_heartbeat > cfg.heartbeat_timeout_s:
                        self._probe(m.id, "heartbeat timeout")
            for pid in list(self._suspects):   # suspects: every tick
                m = self.table.get(pid)
                if m is None or m.state != SUSPECT:
                    self._suspects.discard(pid)
                elif now > m.probe_deadline:
                    self._suspects.discard(pid)
                    self._declare_dead(m.id, m.cause or "probe timeout",
                                       f"no answer to a probe within {cfg.probe_timeout_s:g} s")
                else:
                    # probe again: libzmq drops the route of a closed connection
                    # a moment after reporting it, and then the send fails at once
                    self._probe(m.id, m.cause)
            if self._publish_due(now):
                self._publish()
            if now - self._forgot > 1.0:
                self._forgot = now
                self.table.forget_dead()
                self._forget_fds()

    # ------------------------------------------------------------- status

    def brief(self) -> dict[str, Any]:
        """What other coordinators need to decide who is active. ``watches``: how many
        other coordinators this one watches; one that watches none never stands by. ``members``:
        how many it serves (of two active ones, one that serves some stays)."""
        return {"coordinator": self.address, "epoch": self.table.epoch, "mode": self.mode,
                "watches": len(self.config.others), "token": self._token, "members": self.table.live()}

    def _watched_alone(self, asker: Any) -> None:
        """Another coordinator watches this one, which watches none: say so once per asker
        (at most 16: the address comes off the wire)."""
        who = asker if isinstance(asker, str) and 0 < len(asker) <= 256 else "another coordinator"
        if who in self._alone_warned or len(self._alone_warned) >= 16:
            return
        self._alone_warned.add(who)
        log.warning("coordinator %s: %r watches this coordinator, but this one was started without --others, "
                    "so it never stands by: %r stands by for it instead; for failover both ways give this one "
                    "--others too", self.address, who, who)

    async def _watch_loop(self) -> None:
        """Watch the other coordinators; take over or step down (fenced by epoch)."""
        socks = {addr: tp.shadow(d) for addr, d in self._watch.items()}   # connected by start()
        monitors = {addr: tp.shadow(m) for addr, m in self._watch_monitors.items()}
        for addr in socks:
            # handshake: why the last attempt to reach it failed its handshake ("" if it did not);
            # silent: why it is taken as down although no attempt was refused (its handshake or
            # its connect timed out), and after_silent: which of the two, for the log once it answers;
            # dialed: whether the attempt under way got as far as a connect
            self._others[addr] = {"seen": 0.0, "epoch": 0, "mode": "?", "name": addr, "token": "", "members": None, "lost": False,
                                  "watches": 1, "handshake": "", "silent": "", "after_silent": "", "dialed": False,
                                  "dialing_at": 0.0, "connected_at": 0.0, "redial_at": 0.0}
        self._first_dials = set(socks)
        cfg = self.config
        while True:
            # an answer is as fresh as the request it answers: one read after a stall (this
            # process frozen) may have waited in the socket since before it
            asked = time.monotonic()
            self._check_stall(asked)
            for d in socks.values():
                tp.try_send(d, wire.encode("status", self.name, body={"brief": True, "from": self.address}))
            await asyncio.sleep(0.1)
            now = time.monotonic()
            self._check_stall(now)
            for addr, d in socks.items():
                o = self._others[addr]
                for frames in tp.drain(monitors[addr]):
                    self._on_watch_event(addr, o, parse_monitor_message([f.bytes for f in frames]), now)
                if o["redial_at"] and now >= o["redial_at"]:
                    o["redial_at"] = 0.0
                    try:
                        d.disconnect(addr)
                    except zmq.ZMQError:
                        pass
                    tp.connect(d, addr)
                answered = False
                for frames in tp.drain(d):
                    try:
                        b = wire.decode(frames, self.limits).body
                        watches = b.get("watches", 1)   # a coordinator from before the field watches
                        epoch = _int(b, "epoch")
                        if not 0 <= epoch <= MAX_LAST_EPOCH:
                            # followed, it would be this one's epoch: past 64 bits no view could go out
                            raise WireError(f"epoch {epoch} of another coordinator is not in 0..{MAX_LAST_EPOCH}")
                        members = _int(b, "members") if "members" in b else None   # None: from before the field
                        o.update(seen=asked, epoch=epoch, mode=str(b.get("mode")),
                                 name=str(b.get("coordinator", addr)), token=str(b.get("token", "")),
                                 watches=watches if type(watches) is int else 1, members=members)
                        answered = True
                    except WireError as e:
                        self._bad(addr, e)
                if answered and o["handshake"]:
                    self._handshake_cleared(addr, o, "it answers")
                if answered:
                    o["lost"] = False
                elif o["seen"] and not o["lost"] and now - max(o["seen"], self._thawed_at) >= cfg.takeover_s:
                    # (silence while this one was stalled is not the other's: counted from the thaw)
                    o["lost"] = True   # logged once, until it answers again
                    log.warning("coordinator %s: coordinator %s stopped answering (its last answer %.1f s ago)",
                                self.address, addr, now - o["seen"])
            self._decide(now)

    def _on_watch_event(self, addr: str, o: dict[str, Any], ev: dict[str, Any], now: float) -> None:
        """Follow how the attempts to reach another coordinator end. A handshake that fails
        means someone is there whom this one cannot talk to: it may be up, and active."""
        event = ev["event"]
        log.debug("coordinator %s: %s: %s (value %s)", self.address, addr, zmq.Event(event).name, ev["value"])
        if addr in self._first_dials and event not in (zmq.EVENT_CONNECT_DELAYED, zmq.EVENT_CONNECTED):
            # the first attempt to reach it ended (its handshake succeeded, or it failed):
            # takeover_s counts from here (_decide)
            self._first_dials.discard(addr)
            self._no_active_since = now
        if event == zmq.EVENT_CONNECT_DELAYED:
            o["dialing_at"], o["dialed"] = now, True   # a connect under way (every attempt not answered at once)
            return
        if event == zmq.EVENT_CONNECTED:
            o["connected_at"], o["dialing_at"], o["dialed"] = now, 0.0, True
            return
        if event == zmq.EVENT_CONNECT_RETRIED:
            # an attempt ended and the next is due. One that never got to a connect: libzmq
            # could not resolve the name, and says nothing else of it (it retries every second)
            if not o["dialed"]:
                self._silent(addr, o, "has a host name that does not resolve to an IPv4 address (swarm connects "
                             "over IPv4 only): check it in --others (coordinator.others), or give the address",
                             "a name that did not resolve")
            o["dialed"] = False
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._handshake_cleared(addr, o, "the handshake succeeds")
            return
        if event == zmq.EVENT_CLOSED:
            # a connect that failed. Refused: nobody listens there. Not answered within
            # CONNECT_TIMEOUT_S (a refusal takes one round trip, or a few seconds after lost
            # SYNs): its host is gone or cut off. Either way it is down, and does not hold this
            # one back. (A watch loop stalled past the timeout reads both events at once and
            # calls a timeout a refusal: only the wording differs.)
            dialing_at, o["dialing_at"] = o["dialing_at"], 0.0
            if not dialing_at or now - dialing_at < 0.9 * CONNECT_TIMEOUT_S:
                self._handshake_cleared(addr, o, "nothing listens there")
                return
            why = f"it did not answer a connection within {CONNECT_TIMEOUT_S:g} s"
            if o["handshake"]:
                self._handshake_cleared(addr, o, why)
            self._silent(addr, o, f"{why}: its host is down or cut off (no TCP reset), or the network is "
                         f"that slow", "a connection that was not answered")
            return
        # The rest are failed handshakes. One that a dying process cut short is followed by
        # a refused connect (EVENT_CLOSED above). A frozen one's times out: it says nothing
        # about keys, and like a coordinator that does not answer, it does not hold back.
        if (event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and ev["value"] not in (errno.EPIPE, errno.ECONNRESET)
                and o["connected_at"] and now - o["connected_at"] >= HANDSHAKE_TIMEOUT_S / 2):
            self._silent(addr, o, f"it accepts connections but did not answer the handshake within "
                         f"{HANDSHAKE_TIMEOUT_S:g} s: a stopped or frozen process, or an overloaded host",
                         "a handshake that timed out")
            return
        why, gave_up = _handshake_error(event, ev["value"], keyed=self._curve is not None)
        if gave_up:
            # libzmq never dials such an address again: dial it every takeover_s, so that a
            # fixed or stopped other coordinator is seen
            o["redial_at"] = now + self.config.takeover_s
        first = not o["handshake"]
        if first or gave_up:
            o["handshake"] = why    # the precise reason over a connection closed in the handshake
        if not first:
            return
        if gave_up or ev["value"] not in (errno.EPIPE, errno.ECONNRESET):
            self._log_cannot_talk(addr, why)
            return
        # A close is a guess (libzmq reports a mechanism mismatch only when its side reads the
        # other's greeting first): read the greeting, and log once that says which it is
        probe = asyncio.get_running_loop().create_task(self._read_greeting(addr, o, why))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _read_greeting(self, addr: str, o: dict[str, Any], guess: str) -> None:
        """Say why coordinator ``addr`` closes this one's handshakes: the mechanism its
        greeting names, in place of the ``guess`` (where it still stands)."""
        precise = _closed_because(await tp.zmtp_mechanism(addr, GREETING_S), self._curve is not None)
        if self._stop.is_set() or not o["handshake"]:
            return   # closing, or it answers since
        if precise and o["handshake"] == guess:
            o["handshake"] = precise
        self._log_cannot_talk(addr, o["handshake"])

    def _log_cannot_talk(self, addr: str, why: str) -> None:
        log.error("coordinator %s cannot talk to coordinator %s: the handshake fails (%s). This one cannot "
                  "tell whether it is up and serving views, so it does not take over while this lasts. "
                  "Give every coordinator the same coordinator key pair (--keys folders from one `swarm "
                  "keys generate`, with coordinator.key in authorized/), or --keys to none",
                  self.address, addr, why)

    def _silent(self, addr: str, o: dict[str, Any], why: str, after: str) -> None:
        """Another coordinator is taken as down although nothing refused it (a timeout):
        logged once per reason, until it answers or refuses."""
        if o["silent"] != why:
            o["silent"], o["after_silent"] = why, after
            log.warning("coordinator %s: coordinator %s %s; taken as down while it does not answer",
                        self.address, addr, why)

    def _handshake_cleared(self, addr: str, o: dict[str, Any], how: str) -> None:
        if o["handshake"]:
            log.warning("coordinator %s: %s: %s, so its failed handshakes no longer hold this one back",
                        self.address, addr, how)
            # it may answer now, and be the active one: give it takeover_s to say so
            self._no_active_since = time.monotonic()
        elif o["silent"]:
            log.warning("coordinator %s: %s: %s, after %s", self.address, addr, how, o["after_silent"])
        o["handshake"], o["silent"], o["redial_at"] = "", "", 0.0

    def _decide(self, now: float) -> None:
        cfg = self.config
        live = [o for o in self._others.values() if now - o["seen"] < cfg.takeover_s]
        active = [o for o in live if o["mode"] == "active"]
        # a standby follows the others' epochs, so that a takeover fences above them. An
        # active one compares its own first: raised before, it always tied, and the lower
        # address stayed active with the older view
        ahead = max([self.table.epoch] + [o["epoch"] for o in live])
        if self.mode == "active":
            serves = self.table.live()
            for o in active:
                # members is None from a coordinator from before the field: then epochs decide
                theirs = o.get("members")
                if o["watches"] < 1:
                    why = "watches no other coordinator (started without --others), so it never stands by"
                elif ((bool(theirs), o["epoch"], self.address, self._token)
                      > (theirs is not None and serves > 0, self.table.epoch, o["name"], o["token"])):
                    # two actives (a partition healed, a restart, a frozen one thawed): the one
                    # that serves members wins (a standby that took over while only the link
                    # between the coordinators was cut serves none: by epoch alone it pushed every
                    # peer through a failover), then the newer epoch, the lower address, the token
                    if o["epoch"] > self.table.epoch:
                        why = f"has a newer view (epoch {o['epoch']}, this one's {self.table.epoch})"
                    elif theirs and not serves:
                        why = f"serves {o['members']} members and this one none"
                    else:
                        why = f"has the same epoch ({o['epoch']}) and a lower address or token"
                else:
                    continue
                log.warning("coordinator %s: coordinator %s is active too and %s; standing by",
                            self.address, o["name"], why)
                self._stand_down(ahead)
                return
            return
        self.table.epoch = ahead
        if active:
            self._no_active_since = now
            self._held_back = False
            return
        if self._first_dials:
            # takeover_s counts from the end of the first attempt to reach each other: across
            # a slow link the TCP and ZMTP handshakes take a few round trips (1.2-1.6 s at
            # 400 ms), and counted from the start a standby took over from a live primary
            # before it could hear it. The cost: one whose other's host is gone waits out
            # CONNECT_TIMEOUT_S first, one whose other is frozen HANDSHAKE_TIMEOUT_S
            return
        if now - self._no_active_since < cfg.takeover_s:
            return
        unknown = [addr for addr, o in self._others.items() if o["handshake"]]
        if unknown:
            # a coordinator we cannot authenticate with may be the active one: a takeover
            # would make two swarms of one (split brain); staying a standby is loud and safe
            if not self._held_back:
                self._held_back = True
                log.error("coordinator %s: no active coordinator answers, but not taking over: cannot tell "
                          "whether %s is up (its handshake fails, see above)", self.address, ", ".join(unknown))
            return
        self._held_back = False
        # nobody active for takeover_s: the lowest address (then token) among the live standbys takes over
        me = (self.address, self._token)
        if min([me] + [(o["name"], o["token"]) for o in live]) == me:
            self.mode = "active"
            self.table.clear()   # peers re-join; a stale table would only hold stale routes
            self._fds.clear()
            self._grace_until = now + cfg.rejoin_grace_s
            self._dirty = True
            self.table.log_event("takeover", self.address)
            log.warning("coordinator %s: taking over at epoch %d", self.address, self.table.epoch + 1)

    def _stand_down(self, epoch: int) -> None:
        """Stand by for another active coordinator, following its ``epoch``. The members are
        the other's now: kept, the table showed them alive in `swarm status`, and their
        closes were probed and logged as deaths."""
        self.mode = "standby"
        self.table.epoch = epoch
        self.table.clear()
        self._fds.clear()
        self._closing.clear()
        self._suspects.clear()
        self._dirty = False
        self._stalled_at = 0.0
        self.table.log_event("standby", self.address)

    def _others_status(self, now: float) -> list[dict[str, Any]]:
        """Each watched coordinator as this one sees it: ``state`` is its mode while it
        answers, else ``no answer`` (down or unreachable; ``error`` says so if it accepts
        connections but its handshake timed out, or if its host did not answer a connection)
        or ``handshake failed`` (see ``error``)."""
        out = []
        for addr, o in self._others.items():
            answers = now - o["seen"] < self.config.takeover_s
            state = o["mode"] if answers else ("handshake failed" if o["handshake"] else "no answer")
            out.append({"address": addr, "state": state, "epoch": o["epoch"],
                        "error": o["handshake"] or o["silent"],
                        "answered_s_ago": round(now - o["seen"], 3) if o["seen"] else None})
        return out

    def _status_frames(self, asker: str) -> list[Any]:
        """The ``status_reply`` message, built at most once per STATUS_CACHE_S (or 5 times
        what it cost) while the membership stays the same; the frames are shared by every
        send. ``asker`` is named in the log where the reply cannot be built."""
        t = self.table
        # what changes with each join, death, view, epoch, takeover, forgotten record or
        # refused message; the view and the last log entry are compared as objects
        made_of = (self.mode, t.epoch, len(t.members), self.malformed, t.view, t.log[-1] if t.log else None)
        now = time.monotonic()
        c = self._status_cache
        if (c is not None and now - c[0] < max(STATUS_CACHE_S, 5 * self._status_cost)
                and c[1][:4] == made_of[:4] and c[1][4] is made_of[4] and c[1][5] is made_of[5]):
            return c[2]
        t0 = time.perf_counter()
        try:
            frames = wire.encode("status_reply", self.name, epoch=t.epoch, body=self.status())
        except WireError as e:
            # the table is too big for one message: the asker did nothing wrong, so it
            # is told why (not counted as malformed, and not left to time out)
            page = (f"read {self.http_url}status.json instead" if self.http_url
                    else "set coordinator.http_bind and read its /status.json instead")
            why = f"the status reply does not fit in a message ({str(e)[:200]}); {page}"
            log.warning("status request from %r: %s", asker, why)
            frames = wire.encode("status_reply", self.name, epoch=t.epoch, body={"error": why})
        self._status_cost = time.perf_counter() - t0
        self._status_cache = (now, made_of, tp.shared(frames))
        return self._status_cache[2]

    def status(self) -> dict[str, Any]:
        """The member table and the current view, as `swarm status` shows them."""
        rows = self.table.rows()
        now = time.monotonic()
        return {
            "coordinator": self.address, "mode": self.mode, "http": self.http_url, "pid": os.getpid(), "epoch": self.table.epoch,
            "uptime_s": round(now - self.started, 3), "others": self._others_status(now),
            "view": self.table.view.to_wire(), "members": rows,
            "malformed": self.malformed, "heartbeats": self.heartbeats,
            "log": [list(x) for x in self.table.log[-50:]],
        }
