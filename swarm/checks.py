"""Argument checks that the public APIs share: what counts as an integer, a real
number, a number of seconds, a seed. numpy's scalars count (``numbers`` registers them);
a bool does not, though Python takes ``True`` for 1. And how text a sender chose is
shown in errors, logs and tables (:func:`shown`, :func:`printable`)."""

from __future__ import annotations

import math
import numbers
import os
import reprlib
from typing import Any

from .errors import ConfigError

__all__ = ["is_int", "is_real", "nonneg", "seconds", "rng_seed", "finite_arg", "MAX_GRAD", "largest_abs", "shown",
           "printable"]

#: The largest gradient entry a peer takes (FlatAdam, the gradient relay): the square of a
#: larger one overflows float32 (max 3.4028235e38), and Adam's second moment would stay
#: infinite for good.
MAX_GRAD = math.sqrt(3.4028234663852886e38)


def largest_abs(a: Any) -> float:
    """The largest ``|x|`` of a numpy float array (0 when empty): NaN if an entry is NaN
    (numpy's min and max both are then), inf if one is infinite; so ``largest_abs(g) <=
    MAX_GRAD`` is the whole check of a gradient. Two reductions, no temporary array."""
    return max(-float(a.min()), float(a.max())) if a.size else 0.0


def is_int(x: Any) -> bool:
    # the exact type first: the numbers.Integral check alone costs ~0.5 µs
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def is_real(x: Any) -> bool:
    return type(x) in (int, float) or (isinstance(x, numbers.Real) and not isinstance(x, bool))


def nonneg(x: Any) -> bool:
    """Whether ``x >= 0``: the check of a config field that 0 turns off or leaves unbounded."""
    return x >= 0


def seconds(v: Any, name: str = "timeout", *, none_ok: bool = False) -> float | None:
    """``v`` as a finite number of seconds >= 0 (None, where ``none_ok``: no deadline),
    or :class:`ConfigError` naming ``name``: a NaN or infinite deadline never ends a wait."""
    if v is None and none_ok:
        return None
    if is_real(v) and 0 <= v < math.inf:
        try:
            return float(v)
        except OverflowError:   # an int or Fraction past float's range: no deadline either
            pass
    raise ConfigError(f"{name} = {v!r}: must be a finite number of seconds >= 0"
                      + (" or None" if none_ok else ""))


#: Seeds are 32-bit, so that every seed derived from one (an experiment's seed + rank, and
#: + the env steps done on resume) stays far inside the 64 bits torch.manual_seed takes.
SEED_LIMIT = 2**32


def rng_seed(v: Any, name: str = "seed") -> int:
    """``v`` as a seed in ``[0, 2**32)``, or :class:`ConfigError` naming ``name``. Two
    seeds that differ must draw differently, so a larger one is refused, not masked."""
    if not (is_int(v) and 0 <= v < SEED_LIMIT):
        raise ConfigError(f"{name} = {v!r}: must be an integer in [0, 2**32)")
    return int(v)


def finite_arg(text: str) -> float:
    """An argparse ``type`` for a float option: a finite number, else a usage error (NaN
    or infinity would pass every later ``<=`` check, and fail late or quietly)."""
    import argparse   # noqa: PLC0415 - only command lines need it

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


class _ShortRepr(reprlib.Repr):
    """reprlib's, cutting bytes before making their repr (reprlib makes it whole first)."""

    def repr_bytes(self, x: bytes, level: int) -> str:
        return repr(x[:self.maxstring]) + ("..." if len(x) > self.maxstring else "")


_short = _ShortRepr()
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxstring = 2, 6, 4, 60
#: characters of a sender's value that an error text quotes at most
MAX_SHOWN = 100


def shown(x: Any) -> str:
    """``repr(x)``, at most :data:`MAX_SHOWN` characters, for a value a sender chose: a whole
    repr of a 4 MB header's list of 4M ints was a 12 MB error text, made and logged at 7x
    the cost of accepting a message."""
    s = _short.repr(x)
    return s if len(s) <= MAX_SHOWN else f"{s[:MAX_SHOWN - 3]}..."


def printable(s: Any) -> str:
    r"""``str(s)`` with every character that is not printable (control characters, ESC
    among them, line breaks, bidi overrides ...) shown as its Python escape, and every
    other as it is: what a peer sent cannot move the cursor or recolour an operator's
    terminal, nor forge a line of a log, and an id reads the same in the log as in
    ``swarm status`` (a repr of the whole text doubled its backslashes).

    >>> printable("p0\x1b[2J"), printable("a\\b\n")
    ('p0\\x1b[2J', 'a\\b\\n')
    """
    s = str(s)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists here (one of another user's does; one past the
    largest pid does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return True
    except PermissionError:
        return False
    return False
