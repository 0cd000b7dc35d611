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

from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np
from zmq import Frame

from .checks import MAX_SHOWN, shown  # noqa: F401 - both are the wire's names too
from .errors import WireError

__all__ = [
    "shown",
    "VERSION",
    "DTYPES",
    "PROTOCOL_TYPES",
    "Limits",
    "Message",
    "encode",
    "decode",
    "unpack_header",
    "register_type",
    "known_types",
]

#: The protocol's version, in every header; a message of another is refused. Raised when a
#: message type is added or one's meaning changes, so that hosts running different
#: releases are told so (docs/wire.md lists the versions): 1 until the gradient relay's
#: notices and copies (grad_late, grad_sync, grad_state) changed what a peer must answer;
#: a swarm mixing such releases ran on, 3-4x slower, with nothing said; 2 until the
#: bootstrap's acknowledgement (gsp_boot_ok): an asker of this release asked every old donor
#: again after 1 s, and an old asker took a new donor's ack for a malformed message; 3
#: until the relay sent its last turn again at joins too, each resend marked with the view
#: that made it (``q``): an old peer took a join's resend and the leave's that followed for
#: one message, and dropped the second, losing the gradient for the peers behind it; 4
#: until a gossip nack carried the receiver's size (``gsp_nack {ver, d}``: a sender of
#: another size sends it nothing more) and an engine without ``topology=`` followed its
#: peer's graph instead of a ring: a mixed swarm kept sending full states to a peer of
#: another size, and averaged over two graphs, moving the mean ~5% with every round ok.
VERSION = 5

#: dtypes allowed on the wire (little-endian only; this is what numpy's native
#: names mean on every machine swarm runs on).
DTYPES: frozenset[str] = frozenset(
    {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
     "int64", "uint64", "float16", "float32", "float64"}
)

#: swarm's own message types (docs/wire.md, section 4)
PROTOCOL_TYPES: frozenset[str] = frozenset({
    # membership (peer <-> coordinator)
    "join", "welcome", "refuse", "heartbeat", "rejoin", "leave", "view",
    "suspect", "probe", "probe_ack", "linked", "status", "status_reply", "standby",
    # peer <-> peer
    "hello", "hello_ack", "ping", "pong", "bye",
})

# Message types. Each subsystem registers the types it handles; a message of a
# type nobody registered is dropped by the receiver as malformed.
_TYPES: set[str] = set(PROTOCOL_TYPES)

MAX_TYPE_LEN = 32
MAX_SRC_LEN = 256


def register_type(name: str) -> str:
    """Add a message type to the whitelist (for subsystems such as gossip)."""
    if not _type_name_ok(name):
        raise WireError(f"message type must be a non-empty str of <= {MAX_TYPE_LEN} chars, got {name!r:.80}")
    _TYPES.add(name)
    return name


def _type_name_ok(name: Any) -> bool:
    """Whether ``name`` can be registered: a type that cannot is dropped by every receiver."""
    return isinstance(name, str) and 0 < len(name) <= MAX_TYPE_LEN


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

    @property
    def max_containers(self) -> int:
        """Maps and arrays a header may hold: one per 8 bytes of ``max_header_bytes``.
        The other limits bound each container, not their number; an empty list is one
        byte on the wire and ~60 in memory, so 4 MiB of them took ~0.6 s and ~270 MB to
        unpack. An honest header is far below (a view of 10,000 members holds ~10,000)."""
        return self.max_header_bytes // 8


DEFAULT_LIMITS = Limits()


@dataclass
class Message:
    """A decoded message. ``arrays`` are views over the received frames (no copy; the
    receiver owns them, and they are writable when the frames are libzmq's buffers)."""

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


_NAMES: dict[np.dtype, str] = {np.dtype(n): n for n in DTYPES}


def encode(
    t: str,
    src: str,
    *,
    epoch: int = 0,
    seq: int = 0,
    body: dict[str, Any] | None = None,
    arrays: Sequence[np.ndarray] = (),
    limits: Limits = DEFAULT_LIMITS,
) -> list[Any]:
    """Encode a message into frames ready for ``send_multipart(copy=False)``.

    Arrays are sent from their own memory (made contiguous if they are not):
    do not modify them until the message has gone.

    Raises :class:`WireError` for a message that a receiver with ``limits``
    would drop (:func:`decode` checks the same): a type that no receiver can
    register (``t`` is registered where it is received, not necessarily here), a bad
    ``src``, an ``epoch`` or ``seq`` that is not an int of 64 bits, a body that is not
    a dict or holds what msgpack cannot pack (numpy
    scalars and arrays, sets, other objects) or over the limits (non-str map
    keys, long strings and containers), ``arrays`` that is not a sequence of arrays
    (None: pass ``()`` for none) or holds one numpy cannot make an array of (a
    ragged list), too many arrays or dimensions, a dtype not in :data:`DTYPES`, or
    too many bytes in all.
    """
    if not _type_name_ok(t):
        raise WireError(f"message type {t!r} cannot be registered, so no receiver accepts it: "
                        f"give a non-empty str of <= {MAX_TYPE_LEN} chars")
    if type(src) is not str or not src or len(src) > MAX_SRC_LEN:
        raise WireError(f"bad src {src!r}: a str of 1 to {MAX_SRC_LEN} chars")
    for name, v in (("epoch", epoch), ("seq", seq)):
        # int() would take "7" and 3.9 as 7 and 3; a receiver refuses a bool
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise WireError(f"{name} must be an int, got {v!r:.40}")
        if not -2**63 <= v < 2**64:   # else msgpack refused it, and the body was blamed
            # str() of an int of over 4300 digits raises ValueError
            got = v if v.bit_length() <= 128 else f"an int of {v.bit_length()} bits"
            raise WireError(f"{name} must be an int of 64 bits (-2**63 to 2**64 - 1), got {got}")
    if body is None:
        body = {}
    elif not isinstance(body, dict):
        raise WireError(f"body must be a dict, got {type(body).__name__}")
    descs = []
    frames: list[Any] = [b""]
    nbytes = 0
    max_ndim = limits.max_ndim
    if isinstance(arrays, np.ndarray):   # iterated, its rows would go as separate arrays
        raise WireError(f"arrays must be a sequence of numpy arrays, got one array of shape {arrays.shape}; "
                        "pass [a] to send it")
    try:
        items = iter(arrays)
    except TypeError:
        raise WireError(f"arrays must be a sequence of numpy arrays, got {type(arrays).__name__}; "
                        "pass () for none") from None
    for a in items:
        if type(a) is not np.ndarray:
            try:
                a = np.asarray(a)
            except (TypeError, ValueError) as e:   # a ragged list: numpy refuses it
                raise WireError(f"array {len(descs)} is not an array numpy can make: {e}") from None
        name = _NAMES.get(a.dtype)   # native byte order only: '>f4' is not in the table
        if name is None:
            raise WireError(f"dtype {a.dtype} cannot go on the wire; allowed: {sorted(DTYPES)}")
        if a.ndim > max_ndim:
            raise WireError(f"array {len(descs)}: {a.ndim} dimensions, more than the limit {max_ndim}")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        descs.append([name, a.shape])   # msgpack packs the tuple as the list a receiver reads
        n = a.nbytes
        frames.append(a if n else b"")
        nbytes += n
    if len(descs) > limits.max_frames:
        raise WireError(f"{len(descs)} arrays, more than the limit {limits.max_frames}")
    try:
        head = msgpack.packb({"v": VERSION, "t": t, "src": src, "epoch": int(epoch), "seq": int(seq),
                              "body": body, "arrays": descs}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(_body_problem(body, limits) or f"body cannot go on the wire: {e}") from None
    nbytes += len(head)
    if nbytes > limits.max_message_bytes:
        raise WireError(f"message of {nbytes} bytes exceeds the limit {limits.max_message_bytes}")
    if len(head) > limits.max_header_bytes:
        raise WireError(f"header of {len(head)} bytes exceeds the limit {limits.max_header_bytes}")
    try:
        _check_unpacks(head, limits)   # what msgpack packs but a receiver refuses: long strings, int keys
    except Exception:  # msgpack raises several unrelated types
        try:
            unpack_header(head, limits)   # refuses it too, and says why as a receiver would
        except WireError as e:
            raise WireError(_body_problem(body, limits) or str(e)) from None
    frames[0] = head
    return frames


def _check_unpacks(head: bytes, limits: Limits) -> None:
    """Raise where :func:`unpack_header` would refuse ``head``, which msgpack packed, at less cost:
    bytes for str and tuples for lists are cheaper to make, and refused alike (msgpack
    packs no invalid UTF-8, and takes only str and bytes as keys with ``strict_map_key``)."""
    msgpack.unpackb(
        head, raw=True, strict_map_key=True, use_list=False, **_hooks(head, limits),
        max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
        max_array_len=limits.max_array_len, max_map_len=limits.max_map_len,
        max_ext_len=0,
    )


def _hooks(head: Any, limits: Limits) -> dict[str, Any]:
    """msgpack's hooks that count the maps and arrays of ``head`` against the limit; none
    for a header no longer than it (each takes a byte at least), so ordinary ones pay nothing."""
    if len(head) <= limits.max_containers:
        return {}
    count = _Counter(limits.max_containers)
    return {"list_hook": count, "object_hook": count}


class _TooManyContainers(Exception):
    pass


class _Counter:
    """msgpack's hook for each map and array unpacked: raises past ``left`` of them."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def __call__(self, x: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise _TooManyContainers
        return x


def _body_problem(body: dict[str, Any], limits: Limits) -> str | None:
    """Where in ``body`` msgpack or the receiver's limits fail, in words (None if not found)."""
    try:
        return _problem(body, "body", limits)
    except RecursionError:
        return None


def _problem(x: Any, where: str, limits: Limits) -> str | None:
    if x is None or isinstance(x, (bool, float)):
        return None
    if isinstance(x, int):
        return None if -2**63 <= x < 2**64 else f"{where}: int {x} does not fit in 64 bits"
    if isinstance(x, str):
        try:
            n = len(x.encode())
        except UnicodeEncodeError:
            return f"{where}: str is not valid UTF-8 text"
        return f"{where}: str of {n} bytes, more than the limit {limits.max_str_len}" \
            if n > limits.max_str_len else None
    if isinstance(x, (bytes, bytearray, memoryview)):
        n = memoryview(x).nbytes
        return f"{where}: {n} bytes, more than the limit {limits.max_bin_len}" if n > limits.max_bin_len else None
    if isinstance(x, dict):
        if len(x) > limits.max_map_len:
            return f"{where}: dict of {len(x)} items, more than the limit {limits.max_map_len}"
        for k, v in x.items():
            if not isinstance(k, (str, bytes)):
                return f"{where}: key {k!r} is not a str ({type(k).__name__}); map keys must be str"
            found = _problem(k, f"{where} key {k!r:.40}", limits) or _problem(v, f"{where}[{k!r:.40}]", limits)
            if found:
                return found
        return None
    if isinstance(x, (list, tuple)):
        if len(x) > limits.max_array_len:
            return f"{where}: {type(x).__name__} of {len(x)} items, more than the limit {limits.max_array_len}"
        for i, v in enumerate(x):
            found = _problem(v, f"{where}[{i}]", limits)
            if found:
                return found
        return None
    if isinstance(x, np.ndarray):
        return f"{where}: a numpy array cannot go in the body; send it as an array frame (arrays=[...])"
    if isinstance(x, (np.bool_, np.integer, np.floating)):
        return (f"{where}: np.{type(x).__name__} cannot go on the wire; use {type(x.item()).__name__}() "
                f"or an array frame")
    return (f"{where}: {type(x).__name__} cannot go on the wire; use dict, list, str, bytes, int, float, "
            f"bool or None")


def _buffer(frame: Any) -> memoryview:
    """The bytes of a received frame (bytes or memoryview; :func:`decode` reads a zmq.Frame
    as it is) without copying."""
    tp = type(frame)
    if tp is bytes or tp is bytearray:
        return memoryview(frame)
    buf = getattr(frame, "buffer", None)   # zmq.Frame
    if buf is not None:
        return buf
    try:
        if tp is memoryview:
            if frame.format == "B" and frame.ndim == 1 and frame.c_contiguous:
                return frame
            return frame.cast("B")
        return memoryview(frame).cast("B")
    except TypeError:   # not a buffer, or one that is not contiguous
        raise WireError(f"frame of type {tp.__name__} is not contiguous bytes") from None
    except ValueError as e:   # a released memoryview
        raise WireError(f"frame of type {tp.__name__} cannot be read: {e}") from None


#: a wire dtype's name -> (the dtype, its itemsize)
_DT = {n: (np.dtype(n), np.dtype(n).itemsize) for n in DTYPES}


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and check a received multipart message. Raises :class:`WireError`."""
    n = len(frames)
    if n == 0:
        raise WireError("empty message")
    if n > limits.max_frames + 1:
        raise WireError(f"{n} frames, more than the limit {limits.max_frames + 1}")
    # A zmq.Frame is read as it is (msgpack and numpy take its buffer; len() is its size):
    # making a memoryview of each frame cost about as much as all the checks on it.
    bufs = [f if type(f) is Frame else _buffer(f) for f in frames]
    sizes = [len(b) if type(b) is Frame else b.nbytes for b in bufs]
    head, total = bufs[0], sum(sizes)
    if total > limits.max_message_bytes:
        raise WireError(f"message of {total} bytes exceeds the limit {limits.max_message_bytes}")
    if sizes[0] > limits.max_header_bytes:
        raise WireError(f"header of {sizes[0]} bytes exceeds the limit {limits.max_header_bytes}")
    h = unpack_header(head, limits)
    if type(h) is not dict:
        raise WireError("header is not a map")
    v = h.get("v")
    if type(v) is not int or v != VERSION:   # 3.0 is no version number
        raise WireError(f"protocol version {shown(v)}, expected {VERSION} (another swarm release: every host "
                        "must run the same one)")
    t, src = h.get("t"), h.get("src")
    if type(t) is not str or t not in _TYPES:   # str first: a list is not hashable
        raise WireError(f"unknown message type {shown(t)}")
    if type(src) is not str or not src or len(src) > MAX_SRC_LEN:
        raise WireError(f"bad src {shown(src)}")
    epoch, seq = h.get("epoch", 0), h.get("seq", 0)
    if type(epoch) is not int or type(seq) is not int:
        raise WireError("epoch and seq must be integers")
    body = h.get("body", {})
    if type(body) is not dict:
        raise WireError("body is not a map")
    descs = h.get("arrays", [])
    if type(descs) is not list or len(descs) != n - 1:
        raise WireError(f"header describes {len(descs) if isinstance(descs, list) else '?'} "
                        f"arrays but {n - 1} frames follow")
    arrays = _arrays(descs, bufs, sizes, limits.max_ndim) if descs else []
    return Message(t=t, src=src, epoch=epoch, seq=seq, body=body, arrays=arrays, nbytes=total)


def unpack_header(head: Any, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Unpack a header frame's msgpack under ``limits`` (its size is the caller's to check)
    and return it, not yet checked as a header; raises :class:`WireError`. :func:`decode`
    unpacks with it, :func:`encode` checks its output with it, and the coordinator's
    heartbeat fast path reads with it."""
    try:
        return msgpack.unpackb(
            head, raw=False, strict_map_key=True, use_list=True, **_hooks(head, limits),
            max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len, max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except _TooManyContainers:
        raise WireError(f"header holds more than {limits.max_containers} maps and arrays "
                        f"(one per 8 bytes of the header limit)") from None
    except Exception as e:  # msgpack raises several unrelated types
        raise WireError(f"header is not valid msgpack: {type(e).__name__}: {e}") from None


def _arrays(descs: list[Any], bufs: list[Any], sizes: list[int], max_ndim: int) -> list[np.ndarray]:
    """The arrays that ``descs`` describe, each checked, over the frames after the header
    (``bufs[1:]``, of ``sizes[1:]`` bytes). One loop for all: a message carries a dozen or
    more, and a call per array cost a fifth of the time."""
    arrays = []
    for i, desc in enumerate(descs):
        if type(desc) is not list or len(desc) != 2:
            raise WireError(f"array {i}: descriptor must be [dtype, shape]")
        name, shape = desc
        dt = _DT.get(name) if type(name) is str else None
        if dt is None:
            raise WireError(f"array {i}: dtype {shown(name)} not allowed")
        if type(shape) is not list or len(shape) > max_ndim:
            raise WireError(f"array {i}: bad shape {shown(shape)}")
        dtype, expect = dt
        for d in shape:
            if type(d) is not int or d < 0:
                raise WireError(f"array {i}: bad shape {shown(shape)}")
            expect *= d
        nbytes = sizes[i + 1]
        if expect != nbytes:
            raise WireError(f"array {i}: shape {shape} of {name} needs {expect} bytes, frame has {nbytes}")
        if expect:
            buf = bufs[i + 1]
            if type(buf) is Frame:
                # over the frame's bytes in one call, which keeps the frame alive: np.frombuffer
                # and a reshape cost twice as much (and frombuffer's keywords as much again)
                arrays.append(np.ndarray(shape, dtype, buf))
            else:
                # np.ndarray would keep only what the memoryview's exporter views, where
                # frombuffer keeps the memoryview (and so the exporter: the frame) alive
                a = np.frombuffer(buf, dtype)
                arrays.append(a if len(shape) == 1 else a.reshape(shape))
            continue
        # an empty array may still name huge dimensions ([0, 2**63]), which numpy refuses
        try:
            arrays.append(np.empty(shape, dtype))
        except (ValueError, OverflowError) as e:
            raise WireError(f"array {i}: bad shape {shown(shape)}: {e}") from None
    return arrays
