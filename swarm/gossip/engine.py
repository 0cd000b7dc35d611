"""The gossip engine: CHOCO-style compressed deltas over a :class:`~swarm.link.Link`.

One round for peer i, with senders N(i) and mixing weights w (see
:mod:`swarm.gossip.topology`)::

    q_i   = C(x_i − x̂_i)           # compressed delta: the only thing sent
    x̂_i  += q_i ;  x̂_j += q_j      # public copies, identical on both ends
    x_i  += γ · Σ_j w_ij (x̂_j − x̂_i)

With the identity codec and γ = 1 this is exact gossip ``x ← W x``; for every
codec the sum over peers is unchanged by a lockstep round that leaves nobody
out (each pair's terms cancel because both ends hold the same copies); a pair
mixed at one end only (a timeout, a late neighbour) moves it.

Streams and copies
    On static topologies a peer has one outgoing stream (one x̂_i, broadcast to
    all its receivers). On time-varying ones (one-peer exponential, random
    pairing) it keeps one stream per receiver, because a receiver that is not
    heard from every round cannot follow a broadcast copy. Each stream carries a
    version; a receiver holds one copy per sender with that version, for its
    most recently heard-from senders only (:meth:`Gossip._drop_unused_copies`).

    Every stream starts from x itself (x̂ = x), new or restarted (forgotten, its
    receiver back in the view, after bootstrap()), and its versions start above
    every version the engine has sent, so none is one the receiver still holds
    from before. A receiver that is new to a stream, whose send failed, or that
    reports a gap (``gsp_nack``) is sent the *full* public copy (dense float32)
    instead of a delta, so nobody ever applies a delta to a copy it never had: a
    stream's first message to each receiver is a full state.

    With the identity codec x̂ becomes x exactly each round, so every message is
    the full state (a snapshot of x: the same bytes as the delta) and receivers
    keep the received buffer as their copy.

Messages (registered with :func:`swarm.wire.register_type`)
    ``gsp_delta``  body ``{r, ver, meta, g}``, arrays = the codec's frames; ``g``: the
                   sender's γ (a receiver with another warns once, see _on_message)
    ``gsp_full``   body ``{r, ver}``, arrays = ``[x̂ float32[d]]`` (every identity message)
    ``gsp_nack``   body ``{ver, d}``: "my copy of you is not at ``ver − 1``; send it full;
                   I gossip ``d`` values" (a ``d`` other than the sender's: "send me nothing")
    ``gsp_boot_req`` body ``{lo, hi, nonce}``: "send me x[lo:hi]" (:meth:`Gossip.bootstrap`)
    ``gsp_boot_ok`` body ``{nonce}``: "I took that request; its slice follows"
    ``gsp_boot``   body ``{lo, hi, nonce, r}``, arrays = ``[x[lo:hi] float32]``

Sync modes
    ``lockstep`` waits (up to ``round_timeout``) for every sender's round-t
    message; ``bounded`` waits only for senders more than ``max_staleness``
    rounds behind; ``async`` never waits and uses whatever has arrived. Messages
    from a sender's *future* rounds are held back in lockstep and bounded so
    both ends mix the same copies. A sender waited for until the deadline in
    vain is not waited for again until a message from it arrives, nor is one
    that has sent a later round (messages arrive in order). On a static
    graph, a peer that gets a message from more than ``max_staleness`` rounds
    ahead (lockstep: any) was left behind, and takes that round less
    ``max_staleness`` (see :meth:`Gossip.round`). Until it has first averaged, a
    peer takes the round of a later message (a joiner): any, except on a
    time-varying graph in lockstep and bounded, where only one that its sender
    could not have reached without somebody giving up waiting for this peer
    (:meth:`Gossip._left_behind`), not one a neighbour is ahead by the graph alone.
    No round above ``_MAX_ROUND`` is ever taken (joining, catching up, bootstrap);
    messages may carry rounds up to ``_MAX_WIRE_ROUND``, the headroom of a peer
    that took one at the bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .. import wire
from ..checks import rng_seed
from ..compress import CODECS
from ..errors import ConfigError, GossipError
from ..link import Link, View, link_closed, link_problem
from ..wire import Message, shown
from . import topology as topo
from ._codecs import DIVERGES_ABOVE, Encoded, copy_scale, make_codec, suggested_gamma

__all__ = ["Gossip", "RoundResult", "GossipStats", "SYNC_MODES", "MODES"]

log = logging.getLogger(__name__)

T_DELTA = wire.register_type("gsp_delta")
T_FULL = wire.register_type("gsp_full")
T_NACK = wire.register_type("gsp_nack")
T_BOOT_REQ = wire.register_type("gsp_boot_req")
T_BOOT_OK = wire.register_type("gsp_boot_ok")
T_BOOT = wire.register_type("gsp_boot")

SYNC_MODES = ("lockstep", "bounded", "async")
#: seconds a bootstrap waits before asking the next donor when a send was refused at once
BOOT_RETRY_S = 0.05
#: bootstrap slices a donor sends to one asker at once (a bootstrap asks up to its
#: ``donors`` slices, a few of one donor after a failure); more are dropped, counted
MAX_BOOT_SERVING = 4
#: a donor that took a bootstrap request is given this many times as long as the slices
#: that arrived say the missing ones need, before the next donor is asked (see _Arrivals)
BOOT_SLACK = 2.0
#: seconds a bootstrap waits for a donor to take its request (``gsp_boot_ok``) before
#: asking the next one (at most half the time left). The request and the ack are two small
#: messages, one round trip (0.4 s across a 400 ms RTT), the ack sent ahead of the slice;
#: a donor that has not answered by then dropped the request (see _on_boot_req)
BOOT_ACK_S = 1.0
MODES = ("params", "pseudo_gradient")
#: seconds a round waits on arrivals at a time, to see its peer close meanwhile (a
#: Peer's close sets no event of the engine's), as ``Peer.wait_linked`` looks at its own
_LOOK_S = 0.05

# Random pairing meets many partners over time; past this many per-receiver
# streams the least recently used is forgotten (its next meeting starts full).
# The one-peer exponential graph keeps its τ = ceil(log2 n) receivers' streams.
_MAX_EDGE_STREAMS = 8

# Receivers keep the copies of this many times as many senders as a sender keeps
# streams (see Gossip._drop_unused_copies), the most recently heard from. A copy is
# of use only while its sender keeps a stream to us; twice as many keeps a dropped
# copy rare, and a dropped one costs one nack and one full state. Unbounded, random
# pairing held n − 1 copies a peer (1 GB at 256 peers and d = 1e6), and a ring filled
# one join at a time left rank 0 a copy of every peer that was once its neighbour.
_IN_COPIES_PER_STREAM = 2

# Messages held per sender until a round applies them, past max_staleness. A peer
# normally holds one or two (async: one per round the sender ran since ours); one
# that runs no round for a while (an evaluation, a checkpoint) held every message
# of every neighbour meanwhile: 300 MB after 400 of its neighbours' rounds at d = 1e5.
# Past this the oldest is applied (async) or dropped, as if lost, keeping a full state
# that later deltas build on (see Gossip._overflow).
_MAX_PENDING = 32

# The largest round number a peer takes from a neighbour (joining, catching up,
# bootstrap()). Honest round numbers count rounds: a peer starts at 0 and moves one a
# round, or to a round that some neighbour has run, so none comes near 2**53 (at a
# million rounds a second, 285 years). No bound relative to this peer's own round is
# safe: a peer frozen for an hour, or a restarted one at round 0, rightly jumps any
# number of rounds.
_MAX_ROUND = 2**53
# The largest round number a message may carry: past it (or below 0) the message is
# forged or corrupt, and is refused as malformed before its round is seen (a single
# r = 2**64 − 1 was adopted, and every later round of that peer raised WireError: r + 1
# does not fit the wire's 64 bits). Far above _MAX_ROUND, so that a peer that took a
# round at _MAX_ROUND (a forged one) still counts on from it, and its neighbours with it:
# with one bound for both, a single r = 2**53 was taken, spread hop by hop, and from then
# on every message carried 2**53 + 1, which every receiver refused; the swarm never
# averaged again.
_MAX_WIRE_ROUND = 2**62
# Limits that refuse nothing, to measure a message rather than check it (see _most_bytes)
_UNLIMITED = wire.Limits(max_message_bytes=2**62, max_header_bytes=2**62)


@dataclass
class RoundResult:
    """What one gossip round did.

    ``ok`` is true only if the peer actually averaged with somebody; a round
    with no participants (alone in the view, everyone timed out, a mix or outer
    step that overflowed float32 and was left out) is reported with ``ok = False`` and
    ``reason``. ``participants`` were mixed, ``missing`` left out; ``staleness``
    is this round less the round of each participant's state. ``sent``,
    ``full_sent``, ``bytes_out`` and ``dropped`` (sends refused) are this round's;
    ``bytes_in`` and ``rejected`` count what arrived since the previous round
    ended, so their sums over rounds match :class:`GossipStats`.
    """

    round: int
    participants: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    staleness: dict[str, int] = field(default_factory=dict)
    bytes_out: int = 0
    bytes_in: int = 0
    sent: int = 0
    full_sent: int = 0
    dropped: int = 0
    rejected: int = 0
    waited_s: float = 0.0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.participants)


@dataclass
class GossipStats:
    """Counters over the engine's life (rejections never change state)."""

    rounds: int = 0
    rounds_alone: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    dropped_sends: int = 0
    rejected_nonfinite: int = 0
    rejected_size: int = 0      # wrong-size states and deltas; bootstrap requests no message could answer
    rejected_malformed: int = 0
    out_of_sync: int = 0
    nacks_sent: int = 0
    nacks_stale: int = 0        # nacks of a gap that a full state sent since fills: no full state more
    full_sent: int = 0
    ignored_strangers: int = 0
    boot_served: int = 0        # parameter slices sent to bootstrapping neighbours
    boot_busy: int = 0          # bootstrap requests dropped: MAX_BOOT_SERVING to that asker under way
    backlog_dropped: int = 0    # held messages dropped past a sender's _MAX_PENDING (lockstep, bounded; see _overflow)
    mix_overflows: int = 0      # mixes left out: their float32 sum or outer step was not finite (x unchanged; in rounds_alone)


# Elements per block of the blockwise passes below: two float32 blocks stay in L2.
_BLOCK = 1 << 16


def _finite(a: np.ndarray) -> bool:
    """True if ``a`` has no NaN/Inf. (``np.isfinite(a).all()`` measured faster
    here than a finite-sum shortcut: numpy's pairwise float32 sum runs at half
    the speed of the vectorised isfinite.) Large arrays are checked a block at a
    time into one small mask: a full-size bool temporary is d/4 bytes of fresh
    memory per check, and fresh pages cost more here than the check itself.
    float16 is checked on its exponent bits (all ones: Inf or NaN): numpy's
    float16 isfinite is a scalar loop, 6x slower (18 ms against 3 ms at 10M)."""
    if a.dtype.kind != "f":
        return True
    a = a.reshape(-1)
    half = a.dtype == np.float16
    if half:
        a = a.view(np.uint16)
    if a.size <= _BLOCK:
        return bool((a & 0x7C00 != 0x7C00).all()) if half else bool(np.isfinite(a).all())
    mask = np.empty(_BLOCK, np.bool_)
    bits = np.empty(_BLOCK, np.uint16) if half else None
    for lo in range(0, a.size, _BLOCK):
        blk = a[lo:lo + _BLOCK]
        m = mask[:blk.size]
        if half:
            e = np.bitwise_and(blk, 0x7C00, out=bits[:blk.size])
            np.not_equal(e, 0x7C00, out=m)
        else:
            np.isfinite(blk, out=m)
        if not m.all():
            return False
    return True


def _fill_finite(out: np.ndarray, x: np.ndarray, minus: np.ndarray | None = None) -> bool:
    """``out[:] = x`` (``x − minus`` if given) a block at a time, and whether ``out``
    came out all finite. Each block is checked while it is still in cache, so the
    check makes no pass over memory of its own: x − x̂ at d = 1e6 took 0.90 ms
    unchecked, 0.94 ms checked so, and 1.39 ms after a separate check of x."""
    mask = np.empty(min(out.size, _BLOCK), np.bool_)
    finite = True
    for lo in range(0, out.size, _BLOCK):
        o = out[lo:lo + _BLOCK]
        if minus is None:
            np.copyto(o, x[lo:lo + _BLOCK])
        else:
            np.subtract(x[lo:lo + _BLOCK], minus[lo:lo + _BLOCK], out=o)
        if finite:
            finite = bool(np.isfinite(o, out=mask[:o.size]).all())
    return finite


def _round_number(v: Any) -> bool:
    """Whether ``v`` can be a round number a peer sent (see ``_MAX_WIRE_ROUND``)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_WIRE_ROUND


def _most_bytes(src: str, t: str, body: dict[str, Any], values: np.ndarray) -> int:
    """Bytes on the wire, at most, of a message from ``src`` that carries ``values``: the
    epoch and seq that the link sets are taken at their largest (9 bytes each)."""
    head = wire.encode(t, src, epoch=2**64 - 1, seq=2**64 - 1, body=body, arrays=[values], limits=_UNLIMITED)[0]
    return len(head) + values.nbytes


def _real(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (not a bool: ``True`` is no setting)."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and math.isfinite(v)


def _number(name: str, v: Any, kind: type = numbers.Real) -> None:
    """Refuse a setting ``v`` that is not a ``kind`` (numbers.Real or numbers.Integral) by
    its type: numpy scalars (a sweep's np.linspace) are numbers, a bool is no setting."""
    if isinstance(v, bool) or not isinstance(v, kind):
        what = "an integer" if kind is numbers.Integral else "a number"
        raise ConfigError(f"{name} must be {what}, got {type(v).__name__} {v!r}")


def _link_topology(link: Link) -> tuple[str, Any, int] | None:
    """The graph ``link.neighbours()`` follows, as ``(topology, edges, seed)``: a Peer's
    ``config.topology`` and ``config.edges`` with seed 0 (what a Peer draws its neighbours
    with), a SimLink's hub's; None for a link that names none (a link of the user's own)."""
    # Read by attribute, so that the Link protocol asks nothing more of a link; the hub
    # is private to SimLink, a module of this package.
    owner = getattr(link, "config", None) or getattr(link, "_hub", None)
    topology = getattr(owner, "topology", None)
    if not isinstance(topology, str) or topology not in topo.TOPOLOGIES:
        return None
    edges = getattr(owner, "edges", None) if topology == "custom" else None
    return topology, edges, getattr(owner, "seed", 0)


def _graph(topology: str, edges: Any) -> tuple[str, frozenset[frozenset[int]] | None]:
    """What two topology settings are compared by: the name, and a custom graph's
    undirected edges in any order. (The seed is not: it draws random pairings only,
    which change every round anyway.)"""
    return topology, frozenset(frozenset(map(int, e)) for e in edges or ()) if topology == "custom" else None


def _decoder(family: Any) -> Any | None:
    """A codec that decodes the deltas of ``family`` (a delta's ``meta["codec"]``), or None
    where no built-in family has that name. Every parameter a decoder needs is in the meta
    (docs/compress.md), so any instance of the family does: one made with ratio 1 decodes
    a sender's top-1%, and an ``ef+`` sender's payloads are its inner family's."""
    if not isinstance(family, str) or family not in CODECS:
        return None
    return make_codec(f"{family}:1" if family in ("topk", "randomk") else family)


def _give_back(free: list[np.ndarray], buf: np.ndarray, keep: int = 2) -> None:
    if len(free) < keep:
        free.append(buf)


def _written_zeros(d: int) -> np.ndarray:
    """float32 zeros with every page written now instead of at first use (see
    :meth:`Gossip._snapshot`)."""
    a = np.empty(d, np.float32)
    a.fill(0.0)
    return a


class _OutStream:
    """One public copy x̂ of our own vector, and who holds it at which version."""

    def __init__(self, d: int, codec: Any, shared: list[np.ndarray] | None = None):
        self.hat = np.zeros(d, np.float32)   # x once started, or the identity snapshot (see Gossip.round)
        self.ver = 0
        self.codec = codec
        self.synced: set[str] = set()
        # receiver -> the version of the last full state sent to it: a nack of an earlier
        # version is for a gap that full state fills (see Gossip._on_nack)
        self.full_at: dict[str, int] = {}
        self.sending: str | None = None   # the receiver a send of this stream is waiting on
        self.nacked = False               # and whether it nacked meanwhile
        self._shared = [] if shared is None else shared

    def delta(self, x: np.ndarray) -> tuple[np.ndarray, bool]:
        """``x − x̂``, and whether it is all finite. In one buffer shared by the
        engine's streams and reused every round (fresh 400 kB arrays cost more in
        page faults than the subtraction itself: 245 µs vs 51 µs at d = 1e5). The
        codec's frames are new arrays, so the buffer is free again once encoded.
        (Identity, whose frames would alias it, sends state and never comes here;
        the engine refuses other aliasing codecs, since a zero-copy transport may
        still be sending such a frame when the next round rewrites it.)"""
        if not self._shared:
            self._shared.append(np.empty_like(self.hat))
        out = self._shared[0]
        return out, _fill_finite(out, x, self.hat)


class _InCopy:
    """Our copy of a sender's public stream, and its messages not yet applied."""

    def __init__(self, d: int):
        self.hat = np.zeros(d, np.float32)
        self.ver = -1          # -1: never had a full state, so deltas cannot apply
        self.round = -1        # round of the last message applied
        # decoders by codec family, each made on its first delta: a delta is decoded by
        # the family its meta names, which a neighbour with another codec than this
        # engine's sends (see _decoder)
        self.codecs: dict[str, Any] = {}
        self.pending: deque[Message] = deque()
        self.gap: int | None = None   # a version found missing outside a round (see _overflow): the next drain nacks it


class _Arrivals:
    """The slices a bootstrap has received so far: what says when the others are late.

    A slice is one message, seen only once whole, so a donor whose reply a slow link is
    still carrying looks silent. The slices that did arrive show how fast the link
    carries them; until the missing ones should have followed at that rate, they may
    be on their way, and asking other donors for them only queues copies behind them
    (a 4 MB model over 5 Mbit/s drew 26 MB so)."""

    def __init__(self, total: int) -> None:
        self.total, self.got = total, 0
        self.start = self.last = time.monotonic()
        self.news: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(self, nbytes: int) -> None:
        self.got += nbytes
        self.last = time.monotonic()
        self.news.set_result(None)   # wakes the slices still waiting: their due time moved
        self.news = asyncio.get_running_loop().create_future()

    def due(self) -> float:
        """When the missing bytes should be in at the rate the others came, ``BOOT_SLACK``
        times over; never while nothing has come (a slow link and silent donors look alike)."""
        if not self.got:
            return math.inf
        return self.last + BOOT_SLACK * (self.last - self.start) * (self.total - self.got) / self.got


class Gossip:
    """Gossip averaging of one float32 vector with the neighbours a link provides.

    >>> g = Gossip(peer, x, codec="identity", gamma=1.0)   # over the peer's own topology
    >>> result = await g.round()          # one round; x is updated in place
    >>> g.close()                         # its handlers off the link (see close)

    Parameters
    ----------
    link: the transport (a :class:`swarm.peer.Peer` or a :class:`swarm.gossip.sim.SimLink`).
    params: a 1-D contiguous float32 array, updated in place (see
        :func:`swarm.gossip.flat.flat_parameters` for a torch module). Its full state
        (4·d bytes and a header) must fit in one message under the link's limits (a
        Peer's ``max_message_mb``), else :class:`ConfigError`: receivers new to a stream,
        or that lost a delta, are sent it whatever the codec.
    topology, edges, seed: as in :mod:`swarm.gossip.topology`, applied to the link's view.
        ``topology=None`` (the default) is the graph the link's own ``neighbours()``
        follow: a Peer's ``topology`` and ``edges`` (seed 0), a SimLink's hub's
        ``topology``, ``edges`` and ``seed``; a ring on a link that names none. ``edges``
        without a topology are refused (pass ``topology="custom"``); a ``seed`` given
        with none is used instead of the link's. An explicit topology other than the
        link's is used as given, and said once at INFO: replay sharing and ``swarm
        status`` still follow the link's neighbours.
    codec: codec spec string for :func:`swarm.compress.get_codec`, a built-in family
        (not an instance: the engine makes one per stream, and neighbours decode by name).
    gamma: CHOCO consensus step in (0, 1], or ``"auto"`` for
        :func:`~swarm.gossip.suggested_gamma` of the codec (and of the outer step, in
        ``pseudo_gradient`` mode); 1 with the identity codec is exact gossip, coarse
        codecs need less (top-1%: 0.02) and diverge above it.
    sync: ``lockstep``, ``bounded`` or ``async``; ``max_staleness`` for ``bounded``.
    round_timeout: longest a round waits for neighbours, in seconds.
    send_timeout: passed to ``link.send``.
    mode: ``params`` (plain averaging) or ``pseudo_gradient`` (outer Nesterov step on
        the movement to the neighbourhood average, DiLoCo-style), with ``outer_lr``
        and ``outer_momentum``. Its anchor (the outer parameters) is ``params`` as
        built; after setting ``params`` from outside (a checkpoint loaded in place, x
        restored after the NaN error) call :meth:`reset_anchor`, else the next round
        takes the whole jump for one pseudo-gradient. A new engine, :meth:`bootstrap`
        and ``reset_anchor()`` restart the outer momentum at zero.
    local_steps: H, the local steps between rounds counted by :meth:`local_step`.
    """

    def __init__(self, link: Link, params: np.ndarray, *, topology: str | None = None,
                 codec: str = "identity", gamma: float | Literal["auto"] = 1.0,
                 sync: Literal["lockstep", "bounded", "async"] = "lockstep",
                 max_staleness: int = 1, round_timeout: float = 5.0,
                 send_timeout: float | None = 1.0, edges: Any = None, seed: int | None = None,
                 mode: Literal["params", "pseudo_gradient"] = "params",
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, local_steps: int = 1):
        if (problem := link_problem(link)) is not None:
            raise ConfigError(problem)
        if isinstance(params, np.ndarray) and params.dtype == np.float32 and params.ndim == 1 and params.size == 0:
            # said first: a read-only empty vector (BaseAgent.parameters()'s) is told it is empty, not read-only
            raise ConfigError("params is empty: nothing to gossip (an agent with nothing to learn needs no engine)")
        if not isinstance(params, np.ndarray) or params.dtype != np.float32 or params.ndim != 1 \
                or not params.flags.c_contiguous or not params.flags.writeable:
            got = type(params).__name__
            if hasattr(params, "dtype"):
                got += f" {params.dtype}"
            if hasattr(params, "shape"):
                got += f" shape {params.shape}"
            # told by its module, not isinstance: the engine does not import torch
            hint = (": for a model, pass swarm.gossip.flat_parameters(model); for a tensor, tensor.numpy() of a "
                    "contiguous float32 CPU one") if type(params).__module__.split(".")[0] == "torch" else ""
            if isinstance(params, np.ndarray) and params.dtype == np.float32 and params.ndim == 1:
                # type, dtype and shape look right, so say which flag is wrong
                if not params.flags.c_contiguous:
                    hint = (": it is not C-contiguous (a strided view); pass np.ascontiguousarray(params) and "
                            "keep that array, which the engine updates in place")
                else:
                    hint = (": it is read-only, and the engine writes the average into it in place; pass a "
                            "writeable array (params.copy())")
            raise ConfigError(f"params must be a writeable 1-D contiguous float32 numpy array, got {got}{hint}")
        own = _link_topology(link)
        if topology is None:
            if edges is not None:
                raise ConfigError(f"edges = {edges!r:.80} without a topology: pass topology='custom' with them "
                                  "(an engine without topology= follows its link's own graph, edges included)")
            topology, edges, own_seed = own or ("ring", None, 0)
            seed = own_seed if seed is None else seed
        if topology not in topo.TOPOLOGIES:
            raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(topo.TOPOLOGIES)}")
        probe = make_codec(codec)  # fail now, naming the spec, rather than in the first round
        if probe.aliases_input and probe.name != "identity":
            raise ConfigError(f"codec {codec!r} returns frames that alias its input; the engine "
                              "reuses its delta buffer, which such frames would race")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        _number("outer_lr", outer_lr)
        if not (math.isfinite(outer_lr) and outer_lr > 0):
            raise ConfigError(f"outer_lr must be a finite number > 0, got {outer_lr!r}")
        _number("outer_momentum", outer_momentum)
        if not 0 <= outer_momentum < 1:
            raise ConfigError(f"outer_momentum must be in [0, 1), got {outer_momentum!r}")
        outer_lr, outer_momentum = float(outer_lr), float(outer_momentum)
        # the outer step scales how far a round moves x, and so the step that is stable
        stable = suggested_gamma(codec, *((outer_lr, outer_momentum, topology) if mode == "pseudo_gradient" else ()))
        if isinstance(gamma, str) and gamma == "auto":
            gamma = stable
        if not isinstance(gamma, str):
            _number("gamma", gamma)
        if not (_real(gamma) and 0 < gamma <= 1):
            raise ConfigError(f"gamma must be in (0, 1] or 'auto', got {gamma!r}")
        gamma = float(gamma)
        if gamma > DIVERGES_ABOVE * stable:
            # CHOCO diverges when γ is large for a coarse codec (measured: ef+topk:0.01
            # at γ = 1 on an 8-ring grows the consensus error 37× in 200 rounds), and the
            # outer step for any codec past outer_step_limit (a 4-ring, identity, γ = 1,
            # outer_lr 1.1: 1e37)
            log.warning("gossip: gamma=%s is far above the stable step for codec %r%s (about %.3g); "
                        "expect divergence; pass gamma='auto' (in a swarm run spec, set gossip.step_size to it)%s",
                        gamma, codec, " with this outer step" if mode == "pseudo_gradient" else "", stable,
                        f", or a smaller outer_lr ({outer_lr}) or outer_momentum ({outer_momentum}) for "
                        f"topology {topology!r}" if mode == "pseudo_gradient" else "")
        if sync not in SYNC_MODES:
            raise ConfigError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        _number("max_staleness", max_staleness, numbers.Integral)
        if max_staleness < 0:
            raise ConfigError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
        if not (_real(round_timeout) and round_timeout > 0):
            raise ConfigError(f"round_timeout must be a finite number of seconds > 0, got {round_timeout!r}")
        if send_timeout is not None and not (_real(send_timeout) and send_timeout >= 0):
            raise ConfigError(f"send_timeout must be None or a finite number of seconds >= 0, "
                              f"got {send_timeout!r}")
        max_staleness, round_timeout = int(max_staleness), float(round_timeout)
        send_timeout = None if send_timeout is None else float(send_timeout)
        _number("local_steps", local_steps, numbers.Integral)
        if local_steps < 1:
            raise ConfigError(f"local_steps must be an integer >= 1, got {local_steps!r}")
        local_steps = int(local_steps)
        limits: wire.Limits = getattr(link, "limits", wire.DEFAULT_LIMITS)
        # Checked now: with a delta codec the first rounds ran, and the first full state
        # (a member joined, a nack) raised WireError out of that round and every one after.
        full = _most_bytes(link.id, T_FULL, {"r": _MAX_WIRE_ROUND, "ver": 2**64 - 1}, params)
        if full > limits.max_message_bytes:
            raise ConfigError(f"d = {params.size}: a full state takes {full} bytes on the wire, more than a "
                              f"message on this link may carry ({limits.max_message_bytes} bytes; a Peer's "
                              "max_message_mb sets it): raise that limit or gossip fewer parameters")
        seed = rng_seed(0 if seed is None else seed)   # in [0, 2**32): random_pairing's draws would mask a larger one
        if topology == "custom":
            if edges is not None and not isinstance(edges, (str, bytes)) and hasattr(edges, "__iter__"):
                edges = list(edges)   # kept for every view: a generator would be spent by the check below
            topo.within(edges, 0)   # pairs of positions; each view uses those it has
        if own is not None and _graph(topology, edges) != _graph(*own[:2]):
            # INFO, not WARNING: only an explicit topology= gets here, and averaging over
            # another graph than the links' may be deliberate (a benchmark's full mesh under
            # a one-peer exponential engine); a warning could not be silenced but by
            # logging. Said once, here, for whoever wonders why the neighbours differ.
            log.info("gossip %s: topology %r%s differs from its link's %r (what the link's neighbours(), "
                     "replay sharing and `swarm status` follow); averaging follows %r as given; leave "
                     "topology unset to follow the link's", link.id, topology,
                     " with other edges" if topology == own[0] else "", own[0], topology)

        self.link = link
        self._limits = limits
        self.x = params
        self.d = params.size
        self.topology, self.edges, self.seed = topology, edges, seed
        self.codec_spec = codec
        self.gamma = float(gamma)
        self.sync, self.max_staleness = sync, max_staleness
        self.round_timeout, self.send_timeout = float(round_timeout), send_timeout
        self.mode, self.outer_lr, self.outer_momentum = mode, float(outer_lr), float(outer_momentum)
        self.local_steps = local_steps
        self.t = 0
        self.stats = GossipStats()
        self._per_edge = topology in topo.TIME_VARYING
        self._sends_state = probe.name == "identity"   # see round()
        self._out: OrderedDict[str, _OutStream] = OrderedDict()  # key "" = broadcast stream
        # Above every version a dropped stream of this engine reached: a stream's
        # versions start here (see _start). From the time in µs, as the relay numbers
        # its gradients: a process restarted under its old id does not reuse its dead
        # process's versions either.
        self._ver_floor = time.time_ns() // 1000
        self._in: OrderedDict[str, _InCopy] = OrderedDict()   # least recently heard from first
        self._arrived = asyncio.Event()
        # Senders a round waited for until its deadline, in vain: later rounds do not
        # wait for them again until something from them arrives. A neighbour that is
        # still starting (a restart, a late join) or stalled costs one timeout, not one
        # per round, while a merely slow neighbour is waited for as the mode says.
        # (Not before this peer's first averaging round: see round().)
        self._late: set[str] = set()
        # Neighbours whose model has another size, by that size: senders whose states this
        # engine refused (not waited for) and receivers that refused its states (a nack's d:
        # sent nothing), until a state or nack of this size comes from them or they leave
        # the view (see _reject_size)
        self._refused: dict[str, int] = {}
        self._refused_by: dict[str, int] = {}
        # Neighbours whose messages carry another gamma, by that gamma (warned of once each)
        self._gammas: dict[str, float] = {}
        self._bytes_in = 0
        self._rejected = 0
        self._steps = 0
        self._scratch: np.ndarray | None = None
        self._blocks: np.ndarray | None = None
        self._unmixed: tuple[np.ndarray, np.ndarray] | None = None   # x before the mix, a block's mask (_mix)
        self._shared_delta: list[np.ndarray] = []   # see _OutStream.delta
        self._anchor = params.copy() if mode == "pseudo_gradient" else None
        self._momentum = np.zeros(self.d, np.float32) if mode == "pseudo_gradient" else None
        self._view: View = link.view
        self._pos_cache: tuple[View, int | None, tuple[int, list[str], list[str], dict[str, float]]] | None = None
        self._handlers = [(T_DELTA, self._on_message), (T_FULL, self._on_message), (T_NACK, self._on_nack),
                          (T_BOOT_REQ, self._on_boot_req), (T_BOOT_OK, self._on_boot_ok), (T_BOOT, self._on_boot)]
        self._closed = False
        self._peer_down = False   # closed because its peer closed (see _peer_gone)
        self._running: str | None = None   # "a round" or "a bootstrap" under way (see _may_run)
        self._boot: dict[int, tuple[str, int, int, asyncio.Future[np.ndarray | None]]] = {}
        self._boot_taken: dict[int, asyncio.Future[None]] = {}   # by nonce: gsp_boot_ok came
        self._boot_nonce = 0
        self._boot_round = 0
        self._serving: dict[str, int] = {}          # bootstrap slices being sent, by asker
        self._serve_tasks: set[asyncio.Task[None]] = set()
        # identity snapshots: written buffers that come back once sent and replaced
        self._free_snapshots: list[np.ndarray] = []
        if self._sends_state:
            self._free_snapshots += [_written_zeros(self.d) for _ in range(2)]
        else:
            self._preallocate()
        # last: a constructor that raised left no handlers behind (an engine nobody could
        # close, handling every gossip message beside the next one built)
        for t, h in self._handlers:
            link.on(t, h)
        link.on_view(self._on_view)

    def close(self) -> None:
        """Take this engine's handlers off the link: it receives nothing more, and once
        dropped it is freed with its buffers (the link held it until then).

        Call it on the link's loop before building another engine on the same peer,
        which otherwise gets every message too (a notebook cell run again). Closing
        twice does nothing; :meth:`round` (and :meth:`bootstrap`) on a closed engine
        raises :class:`~swarm.errors.GossipError`, a round in flight stops waiting for
        its neighbours (it mixes what arrived and says so in ``reason``), and a bootstrap
        in flight stops asking and raises that error, leaving ``x`` alone. A link without
        ``off``/``off_view`` (a test double; :class:`~swarm.peer.Peer` and
        :class:`~swarm.gossip.sim.SimLink` have them) keeps what it holds.
        """
        if self._closed:
            return
        self._closed = True
        off, off_view = getattr(self.link, "off", None), getattr(self.link, "off_view", None)
        if off is not None:
            for t, h in self._handlers:
                off(t, h)
        if off_view is not None:
            off_view(self._on_view)
        self._arrived.set()   # a round in flight stops waiting for its neighbours
        # and a bootstrap in flight for its slices (none can reach a closed engine)
        for _, _, _, fut in self._boot.values():
            if not fut.done():
                fut.set_exception(self._closed_error())
                fut.exception()   # marked retrieved: a slice between asks never awaits it (see fetch)
        for task in self._serve_tasks:   # bootstrap slices still waiting to go
            task.cancel()

    def _snapshot(self) -> tuple[np.ndarray, bool]:
        """A copy of x for an identity round, in a recycled buffer where one is free,
        and whether it is all finite.

        The copy is sent without a copy by the transport and kept as the stream's
        x̂ until the next round, so its buffer may be written again only once both
        are done with it: the array handed out is a view whose finalizer returns
        the buffer (as SimHub recycles its message buffers). Two written buffers are
        made with the engine, so the first rounds fault in no fresh pages (40 MB at
        d = 1e7); a round whose buffers are all still in flight gets a new one."""
        free = self._free_snapshots
        buf = free.pop() if free else np.empty(self.d, np.float32)
        finite = _fill_finite(buf, self.x)
        view = buf[:]
        weakref.finalize(view, _give_back, free, buf)
        return view, finite

    def _preallocate(self) -> None:
        """Allocate and write our public copies for the first rounds' receivers now.

        Writing fresh pages costs more than a round's arithmetic: the first fp16
        round of 4 peers at d = 1e7 spent most of its time writing into new
        copies while ZeroMQ's I/O thread faulted in receive buffers (measured
        0.1 s of CPU per 40 MB copy against 0.005 s into written pages). A peer
        built before its first round pays that here; its first round copies x into
        them (see _start). The neighbours' copies need none: a stream's first
        message is a full state, which the receiver keeps as it came. Identity
        streams need no copies of their own (see round()). Receivers that come
        later get their streams on first contact, as before."""
        me = self._view.index(self.link.id)
        n = len(self._view.members)
        if me < 0 or n < 2:
            return
        rounds = max(1, (n - 1).bit_length()) if self.topology == "one_peer_exponential" else 1
        for t in range(self.t, self.t + rounds):
            try:
                _, _, receivers, _ = self._positions_uncached(t)
            except ConfigError:   # a view the topology cannot take (a hypercube of 3): the round says so
                return
            for s in {id(s): s for s in map(self._stream_for, receivers)}.values():
                s.hat.fill(0.0)

    # ------------------------------------------------------------ topology

    def _positions(self, t: int) -> tuple[int, list[str], list[str], dict[str, float]]:
        """(my position, sender ids, receiver ids, weights by id incl. self) for round t.

        Cached per view (and per round on time-varying topologies): the lists are
        the same every round of a static topology, and rebuilding them cost
        ~100 µs a round. Callers must not modify what this returns."""
        view, rt = self._view, (t if self._per_edge else None)
        c = self._pos_cache
        if c is not None and c[0] is view and c[1] == rt:
            return c[2]
        out = self._positions_uncached(t)
        self._pos_cache = (view, rt, out)
        return out

    def _positions_uncached(self, t: int) -> tuple[int, list[str], list[str], dict[str, float]]:
        ids = self._view.ids
        i = self._view.index(self.link.id)
        if i < 0:
            return -1, [], [], {}
        n = len(ids)
        kw = dict(edges=topo.within(self.edges, n) if self.topology == "custom" else None, seed=self.seed)
        snd = [ids[j] for j in topo.senders(self.topology, n, i, t, **kw)]
        rcv = [ids[j] for j in topo.receivers(self.topology, n, i, t, **kw)]
        w = {ids[j]: v for j, v in topo.weights(self.topology, n, i, t, **kw).items()}
        return i, snd, rcv, w

    def _on_view(self, view: View) -> None:
        # Neighbours follow the new view at the next round (a round in flight mixes
        # by it when a sender of the round left: see _senders_now); copies of peers that left are dropped so a later
        # return starts from a full state, and so are streams to them, for the same reason.
        if view.epoch < self._view.epoch:
            return
        self._view = view
        present = set(view.ids)
        for src in [s for s in self._in if s not in present]:
            del self._in[src]
        for key in [k for k in self._out if k and k not in present]:
            self._drop_stream(key)
        self._late &= present   # a member that comes back under its id is waited for again
        # and warned of again, and sent states again
        self._refused = {k: n for k, n in self._refused.items() if k in present}
        self._refused_by = {k: n for k, n in self._refused_by.items() if k in present}
        self._gammas = {k: g for k, g in self._gammas.items() if k in present}
        for s in self._out.values():
            s.synced &= present
            s.full_at = {k: v for k, v in s.full_at.items() if k in present}
        for donor, _, _, fut in self._boot.values():   # a bootstrap asks the next donor at once
            if donor not in present and not fut.done():
                fut.set_result(None)
        self._arrived.set()

    # ------------------------------------------------------------ receiving

    def _on_message(self, msg: Message) -> None:
        if self._view.index(msg.src) < 0:
            self.stats.ignored_strangers += 1
            return
        n = msg.nbytes or sum(int(a.nbytes) for a in msg.arrays)
        self._bytes_in += n
        self.stats.bytes_in += n
        # checked on arrival: round() reads the rounds of held messages (to join, to
        # catch up) before any of them is applied
        r, ver = msg.body.get("r"), msg.body.get("ver")
        if not _round_number(r) or not isinstance(ver, int):
            self._reject(msg.src, "rejected_malformed",
                         f"body needs a round r in [0, {_MAX_WIRE_ROUND}] and an integer ver, got r={shown(r)} "
                         f"ver={shown(ver)}")
            return
        # The sender's gamma, on deltas only: a full state stays the size the constructor
        # checked against the link's message limit, to the byte (identity sends no delta)
        g = msg.body.get("g")
        if _real(g) and g != self.gamma and self._gammas.get(msg.src) != g:
            self._gammas[msg.src] = g
            log.warning("gossip: neighbour %r mixes with gamma=%g, this engine with %g: the two ends of the edge "
                        "move by different steps, so the swarm's mean drifts towards the peers with the larger "
                        "one (CHOCO keeps it only with one gamma on every peer); give every peer the same gamma "
                        "(gamma='auto' picks it by codec: then the same codec spec too)", msg.src, g, self.gamma)
        copy = self._in.get(msg.src)
        if copy is None:
            copy = self._in[msg.src] = _InCopy(self.d)
        else:
            self._in.move_to_end(msg.src)
        if msg.t == T_FULL and self.sync == "async":
            # Everything held from the sender is older, and no async round mixes a copy
            # between them and this state, which replaces the copy: applied, they only
            # cost decoding, and the deltas behind a gap an out-of-sync count and a nack
            # each. (Lockstep and bounded mix each round's copy in that round: kept.)
            copy.pending.clear()
            copy.gap = None
        copy.pending.append(msg)
        if len(copy.pending) > _MAX_PENDING + self.max_staleness:
            self._overflow(msg.src, copy)
        self._late.discard(msg.src)
        self._arrived.set()

    def _overflow(self, src: str, copy: _InCopy) -> None:
        """Hold one message fewer from ``src``, whose backlog just went past ``_MAX_PENDING``
        plus ``max_staleness``; a held full state that deltas behind it build on is never
        the one lost.

        Async: the oldest is applied now, which is what the next round would do first
        (an async round applies all it holds, and waits for no round): nothing is lost.
        Lockstep and bounded (whose rounds mix each round's copy in that round): the
        oldest is dropped, as if lost, unless it is a full state that deltas behind it
        build on; then the messages before the newest held full state go (superseded by
        it), or with none, the delta after it (its gap is nacked, and repaired by the next
        full state). Dropping the oldest whatever it was kept a peer much slower than its
        neighbours out of sync for good: a neighbour 60 messages ahead each round got the
        gap nacked, sent the full state that repairs it and more than 33 deltas behind it,
        and the full state went first. The slow peer (async, fp16, 4-ring) mixed nobody in
        26 of 33 rounds, and each fast neighbour sent it 30 full states instead of 2."""
        pending = copy.pending
        if self.sync == "async":
            msg = pending.popleft()
            if not self._apply(src, copy, msg):
                copy.gap = msg.body["ver"]
            return
        drop = 1
        if pending[0].t == T_FULL and pending[1].t == T_DELTA:
            drop = max(i for i, m in enumerate(pending) if m.t == T_FULL)
            if not drop:
                del pending[1]
                self.stats.backlog_dropped += 1
                return
        for _ in range(drop):
            pending.popleft()
        self.stats.backlog_dropped += drop

    def _on_nack(self, msg: Message) -> None:
        d = msg.body.get("d")   # absent from an older peer's nacks
        if type(d) is int and d > 0 and self._view.index(msg.src) >= 0:
            if d == self.d:
                self._size_matches(msg.src)
            else:
                self._other_size(msg.src, d, self._refused_by)
        stream = self._out.get(msg.src if self._per_edge else "")
        if stream is None:
            return
        ver = msg.body.get("ver")
        if type(ver) is int and ver <= stream.full_at.get(msg.src, -1):
            # a gap that the full state sent since fills: a receiver a few rounds behind
            # nacks each delta queued behind the gap as it reaches it, and each nack cost
            # a full state more (max_staleness + 1 of them for one lost delta)
            self.stats.nacks_stale += 1
            return
        stream.synced.discard(msg.src)
        if stream.sending == msg.src:
            stream.nacked = True

    def _reject(self, src: str, kind: str, why: str) -> None:
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self._rejected += 1
        # %r: a bootstrap slice is taken from any sender (a stranger too), whose id may
        # hold a line break and so forge lines in the log
        log.debug("gossip: rejected message from %r: %s", src, why)

    def _reject_size(self, src: str, n: int | None, why: str) -> None:
        """Reject a state or delta of the wrong size from ``src``, as :meth:`_reject`; one of
        ``n`` values, not ``d``, marks ``src`` as a neighbour of another size (see
        :meth:`_other_size`), whose states are not waited for from then on."""
        self._reject(src, "rejected_size", why)
        if n is not None and n != self.d:
            self._other_size(src, n, self._refused)

    def _other_size(self, src: str, n: int, marks: dict[str, int]) -> None:
        """Mark ``src`` in ``marks`` (:attr:`_refused` or :attr:`_refused_by`) as gossiping
        ``n`` values, not ``d``; the first mark of each neighbour is logged as a warning.

        Each of its nacks of a refused state took it out of its stream's receivers in
        sync and so drew a full state: every round with the identity codec, every other
        round with a delta codec, for good, to a peer that could use none of them; and
        at DEBUG only, its rounds were no-ops that nothing explained."""
        if src not in self._refused and src not in self._refused_by:
            log.warning("gossip: neighbour %r gossips %d values, this engine has %d (a different model?): "
                        "no states go between the two until their sizes match (a new engine, a restart)",
                        src, n, self.d)
        marks[src] = n

    def _size_matches(self, src: str) -> None:
        """``src`` sent a state, delta or nack of this engine's size (a new engine on a model of
        this size, a restart): its states are waited for, and it is sent states, again."""
        self._refused.pop(src, None)
        self._refused_by.pop(src, None)

    def _apply_pending(self, src: str, copy: _InCopy, upto: int | None) -> list[int]:
        """Apply queued messages of ``src`` in order, up to round ``upto``; returns
        versions that failed to apply (each gets a nack)."""
        gaps = [] if copy.gap is None else [copy.gap]
        copy.gap = None
        while copy.pending:
            msg = copy.pending[0]
            if upto is not None and msg.body["r"] > upto:   # checked on arrival (_on_message)
                break
            copy.pending.popleft()
            if not self._apply(src, copy, msg):
                gaps.append(msg.body["ver"])
        return gaps

    def _apply(self, src: str, copy: _InCopy, msg: Message) -> bool:
        """Apply one message of ``src`` to its copy; False if it did not apply (a gap, or
        a message refused), which leaves the copy unusable until a full state comes."""
        r, ver = msg.body["r"], msg.body["ver"]   # checked on arrival (_on_message)
        if msg.t == T_FULL:
            if len(msg.arrays) != 1 or msg.arrays[0].dtype != np.float32 or msg.arrays[0].size != self.d:
                got = ", ".join(f"{a.dtype}[{a.size}]" for a in msg.arrays) or "no array"
                n = msg.arrays[0].size if len(msg.arrays) == 1 else None
                self._reject_size(src, n, f"full state is {got}, expected float32[{self.d}]")
                return False
            a = msg.arrays[0].reshape(-1)
            if not _finite(a):
                self._reject(src, "rejected_nonfinite", "full state has NaN/Inf")
                copy.ver = -1  # the old copy no longer matches the sender's
                return False
            if a.flags.writeable:
                copy.hat = a   # the received buffer is ours alone: keep it, no copy
            else:
                np.copyto(copy.hat, a)
            copy.ver, copy.round = ver, r
            self._size_matches(src)
            return True
        if copy.ver < 0 or ver != copy.ver + 1:
            self.stats.out_of_sync += 1
            copy.ver = -1
            return False
        meta = msg.body.get("meta")
        if not isinstance(meta, dict):
            self._reject(src, "rejected_malformed", "delta without codec meta")
            copy.ver = -1
            return False
        n = meta.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n != self.d:
            self._reject_size(src, n, f"delta has {n} values, expected {self.d}")
            copy.ver = -1
            return False
        if not all(_finite(np.asarray(f).reshape(-1)) for f in msg.arrays):
            # checked on the payload, before the copy is touched: a rejected
            # message changes no state
            self._reject(src, "rejected_nonfinite", "delta has NaN/Inf")
            copy.ver = -1
            return False
        # Decoded by the family the payload names, not this engine's: neighbours with other
        # codecs (int8 beside topk:0.1) refused each other's every delta, each then sent a
        # full state every round, and a peer between them mixed in every other round only.
        family = meta.get("codec")
        codec = copy.codecs.get(family) if isinstance(family, str) else None
        if codec is None:
            codec = _decoder(family)
            if codec is None:
                self._reject(src, "rejected_malformed", f"delta of codec {shown(family)}, not a built-in family")
                copy.ver = -1
                return False
            copy.codecs[family] = codec
        try:
            # straight into the copy: the codec checks everything before it writes
            with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked below
                # scale: 1 but for QSGD that is no contraction
                codec.decode_into(Encoded(meta, list(msg.arrays)), copy.hat, copy_scale(meta))
        except Exception as e:  # a codec may raise anything on hostile meta
            self._reject(src, "rejected_malformed", f"codec could not decode: {e}")
            copy.ver = -1
            return False
        if not _finite(copy.hat):
            # finite values can still overflow (huge scale × level): the copy is
            # spoilt, so it is not mixed until a full state repairs it
            self._reject(src, "rejected_nonfinite", "delta overflows the public copy")
            copy.ver = -1
            return False
        copy.ver, copy.round = ver, r
        self._size_matches(src)
        return True

    # ------------------------------------------------------------ bootstrap

    async def _on_boot_req(self, msg: Message) -> None:
        if self._view.index(msg.src) < 0:
            self.stats.ignored_strangers += 1
            return
        lo, hi, nonce = msg.body.get("lo"), msg.body.get("hi"), msg.body.get("nonce")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi, nonce)) \
                or not 0 <= lo < hi <= self.d:
            self._reject(msg.src, "rejected_malformed",
                         f"bootstrap request for [{shown(lo)}, {shown(hi)}) of {self.d}")
            return
        body = {"lo": lo, "hi": hi, "nonce": nonce, "r": self.t}
        size = _most_bytes(self.link.id, T_BOOT, body, self.x[lo:hi])
        if size > self._limits.max_message_bytes:
            # only a slice of nearly all of x, with a longer header than the full state the
            # constructor checked: its send raised WireError in a task nobody awaited
            self._reject(msg.src, "rejected_size", f"bootstrap request for [{lo}, {hi}): {size} bytes, more "
                                                   f"than a message may carry ({self._limits.max_message_bytes})")
            return
        # Sent by a task of its own: awaited here, a send to an asker whose queue is full
        # held the peer's receive loop up to send_timeout per request, as often as it asked.
        if self._serving.get(msg.src, 0) >= MAX_BOOT_SERVING:
            self.stats.boot_busy += 1
            return
        self._serving[msg.src] = self._serving.get(msg.src, 0) + 1
        # a copy: x keeps training while the transport sends without copying
        task = asyncio.get_running_loop().create_task(self._serve_boot(msg.src, body, self.x[lo:hi].copy()))
        self._serve_tasks.add(task)
        task.add_done_callback(self._serve_tasks.discard)

    async def _serve_boot(self, dst: str, body: dict[str, int], values: np.ndarray) -> None:
        # "Taken" first, on the same link, so it arrives ahead of the slice however slow the
        # link: an asker that hears nothing asks the next donor after BOOT_ACK_S, one that
        # heard it waits for the slice (see bootstrap). An ack that cannot go means the
        # asker will ask another donor: the slice would only be a duplicate.
        try:
            if await self.link.send(dst, T_BOOT_OK, {"nonce": body["nonce"]}, timeout=self.send_timeout) \
                    and await self.link.send(dst, T_BOOT, body, [values], timeout=self.send_timeout):
                self.stats.boot_served += 1
        finally:
            left = self._serving.pop(dst) - 1
            if left:
                self._serving[dst] = left

    def _asked(self, msg: Message, what: str) -> int | None:
        """The nonce of the request that ``msg`` (``what``: a slice or an ack) answers, if
        this bootstrap still waits for it and ``msg`` comes from the donor asked."""
        nonce = msg.body.get("nonce")
        if not isinstance(nonce, int) or nonce not in self._boot:
            return None
        donor = self._boot[nonce][0]
        if msg.src != donor:   # nonces count up: anyone could answer a request sent to another
            self._reject(msg.src, "rejected_malformed", f"bootstrap {what} from {shown(msg.src)}, asked of {donor!r}")
            return None
        return nonce

    def _on_boot_ok(self, msg: Message) -> None:
        nonce = self._asked(msg, "ack")
        if nonce is not None and not self._boot_taken[nonce].done():
            self._boot_taken[nonce].set_result(None)

    def _on_boot(self, msg: Message) -> None:
        nonce = self._asked(msg, "slice")
        if nonce is None:
            return
        _, lo, hi, fut = self._boot[nonce]
        a = msg.arrays[0].reshape(-1) if len(msg.arrays) == 1 else None
        if (msg.body.get("lo"), msg.body.get("hi")) != (lo, hi) or a is None \
                or a.dtype != np.float32 or a.size != hi - lo or not _finite(a):
            self._reject(msg.src, "rejected_malformed", "bootstrap slice does not match the request")
            return
        r = msg.body.get("r")
        if not _round_number(r) or r > _MAX_ROUND:   # bootstrap() takes the donors' round (see _MAX_ROUND)
            self._reject(msg.src, "rejected_malformed", f"bootstrap slice with round {shown(r)}")
            return
        self._boot_round = max(self._boot_round, r)
        if not fut.done():
            fut.set_result(a.copy())

    async def bootstrap(self, donors: int = 3, timeout: float = 5.0) -> list[str]:
        """Take the parameters from neighbours instead of starting from scratch.

        For a peer that joins a running swarm late or comes back after a crash:
        the vector is cut into ``donors`` slices, each fetched from a different
        neighbour (so no single neighbour pays for the whole transfer). A slice is
        asked of the next donor at once when its donor refuses the request or leaves
        the view, and after ``BOOT_ACK_S`` (1 s; at most half the time left) when it
        has not said it took the request (it drops requests while its view does not
        list this peer yet, when it serves this peer ``MAX_BOOT_SERVING`` slices already,
        and when it runs no engine). One that took it is waited for at least half the
        time left, and past that for as long as the slices that arrived say its reply
        may still be on the way (``BOOT_SLACK`` times what their rate gives; with none
        arrived, up to the deadline: a slice over a slow link is seen only once whole,
        and asking again only queued copies behind the first reply). On success ``x``
        is replaced and the public copies are reset, so every receiver gets a full
        state next round.
        Returns the donors that served, in slice order; raises :class:`GossipError`
        (and leaves ``x`` alone) if a slice could not be fetched within ``timeout``
        seconds, and asks no more; replies that come later are ignored. Over a slow
        link allow ``timeout`` for the whole vector (4·d bytes) at its rate.
        ``donors`` must be an integer >= 1 and
        ``timeout`` a finite number of seconds > 0 (a NaN one never ended), else
        :class:`ConfigError` before anything is asked. After :meth:`close` it raises
        :class:`GossipError` at once, as :meth:`round` does (it could receive no slice),
        as one in flight does when the engine is closed, and so it does while a round or
        another bootstrap of this engine runs (it would replace x and the public copies
        that the round is sending and mixing).
        """
        self._may_run()
        if isinstance(donors, bool) or not isinstance(donors, numbers.Integral) or donors < 1:
            raise ConfigError(f"bootstrap: donors must be an integer >= 1, got {donors!r}")
        if not (_real(timeout) and timeout > 0):
            raise ConfigError(f"bootstrap: timeout must be a finite number of seconds > 0, got {timeout!r}")
        self._running = "a bootstrap"
        try:
            return await self._bootstrap(int(donors), timeout)
        finally:
            self._running = None

    async def _bootstrap(self, donors: int, timeout: float) -> list[str]:
        me, snd, rcv, _ = self._positions(self.t)
        if me < 0:
            raise GossipError("bootstrap: this peer is not in the current view")
        near = list(dict.fromkeys(snd + rcv))
        others = [m for m in self._view.ids if m != self.link.id and m not in near]
        candidates = near + others
        if not candidates:
            return []
        k = min(donors, len(candidates), self.d)
        bounds = np.linspace(0, self.d, k + 1).astype(int)
        deadline = time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        arrivals = _Arrivals(4 * self.d)

        async def fetch(i: int) -> tuple[str, np.ndarray]:
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            tries = 0
            why = "no donor was asked"
            while True:
                donor = candidates[(i + tries) % len(candidates)]
                tries += 1
                self._boot_nonce += 1
                nonce = self._boot_nonce
                fut: asyncio.Future[np.ndarray | None] = loop.create_future()   # None: the donor left
                taken = self._boot_taken[nonce] = loop.create_future()
                self._boot[nonce] = (donor, lo, hi, fut)
                try:
                    if self._closed or self._peer_gone():   # no slice can reach a closed engine (see close)
                        raise self._closed_error()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise GossipError(f"bootstrap: no neighbour sent values [{lo}, {hi}) in {timeout} s; {why}")
                    if not await self.link.send(donor, T_BOOT_REQ, {"lo": lo, "hi": hi, "nonce": nonce},
                                                timeout=self.send_timeout):
                        # refused at once (it left the view, its queue is full): a pause before
                        # the next donor, or this loop would spin without yielding to the peer's
                        why = f"{donor!r}, asked last, refused the request (gone, or its queue full)"
                        await asyncio.sleep(min(BOOT_RETRY_S, left))
                        continue
                    # One donor may not use the whole budget when others could answer. One that
                    # has not taken the request in BOOT_ACK_S dropped it (its view does not list
                    # us yet, it serves us MAX_BOOT_SERVING slices already, it runs no engine).
                    # One that took it has half the time left, and past that as long as the
                    # slices that came say its slice may still be on the way (then asking
                    # another donor for it would only queue a copy behind it). A donor that
                    # leaves is not waited for.
                    half = max(0.2, left / 2)
                    floor = time.monotonic() + (left if len(candidates) == 1 else half)
                    await asyncio.wait((fut, taken), timeout=min(BOOT_ACK_S, half, left),
                                       return_when=asyncio.FIRST_COMPLETED)
                    if not (taken.done() or fut.done()):
                        why = (f"{donor!r}, asked last, did not take the request (its view did not "
                               "list this peer yet, it was busy, or it runs no engine)")
                        continue
                    while not fut.done():
                        now = time.monotonic()
                        if now >= deadline:
                            raise GossipError(
                                f"bootstrap: no neighbour sent values [{lo}, {hi}) in {timeout} s; {donor!r} took "
                                "the request: over a slow link the values may still have been on the way "
                                "(a longer timeout waits for them)")
                        due = max(floor, arrivals.due())
                        if now >= due:
                            break
                        await asyncio.wait((fut, arrivals.news), timeout=min(due, deadline) - now,
                                           return_when=asyncio.FIRST_COMPLETED)
                    if not fut.done():
                        why = f"{donor!r}, asked last, sent nothing while the other slices came"
                        continue
                    a = fut.result()   # or the error of an engine closed meanwhile
                    if a is not None:
                        arrivals.add(a.nbytes)
                        return donor, a
                    why = f"{donor!r}, asked last, left the view"
                finally:
                    del self._boot[nonce], self._boot_taken[nonce]   # later replies are ignored (_asked)

        tasks = [asyncio.ensure_future(fetch(i)) for i in range(k)]
        try:
            got = await asyncio.gather(*tasks)
        finally:   # a slice failed (or the bootstrap was cancelled): the others stop asking
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for i, (_, a) in enumerate(got):
            self.x[bounds[i]:bounds[i + 1]] = a
        for key in list(self._out):   # our old public copies are void:
            self._drop_stream(key)    # receivers get full states
        self.reset_anchor()
        self.t = max(self.t, self._boot_round)   # and we join the swarm's round, not round 0
        return [d for d, _ in got]

    # ------------------------------------------------------------ a round

    def _stream_for(self, dst: str) -> _OutStream:
        """The stream to ``dst``: the one kept, or a new one, which the next round
        starts (see :meth:`_start`)."""
        key = dst if self._per_edge else ""
        s = self._out.get(key)
        if s is not None:
            self._out.move_to_end(key)
            return s
        s = _OutStream(self.d, make_codec(self.codec_spec), self._shared_delta)
        self._out[key] = s
        if self._per_edge and len(self._out) > self._stream_cap():
            self._drop_stream(next(iter(self._out)))
        return s

    def _drop_stream(self, key: str) -> None:
        """Drop the stream ``key``: the next stream for that key starts from x, sent
        full, at versions above all of this one's (see :meth:`_start`)."""
        s = self._out.pop(key)
        self._ver_floor = max(self._ver_floor, s.ver)

    def _start(self, s: _OutStream) -> None:
        """Start the delta stream ``s``, new or restarted (forgotten past the stream cap,
        its receiver back in the view, after bootstrap()): from x itself, sent full to
        every receiver, or raise :class:`GossipError` for an ``x`` with NaN or Inf
        (``s`` stays unstarted).

        From zero, its first delta was C(x): each receiver's copy of it a compressed x.
        Restarted so, top-k's sparse copies pulled x towards them at every restart
        (top-10% over 16 live peers stayed at 0.25 of the starting consensus error
        after 800 rounds; 8 peers: 2e-5); and peers that start from one checkpoint
        were pushed apart by gossip alone (3-ring, randomk:0.1: 42% of ||x|| away after
        10-20 rounds; qsgd:4: 36%, back only after ~100 rounds). From x, copies the
        peers agree on stay where they are, for one full state per receiver.

        Its versions start above every version this engine has sent, so the receiver
        never holds one of them from the stream's earlier life. From version 1 again,
        its first message (a full state at version 2) can be lost on the way with send
        reporting it sent, and the next delta (version 3) applied to the receiver's
        copy of version 2 from before: the two ends' copies differed for good, and
        nothing counted it (random pairing, topk:0.5: the pair's sum went from 706 to
        −9,427 over 300 loss-free rounds). Now that delta finds no copy of its base:
        the receiver counts it out of sync and nacks, and gets a full state."""
        if not _finite(self.x):   # checked first: a round that raises changes no copy
            raise self._nonfinite()
        np.copyto(s.hat, self.x)
        s.ver = self._ver_floor + 1   # synced with nobody: every receiver gets it full

    def _stream_cap(self) -> int:
        """Per-receiver streams a peer keeps on a time-varying graph (see ``_MAX_EDGE_STREAMS``)."""
        # the one-peer exponential graph cycles through τ = ceil(log2 n) receivers:
        # past 256 peers a cap of 8 forgot each stream before its next use
        return max(_MAX_EDGE_STREAMS, (len(self._view.members) - 1).bit_length()
                   if self.topology == "one_peer_exponential" else 0)

    def _drop_unused_copies(self, senders: list[str]) -> None:
        """Drop the least recently heard-from copies past ``_IN_COPIES_PER_STREAM`` times
        the senders' stream cap, never fewer than this round's ``senders``.

        A copy is of use only while its sender keeps a stream to this peer: a sender
        keeps its ``_stream_cap()`` most recent receivers' streams (time-varying
        graphs), or only its current receivers (static ones, where a sender whose view
        lags behind ours may still send for a few rounds). This round's senders and
        copies with messages still to apply are always kept. A sender whose copy was
        dropped and that still sends deltas is nacked (a new copy has no version) and
        sends a full state, as to any receiver new to its stream."""
        keep = max(len(senders), _IN_COPIES_PER_STREAM * self._stream_cap())
        current = set(senders)
        for src in [s for s, c in self._in.items() if s not in current and not c.pending]:
            if len(self._in) <= keep:
                break
            del self._in[src]

    def _wire_size(self, t: str, body: dict, arrays: list) -> int:
        """Bytes of this message on the wire (header + frames), as the link will send it
        but for its ``seq``, which only the link knows (1 to 9 bytes in the header; here
        1): :meth:`_send` counts the link's own figure where it gives one."""
        return sum(len(f) if isinstance(f, (bytes, bytearray)) else int(np.asarray(f).nbytes)
                   for f in wire.encode(t, self.link.id, epoch=self.link.view.epoch, body=body, arrays=arrays))

    async def _send(self, dst: str, t: str, body: dict, arrays: list, nbytes: int,
                    res: RoundResult) -> bool:
        ok = await self.link.send(dst, t, body, arrays, timeout=self.send_timeout)
        if ok:
            # A Peer says what it queued (sent_nbytes, read before anything yields): the
            # receiver counts those bytes, whose header's seq takes 1 byte at first, 3 past
            # 255 and 5 past 65,535. Other links (SimLink) give nbytes, short by the seq's.
            res.bytes_out += getattr(self.link, "sent_nbytes", nbytes)
            res.sent += 1
        else:
            res.dropped += 1
        return ok

    async def round(self) -> RoundResult:
        """Run one gossip round; ``x`` is updated in place. Never raises for a slow,
        dead or misbehaving neighbour: that shows in the result.

        Raises :class:`GossipError` when ``x`` itself holds NaN or Inf, before
        anything is sent or changed: neighbours would refuse such a state, or (top-k
        never picks a NaN) average towards a stale copy of it; after :meth:`close`;
        once the peer closed (close the engine first), and while the round waits when
        it closes, leaving ``x`` and ``t`` alone (the engine is closed then too); and
        at once, changing nothing, while another round or a :meth:`bootstrap` of
        this engine is still running (they must not overlap: await one before the next).
        A cancelled round (a caller's deadline, a TaskGroup, Ctrl-C) raises
        ``CancelledError`` and mixes nothing, also when the cancel lands as a state arrives.
        """
        self._may_run()
        self._running = "a round"
        try:
            return await self._round()
        finally:
            self._running = None

    def _may_run(self) -> None:
        """Raise :class:`GossipError` if a round or a bootstrap may not start now, changing nothing.

        Rounds of one engine must not overlap: both took the same round number and
        public copies, and x was mixed twice (two concurrent rounds on one peer of a
        3-ring moved the swarm's sum from 168 to 196). Nor may a round and a bootstrap,
        which replaces x, the public copies and the round number under the round."""
        if self._closed or self._peer_gone():
            raise self._closed_error()
        if self._running is not None:
            raise GossipError(f"{self._running} is already running on this gossip engine (round {self.t}); "
                              "await it before starting another round or bootstrap")

    async def _round(self) -> RoundResult:
        t = self.t   # self.t moves when the round ends: one that raises leaves it as it was
        if not self._has_averaged:
            # A peer joining a running swarm adopts its neighbours' round number,
            # which time-varying topologies and lockstep both rely on. It does so
            # until it has first averaged with someone, not only in its first round:
            # the messages a neighbour sent before this engine existed are lost, and
            # a peer that started at round 0 behind a neighbour already at round 4
            # held that neighbour's later messages back as "future" (bounded mode),
            # and the full state that would repair its copy as well, until the
            # neighbour had finished (tests/experiment/test_run.py, 2 peers).
            # On a time-varying graph in lockstep and bounded it takes only a round
            # that shows the swarm went on without it (see _left_behind): peers that
            # start together there are legitimately a round apart, and one that took a
            # neighbour's round 1 skipped its round 0, whose receiver then had no
            # state from it in round 0, and it ran a round ahead of everyone to the
            # end, where it waited out round_timeout for a round nobody else ran
            # (scripts/bench_vs_hivemind.py, 4 peers, one_peer_exponential).
            newest: dict[str, int] = {}   # each sender's latest round (the one most likely to show it)
            for src, c in self._in.items():   # held messages' rounds were checked on arrival
                for m in c.pending:
                    if newest.get(src, t) < m.body["r"] <= _MAX_ROUND:   # none past it (see _MAX_WIRE_ROUND)
                        newest[src] = m.body["r"]
            if self.sync != "async" and self._per_edge and newest:
                newest = self._left_behind(newest, t)
            t = max([t, *newest.values()])
        elif self.sync != "async" and not self._per_edge:
            # On a static graph a neighbour is also a receiver, and waits for this
            # peer's state before it gets more than max_staleness rounds ahead
            # (lockstep: none). A message from further ahead means it went on without
            # this peer (which was slow, frozen, or away from its view), so the rounds
            # this peer would wait for are never coming: it catches up. Without this
            # it held back every newer message (growing without bound while the
            # neighbour ran on), and it and its neighbours waited out round_timeout
            # every round until it had crept forward one round at a time.
            slack = self.max_staleness if self.sync == "bounded" else 0
            newest = [c.pending[-1].body["r"] for c in self._in.values() if c.pending]
            t = max([t] + [r - slack for r in newest if r <= _MAX_ROUND])   # see _MAX_WIRE_ROUND
        res = RoundResult(round=t)
        me, senders, receivers, w = self._positions(t)
        if self._per_edge:
            # On a time-varying graph a sender sends to this peer only in the rounds it is
            # one, so no message clears a mark it took for a round it missed: a joiner that
            # took a later round number (its neighbour timed out on the round it skipped)
            # was then not waited for when next a sender, though on time, and the half of
            # the edge it applied was lost (the sum fell 1.8-8.9%). Each sender is waited
            # for in its own rounds: a frozen one costs a timeout in each until the view drops it.
            self._late.difference_update(senders)
        began = bool(senders)
        if me < 0:
            res.reason = "not a member of the current view"
        # 1. compress and send our deltas (full state to anyone not in sync).
        streams: dict[int, tuple[_OutStream, list[str]]] = {}
        for dst in receivers:
            s = self._stream_for(dst)
            dsts = streams.setdefault(id(s), (s, []))[1]
            if dst in self._refused_by:
                # its model has another size (its nack said so; its own states alone do
                # not stop the sends: one forged or damaged state of another size would
                # cost it a round's timeout): it refuses every state. The stream still
                # moves (it is this peer's copy in the mix); a full state goes once the
                # sizes match again
                s.synced.discard(dst)
            else:
                dsts.append(dst)
        if not self._per_edge and receivers:
            self._stream_for("").synced &= set(receivers)
        # x is checked for NaN/Inf in the first pass the round makes over it anyway
        # (the identity snapshot, the first stream's delta), before anything is sent
        # or any public copy changes
        if not receivers and not _finite(self.x):
            raise self._nonfinite()
        sends = []
        snapshot = None
        for s, dsts in streams.values():
            if self._sends_state:
                # Identity codec: x̂ becomes x exactly each round, so the message is x
                # itself (the same bytes as the delta x − x̂), and a receiver keeps the
                # received array as its copy: no delta buffer, no additions at either
                # end, no versions to fall out of. The snapshot is not written again
                # while sent or held (see _snapshot), so it goes without a copy.
                if snapshot is None:
                    snapshot, finite = self._snapshot()
                    if not finite:
                        raise self._nonfinite()
                s.hat, s.ver = snapshot, s.ver + 1
                body = {"r": t, "ver": s.ver}
                state = (T_FULL, body, [snapshot], self._wire_size(T_FULL, body, [snapshot]))
                sends += [(s, dst, state) for dst in dsts]
                continue
            if s.ver == 0:
                self._start(s)   # x̂ = x: full states to all, no delta to send
            else:
                delta, finite = s.delta(self.x)
                if not finite and not _finite(self.x):   # else x̂ overflowed: left to the codec, as before
                    raise self._nonfinite()
                enc = s.codec.encode(delta)
                s.codec.decode_into(enc, s.hat, copy_scale(enc.meta))   # 1 but for QSGD that is no contraction
                s.ver += 1
            delta = full = None
            for dst in dsts:
                if dst in s.synced:
                    if delta is None:  # one body, measured once, for all receivers
                        body = {"r": t, "ver": s.ver, "meta": dict(enc.meta), "g": self.gamma}
                        frames = [np.asarray(f) for f in enc.frames]
                        delta = (T_DELTA, body, frames, self._wire_size(T_DELTA, body, frames))
                    sends.append((s, dst, delta))
                else:
                    if full is None:
                        body, arrays = {"r": t, "ver": s.ver}, [s.hat.copy()]
                        full = (T_FULL, body, arrays, self._wire_size(T_FULL, body, arrays))
                    sends.append((s, dst, full))
        # Our copy to mix against, taken before anything yields: a view without the
        # receiver drops its per-edge stream, and looking it up after the wait
        # raised KeyError (a live one-peer exponential peer died so, when a frozen
        # receiver left the view during the round).
        own = (self._out[receivers[0] if self._per_edge else ""].hat if receivers
               else self._out[""].hat if "" in self._out else self.x)
        for s, dst, (typ, body, arrays, nbytes) in sends:
            s.sending, s.nacked = dst, False
            try:
                ok = await self._send(dst, typ, body, arrays, nbytes, res)
            finally:
                s.sending = None
            if ok:
                if typ == T_FULL and not self._sends_state:
                    res.full_sent += 1
                    self.stats.full_sent += 1
                    s.full_at[dst] = body["ver"]
                # a nack that came while this delta waited to go is for a gap this delta
                # does not fill: it stays unsynced and gets the full state next round (a
                # full state sent meanwhile fills it)
                if typ == T_FULL or not s.nacked:
                    s.synced.add(dst)
            else:
                s.synced.discard(dst)

        # 2. wait as the sync mode says, applying arrivals as they come. Yield once
        # first: the sends above need not have, and a round that waits for nobody
        # (async mode, or every sender late) would otherwise never let the peer's
        # receive loop run, so a caller running rounds back to back took in nothing
        # its neighbours sent until a full send queue made it wait.
        await asyncio.sleep(0)
        upto = None if self.sync == "async" else t
        need = {"lockstep": t, "bounded": t - self.max_staleness, "async": None}[self.sync]
        t0 = time.monotonic()
        deadline = t0 + self.round_timeout
        broken: set[str] = set()
        while True:
            # cleared before looking, not after: a nack sent while looking may yield,
            # and a message that arrives then must end the wait below
            self._arrived.clear()
            # a sender whose copy broke this round (gap, bad delta) is repaired by a
            # full state next round; waiting for it now would only burn the timeout
            broken |= await self._drain(upto)
            # the view may have changed (while we sent, waited or nacked): when a
            # sender of the round left it, wait for and mix the senders it decides,
            # with its weights; nothing below awaits before the mix
            senders, w = self._senders_now(t, senders, w)
            waiting = [] if need is None else [j for j in senders if self._copy_round(j) < need
                                               and j not in broken and j not in self._late
                                               and j not in self._refused
                                               and not self._went_past(j, t)]
            if not waiting:
                break
            if self._peer_gone():   # nothing can arrive: x is left alone, t as it was
                raise self._closed_error()
            if self._closed:
                res.reason = "the engine was closed during the round"
                break
            left = deadline - time.monotonic()
            if left <= 0:
                if self._has_averaged:
                    # only once this peer has averaged with someone: at start-up,
                    # neighbours still setting up are waited for every round, so
                    # peers that start together also train together
                    self._late.update(waiting)
                break
            # not wait_for: on 3.11 it returns when a cancel (a caller's deadline, a
            # TaskGroup, Ctrl-C) lands as the event is set, and the round mixed and went on
            try:
                async with asyncio.timeout(min(left, _LOOK_S)):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        res.waited_s = time.monotonic() - t0

        # 3. mix with every sender whose copy is usable (w: the weights of the view
        # that decided the senders, above)
        if me >= 0 and self._view.index(self.link.id) < 0 and not res.reason:
            res.reason = "left the view during the round"
        usable = [j for j in senders if j in self._in and self._in[j].ver >= 0
                  and (need is None or self._in[j].round >= need)]
        res.missing = [j for j in senders if j not in usable]
        res.participants = usable
        res.staleness = {j: max(0, t - self._in[j].round) for j in usable}
        mixed = False
        if usable:
            # Neighbours with the same weight (all of them on regular graphs) are
            # summed first and scaled once: fewer operations than scaling each.
            groups: dict[float, list[np.ndarray]] = {}
            for j in usable:
                groups.setdefault(w[j], []).append(self._in[j].hat)
            mixed = self._mix(own, [(np.float32(self.gamma * wj), hats) for wj, hats in groups.items()])
            step = "the mix"
            if mixed and self.mode == "pseudo_gradient":
                mixed, step = self._outer_step(), "the outer step"
            if not mixed:
                # finite copies near float32's largest (3e38) sum to Inf: taken, x would
                # hold Inf, and every later round would raise (_nonfinite)
                self.stats.mix_overflows += 1
                why = f"{step} overflowed float32 (a copy near ±3.4e38); x unchanged"
                res.reason = f"{res.reason}; {why}" if res.reason else why
                res.participants, res.missing, res.staleness = [], list(senders), {}
        if not usable and self.mode == "pseudo_gradient" and not self._closed:
            # (a round cut short by close() leaves x alone, as a closed engine's calls do)
            # Nobody to mix: the outer step with y = x (DiLoCo with one worker), so the
            # anchor follows training. Left where it was, it lagged every step trained
            # alone, and the first mixed round applied them all at once, amplified by the
            # momentum: a peer alone for 40 rounds was thrown 1.33× its whole trajectory
            # back when a peer that had bootstrapped from it joined (loss ×8.8).
            self._outer_step_alone()
        if not mixed:
            self.stats.rounds_alone += 1
            if not res.reason:
                res.reason = ("every sender's model has another size (see the warning)"
                              if senders and all(j in self._refused for j in senders)
                              else "no neighbour's state arrived in time" if senders
                              else "the view changed during the round and left it no sender" if began
                              else "alone in the view")
        self._drop_unused_copies(senders)
        # what arrived since the last round, not only during this one: neighbours'
        # messages mostly land while this peer trains between rounds
        res.bytes_in, res.rejected = self._bytes_in, self._rejected
        self._bytes_in, self._rejected = 0, 0
        self.stats.bytes_out += res.bytes_out
        self.stats.dropped_sends += res.dropped
        self.stats.rounds += 1
        self.t = t + 1
        return res

    def _closed_error(self) -> GossipError:
        if self._peer_down:
            return GossipError(f"gossip engine of peer {self.link.id!r}: its peer closed, so it sends and "
                               "receives nothing any more; close the engine before its peer, and build a new "
                               "one on a new peer")
        return GossipError("this gossip engine is closed (it receives nothing); build a new one")

    def _peer_gone(self) -> bool:
        """Whether the peer under this engine closed: then the engine closes too (once), as a
        relay does. Before, a round in flight waited out round_timeout and blamed its
        neighbours ("no neighbour's state arrived in time"), and so did every round after."""
        if not (self._peer_down or self._closed):
            if link_closed(self.link):
                self._peer_down = True
                self.close()
        return self._peer_down

    def _nonfinite(self) -> GossipError:
        # restored in place, x is far from the anchor: the next outer step would take the
        # whole difference for one pseudo-gradient (bootstrap() resets the anchor itself)
        anchor = (" (in pseudo_gradient mode, then call reset_anchor())"
                  if self.mode == "pseudo_gradient" else "")
        return GossipError(f"params hold NaN or Inf; round {self.t} not run (nothing sent, x unchanged): "
                           f"restore them, e.g. from a checkpoint{anchor} or with bootstrap()")

    @property
    def _has_averaged(self) -> bool:
        """Whether any round so far mixed with a neighbour."""
        return self.stats.rounds > self.stats.rounds_alone

    def _senders_now(self, t: int, senders: list[str], w: dict[str, float]) -> tuple[list[str], dict[str, float]]:
        """Round ``t``'s senders and weights now: those the round began with, unless the
        view changed since and a sender of the round (or this peer) left it; then those
        of ``senders`` that the current view makes senders of round ``t`` too, and that
        view's weights.

        Both ends of an edge must mix it with the same weight, or the pair's terms do
        not cancel and the swarm's sum moves. A round that waits on a sender that left
        waits for a view without it, and its neighbours, waiting on it too or starting
        their rounds after that view, mix by the new view: keeping the old weights here
        moved a 3-ring that lost a peer mid-round from 120 to 100 (one survivor mixed
        with 1/3, the other with 1/2). A view that keeps every sender (a member joined)
        changes nothing in the round: a neighbour may have finished it under the old
        view already, and following the new one here (a 3-ring joined by a fourth:
        an edge the new view drops mixed at one end only) moved the sum from 360 to
        280. Ends that see the view at different points of the round still mix with
        different weights (docs/gossip.md). A view the topology cannot take (a
        hypercube of 3) raises at the next round; this one keeps its weights and drops
        only the senders that left."""
        try:
            _, now, _, w_now = self._positions(t)   # cached per view: the same w while it stands
        except ConfigError:
            return [j for j in senders if self._view.index(j) >= 0], w
        if w_now is w or all(self._view.index(j) >= 0 for j in (*senders, self.link.id)):
            return senders, w
        now = set(now)
        return [j for j in senders if j in now], w_now

    def _went_past(self, j: str, t: int) -> bool:
        """Whether ``j`` has sent a message of a round after ``t``: its messages arrive
        in order, so a round-``t`` one that has not come yet never will. (A peer left
        behind on a time-varying graph, after a freeze that took it out of the view,
        waited ``round_timeout`` for a different partner every round and never caught
        up: a 3 s SIGSTOP of one of 5 live peers cost each of them 40 s of waiting.)"""
        c = self._in.get(j)
        return c is not None and bool(c.pending) and c.pending[-1].body["r"] > t

    def _left_behind(self, newest: dict[str, int], t: int) -> dict[str, int]:
        """Of ``newest`` (each sender's latest round, beyond ``t``), those that show the
        swarm went on without this peer, which has sent nothing of round ``t`` or later
        yet (time-varying graphs, lockstep and bounded).

        Plays rounds ``t ..`` of the graph once, with this peer stopped before round
        ``t`` and everyone else as patient as the sync mode says: a peer whose sender of
        round u has sent it nothing since round u − ``max_staleness`` (lockstep: since
        u) stops in round u, after sending that round's message. A sender that stops
        before its round r got to r only because someone gave up waiting for this
        peer, whose rounds before r are then not wanted any more. Otherwise it is ahead
        by the graph alone: its rounds need this peer's state only some rounds later
        (one-peer exponential, n = 4: a peer one round ahead is normal while the others
        start). Messages sent before round ``t`` are taken to have arrived, which errs
        towards keeping the round. A round more than n · (``max_staleness`` + 1) ahead
        counts without playing (a stopped peer stops every other one sooner on a
        connected graph), which bounds the play, O(n) a round, for a joiner far
        behind."""
        ids = self._view.ids
        n = len(ids)
        me = self._view.index(self.link.id)
        slack = self.max_staleness if self.sync == "bounded" else 0
        far = {j: r for j, r in newest.items() if r - t > n * (slack + 1)}
        near = {self._view.index(j): (j, r) for j, r in newest.items() if j not in far}
        near.pop(-1, None)      # a sender the view no longer lists proves nothing
        if me < 0 or not near:
            return far
        kw = dict(edges=topo.within(self.edges, n) if self.topology == "custom" else None, seed=self.seed)
        stopped = {me: t - 1}                 # position -> the last round it sent
        last: dict[tuple[int, int], int] = {}  # (sender, receiver) -> last round sent there
        for u in range(t, max(r for _, r in near.values())):
            senders: list[list[int]] = [[] for _ in range(n)]
            for k, dsts in enumerate(topo.all_receivers(self.topology, n, u, **kw)):
                for dst in dsts:
                    senders[dst].append(k)
                    if k not in stopped:
                        last[k, dst] = u
            for k in range(n):
                if k not in stopped and any(last.get((m, k), t - 1) < u - slack for m in senders[k]):
                    stopped[k] = u
            if all(k in stopped or r <= u + 1 for k, (_, r) in near.items()):
                break   # each has stopped, or got to its round
        return {**far, **{j: r for k, (j, r) in near.items() if stopped.get(k, r) < r}}

    def _copy_round(self, j: str) -> int:
        c = self._in.get(j)
        return c.round if c is not None and c.ver >= 0 else -1

    async def _drain(self, upto: int | None) -> set[str]:
        nacked = set()
        for src in list(self._in):
            copy = self._in.get(src)   # a view installed while a nack below waited drops copies
            if copy is None or not (copy.pending or copy.gap is not None):
                continue
            gaps = self._apply_pending(src, copy, upto)
            if gaps and self._view.index(src) >= 0:
                self.stats.nacks_sent += 1
                nacked.add(src)
                # d: a sender of another size sends this peer nothing more (see _on_nack)
                await self.link.send(src, T_NACK, {"ver": gaps[-1], "d": self.d}, (), timeout=self.send_timeout)
        return nacked

    def _outer_step(self) -> bool:
        """After a mix that x took, ``x`` holds the neighbourhood average y. Pseudo-gradient
        g = anchor − y; Nesterov: m ← μm + g; anchor ← anchor − lr (g + μm); x ← anchor.
        Whether it was taken: a finite y can still step past float32's range (anchor and y
        near ±3.4e38 of opposite signs), and then x goes back to what it was before the mix
        and the anchor and momentum stay as they were, as after a mix overflow."""
        g, m = self._mix_buffers()
        mu = np.float32(self.outer_momentum)
        with np.errstate(over="ignore", invalid="ignore"):   # checked below, before anything is kept
            np.subtract(self._anchor, self.x, out=g)
            np.multiply(self._momentum, mu, out=m)
            m += g
            # the new anchor goes into x (it ends there), which _mix's copy can restore
            np.multiply(m, mu, out=self.x)
            self.x += g
            self.x *= np.float32(self.outer_lr)
            np.subtract(self._anchor, self.x, out=self.x)
        # x = anchor − lr (μm + g) with lr > 0 and 0 <= μ < 1: any Inf or NaN in m or g
        # reaches x (μ = 0 makes 0·inf a NaN), so x's one scan covers all three
        if not _finite(self.x):
            np.copyto(self.x, self._unmixed[0])   # x before the mix, as _mix kept it
            return False
        np.copyto(self._momentum, m)
        np.copyto(self._anchor, self.x)
        return True

    def _outer_step_alone(self) -> None:
        """:meth:`_outer_step` on a round that mixed nobody: y is x as trained. One that
        overflows leaves x, the anchor and the momentum as they were."""
        if self._unmixed is None:
            self._unmixed = np.empty(self.d, np.float32), np.empty(min(self.d, _BLOCK), np.bool_)
        np.copyto(self._unmixed[0], self.x)   # what _outer_step restores on an overflow
        self._outer_step()

    def _mix(self, own: np.ndarray, groups: list[tuple[np.float32, list[np.ndarray]]]) -> bool:
        """``x += Σ_g c_g Σ_{h∈g} (h − own)``, i.e. x += γ Σ_j w_j (x̂_j − x̂_i); whether x
        took it. A result that is not all finite (a float32 sum past ±3.4e38) is undone: x
        is left exactly as it was.

        Differences, not ``Σ c_g Σ h − total · own``: the two ends of an edge then add
        exact opposites, c·(x̂_j − x̂_i) and c·(x̂_i − x̂_j), and the swarm's sum is kept
        to rounding. ``total``, float32(γ Σ w) rounded on its own, is not the sum of the
        float32 weights the neighbours add x̂_i with (float32(6/7) is 6·float32(1/7) +
        3e-8), and every parameter drifted by that factor each round, on every graph but
        the ring: +1.3e-4 of the sum in 4,096 rounds on a full graph of 7.

        One pass over memory, a block at a time: each block of every copy is read
        once and x is written once, through two L2-sized scratch blocks. Whole-
        vector steps made six passes over d and needed 2·d floats of scratch,
        whose first touch cost more than the arithmetic (numpy, not torch:
        torch's thread pool spins against the other peers sharing these cores
        and made this step 40× slower). Each block of x is kept as it was before
        it is written (one more float32[d], reused), and checked while it is in
        cache: a block that overflows after earlier ones were written puts them back."""
        acc, tmp = self._block_buffers()
        if self._unmixed is None:
            self._unmixed = np.empty(self.d, np.float32), np.empty(min(self.d, _BLOCK), np.bool_)
        (was, mask), x, d = self._unmixed, self.x, self.d
        with np.errstate(over="ignore", invalid="ignore"):   # an overflow is handled below, not warned of
            for lo in range(0, d, _BLOCK):
                hi = min(d, lo + _BLOCK)
                a, b = acc[:hi - lo], tmp[:hi - lo]
                mine = own[lo:hi]
                for g, (c, hats) in enumerate(groups):
                    np.subtract(hats[0][lo:hi], mine, out=b)
                    for h in hats[1:]:
                        b += h[lo:hi]
                        b -= mine
                    if g:
                        b *= c
                        a += b
                    else:
                        np.multiply(b, c, out=a)
                np.copyto(was[lo:hi], x[lo:hi])
                x[lo:hi] += a
                if not np.isfinite(x[lo:hi], out=mask[:hi - lo]).all():
                    np.copyto(x[:hi], was[:hi])
                    return False
        return True

    def _block_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        if self._blocks is None:
            self._blocks = np.empty((2, min(self.d, _BLOCK)), np.float32)
        return self._blocks[0], self._blocks[1]

    def _mix_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """Two float32[d] scratch buffers, allocated on first use and then reused
        (never sent, so reusing them cannot race a zero-copy transport)."""
        if self._scratch is None:
            self._scratch = np.empty((2, self.d), np.float32)
        return self._scratch[0], self._scratch[1]

    async def local_step(self) -> RoundResult | None:
        """Count one local training step; every ``local_steps``-th call runs a round.

        One that would run a round raises as :meth:`round` does, without counting: the
        call after a repair (x restored after the NaN error) runs that round."""
        if (self._steps + 1) % self.local_steps:
            self._steps += 1
            return None
        # counted once the round is back: a round that raised (NaN in x, a view the
        # topology cannot take) left the count where it was, and the repaired retry ran
        # no round, leaving its lockstep neighbours to wait out round_timeout for it
        res = await self.round()
        self._steps += 1
        return res

    def reset_anchor(self) -> None:
        """In pseudo-gradient mode, take the current ``x`` as the outer parameters and
        restart the outer momentum at zero. Call it after setting ``x`` from outside
        the engine (a checkpoint loaded in place, x restored after the NaN error): else
        the next outer step takes the whole jump for one pseudo-gradient and carries x
        about lr/(1 − μ) times as far. Does nothing in ``params`` mode."""
        if self._anchor is not None:
            np.copyto(self._anchor, self.x)
            self._momentum.fill(0.0)
