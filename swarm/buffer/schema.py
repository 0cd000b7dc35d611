"""The declared layout of replay items: field name -> (dtype, shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from ..checks import is_int
from ..errors import ReplayError
from ..wire import DTYPES

__all__ = ["Field", "Schema"]

# Field names the buffer keeps for itself on disk and on the wire.
_RESERVED = frozenset({"_ids", "_seq", "_origin", "_time", "_priority", "_ticket"})
_NAME_BYTES = 200   # <name>.npy stays within the 255 bytes a file name may have


@dataclass(frozen=True)
class Field:
    """One column of the buffer: every item has one value of ``dtype`` and ``shape``."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


class Schema:
    """An ordered set of fields, checked once when the buffer is made.

    >>> s = Schema({"obs": ("float32", (4,)), "action": ("int64", ())})
    >>> s.names
    ['obs', 'action']

    Only dtypes that can travel on the wire are accepted, so every buffer can
    be shared with neighbours.
    """

    def __init__(self, fields: Mapping[str, Any] | "Schema") -> None:
        if isinstance(fields, Schema):
            self.fields: tuple[Field, ...] = fields.fields
            self._names = fields._names
            self._bounds, self._casts = fields._bounds, fields._casts
            return
        if not isinstance(fields, Mapping) or not fields:
            raise ReplayError("schema must be a non-empty mapping {field: (dtype, shape)}")
        out = []
        for name, spec in fields.items():
            if not isinstance(name, str) or not name or name in _RESERVED or name.startswith("_"):
                raise ReplayError(f"schema field name {name!r} is not allowed (non-empty str, no leading '_')")
            # A snapshot stores the field as <name>.npy: a path there would write (and a
            # crafted meta.json read) outside the snapshot, or make every save fail.
            if not _file_name(name):
                raise ReplayError(f"schema field name {name!r:.100} is not allowed: it names the field's file in a "
                                  f"snapshot, so give a name without '/', '\\' or NUL, not '.' or '..', "
                                  f"of at most {_NAME_BYTES} bytes in UTF-8")
            try:
                dtype, shape = spec
            except (TypeError, ValueError):
                raise ReplayError(f"schema field {name!r}: expected (dtype, shape), got {spec!r}") from None
            if dtype is None:   # np.dtype(None) is float64: say which
                raise ReplayError(f"schema field {name!r}: dtype is None; use one of {sorted(DTYPES)}")
            try:
                dt = np.dtype(dtype)
            except (TypeError, ValueError):   # ValueError: a malformed structured or sub-array spec
                raise ReplayError(f"schema field {name!r}: unknown dtype {dtype!r}") from None
            if dt.name not in DTYPES:
                raise ReplayError(f"schema field {name!r}: dtype {dt} not allowed; use one of {sorted(DTYPES)}")
            # The native dtype of that name: the wire carries native byte order only, so
            # '>f4' is stored (and shared) as float32; big-endian data is cast on add.
            dt = np.dtype(dt.name)
            if is_int(shape):
                shape = (shape,)
            try:
                dims = tuple(shape)
            except TypeError:
                dims = (None,)
            if not all(is_int(d) for d in dims):   # 2.5 is not 2, True is not 1
                raise ReplayError(f"schema field {name!r}: bad shape {shape!r}: "
                                  "give a tuple of ints (not bools), or one int")
            shape = tuple(int(d) for d in dims)
            if any(d < 1 for d in shape):
                raise ReplayError(f"schema field {name!r}: shape {shape} has a dimension < 1")
            out.append(Field(name, dt, shape))
        self.fields = tuple(out)
        self._names = frozenset(f.name for f in self.fields)
        self._bounds = {f.name: _bounds(f.dtype) for f in self.fields}
        # (data dtype, field name) -> _SAFE or _NARROW, decided once: can_cast costs
        # more than the dict lookup. Refused dtypes are not kept (they raise anyway).
        self._casts: dict[tuple[np.dtype, str], str] = {}

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def to_dict(self) -> dict[str, list]:
        """JSON/msgpack-friendly form: ``{name: [dtype, [shape...]]}``."""
        return {f.name: [f.dtype.name, list(f.shape)] for f in self.fields}

    def check(self, items: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        """Validate a batch of items; return the arrays (cast safely) and the batch size.

        Every field must be present, no extra field allowed, each with shape
        ``(n, *field.shape)`` and a dtype that casts to the field's dtype without
        loss of kind (``same_kind``). Where the field's dtype is narrower, every
        value must fit it: an integer out of its range, or a finite float that
        would become ``inf``, is refused rather than stored wrapped or infinite.
        Raises :class:`ReplayError` naming the field.
        """
        if type(items) is not dict and not isinstance(items, Mapping):
            raise ReplayError(f"items must be a mapping of field -> array, got {type(items).__name__}")
        if items.keys() != self._names:
            missing = [f.name for f in self.fields if f.name not in items]
            if missing:
                raise ReplayError(f"items miss field(s) {missing}; schema has {self.names}")
            extra = [k for k in items if k not in self._names]
            raise ReplayError(f"items have unknown field(s) {extra}; schema has {self.names}")
        out: dict[str, np.ndarray] = {}
        n = -1
        for f in self.fields:
            a = items[f.name]
            if type(a) is not np.ndarray:
                try:
                    a = np.asarray(a)
                except (ValueError, TypeError) as e:   # ragged nested lists, for one
                    raise ReplayError(f"field {f.name!r}: not an array numpy can make ({e})") from None
            # Fast path: the exact dtype needs no cast checks (the common case). Native
            # builtin dtypes are singletons, so identity settles it without ``==``.
            if a.dtype is not f.dtype and a.dtype != f.dtype:
                cast = self._casts.get((a.dtype, f.name))
                if cast is None:
                    cast = _cast(a.dtype, f.dtype)
                    if cast not in (_SAFE, _NARROW):
                        raise ReplayError(f"field {f.name!r}: {cast}")
                    self._casts[a.dtype, f.name] = cast
                if cast == _NARROW and a.size:
                    self._check_fits(f, a)
            if a.shape[1:] != f.shape or a.ndim == 0:
                raise ReplayError(f"field {f.name!r}: shape {a.shape}, expected (n, {', '.join(map(str, f.shape))})"
                                  .replace(", )", ")"))
            if n < 0:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise ReplayError(f"field {f.name!r}: {a.shape[0]} items, but earlier fields have {n}")
            out[f.name] = a
        return out, n

    def _check_fits(self, f: Field, a: np.ndarray) -> None:
        """Raise unless every value of ``a`` survives the cast to the narrower ``f.dtype``."""
        lo, hi = self._bounds[f.name]
        # Only values past the field's range (inf, for floats; a NaN, whose max is NaN,
        # for floats too, so that a NaN beside a 1e39 cannot hide it) get beyond these
        # cheap reductions.
        if a.dtype.kind == "f":
            if np.abs(a).max() <= hi:
                return
        else:
            amin, amax = np.minimum.reduce(a, axis=None), np.maximum.reduce(a, axis=None)
            if not (amin < lo or amax > hi):
                return
            if f.dtype.kind in "iu":
                raise ReplayError(f"field {f.name!r}: values in [{amin}, {amax}] do not fit {f.dtype} "
                                  f"[{lo}, {hi}]")
        # A float field: inf or NaN given is stored as given; a finite value must stay finite.
        with np.errstate(over="ignore"):
            lost = np.isfinite(a) & ~np.isfinite(a.astype(f.dtype))
        if lost.any():
            raise ReplayError(f"field {f.name!r}: {a[lost].flat[0]} overflows {f.dtype} (largest {hi:g})")


def _file_name(name: str) -> bool:
    """Whether ``name`` + ".npy" names a file inside a snapshot's directory: no path, no
    NUL, at most _NAME_BYTES in UTF-8 (a lone surrogate, which UTF-8 cannot encode, is refused)."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return size <= _NAME_BYTES and name not in (".", "..") and not any(c in name for c in "/\\\0")


_SAFE, _NARROW = "safe", "narrow"


def _cast(src: np.dtype, dst: np.dtype) -> str:
    """How data of dtype ``src`` goes into a field of dtype ``dst``: _SAFE, _NARROW
    (the values must fit, see :meth:`Schema._check_fits`), or why it cannot."""
    if not np.can_cast(src, dst, casting="same_kind"):
        return f"dtype {src} cannot be stored as {dst}"
    if src.kind == "f" and dst.kind in "iub":
        return f"float data for integer field of dtype {dst}"
    if src.kind in "iub" and dst.kind == "f" and dst.itemsize >= 4:
        return _SAFE   # rounds, but no integer overflows float32 (only float16's 65504)
    return _SAFE if np.can_cast(src, dst) else _NARROW


def _bounds(dtype: np.dtype) -> tuple[Any, Any]:
    """The smallest and largest value of a field's dtype (bool: 0 and 1)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    if dtype.kind == "f":
        fmax = float(np.finfo(dtype).max)
        return -fmax, fmax
    return 0, 1
