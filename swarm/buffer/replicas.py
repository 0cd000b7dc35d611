"""Which neighbours hold which local items, until ``k`` of them do.

:class:`~swarm.buffer.Federation` keeps one row per local item that fewer than
``k`` neighbours have acknowledged, in numpy columns (no per-item Python
objects): its seq and buffer index, and per *holder slot* whether that holder
has it (``held``) and whether a push of it to that holder awaits an ack
(``sent``), and how many pushes of it got no ack and have not gone again
(``again``). There are ``k`` slots, one for each of the peer's current first k
neighbours (its targets); a neighbour that stops being a target gives its slot
up and its copies stop counting (it may have died with them). A row leaves the
table when all k slots hold it (the item is safe) or when the local ring
overwrites the item (it can no longer be sent). So the table has at most as
many rows as there are local items in the ring, ``18 + 2k`` bytes each.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ReplicaTable"]


class ReplicaTable:
    """Local items held by fewer than ``k`` neighbours, and who holds each.

    >>> t = ReplicaTable(2)
    >>> t.add(np.arange(3), np.arange(3))
    >>> t.retarget(["a"])              # one neighbour: slot 0 is a's
    >>> t.to_send("a").tolist()
    [0, 1, 2]
    >>> t.ack("a", np.arange(3))       # a holds them all: still one holder short
    (array([], dtype=int64), array([], dtype=bool))
    >>> t.retarget(["a", "b"])         # b joins: what a holds goes to b
    >>> t.to_send("b").tolist(), t.ack("b", np.array([1]))[0].tolist()
    ([0, 1, 2], [1])
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.seq = np.zeros(0, np.int64)          # sorted: local seqs only grow
        self.idx = np.zeros(0, np.int64)          # the item's index in the local buffer
        self.held = np.zeros((0, k), bool)        # [row, slot]: that holder acknowledged it
        self.sent = np.zeros((0, k), bool)        # [row, slot]: a push to that holder awaits its ack
        self.told = np.zeros(0, bool)             # reported safe before (being replicated again)
        self.again = np.zeros(0, np.uint8)        # pushes of it given up on (no ack), not yet sent again
        self.slots: dict[str, int] = {}           # target -> its slot (column)

    def __len__(self) -> int:
        return int(self.seq.size)

    def add(self, seqs: np.ndarray, idx: np.ndarray, told: bool = False) -> None:
        """Rows for these items, held by no one; items that have a row keep it as it is."""
        seqs, idx = np.asarray(seqs, np.int64), np.asarray(idx, np.int64)
        if self.seq.size and seqs.size:
            fresh = ~np.isin(seqs, self.seq)
            seqs, idx = seqs[fresh], idx[fresh]
        if not seqs.size:
            return
        order = np.argsort(seqs, kind="stable")   # re-added items come in slot order
        seqs, idx = seqs[order], idx[order]
        n = seqs.size
        self.seq = np.concatenate([self.seq, seqs])
        self.idx = np.concatenate([self.idx, idx])
        self.held = np.concatenate([self.held, np.zeros((n, self.k), bool)])
        self.sent = np.concatenate([self.sent, np.zeros((n, self.k), bool)])
        self.told = np.concatenate([self.told, np.full(n, told)])
        self.again = np.concatenate([self.again, np.zeros(n, np.uint8)])
        if n < self.seq.size and seqs[0] < self.seq[-n - 1]:   # new items come last; re-added ones may not
            self._keep(np.argsort(self.seq, kind="stable"))

    def retarget(self, targets: list[str]) -> None:
        """Make the slots those of ``targets`` (at most k): a holder that is not one any
        more frees its slot, and what it held or was sent counts no longer."""
        for holder in [h for h in self.slots if h not in targets]:
            c = self.slots.pop(holder)
            self.held[:, c] = False
            self.sent[:, c] = False
        free = sorted(set(range(self.k)) - set(self.slots.values()))
        for dst in targets:
            if dst not in self.slots:
                self.slots[dst] = free.pop(0)

    def to_send(self, dst: str) -> np.ndarray:
        """Buffer indices of the rows target ``dst`` neither holds nor has on the way."""
        c = self.slots[dst]
        return self.idx[~self.held[:, c] & ~self.sent[:, c]]

    def mark(self, dst: str, seqs: np.ndarray, sent: bool) -> int:
        """A push of ``seqs`` to ``dst`` goes out (True) or will get no ack (False).
        Returns how many of a push that goes out are sent again after one given up on
        (each given-up push is counted once)."""
        rows = self._rows(seqs)
        c = self.slots.get(dst)
        if c is not None:
            self.sent[rows, c] = sent
        if not sent:
            self.again[rows] += self.again[rows] < 255   # at most one push per slot is under way
            return 0
        rows = rows[self.again[rows] > 0]
        self.again[rows] -= 1
        return int(rows.size)

    def on_the_way(self, dst: str, seqs: np.ndarray) -> None:
        """A push of ``seqs`` to ``dst`` from before it left the targets and came back is
        still on the way: it awaits its ack again (as :meth:`mark` with True, but it is
        not counted as sent again)."""
        c = self.slots.get(dst)
        if c is not None:
            self.sent[self._rows(seqs), c] = True

    def given_up(self, seqs: np.ndarray) -> np.ndarray:
        """Those of ``seqs`` with a push given up on that has not gone again (for :meth:`unmark`)."""
        rows = self._rows(seqs)
        return self.seq[rows[self.again[rows] > 0]]

    def unmark(self, dst: str, seqs: np.ndarray, given_up: np.ndarray) -> None:
        """Undo ``mark(dst, seqs, sent=True)`` for a push that did not go out (its send
        raised): ``given_up`` is what :meth:`given_up` said of ``seqs`` before the mark."""
        c = self.slots.get(dst)
        if c is not None:
            self.sent[self._rows(seqs), c] = False
        rows = self._rows(given_up)
        self.again[rows] += self.again[rows] < 255

    def drop(self, seqs: np.ndarray) -> None:
        """Remove the rows of ``seqs``: those items can be sent to no one."""
        if self.seq.size:
            self._keep(~np.isin(self.seq, np.asarray(seqs, np.int64)))

    def forget(self, holder: str, seqs: np.ndarray) -> None:
        """``holder`` may have lost its copies of ``seqs`` (it restarted)."""
        c = self.slots.get(holder)
        if c is not None:
            self.held[self._rows(seqs), c] = False

    def ack(self, dst: str, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``dst`` holds ``seqs``. Returns the seqs that k holders now hold (their rows
        leave the table) and, for each, whether it was reported safe before."""
        c = self.slots.get(dst)
        if c is None:                             # not a target (any more): its copies do not count
            return np.zeros(0, np.int64), np.zeros(0, bool)
        rows = self._rows(seqs)
        self.held[rows, c] = True
        self.sent[rows, c] = False
        safe = self.held.all(axis=1)
        out = self.seq[safe], self.told[safe]
        if out[0].size:
            self._keep(~safe)
        return out

    def drop_overwritten(self, ticket: np.ndarray) -> int:
        """Remove rows whose item the local ring overwrote (``ticket``: the index each
        slot holds); return how many."""
        live = ticket[self.idx % ticket.size] == self.idx
        gone = int(live.size - live.sum())
        if gone:
            self._keep(live)
        return gone

    def _rows(self, seqs: np.ndarray) -> np.ndarray:
        """Rows of those of ``seqs`` that have one."""
        seqs = np.asarray(seqs, np.int64)
        pos = np.minimum(np.searchsorted(self.seq, seqs), max(self.seq.size - 1, 0))
        if not self.seq.size:
            return pos[:0]
        return pos[self.seq[pos] == seqs]

    def _keep(self, sel: np.ndarray) -> None:
        self.seq, self.idx, self.told, self.again = self.seq[sel], self.idx[sel], self.told[sel], self.again[sel]
        self.held, self.sent = self.held[sel], self.sent[sel]
