"""The local replay buffer: columnar numpy storage, a ring, prioritized sampling with age decay.

Priority of item i at time t::

    P_i(t)  ∝  (|td_i| + eps)^alpha · exp(-decay · (t - origin_time_i))

The tree stores ``(|td|+eps)^alpha · exp(decay · (origin_time - base))``: the
factor ``exp(-decay · (t - base))`` is common to all items and cancels in the
sampling probabilities, so ageing costs nothing per step. When the stored
exponents grow large the leaves are rescaled once and ``base`` moves forward
(a *rebase*, O(capacity), every ``rebase_after / decay`` seconds).

A buffer restored from a snapshot with decay keeps its time running from where
the snapshot stopped: its times (stored origin times, ``base``, now) run behind
``clock()`` by the pause, so the pause is not counted as age (see ``_lag``).
Origin times given to it and handed out by it are the clock's.

Each item has an *index*: its insertion number, unique for the life of the
buffer. Its slot is ``index % capacity``; a slot remembers the index it holds,
so a priority update for an index whose slot has been overwritten since it was
sampled is ignored (slot generations).

Each item also has an *id*, ``(origin peer, seq)``, by which peers sharing items
tell them apart. A buffer numbers its own items from a floor taken from the wall
clock (:func:`seq_floor`), not from 0: a process restarted under the same peer id
with a fresh buffer must not hand out ids its predecessor gave to items that
neighbours still hold (they would drop the new items as duplicates).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..checks import is_int, is_real
from ..errors import ReplayError
from ..wire import MAX_SRC_LEN
from .idindex import IdIndex
from .limiter import RateLimiter
from .schema import Schema
from .sumtree import SumTree, _floats

__all__ = ["ReplayBuffer", "Sample", "Items", "SAMPLERS", "seq_floor"]

SAMPLERS = ("prioritized", "uniform", "fifo")

# Rescale stored priorities once decay·(t − base) passes this: e^40 ≈ 2e17 keeps
# fresh items far from float64 overflow while items 700/decay seconds old
# underflow to zero, where their true probability already is.
_REBASE_AFTER = 40.0
# Up to this many received items a Python set finds repeated ids faster than
# numpy's sort (5 times at 8 items; slower from about a hundred on).
_FEW = 32
# The origin id list is compacted once it is this long, or twice as long as after
# the last compaction if that is more (see ReplayBuffer._compact_peers).
_COMPACT_PEERS = 64
_SEQ_MAX = int(np.iinfo(np.int64).max)
# Local seqs issued per millisecond of wall clock before a successor's floor could
# fall among them (see seq_floor).
_SEQ_PER_MS_BITS = 16


def seq_floor() -> int:
    """A first local sequence number above any that an earlier process could have issued.

    Milliseconds since the epoch times 65,536: a process that started earlier under
    the same peer id issued ids below this unless it added more than 65,536 items
    per millisecond since its own start, or the wall clock was set back between the
    two starts. Fits an int64 for another ~4,000 years.
    """
    return (time.time_ns() // 1_000_000) << _SEQ_PER_MS_BITS


@dataclass
class Sample:
    """A sampled batch.

    ``batch`` maps each schema field to an array of ``n`` items; ``indices``
    identify the items for :meth:`ReplayBuffer.update_priorities`; ``weights``
    are the importance weights ``(N·P(i))^-beta / max_j (N·P(j))^-beta`` (float32,
    max over every item in the buffer, i.e. the least likely one, as in the PER
    paper, or over the batch with age decay (see :meth:`ReplayBuffer.sample`); all
    ones for uniform and FIFO sampling); ``probabilities`` are P(i).
    """

    batch: dict[str, np.ndarray]
    indices: np.ndarray
    weights: np.ndarray
    probabilities: np.ndarray
    origin_times: np.ndarray

    def __len__(self) -> int:
        return int(self.indices.size)


@dataclass
class Items:
    """Items with their ids, as they travel between peers or leave the buffer.

    ``origins`` index into ``peers`` (origin peer ids); ``seqs`` are the origin's
    sequence numbers, so ``(peers[origins[k]], seqs[k])`` is item k's id.
    ``priorities`` are raw priorities ``(|td|+eps)^alpha`` without age.
    """

    fields: dict[str, np.ndarray]
    peers: list[str]
    origins: np.ndarray
    seqs: np.ndarray
    times: np.ndarray
    priorities: np.ndarray

    def __len__(self) -> int:
        return int(self.seqs.size)


class ReplayBuffer:
    """Fixed-capacity replay buffer over a declared schema.

    >>> buf = ReplayBuffer({"obs": ("float32", (4,)), "action": ("int64", ())}, capacity=8, seed=0)
    >>> idx = buf.add({"obs": np.zeros((3, 4), np.float32), "action": np.arange(3)})
    >>> s = buf.sample(2, beta=0.4)
    >>> sorted(s.batch), s.weights.dtype.name, len(buf)
    (['action', 'obs'], 'float32', 3)

    Args:
        schema: ``{field: (dtype, shape)}`` or a :class:`Schema`.
        capacity: number of slots; the oldest item is overwritten when full.
        alpha: priority exponent (0 gives uniform sampling through the tree).
        eps: added to ``|td|`` so that no item's priority is zero.
        decay: λ, per second; priorities shrink by ``exp(-λ·age)``.
        prioritized: shorthand for ``sampler="prioritized"`` (True) or ``"uniform"``.
        sampler: ``"prioritized"``, ``"uniform"`` or ``"fifo"`` (each item sampled
            once, oldest first, like a queue); overrides ``prioritized``.
        stratified: draw one prefix sum per equal slice of the total (lower variance,
            as in the PER paper); False draws i.i.d.
        seed: seed of the sampling generator.
        clock: seconds (a finite number; anything else is a ReplayError when read), used
            for the origin time of locally added items and for age. A buffer restored
            by :meth:`load` with decay does not count the time between the snapshot and
            the restore as age.
        peer_id: the origin id stamped on locally added items.
        first_seq: the seq of the first locally added item (ids are ``(peer_id, seq)``).
            Default: :func:`seq_floor`, from the wall clock, so that a process restarted
            under the same ``peer_id`` issues no id its predecessor did; pass 0 for ids
            that are the same in every run (tests).
        limiter: a :class:`RateLimiter` (default: ``min_size=1``, no ratio).

    Thread-safe: sampling, adding, updating and saving may run on different threads.
    """

    def __init__(self, schema: Mapping[str, Any] | Schema, capacity: int, *, alpha: float = 0.6,
                 eps: float = 1e-6, decay: float = 0.0, prioritized: bool = True,
                 sampler: str | None = None, stratified: bool = True, seed: int | None = None,
                 clock: Callable[[], float] = time.time, peer_id: str = "local",
                 first_seq: int | None = None, limiter: RateLimiter | None = None) -> None:
        self.schema = Schema(schema)
        if not (is_int(capacity) and capacity >= 1):
            raise ReplayError(f"capacity must be an int >= 1, got {capacity!r}")
        if not (is_real(alpha) and 0 <= alpha <= 10):
            raise ReplayError(f"alpha must be a number in [0, 10], got {alpha!r}")
        if not (is_real(eps) and eps > 0 and math.isfinite(eps)):
            raise ReplayError(f"eps must be a finite number > 0, got {eps!r}")
        if not (is_real(decay) and decay >= 0 and math.isfinite(decay)):
            raise ReplayError(f"decay must be a finite number >= 0 (per second), got {decay!r}")
        sampler = sampler if sampler is not None else ("prioritized" if prioritized else "uniform")
        if sampler not in SAMPLERS:
            raise ReplayError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if not isinstance(peer_id, str) or not peer_id or len(peer_id) > MAX_SRC_LEN:
            raise ReplayError(f"peer_id must be a str of 1 to {MAX_SRC_LEN} chars (a peer id), "
                              f"got {peer_id!r:.100}")
        # The seed goes into snapshots' meta.json: an int or None, nothing numpy-only.
        if seed is not None and not (is_int(seed) and seed >= 0):
            raise ReplayError(f"seed must be an int >= 0 or None, got {seed!r}")
        if first_seq is not None and not (is_int(first_seq) and 0 <= first_seq <= _SEQ_MAX):
            raise ReplayError(f"first_seq must be an int in [0, {_SEQ_MAX}] or None, got {first_seq!r}")
        if not callable(clock):
            raise ReplayError(f"clock must be a function returning seconds, got {clock!r}")
        if limiter is not None and not isinstance(limiter, RateLimiter):
            raise ReplayError(f"limiter must be a RateLimiter or None, got {limiter!r}")
        self.capacity = int(capacity)
        self.alpha, self.eps, self.decay = float(alpha), float(eps), float(decay)
        self.sampler, self.stratified = sampler, bool(stratified)
        self.clock = clock
        self.peer_id = peer_id
        self.limiter = limiter if limiter is not None else RateLimiter()
        self._seed = None if seed is None else int(seed)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        cap = self.capacity
        # The largest raw priority kept: the tree's sum of every leaf stays finite
        # (alpha 8 takes a float32 TD error of 3e38 to 6e305, and three of them to inf).
        self._max_raw = sys.float_info.max / (4 * cap)
        # Fixed capacity, memory committed up front: every column is written once
        # here (np.zeros alone maps pages lazily, so a process would grow as the
        # ring fills). A buffer that does not fit fails now, not hours into a run.
        self._data = {f.name: _allocated(f"field {f.name!r}", (cap,) + f.shape, f.dtype) for f in self.schema}
        ids = "the item ids and times"
        self._ticket = _allocated(ids, cap, np.int64, fill=-1)   # index held by each slot
        self._origin = _allocated(ids, cap, np.int32)          # into self._peers; 0 is this peer
        self._seq = _allocated(ids, cap, np.int64)
        self._time = _allocated(ids, cap, np.float64)
        try:
            self._tree = SumTree(cap)
            self._foreign = IdIndex(cap, self._origin, self._seq)   # (origin, seq) -> slot, items from others
        except (MemoryError, ValueError) as e:
            raise ReplayError(f"capacity {cap}: the priority tree and id index cannot be allocated "
                              f"({e}): give a smaller capacity") from None
        self._peers: list[str] = [peer_id]
        self._peer_index: dict[str, int] = {peer_id: 0}
        self._compact_at = _COMPACT_PEERS   # compact the origin list when it grows past this
        self._next = 0            # index of the next item written
        self._next_seq = seq_floor() if first_seq is None else int(first_seq)   # next local seq
        self._read = 0            # FIFO cursor (an index)
        self._max_p = 1.0         # running max raw priority; new items get it
        # Seconds this buffer's times (the _time column, _base, _now) run behind clock():
        # the pause between a snapshot and its restore, which is not age (persist.load
        # sets it). Origin times cross the API in the clock's time: add(times=), insert,
        # items and Sample convert them.
        self._lag = 0.0
        self._base = self._now() if self.decay else 0.0
        self._listeners: list[Callable[[np.ndarray], None]] = []
        self._saver: Any = None   # an active background snapshot, see persist.py
        self._arange = np.zeros(0)  # strata offsets 0..n-1 of the last batch size

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return min(self._next, self.capacity)

    @property
    def max_priority(self) -> float:
        """The largest raw priority ``(|td|+eps)^alpha`` seen so far (new items get it)."""
        return self._max_p

    @property
    def total_added(self) -> int:
        """Items ever written, local and received (the next item's index)."""
        return self._next

    def peers(self) -> list[str]:
        """Origin peer ids known to this buffer (index 0 is this peer): those of the
        items it holds, and perhaps some whose items are gone (they are dropped, and
        the others renumbered, each time the list has doubled)."""
        return list(self._peers)

    def on_add(self, callback: Callable[[np.ndarray], None]) -> None:
        """Call ``callback(indices)`` after each local :meth:`add` (used by federation)."""
        self._listeners.append(callback)

    def off_add(self, callback: Callable[[np.ndarray], None]) -> bool:
        """Stop calling ``callback`` after adds (undo one :meth:`on_add`); False if it was
        not registered. A new list: an :meth:`add` on another thread may be going over
        the old one."""
        if callback not in self._listeners:
            return False
        i = self._listeners.index(callback)
        self._listeners = self._listeners[:i] + self._listeners[i + 1:]
        return True

    # -------------------------------------------------------------- inserting
    def add(self, items: Mapping[str, Any], *, times: Any = None) -> np.ndarray:
        """Add a batch of items (each field shaped ``(n, *shape)``); return their indices.

        New items get the current max priority. ``times`` are origin times in
        seconds (scalar or ``(n,)``; default ``clock()``); times in the future
        are clipped to now, as for received items. Bad items raise
        :class:`ReplayError` naming the field, and nothing is stored. An empty
        batch stores nothing.
        """
        arrays, n = self.schema.check(items)
        t = self._times(times, n)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        with self._lock:
            if self._next_seq > _SEQ_MAX - n + 1:
                raise ReplayError(f"local seqs would pass {_SEQ_MAX} (the next is {self._next_seq}, "
                                  f"{n} items): nothing stored; give a smaller first_seq")
            seqs = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
            self._next_seq += n
            idx = self._write(arrays, n, 0, seqs, t, None)
        for cb in self._listeners:
            cb(idx)
        return idx

    def add_one(self, **fields: Any) -> int:
        """Add a single item given as keyword fields (each shaped like the schema field)."""
        return int(self.add({k: np.asarray(v)[None] for k, v in fields.items()})[0])

    def insert(self, items: Items, *, priority_clip: float | None = None, limit: bool = False) -> np.ndarray:
        """Store items received from other peers, keeping their ids, origin times and priorities.

        Items already present (same id) or originating here are dropped;
        priorities are clipped to ``priority_clip`` (default: this buffer's max
        priority) so a neighbour cannot flood the sampler, and to ``float max / (4 *
        capacity)`` so their sum stays finite, and raised to
        ``eps**alpha`` unless 0 (a forgotten item stays forgotten); origin times in
        the future are clipped to now. With ``limit``, only as many of the remaining
        (new) items as the rate limiter's ``insert_room()`` allows are stored, the
        last ones in ``items``: duplicates take no room. Of more new items than
        ``capacity``, only the newest ``capacity`` are stored. Returns the indices of
        the items stored.
        """
        return self._insert(items, priority_clip, limit)[0]

    def _insert(self, items: Items, priority_clip: float | None, limit: bool) -> tuple[np.ndarray, int, int]:
        """:meth:`insert`, and how many new items were left out: for the rate limiter's
        room, and then for the ring's (of more new items than ``capacity``, only the
        newest ``capacity`` are written)."""
        if priority_clip is not None and not (is_real(priority_clip) and priority_clip > 0):
            raise ReplayError(f"priority_clip must be a number > 0 or None, got {priority_clip!r}")
        if not isinstance(items, Items):
            raise ReplayError(f"insert takes Items (as ReplayBuffer.items returns), "
                              f"got {type(items).__name__}")
        # a str would pass as a list of one-letter names
        if not isinstance(items.peers, (list, tuple)):
            raise ReplayError(f"items.peers must be a list of origin peer ids, got "
                              f"{type(items.peers).__name__} {items.peers!r:.80}")
        arrays, n = self.schema.check(items.fields)
        try:
            origins = np.asarray(items.origins)
            seqs, times, pri = (np.asarray(a) for a in (items.seqs, items.times, items.priorities))
        except (TypeError, ValueError) as e:   # ragged lists: numpy's own ValueError
            raise ReplayError(f"items.origins, seqs, times and priorities must be arrays of numbers: {e}") from None
        for name, a, kind in (("origins", origins, "iu"), ("seqs", seqs, "iu"),
                              ("times", times, "f"), ("priorities", pri, "f")):
            if a.shape != (n,) or a.dtype.kind not in kind:
                raise ReplayError(f"items.{name}: expected shape ({n},) of kind {kind!r}, "
                                  f"got {a.shape} {a.dtype}")
        # Local seqs count up from a floor >= 0; a uint64 past int64's range would wrap to a negative id.
        if n and (_below(seqs, 0) or _above(seqs, _SEQ_MAX)):
            raise ReplayError(f"items.seqs must be in [0, {_SEQ_MAX}], got [{seqs.min()}, {seqs.max()}]")
        if n and (_below(origins, 0) or _above(origins, len(items.peers) - 1)):
            raise ReplayError(f"items.origins must index items.peers (0..{len(items.peers) - 1})")
        if not all(isinstance(p, str) and 0 < len(p) <= MAX_SRC_LEN for p in items.peers):
            # no peer has a longer id (the wire's bound); kept, each would stay while its items do
            raise ReplayError(f"items.peers must be strings of 1 to {MAX_SRC_LEN} chars (peer ids)")
        # A min and a max find a NaN too (it passes through both, and fails every comparison).
        # Compared in their own dtype: a long double past float64's range is finite.
        if n and not (-math.inf < _min(times) and _max(times) < math.inf
                      and 0 <= _min(pri) and _max(pri) < math.inf):
            raise ReplayError("items.times and items.priorities must be finite, priorities >= 0")
        with self._lock:
            now = self._now()
            # A name listed twice in items.peers is one origin: use its first position.
            if len(set(items.peers)) == len(items.peers):   # as a message's peers are: no renumbering
                origins = origins.astype(np.int64)
            else:
                first_of: dict[str, int] = {}
                canon = np.array([first_of.setdefault(p, i) for i, p in enumerate(items.peers)], dtype=np.int64)
                origins = canon[origins] if n else origins.astype(np.int64)
            # Origin numbers in this buffer for the message's peers (-1: not known here yet).
            known = np.array([self._peer_index.get(p, -1) for p in items.peers], dtype=np.int64)
            lo = known[origins]
            sseq = seqs.astype(np.int64)
            # Items that originate here are not stored, nor ids held already (the index
            # holds no id of origin 0 or -1: no need to pick those items out for find).
            keep = lo != 0
            keep &= self._foreign.find(lo, sseq) < 0
            # Repeats within the message: the first copy of each id is kept. Most messages
            # have none, and on a few items a set of the ids tells so faster than a sort.
            if n > _FEW or len(set(zip(origins.tolist(), sseq.tolist()))) < n:
                keep &= _first_copies(origins, sseq)
            sel = np.flatnonzero(keep)
            over = max(0, sel.size - self.limiter.insert_room()) if limit else 0
            sel = sel[over:]
            if not sel.size:
                return np.zeros(0, dtype=np.int64), over, 0
            if sel.size < n:   # else every item is stored: no copies to pick them out
                arrays = {k: v[sel] for k, v in arrays.items()}
                origins, sseq, pri, times = origins[sel], sseq[sel], pri[sel], times[sel]
            for o in sorted(set(origins.tolist())):
                if known[o] < 0:
                    known[o] = self._peer_index[items.peers[o]] = len(self._peers)
                    self._peers.append(items.peers[o])
            lo = known[origins].astype(np.int32)
            # at most _max_raw, as update_priorities() caps: a sum of larger ones overflows
            clip = min(self._max_p if priority_clip is None else float(priority_clip), self._max_raw)
            # dtype=float64 casts before comparing, as astype() did: new arrays, never the caller's
            if pri.dtype.itemsize > 8:   # a long double past float64: inf, which the clip takes
                with np.errstate(over="ignore"):
                    raw = np.minimum(pri, clip, dtype=np.float64)
            else:
                raw = np.minimum(pri, clip, dtype=np.float64)
            # Positive ones are raised to the floor; a 0 (forgotten, or decayed to nothing, at
            # its sender) stays 0: the floor would make it this buffer's smallest priority,
            # shrinking every other item's importance weight, and draw it again.
            np.maximum(raw, self.eps ** self.alpha, out=raw, where=raw > 0)
            if times.dtype.itemsize > 8:
                # A long double past float64's range would be cast to an infinity: -inf, which
                # every neighbour and a snapshot's load refuse, stored. The oldest float64 time
                # instead (a time past the newest is clipped to now just below).
                times = np.clip(times, -sys.float_info.max, sys.float_info.max)
            if self._lag:   # the clock's times, into this buffer's
                times = times.astype(np.float64) - self._lag
            t = np.minimum(times, now, dtype=np.float64)
            idx = self._write(arrays, sel.size, lo, sseq, t, raw)
            # Only the newest `capacity` of a huge batch were written.
            self._foreign.add(idx % self.capacity)
            if len(self._peers) > self._compact_at:
                self._compact_peers()
        return idx, over, sel.size - idx.size

    def _take_id(self, peer_id: str) -> bool:
        """Name this buffer's own items (origin 0, stored and to come) ``peer_id``, where
        the buffer has the default id and none of its other origins is ``peer_id`` (a
        :class:`Federation` gives it its peer's id); whether it did. Items stored under the
        default id are this buffer's own (a snapshot of the releases before the forty-sixth
        session's, made as their docs showed, holds nothing else): they go out under it."""
        with self._lock:
            if self.peer_id != "local" or peer_id in self._peer_index:
                return False
            self.peer_id, self._peers[0] = peer_id, peer_id
            del self._peer_index["local"]
            self._peer_index[peer_id] = 0
            return True

    def _compact_peers(self) -> None:
        """Drop the origin ids no stored item refers to and renumber the rest (lock held).

        A restarted neighbour is a new origin id: without this the list grew by one
        id (~140 B) per restart whose items ever reached the buffer, and never
        shrank. It runs when the list passes twice its length after the last
        compaction (at least ``_COMPACT_PEERS``), so its O(capacity) cost (the origin
        column and the id index, which hashes origin numbers) is spread over at
        least as many new ids as it kept. This peer stays origin 0. Deferred while
        a snapshot is being written (or an increment or a digest read, chunk by chunk,
        by :mod:`swarm.buffer.persist`): its rows not yet copied would be renumbered
        while its meta.json keeps the old list (the next insert tries again).
        """
        if self._saver is not None:
            return
        n = len(self)                       # the ring fills slots in order: [0, n) hold items
        origin = self._origin[:n]           # a view: the id index reads this column
        used = np.zeros(len(self._peers), dtype=bool)
        used[origin] = True
        used[0] = True
        if not used.all():
            number = (np.cumsum(used) - 1).astype(np.int32)   # old origin number -> new
            origin[...] = number[origin]
            self._peers = [p for p, u in zip(self._peers, used.tolist()) if u]
            self._peer_index = {p: i for i, p in enumerate(self._peers)}
            self._foreign.clear()
            self._foreign.add(np.flatnonzero(origin != 0))
        self._compact_at = max(_COMPACT_PEERS, 2 * len(self._peers))

    def _times(self, times: Any, n: int) -> np.ndarray:
        if times is None:
            t = np.empty(n, dtype=np.float64)
            t.fill(self._now())
            return t
        t = _floats(times, "times")
        if t.ndim == 0:
            t = np.full(n, float(t))
        if t.shape != (n,) or not np.isfinite(t).all():
            raise ReplayError(f"times must be a finite scalar or shape ({n},), got shape {t.shape}")
        # A time in the future would move the decay base past now on the next rebase,
        # and every item added before it would decay to nothing at once.
        return np.minimum(t - self._lag, self._now())

    def _now(self) -> float:
        """``clock()`` in this buffer's time (less ``_lag``), or ReplayError before anything
        is written: a NaN time stored would make every neighbour drop the item, and one
        that is not a number would fail half-way through an add."""
        t = self.clock()
        if not (is_real(t) and math.isfinite(t)):
            raise ReplayError(f"clock() returned {t!r:.80}: it must return a finite number of seconds")
        return float(t) - self._lag

    def _write(self, arrays: dict[str, np.ndarray], n: int, origin: Any, seqs: np.ndarray,
               times: np.ndarray, raw: np.ndarray | None) -> np.ndarray:
        """Write n validated items at the ring head (lock held). ``raw=None``: max priority."""
        cap = self.capacity
        if n > cap:  # only the newest `cap` survive; skip writing the rest
            drop = n - cap
            self._next += drop
            arrays = {k: v[drop:] for k, v in arrays.items()}
            seqs, times = seqs[drop:], times[drop:]
            origin = origin[drop:] if isinstance(origin, np.ndarray) else origin
            raw = raw[drop:] if raw is not None else None
            n = cap
        idx = np.arange(self._next, self._next + n, dtype=np.int64)
        start = self._next % cap
        # One or two contiguous runs: slicing is much faster than fancy indexing.
        runs = [(start, min(cap, start + n), 0)]
        if start + n > cap:
            runs.append((0, start + n - cap, cap - start))
        leaf = None
        if self.sampler == "prioritized" and (raw is not None or self.decay):
            # Computed and checked before any column is written: a refused leaf must leave
            # the items out whole, not in the ring but missing from the id index and tree.
            if self.decay:
                self._maybe_rebase(float(np.maximum.reduce(times)))
            leaf = self._leaf(np.full(n, self._max_p) if raw is None else raw, times)
            # a NaN fails it too (and is the min); a long double priority past float64's
            # range is finite where the items were checked and Inf as a leaf
            if not (0.0 <= np.minimum.reduce(leaf) and np.maximum.reduce(leaf) < math.inf):
                raise ReplayError("priorities of the items to store must be finite and >= 0; nothing stored")
        if self._saver is not None:
            self._saver.preserve(idx % cap)
        # Overwritten items from others leave the id index. Only a slot that holds an item
        # (ticket >= 0) can be in it: while the ring fills, one look at the tickets of the
        # runs says there is nothing to remove (three fancy indexings less per add).
        if self._foreign.count and any(np.maximum.reduce(self._ticket[a:b]) >= 0 for a, b, _ in runs):
            slots = idx % cap
            hit = (self._origin[slots] != 0) & (self._ticket[slots] >= 0)
            self._foreign.remove(slots[hit])
        whole = len(runs) == 1   # the arrays go in as they are, without slicing them
        for a, b, off in runs:
            m = b - a
            for name, col in self._data.items():
                col[a:b] = arrays[name] if whole else arrays[name][off:off + m]
            self._ticket[a:b] = idx if whole else idx[off:off + m]
            if isinstance(origin, np.ndarray):
                self._origin[a:b] = origin if whole else origin[off:off + m]
            else:
                self._origin[a:b] = origin
            self._seq[a:b] = seqs if whole else seqs[off:off + m]
            self._time[a:b] = times if whole else times[off:off + m]
        self._next += n
        self.limiter.inserted += n
        if self.sampler == "prioritized":
            if leaf is None:
                # Local items without decay all get the same leaf: no array to build.
                for a, b, off in runs:
                    self._tree.fill_range(a, b - a, self._max_p)
                return idx
            if raw is not None:
                self._max_p = max(self._max_p, float(np.maximum.reduce(raw)))
            for a, b, off in runs:   # checked above, before any column was written
                self._tree._write_range(a, b - a, leaf if whole else leaf[off:off + b - a])
        return idx

    def _leaf(self, raw: np.ndarray, times: np.ndarray) -> np.ndarray:
        if not self.decay:
            return raw
        # capped as raw priorities are: the factor reaches e^40 before a rebase (inf, past
        # float's range, is capped too). A 0 stays 0: with the rebase deferred by a snapshot
        # the factor can be inf, and 0 * inf is NaN.
        with np.errstate(over="ignore", invalid="ignore"):
            leaf = np.minimum(raw * np.exp(self.decay * (times - self._base)), self._max_raw)
        leaf[raw == 0] = 0.0
        return leaf

    def _maybe_rebase(self, t: float) -> None:
        if self.decay * (t - self._base) <= _REBASE_AFTER or self._saver is not None:
            return
        # Not rebase(t): it reads the clock again, and with the columns written a bad
        # reading would leave the items half stored. t is already clipped to this write's
        # reading, and moves the base forward: the scaling cannot overflow.
        self._rebase(t)

    def rebase(self, t: float | None = None) -> None:
        """Move the decay base to time ``t`` (default now), rescaling every stored priority.

        Happens on its own when needed; sampling probabilities do not change. A
        ``t`` in the future is taken as now (see :meth:`add`); one so far back that a stored
        priority would pass ``float max / (4 * capacity)`` (the cap every write keeps) raises
        :class:`ReplayError`, and nothing changes. Deferred (nothing
        happens) while a snapshot is being written (or an increment or a digest
        read): the snapshot's rows not yet
        copied would be rescaled while its recorded base stays the old one.
        """
        if t is not None and not (is_real(t) and math.isfinite(t)):
            raise ReplayError(f"rebase time must be a finite number of seconds, got {t!r}")
        with self._lock:
            if not self.decay or self._saver is not None:
                return
            now = self._now()
            self._rebase(now if t is None else min(float(t) - self._lag, now))

    def _rebase(self, t: float) -> None:
        """:meth:`rebase` to ``t`` (lock held, decay on, no snapshot under way, ``t`` not past now)."""
        try:   # a base moved far back scales every priority up
            factor = math.exp(-self.decay * (t - self._base))
        except OverflowError:
            factor = math.inf
        # Moved back, the base lifts every leaf. None may pass the cap that every other write
        # keeps (_leaf, update_priorities): the next write at the cap could make the sum inf.
        # Moved forward (factor <= 1), nothing grows: no O(capacity) look at the leaves.
        if factor > 1 and not float(_max(self._tree.leaves)) * factor <= self._max_raw:
            raise ReplayError(f"rebase to t={t!r}: the priorities scaled by exp({-self.decay * (t - self._base):.4g}) "
                              f"would overflow past their cap {self._max_raw:.4g} (float max / (4 * capacity)); "
                              f"the base stays at {self._base!r}: give a later t")
        self._tree.scale(factor)
        self._base = t

    # --------------------------------------------------------------- sampling
    def _strata(self, n: int) -> np.ndarray:
        if self._arange.size != n:
            self._arange = np.arange(n, dtype=np.float64)
        return self._arange

    def can_sample(self, n: int) -> bool:
        """Whether ``sample(n)`` may go ahead now: the rate limiter allows ``n`` more
        (``min_size`` and the ratio, for every sampler), some item can be drawn and,
        FIFO, ``n`` unread items remain. A batch size :meth:`sample` refuses raises
        :class:`ReplayError` as there."""
        _check_batch(n)
        if self.sampler == "fifo":
            if self._next - max(self._read, self._next - self.capacity) < n:
                return False
        elif self.sampler == "prioritized":
            with self._lock:   # reading the total may cache it: not while a write is under way
                if not self._tree.total > 0:
                    return False
        return self.limiter.can_sample(n, len(self))

    def sample(self, n: int, beta: float = 0.4) -> Sample:
        """Sample ``n`` items.

        Prioritized: ``P(i) = p_i / Σp`` with age-decayed priorities; weights
        ``(N·P(i))^-beta`` divided by the largest weight any stored item could get
        or, with ``decay > 0``, by the largest weight in the batch: the least likely
        stored item is then the oldest, and normalising by it would make every
        weight shrink like ``exp(-beta·decay·age span)``. Uniform: with
        replacement, weights 1. FIFO: the ``n`` oldest items not yet sampled
        (fewer if fewer remain), each returned once.

        Raises :class:`ReplayError` if the buffer holds fewer than the limiter's
        ``min_size`` items (or, FIFO, none left to read), or if every stored
        priority has decayed to zero (items far older than ``1/decay``): no item
        can then be drawn by the law, and weights would be NaN.
        """
        _check_batch(n)
        if not (is_real(beta) and 0 <= beta < math.inf):
            raise ReplayError(f"beta must be a finite number >= 0, got {beta!r}")
        with self._lock:
            size = len(self)
            if size < max(1, self.limiter.min_size):
                raise ReplayError(f"cannot sample: buffer holds {size} items, "
                                  f"min_size is {self.limiter.min_size}")
            if self.sampler == "prioritized":
                total = self._tree.total
                if not total > 0:
                    raise ReplayError(f"cannot sample: every priority of the {size} items is 0 (items "
                                      "far older than 1/decay seconds decay to nothing); add newer items")
                if self.stratified:
                    u = self._rng.random(n)
                    u += self._strata(n)
                    u *= total / n
                else:
                    u = self._rng.random(n) * total
                slots = self._tree.find(u)
                if size < self.capacity:
                    np.minimum(slots, size - 1, out=slots)
                p = self._tree._get(slots)   # leaves: found, or range-checked above
                prob = p / total
                # (N·P(i))^-β / max_j (N·P(j))^-β; the max belongs to the least
                # likely item j, so this is (p_i / p_min)^-β. Without decay j runs
                # over the whole buffer. With decay the least likely stored item is
                # the oldest, whose probability falls like exp(-decay·age span):
                # every weight would shrink with it and learning stop, so j runs
                # over the batch instead (its largest weight is 1).
                if self.decay:
                    pmin = float(p.min())
                    if not pmin > 0:   # a zero leaf is never drawn; a guard only
                        pmin = float(p[p > 0].min()) if (p > 0).any() else self._tree.min
                else:
                    pmin = self._tree.min
                w = np.maximum(p, pmin)
                w /= pmin
                w = (w ** -beta).astype(np.float32)
            elif self.sampler == "uniform":
                slots = self._rng.integers(0, size, n)
                prob = np.full(n, 1.0 / size)
                w = np.ones(n, dtype=np.float32)
            else:
                start = max(self._read, self._next - self.capacity)
                k = min(n, self._next - start)
                if k <= 0:
                    raise ReplayError("cannot sample: FIFO buffer has no unread items")
                slots = np.arange(start, start + k, dtype=np.int64) % self.capacity
                self._read = start + k
                prob = np.full(k, 1.0 / k)
                w = np.ones(k, dtype=np.float32)
            # take() along axis 0 is several times faster than fancy indexing for
            # multi-dimensional columns (one row copy per item instead of a generic loop).
            batch = {name: col.take(slots, axis=0) for name, col in self._data.items()}
            self.limiter.sampled += slots.size
            times = self._time[slots]   # a copy (fancy indexing)
            if self._lag:
                times += self._lag
            return Sample(batch, self._ticket[slots], w, prob, times)

    def update_priorities(self, indices: Any, td: Any) -> int:
        """Set priorities ``(|td|+eps)^alpha`` for sampled ``indices``; return how many were applied.

        Indices whose slot has been overwritten since they were sampled are
        ignored; an index this buffer never handed out (negative, or not yet
        added) raises :class:`ReplayError` and nothing changes. A priority past
        ``float max / (4 * capacity)`` is taken as that, so that their sum stays finite. A no-op for
        uniform and FIFO sampling (beyond the checks).
        """
        try:
            indices = np.asarray(indices)
        except (TypeError, ValueError) as e:   # a ragged list: numpy's own ValueError
            raise ReplayError(f"indices must be a 1-D integer array: {e}") from None
        td = _floats(td, "td")
        if indices.ndim != 1 or indices.dtype.kind not in "iu":
            raise ReplayError(f"indices must be a 1-D integer array, got {indices.dtype} {indices.shape}")
        if td.shape != indices.shape:
            td = td.reshape(-1) if td.size == indices.size else td
            if td.shape != indices.shape:
                raise ReplayError(f"td has shape {td.shape}, expected {indices.shape} like indices")
        if indices.size == 0:
            return 0
        # One pass gives the priorities and, through their max, the NaN/Inf check; the TD
        # errors themselves are looked at only when that max is not finite (a finite td's
        # power can overflow: 1e200 at alpha 2) or alpha is 0 (every power is 1, NaN's too).
        raw = np.abs(td)
        raw += self.eps
        if self.alpha > 1:   # only then can a finite td's power overflow (errstate costs 1 us)
            with np.errstate(over="ignore"):
                raw **= self.alpha
        else:
            raw **= self.alpha
        m = float(raw.max())
        if (not math.isfinite(m) or self.alpha == 0) and not np.isfinite(td).all():
            raise ReplayError("td contains NaN or Inf; priorities left unchanged")
        if m > self._max_raw:   # priorities whose sum would not be finite (inf: overflowed)
            np.minimum(raw, self._max_raw, out=raw)
            m = self._max_raw
        with self._lock:
            slots = indices % self.capacity
            live = self._ticket[slots] == indices
            stale = not live.all()
            # Only now tell an index that was never handed out from a stale one. While
            # the ring fills, index -1 also matches an empty slot's ticket (-1).
            if stale or (self._next < self.capacity and np.minimum.reduce(indices) < 0):
                self._check_range(indices)
            if stale:
                slots, raw = slots[live], raw[live]
                if slots.size == 0:
                    return 0
                m = float(raw.max())
            if self.sampler != "prioritized":
                return 0
            if self._saver is not None:
                self._saver.preserve(slots)
            if m > self._max_p:
                self._max_p = m
            # slots and priorities are checked above (in range, finite, capped)
            self._tree._set(slots.astype(np.int64, copy=False),
                            np.asarray(self._leaf(raw, self._time[slots]) if self.decay else raw, np.float64))
            return int(slots.size)

    def forget(self, indices: Any) -> int:
        """Never draw the live ``indices`` again: their priority becomes 0 (they stay in
        the ring until overwritten, and are still shared and saved: a receiver stores them
        at priority 0 too); return how many were live. For items no update can learn from:
        a low priority instead would become the buffer's smallest and shrink every other
        item's importance weight. Raises
        :class:`ReplayError` for an index this buffer never handed out. A no-op for uniform
        and FIFO sampling (beyond the checks)."""
        indices = _as_indices(indices).reshape(-1)
        with self._lock:
            self._check_range(indices)
            slots = indices % self.capacity
            slots = slots[self._ticket[slots] == indices]
            if self.sampler != "prioritized" or slots.size == 0:
                return 0
            if self._saver is not None:
                self._saver.preserve(slots)
            self._tree._set(slots.astype(np.int64, copy=False), np.zeros(slots.size))
            return int(slots.size)

    def priorities(self, indices: Any) -> np.ndarray:
        """Current age-decayed priorities of live ``indices`` (NaN for overwritten ones).

        Like :meth:`update_priorities`, raises :class:`ReplayError` for an index
        this buffer never handed out.
        """
        indices = _as_indices(indices)
        with self._lock:
            self._check_range(indices)
            slots = indices % self.capacity
            live = self._ticket[slots] == indices
            if self.sampler != "prioritized":
                p = np.ones(indices.shape)
            else:
                p = self._tree._get(slots)   # leaves: found, or range-checked above
                if self.decay:
                    p = p * math.exp(-self.decay * (self._now() - self._base))
            return np.where(live, p, np.nan)

    def probabilities(self) -> np.ndarray:
        """Exact sampling probability of every slot in ``[0, len)`` (for tests and diagnostics)."""
        with self._lock:
            size = len(self)
            if self.sampler != "prioritized":
                return np.full(size, 1.0 / max(size, 1))
            leaves = self._tree.leaves[:size]
            total = leaves.sum()
            return leaves / total if total > 0 else np.zeros(size)

    def _check_range(self, indices: np.ndarray) -> None:
        """Raise unless every index was handed out by this buffer (lock held)."""
        if indices.size and (indices.min() < 0 or indices.max() >= self._next):
            raise ReplayError(f"indices out of range [0, {self._next}): not from this buffer")

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, background: bool = False) -> Any:
        """Snapshot the buffer to the directory ``path``; see :mod:`swarm.buffer.persist`.

        Sampling and adding go on meanwhile, waiting at most one chunk copy (a
        few ms at 1M items). With ``background=True`` the write runs on a thread
        and the returned :class:`~swarm.buffer.persist.Snapshot` has ``wait()``.
        """
        from .persist import save
        return save(self, path, background=background)

    @classmethod
    def load(cls, path: Any, *, clock: Callable[[], float] = time.time,
             limiter: RateLimiter | None = None) -> "ReplayBuffer":
        """Restore a buffer written by :meth:`save` (items, priorities, ids, counters, rng).
        With decay, the time between the save and the restore is not counted as age."""
        from .persist import load
        return load(path, clock=clock, limiter=limiter)

    # ------------------------------------------------------------- federation
    def items(self, indices: Any) -> Items:
        """The live items at ``indices``, with ids, origin times and raw priorities.

        Overwritten items are left out; an index this buffer never handed out
        raises :class:`ReplayError`.
        """
        indices = _as_indices(indices)
        with self._lock:
            self._check_range(indices)
            slots = indices % self.capacity
            slots = slots[self._ticket[slots] == indices]
            if self.sampler == "prioritized":
                raw = self._tree._get(slots)   # range-checked above
                if self.decay:
                    with np.errstate(over="ignore"):   # a time ~1e308 s back: -inf, see _undecayed
                        x = self.decay * (self._time[slots] - self._base)
                    if x.size and x.min() < -700.0:
                        raw = _undecayed(raw, x, self._max_p)
                    else:
                        raw = raw * np.exp(-x)
            else:
                raw = np.full(slots.size, self._max_p)
            origins = self._origin[slots]
            if origins.size and _min(origins) == _max(origins):
                # One origin (a peer's own new items, as a ride carries them): what np.unique
                # gives, without its sort, several times the cost on a few items.
                used, inv = origins[:1], np.zeros(origins.size, np.int32)
            else:
                used, inv = np.unique(origins, return_inverse=True)
            # take() and fancy indexing copy: the seqs and times need no copy() of their own
            times = self._time[slots]
            if self._lag:
                times += self._lag   # the clock's time, as every buffer's items travel
            return Items({k: c.take(slots, axis=0) for k, c in self._data.items()},
                         [self._peers[i] for i in used], inv.astype(np.int32).reshape(-1),
                         self._seq[slots], times, raw)

    def contains(self, peer: str, seq: int) -> bool:
        """Whether the item with id ``(peer, seq)`` is in the buffer now: False for a seq
        no id has (outside ``[0, 2**63)``); a ``peer`` that is not a str, or a ``seq`` that
        is not an int (``1.0``, ``"1"``), raises :class:`ReplayError`."""
        if not isinstance(peer, str):
            raise ReplayError(f"peer must be a peer id (a str), got {peer!r:.80}")
        if not is_int(seq):
            raise ReplayError(f"seq must be an int, got {seq!r:.80}")
        seq = int(seq)   # a numpy uint64 against the int64 column would compare as float64
        if not 0 <= seq <= _SEQ_MAX:
            return False
        with self._lock:
            o = self._peer_index.get(peer)
            if o is None:
                return False
            if o == 0:
                hit = (self._origin == 0) & (self._seq == seq) & (self._ticket >= 0)
                return bool(hit.any())
            return bool(self._foreign.find(np.array([o]), np.array([seq], np.int64))[0] >= 0)

    def ids(self) -> list[tuple[str, int]]:
        """Ids ``(origin peer, seq)`` of every item now stored, in slot order."""
        with self._lock:
            n = len(self)
            return [(self._peers[o], int(s)) for o, s in zip(self._origin[:n], self._seq[:n])]


def _first_copies(origins: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Mask of the first copy of each id ``(origins[k], seqs[k])`` (a stable sort by id
    puts it first among its copies; np.unique over rows costs several times as much)."""
    n = origins.size
    order = np.lexsort((seqs, origins))
    so, ss = origins[order], seqs[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (so[1:] != so[:-1]) | (ss[1:] != ss[:-1])
    once = np.zeros(n, dtype=bool)
    once[order[first]] = True
    return once


# The ufuncs' own reductions: ndarray.min and .max go through a Python wrapper that costs
# a fifth again on the few items of a message.
_min, _max = np.minimum.reduce, np.maximum.reduce


def _below(a: np.ndarray, lo: int) -> bool:
    """Whether the non-empty integer array ``a`` has a value below ``lo`` (<= 0): never
    for an unsigned dtype, which is not looked at."""
    return a.dtype.kind != "u" and int(_min(a)) < lo   # Python ints compare faster than numpy's


def _above(a: np.ndarray, hi: int) -> bool:
    """Whether the non-empty integer array ``a`` has a value above ``hi``: never for a
    signed dtype whose range ``hi`` covers (``_SEQ_MAX`` covers int64's), which is not looked at."""
    signed_max = (1 << (8 * a.dtype.itemsize - 1)) - 1   # np.iinfo costs more than the reduction
    return not (a.dtype.kind == "i" and hi >= signed_max) and int(_max(a)) > hi


def _as_indices(indices: Any) -> np.ndarray:
    """``indices`` as an int64 array, or :class:`ReplayError` if they are not integers."""
    try:
        a = np.asarray(indices)
    except (TypeError, ValueError) as e:
        raise ReplayError(f"indices must be integers: {e}") from None
    if a.size and a.dtype.kind not in "iu":
        raise ReplayError(f"indices must be integers, got {a.dtype}")
    return a.astype(np.int64, copy=False)


def _check_batch(n: Any) -> None:
    if not (is_int(n) and n >= 1):
        raise ReplayError(f"batch size must be an int >= 1, got {n!r}")


def _undecayed(leaf: np.ndarray, x: np.ndarray, max_p: float) -> np.ndarray:
    """Raw priorities ``leaf · e^-x`` where some items are ~700/decay s older than the base.

    Their leaves underflowed to 0 (or a subnormal) and ``e^-x`` overflows: the
    product would be NaN or Inf, and one such priority makes a receiver drop the
    whole message. In the log domain a subnormal leaf gives a finite priority; a 0
    leaf stays 0 (taken apart: ``x`` is ``-inf`` for a time ~1e308 s back, and
    ``log(0) - x`` NaN); no raw priority exceeds the buffer's max.
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.where(leaf > 0, np.minimum(np.exp(np.log(leaf) - x), max_p), 0.0)


def _allocated(what: str, shape: Any, dtype: Any, fill: int = 0) -> np.ndarray:
    """An array filled with ``fill`` whose pages are all resident (written once, not
    mapped lazily), or a ReplayError naming ``what`` and the bytes it needs when numpy
    cannot allocate it (MemoryError; ValueError past its largest possible size).

    A size the system only maps lazily but cannot commit is not seen here: the
    fill then fails as the kernel decides (overcommit), not as an exception.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    need = math.prod(dims) * np.dtype(dtype).itemsize
    try:
        a = np.empty(dims, dtype=dtype)
        a.fill(fill)
    except (MemoryError, ValueError):
        raise ReplayError(f"{what}: capacity {dims[0]} x {dims[1:] or 'one value'} of {np.dtype(dtype)} "
                          f"needs {_size(need)}, which cannot be allocated: give a smaller capacity "
                          "or shape") from None
    return a


def _size(n: int) -> str:
    """Bytes in words: '14.6 TiB (16000000000000 bytes)'."""
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.3g} {unit} ({n} bytes)"
    return f"{n} bytes"
