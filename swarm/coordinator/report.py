"""What the status surfaces show: per-peer rows with rates, Prometheus text, a terminal table.

Peers put their figures in the ``stats`` map of one heartbeat a second (the
peer's message and byte counters, its neighbours; the experiment runner adds
env steps, rounds, buffer size ...). Rates are not sent: the coordinator
derives them from successive figures with :class:`PeerRates`, so a peer that
restarts, a counter that goes backwards or one that starts being sent only
resets its own history, and a peer whose figures stop coming has no rates.

Everything in ``stats`` comes off the wire, so it is treated as untrusted:
the coordinator keeps a bounded copy of each member's (:func:`bound_stats`),
what ``status`` replies carry is reduced to what JSON can hold (:func:`plain`),
numbers (rates included) are used only when they are real finite numbers,
strings are cut short, the HTML page and the Prometheus labels escape what
they show, and the terminal table shows control characters as escapes
(:func:`printable`).

    >>> rates = PeerRates()
    >>> rates.observe("p0", 1, 0.0, {"env_steps": 0})
    >>> rates.observe("p0", 1, 2.0, {"env_steps": 500})
    >>> rates.rates("p0", now=2.5)["env_steps"]
    250.0
    >>> rates.rates("p0", now=9.0)["env_steps"] is None   # no figures for 7 s
    True
"""

from __future__ import annotations

import math
import time
import unicodedata
from collections import deque
from itertools import islice
from typing import Any, Iterable

from ..checks import printable

__all__ = ["PeerRates", "peer_rows", "status_document", "prometheus", "format_table", "plain", "bound_stats",
           "printable", "unreachable_ids", "has_left", "RATE_KEYS", "MAX_STAT_TEXT", "MAX_STAT_ITEMS",
           "MAX_STATS_SIZE", "STANDBY_NOTE"]

#: counters whose per-second rate the coordinator derives from heartbeats
RATE_KEYS = ("env_steps", "rounds", "bytes_in", "bytes_out")
#: counts of messages set aside, shown per peer when the peer sends them: its transport's
#: (``PeerCounters``) and, with ``gossip.exchange = gradients``, its relay's (``relay_*``)
LOSS_KEYS = ("dropped_out", "malformed", "unlisted", "unknown_dst", "held", "held_in", "relay_held_dropped",
             "relay_stale", "relay_unlisted")

_MAX_TEXT = 200   # longest string copied from a peer's stats into a row

#: the line under a standby coordinator's mode in the terminal tables: its table has no
#: members, which read as a swarm without peers
STANDBY_NOTE = "this coordinator stands by: its table lists no members until it takes over"

#: a coordinator sends a ``status`` reply again for up to 0.25 s (server.STATUS_CACHE_S),
#: its ages as of when it was built, so the same figures come stamped up to that much
#: later (rounded to 10 ms): within this of the last stamp, equal figures are those again
_SAME_FIGURES_S = 0.3

#: longest string the coordinator keeps of a member's stats (a longer one is cut; a
#: longer map key is left out): peer ids are at most 256 characters (wire.MAX_SRC_LEN)
MAX_STAT_TEXT = 256
#: most items the coordinator keeps of each list or map in a member's stats
MAX_STAT_ITEMS = 64
#: about the most characters the coordinator keeps of one member's stats (each value
#: counts 1, a string or key 1 + its length); what comes past it is left out. A peer's
#: own figures take a few hundred; without a bound, a few members with a heartbeat of
#: long strings each made the ``status`` reply too big to send
MAX_STATS_SIZE = 8192


def num(v: Any) -> float | int | None:
    """``v`` if it is a finite int or float (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _text(v: Any) -> str:
    return v[:_MAX_TEXT] if isinstance(v, str) else ""


def plain(v: Any, depth: int = 0) -> Any:
    """``v`` reduced to what JSON holds: maps with string keys, lists, strings, finite
    numbers, booleans and None. Bytes, non-finite floats, other keys and anything
    nested deeper than 4 levels become None or are left out, so that a peer's stats
    can be printed by ``swarm status --json`` whatever the peer sent."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if depth < 4 and isinstance(v, list):
        return [plain(x, depth + 1) for x in v]
    if depth < 4 and isinstance(v, dict):
        return {k: plain(x, depth + 1) for k, x in v.items() if isinstance(k, str)}
    return None


def bound_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """What the coordinator keeps of one heartbeat's ``stats``: :func:`plain`'s reduction
    with strings cut to :data:`MAX_STAT_TEXT` characters, lists and maps to their first
    :data:`MAX_STAT_ITEMS` items, and the whole to about :data:`MAX_STATS_SIZE` (later
    items left out), so that each member adds a bounded amount to a ``status`` reply
    however its heartbeats fill the message.

    >>> bound_stats({"env_steps": 5, "last_error": "x" * 1000, "nested": {"deep": [b"?"]}})["nested"]
    {'deep': [None]}
    """
    left = [MAX_STATS_SIZE]
    out = _bounded(stats, 0, left)
    return out if isinstance(out, dict) else {}


def _bounded(v: Any, depth: int, left: list[int]) -> Any:
    # Every value looked at costs at least 1 of ``left``, also one left out, so the walk
    # takes at most MAX_STATS_SIZE steps however the heartbeat nests.
    if isinstance(v, str):
        v = v[:MAX_STAT_TEXT]
        left[0] -= 1 + len(v)
        return v
    left[0] -= 1
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if depth < 4 and isinstance(v, list):
        items: list[Any] = []
        for x in islice(v, MAX_STAT_ITEMS):
            if left[0] <= 0:
                break
            y = _bounded(x, depth + 1, left)
            if left[0] < 0:
                break   # it did not fit: left out
            items.append(y)
        return items
    if depth < 4 and isinstance(v, dict):
        fields: dict[str, Any] = {}
        for k, x in islice(v.items(), MAX_STAT_ITEMS):
            if left[0] <= 0:
                break
            if not isinstance(k, str) or len(k) > MAX_STAT_TEXT:
                left[0] -= 1
                continue
            left[0] -= len(k)
            y = _bounded(x, depth + 1, left)
            if left[0] < 0:
                break
            fields[k] = y
        return fields
    return None


def _columns(c: str) -> int:
    """Terminal columns a printable character takes: 2 for a wide East Asian one, none for
    a combining mark (drawn over the character before it), else 1."""
    if unicodedata.category(c) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _fit(s: Any, width: float) -> tuple[str, int]:
    r"""``s`` as :func:`printable` shows it, cut to at most ``width`` terminal columns, and
    the columns it takes. Cut only between whole characters and whole escapes: cut by
    characters, an ESC (``\x1b``) could show as ``\x``, and wide characters overran.

    >>> _fit("ab\x1bcd", 5), _fit("ab\x1bcd", 6), _fit("日本語", 5)
    (('ab', 2), ('ab\\x1b', 6), ('日本', 4))
    """
    s = str(s)
    if s.isascii() and s.isprintable():
        if len(s) > width:
            s = s[:int(width)]
        return s, len(s)
    out: list[str] = []
    used = 0
    for c in s:
        text = printable(c)
        w = _columns(c) if text == c else len(text)
        if used + w > width:
            break
        out.append(text)
        used += w
    return "".join(out), used


def pad(s: Any, cols: int) -> str:
    """``s`` as :func:`printable` shows it, with spaces after it up to ``cols`` terminal
    columns (not cut where it takes more): ``f"{s:<{cols}}"`` by what a terminal shows,
    where that counts characters (a wide one takes 2 columns, a combining one none)."""
    text, used = _fit(s, math.inf)
    return text + " " * (cols - used)


def columns(s: Any) -> int:
    """The terminal columns that ``s`` takes as :func:`printable` shows it."""
    return _fit(s, math.inf)[1]


def _row(cells: list[tuple[Any, int | None]], width: int) -> str:
    """One terminal line of ``(text, columns)`` cells, each shown through :func:`printable`,
    cut and padded to its columns by what the terminal shows (None: as wide as it is), so
    that the columns after an id line up whatever it holds; the whole cut to ``width``."""
    out: list[str] = []
    left = width
    for text, cols in cells:
        room = left if cols is None else min(cols, left)
        s, used = _fit(text, room)
        if cols is not None:
            s, used = s + " " * (room - used), room
        out.append(s)
        left -= used
    return "".join(out)


class PeerRates:
    """Per-second rates of each peer's counters over a sliding window of heartbeats.

    ``observe`` is cheap and idempotent for a heartbeat already seen (same
    time stamp), so it can be fed from a periodic sampler of the member table
    or from successive ``status`` replies.

    The history restarts when a counter goes backwards (the peer restarted its
    counting) and when one that was not sent comes: the experiment runner sends its
    figures once it trains, and a peer resumed from a checkpoint then counts the
    traffic carried over from it too, so its byte counters jump by the traffic of the
    processes before (a rate over that jump showed 5-20 times the real one).
    """

    def __init__(self, window_s: float = 5.0, min_span_s: float = 0.2) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._hist: dict[str, tuple[int, deque[tuple[float, tuple[Any, ...]]]]] = {}

    def observe(self, peer_id: str, incarnation: int, t: float, stats: dict[str, Any],
                same_s: float = 0.0) -> None:
        """Record the counters of one heartbeat received at time ``t`` (seconds). Figures
        equal to the last ones and stamped less than ``same_s`` after them are those again
        (a reply sent again), not new ones."""
        entry = self._hist.get(peer_id)
        if entry is None or entry[0] != incarnation:
            entry = (incarnation, deque())
            self._hist[peer_id] = entry
        dq = entry[1]
        if dq:
            t_last, last = dq[-1]
            if t <= t_last:
                return   # seen already (sampled again before new figures came)
        vals = tuple(num(stats.get(k)) for k in RATE_KEYS)
        if dq and t - t_last < same_s and vals == last:
            return   # a later stamp of the same figures would bend the rates
        if dq:
            # a counter that went backwards: the peer restarted its counting; one that
            # came: the peer started other figures, which may go on from a checkpoint's
            if any(b is not None and (a is None or b < a) for a, b in zip(last, vals)):
                dq.clear()
        dq.append((t, vals))
        while len(dq) > 2 and t - dq[1][0] >= self.window_s:
            dq.popleft()

    def rates(self, peer_id: str, now: float | None = None) -> dict[str, float | None]:
        """``{counter: per second}`` over the window; None where not yet known.

        ``now``: the time on the clock of ``observe``'s stamps. With it, a peer whose
        newest figures are older than the window (or than twice the gap between its
        last two, when its figures come further apart) has no rates: its figures stopped
        coming, and the last window's rate would be shown as current.
        """
        entry = self._hist.get(peer_id)
        out: dict[str, float | None] = dict.fromkeys(RATE_KEYS)
        if entry is None or len(entry[1]) < 2:
            return out
        dq = entry[1]
        (t0, v0), (t1, v1) = dq[0], dq[-1]
        if t1 - t0 < self.min_span_s:
            return out
        if now is not None and now - t1 > max(self.window_s, 2 * (t1 - dq[-2][0])):
            return out
        for k, a, b in zip(RATE_KEYS, v0, v1):
            if a is not None and b is not None:
                # finite figures can still make an infinite rate (1e308 after 0)
                out[k] = num((b - a) / (t1 - t0))
        return out

    def forget_except(self, keep: Iterable[str]) -> None:
        """Drop the history of peers no longer in the table."""
        keep = set(keep)
        for pid in [p for p in self._hist if p not in keep]:
            del self._hist[pid]

    def observe_rows(self, rows: Iterable[dict[str, Any]], now: float | None = None) -> None:
        """Feed ``status`` rows, e.g. in a client: each row's figures are stamped with
        when they arrived (``stats_age_s``), not with its last heartbeat, which is
        most often a bare beat that came up to a second later."""
        now = time.monotonic() if now is None else now
        seen = []
        for r in rows:
            seen.append(r["id"])
            # a coordinator from before stats_age_s: the heartbeat age is the best there is
            age = num(r.get("stats_age_s", r.get("heartbeat_age_s")))
            if age is not None and isinstance(r.get("stats"), dict):
                # ages are rounded to 1 ms; round the stamp too so figures seen
                # again in the next reply are recognised as the same ones
                self.observe(r["id"], r.get("incarnation", 0), round(now - age, 2), r["stats"],
                             same_s=_SAME_FIGURES_S)
        self.forget_except(seen)


def unreachable_ids(stats: Any) -> list[str]:
    """The members a peer's links cannot reach, from its stats (``unreachable_ids``):
    the string ids only, each cut to :data:`MAX_STAT_TEXT`, at most 64."""
    ids = stats.get("unreachable_ids") if isinstance(stats, dict) else None
    return [n[:MAX_STAT_TEXT] for n in ids if isinstance(n, str)][:64] if isinstance(ids, list) else []


def has_left(row: dict[str, Any]) -> bool:
    """Whether a status row is of a member that left (a ``leave``): dead, by its own wish."""
    return row.get("state") == "dead" and row.get("cause") == "left"


def peer_rows(status: dict[str, Any], rates: PeerRates, now: float | None = None) -> list[dict[str, Any]]:
    """One flat row per member: the table's fields, the figures from its stats, its rates
    (as of ``now`` on ``rates``' clock, by default ``time.monotonic()``: see :meth:`PeerRates.rates`).

    ``last_error`` is the peer's own (its stats'), else the coordinator's cause of its
    death, but for a member that left (``left``: a state, not an error), led by the
    members an alive one cannot reach."""
    now = time.monotonic() if now is None else now
    out = []
    for r in status.get("members", []):
        s = r.get("stats") if isinstance(r.get("stats"), dict) else {}
        dead = r.get("state") == "dead"
        rt = rates.rates(r["id"], now) if not dead else dict.fromkeys(RATE_KEYS)
        errors = [_text(s.get("last_error")) or ("" if has_left(r) else _text(r.get("cause")))]
        unreachable = unreachable_ids(s) if not dead else []   # a dead member's last figures are stale
        if unreachable:
            errors.insert(0, f"cannot reach {', '.join(unreachable)}")
        out.append({
            "id": r["id"], "rank": r.get("rank"), "addr": r.get("addr"), "state": r.get("state"),
            "left": has_left(r),
            "incarnation": r.get("incarnation"), "heartbeat_age_s": r.get("heartbeat_age_s"),
            "linked_epoch": r.get("linked_epoch"),
            "neighbours": [n[:MAX_STAT_TEXT] for n in r.get("neighbours", []) if isinstance(n, str)][:64],
            "env_steps": num(s.get("env_steps")), "env_steps_per_s": num(rt["env_steps"]),
            "rounds": num(s.get("rounds")), "rounds_per_s": num(rt["rounds"]),
            "bytes_in": num(s.get("bytes_in")), "bytes_out": num(s.get("bytes_out")),
            "bytes_in_per_s": num(rt["bytes_in"]), "bytes_out_per_s": num(rt["bytes_out"]),
            "gossip_bytes_in": num(s.get("gossip_bytes_in")), "gossip_bytes_out": num(s.get("gossip_bytes_out")),
            "codec_ratio": num(s.get("codec_ratio")), "staleness": num(s.get("staleness")),
            "buffer_size": num(s.get("buffer_size")), "mean_return": num(s.get("mean_return")),
            "under_replicated": num(s.get("under_replicated")), "last_error": "; ".join(e for e in errors if e),
            "unreachable": None if dead else num(s.get("unreachable")),   # stale, as the ids above
            # what the peer's transport (and, with gradient exchange, its relay) set aside
            **{k: num(s.get(k)) for k in LOSS_KEYS},
        })
    return out


def status_document(status: dict[str, Any], rates: PeerRates, run: str = "", http: str = "",
                    now: float | None = None) -> dict[str, Any]:
    """What ``/status.json`` serves and the page renders: run, epoch, peers, the event log,
    and with standby coordinators this one's mode and how it sees the others (rates as
    of ``now``: :func:`peer_rows`)."""
    peers = peer_rows(status, rates, now)
    others = status.get("others")
    return {
        "run": run, "coordinator": status.get("coordinator"), "http": http, "pid": status.get("pid"),
        "mode": _text(status.get("mode")), "others": plain(others) if isinstance(others, list) else [],
        "epoch": status.get("epoch"), "uptime_s": status.get("uptime_s"),
        "members": len(status.get("view", {}).get("members", [])),
        "malformed": status.get("malformed", 0),
        "peers": peers,
        "log": [{"time": t, "event": ev, "peer": pid} for t, ev, pid in status.get("log", [])],
    }


# ---------------------------------------------------------------- Prometheus

def _label(v: Any) -> str:
    s = str(v)
    return s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _fmt(v: float | int) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


# (metric, type, help, row key)
_PEER_METRICS = [
    ("swarm_peer_up", "gauge", "1 if the peer is alive or suspect, 0 if dead", None),
    ("swarm_peer_heartbeat_age_seconds", "gauge", "seconds since the peer's last heartbeat", "heartbeat_age_s"),
    ("swarm_peer_neighbours", "gauge", "number of neighbours the peer reports", None),
    ("swarm_peer_env_steps_total", "counter", "environment steps taken", "env_steps"),
    ("swarm_peer_env_steps_per_second", "gauge", "environment steps per second (from heartbeats)",
     "env_steps_per_s"),
    ("swarm_peer_rounds_total", "counter", "gossip rounds done", "rounds"),
    ("swarm_peer_rounds_per_second", "gauge", "gossip rounds per second (from heartbeats)", "rounds_per_s"),
    ("swarm_peer_bytes_in_total", "counter", "bytes received by the peer", "bytes_in"),
    ("swarm_peer_bytes_out_total", "counter", "bytes sent by the peer", "bytes_out"),
    ("swarm_peer_bytes_in_per_second", "gauge", "bytes received per second (from heartbeats)", "bytes_in_per_s"),
    ("swarm_peer_bytes_out_per_second", "gauge", "bytes sent per second (from heartbeats)", "bytes_out_per_s"),
    ("swarm_peer_codec_ratio", "gauge", "compressed size / dense size of gossip deltas", "codec_ratio"),
    ("swarm_peer_staleness_rounds", "gauge", "rounds the peer's freshest neighbour data lags", "staleness"),
    ("swarm_peer_buffer_items", "gauge", "items in the peer's replay buffer", "buffer_size"),
    ("swarm_peer_under_replicated_items", "gauge",
     "local replay items that fewer than buffer.replicas neighbours hold", "under_replicated"),
    ("swarm_peer_mean_return", "gauge", "mean episode return", "mean_return"),
    ("swarm_peer_unreachable_neighbours", "gauge",
     "neighbours the peer cannot reach now (no handshake for the link's connect timeout)", "unreachable"),
    ("swarm_peer_dropped_out_total", "counter", "sends dropped: the send queue stayed full past the deadline",
     "dropped_out"),
    ("swarm_peer_malformed_total", "counter", "inbound messages that failed a wire check", "malformed"),
    ("swarm_peer_unlisted_total", "counter",
     "inbound messages (keys) from a sender the view no longer listed, dropped", "unlisted"),
    ("swarm_peer_unknown_dst_total", "counter", "sends to a peer not in the view (or that could not be linked)",
     "unknown_dst"),
    ("swarm_peer_held_total", "counter", "sends held until the view listed their destination", "held"),
    ("swarm_peer_held_in_total", "counter", "inbound messages held until the view listed their sender (keys)",
     "held_in"),
    ("swarm_peer_relay_held_dropped_total", "counter",
     "relayed gradients held for a sender the view did not list, then dropped", "relay_held_dropped"),
    ("swarm_peer_relay_stale_total", "counter",
     "relayed gradients dropped as more than the window late (may have been first copies)", "relay_stale"),
    ("swarm_peer_relay_unlisted_total", "counter",
     "relayed gradients (keys) from a sender the view no longer listed, dropped", "relay_unlisted"),
]


def prometheus(doc: dict[str, Any]) -> str:
    """The status document in the Prometheus text exposition format (version 0.0.4). A dead
    member (crashed or left) has ``swarm_peer_up 0`` and its counters only, none of its gauges."""
    run = _label(doc.get("run") or "")
    lines = []

    def head(name: str, kind: str, help_: str) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")

    head("swarm_coordinator_uptime_seconds", "gauge", "seconds since the coordinator started")
    lines.append(f'swarm_coordinator_uptime_seconds{{run="{run}"}} {_fmt(doc.get("uptime_s") or 0.0)}')
    # a standby's page has no members: without this it read as an active swarm with no peers
    head("swarm_coordinator_active", "gauge",
         "1 on the active coordinator, 0 on a standby (whose member metrics are empty until it takes over)")
    lines.append(f'swarm_coordinator_active{{run="{run}"}} {int(doc.get("mode") == "active")}')
    head("swarm_epoch", "gauge", "current membership epoch")
    lines.append(f'swarm_epoch{{run="{run}"}} {_fmt(doc.get("epoch") or 0)}')
    head("swarm_members", "gauge", "members by state")
    counts = {"alive": 0, "suspect": 0, "dead": 0}
    for p in doc["peers"]:
        if p["state"] in counts:
            counts[p["state"]] += 1
    for state, n in counts.items():
        lines.append(f'swarm_members{{run="{run}",state="{state}"}} {n}')
    head("swarm_coordinator_malformed_total", "counter", "messages the coordinator rejected")
    lines.append(f'swarm_coordinator_malformed_total{{run="{run}"}} {_fmt(doc.get("malformed") or 0)}')
    for name, kind, help_, key in _PEER_METRICS:
        head(name, kind, help_)
        for p in doc["peers"]:
            if name == "swarm_peer_up":
                v: Any = int(p["state"] != "dead")
            elif kind == "gauge" and p["state"] == "dead":
                # crashed or left, listed for a while: its gauges are its last figures, which a sum
                # or an average over the swarm would count; its counters stay (they do not go back)
                continue
            elif name == "swarm_peer_neighbours":
                v = len(p["neighbours"])
            else:
                v = num(p.get(key))
            if v is None:
                continue
            lines.append(f'{name}{{run="{run}",peer="{_label(p["id"])}",rank="{_label(p["rank"])}"}} {_fmt(v)}')
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- terminal

def si(v: Any, unit: str = "") -> str:
    """A number in a few characters (``12.3k``; ``-123.4k`` is the longest below 1e12), ``-``
    for none; the page's JS formats alike. The terminal table fits it to a column (:func:`_number`)."""
    v = num(v)
    if v is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{_to_fixed(v / div, 1)}{suffix}{unit}"
    return _to_fixed(v, 0 if abs(v) >= 10 or v == int(v) else 1) + unit


def fixed(v: Any, digits: int) -> str:
    """``v`` with ``digits`` decimals, ``-`` for none."""
    v = num(v)
    return "-" if v is None else _to_fixed(v, digits)


def _number(v: Any, width: int, digits: int | None = None, unit: str = "") -> str:
    """``v`` in at most ``width`` characters for a column of the terminal table: as
    :func:`si` writes it (or :func:`fixed` with ``digits``) where that fits, else with
    fewer decimals or a larger suffix (up to E), else in e-notation, else ``#`` × width.
    A wider cell pushed every column after it out of line (``12.3k`` in rank's 4).

    >>> _number(12345, 4), _number(12.5, 5, digits=3), _number(-123456, 5), _number(1e30, 4)
    ('12k', '12.50', '-123k', '1e30')
    """
    text = si(v, unit) if digits is None else fixed(v, digits)
    x = num(v)
    if len(text) <= width or x is None:
        return text
    tries = [fixed(x, d) + unit for d in range(digits or 0, -1, -1)]
    for div, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P"), (1e18, "E")):
        if div <= abs(x) < 1000 * div or (suffix == "E" and abs(x) >= div):
            tries += [f"{_to_fixed(x / div, 1)}{suffix}{unit}", f"{_to_fixed(x / div, 0)}{suffix}{unit}"]
    tries.append(f"{x:.0e}".replace("e+", "e") + unit)
    return next((t for t in tries if len(t) <= width), "#" * width)


def _to_fixed(v: float, digits: int) -> str:
    """``v`` with ``digits`` decimals as JavaScript's ``toFixed`` writes it (ECMA-262
    Number.prototype.toFixed), so that the page reads the same before and after its JS
    redraws it. Python's format() differs: it rounds an exact tie to even (1.25 → 1.2,
    JS 1.3), writes -0.0 with its sign and 1e21 in full."""
    v = float(v)   # what the page's JSON.parse makes of an int, too
    if abs(v) >= 1e21:
        return repr(v)   # toFixed gives up on decimals here: JS's shortest form, as repr's (1e+21)
    # the exact value of the double times 10**digits, rounded to the nearer integer and
    # on a tie to the larger magnitude, as the spec says
    n, d = abs(v).as_integer_ratio()
    q, r = divmod(n * 10**digits, d)
    if 2 * r >= d:
        q += 1
    text = str(q).rjust(digits + 1, "0")
    if digits:
        text = f"{text[:-digits]}.{text[-digits:]}"
    return ("-" if v < 0 else "") + text


def format_table(doc: dict[str, Any], width: int = 160) -> str:
    """The status document as a terminal table (what ``swarm status --watch`` redraws).
    What peers sent (ids, errors, the event log) is shown through :func:`printable`; a
    cell is cut between whole characters and escapes and padded by the columns the
    terminal gives it (2 for a wide character), so the columns line up whatever an id
    holds, and a line is cut to ``width`` columns alike."""
    run = f"{doc['run']}  " if doc.get("run") else ""
    lines = [f"{run}coordinator {doc.get('coordinator')}  epoch {doc.get('epoch')}  "
             f"uptime {num(doc.get('uptime_s')) or 0:.1f} s  members {doc.get('members')}"
             + (f"  page {doc['http']}" if doc.get("http") else "")]
    if doc.get("others"):
        # failover: this one's mode, and each other coordinator as it sees it (and why it cannot tell)
        seen = []
        for o in doc["others"]:
            if isinstance(o, dict):
                error = _text(o.get("error"))
                seen.append(f"{_text(o.get('address'))}: {_text(o.get('state'))}" + (f" ({error})" if error else ""))
        # cut by the columns the terminal shows, between whole escapes (by characters and
        # before escaping, the line ran past the terminal and could end inside an escape)
        lines.append(_fit(f"mode {doc.get('mode')}  " + "  ".join(seen), width)[0])
        if doc.get("mode") == "standby":
            lines.append(_fit(STANDBY_NOTE, width)[0])
    head = (f"{'id':<16} {'rank':>4} {'state':<7} {'hb age':>6} {'steps/s':>8} {'rounds/s':>8} "
            f"{'in/s':>7} {'out/s':>7} {'ratio':>5} {'stale':>5} {'buffer':>7}  {'neighbours':<20} error")
    lines += [head, "-" * len(head)]
    for p in doc["peers"]:
        age, ratio = _number(p["heartbeat_age_s"], 6, digits=2), _number(p["codec_ratio"], 5, digits=3)
        figures = (f" {age:>6} {_number(p['env_steps_per_s'], 8):>8} {_number(p['rounds_per_s'], 8):>8} "
                   f"{_number(p['bytes_in_per_s'], 7, unit='B'):>7} {_number(p['bytes_out_per_s'], 7, unit='B'):>7} "
                   f"{ratio:>5} {_number(p['staleness'], 5):>5} {_number(p['buffer_size'], 7):>7}  ")
        state = "left" if p.get("left") else p["state"]
        lines.append(_row([(p["id"], 16), (f" {_number(p['rank'], 4):>4} ", None), (state, 7), (figures, None),
                           (",".join(p["neighbours"]), 20), (" ", None), (p["last_error"], None)], width))
    recent = doc.get("log", [])[-5:]
    if recent:
        lines.append("")
        for e in recent:
            event, cols = _fit(e["event"], math.inf)   # not cut: "suspected by" names the suspecting peer
            lines.append(f"{time.strftime('%H:%M:%S', time.localtime(e['time']))}  {event}{' ' * (20 - cols)} "
                         f"{printable(e['peer'])}")
    # and whatever else reaches the terminal (the run's name, another coordinator's error),
    # each line cut to the terminal: the title, the header and its rule too, which wrapped
    # at 80 columns (118 wide) while the rows were cut, and stood no longer over their columns
    return "\n".join(_fit(line, width)[0] for line in lines)
