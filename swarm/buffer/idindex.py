"""The id index of a replay buffer: item id ``(origin, seq)`` → slot, in fixed, preallocated memory.

Items received from other peers are deduplicated by id, and an overwritten
item must leave the index. A Python dict of tuples does that at ~150 bytes per
item, allocated as items arrive: a buffer of 200,000 foreign items grew its
peer by ~30 MB over the time it took to fill. This index is an open-addressing
hash table of slot numbers (int32, ``-1`` empty, ``-2`` deleted) of at least
four times the buffer's capacity, allocated and touched once: 16 bytes per
slot of capacity, the same at the start as when full.

The keys are not stored: a table entry holds a slot, and the slot's id is read
from the buffer's own ``origin`` and ``seq`` columns, which the caller passes
in. Every operation works on a whole batch at once (one numpy pass per probe
step). Deleted entries are left as tombstones and the table is rebuilt from
the live slots when they fill a quarter of it, so the load stays at most 1/2
and probe sequences stay short.
"""

from __future__ import annotations

import numpy as np

from ..errors import ReplayError

__all__ = ["IdIndex"]

_EMPTY, _DELETED = -1, -2
_K1 = np.uint64(0x9E3779B97F4A7C15)   # odd multipliers of the golden-ratio family (multiplicative hashing)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)


class IdIndex:
    """Maps ids ``(origin, seq)`` to the slots of a buffer of ``capacity`` slots.

    ``origin`` and ``seq`` are the buffer's per-slot columns (int32 and int64,
    length ``capacity``): the index reads an entry's key through them, so a slot
    must be removed *before* its columns are overwritten and added *after*.
    """

    def __init__(self, capacity: int, origin: np.ndarray, seq: np.ndarray) -> None:
        bits = max(4, int(np.ceil(np.log2(4 * capacity))))
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self._table = np.full(1 << bits, _EMPTY, dtype=np.int32)   # full(): every page touched now
        self._origin, self._seq = origin, seq
        self.count = 0       # live entries
        self._deleted = 0    # tombstones

    @property
    def nbytes(self) -> int:
        """Bytes the table holds (fixed for its life)."""
        return int(self._table.nbytes)

    def _home(self, origins: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        h = seqs.astype(np.uint64) * _K1
        h ^= origins.astype(np.uint64) * _K2
        return (h >> self._shift).astype(np.int64)

    def find(self, origins: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Slots holding the ids ``(origins[k], seqs[k])``, ``-1`` where absent."""
        origins, seqs = np.asarray(origins), np.asarray(seqs)
        out = np.full(origins.size, -1, dtype=np.int64)
        if self.count == 0 or origins.size == 0:
            return out
        pos = self._home(origins, seqs)
        todo = np.arange(origins.size)
        while todo.size:
            e = self._table[pos]
            live = e >= 0
            es = np.where(live, e, 0)
            hit = live & (self._origin[es] == origins[todo]) & (self._seq[es] == seqs[todo])
            out[todo[hit]] = e[hit]
            go = ~hit & (e != _EMPTY)      # keep probing past other keys and tombstones
            todo, pos = todo[go], (pos[go] + 1) & self._mask
        return out

    def add(self, slots: np.ndarray) -> None:
        """Index ``slots`` under the ids their columns hold now (ids absent and distinct)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if 2 * (self.count + self._deleted + slots.size) > self._table.size:
            self._rebuild(extra=slots)
            return
        self._place(slots)

    def _place(self, slots: np.ndarray) -> None:
        pos = self._home(self._origin[slots], self._seq[slots])
        while slots.size:
            cell = self._table[pos]
            free = cell < 0
            # Several keys may want one free cell: all are written, the one whose slot
            # reads back holds it and the others probe on (cheaper than np.unique on
            # the few keys of a message; the slots are distinct, so no two read back).
            self._table[pos[free]] = slots[free]
            took = free & (self._table[pos] == slots)
            self._deleted -= int(np.count_nonzero(cell[took] == _DELETED))
            self.count += int(np.count_nonzero(took))
            rest = ~took
            slots, pos = slots[rest], (pos[rest] + 1) & self._mask   # every free cell wanted is taken now

    def remove(self, slots: np.ndarray) -> None:
        """Drop the entries of ``slots`` (call before their columns change); absent ones are ignored."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0 or self.count == 0:
            return
        if slots.size > 1 and not (slots[1:] > slots[:-1]).all():
            slots = np.unique(slots)   # a repeat would be counted twice; increasing slots have none
        pos = self._home(self._origin[slots], self._seq[slots])
        while slots.size:
            e = self._table[pos]
            hit = e == slots
            self._table[pos[hit]] = _DELETED
            k = int(np.count_nonzero(hit))
            self.count -= k
            self._deleted += k
            go = ~hit & (e != _EMPTY)
            slots, pos = slots[go], (pos[go] + 1) & self._mask
        if 4 * self._deleted > self._table.size:
            self._rebuild()

    def clear(self) -> None:
        """Forget every entry (the table keeps its memory)."""
        self._table.fill(_EMPTY)
        self.count = self._deleted = 0

    def _rebuild(self, extra: np.ndarray | None = None) -> None:
        live = self._table[self._table >= 0].astype(np.int64)
        if extra is not None:
            live = np.concatenate([live, extra])
        if 2 * live.size > self._table.size:
            raise ReplayError(f"id index over half full ({live.size} of {self._table.size}); "
                                 "the buffer holds more ids than slots")
        self.clear()
        self._place(live)
