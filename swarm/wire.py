"""The swarm envelope: one msgpack header frame, then raw array frames.

A message is one ZeroMQ multipart message::

    frame 0     msgpack map: {v, t, src, epoch, seq, body, arrays}
    frame 1..n  raw bytes of the arrays, in the order of ``arrays``

``arrays`` is a list of ``[dtype, shape]`` pairs; array ``i`` travels in frame
``i + 1``. Only the dtypes in :data:`DTYPES` are accepted and
``prod(shape) * itemsize`` must equal the frame's length. Decoding never copies
array bytes (``np.frombuffer`` over the received frame) and never unpickles.

Anything that fails a check raises :class:`~swarm.errors.WireError`; the
receive loops catch it, count it and drop the message. See ``docs/wire.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

from .errors import WireError

__all__ = [
    "VERSION",
    "DTYPES",
    "Limits",
    "Message",
    "encode",
    "decode",
    "register_type",
    "known_types",
]

VERSION = 1

#: dtypes allowed on the wire (little-endian only; this is what numpy's native
#: names mean on every machine swarm runs on).
DTYPES: frozenset[str] = frozenset(
    {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
     "int64", "uint64", "float16", "float32", "float64"}
)

# Message types. Each subsystem registers the types it handles; a message of a
# type nobody registered is dropped by the receiver as malformed.
_TYPES: set[str] = {
    # membership (peer <-> coordinator)
    "join", "welcome", "refuse", "heartbeat", "rejoin", "leave", "view",
    "suspect", "probe", "probe_ack", "linked", "status", "status_reply",
    # peer <-> peer
    "hello", "hello_ack", "ping", "pong", "bye",
}


def register_type(name: str) -> str:
    """Add a message type to the whitelist (for subsystems such as gossip)."""
    if not isinstance(name, str) or not name or len(name) > 32:
        raise ValueError(f"message type must be a non-empty str of <= 32 chars, got {name!r}")
    _TYPES.add(name)
    return name


def known_types() -> frozenset[str]:
    return frozenset(_TYPES)


@dataclass(frozen=True)
class Limits:
    """Hard limits on what a receiver accepts. Also set as ZMQ ``MAXMSGSIZE``."""

    max_message_bytes: int = 512 * 1024 * 1024
    max_header_bytes: int = 4 * 1024 * 1024
    max_frames: int = 64
    max_str_len: int = 64 * 1024
    max_bin_len: int = 1024 * 1024
    max_array_len: int = 100_000
    max_map_len: int = 10_000
    max_ndim: int = 8


DEFAULT_LIMITS = Limits()


@dataclass
class Message:
    """A decoded message. ``arrays`` are read-only views over the received frames."""

    t: str
    src: str
    epoch: int = 0
    seq: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)
    # Transport bookkeeping (not on the wire): the socket it came in on and the
    # ZeroMQ routing id to reply through, set by the peer's receive loop.
    route: Any = None
    nbytes: int = 0


def encode(
    t: str,
    src: str,
    *,
    epoch: int = 0,
    seq: int = 0,
    body: dict[str, Any] | None = None,
    arrays: Sequence[np.ndarray] = (),
) -> list[Any]:
    """Encode a message into frames ready for ``send_multipart(copy=False)``.

    Arrays are sent from their own memory (made contiguous if they are not).
    """
    descs = []
    frames: list[Any] = [b""]
    for a in arrays:
        a = np.asarray(a)
        name = a.dtype.name
        if name not in DTYPES or a.dtype.byteorder == ">":
            raise WireError(f"dtype {a.dtype} cannot go on the wire; allowed: {sorted(DTYPES)}")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        descs.append([name, list(a.shape)])
        frames.append(a.reshape(-1).view(np.uint8) if a.size else b"")
    header = {"v": VERSION, "t": t, "src": src, "epoch": int(epoch), "seq": int(seq),
              "body": body or {}, "arrays": descs}
    frames[0] = msgpack.packb(header, use_bin_type=True)
    return frames


def _buffer(frame: Any) -> memoryview:
    """The bytes of a received frame (zmq.Frame, bytes or memoryview) without copying."""
    if isinstance(frame, (bytes, bytearray)):
        return memoryview(frame)
    if isinstance(frame, memoryview):
        return frame
    buf = getattr(frame, "buffer", None)   # zmq.Frame
    if buf is not None:
        return buf
    try:
        return memoryview(frame).cast("B")
    except TypeError:
        raise WireError(f"frame of type {type(frame).__name__} is not bytes") from None


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and check a received multipart message. Raises :class:`WireError`."""
    if not frames:
        raise WireError("empty message")
    if len(frames) > limits.max_frames + 1:
        raise WireError(f"{len(frames)} frames, more than the limit {limits.max_frames + 1}")
    bufs = [_buffer(f) for f in frames]
    total = sum(b.nbytes for b in bufs)
    if total > limits.max_message_bytes:
        raise WireError(f"message of {total} bytes exceeds the limit {limits.max_message_bytes}")
    head = bufs[0]
    if head.nbytes > limits.max_header_bytes:
        raise WireError(f"header of {head.nbytes} bytes exceeds the limit {limits.max_header_bytes}")
    try:
        h = msgpack.unpackb(
            head, raw=False, strict_map_key=True, use_list=True,
            max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len, max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several unrelated types
        raise WireError(f"header is not valid msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(h, dict):
        raise WireError("header is not a map")
    v = h.get("v")
    if v != VERSION:
        raise WireError(f"protocol version {v!r}, expected {VERSION}")
    t, src = h.get("t"), h.get("src")
    if not isinstance(t, str) or t not in _TYPES:
        raise WireError(f"unknown message type {t!r}")
    if not isinstance(src, str) or not src or len(src) > 256:
        raise WireError(f"bad src {src!r}")
    epoch, seq = h.get("epoch", 0), h.get("seq", 0)
    if not isinstance(epoch, int) or not isinstance(seq, int) or isinstance(epoch, bool):
        raise WireError("epoch and seq must be integers")
    body = h.get("body", {})
    if not isinstance(body, dict):
        raise WireError("body is not a map")
    descs = h.get("arrays", [])
    if not isinstance(descs, list) or len(descs) != len(frames) - 1:
        raise WireError(f"header describes {len(descs) if isinstance(descs, list) else '?'} "
                        f"arrays but {len(frames) - 1} frames follow")
    arrays = []
    for i, d in enumerate(descs):
        arrays.append(_array(d, bufs[i + 1], i, limits))
    return Message(t=t, src=src, epoch=epoch, seq=seq, body=body, arrays=arrays, nbytes=total)


def _array(desc: Any, buf: memoryview, i: int, limits: Limits) -> np.ndarray:
    if not (isinstance(desc, list) and len(desc) == 2):
        raise WireError(f"array {i}: descriptor must be [dtype, shape]")
    name, shape = desc
    if not isinstance(name, str) or name not in DTYPES:
        raise WireError(f"array {i}: dtype {name!r} not allowed")
    if (not isinstance(shape, list) or len(shape) > limits.max_ndim
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise WireError(f"array {i}: bad shape {shape!r}")
    dtype = np.dtype(name)
    expect = math.prod(shape) * dtype.itemsize
    if expect != buf.nbytes:
        raise WireError(f"array {i}: shape {shape} of {name} needs {expect} bytes, frame has {buf.nbytes}")
    if expect == 0:
        return np.empty(shape, dtype)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
