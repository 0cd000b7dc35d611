"""The member table: who is in the swarm, in which state, and the current view.

Pure bookkeeping, no sockets, so that its rules are easy to test:

* a member is ``alive``, ``suspect`` (silent too long or reported by a
  neighbour; a direct probe is out) or ``dead`` (left, crashed or frozen);
* every change of the alive set bumps the epoch; the view is the alive members
  ordered by rank;
* epochs never go backwards, also across a coordinator restart: joins carry the
  peer's last epoch and the table starts above the highest one it hears.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..checks import is_int, shown
from ..errors import MembershipError
from ..link import Member, View

__all__ = ["MemberRecord", "MemberTable", "ALIVE", "SUSPECT", "DEAD", "MAX_RANK"]

ALIVE, SUSPECT, DEAD = "alive", "suspect", "dead"

#: seconds a dead member's record is kept (a row of `swarm status` that says why it died)
DEAD_KEPT_S = 300.0
#: dead records kept at most, the newest (each is a row of every status reply): a
#: restarted process joins under a new id, and a churn of 15,000 deaths within
#: DEAD_KEPT_S made a status reply over the 4 MiB header limit, which went unanswered
MAX_DEAD = 4096

#: how a refusal of a peer id in use says to choose another: the joiner may be a
#: `swarm peer` or a Peer in Python (a second one of the same process, say)
ANOTHER_ID = "--id on the command line, with --spec another --rank; id= in the Python API"

#: the highest rank a join may ask for: ranks number agents and seed environments
#: (seed + 100·rank), and one that fits 32 bits fits every int type they meet
MAX_RANK = 2**31 - 1


@dataclass
class MemberRecord:
    id: str
    addr: str
    rank: int
    incarnation: int
    route: bytes
    state: str = ALIVE
    last_heartbeat: float = field(default_factory=time.monotonic)
    fd: int = -1
    probe_deadline: float = 0.0
    probe_nonce: int = 0
    linked_epoch: int = -1
    linked_at: float = 0.0
    died_at: float = 0.0       # time.monotonic() when it died: its record's age is elapsed time
    cause: str = ""
    key: str = ""
    view_sent: float = 0.0     # when a lagging heartbeat last got the full view
    view_bytes: int = 0        # the bytes of its entry in an encoded view (see MemberTable.view_bytes)
    stats: dict[str, Any] = field(default_factory=dict)   # as bound_stats keeps them: plain, bounded
    stats_at: float = 0.0      # when ``stats`` arrived (heartbeats carry them only once a second)


class MemberTable:
    """Members, their states and the numbered view.

    ``max_members`` and ``max_view_bytes`` bound the view (None: no bound): a join that
    would make it longer, or its encoded member list larger, is refused. A view goes to
    every member as one message; one past what a peer accepts could not be sent at all.
    """

    def __init__(self, epoch: int = 0, *, max_members: int | None = None,
                 max_view_bytes: int | None = None) -> None:
        self.members: dict[str, MemberRecord] = {}
        self.epoch = epoch
        self.view = View(epoch)
        self.log: list[tuple[float, str, str]] = []   # (time, event, peer id)
        self.max_members = max_members
        self.max_view_bytes = max_view_bytes
        #: bytes of the live members' entries in an encoded view, kept as they join and die
        self.view_bytes = 0
        # rank -> id of its live holder, and a rank below which none is free: a join
        # finds its rank without a scan of the table
        self._ranks: dict[int, str] = {}
        self._low = 0

    # -- queries

    def alive(self) -> list[MemberRecord]:
        return sorted((m for m in self.members.values() if m.state != DEAD), key=lambda m: m.rank)

    def get(self, peer_id: str) -> MemberRecord | None:
        return self.members.get(peer_id)

    def live(self) -> int:
        """How many members are in the view (alive or suspect)."""
        return len(self._ranks)

    def _free_rank(self, wanted: int) -> int:
        if wanted >= 0:
            return wanted
        r = self._low
        while r in self._ranks:
            r += 1
        self._low = r
        return r

    @staticmethod
    def entry_bytes(peer_id: str, addr: str, rank: int, key: str) -> int:
        """The bytes of one member's entry in an encoded view (View.to_wire's list)."""
        return len(msgpack.packb([peer_id, addr, rank, key], use_bin_type=True))

    def _check_room(self, grow: int, peer_id: str, more: int) -> None:
        """Refuse a join that would take the view past its bounds: ``more`` members and
        ``grow`` bytes more than now."""
        if more and self.max_members is not None and self.live() + more > self.max_members:
            raise MembershipError(f"the swarm is full: {self.live()} members, the coordinator's "
                                  f"max_members = {self.max_members}; {peer_id!r} is not admitted")
        if grow > 0 and self.max_view_bytes is not None and self.view_bytes + grow > self.max_view_bytes:
            raise MembershipError(
                f"the view is full: with {peer_id!r} its member list would be {self.view_bytes + grow} bytes, "
                f"over the {self.max_view_bytes} that fit in a view message ({self.live()} members); "
                "shorter peer ids and addresses fit more")

    # -- changes (each returns True when the view must be republished)

    def join(self, peer_id: str, addr: str, rank: int, incarnation: int, route: bytes,
             last_epoch: int = 0, now: float | None = None, key: str = "",
             replace: bool = False, was: int = -1) -> MemberRecord:
        """Admit a peer, or raise MembershipError (duplicate live id, rank taken) and
        change nothing.

        A peer that comes back under the id of a dead member takes over its role:
        its rank (and so its place in the ring, its env seeds, its agent ids).
        With ``replace`` the id must be one the table knows, and dead: only one
        holder of an identity exists at a time. ``key`` is the CURVE key the join
        came with (empty without keys): a live id belongs to the key it joined with.
        ``was`` is the rank a peer that asks for none (``rank`` -1) held before, for a
        coordinator that does not remember it (restarted): it takes it again if it is free.
        """
        now = time.monotonic() if now is None else now
        # checked as View.from_wire checks a member: one admitted here is in every view
        # published after, and peers refuse a view with a bad member whole
        if not (isinstance(peer_id, str) and peer_id):
            raise MembershipError(f"peer_id must be a non-empty str, got {shown(peer_id)}")
        if not (isinstance(addr, str) and isinstance(key, str)):
            raise MembershipError(f"join of {shown(peer_id)}: addr and key must be strs, got {shown(addr)} and "
                                  f"{shown(key)}")
        if not (is_int(rank) and is_int(incarnation) and is_int(last_epoch)):
            raise MembershipError(f"join of {shown(peer_id)}: rank, incarnation and last_epoch must be ints, got "
                                  f"{shown(rank)}, {shown(incarnation)} and {shown(last_epoch)}")
        if rank < -1 or rank > MAX_RANK:
            raise MembershipError(f"rank {rank} is out of range: -1 (any free rank) or 0 to {MAX_RANK}")
        rank, incarnation, last_epoch = int(rank), int(incarnation), int(last_epoch)   # msgpack packs no numpy int
        old = self.members.get(peer_id)
        if old is not None and old.state != DEAD and old.key != key:
            # the incarnation is no secret (status shows it): without this, any listed key
            # could re-point a live member's address and key at itself
            raise MembershipError(f"peer id {peer_id!r} is alive and holds another CURVE key; "
                                  f"choose another id ({ANOTHER_ID})")
        if old is not None and old.state != DEAD:
            if old.incarnation == incarnation:
                # a retried or repeated join of the same process: refresh, keep its rank
                size = self.entry_bytes(peer_id, addr, old.rank, key)
                self._check_room(size - old.view_bytes, peer_id, 0)
                self._continue_above(last_epoch)
                self.view_bytes += size - old.view_bytes
                if old.state != ALIVE:   # back from suspect: its cause goes, as on a heartbeat or probe_ack
                    old.cause = ""
                old.route, old.addr, old.last_heartbeat, old.state, old.key = route, addr, now, ALIVE, key
                old.view_bytes = size
                return old
            if old.incarnation > incarnation:
                raise MembershipError(f"peer id {peer_id!r} is held by a newer process at {old.addr}")
            raise MembershipError(
                f"peer id {peer_id!r} is already alive at {old.addr}; "
                f"choose another id ({ANOTHER_ID}), or stop the peer that holds it first"
                + (" (a replacement waits until the coordinator has declared it dead)" if replace else ""))
        if replace and old is None:
            raise MembershipError(f"--replace {peer_id}: no such member to take over")
        # A peer that asked for no rank takes its old one back if no live member holds
        # it, else any free one: one that joined while it was frozen may hold it now,
        # and it was given that rank, not asked for it
        had = old.rank if old is not None else was
        if rank < 0 and 0 <= had <= MAX_RANK and had not in self._ranks:
            rank = had
        if rank >= 0:
            holder = self._ranks.get(rank)   # live members only; old, if any, is dead
            if holder is not None:
                raise MembershipError(f"rank {rank} is held by peer {holder!r}")
        rank = self._free_rank(rank)
        size = self.entry_bytes(peer_id, addr, rank, key)
        self._check_room(size, peer_id, 1)
        self._continue_above(last_epoch)
        rec = MemberRecord(peer_id, addr, rank, incarnation, route, last_heartbeat=now, key=key, view_bytes=size)
        self.members[peer_id] = rec
        self._ranks[rank] = peer_id
        self.view_bytes += size
        self._log("join", peer_id)
        return rec

    def _continue_above(self, last_epoch: int) -> None:
        # a restarted coordinator continues above what peers saw; only an admitted join
        # moves the epoch, as a refused one changes nothing
        if last_epoch > self.epoch:
            self.epoch = last_epoch

    def mark_dead(self, peer_id: str, cause: str) -> bool:
        m = self.members.get(peer_id)
        if m is None or m.state == DEAD:
            return False
        m.state, m.cause, m.died_at = DEAD, cause, time.monotonic()
        if self._ranks.get(m.rank) == peer_id:
            del self._ranks[m.rank]
            self._low = min(self._low, m.rank)
        self.view_bytes -= m.view_bytes
        self._log(cause, peer_id)
        return True

    def clear(self) -> None:
        """Forget every member (a standby that takes over: its peers re-join), and the view
        of them: joins were checked against it, and the next view went out as a change from it."""
        self.members.clear()
        self._ranks.clear()
        self._low = 0
        self.view_bytes = 0
        self.view = View(self.epoch)

    def log_event(self, event: str, who: str) -> None:
        """Record a coordinator event (takeover, standby) in the log."""
        self._log(event, who)

    def _log(self, event: str, peer_id: str) -> None:
        self.log.append((time.time(), event, peer_id))
        if len(self.log) > 2000:
            del self.log[:1000]

    def publish(self) -> View:
        """Bump the epoch and make the view of the alive members."""
        self.epoch += 1
        members = tuple(Member(m.id, m.addr, m.rank, m.key) for m in self.alive())
        self.view = View(self.epoch, members)
        return self.view

    def forget_dead(self, keep: int = MAX_DEAD) -> None:
        """Drop dead records after :data:`DEAD_KEPT_S`, and the oldest beyond ``keep``, so
        the table stays bounded however fast members come and go. Their age is elapsed
        time: a step of the wall clock (NTP, a resume from suspend) dropped them all at once."""
        cutoff = time.monotonic() - DEAD_KEPT_S
        dead = sorted((m.died_at, p) for p, m in self.members.items() if m.state == DEAD)
        over = len(dead) - keep
        for i, (died_at, pid) in enumerate(dead):
            if i < over or died_at < cutoff:
                del self.members[pid]

    def rows(self) -> list[dict[str, Any]]:
        """The table as plain rows for `swarm status`, and each member's neighbours
        (``stats["nbrs"]``) as a list of ids. A row holds the member's ``stats`` itself,
        not a copy: they are plain already (:func:`~swarm.coordinator.report.bound_stats`),
        and walking up to ~8,000 values of each member's again on every status read held
        the loop for seconds at a few thousand members (heartbeats unanswered, live
        members declared dead while a status page was open)."""
        now = time.monotonic()
        out = []
        for m in sorted(self.members.values(), key=lambda m: (m.state == DEAD, m.rank)):
            stats = m.stats
            nbrs = stats.get("nbrs")
            out.append({
                "id": m.id, "addr": m.addr, "rank": m.rank, "state": m.state,
                "incarnation": m.incarnation,
                "heartbeat_age_s": round(now - m.last_heartbeat, 3) if m.state != DEAD else None,
                # when the figures in stats arrived (most heartbeats are bare), for rates
                "stats_age_s": round(now - m.stats_at, 3) if m.stats_at else None,
                "linked_epoch": m.linked_epoch, "linked_at": m.linked_at,
                "neighbours": [n for n in nbrs if isinstance(n, str)][:64] if isinstance(nbrs, list) else [],
                "cause": m.cause, "stats": stats,
            })
        return out
