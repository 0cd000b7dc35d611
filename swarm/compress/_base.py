"""The codec interface: :class:`Encoded`, :class:`Codec`, and the checks every decoder shares.

A codec turns a flat float32 vector into ``Encoded(meta, frames)``: ``meta`` is a
small dict of msgpack-able scalars (always ``codec`` and ``n``), ``frames`` a list of
numpy arrays, each of which travels as one zero-copy wire frame. Decoding trusts
nothing: every meta value and every frame's dtype and length is checked before a
byte is written, and a payload that fails a check raises
:class:`~swarm.errors.WireError`.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..checks import is_int, shown
from ..errors import ConfigError, GossipError, WireError

__all__ = ["Encoded", "Codec", "MAX_N", "as_vector"]

#: Largest vector a decoder will allocate for. A sparse payload names ``n`` without
#: carrying ``n`` values, so without this cap a lying peer could make ``decode``
#: allocate any amount of memory. ``decode_into`` is bounded by ``out`` instead.
MAX_N = (1 << 31) - 1


@dataclass
class Encoded:
    """One compressed vector: ``meta`` (msgpack-able scalars) plus raw ``frames``.

    ``nbytes`` counts the frames only -- the payload bytes that travel as raw wire
    frames. The meta dict adds a few dozen bytes to the message header (measure it
    with :meth:`meta_nbytes` if you need the last byte).

    Example::

        enc = get_codec("topk:0.01").encode(x)
        frames = wire.encode("delta", me, body={"meta": enc.meta}, arrays=enc.frames)
        msg = wire.decode(frames)
        y = codec.decode(Encoded(msg.body["meta"], msg.arrays))
    """

    meta: dict[str, Any]
    frames: list[np.ndarray] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Exact payload bytes on the wire: the sum of the frames' sizes."""
        return int(sum(np.asarray(f).nbytes for f in self.frames))

    @property
    def n(self) -> int:
        """Length of the vector this payload decodes to (``meta["n"]``); a meta without
        an integer ``n >= 0`` raises :class:`~swarm.errors.WireError`. Nothing else
        is checked: :meth:`Codec.decode` does that."""
        if not isinstance(self.meta, dict):
            raise WireError(f"meta is a {type(self.meta).__name__}, not a dict")
        codec = self.meta.get("codec")
        # the sender's name for it, when that is a short one on one line (it may be anything)
        name = codec if isinstance(codec, str) and len(codec) <= 40 and codec.isprintable() else "payload"
        return meta_int(self.meta, "n", name, lo=0)

    def meta_nbytes(self) -> int:
        """Bytes the meta dict takes when msgpack-packed (it rides in the header)."""
        import msgpack

        return len(msgpack.packb(self.meta, use_bin_type=True))


def as_vector(x: Any, what: str = "x") -> np.ndarray:
    """``x`` as a flat float32 numpy array, without a copy when it already is one.

    Accepts numpy arrays of any floating dtype and shape, and torch tensors (CPU
    tensors are viewed, not copied; other devices are moved to the CPU once).
    Anything else, a tensor on the "meta" device (no data), and a wider float (float64)
    with finite values past float32's range raise :class:`~swarm.errors.GossipError`
    naming ``what``.
    """
    if type(x).__module__.split(".")[0] == "torch":
        x = _torch_to_numpy(x, what)
    elif not isinstance(x, np.ndarray):
        raise GossipError(f"{what} must be a numpy array or a torch tensor, got {type(x).__name__}")
    if x.dtype != np.float32:
        if x.dtype.kind != "f":
            raise GossipError(f"{what} must be a floating-point array, got dtype {x.dtype}")
        # the cast would make such values ±Inf (a warning at most), which fp16 sends as
        # 65504 and error feedback keeps for good; Inf and NaN themselves cast silently
        try:
            with np.errstate(all="ignore", over="raise"):   # underflow to 0 is fine
                x = x.astype(np.float32)
        except FloatingPointError:
            raise _past_f32(what, np.abs(x[np.isfinite(x)]).max()) from None
    # reshape(-1) is a view for contiguous input and a copy otherwise.
    return x.reshape(-1)


def _torch_to_numpy(t: Any, what: str) -> np.ndarray:
    import torch

    if not isinstance(t, torch.Tensor):
        raise GossipError(f"{what} must be a numpy array or a torch tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise GossipError(f"{what} must be a floating-point tensor, got dtype {t.dtype}")
    if t.device.type == "meta":
        raise GossipError(f"{what} is a tensor on the 'meta' device, which has a shape but no "
                          f"data; materialize it first (e.g. module.to_empty(device='cpu'), "
                          f"then initialize its parameters)")
    t = t.detach()
    if t.device.type == "cpu" and t.dtype == torch.float32:
        return t.numpy()
    # one conversion and one move, in the order that moves the fewest bytes
    a = t.to(device="cpu", dtype=torch.float32).numpy()
    # torch's cast makes finite values past float32's range ±Inf without a word; only a
    # wider source can have them, and only an Inf the source lacks is one
    if t.dtype.itemsize > 4 and np.isinf(a).any() and \
            int(torch.isinf(t).sum()) < int(np.isinf(a).sum()):
        raise _past_f32(what, float(t.abs().nan_to_num(0.0, posinf=0.0).max()))
    return a


def ratio_length(codec: str, n: Any) -> int:
    """``n`` as the vector length :meth:`Codec.ratio` is asked about: an int in ``[0, MAX_N]``,
    else :class:`ConfigError` naming it (a length no decoder takes has no ratio, and the
    query encodes a vector of that length)."""
    if not (is_int(n) and 0 <= n <= MAX_N):
        raise ConfigError(f"{codec}: ratio's n must be an int in [0, {MAX_N}], got {shown(n)}")
    return int(n)


def _past_f32(what: str, amax: float) -> GossipError:
    return GossipError(f"{what} has values past float32's range (largest magnitude {amax:.4g}, "
                       f"float32 holds up to {_F32_MAX:.8g}), which would become Inf; "
                       f"scale it down before encoding")


class Codec:
    """Base class of all codecs. Subclasses set ``name`` and implement the hooks
    ``_encode``, ``_frame_specs`` and ``_decode_into`` (the others have defaults).
    A codec of one's own is used as an instance; specs, ``--set`` and the engines name
    only the built-in families (:data:`~swarm.compress.CODECS`, read-only: every peer
    process must build what another sends).

    ``name`` is the family that appears as ``meta["codec"]``; ``spec`` is the config
    string the instance was made from (``"topk:0.01"``). Every parameter a decoder
    needs travels in ``meta``, so any instance of a family decodes any payload of
    that family. Instances are not thread-safe; stateful codecs (seeded random
    codecs, :class:`~swarm.compress.ErrorFeedback`) keep one instance per stream.
    """

    name: ClassVar[str] = ""
    #: True when ``encode`` may return frames that are views of its input; callers
    #: that reuse the input buffer (ErrorFeedback) must then hand it a copy.
    aliases_input: ClassVar[bool] = False

    def __init__(self, spec: str | None = None) -> None:
        self.spec = spec or self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"

    # ---- public API -----------------------------------------------------------------

    def encode(self, x: Any) -> Encoded:
        """Compress ``x`` (any-shape float array or tensor; flattened) into an :class:`Encoded`."""
        if _device_tensor(x):
            enc = self._encode_device(x)
            if enc is not None:
                return enc
        v = as_vector(x)
        return self._encode(v)

    def encode_decoded(self, x: Any) -> tuple[Encoded, np.ndarray]:
        """``encode(x)`` and what a receiver decodes from it (a new array), in one call;
        a sender that applies its own update as its receivers do needs both."""
        if not _device_tensor(x):
            v = as_vector(x)
            sparse = self._encode_sparse(v)
            if sparse is not None:
                enc, idx, vals = sparse
                return enc, scatter(v.size, idx, vals)
        enc = self.encode(x)
        return enc, self.decode(enc)

    def decode(self, enc: Encoded, n: int | None = None) -> np.ndarray:
        """The float32 vector of length ``meta["n"]`` that ``enc`` stands for (a new array).

        ``n``, when given, is the length the caller expects; a payload of another
        length is rejected. Raises :class:`~swarm.errors.WireError` for any payload
        that fails a check.
        """
        if n is not None and not (is_int(n) and n >= 0):   # the caller's slip, not the payload's
            raise ConfigError(f"{self.name}: decode's n must be an int >= 0 or None, got {shown(n)}")
        meta, frames, size = self._check(enc)
        if n is not None and size != n:
            raise WireError(f"{self.name}: payload is for n={size}, expected n={n}")
        if size > MAX_N:
            raise WireError(f"{self.name}: n={size} exceeds the decoder limit {MAX_N}")
        return self._decode(meta, frames, size)

    def decode_into(self, enc: Encoded, out: np.ndarray, alpha: float = 1.0) -> np.ndarray:
        """Add ``alpha * decode(enc)`` to ``out`` in place, without a full temporary.

        ``out`` must be a writable, contiguous 1-D float32 array of length
        ``meta["n"]``. Every check runs before ``out`` is touched, so a rejected
        payload leaves ``out`` unchanged. Returns ``out``.
        """
        if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 1
                and out.flags.c_contiguous and out.flags.writeable):
            raise GossipError("out must be a writable, contiguous 1-D float32 numpy array")
        # float first: the numbers.Real check alone costs ~0.5 µs, a fifth of a small decode
        real = type(alpha) is float or (isinstance(alpha, numbers.Real) and not isinstance(alpha, bool))
        # past float32's range, alpha becomes Inf in the float32 kernels: NaN where 0 is right
        if not (real and -_F32_MAX <= alpha <= _F32_MAX):   # also False for NaN
            raise GossipError(f"alpha must be a finite real number within float32's range "
                              f"(|alpha| <= {_F32_MAX:.8g}), got {alpha!r}")
        meta, frames, size = self._check(enc)
        if size != out.size:
            raise WireError(f"{self.name}: payload is for n={size}, but out has {out.size} elements")
        self._decode_into(meta, frames, out, float(alpha))
        return out

    def ratio(self, n: int) -> float:
        """Compression ratio (dense float32 bytes / payload bytes) for a vector of length n.

        A query: a seeded codec sends the same payloads with or without it."""
        n = ratio_length(self.name, n)
        # encoding draws from a random codec's generator; put its state back
        rng = getattr(self, "_rng", None)
        state = rng.bit_generator.state if rng is not None else None
        try:
            enc = self.encode(np.zeros(n, np.float32))
        finally:
            if rng is not None:
                rng.bit_generator.state = state
        return 4.0 * n / max(enc.nbytes, 1)

    # ---- hooks --------------------------------------------------------------------------

    def _encode(self, x: np.ndarray) -> Encoded:  # pragma: no cover - abstract
        raise self._missing("_encode(x) -> Encoded")

    def _encode_sparse(self, x: np.ndarray) -> tuple[Encoded, np.ndarray, np.ndarray] | None:
        """For codecs whose payload is a set of coordinates: ``(encode(x), indices, the
        float32 values a receiver decodes at them)``, everything else decoding to zero.
        It spares a sender its own payload's checks and a pass over the whole vector
        (:meth:`encode_decoded`, error feedback). None: not such a codec."""
        return None

    def _encode_device(self, t: Any) -> Encoded | None:
        """Encode a tensor on its accelerator, or return None to move it to the CPU first."""
        return None

    def _encode_contracting(self, x: np.ndarray) -> Encoded:
        """``encode(x)`` for error feedback, whose residual stays bounded only when the
        codec is a contraction, ``E‖C(x) − x‖² < ‖x‖²``. Every codec but a coarse QSGD
        is one, so this is ``encode``; QSGD scales its payload (see there), and a
        receiver decodes the result as any other payload of the family."""
        return self.encode(x)

    def _frame_specs(self, meta: dict[str, Any], n: int) -> list[tuple[str, Any, int]]:  # pragma: no cover
        """``(label, allowed dtypes, length)`` of each frame this meta implies."""
        raise self._missing("_frame_specs(meta, n) -> [(label, dtypes, length), ...]")

    def _decode(self, meta: dict[str, Any], frames: list[np.ndarray], n: int) -> np.ndarray:
        out = np.zeros(n, np.float32)
        self._decode_into(meta, frames, out, 1.0)
        return out

    def _decode_into(self, meta: dict[str, Any], frames: list[np.ndarray], out: np.ndarray,
                     alpha: float) -> None:  # pragma: no cover - abstract
        raise self._missing("_decode_into(meta, frames, out, alpha), adding alpha * the decoded vector to out")

    def _missing(self, hook: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} (codec {self.name!r}) must implement {hook}; a codec "
                                   "implements _encode, _frame_specs and _decode_into")

    def _check_meta(self, meta: dict[str, Any], n: int) -> None:
        """Extra per-codec checks on meta values (ranges, finiteness)."""

    def _check_frames(self, meta: dict[str, Any], frames: list[np.ndarray], n: int) -> None:
        """Extra per-codec checks on frame contents (index ranges, value ranges)."""

    # ---- shared checks ------------------------------------------------------------------

    def _check(self, enc: Any) -> tuple[dict[str, Any], list[np.ndarray], int]:
        if not isinstance(enc, Encoded):
            raise WireError(f"{self.name}: expected an Encoded, got {type(enc).__name__}")
        meta = enc.meta
        if not isinstance(meta, dict):
            raise WireError(f"{self.name}: meta is a {type(meta).__name__}, not a dict")
        if meta.get("codec") != self.name:
            raise WireError(f"{self.name}: payload was encoded by codec {shown(meta.get('codec'))}")
        n = meta_int(meta, "n", self.name, lo=0)
        self._check_meta(meta, n)
        specs = self._frame_specs(meta, n)
        raw = enc.frames
        if not isinstance(raw, (list, tuple)) or len(raw) != len(specs):
            got = len(raw) if isinstance(raw, (list, tuple)) else type(raw).__name__
            raise WireError(f"{self.name}: expected {len(specs)} frames, got {got}")
        frames = []
        for f, (label, dtypes, length) in zip(raw, specs):
            if not isinstance(f, np.ndarray):
                raise WireError(f"{self.name}: frame {label} is a {type(f).__name__}, not an array")
            if f.dtype not in _dtypes(dtypes) or f.dtype.byteorder == ">":
                raise WireError(f"{self.name}: frame {label} has dtype {f.dtype}, expected {'/'.join(dtypes)}")
            if f.size != length:
                raise WireError(f"{self.name}: frame {label} has {f.size} elements, expected {length}")
            frames.append(f.reshape(-1))
        self._check_frames(meta, frames, n)
        return meta, frames, n


@functools.lru_cache(maxsize=None)
def _dtypes(names: tuple[str, ...]) -> frozenset[np.dtype]:
    # dtype objects compare and hash without building their name string, which
    # measured ~50 µs per message here
    return frozenset(np.dtype(n) for n in names)


def meta_int(meta: dict[str, Any], key: str, codec: str, lo: int | None = None,
             hi: int | None = None) -> int:
    """``meta[key]`` as an int in ``[lo, hi]``, or :class:`WireError` naming the key."""
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise WireError(f"{codec}: meta {key}={shown(v)} is not an integer")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise WireError(f"{codec}: meta {key}={v} is outside [{lo}, {hi}]")
    return v


#: the largest float32: a scale beyond it would decode to Inf (a sender's scales are
#: computed from float32 values and never exceed it)
_F32_MAX = float(np.finfo(np.float32).max)


def meta_float(meta: dict[str, Any], key: str, codec: str) -> float:
    """``meta[key]`` as a non-negative float within float32's range, or
    :class:`WireError` naming the key."""
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{codec}: meta {key}={shown(v)} is not a number")
    if not 0 <= v <= _F32_MAX:   # also False for NaN
        raise WireError(f"{codec}: meta {key}={shown(v)} is not in [0, {_F32_MAX:.4g}] (a float32 scale)")
    return float(v)


#: the smallest normal float32: a scale below it would lose precision, or be 0, in float32
_F32_TINY = float(np.finfo(np.float32).tiny)


def meta_scale(meta: dict[str, Any], key: str, codec: str) -> float:
    """``meta[key]`` as a positive float within float32's normal range (a divisor the
    sender applied, which the receiver multiplies back), or :class:`WireError`."""
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{codec}: meta {key}={shown(v)} is not a number")
    if not _F32_TINY <= v <= _F32_MAX:   # also False for NaN
        raise WireError(f"{codec}: meta {key}={shown(v)} is not in [{_F32_TINY:.4g}, {_F32_MAX:.4g}] "
                        f"(a positive float32 scale)")
    return float(v)


def scatter(n: int, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """A float32 vector of length ``n``: ``vals`` at ``idx``, zero elsewhere (what a
    receiver decodes from a sparse payload, :meth:`Codec._encode_sparse`)."""
    out = np.zeros(n, np.float32)
    out[idx] = vals
    return out


def _device_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor on an accelerator (not the CPU, not "meta")."""
    if type(x).__module__.split(".")[0] != "torch":
        return False
    dev = getattr(x, "device", None)
    # "meta" tensors hold no data: as_vector refuses them
    return dev is not None and getattr(dev, "type", "cpu") not in ("cpu", "meta")


class Scratch:
    """Grow-only scratch buffers keyed by name, reused across calls to avoid page faults."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, key: str, n: int, dtype: Any) -> np.ndarray:
        b = self._bufs.get(key)
        if b is None or b.size < n or b.dtype != np.dtype(dtype):
            b = np.empty(max(n, 1), dtype)
            self._bufs[key] = b
        return b[:n]
