"""Sharing replay items with neighbours over a :class:`~swarm.link.Link`.

Protocol (all messages carry items in the same layout)::

    buf.push   {rid, ack, fields, peers} + arrays   items offered to a neighbour
    buf.ack    {rid, n}                             the pushed items are held (replication only)
    buf.pull   {rid, n}                             ask a neighbour for up to n items
    buf.resync {}                                   "I (re)started: what you replicated to me
                                                    recently may be gone" (replication only)
    buf.items  {rid, fields, peers} + arrays        the answer to a pull (possibly empty; one that
                                                    comes after the pull timed out, or was
                                                    cancelled, is stored too)

Arrays: one per schema field in schema order, then ``origins`` (int32, into
``peers``), ``seqs`` (int64), ``times`` (float64 origin times) and
``priorities`` (float64 raw priorities, without age). A receiver drops (and
counts) any message whose fields do not match its schema; it clips received
priorities and deduplicates by id ``(origin peer, seq)``.

Sharing: on each :meth:`Federation.flush`, a ``share`` fraction of the items
added locally since the last flush (the newest, or the highest-priority) goes
to every neighbour, within a token-bucket rate, in messages of at most
``max_items``, or as many as the link's message limit holds (by the schema's
bytes per item) where that is fewer; a message's items are gathered when it is
due and let go once it is sent. The fraction is rounded down and the remainder
carried to the next flush, so it holds however few items a flush has. Replication: with
``replicas=k`` every local item is pushed to the first k neighbours with
``ack`` set, and those k get no share push of it (a receiver stores both alike:
it would only go to them twice, and take share tokens); an item counts as safe
once k neighbours acknowledged it
(:meth:`Federation.take_acknowledged` hands out newly safe ids). A push
not acknowledged within ``ack_timeout`` (or whose target left the view) is
sent again on the next flush, to whichever neighbours are first then; to a
target that acknowledges nothing the resends back off (the wait doubles up
to ``ack_timeout_max``, and is ``ack_timeout`` again at its next ack). While
a peer has fewer than k neighbours (they have not joined yet, or died), its
items wait in a table of which neighbours hold them
(:class:`~swarm.buffer.replicas.ReplicaTable`, at most one row per local item
in the ring) and go to each neighbour that becomes one of the first k;
``stats.under_replicated`` counts the local items fewer than k hold.

Sending fails in two ways. A send that returns False (a full queue past
``send_timeout``, a neighbour gone) drops that message, as any best-effort
share: ``stats.send_failures``; a replication push waits for its ack timeout
and goes again. A send that *raises* sent nothing: the items it carried go at
the next flush (shared ones to the same neighbour, if it still is one;
replicated ones to their targets at once), and :meth:`flush` re-raises. Every
new item is in the replica table, and every shared one in the list of what is
owed to each neighbour, before the first send, so no send loses one. A message
the wire still refuses (:class:`~swarm.errors.WireError`: a header of many long
origin ids, say) goes again in halves, and from then on every message
carries at most half as many items; an item that cannot go even alone is
dropped and counted (``stats.unsendable``, logged as a warning).

With ``ride=True`` the shared items go with the gradient relay's messages
instead (give the federation to :class:`~swarm.gossip.GradientRelay` as its
``rider``): at each message of its own, a peer sends the ``share`` of the items
added since its last one to its neighbours, in the same layout (the arrays above;
body ``{fields, peers}``), and sends no ``buf.push`` for them. :meth:`flush` then
only replicates. A ride goes to every neighbour alike, so nothing rides when all
of them are among the first k (they get every item replicated). It spares a
round on the peer's loop per share: with the relay's ``direct`` sockets the
items go out and come in on the training thread, between its steps.

An acknowledged copy lives in the holder's memory (and its checkpoints): a
holder that crashes and restarts from a checkpoint has lost the replicas it
acknowledged since. So an origin remembers, per holder, the seqs that holder
acknowledged in the last ``rereplicate_s`` seconds, and replicates them again
when the holder stops being one of its first k neighbours (it died or the
view changed) or says ``buf.resync`` (every Federation, whatever its own
``replicas``, sends it to its neighbours on its first flush, i.e. after every
(re)start). Receivers drop the copies they still hold, by id. The origin's own
buffer holds the items meanwhile, so only the origin and the holder both
failing within the holder's checkpoint lag and before the next flush loses an
acknowledged item.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import is_int, is_real, seconds
from ..errors import ConfigError, ReplayError, WireError
from ..link import Link, link_closed, link_problem
from ..wire import DEFAULT_LIMITS, Limits, Message, register_type, shown
from .limiter import TokenBucket
from .replay import Items, ReplayBuffer
from .replicas import ReplicaTable

__all__ = ["Federation", "FederationStats", "PUSH", "PULL", "ITEMS", "ACK", "RESYNC"]

PUSH = register_type("buf.push")
PULL = register_type("buf.pull")
ITEMS = register_type("buf.items")
ACK = register_type("buf.ack")
RESYNC = register_type("buf.resync")
#: flushes that try to tell a neighbour of a restart whose queue stayed full
RESYNC_TRIES = 3

log = logging.getLogger(__name__)
_META = 4  # origins, seqs, times, priorities after the field arrays
_META_BYTES = 4 + 8 + 8 + 8   # and their bytes per item
_HEADER_ROOM = 64 << 10   # of a message's limit, left to its header (the origin ids, the field names)
_LATE_PULLS = 64   # pulls cut short whose answers are still taken when they come (the latest)
_LOOK_S = 0.05   # a pull waits at most this long at a time, to see its peer close (which resolves nothing of ours)
_BUCKETS = 64  # acks a holder made within rereplicate_s are remembered in at most this many (+1) entries
_ERROR_CHARS = 300  # of one text in stats.errors: its first 20 are kept for the federation's life
_MISFITS = 1024   # senders of items of another layout warned of, one warning each (then DEBUG only)
_LAYOUT_CHARS = 200   # of a sender's layout in that warning


@dataclass
class FederationStats:
    """Counters of what the federation did (items, not messages, unless named so)."""

    pushed: int = 0          # items sent in buf.push
    received: int = 0        # items that arrived in buf.push / buf.items
    stored: int = 0          # of those, stored (not duplicates, not over the rate, not overflow)
    duplicates: int = 0      # of those, held already, repeated in the message, or from this peer
    throttled: int = 0       # items not sent or not taken because of a rate limit
    overflow: int = 0        # of those received, new items the ring had no room for (past its capacity)
    served: int = 0          # items sent in answer to pulls
    acked: int = 0           # local items acknowledged by `replicas` neighbours
    under_replicated: int = 0   # now: local items in the ring that fewer than `replicas` neighbours hold
    unreplicated: int = 0    # local items the ring overwrote before `replicas` neighbours held them
    resent: int = 0          # items pushed again because a push of them got no ack (timeout, target left)
    rereplicated: int = 0    # acknowledged items replicated again: their holder left or restarted
    late: int = 0            # answers that came after their pull timed out or was cancelled (stored)
    dropped_messages: int = 0
    send_failures: int = 0
    unsendable: int = 0      # items (per neighbour) dropped: the wire refuses a message of that item alone
    errors: list[str] = field(default_factory=list)


class Federation:
    """Push, pull and replicate a :class:`ReplayBuffer`'s items over a link.

    Args:
        buffer: the local buffer (its schema must match the neighbours').
        link: anything with the :class:`~swarm.link.Link` shape.
        share: fraction of new local items pushed to each neighbour per flush (but the
            first ``replicas``, which get every item as a replication push).
        share_by: ``"newest"`` or ``"priority"`` (highest current priority first).
        replicas: k; each local item is pushed to the first k neighbours until k ack it
            (with fewer neighbours it waits for more: ``stats.under_replicated``).
        priority_clip: bound on a received item's raw priority (default: the
            receiving buffer's max priority, so a neighbour cannot out-rank local data).
        rate, burst: items per second (and burst) this peer sends for sharing and
            pulls combined; ``None`` means unbounded (a number must be finite, a
            burst >= 1 item, checked with no rate too). Replication is not throttled.
        ack_timeout: seconds before an unacknowledged replication push is resent.
        ack_timeout_max: the longest wait between two resends to a target that
            acknowledges nothing: each round of resends to it doubles the wait, from
            ``ack_timeout`` up to this (at least ``ack_timeout``); its next ack resets it.
        rereplicate_s: how long an acknowledged item is replicated again if its
            holder leaves or restarts (cover the holders' checkpoint interval; finite,
            0 for never).
        send_timeout: how long one send may wait on a full queue.
        max_items: the most items in one message (larger batches are split; a ride
            takes the newest ``max_items``); fewer where the link's message limit
            (a Peer's ``max_message_mb``) holds fewer, by the schema's bytes per item,
            and fewer once the wire refused a message.
        ride: share on a :class:`~swarm.gossip.GradientRelay`'s messages (as its
            ``rider``) instead of in :meth:`flush`.

    Call :meth:`flush` periodically (or run :meth:`run` as a task); call
    :meth:`pull` to fetch items from a neighbour, and :meth:`close` when done.
    """

    def __init__(self, buffer: ReplayBuffer, link: Link, *, share: float = 0.1,
                 share_by: str = "newest", replicas: int = 0, priority_clip: float | None = None,
                 rate: float | None = None, burst: float | None = None, ack_timeout: float = 2.0,
                 ack_timeout_max: float = 30.0, send_timeout: float = 1.0, max_items: int = 4096,
                 seed: int | None = None, rereplicate_s: float = 300.0, ride: bool = False) -> None:
        if not isinstance(buffer, ReplayBuffer):
            raise ReplayError(f"buffer must be a ReplayBuffer, got {type(buffer).__name__}")
        if (problem := link_problem(link)) is not None:
            raise ReplayError(problem)
        if not (is_real(share) and 0.0 <= share <= 1.0):
            raise ReplayError(f"share must be a number in [0, 1], got {share!r}")
        if share_by not in ("newest", "priority"):
            raise ReplayError(f"share_by must be 'newest' or 'priority', got {share_by!r}")
        if not (is_int(replicas) and replicas >= 0):
            raise ReplayError(f"replicas must be an int >= 0, got {replicas!r}")
        if priority_clip is not None and not (is_real(priority_clip) and priority_clip > 0):
            raise ReplayError(f"priority_clip must be a number > 0 or None, got {priority_clip!r}")
        for name, v in (("ack_timeout", ack_timeout), ("ack_timeout_max", ack_timeout_max),
                        ("send_timeout", send_timeout)):
            if not (is_real(v) and 0 < v < math.inf):
                raise ReplayError(f"{name} must be a finite number of seconds > 0, got {v!r}")
        # inf would put every ack into one bucket that never closes: kept, and grown, for ever
        if not (is_real(rereplicate_s) and 0 <= rereplicate_s < math.inf):
            raise ReplayError(f"rereplicate_s must be a finite number of seconds >= 0 "
                              f"(0: never replicate again), got {rereplicate_s!r}")
        if not (is_int(max_items) and max_items >= 1):
            raise ReplayError(f"max_items must be an int >= 1, got {max_items!r}")
        if seed is not None and not (is_int(seed) and seed >= 0):
            raise ReplayError(f"seed must be an int >= 0 or None, got {seed!r}")
        if buffer.peer_id != link.id and not buffer._take_id(link.id):
            # its neighbours' ids and its own must differ: a buffer left at the default id
            # "local" with items in it took every neighbour's items (all stamped "local" too)
            # for its own, and dropped them all as duplicates
            raise ReplayError(f"the buffer's peer_id {buffer.peer_id!r} is not the link's id {link.id!r}: "
                              "its items would go out under another peer's id; make the buffer with "
                              "ReplayBuffer(..., peer_id=<the peer's id>)")
        self.buffer, self.link = buffer, link
        self.share, self.share_by, self.replicas = float(share), share_by, int(replicas)
        self.priority_clip = priority_clip
        self.bucket = TokenBucket(rate, burst)
        self.ack_timeout, self.send_timeout, self.max_items = ack_timeout, send_timeout, int(max_items)
        self.ack_timeout_max = max(float(ack_timeout_max), float(ack_timeout))
        self.rereplicate_s = float(rereplicate_s)
        self.riding = bool(ride)
        self.stats = FederationStats()
        self._names = buffer.schema.names
        self._rng = np.random.default_rng(seed)
        # Push ids from a random start: a restarted process (or a Federation rebuilt on the
        # same peer) counting from 1 again could take a late ack of its predecessor's push
        # for one of its own, and mark items held that never arrived.
        self._rid = itertools.count(int(np.random.default_rng().integers(1, 2**62)))
        self._new: list[np.ndarray] = []          # indices added locally since the last flush
        self._unridden: list[np.ndarray] = []     # ... since the last ride (ride=True)
        self._new_lock = threading.Lock()         # add() may run on the learner's thread
        # neighbour -> indices of the items shared with it (its rate already charged) that are
        # still to go: a send that raised left them for the next flush
        self._owed: dict[str, np.ndarray] = {}
        # what one message holds, by the schema's bytes per item and the link's limit: a
        # message is sized before its items are gathered (a gather of max_items frames the
        # wire then refused held twice the message); halved each time the wire refuses one
        self._per_message = min(self.max_items, _fits(buffer, link))
        # rides: at most this many items (halved by each ride the relay could not carry), the
        # last ride (its items' indices, how many, to how many neighbours) until the next, and
        # the items of a refused one, to ride again
        self._ride_cap = self.max_items
        self._ridden: tuple[np.ndarray | None, int, int] = (None, 0, 0)
        self._reride: np.ndarray | None = None
        self._inflight: dict[int, tuple[str, np.ndarray, float]] = {}  # rid -> (dst, seqs, deadline)
        # target -> (wait, not before): a target that let pushes time out gets its next
        # resends only after `wait`, which doubles each round; its next ack removes the entry
        self._backoff: dict[str, tuple[float, float]] = {}
        # Local items that fewer than `replicas` neighbours hold, and which do: a row per
        # item, gone once it is safe or overwritten, so at most one per local item in the ring.
        self._table = ReplicaTable(self.replicas)
        self._newly_safe: deque[int] = deque(maxlen=buffer.capacity)   # for take_acknowledged()
        # holder -> buckets (until, [seqs, ...]): what it acknowledged within rereplicate_s, replicated
        # again if it goes; acks are merged into buckets of rereplicate_s / _BUCKETS seconds (see _remember)
        self._recent: dict[str, deque[tuple[float, list[np.ndarray]]]] = {}
        self._resync_sent = False
        self._resync_tries = 0
        self._resynced: set[str] = set()           # told so far, while the first resync goes out
        self._misfits: set[str] = set()            # senders of items of another layout, warned of (_misfit)
        self._credit = 0.0                         # share of new items owed but not yet sent (< 1)
        self._pulls: dict[int, tuple[str, asyncio.Future]] = {}   # rid -> (peer asked, its answer)
        self._late: dict[int, str] = {}   # rid -> peer asked, of the last _LATE_PULLS pulls cut short
        buffer.on_add(self._on_add)
        self._handlers = [(PUSH, self._on_push), (PULL, self._on_pull), (ITEMS, self._on_items),
                          (ACK, self._on_ack), (RESYNC, self._on_resync)]
        for t, h in self._handlers:
            link.on(t, h)
        self._closed = False
        self._peer_down = False   # closed because its peer closed (see _peer_gone)

    def close(self) -> None:
        """Take this federation's handlers off the link and the buffer: it receives and
        collects nothing more, and once dropped it is freed (they held it until then).

        Call it on the link's loop (and stop the :meth:`run` task) before building
        another federation on the same peer or buffer, which otherwise both get every
        message and every added item. Closing twice does nothing; pulls in flight end
        empty, and a :meth:`pull` or :meth:`flush` after it raises ReplayError (so a
        :meth:`run` task not cancelled ends at its next flush); a relay that still holds
        it as its rider gets no more rides (:meth:`ride` gives None) and every ride it
        hands to :meth:`arrive` is counted and dropped. A link without ``off``
        (a test double; a Peer and a SimLink have it) keeps its handlers. A federation
        whose peer closed first closes too, at its next pull or flush, or in a pull
        waiting then, which raise ReplayError saying so.
        """
        if self._closed:
            return
        self._closed = True
        off = getattr(self.link, "off", None)
        if off is not None:
            for t, h in self._handlers:
                off(t, h)
        self.buffer.off_add(self._on_add)
        for peer, fut in self._pulls.values():
            if not fut.done():   # its answer would no longer reach this federation
                if self._peer_down:   # nor could it come: the pull says why
                    fut.set_exception(self._closed_error(f"pull from {peer!r}"))
                else:
                    fut.set_result(0)

    def _closed_error(self, what: str) -> ReplayError:
        if self._peer_down:
            return ReplayError(f"{what}: peer {self.link.id!r}, under this federation, closed, so it sends and "
                               "receives nothing any more; close the federation before its peer, and build a "
                               "new one on a new peer")
        return ReplayError(f"{what}: this federation is closed")

    def _peer_gone(self) -> bool:
        """Whether the peer under this federation closed: then the federation closes too
        (once), as a relay does. Before, a pull without a deadline waited for ever, one
        after returned 0 as if the neighbour had nothing, and flush sent nothing, silently."""
        if not (self._peer_down or self._closed):
            if link_closed(self.link):
                self._peer_down = True
                self.close()
        return self._peer_down

    # ------------------------------------------------------------------ API
    def take_acknowledged(self) -> list[tuple[str, int]]:
        """Ids of local items that ``replicas`` neighbours acknowledged since the last call.

        Each id is returned once. Between two calls at most ``buffer.capacity``
        ids are kept (the oldest are dropped): call it after each :meth:`flush`.
        """
        out = [(self.buffer.peer_id, s) for s in self._newly_safe]
        self._newly_safe.clear()
        return out

    async def run(self, interval: float = 0.1) -> None:
        """Flush every ``interval`` seconds (finite, > 0) until cancelled; a task left
        running after :meth:`close` ends there, with the ReplayError of its next flush."""
        if not seconds(interval, "interval"):
            raise ConfigError(f"interval = {interval!r}: must be > 0 seconds (0 flushes without pause)")
        while True:
            await self.flush()
            await asyncio.sleep(interval)

    async def flush(self) -> int:
        """Share new items, (re)send replication pushes; return the number of items sent.

        A send that raises sent nothing: its items go at the next flush, and the
        error goes on up (see the module docstring). Raises
        :class:`~swarm.errors.ReplayError` once the federation is closed, or its peer.
        """
        if self._closed or self._peer_gone():   # acks are no longer handled: pushes would go again for ever
            raise self._closed_error("flush")
        nbrs = [n for n in self.link.neighbours() if n != self.link.id]
        self._take_new(nbrs)
        if not self._resync_sent and nbrs:
            # Whatever this peer's own settings, it may have held its neighbours' replicas
            # before a restart: they must hear of it to replicate them again. One whose
            # queue stayed full is told at the next flush (it never heard, before), up to
            # RESYNC_TRIES flushes.
            for dst in nbrs:
                if dst not in self._resynced:
                    if await self.link.send(dst, RESYNC, {}, timeout=self.send_timeout):
                        self._resynced.add(dst)
                    else:
                        self.stats.send_failures += 1
            self._resync_tries += 1
            if self._resync_tries >= RESYNC_TRIES or all(d in self._resynced for d in nbrs):
                self._resync_sent = True
                self._resynced.clear()
        sent = 0
        if self._owed:
            sent += await self._share(nbrs)
        if self.replicas:
            try:
                sent += await self._replicate(nbrs)
            finally:
                self.stats.under_replicated = len(self._table)
        return sent

    def _take_new(self, nbrs: list[str]) -> None:
        """Take the items added since the last flush into the replica table and, their
        ``share`` within the rate, into what is owed to each neighbour: from there a
        send that raises leaves them to the next flush. If this raises (a clock the
        buffer refuses, for ``share_by="priority"``), they stay new."""
        with self._new_lock:
            new, self._new = self._new, []
        if not new:
            return
        credit = self._credit
        try:
            idx = np.concatenate(new)
            owed: dict[str, np.ndarray] = {}
            # The first `replicas` neighbours get every new item in this flush as a replication
            # push: a share push of it too would send it to them twice, and take tokens for it.
            sharers = nbrs[self.replicas:]
            if self.share > 0 and sharers and not self.riding:
                _, picked = self._live(self._pick(idx))
                for dst in sharers:
                    allowed = self.bucket.take(picked.size) if picked.size else 0
                    self.stats.throttled += picked.size - allowed
                    if allowed:   # _pick puts the preferred last: the rate cuts the others
                        owed[dst] = picked[picked.size - allowed:]
            if self.replicas:
                seqs, live = self._live(idx)
                self._table.add(seqs, live)
                # overwritten before their first flush (more added than the ring holds):
                # they went to no one
                self.stats.unreplicated += idx.size - live.size
                self.stats.under_replicated = len(self._table)
        except BaseException:
            self._credit = credit
            with self._new_lock:
                self._new[:0] = new
            raise
        floor = self.buffer.total_added - self.buffer.capacity   # below it the ring holds nothing
        for dst, part in owed.items():
            if dst in self._owed:
                part = np.concatenate([self._owed[dst], part])
            self._owed[dst] = part[part >= floor]

    def ride(self) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """The items to send with this peer's next relay message (``ride=True``): the
        ``share`` of those added since the last ride, as a body and arrays; None if
        there are none, or once the federation is closed. Called on the thread that
        publishes gradients."""
        if self._closed:   # it collects nothing more: what it holds would ride for ever
            return None
        nbrs = [n for n in self.link.neighbours() if n != self.link.id]
        with self._new_lock:
            new, self._unridden = self._unridden, []
        again, self._reride, self._ridden = self._reride, None, (None, 0, 0)
        # Neighbours that all are among the first `replicas` get every item as a replication
        # push (flush): a ride would send it to them twice. A ride goes to every neighbour,
        # so with others beside them it goes to these too.
        if (not new and again is None) or self.share <= 0 or len(nbrs) <= self.replicas:
            return None
        credit = self._credit
        try:
            picked = self._pick(np.concatenate(new)[-self.max_items:]) if new else np.zeros(0, np.int64)
            if again is not None:   # a refused ride's items (picked then) ride again
                picked = np.concatenate([again, picked])
            if picked.size > self._ride_cap:   # the preferred of them; the others at the next rides
                picked = self._preferred_last(picked)
                rest, picked = picked[:-self._ride_cap], picked[-self._ride_cap:]
                self._reride = rest[-self.max_items:]   # at most what one ride took before
            items = self.buffer.items(picked)
        except BaseException:   # a clock the buffer refuses (share_by="priority"): they ride later
            self._credit = credit
            self._reride = again
            with self._new_lock:
                self._unridden[:0] = new
            raise
        # every neighbour gets the same items: the rate counts them once per neighbour
        allowed = self.bucket.take(len(items) * len(nbrs)) // len(nbrs)
        self.stats.throttled += (len(items) - allowed) * len(nbrs)
        if allowed == 0:
            return None
        if allowed < len(items):   # the last: the preferred (see _pick)
            items = _slice(items, slice(len(items) - allowed, None))
        self.stats.pushed += len(items) * len(nbrs)
        self._ridden = (picked[picked.size - allowed:], len(items), len(nbrs))
        return {"fields": self._names, "peers": items.peers}, self._arrays(items)

    def refused(self) -> None:
        """The relay could not carry the last ride beside its gradients (too large for a
        message): it is not counted as pushed, its items ride again first, and every ride
        from now on carries at most half as many (pushes and pulls are not affected). One
        item alone that does not fit is dropped (``stats.unsendable``). Called on the
        thread that publishes gradients, once per ride (a second call does nothing)."""
        idx, n, k = self._ridden
        self._ridden = (None, 0, 0)
        if idx is None or not n:
            return
        self.stats.pushed -= n * k
        if n > 1:
            self._ride_cap = min(self._ride_cap, n // 2)
            log.warning("a ride of %d items did not fit beside the gradients: at most %d items per ride "
                        "from now on", n, self._ride_cap)
            self._reride = idx
        else:
            self.stats.unsendable += n * k

    def arrive(self, src: str, body: dict[str, Any], arrays: list[np.ndarray]) -> None:
        """Store the items that rode on neighbour ``src``'s relay message (as ``buf.push``
        without ack: a bad one, a body that is not a dict included, is counted and dropped,
        as is every ride once the federation is closed)."""
        if self._closed:   # it receives nothing more (close): a relay still holding it may call
            self._drop(Message(t="buf.ride", src=str(src)[:100]), "this federation is closed")
            return
        if not (isinstance(src, str) and isinstance(body, dict) and isinstance(arrays, (list, tuple))):
            self._drop(Message(t="buf.ride", src=str(src)[:100]),
                       f"a ride needs a peer id (str), a body (dict) and a list of arrays, got "
                       f"{type(src).__name__}, {type(body).__name__}, {type(arrays).__name__}")
            return
        msg = Message(t="buf.ride", src=src, body=body, arrays=list(arrays))
        items = self._decode(msg)
        if items is not None:
            self._store(msg, items, limit=True)

    async def pull(self, peer: str, n: int, timeout: float = 2.0) -> int:
        """Ask ``peer`` for up to ``n`` items and store them; return how many were stored.

        Raises :class:`~swarm.errors.PeerTimeout` if no answer comes within ``timeout``
        (finite seconds >= 0, or None: no deadline), :class:`~swarm.errors.ReplayError`
        once the federation is closed, and once its peer closed (close the federation
        first), also while the pull waits. Bad arguments raise before anything is sent.
        The timeout must cover the transfer of the answer: one that comes later, or
        after the pull was cancelled (a caller's deadline, a TaskGroup, Ctrl-C), is
        still stored (its items were drawn and sent for it), and counted in
        ``stats.late``; the first is logged.
        """
        from ..errors import PeerTimeout
        if not (is_int(n) and n >= 1):
            raise ReplayError(f"pull size must be an int >= 1, got {n!r}")
        timeout = seconds(timeout, none_ok=True)
        if self._closed or self._peer_gone():   # the answer would never arrive (it waited out its timeout)
            raise self._closed_error(f"pull from {peer!r}")
        rid = next(self._rid)
        fut = asyncio.get_running_loop().create_future()
        self._pulls[rid] = (peer, fut)
        try:
            if not await self.link.send(peer, PULL, {"rid": rid, "n": min(int(n), self.max_items)},
                                        timeout=self.send_timeout):
                self.stats.send_failures += 1
                return 0
            async with asyncio.timeout(timeout):
                while not (fut.done() or self._peer_gone()):   # a peer gone fails fut (close)
                    await asyncio.wait([fut], timeout=_LOOK_S)
                return fut.result()
        except (TimeoutError, asyncio.CancelledError) as e:
            # Cut short by its own deadline or by its caller's (a cancel: asyncio.timeout,
            # wait_for, a TaskGroup, SyncPeer.call's timeout, Ctrl-C): the neighbour draws and
            # sends the items all the same, and they are stored when they come. Before, a
            # caller's deadline threw them away without a trace, counted served there.
            self._late[rid] = peer
            if len(self._late) > _LATE_PULLS:
                del self._late[next(iter(self._late))]
            if isinstance(e, asyncio.CancelledError):
                raise
            raise PeerTimeout(f"no buf.items from {peer!r} within {timeout} s") from None
        finally:
            self._pulls.pop(rid, None)

    # ------------------------------------------------------------- sending
    def _pick(self, idx: np.ndarray) -> np.ndarray:
        """The ``share`` of the new items ``idx`` to send, by ``share_by``, the preferred
        last (the newest, or the highest current priority): a rate cut keeps the last.

        The fraction is rounded down and the remainder carried to the next call, so
        over a run exactly ``share`` of the items go, however few each flush has
        (rounding up would send every item of a flush that has one).
        """
        if self.share >= 1:
            return idx
        self._credit += self.share * idx.size
        k = min(idx.size, int(self._credit + 1e-9))   # 1e-9: 0.1·10 summed as 0.999…
        self._credit = max(0.0, self._credit - k)
        if k == 0:
            return idx[:0]
        if self.share_by == "newest":
            return idx[-k:]
        p = self.buffer.priorities(idx)
        p = np.where(np.isnan(p), -1.0, p)
        return idx[np.argsort(-p, kind="stable")[:k][::-1]]

    def _preferred_last(self, idx: np.ndarray) -> np.ndarray:
        """The items ``idx`` in :meth:`_pick`'s order, the preferred last (the newest, or the
        highest current priority): a refused ride's items and new ones picked since, whose
        two runs are each in that order, merged."""
        idx = np.sort(idx)
        if self.share_by == "newest":
            return idx
        p = self.buffer.priorities(idx)
        p = np.where(np.isnan(p), -1.0, p)   # overwritten: last preferred
        return idx[np.argsort(p, kind="stable")]

    async def _share(self, nbrs: list[str]) -> int:
        """Send each neighbour what is owed to it, in messages of at most ``_per_message``
        items. What is owed to a peer that is no neighbour any more is dropped: sharing
        goes to the neighbours of the moment. A send that raises leaves its items, and
        those after them, owed."""
        for dst in [d for d in self._owed if d not in nbrs]:
            del self._owed[dst]
        # A neighbour that has become one of the first `replicas` since its items were owed
        # (a send to it raised, then a target left): what it is still to be replicated
        # goes to it in this flush's replication push, not in a share push too.
        for dst in nbrs[:self.replicas]:
            todo = self._owed.get(dst)
            if todo is not None and len(self._table):
                self._owed[dst] = todo[~np.isin(todo, self._table.idx)]
        sent = 0
        while True:
            # the next message owed to each neighbour; usually the same items for all of them,
            # gathered once, sent to each, and let go before the next is gathered
            n = self._per_message
            heads: dict[bytes, list[str]] = {}
            for dst in nbrs:
                todo = self._owed.get(dst)
                if todo is not None and not todo.size:
                    del self._owed[dst]
                elif todo is not None:
                    heads.setdefault(todo[:n].tobytes(), []).append(dst)
            if not heads:
                return sent
            for dsts in heads.values():
                got = await self._share_one(dsts, n)
                if got is None:   # refused: again, in smaller messages
                    break
                sent += got

    async def _share_one(self, dsts: list[str], n: int) -> int | None:
        """Send the first ``n`` items owed to each of ``dsts`` (the same items) in one
        message, and take them off what is owed to those it went to; None once the wire
        refused it (the others are still owed them)."""
        part = self.buffer.items(self._owed[dsts[0]][:n])   # those the ring overwrote meanwhile are left out
        sent = 0
        for dst in dsts:
            if len(part):
                try:
                    ok = await self._send_items(dst, PUSH, part, {"rid": 0, "ack": False})
                except WireError as e:
                    if self._refused(e, len(part), PUSH, dst):
                        return None
                    ok = False
                if ok:
                    sent += len(part)
                    self.stats.pushed += len(part)
            self._owed[dst] = self._owed[dst][n:]
        return sent

    async def _replicate(self, nbrs: list[str]) -> int:
        """Push each item not yet safe to those of the first k neighbours that neither
        hold it nor have a push of it on the way; an item that every one of them
        holds while they are fewer than k waits for the next neighbour."""
        now = time.monotonic()
        targets = nbrs[:self.replicas]
        table = self._table
        promoted = [d for d in targets if d not in table.slots]
        table.retarget(targets)                # copies held by a peer that left the first k count no longer
        # A target back among the first k before its pushes from then timed out (it was
        # demoted while still a neighbour) still has them on the way: they are not sent
        # twice, and only their own timeout backs it off.
        if promoted:
            for dst, seqs, _ in self._inflight.values():
                if dst in promoted:
                    table.on_the_way(dst, seqs)
        for holder, dq in list(self._recent.items()):
            while dq and dq[0][0] < now - self.rereplicate_s:
                dq.popleft()
            if holder not in targets:
                self._again_from(holder)   # it left the first k: its copies may have gone with it
            elif not dq:
                del self._recent[holder]
        # Pushes to a peer gone from the neighbourhood go again at once (to its successor).
        # Pushes past their deadline go again too, but to a target that has acknowledged
        # nothing since its last round of resends only once its wait is over, and each
        # round doubles that wait: a silent target (a hung peer until it is declared dead,
        # one that drops the pushes for good) was sent everything it had not acknowledged
        # every ack_timeout, so over n ack_timeouts n rounds, now about log2(n).
        for dst in [d for d in self._backoff if d not in targets]:
            del self._backoff[dst]
        resent_to: set[str] = set()
        for rid, (dst, seqs, deadline) in list(self._inflight.items()):
            if dst in nbrs and (now <= deadline or now < self._backoff.get(dst, (0.0, 0.0))[1]):
                continue
            del self._inflight[rid]
            table.mark(dst, seqs, sent=False)
            if dst in nbrs:
                resent_to.add(dst)
        for dst in resent_to & set(targets):
            wait = min(2 * self._backoff.get(dst, (self.ack_timeout, 0.0))[0], self.ack_timeout_max)
            self._backoff[dst] = (wait, now + wait)
        with self.buffer._lock:                # items overwritten locally can be sent no more
            self.stats.unreplicated += table.drop_overwritten(self.buffer._ticket)
        sent = 0
        for dst in targets:
            todo = table.to_send(dst)
            while todo.size:
                n = self._per_message
                got = await self._replicate_one(dst, todo[:n])
                if got is None:   # refused: again, in smaller messages
                    continue
                sent += got
                todo = todo[n:]
        return sent

    async def _replicate_one(self, dst: str, idx: np.ndarray) -> int | None:
        """Push the local items ``idx`` to ``dst`` with ``ack`` set, in one message (its items
        let go on return); the number sent, or None once the wire refused the message."""
        table = self._table
        chunk = self.buffer.items(idx)
        if not len(chunk):
            return 0
        seqs = chunk.seqs.copy()
        rid = next(self._rid)
        self._inflight[rid] = (dst, seqs, time.monotonic() + self.ack_timeout)
        given_up = table.given_up(seqs)
        again = table.mark(dst, seqs, sent=True)
        try:
            ok = await self._send_items(dst, PUSH, chunk, {"rid": rid, "ack": True})
            if rid in self._inflight:
                # the ack's time runs from when the push went, not from before a wait
                # on a full queue (up to send_timeout): that resent pushes on congested
                # links before an ack could have come. Registered before the send, so
                # that an ack that comes first still matches.
                self._inflight[rid] = (dst, seqs, time.monotonic() + self.ack_timeout)
        except BaseException as e:
            # Nothing went: the items go again at the next flush (or now, in halves),
            # not after ack_timeout, and their target is not backed off for it.
            self._inflight.pop(rid, None)
            table.unmark(dst, seqs, given_up)
            if not isinstance(e, WireError):
                raise
            if self._refused(e, len(chunk), PUSH, dst):
                return None
            table.drop(seqs)              # it can go to no one: counted in stats.unsendable
            return 0
        if not ok:
            return 0                      # the in-flight entry times out and is resent
        self.stats.pushed += len(chunk)
        self.stats.resent += again
        return len(chunk)

    def _live(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seqs and indices of the local items ``idx`` that the ring still holds."""
        buf = self.buffer
        with buf._lock:
            slots = idx % buf.capacity
            live = buf._ticket[slots] == idx
            return buf._seq[slots[live]], idx[live]

    def _local_items(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Seqs and indices of the local items with these seqs that the ring still holds."""
        buf = self.buffer
        with buf._lock:
            n = len(buf)
            mine = (buf._origin[:n] == 0) & np.isin(buf._seq[:n], seqs)
            return buf._seq[:n][mine], buf._ticket[:n][mine]

    def _arrays(self, items: Items) -> list[np.ndarray]:
        """The wire layout: the schema's fields, then origins, seqs, times, priorities."""
        return [items.fields[k] for k in self._names] + [
            items.origins.astype(np.int32), items.seqs.astype(np.int64),
            items.times.astype(np.float64), items.priorities.astype(np.float64)]

    def _refused(self, e: WireError, n: int, t: str, dst: str) -> bool:
        """The wire refused a message ``t`` of ``n`` items to ``dst`` (too large for the
        peer's ``max_message_mb``, say). Of more than one item: from now on a message
        carries at most half as many, and True (send them again). One item alone can go
        to no one: it is counted in ``stats.unsendable`` and logged, and False."""
        if n > 1:
            self._per_message = min(self._per_message, n // 2)
            log.warning("the wire refused a %s of %d items to %r (%s): at most %d items per message "
                        "from now on", t, n, dst, e, self._per_message)
            return True
        first = self.stats.unsendable == 0
        self.stats.unsendable += n
        # shown(): the answer to a pull goes to whoever sent it, by the id it chose
        why = f"{t} to {shown(dst)}: the wire refuses even a message of one item, dropped ({e})"
        self._error(why)
        (log.warning if first else log.debug)("%s; stats.unsendable counts such items", why)
        return False

    async def _send_items(self, dst: str, t: str, items: Items, body: dict[str, Any]) -> bool:
        body = dict(body, fields=self._names, peers=items.peers)
        ok = await self.link.send(dst, t, body, self._arrays(items), timeout=self.send_timeout)
        if not ok:
            self.stats.send_failures += 1
        return ok

    # ------------------------------------------------------------ receiving
    def _decode(self, msg: Message) -> Items | None:
        b = msg.body
        if b.get("fields") != self._names:
            self._misfit(msg)
            return None
        if len(msg.arrays) != len(self._names) + _META:
            self._drop(msg, f"{len(msg.arrays)} arrays, expected {len(self._names) + _META}: one per "
                            f"schema field {self._names}, then origins, seqs, times and priorities")
            return None
        peers = b.get("peers")
        if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
            self._drop(msg, "bad peers list")
            return None
        # The wire decodes only arrays, but a ride's come from the relay's caller: a list
        # (ragged, say) would raise in the buffer, not be dropped.
        if not all(isinstance(a, np.ndarray) for a in msg.arrays):
            self._drop(msg, "items must come as numpy arrays, got "
                            f"{shown([type(a).__name__ for a in msg.arrays])}")
            return None
        f = msg.arrays[:len(self._names)]
        try:   # the layout only: on no rows, no value is looked at (the buffer checks them on insert)
            self.buffer.schema.check({k: a[:0] if a.ndim else a for k, a in zip(self._names, f)})
        except ReplayError:
            self._misfit(msg)
            return None
        o, s, t, p = msg.arrays[len(self._names):]
        return Items(dict(zip(self._names, f)), peers, o, s, t, p)

    def _misfit(self, msg: Message) -> None:
        """Drop ``msg``, whose items are not laid out as this buffer's schema, as :meth:`_drop`
        does; the first such message from each neighbour is logged as a warning, naming
        both layouts. At DEBUG only, a neighbour with another schema (obs of 6 values
        beside 4) had every batch it sent refused for the whole run, and only
        ``stats.errors`` (which a hand-built loop reads nowhere) said why."""
        fields = msg.body.get("fields")
        if isinstance(fields, list) and len(msg.arrays) == len(fields) + _META \
                and all(isinstance(a, np.ndarray) for a in msg.arrays):
            theirs = ", ".join(f"{shown(k)} {a.dtype} {a.shape[1:]}" for k, a in zip(fields, msg.arrays))
            theirs = theirs if len(theirs) <= _LAYOUT_CHARS else f"{theirs[:_LAYOUT_CHARS - 3]}..."
        else:
            theirs = f"fields {shown(fields)} in {len(msg.arrays)} arrays"
        ours = ", ".join(f"{f.name!r} {f.dtype} {f.shape}" for f in self.buffer.schema.fields)
        why = f"items laid out as {theirs} do not match schema {ours}"
        self._drop(msg, why)
        if msg.src not in self._misfits and len(self._misfits) < _MISFITS:
            self._misfits.add(msg.src)
            log.warning("replay items from neighbour %s do not fit this buffer: %s; each such batch is dropped "
                        "(stats.dropped_messages): give every peer the same buffer schema", shown(msg.src), why)

    def _store(self, msg: Message, items: Items, limit: bool) -> np.ndarray | None:
        n = len(items)
        self.stats.received += n
        try:
            # Duplicates are dropped before the limiter's room is counted: they take none of it.
            idx, over, overflow = self.buffer._insert(items, self.priority_clip, limit)
        except ReplayError as e:
            self._drop(msg, str(e))
            return None
        self.stats.stored += idx.size
        self.stats.throttled += over
        self.stats.overflow += overflow
        self.stats.duplicates += n - over - overflow - idx.size
        return idx

    async def _on_push(self, msg: Message) -> None:
        items = self._decode(msg)
        if items is None:
            return
        ack = bool(msg.body.get("ack"))
        # Replicas bypass the sample-to-insert ratio: they are a durability promise.
        if self._store(msg, items, limit=not ack) is None or not ack:
            return
        if not await self.link.send(msg.src, ACK, {"rid": msg.body.get("rid"), "n": len(items)},
                                    timeout=self.send_timeout):
            self.stats.send_failures += 1

    async def _on_ack(self, msg: Message) -> None:
        rid = msg.body.get("rid")
        if not isinstance(rid, int):
            self._drop(msg, f"bad ack {shown(msg.body)}")
            return
        entry = self._inflight.get(rid)
        if entry is None or entry[0] != msg.src:
            return                               # late, or not the push's target: it changes nothing
        del self._inflight[rid]
        self._backoff.pop(msg.src, None)         # it acknowledges again: its resends wait ack_timeout
        seqs = entry[1]
        if self.rereplicate_s > 0 and msg.src in self._table.slots:
            self._remember(msg.src, seqs)
        safe, told = self._table.ack(msg.src, seqs)
        fresh = safe[~told].tolist()             # the others were handed out before a holder left
        self._newly_safe.extend(fresh)
        self.stats.acked += len(fresh)
        self.stats.under_replicated = len(self._table)

    def _remember(self, holder: str, seqs: np.ndarray) -> None:
        """Note that ``holder`` acknowledged ``seqs``, for :meth:`_again_from`.

        An entry per ack would be one per flush and holder for rereplicate_s (20,000
        after 150 s of a fast run, ~9 MB). Acks go instead into the holder's open
        bucket, which takes them until its ``until`` time and expires rereplicate_s
        after it (so every ack is kept at least rereplicate_s): at most
        ``_BUCKETS + 1`` entries per holder. When a bucket opens, the seqs the ring
        has overwritten for sure are dropped: they could not be sent again anyway.
        Those are the seqs more than ``capacity`` below the next local seq (local seqs
        are issued one per local item, and only grow), so what is kept is at most
        ``capacity`` seqs, plus the open bucket's.

        The open bucket collects the acks' arrays in a list, joined into one when it
        closes: joining on every ack copied the whole bucket each time (quadratic in
        the acks per bucket).
        """
        now = time.monotonic()
        dq = self._recent.setdefault(holder, deque())
        if dq and now <= dq[-1][0]:
            dq[-1][1].append(seqs)
            return
        floor = self.buffer._next_seq - self.buffer.capacity
        kept = [(t, _joined(parts)) for t, parts in dq if t >= now - self.rereplicate_s]
        kept = [(t, a[a >= floor]) for t, a in kept]
        dq.clear()
        dq.extend((t, [a]) for t, a in kept if a.size)
        dq.append((now + self.rereplicate_s / _BUCKETS, [seqs]))

    async def _on_resync(self, msg: Message) -> None:
        self._again_from(msg.src)

    def _again_from(self, holder: str) -> None:
        """Replicate again what ``holder`` acknowledged recently (on the next flush)."""
        dq = self._recent.pop(holder, None)
        if not dq:
            return
        seqs = np.unique(np.concatenate([a for _, parts in dq for a in parts]))
        self._table.forget(holder, seqs)
        seqs, idx = self._local_items(seqs)       # what the ring overwrote since cannot go again
        self._table.add(seqs, idx, told=True)     # a safe item's other holders are not known: all targets
        self.stats.rereplicated += int(seqs.size)

    async def _on_pull(self, msg: Message) -> None:
        n = msg.body.get("n")
        rid = msg.body.get("rid")
        if type(n) is not int or n < 1 or type(rid) is not int:   # a bool is no count
            self._drop(msg, f"bad pull request {shown(msg.body)}")
            return
        want = min(n, self._per_message)
        k = self.bucket.take(want)
        self.stats.throttled += want - k
        items = self.buffer.items(self._draw(k))
        while True:
            try:
                await self._send_items(msg.src, ITEMS, items, {"rid": rid})
            except WireError as e:
                if not len(items):     # not even an empty answer goes: the pull times out
                    log.warning("the wire refused an empty buf.items to %r (%s): its pull goes "
                                "unanswered", msg.src, e)
                    return
                # fewer items, or none if one alone cannot go (an empty answer ends the pull)
                keep = self._per_message if self._refused(e, len(items), ITEMS, msg.src) else 0
                items = _slice(items, slice(0, keep))
                continue
            self.stats.served += len(items)
            return

    async def _on_items(self, msg: Message) -> None:
        rid = msg.body.get("rid")
        if not isinstance(rid, int):
            self._drop(msg, f"bad rid {shown(rid)} in buf.items")
            return
        peer, fut = self._pulls.get(rid, (self._late.get(rid), None))
        if peer is not None and msg.src != peer:
            # rids count up and pushes carry them too: a third peer could answer our pull
            self._drop(msg, f"buf.items for a pull sent to {peer!r}")
            return
        items = self._decode(msg)
        if fut is None:
            if peer is None:   # no pull of ours asked for it (or it timed out long ago)
                return
            # its pull timed out or was cancelled: the items were drawn and sent for it all the same
            del self._late[rid]
            if items is not None:
                self._late_answer(msg, len(items))
                self._store(msg, items, limit=True)
            return
        if items is None:
            if not fut.done():
                fut.set_result(0)     # an answer, but nothing usable (counted): not a timeout
            return
        idx = self._store(msg, items, limit=True)
        if not fut.done():
            fut.set_result(0 if idx is None else int(idx.size))

    def _late_answer(self, msg: Message, n: int) -> None:
        """Count an answer that came after its pull timed out or was cancelled; log the first."""
        self.stats.late += 1
        (log.warning if self.stats.late == 1 else log.debug)(
            "buf.items of %d items from %s came after its pull timed out or was cancelled: stored all the "
            "same; give pull() a timeout that covers the transfer (stats.late counts such answers)",
            n, shown(msg.src))

    def _draw(self, k: int) -> np.ndarray:
        """Up to k distinct indices by the buffer's law, without touching its counters."""
        buf = self.buffer
        with buf._lock:
            size = len(buf)
            if k <= 0 or size == 0:
                return np.zeros(0, np.int64)
            if buf.sampler == "prioritized":
                slots = buf._tree.find(self._rng.random(k) * buf._tree.total)
                slots = np.minimum(slots, size - 1)
            else:
                slots = self._rng.integers(0, size, k)
            return np.unique(buf._ticket[slots])

    def _drop(self, msg: Message, why: str) -> None:
        self.stats.dropped_messages += 1
        # shown(): a sender's id may hold a line break, which would forge a line wherever
        # the errors are printed
        why = f"{msg.t} from {shown(msg.src)}: {why}"
        self._error(why)
        log.debug("dropped %s", why)

    def _error(self, why: str) -> None:
        """Keep ``why`` in ``stats.errors`` (the first 20 texts, each cut to _ERROR_CHARS)."""
        if len(self.stats.errors) < 20:
            self.stats.errors.append(why if len(why) <= _ERROR_CHARS else f"{why[:_ERROR_CHARS - 3]}...")

    def _on_add(self, idx: np.ndarray) -> None:
        with self._new_lock:
            if self.riding:
                self._unridden.append(idx)
                if len(self._unridden) > self.max_items:   # nobody rides: keep what one ride takes
                    del self._unridden[:-self.max_items]
            if not self.riding or self.replicas:
                self._new.append(idx)


def _fits(buffer: ReplayBuffer, link: Link) -> int:
    """How many of ``buffer``'s items one message over ``link`` holds (at least 1): the
    link's limit (a Peer's ``max_message_mb``; the wire's default for a link without
    one), less room for the header, over an item's bytes (its fields, and its origin,
    seq, time and priority)."""
    limits = getattr(link, "limits", None)
    limit = (limits if isinstance(limits, Limits) else DEFAULT_LIMITS).max_message_bytes
    item = sum(f.dtype.itemsize * math.prod(f.shape) for f in buffer.schema) + _META_BYTES
    return max(1, (limit - _HEADER_ROOM) // item)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The arrays of a bucket as one (no copy when there is one already)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _slice(items: Items, sel: Any) -> Items:
    """Items ``sel`` of ``items``, naming only the origins they hold: a smaller message the
    wire refused for its header (many long origin ids) is smaller there too."""
    origins, peers = items.origins[sel], items.peers
    used = np.unique(origins)
    if used.size < len(peers):
        peers = [peers[i] for i in used.tolist()]
        origins = np.searchsorted(used, origins).astype(origins.dtype)
    return Items({k: v[sel] for k, v in items.fields.items()}, peers, origins,
                 items.seqs[sel], items.times[sel], items.priorities[sel])
