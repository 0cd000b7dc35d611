"""What gossip and the replay federation need from a transport: a *link*.

`swarm.gossip` and `swarm.buffer` import no sockets. They talk to neighbours
through an object with this shape, which :class:`swarm.peer.Peer` provides over
ZeroMQ and :mod:`swarm.gossip.sim` provides in memory for simulations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from inspect import iscoroutinefunction
from typing import Any, Awaitable, Callable, Protocol, Sequence

import numpy as np

from .checks import is_int
from .wire import Message, shown

__all__ = ["Member", "View", "Link", "Handler", "link_problem", "link_closed"]

Handler = Callable[[Message], Awaitable[None] | None]


@dataclass(frozen=True)
class Member:
    id: str
    addr: str
    rank: int
    key: str = ""      # CurveZMQ public key (Z85) when the swarm runs with keys


@dataclass(frozen=True)
class View:
    """A numbered membership view: the ordered member list of one epoch.

    Position in ``members`` (sorted by rank) is what topologies use, so a hole
    left by a dead peer closes at once.
    """

    epoch: int
    members: tuple[Member, ...] = field(default_factory=tuple)

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.members]

    @cached_property
    def _positions(self) -> dict[str, int]:
        # built once per view (views are immutable): every message's sender is
        # looked up, and a scan cost ~40 us a message at 1,000 members, 0.4 ms at 10,000
        positions: dict[str, int] = {}
        for i, m in enumerate(self.members):
            positions.setdefault(m.id, i)   # the first, as a scan finds it
        return positions

    def index(self, peer_id: str) -> int:
        return self._positions.get(peer_id, -1)

    def member(self, peer_id: str) -> Member | None:
        i = self.index(peer_id)
        return self.members[i] if i >= 0 else None

    def to_wire(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "members": [[m.id, m.addr, m.rank, m.key] for m in self.members]}

    def delta(self, base: "View") -> dict[str, Any]:
        """The change from ``base`` to this view: members added (or changed) and ids removed.

        At 1,000 members a full view is tens of kB; a death or a join is a few bytes.
        """
        old = {m.id: m for m in base.members}
        ids = {m.id for m in self.members}
        return {"epoch": self.epoch, "base": base.epoch,
                "add": [[m.id, m.addr, m.rank, m.key] for m in self.members if old.get(m.id) != m],
                "remove": [i for i in old if i not in ids]}

    def apply(self, d: dict[str, Any]) -> "View":
        """This view with a delta from :meth:`delta` applied (its ``base`` must be our epoch).

        ValueError for a delta that is not one: a key missing, against another epoch,
        going back to an earlier one, or whose ``add``/``remove`` are not lists of
        members/ids (a str ``remove`` would take ids out one character at a time), or
        that adds an id twice."""
        # values quoted through shown(): a coordinator's (or whoever sent it) choice, so the
        # text is bounded and made without rendering a huge value whole
        try:
            base, epoch, add, remove = d["base"], d["epoch"], d["add"], d["remove"]
        except (KeyError, TypeError):
            raise ValueError(f"a delta has base, epoch, add and remove, got {shown(d)}") from None
        if not (is_int(base) and is_int(epoch)):
            raise ValueError(f"delta epochs must be integers, got base {shown(base)} and epoch {shown(epoch)}")
        if base != self.epoch:
            raise ValueError(f"delta is against epoch {base}, this view is epoch {self.epoch}")
        if epoch < base:
            raise ValueError(f"delta goes back from epoch {base} to {epoch}")
        if not isinstance(remove, (list, tuple)) or not all(isinstance(i, str) for i in remove):
            raise ValueError(f"delta's remove must be a list of peer ids, got {shown(remove)}")
        if not isinstance(add, (list, tuple)) or not all(isinstance(m, (list, tuple)) and 3 <= len(m) <= 4
                                                         for m in add):
            raise ValueError(f"delta's add must be a list of [id, addr, rank(, key)], got {shown(add)}")
        gone = set(remove)
        added = tuple(map(_member, add))
        new_ids = {m.id for m in added}
        if len(new_ids) < len(added):
            raise ValueError("delta's add lists a peer id twice")
        keep = [m for m in self.members if m.id not in gone and m.id not in new_ids]
        return View(int(epoch), tuple(sorted(keep + list(added), key=lambda m: m.rank)))

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "View":
        """The view in a coordinator's message; ValueError for one that is not a view."""
        try:
            epoch, members = d["epoch"], d["members"]
        except (KeyError, TypeError):
            raise ValueError(f"a view has epoch and members, got {shown(d)}") from None
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"a view's epoch must be an integer >= 0, got {shown(epoch)}")
        if not isinstance(members, (list, tuple)):
            raise ValueError(f"a view's members must be a list, got {shown(members)}")
        ms = tuple(map(_member, members))
        if len({m.id for m in ms}) < len(ms):
            raise ValueError("a view lists a peer id twice")
        return cls(int(epoch), ms)


def _member(m: Any) -> Member:
    """``[id, addr, rank(, key)]`` from the wire, checked: ids, addresses and keys are
    strings (an id of None read as "None"), ranks integers >= 0."""
    if not (isinstance(m, (list, tuple)) and 3 <= len(m) <= 4):
        raise ValueError(f"a member is [id, addr, rank(, key)], got {shown(m)}")
    pid, addr, rank, key = (*m, "")[:4]
    if not (isinstance(pid, str) and pid and isinstance(addr, str) and isinstance(key, str)):
        raise ValueError(f"a member's id (non-empty), address and key are strings, got {shown(m)}")
    if not is_int(rank) or rank < 0:
        raise ValueError(f"member {shown(pid)}: rank must be an integer >= 0, got {shown(rank)}")
    return Member(pid, addr, int(rank), key)


class Link(Protocol):
    """A peer's connection to its neighbours, as gossip and the buffer see it."""

    @property
    def id(self) -> str: ...

    @property
    def view(self) -> View: ...

    def neighbours(self) -> list[str]:
        """Current neighbour ids, from the view and the peer's topology."""
        ...

    async def send(self, dst: str, t: str, body: dict[str, Any] | None = None,
                   arrays: Sequence[np.ndarray] = (), *, timeout: float | None = None) -> bool:
        """Send to one peer. Returns False if the message was dropped (queue full
        past ``timeout``, or unknown peer); never raises for a slow neighbour."""
        ...

    def send_nowait(self, dst: str, t: str, body: dict[str, Any] | None = None,
                    arrays: Sequence[np.ndarray] = ()) -> bool:
        """:meth:`send` without waiting, on the link's event loop; False if dropped."""
        ...

    def on(self, t: str, handler: Handler) -> None:
        """Call ``handler(msg)`` for every message of type ``t`` received."""
        ...

    def on_view(self, callback: Callable[[View], None]) -> None:
        """Call ``callback(view)`` whenever a new view is installed."""
        ...

    # Optional: a link may lack the two below (a test double, say). Whoever takes
    # its handlers off on close looks them up with getattr and skips what is missing;
    # on such a link the handlers then stay until the link itself goes.

    def off(self, t: str, handler: Handler) -> bool:
        """Undo one :meth:`on` (what a closed Gossip, relay or federation calls);
        False if ``handler`` was not registered for ``t``."""
        ...

    def off_view(self, callback: Callable[[View], None]) -> bool:
        """Undo one :meth:`on_view`; False if ``callback`` was not registered."""
        ...


def link_problem(link: Any, send: str = "send") -> str | None:
    """What keeps ``link`` from being a :class:`Link`, in words; None where nothing does.
    ``send``: the sending method the caller uses (the relay sends with ``send_nowait``).

    Checked where an engine is built, so that a wrong object (a ``SyncPeer``, whose
    ``send`` blocks and returns a bool) is named there, not by a ``TypeError`` from
    inside the first round.
    """
    if hasattr(link, "peer") and hasattr(link, "call") and not iscoroutinefunction(getattr(link, "send", None)):
        return (f"link is a {type(link).__name__}, a blocking facade: pass its .peer (the Peer on its loop), "
                "and build and run the engine there (through call())")
    missing = [a for a in ("id", "neighbours", send, "on") if not hasattr(link, a)]
    if missing:
        return (f"link must have the swarm.link.Link shape (a Peer, a SimLink); "
                f"{type(link).__name__} has no {', '.join(missing)}")
    if send == "send" and not iscoroutinefunction(link.send):
        return (f"link.send of {type(link).__name__} is not a coroutine function (async def): the engines "
                "await it; pass a Peer or a SimLink")
    return None


def link_closed(link: Any) -> bool:
    """Whether ``link`` is a Peer that has closed (its ``state`` says so); a link without a
    state (a SimLink, a test double) never is. What the engines check to close with it."""
    return getattr(getattr(link, "state", None), "value", None) == "closed"
