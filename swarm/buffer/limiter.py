"""Rate limits: how much a learner may sample per insert, and how fast items are shared."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Mapping

from ..checks import is_int, is_real
from ..errors import ReplayError

__all__ = ["RateLimiter", "TokenBucket"]

#: the keys of RateLimiter.state()'s dict, all of which from_state needs
_STATE_KEYS = ("min_size", "samples_per_insert", "tolerance", "inserted", "sampled")


class RateLimiter:
    """Minimum size before sampling and a sample-to-insert ratio.

    ``samples_per_insert`` (SPI) is how many sampled items each inserted item may
    pay for; ``None`` means no ratio, only ``min_size``. ``tolerance`` is how far
    (in sampled items) the learner may run ahead of the ratio, as in Reverb's
    ``SampleToInsertRatio(error_buffer=...)``.

    The buffer enforces ``min_size`` in ``sample``; the ratio is advisory for the
    learner (``can_sample``) and binding for items arriving from neighbours
    (``insert_room``): a peer whose learner lags does not take in more shared items
    than it can use, which bounds sharing traffic too.
    """

    def __init__(self, min_size: int = 1, samples_per_insert: float | None = None,
                 tolerance: float = 1024.0) -> None:
        if not (is_int(min_size) and min_size >= 1):
            raise ReplayError(f"min_size must be an int >= 1, got {min_size!r}")
        # Infinite settings would only overflow in insert_room(); None already means "no ratio".
        if samples_per_insert is not None and not (_finite(samples_per_insert) and samples_per_insert > 0):
            raise ReplayError(f"samples_per_insert must be a finite number > 0, or None for no ratio, "
                              f"got {samples_per_insert!r}")
        if not (_finite(tolerance) and tolerance >= 0):
            raise ReplayError(f"tolerance must be a finite number >= 0 (use samples_per_insert=None "
                              f"for no ratio), got {tolerance!r}")
        self.min_size = int(min_size)   # state() goes into a snapshot's meta.json: no numpy ints
        self.samples_per_insert = None if samples_per_insert is None else float(samples_per_insert)
        self.tolerance = float(tolerance)
        self.inserted = 0
        self.sampled = 0

    def _deficit(self, inserted: int, sampled: int) -> float:
        # > 0: the learner has sampled more than the inserts pay for.
        assert self.samples_per_insert is not None
        return sampled - self.samples_per_insert * max(0, inserted - self.min_size)

    def can_sample(self, n: int, size: int) -> bool:
        """Whether ``n`` more samples keep within min size and the ratio."""
        if size < self.min_size:
            return False
        if self.samples_per_insert is None:
            return True
        return self._deficit(self.inserted, self.sampled + n) <= self.tolerance

    def can_insert(self, n: int) -> bool:
        """Whether ``n`` more inserts keep the learner from falling behind the ratio: what
        the buffer applies (:meth:`insert_room`)."""
        return n <= self.insert_room()

    def insert_room(self) -> int:
        """How many items may be inserted now without breaking the ratio (a large number if unbounded)."""
        if self.samples_per_insert is None:
            return 1 << 62
        # Solve  spi*(inserted + n - min) - sampled <= tol  for the largest n.
        room = (self.tolerance + self.sampled) / self.samples_per_insert + self.min_size - self.inserted
        return max(0, int(min(room, 1 << 62)))   # a tiny ratio (1e-310) makes it inf

    def state(self) -> dict:
        return {"min_size": self.min_size, "samples_per_insert": self.samples_per_insert,
                "tolerance": self.tolerance, "inserted": self.inserted, "sampled": self.sampled}

    @classmethod
    def from_state(cls, d: dict) -> "RateLimiter":
        """A limiter from :meth:`state`'s dict (a snapshot's meta.json), checked as the
        constructor checks its arguments; the counters must be ints >= 0."""
        if not isinstance(d, Mapping):
            raise ReplayError(f"a limiter's state must be a dict (RateLimiter.state()'s), got {type(d).__name__}")
        missing = [k for k in _STATE_KEYS if k not in d]
        if missing:
            raise ReplayError(f"a limiter's state has no {missing[0]!r} key; it needs {', '.join(_STATE_KEYS)}, "
                              "as RateLimiter.state() gives them")
        r = cls(d["min_size"], d["samples_per_insert"], d["tolerance"])
        counts = d["inserted"], d["sampled"]
        if not all(is_int(c) and c >= 0 for c in counts):
            raise ReplayError(f"the limiter's counts of inserts and samples must be ints >= 0, got {counts!r:.100}")
        r.inserted, r.sampled = int(counts[0]), int(counts[1])
        return r


class TokenBucket:
    """Items per second with a burst: bounds how many items a peer ships to its neighbours.

    ``rate=None`` means unlimited (a ``burst`` given then is checked all the same,
    and has no effect).
    """

    def __init__(self, rate: float | None, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate is not None and not (_finite(rate) and rate > 0):
            raise ReplayError(f"share rate must be a finite number > 0 items/s, or None for unlimited, "
                              f"got {rate!r}")
        if burst is not None and not _finite(burst):
            raise ReplayError(f"burst must be a finite number of items, or None (one second of rate), "
                              f"got {burst!r}")
        self.rate = rate
        self.burst = float(burst if burst is not None else (rate or 0.0))
        if (rate is not None or burst is not None) and not self.burst >= 1:
            raise ReplayError(f"burst must be >= 1 item, got {self.burst:g}"
                              + ("" if burst is not None else f" (the default: one second of rate {rate!r})"))
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()   # a riding federation takes on the training thread too

    def take(self, n: int) -> int:
        """Take up to ``n`` tokens; return how many were granted (from any thread)."""
        if self.rate is None:
            return n
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            k = min(n, int(self._tokens))
            self._tokens -= k
            return k


def _finite(x: Any) -> bool:
    """A real number, not NaN or infinite (bools and strings are not numbers here)."""
    return is_real(x) and math.isfinite(x)
