"""ZeroMQ plumbing shared by peers and the coordinator.

Sockets are created with the options the design asks for (small high-water
marks, ``LINGER`` 0 but :data:`DATA_LINGER_MS` on data links, ``MAXMSGSIZE``,
ZMTP heartbeats) and read with the poll-then-drain pattern: await readability
once, then take every queued message with non-blocking receives on a plain
(shadow) socket. Awaiting each ``recv`` costs a loop round trip per message;
draining does not.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import math
import os
import re
import socket as _socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import zmq
import zmq.asyncio

from .checks import printable
from .errors import ConfigError, TransportError, WireError
from .wire import DEFAULT_LIMITS, Limits, Message, decode, shown

log = logging.getLogger("swarm.transport")

#: most messages taken from one socket before giving the others a turn
DRAIN_BATCH = 256


def router(ctx: zmq.asyncio.Context, *, limits: Limits = DEFAULT_LIMITS, hwm: int = 1000,
           heartbeat_s: float | None = None, heartbeat_timeout_s: float | None = None) -> zmq.asyncio.Socket:
    """An inbound ROUTER: replies to unknown routes fail fast (``ROUTER_MANDATORY``)."""
    return _socket_with(ctx, zmq.ROUTER, [
        (zmq.LINGER, 0),
        (zmq.ROUTER_MANDATORY, 1),
        (zmq.MAXMSGSIZE, limits.max_message_bytes),
        (zmq.RCVHWM, hwm),
        (zmq.SNDHWM, hwm),
        *_heartbeat_options(heartbeat_s, heartbeat_timeout_s),
    ])


#: ``LINGER`` of the sockets that send data to other peers (links, outboxes), in ms; they
#: are closed and disconnected with it. Not 0: libzmq 4.3.5 aborts the process
#: (``session_base.cpp:233``, "Resource temporarily unavailable", issue #3442) when a
#: socket with LINGER 0 is closed or disconnected while its connection is part way
#: through a multipart message (a multi-MB gossip frame behind a slow receiver) and the
#: connection then fails before libzmq has let go of it: a neighbour that leaves closes
#: its end at about the moment we close our link to it. With a linger libzmq can still
#: read the rest of that message, and drops it. Closing such a socket, and so the
#: context's ``term()``, waits up to this long for what it has queued to go out.
DATA_LINGER_MS = 100

#: ``MAXMSGSIZE`` of a send-only DEALER: libzmq applies it to ZMTP commands too, and the
#: largest it must take is a CURVE handshake's (WELCOME, 168 bytes); pings are under 100
SEND_ONLY_MAX_BYTES = 4096


def dealer(ctx: zmq.asyncio.Context, *, limits: Limits = DEFAULT_LIMITS, hwm: int = 8,
           immediate: bool = False, heartbeat_s: float | None = None,
           heartbeat_timeout_s: float | None = None, connect_timeout_s: float | None = None,
           send_only: bool = False) -> zmq.asyncio.Socket:
    """An outbound DEALER with a small send queue; ``connect_timeout_s``:
    how long a host has to answer a connection before libzmq gives it up and dials again
    (else the OS's SYN retries decide: a host gone without a reset was reached up to a
    minute after it came back). ``send_only`` (a link's DEALER, never read): it queues
    one message at most, drops the connection on one over :data:`SEND_ONLY_MAX_BYTES`,
    and lingers :data:`DATA_LINGER_MS` (others 0: they carry small messages, and are
    closed only with their process or their coordinator connection)."""
    # a send-only DEALER's receive queue is never read: under the full limits, what the
    # other end sent back (1000 messages of up to 512 MiB) was held for the link's life
    return _socket_with(ctx, zmq.DEALER, [
        (zmq.LINGER, DATA_LINGER_MS if send_only else 0),
        (zmq.SNDHWM, hwm),
        (zmq.RCVHWM, 1 if send_only else 1000),
        (zmq.MAXMSGSIZE, SEND_ONLY_MAX_BYTES if send_only else limits.max_message_bytes),
        (zmq.RECONNECT_IVL, 50),
        (zmq.RECONNECT_IVL_MAX, 1000),
        *([(zmq.IMMEDIATE, 1)] if immediate else []),
        *_heartbeat_options(heartbeat_s, heartbeat_timeout_s),
        *([(zmq.CONNECT_TIMEOUT, int(connect_timeout_s * 1000))] if connect_timeout_s else []),
    ])


def _socket_with(ctx: zmq.Context, kind: int, options: list[tuple[int, int]]) -> Any:
    """A new socket with ``options`` set. A value libzmq refuses (out of its range) is
    a :class:`ConfigError` naming the option, and the socket is closed first: one left
    open made the context's ``term()``, and so the owner's close, wait for ever."""
    s = ctx.socket(kind)
    try:
        for opt, value in options:
            try:
                s.setsockopt(opt, value)
            except (OverflowError, zmq.ZMQError) as e:
                name = getattr(opt, "name", opt)
                raise ConfigError(f"socket option {name} = {value!r} is out of libzmq's range ({e}); "
                                  "check the settings it comes from (high-water marks, message size "
                                  "limit, heartbeat intervals)") from None
    except BaseException:
        s.close(0)
        raise
    return s


def fd_limit() -> int | None:
    """This process's soft limit on open files (``ulimit -n``): each socket holds one
    (its mailbox) and each of its connections one more. None where there is none
    (unlimited, or a platform without the ``resource`` module)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def raise_fd_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit, never above it,
    and return the soft limit it then has (as :func:`fd_limit`); where the system refuses,
    the limit stays as it was.

    For the `swarm coordinator` and `swarm peer` processes: a ROUTER that has no file
    left for a connection does not refuse it, libzmq retries the ``accept()`` in a loop
    (1.5 to 2.5 cores, nothing logged) while the client hangs, and the common soft limit,
    1024, is far below ``coordinator.max_members`` (10,000) and the usual hard limit."""
    try:
        import resource  # noqa: PLC0415 - POSIX only
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass   # an unlimited hard limit that the system does not take as a soft one (macOS)
    return fd_limit()


def _heartbeat_options(ivl: float | None, timeout: float | None) -> list[tuple[int, int]]:
    if not ivl:
        return []
    ttl = int((timeout or 3 * ivl) * 1000)
    return [(zmq.HEARTBEAT_IVL, int(ivl * 1000)), (zmq.HEARTBEAT_TIMEOUT, ttl), (zmq.HEARTBEAT_TTL, ttl)]


def heartbeats(s: zmq.Socket, ivl: float | None, timeout: float | None) -> None:
    """ZMTP heartbeats every ``ivl`` seconds; a connection silent for ``timeout`` (default
    3 x ``ivl``) is dropped (and dialled again)."""
    # ZMTP heartbeats are answered by libzmq's I/O thread, not by Python: a busy
    # learner or a GC pause cannot make a live peer look dead; a frozen process can.
    for opt, value in _heartbeat_options(ivl, timeout):
        s.setsockopt(opt, value)


def _port_error(addr: str) -> str:
    # libzmq takes a tcp port modulo 65536: port 99999 would quietly be 34463. isascii():
    # "²" is a digit to isdigit() and not to int(), whose ValueError escaped; libzmq
    # refuses any port not in 0-9
    port = addr.rpartition(":")[2]
    if addr.startswith("tcp://") and port.isascii() and port.isdigit() and int(port) > 65535:
        return f"port {port} is out of range (0-65535)"
    return ""


def bind(s: zmq.Socket, addr: str, what: str = "") -> str:
    """Bind and return the resolved endpoint (a ``*`` port becomes the real one).
    ``what`` names where ``addr`` comes from (``coordinator.bind``) in an error."""
    why = _port_error(addr)
    if not why:
        try:
            s.bind(addr)
        except zmq.ZMQError as e:
            why = _bind_failure(addr, e)
    if why:
        raise TransportError(f"{what + ': ' if what else ''}cannot bind {addr}: {why}")
    return s.getsockopt_string(zmq.LAST_ENDPOINT)


def _bind_failure(addr: str, e: zmq.ZMQError) -> str:
    """Why binding ``addr`` failed, in words that do not repeat it."""
    if e.errno == errno.ENODEV:
        # libzmq tries a host it cannot resolve as a network interface's name, and says
        # that there is no such device
        return _unresolved_words([addr.removeprefix("tcp://").rpartition(":")[0]])
    # pyzmq adds the address to libzmq's words, and it is named already
    return e.strerror.removesuffix(f" (addr={addr!r})")


def connect(s: zmq.Socket, addr: str) -> None:
    if why := _port_error(addr):
        raise TransportError(f"cannot connect to {addr}: {why}")
    try:
        s.connect(addr)
    except zmq.ZMQError as e:
        hint = "; expected tcp://HOST:PORT" if member_address_error(addr) else ""
        raise TransportError(f"cannot connect to {addr}: {e.strerror}{hint}") from None


#: a member's address: a host name or an IPv4 address (sockets do not enable IPv6), and a port.
#: The host begins with a letter or digit: libzmq's connect() refuses one that begins
#: with '-', '_' or '.' (EINVAL), and then every neighbour failed to link to the member
_MEMBER_ADDR = re.compile(r"tcp://([A-Za-z0-9][A-Za-z0-9._-]{0,252}):([0-9]{1,5})", re.ASCII)
#: a host of digits and dots: no name, so it must be an IPv4 address (999.1.1.1 and
#: 1.2.3.4.5 went into views, and nobody could reach them)
_NUMERIC_HOST = re.compile(r"[0-9.]+", re.ASCII)


def unspecified_host(host: str) -> bool:
    """Whether ``host`` is 0.0.0.0, as the resolver reads it (``0`` and ``0.0`` too): it
    binds every interface, but dialled it reaches only the dialler's own machine."""
    try:
        return _socket.inet_aton(host) == bytes(4)
    except OSError:   # a host name, or junk
        return False


def _not_ipv4(host: str) -> bool:
    """Whether ``host`` looks like an IPv4 address (digits and dots) but is not one, as the
    resolver reads them (``inet_aton``: ``10.1`` and ``0`` are)."""
    if not _NUMERIC_HOST.fullmatch(host):
        return False
    try:
        _socket.inet_aton(host)
    except OSError:
        return True
    return False


def member_address_error(addr: Any) -> str:
    """Why ``addr`` cannot be a member's address, or "" when it can.

    Neighbours dial it, so it must be ``tcp://HOST:PORT`` with a port in 1..65535.
    libzmq's connect() refuses some junk (the caller then fails) and takes other
    junk (port 0, ``ipc://``) without complaint, then retries it for ever. HOST may be
    0.0.0.0, as in a bind address (the CLI checks those with it); for an address that
    others dial, :func:`dial_address_error` refuses that too.
    """
    m = _MEMBER_ADDR.fullmatch(addr) if isinstance(addr, str) else None
    if m is not None and 1 <= int(m.group(2)) <= 65535 and not _not_ipv4(m.group(1)):
        return ""
    # a join's addr is the sender's choice: a bounded repr, not a whole one cut afterwards
    return f"{shown(addr)} is not tcp://HOST:PORT with a port in 1..65535"


def dial_address_error(addr: Any) -> str:
    """Why other hosts cannot dial ``addr`` (a member's advertised address, a coordinator's),
    or "" when they can: :func:`member_address_error`'s form, and a HOST other than 0.0.0.0,
    which a bind listens on every interface with: dialled, it reaches only the dialler's
    own host (a swarm on one host works, across hosts every neighbour fails to link)."""
    if why := member_address_error(addr):
        return why
    if unspecified_host(addr.removeprefix("tcp://").rpartition(":")[0]):
        return f"{addr!r} is an address to listen on (every interface), not one to dial"
    return ""


def unresolved_hint(addrs: list[str]) -> str:
    """``"; HOST does not resolve to an IPv4 address ..."`` for the hosts among ``addrs``
    (``tcp://HOST:PORT``) that do not, else "". For an error message after nobody
    answered: libzmq retries a name it cannot resolve in silence, as it does a host
    that is down, and a name that resolves to IPv6 only is one too (sockets do not
    enable IPv6). Looks names up, so call it only once something failed."""
    bad = []
    for addr in addrs:
        m = _MEMBER_ADDR.fullmatch(addr) if isinstance(addr, str) else None
        if m is None:
            continue
        host = m.group(1)
        try:
            _socket.getaddrinfo(host, None, _socket.AF_INET)
        except (OSError, UnicodeError):
            bad.append(host)
    return f"; {_unresolved_words(bad)}" if bad else ""


def _unresolved_words(hosts: list[str]) -> str:
    return (f"{', '.join(hosts)} {'does' if len(hosts) == 1 else 'do'} not resolve to an IPv4 address "
            "(swarm connects over IPv4 only: check the name, or give the address)")


def handshake_refused(event: int, value: int) -> bool:
    """Whether a socket monitor's event ``event`` (with ``value``) says that what listens
    at the other end answered a ZMTP handshake and refused it: it refused the key, the
    mechanism or the protocol, or closed the connection in the handshake (``EPIPE``,
    ``ECONNRESET``): something there speaks ZeroMQ, with other keys. A handshake that
    timed out is no such answer (a frozen process, or one that is not ZeroMQ)."""
    if event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
        return True
    return event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value in (errno.EPIPE, errno.ECONNRESET)


def silent_hint(addr: str) -> str:
    """What a client says of ``addr`` where a connection was accepted and no handshake
    ended, nor was refused (:func:`handshake_refused`): for an error message after
    nobody answered."""
    return (f"a connection to {addr} was accepted but its handshake was never answered: the process there is "
            "frozen or overloaded, or is not a ZeroMQ program")


#: what a ZMTP 3 greeting starts with: its signature and major version (ZMTP 3.0, rfc 23)
_ZMTP_HELLO = b"\xff" + bytes(8) + b"\x7f" + b"\x03"
#: a ZMTP 3 greeting's length, and where its mechanism's name (NUL-padded) lies
_GREETING, _MECHANISM = 64, slice(12, 32)


async def zmtp_mechanism(addr: str, timeout: float) -> str:
    """The security mechanism (``"NULL"``, ``"CURVE"``) that the ZMTP endpoint at ``addr``
    (``tcp://HOST:PORT``) names in its greeting, or "" where none comes within ``timeout``
    (nothing there, not ZMTP 3, another address form).

    libzmq reports a mechanism mismatch only when its own side reads the other's greeting
    first; when the other side does, it closes, and this side sees a closed connection
    (on loopback most times). A libzmq endpoint sends its whole greeting once it has the
    other side's signature and major version, before any security handshake: this sends
    just those, reads the greeting and closes, which the other side takes for a handshake
    cut short."""
    m = _MEMBER_ADDR.fullmatch(addr) if isinstance(addr, str) else None
    port = int(m.group(2)) if m is not None else 0
    if not 1 <= port <= 65535:
        return ""
    host = m.group(1)
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, family=_socket.AF_INET)
            writer.write(_ZMTP_HELLO)
            greeting = await reader.readexactly(_GREETING)
    except (OSError, UnicodeError, asyncio.IncompleteReadError, TimeoutError):
        return ""
    finally:
        if writer is not None:
            writer.close()
    if greeting[0] != 0xFF or greeting[9] != 0x7F or greeting[10] < 3:
        return ""
    name = greeting[_MECHANISM].rstrip(b"\x00")
    return name.decode("ascii") if name.isalnum() and name.isascii() else ""


def advertised(endpoint: str) -> str:
    """The address other hosts should use for a bound endpoint.

    For a wildcard bind, the address the host name resolves to. Where that is a
    loopback address (Debian's /etc/hosts maps the host name to 127.0.1.1) other
    hosts cannot reach it; the endpoint is still advertised, for a swarm on one
    host, with a warning that says what to pass instead.
    """
    if endpoint.startswith("tcp://0.0.0.0:") or endpoint.startswith("tcp://*:"):
        port = endpoint.rsplit(":", 1)[1]
        try:
            host = _socket.gethostbyname(_socket.gethostname())
        except OSError:
            host = "127.0.0.1"
        if host.startswith("127."):
            log.warning("bound to %s, advertised as tcp://%s:%s: this host's name resolves to a loopback "
                        "address, which peers on other hosts cannot reach; for a swarm over several hosts "
                        "bind this host's own address (--bind \"tcp://IP:*\") or set peer.advertise",
                        endpoint, host, port)
        return f"tcp://{host}:{port}"
    return endpoint


def shadow(s: zmq.asyncio.Socket) -> zmq.Socket:
    """A plain socket over the same libzmq socket, for non-blocking calls.

    It holds only libzmq's pointer and cannot tell when ``s`` is closed: never use it
    after that (an error is not assured; the next socket made may get the address)."""
    return zmq.Socket.shadow(s.underlying)


_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
# pyzmq's enum constants cost an enum operation at each use
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
#: frames smaller than this are copied: a zero-copy frame costs more than a small memcpy
ZERO_COPY_MIN = 64 * 1024
#: frames of one received message kept by :func:`drain` (the wire's own limit is
#: ``Limits.max_frames + 1``, 65 by default; a ROUTER adds the sender's routing id)
KEEP_FRAMES = 1024


def keep_frames(limits: Limits) -> int:
    """What :func:`drain` keeps for a receiver of these limits: :data:`KEEP_FRAMES`, or
    every frame a message within larger ones has (its routing id included)."""
    return max(KEEP_FRAMES, limits.max_frames + 2)
#: entries of :attr:`BadInput.by_reason` at most: later reasons are counted under OTHER_REASONS
MAX_REASONS = 64
OTHER_REASONS = "(other reasons)"


def drain(s: zmq.Socket, keep: int = KEEP_FRAMES) -> Iterator[list[zmq.Frame]]:
    """Yield queued multipart messages without blocking, at most :data:`DRAIN_BATCH`.

    Frames are received without copying (``copy=False``): arrays decoded from
    them are views of ZeroMQ's own buffers. Of a message of more than ``keep``
    frames, the first ``keep + 1`` are yielded (too many for :func:`swarm.wire.decode`,
    which refuses it) and the rest read and dropped: ``MAXMSGSIZE`` bounds each frame
    and the high-water mark counts messages, so libzmq takes a message of millions
    of empty frames, and a list of them all cost ~200 bytes of Python objects per
    2 bytes on the wire.
    """
    recv, getsockopt = s.recv, s.getsockopt
    for n in range(DRAIN_BATCH):
        # after the first, ask whether another is queued: the zmq.Again that a receive on
        # an empty queue raises costs twice as much, and most drains find one message
        if n and not getsockopt(_EVENTS) & _POLLIN:
            return
        try:
            f = recv(_NOBLOCK, copy=False)
        except zmq.Again:
            return
        # a received Frame says whether more follow (pyzmq reads RCVMORE as it takes it):
        # asking the socket again cost more than the receive. (So does pyzmq's Cython
        # backend, CPython's; not the CFFI one of PyPy, which torch rules out anyway.)
        yield recv_rest(recv, f, keep) if f.more else [f]


def recv_rest(recv: Callable[..., Any], first: zmq.Frame, keep: int) -> list[zmq.Frame]:
    """``first`` and the frames that follow it in its message, taken with ``recv`` (a
    socket's, non-blocking and without copying): the first ``keep + 1`` of them, and the
    rest read and dropped (see :func:`drain`)."""
    frames, f = [first], first
    while f.more:
        f = recv(_NOBLOCK, copy=False)
        if len(frames) <= keep:
            frames.append(f)
    return frames


def _nbytes(f: Any) -> int:
    tp = type(f)
    if tp is bytes:
        return len(f)
    if tp is np.ndarray or tp is memoryview:   # as memoryview(f).nbytes, without making one
        return f.nbytes
    return len(f) if isinstance(f, bytes) else memoryview(f).nbytes


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Bytes of a message's frames as they go on the wire (what byte counters add up)."""
    return sum(map(_nbytes, frames))


def shared(frames: Sequence[Any]) -> list[Any]:
    """``frames`` as :class:`zmq.Frame` objects, for a message sent many times (a view to
    every member): each send of a Frame adds a reference to its one buffer where a send of
    bytes copies them, so a message queued for N routes is held once, not N times."""
    return [f if isinstance(f, zmq.Frame) else zmq.Frame(f, copy=True) for f in frames]


def try_send(s: zmq.Socket, frames: list[Any]) -> bool:
    """Non-blocking multipart send; False when the queue is full or the route is gone.

    ZeroMQ queues a multipart message atomically: if the first frame is
    accepted, the rest are too, so a full queue never leaves half a message.
    A :class:`zmq.Frame` is never copied (see :func:`shared`).
    """
    send = s.send
    try:
        last = len(frames) - 1
        for i, f in enumerate(frames):
            big = not isinstance(f, bytes) and _nbytes(f) >= ZERO_COPY_MIN
            send(f, _NOBLOCK if i == last else _MORE, copy=not big)
        return True
    except zmq.Again:
        return False
    except zmq.ZMQError as e:
        if e.errno in (zmq.EHOSTUNREACH, zmq.ENOTSOCK, zmq.ETERM):
            return False
        raise TransportError(f"send failed: {e.strerror}") from None


#: seconds between two warnings about malformed messages from the same sender
BAD_INPUT_LOG_S = 10.0
#: warnings about malformed messages per :data:`BAD_INPUT_LOG_S` at most, all senders
#: together: a sender names itself (a new connection, a src it writes) for free
BAD_INPUT_LINES = 4


class BadInput:
    """Counts malformed messages and logs them at most once per sender per
    :data:`BAD_INPUT_LOG_S`, and at most :data:`BAD_INPUT_LINES` times in all in that time.

    The sender is its address (``Peer-Address``, see :func:`peer_address`) where the
    caller has the frame, else ``source``: a ROUTER's routing id is new on each
    connection and a src is what the sender writes, so neither alone bounds the log.

    ``by_reason`` counts them by the start of their error message, which often holds
    what was sent (a type name, a size): it holds at most :data:`MAX_REASONS`
    entries, the reasons seen first and :data:`OTHER_REASONS` for the rest, so that
    a sender of junk that varies cannot grow it without bound.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self.by_reason: dict[str, int] = {}
        self._last: dict[Any, float] = {}   # sender -> when it was last logged (within the time)
        self._unlogged = 0                  # counted and not logged since the last line

    def __call__(self, source: Any, err: Exception, addr: str | None = None) -> None:
        self.count += 1
        text = str(err)
        reason = printable(text.split(":", 1)[0][:60])[:60]   # shown in status, as the log line is
        if reason not in self.by_reason and len(self.by_reason) >= MAX_REASONS - 1:
            reason = OTHER_REASONS
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        now = time.monotonic()
        sender = addr or source
        if now - self._last.get(sender, -1e9) < BAD_INPUT_LOG_S:
            self._unlogged += 1
            return
        # bounded memory and lines under a flood of senders: BAD_INPUT_LINES entries at most
        self._last = {s: t for s, t in self._last.items() if now - t < BAD_INPUT_LOG_S}
        if len(self._last) >= BAD_INPUT_LINES:
            self._unlogged += 1
            return
        self._last[sender] = now
        # Cut: a handler's WireError may quote what was sent, at any length. Escaped
        # as `swarm status` shows it: it may quote a sender's id, which may hold a line
        # break, and so forge whole lines in the log. A sender's id so too; a route
        # (bytes) keeps its b'...' form, and is left to DEBUG where the address is known.
        name = printable(sender) if isinstance(sender, str) else repr(sender)
        unlogged = f", {self._unlogged} not logged since the last line" if self._unlogged else ""
        log.warning("%s: dropped malformed message from %s: %s (%d dropped so far%s)",
                    self.where, name, printable(text[:300]), self.count, unlogged)
        if addr:
            log.debug("%s: (the message from %s came on the connection with routing id %r)",
                      self.where, name, source)
        self._unlogged = 0


def decode_routed(frames: list[zmq.Frame], limits: Limits) -> tuple[bytes, Message]:
    """Split a ROUTER message into (routing id, decoded message)."""
    if len(frames) < 2:
        raise WireError("ROUTER message without payload")
    route = frames[0].bytes
    return route, decode(frames[1:], limits)


def peer_address(frame: zmq.Frame) -> str | None:
    """The IP address of the host a frame came from (libzmq's ``Peer-Address``; None
    over ipc or inproc, or when unknown)."""
    try:
        return frame.get("Peer-Address") or None
    except (zmq.ZMQError, AttributeError):
        return None


def srcfd(frame: zmq.Frame) -> int:
    """The file descriptor of the TCP connection a frame arrived on (-1 if unknown)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (zmq.ZMQError, AttributeError, TypeError):
        return -1


#: a key pair's name: a plain file name (no separators, no "..", no leading "-" or ".",
#: which would make a hidden file or an option)
_KEY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
#: a CurveZMQ key as key files hold it: 32 bytes in Z85, 40 characters
_Z85_KEY = re.compile(rb"[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}")
#: seconds between two warnings about the same file in ``authorized/`` (or the folder)
KEYS_WARNING_S = 60.0


def _key_name_error(name: Any) -> str:
    """Why ``name`` cannot name a key pair, or "" when it can."""
    if isinstance(name, str) and _KEY_NAME.fullmatch(name):
        return ""
    return (f"bad key name {name!r}: use letters, digits, '_', '-' and '.' (not first), at most "
            "100 characters")


def _z85_key(value: bytes | None) -> bool:
    """Whether ``value`` is a CurveZMQ key in Z85 (libzmq refuses anything else with a
    bare "Invalid argument" when it is set on a socket)."""
    if value is None or not _Z85_KEY.fullmatch(value):
        return False
    from zmq.utils import z85

    try:
        return len(z85.decode(value)) == 32
    except (ValueError, KeyError, struct.error):   # a group of 5 characters above 2**32
        return False


def _load_key(path: Path, *, secret: bool = False) -> tuple[bytes, bytes | None]:
    """The public key (and with ``secret`` the secret one) of a key file, each checked to
    be 40 Z85 characters; a :class:`ConfigError` naming the file otherwise."""
    import zmq.auth

    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except OSError as e:
        raise ConfigError(f"keys: cannot read {path}: {e.strerror or e}") from None
    except (ValueError, IndexError):   # no public-key line; a key line without "="
        raise ConfigError(f"keys: {path} is not a key file (no public-key = \"...\" line; empty?)") from None
    redo = "; copy it again, or make a new pair with `swarm keys generate`"
    if not _z85_key(public):
        raise ConfigError(f"keys: {path}: its public-key is not 40 Z85 characters (the file is cut "
                          f"short or edited){redo}")
    if secret:
        if secret_key is None:
            raise ConfigError(f"keys: {path} holds no secret key (a public NAME.key in its place?)")
        if not _z85_key(secret_key):
            raise ConfigError(f"keys: {path}: its secret-key is not 40 Z85 characters (the file is cut "
                              f"short or edited){redo}")
    return public, secret_key


class Curve:
    """CurveZMQ keys of one process, and the allow-list of clients it admits.

    A key folder made by ``swarm keys generate DIR`` holds ``NAME.key`` (public)
    and ``NAME.key_secret`` pairs, ``coordinator.key`` among them, and an
    ``authorized/`` folder of the public keys allowed to connect. Servers
    (every ROUTER) check clients against it through a ZAP handler; clients
    (every DEALER) must know the server's public key: peers learn each other's
    from the view, the coordinator's from ``coordinator.key``.

    Every key is checked when the folder is loaded: a file cut short is a
    :class:`ConfigError` naming it, not libzmq's "Invalid argument" later. One
    zmq context checks keys for one Curve: give each keyed coordinator or peer of a
    process its own context.
    """

    def __init__(self, keys_dir: str, name: str) -> None:
        base = Path(keys_dir)
        why = _key_name_error(name)
        if why:   # "../x" read a secret from outside the folder; "" named ".key_secret"
            raise ConfigError(f"keys: {why}; give the NAME of a NAME.key_secret in {base}")
        secret = base / f"{name}.key_secret"
        coord = base / "coordinator.key"
        self.name = name
        self.public_file = base / f"{name}.key"
        self.authorized = base / "authorized"
        if base.exists() and not base.is_dir():
            raise ConfigError(f"keys: {base} is not a folder; give the folder `swarm keys generate` made")
        for p in (secret, coord, self.authorized):
            if not p.exists():
                how = (f"swarm keys generate {base} --names {name}" if base.is_dir() and p == secret
                       else f"swarm keys generate {base}")
                raise ConfigError(f"keys: {p} does not exist; create keys with `{how}`")
        if not self.authorized.is_dir():   # else it admitted nobody, in silence
            raise ConfigError(f"keys: {self.authorized} is not a folder; it must be the folder of the "
                              "public keys allowed to connect (`swarm keys generate` makes it)")
        self.public, self.secret = _load_key(secret, secret=True)
        self.coordinator_public = _load_key(coord)[0]
        mode = secret.stat().st_mode & 0o077
        if mode:   # ssh refuses such a key; a running swarm is not stopped for it, but told
            log.warning("keys: %s is readable or writable by others (mode %o); anyone who can read "
                        "it can join as %s: chmod 600 it", secret, secret.stat().st_mode & 0o777, name)
        self._allowed = _AuthorizedKeys(self.authorized)
        try:
            self._allowed.refresh()
        except OSError as e:
            raise ConfigError(f"keys: cannot read {self.authorized}: {e.strerror or e}") from None
        _warn_writable([base, self.authorized, coord, *self._allowed.files()])
        n = len(self._allowed.keys)
        if n:
            log.info("keys: %s from %s; %d public key%s admitted from %s", name, base, n,
                     "" if n == 1 else "s", self.authorized)
        else:
            log.warning("keys: %s lists no usable public key: no client can connect to this process's "
                        "sockets until one is copied in", self.authorized)
        self._auth: Any = None

    def start(self, ctx: zmq.Context) -> None:
        """Start the ZAP handler (a thread) that checks clients on ``ctx``'s servers."""
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(zmq.Context.shadow(ctx.underlying))
        try:
            auth.start()
        except Exception as e:
            _close_authenticator(auth)
            if isinstance(e, zmq.ZMQError) and e.errno == zmq.EADDRINUSE:
                # one ZAP handler per context (inproc://zeromq.zap.01), and each Curve may have
                # another authorized/: a shared handler would admit the other one's keys
                raise ConfigError("keys: another keyed coordinator or peer already checks keys on this "
                                  "zmq context; give each keyed one its own context (leave context= "
                                  "out)") from None
            why = e.strerror if isinstance(e, zmq.ZMQError) else f"{type(e).__name__}: {e}"
            raise TransportError(f"keys: cannot start the key check: {why}") from None
        self._auth = auth
        auth.configure_curve_callback(domain="*", credentials_provider=self._allowed)

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def server(self, s: zmq.Socket) -> None:
        s.curve_secretkey = self.secret
        s.curve_publickey = self.public
        s.curve_server = True

    def client(self, s: zmq.Socket, server_public: bytes | str) -> None:
        s.curve_secretkey = self.secret
        s.curve_publickey = self.public
        s.curve_serverkey = server_public.encode() if isinstance(server_public, str) else server_public


def _close_authenticator(auth: Any) -> None:
    """Close the sockets of a ThreadAuthenticator whose start() failed part way (its ZAP
    socket bound, its thread not started: at the thread limit, or not up within 10 s):
    left open, they held the context's term(), and so the owner's close, for ever. Not
    ``auth.stop()``: it sends to the thread, which may not run, and joins it."""
    thread = getattr(auth, "thread", None)
    for s in (getattr(thread, "pipe", None), auth.pipe, auth.zap_socket):
        if s is not None:
            s.close(0)
    auth.pipe = auth.zap_socket = None   # else its __del__ runs stop(), on closed sockets


def _warn_writable(paths: list[Path]) -> None:
    """Warn about key files and folders others than their owner may write: whoever can add
    a file to ``authorized/`` (read again while the swarm runs) or swap ``coordinator.key``
    is admitted, or poses as the coordinator."""
    loose = []
    for p in paths:
        try:
            mode = p.stat().st_mode
        except OSError:
            continue
        if mode & 0o022:
            loose.append(f"{p} (mode {mode & 0o777:o})")
    if loose:
        log.warning("keys: writable by others than their owner: %s; anyone who can write there can add "
                    "a key to authorized/ and be admitted (or swap coordinator.key): chmod go-w them",
                    ", ".join(loose))


class _AuthorizedKeys:
    """The public keys in an ``authorized/`` folder, for the ZAP handler.

    Read again whenever the folder or one of its ``*.key`` files changes, at the
    next connection: a key copied in admits its host without restarting the swarm,
    and a key removed admits no new connection (one already open stays until it
    closes). Each file counts on its own: one that cannot be read (empty, cut short,
    not a key) is skipped with a warning naming it, at most one per file per
    :data:`KEYS_WARNING_S`, and the others count.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.keys: set[bytes] = set()
        self._stamp: Any = None
        self._warned: dict[str, float] = {}    # file name ("" for the folder) -> when last warned

    def files(self) -> list[Path]:
        """The ``*.key`` files found at the last read."""
        return [self.folder / name for name, *_ in self._stamp[1]] if self._stamp else []

    def _now_stamp(self) -> Any:
        entries = []
        with os.scandir(self.folder) as it:
            for e in it:
                if e.name.endswith(".key") and not e.name.startswith("."):   # as pyzmq's glob
                    try:
                        st = e.stat()
                        entries.append((e.name, st.st_mtime_ns, st.st_size))
                    except OSError:
                        entries.append((e.name, -1, -1))
        # the files' sizes and times too: a key copied in is an empty file for a moment,
        # and its content changes neither the folder nor the names
        return self.folder.stat().st_mtime_ns, tuple(sorted(entries))

    def refresh(self) -> None:
        """Read the folder again if it changed (OSError if it cannot be listed)."""
        stamp = self._now_stamp()
        if stamp == self._stamp:
            return
        keys = set()
        for name, *_ in stamp[1]:
            try:
                keys.add(_load_key(self.folder / name)[0])
            except ConfigError as e:
                self._warn(name, "%s; skipping it (the other keys in %s count)", e, self.folder)
        self.keys, self._stamp = keys, stamp

    def _warn(self, what: str, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._warned.get(what, -math.inf) >= KEYS_WARNING_S:
            if len(self._warned) > 4096:   # bounded under a folder that fills with junk
                self._warned.clear()
            self._warned[what] = now
            log.warning(fmt, *args)

    def callback(self, domain: str, key: bytes) -> bool:
        try:
            self.refresh()
        except OSError as e:   # a folder being replaced: keep what was read last
            self._warn("", "keys: cannot read %s (%s); admitting the keys read before", self.folder,
                       e.strerror or e)
        return key in self.keys


def generate_keys(keys_dir: str, names: list[str]) -> list[Path]:
    """Create key pairs ``NAME.key``/``NAME.key_secret`` and authorize their public keys.

    ``keys_dir`` may be new, or an existing key folder to add new names to; an
    existing key is never overwritten. Every name and path is checked before
    anything is written, and a failure while writing removes what this call
    wrote, so an error leaves the folder as it was. Returns the public key files.

        generate_keys("keys", ["coordinator", "peer"])   # keys/peer.key, keys/authorized/peer.key, ...
    """
    import shutil

    import zmq.auth

    base = Path(keys_dir)
    auth = base / "authorized"
    if not names:
        raise ConfigError("keys: no key names given")
    for name in names:
        why = _key_name_error(name)
        if why:
            raise ConfigError(f"keys: {why}")
        if names.count(name) > 1:
            raise ConfigError(f"keys: key name {name!r} given more than once")
    try:
        nearest = next(p for p in (auth, base, *base.parents) if p.exists())
    except OSError as e:   # exists() raises for a folder this user may not enter, or a name too long
        raise ConfigError(f"keys: {e.filename}: {e.strerror}; give a key folder this user may create "
                          "or write to") from None
    if not nearest.is_dir():
        raise ConfigError(f"keys: {nearest} is not a folder; give a new or existing key folder")
    for name in names:
        for p in (base / f"{name}.key", base / f"{name}.key_secret", auth / f"{name}.key"):
            if os.path.lexists(p):    # a dangling link too: writing would follow it
                raise ConfigError(f"keys: {p} exists; refusing to overwrite a key; to add key pairs "
                                  "to this folder, give only new names")

    new_dirs = [p for p in (*reversed(base.parents), base, auth) if not p.exists()]
    written: list[Path] = []
    made = []
    try:
        # Modes given, not left to the umask (at most what it allows): under umask 000 or
        # 002 the folders and public keys came out writable by others, and whoever can
        # add a file to authorized/ (read again while the swarm runs) is admitted.
        for d in new_dirs:
            d.mkdir(mode=0o755, exist_ok=True)
        for name in names:
            public, secret, authorized = base / f"{name}.key", base / f"{name}.key_secret", auth / f"{name}.key"
            written += [public, secret, authorized]     # listed first: a half-written pair goes too
            # made before pyzmq writes the keys into them (it opens with "w", which keeps
            # the mode), so the secret is never readable by others
            os.close(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.close(os.open(public, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            zmq.auth.create_certificates(str(base), name)
            secret.chmod(0o600)
            shutil.copy(public, authorized)    # with public's mode
            made.append(public)
    except OSError as e:
        for p in written:
            p.unlink(missing_ok=True)
        for d in reversed(new_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        raise ConfigError(f"keys: cannot write keys in {base}: {e.strerror or e}") from None
    return made


def user_id(frame: zmq.Frame) -> str:
    """The CURVE public key (Z85) a frame's sender authenticated with, or ''."""
    try:
        return frame.get("User-Id") or ""
    except (zmq.ZMQError, AttributeError):
        return ""


class KeyCheck(enum.Enum):
    """What a keyed peer's view says of a message's sender (``Peer.key_check``)."""

    OK = "ok"                  # listed with the key the message came with (or no keys)
    UNLISTED = "unlisted"      # not listed: nothing to check its key against
    OTHER_KEY = "other key"    # listed with another key: a forgery
