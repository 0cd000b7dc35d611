"""Typed configuration: dataclasses, TOML/JSON files, ``--set a.b=v`` overrides.

Every config class is a dataclass with a help text on each field (the ``help``
metadata), which :func:`to_toml` writes above each key: `swarm run --show` shows an
experiment spec's so. The peer's and the coordinator's keys (``--config``, ``--set
peer.KEY=VALUE``) have no such listing: their ``--help`` shows the flags only, and
``docs/`` name the keys where they use them. Loading checks every key and value; an
error names the full key (``peer.heartbeat_s``) and the bad value.

    >>> cfg = load_config("swarm.toml", overrides=["peer.topology=grid"])
    >>> cfg.peer.topology
    'grid'
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
import textwrap
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from .checks import is_int, is_real, nonneg
from .errors import ConfigError

__all__ = [
    "PeerConfig",
    "CoordinatorConfig",
    "SwarmConfig",
    "load_config",
    "from_dict",
    "to_dict",
    "to_toml",
    "apply_overrides",
    "read_file",
    "opt",
]

T = TypeVar("T")


def opt(default: Any, help: str, check: Callable[[Any], bool] | None = None,
        why: str = "", path: bool = False, **kw: Any) -> Any:
    """A dataclass field with a help text and an optional value check. A ``path`` field
    names a file or folder: :func:`from_dict` expands a ``~`` at its start."""
    meta = {"help": help, "check": check, "why": why, "path": path}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _positive(x: Any) -> bool:
    return x > 0


# Settings that become libzmq socket options have libzmq's bounds: a value past them
# failed in setsockopt when the first socket was made, not when the config was read.

#: largest ``data_hwm``: libzmq keeps a high-water mark in a C int
MAX_HWM = 2**31 - 1

#: largest ``max_message_mb`` (1 TiB): libzmq's MAXMSGSIZE is an int64 of bytes, and a
#: larger message could not be held in memory anyway
MAX_MESSAGE_MB = 1024 * 1024

#: largest ``coordinator.max_members``: a view's member list is one msgpack array, and a
#: peer decodes none longer than wire.Limits.max_array_len (100,000)
MAX_VIEW_MEMBERS = 100_000

#: largest ZMTP heartbeat interval or timeout, in seconds: libzmq keeps the timeout
#: (its HEARTBEAT_TTL) in 16 bits of deciseconds, at most 6553.5 s
MAX_ZMTP_S = 6553.0


#: longest ``peer.id``: every message carries its sender's id, and a peer decodes none
#: longer than wire.MAX_SRC_LEN (not imported: this module stays free of zmq and numpy)
MAX_PEER_ID = 256

#: largest ``peer.rank``: far more members than a view holds (MAX_VIEW_MEMBERS); a rank
#: past a C int is a typo, which failed only at the join (past 64 bits msgpack cannot send it)
MAX_RANK = 2**31 - 1


def _hwm(x: Any) -> bool:
    return 0 < x <= MAX_HWM


def _message_mb(x: Any) -> bool:
    return 0 < x <= MAX_MESSAGE_MB


def _zmtp_s(x: Any) -> bool:
    return 0.001 <= x <= MAX_ZMTP_S   # libzmq counts milliseconds: below 1 ms is 0, heartbeats off


_ZMTP_WHY = f"must be in 0.001..{MAX_ZMTP_S:g} s (libzmq's bounds on ZMTP heartbeats, in milliseconds)"


def _host_port(x: Any) -> bool:
    host, sep, port = str(x).rpartition(":")
    # the length first: int() of over 4,300 digits raises ValueError
    return x == "" or (bool(sep and host) and port.isascii() and port.isdigit() and len(port) <= 5
                       and int(port) <= 65535)


def _label(x: Any) -> bool:
    # shown on the page and in /metrics labels: a lone surrogate (a non-UTF-8 byte of argv)
    # cannot be encoded, and took both pages down with a traceback on every request
    return isinstance(x, str) and len(x) <= 200 and x.isprintable()


def _advertisable(x: Any) -> bool:
    # neighbours connect to it: a typo here would fail in every one of them, not in this peer
    from .transport import dial_address_error  # noqa: PLC0415 - the coordinator's own rule

    return x == "" or not dial_address_error(x)


@dataclass
class PeerConfig:
    """How a peer joins, heartbeats and links to its neighbours."""

    # printable, as _label: a lone surrogate (a non-UTF-8 byte of argv) failed only at the
    # join, as a wire error naming neither --id nor peer.id; a line break split output lines
    id: str = opt("", f"peer id, at most {MAX_PEER_ID} printable characters; empty means HOSTNAME-PID (-2, "
                      "-3, ... for later Peers of one process)",
                  lambda s: len(s) <= MAX_PEER_ID and s.isprintable(),
                  f"must be at most {MAX_PEER_ID} characters (a message's sender id), all printable: no line "
                  "breaks, control characters or bytes that are not UTF-8")
    bind: str = opt("tcp://127.0.0.1:*", "ROUTER address to bind; a * port picks a free one")
    advertise: str = opt("", "address other peers connect to (behind NAT); empty means the bound address",
                         _advertisable, "must be tcp://HOST:PORT with a fixed port (the one bind binds) and a HOST "
                         "others can dial (not 0.0.0.0, which only binds every interface), or empty")
    inbox_port: int = opt(0, "port of the direct gradient relay's inbox (gossip.exchange = gradients), bound "
                             "on the bind host and advertised with the advertised host: fix it to forward it "
                             "behind NAT; 0 picks a free one", lambda p: 0 <= p <= 65535, "must be in 0..65535")
    coordinators: list[str] = opt([], "coordinator addresses, primary first")
    rank: int = opt(-1, "requested rank; -1 lets the coordinator pick", lambda r: -1 <= r <= MAX_RANK,
                    f"must be in -1..{MAX_RANK}")
    replace: bool = opt(False, "take over the role (rank) of the dead member whose id this peer uses")
    topology: str = opt("ring", "neighbour topology for links: ring, grid, torus, exponential, full ...")
    edges: list[list[int]] = opt([], "edge list [[i, j], ...] when topology = custom, over positions in the "
                                 "view (members sorted by rank: 0 is the lowest rank alive), not over ranks")
    heartbeat_s: float = opt(0.25, "interval between heartbeats to the coordinator (liveness comes from "
                             "ZMTP heartbeats; these carry figures and refresh the route)", _positive,
                             "must be > 0")
    join_timeout_s: float = opt(5.0, "deadline for the coordinator to answer a join; also how long views of a "
                                "size the topology takes no neighbours in (a hypercube of 3, while peers join) may "
                                "last before a warning", _positive, "must be > 0")
    link_heartbeat_s: float = opt(0.1, "ZMTP heartbeat interval on peer links (detects frozen neighbours); "
                                  f"at most {MAX_ZMTP_S:g} s", _zmtp_s, _ZMTP_WHY)
    link_timeout_s: float = opt(0.3, f"ZMTP heartbeat timeout on peer links; at most {MAX_ZMTP_S:g} s",
                                _zmtp_s, _ZMTP_WHY)
    coordinator_timeout_s: float = opt(1.0, "while joining, how long a coordinator may stay silent before the "
                                       "next address in `coordinators` is tried", _positive, "must be > 0")
    data_hwm: int = opt(8, "high-water mark (messages) of each data link", _hwm,
                        f"must be in 1..{MAX_HWM} (libzmq keeps a high-water mark in a C int)")
    max_message_mb: int = opt(512, f"largest message accepted, in MiB (ZMQ MAXMSGSIZE); at most {MAX_MESSAGE_MB} "
                              "(1 TiB)", _message_mb, f"must be in 1..{MAX_MESSAGE_MB} (1 TiB)")
    keys_dir: str = opt("", "CurveZMQ key folder from `swarm keys generate` (~ is the home folder); empty: no "
                        "encryption", path=True)
    key_name: str = opt("peer", "this peer's key pair in keys_dir")

    def validate(self) -> None:
        from .gossip.topology import TOPOLOGIES  # noqa: PLC0415 (numpy, only when a config is checked)
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"peer.topology = {self.topology!r}: unknown; choose one of {', '.join(TOPOLOGIES)}")
        if self.topology == "custom" and not self.edges:
            raise ConfigError("peer.edges: topology = custom needs an edge list [[i, j], ...]")
        if self.edges and self.topology != "custom":
            raise ConfigError(f"peer.edges is only used with topology = custom, not {self.topology!r}")
        if self.advertise and self.bind.rpartition(":")[2] in ("*", "0"):
            # the port bound is drawn at start, so the one advertised is another: no neighbour could link
            raise ConfigError(f"peer.advertise = {self.advertise!r} with peer.bind = {self.bind!r}: an advertised "
                              "address needs a fixed port to forward to it; bind that port (--bind "
                              "tcp://HOST:PORT), or leave peer.advertise empty to advertise the address bound")
        for e in self.edges:
            if len(e) != 2 or min(e) < 0 or e[0] == e[1]:
                raise ConfigError(f"peer.edges: {e!r} is not a pair of two different positions")
            if max(e) > MAX_RANK:   # the topology refuses it once a view comes: a peer with no neighbours
                raise ConfigError(f"peer.edges: {e!r} names a position past the largest; positions are at most {MAX_RANK}")


@dataclass
class CoordinatorConfig:
    """Membership and failure detection settings of the coordinator."""

    bind: str = opt("tcp://127.0.0.1:5555", "ROUTER address the coordinator binds")
    heartbeat_timeout_s: float = opt(5.0, "heartbeat silence after which a peer is suspected and probed; "
                                     "long, because a peer whose Python is busy (a big gossip step) is "
                                     "alive: crashes and freezes are caught by the connection and ZMTP",
                                     _positive, "must be > 0")
    probe_timeout_s: float = opt(1.0, "deadline for a suspected peer to answer a direct probe",
                                 _positive, "must be > 0")
    zmtp_heartbeat_s: float = opt(0.1, "ZMTP heartbeat interval on peer connections (libzmq answers "
                                  "these, so only a frozen or dead process misses them); at most "
                                  f"{MAX_ZMTP_S:g} s", _zmtp_s, _ZMTP_WHY)
    zmtp_timeout_s: float = opt(0.3, "ZMTP heartbeat timeout: a frozen peer is detected after about this long; "
                                f"at most {MAX_ZMTP_S:g} s", _zmtp_s, _ZMTP_WHY)
    rejoin_grace_s: float = opt(0.3, "after a (re)start, how long to gather re-joins before the first view",
                                nonneg, "must be >= 0")
    tick_s: float = opt(0.02, "failure detector period", _positive, "must be > 0")
    keys_dir: str = opt("", "CurveZMQ key folder from `swarm keys generate` (~ is the home folder); empty: no "
                        "encryption", path=True)
    key_name: str = opt("coordinator", "the coordinator's key pair in keys_dir")
    others: list[str] = opt([], "addresses of the other coordinators (primary and standbys); empty: run alone")
    takeover_s: float = opt(1.0, "a standby takes over when no active coordinator has answered for this long",
                            _positive, "must be > 0")
    http_bind: str = opt("127.0.0.1:0", "HOST:PORT of the status page (/, /status.json, /metrics); "
                         "port 0 picks a free one, empty disables it", _host_port, "must be HOST:PORT or empty")
    run_name: str = opt("", "run name shown on the status page and in /metrics labels", _label,
                        "must be at most 200 printable characters")
    max_members: int = opt(10_000, "most members in the view; a join beyond is refused (the swarm is full), "
                           "as is one whose view would not fit in a message (4 MiB); at most "
                           f"{MAX_VIEW_MEMBERS}, the longest list a peer decodes",
                           lambda n: 1 <= n <= MAX_VIEW_MEMBERS, f"must be in 1..{MAX_VIEW_MEMBERS}")


@dataclass
class SwarmConfig:
    """Top-level config of a peer process or a coordinator process."""

    peer: PeerConfig = field(default_factory=PeerConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)


# ----------------------------------------------------------------- machinery

def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert int->float, and numpy's
    numbers to Python's, only."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of settings, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, vt = typing.get_args(tp) or (str, Any)   # keys are strings, as TOML's are
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return {str(k): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    # numpy's scalars count as numbers (a sweep's np.arange seeds, a float32 from a
    # schedule) and are stored as Python's, so that config.json and TOML stay plain
    if tp is float:
        if not is_real(value):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if is_int(value) and abs(value) > sys.float_info.max:   # TOML's integers have no bound
            raise ConfigError(f"{key}: must be finite, got an integer beyond the largest float (about 1.8e308)")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        return float(value)
    if tp is int:
        if not is_int(value):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            # `--set name=123` reads 123 as a TOML number, `--set name=2024-06-01` as a date:
            # quoting makes either text
            hint = (f"; quote it to give it as text (--set '{key}=\"...\"', or {key} = \"...\" in a file)"
                    if isinstance(value, (int, float, datetime.date, datetime.time)) else "")
            raise ConfigError(f"{key}: expected a string, got {value!r}{hint}")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from a plain dict, checking every key and value."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown key {where}{unknown[0]!s}; known keys: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        f = fields[name]
        if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
            # A section names only what it changes; the rest is the field's own default
            # (which may differ from its class's defaults, as a spec's dqn section does).
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                value = {**to_dict(default), **value}
        v = _coerce(value, hints[name], key)
        if f.metadata.get("path"):
            # as the command line's paths (cli.user_path): a config file or --set is read by
            # no shell, and "~/keys" was a folder named "~" in the current one
            v = os.path.expanduser(v)
        check = f.metadata.get("check")
        if check is not None and not check(v):
            why = f.metadata.get("why") or "is not allowed"
            raise ConfigError(f"{key} = {value!r}: {why}")
        kwargs[name] = v
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """The plain-dict form of a config, as saved beside results."""
    return dataclasses.asdict(obj)


def to_toml(obj: Any, derived: Mapping[str, str] | None = None, _at: str = "") -> str:
    """A config as a TOML file that loads back to it, each key under its help text.

    Top-level keys first, then one ``[table]`` per nested config. A ``None`` value
    (unset) is written as a comment, since TOML has no null. So is each key of
    ``derived`` (dotted, ``eval.solve_return``): its value, with the reason there as
    a note, is what was derived from other keys while it was unset, and a file that
    leaves it unset derives it again.
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise ConfigError(f"to_toml: obj must be a config (a dataclass instance), got {type(obj).__name__}")
    if derived is not None and not isinstance(derived, Mapping):
        raise ConfigError(f"to_toml: derived must be a dict of dotted key to reason, got {type(derived).__name__}")
    derived = derived or {}
    scalars, tables = [], []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            doc = (type(value).__doc__ or "").strip().splitlines()
            head = [f"# {doc[0]}"] if doc else []
            tables.append("\n".join(head + [f"[{f.name}]", to_toml(value, derived, f"{_at}{f.name}.")]))
            continue
        scalars += [f"# {line}" for line in textwrap.wrap(f.metadata.get("help") or "", 86)]
        why = derived.get(_at + f.name)
        line = f"# {f.name} is unset" if value is None else f"{f.name} = {_toml_value(value)}"
        scalars.append(f"# {line}   # {why}" if why and value is not None else line)
    return "\n\n".join((["\n".join(scalars)] if scalars else []) + tables)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if is_int(v):   # numpy's too (a config changed in code): written as Python's
        return repr(int(v))
    if is_real(v):
        return repr(float(v))   # TOML reads inf, nan and exponents as Python writes them
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} ({type(v).__name__}) as TOML")


def _parse_scalar(text: str) -> Any:
    """``--set`` values are TOML scalars/arrays; a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=v`` overrides (a list or tuple of them) to a plain config dict (in
    place) and return it."""
    if not isinstance(data, dict):
        raise ConfigError(f"apply_overrides: data must be a dict of settings, got {type(data).__name__}")
    if not isinstance(overrides, (list, tuple)):
        # a str would be read a character at a time, and a generator, once only
        raise ConfigError(f"overrides must be a list of 'a.b=v' strings, got {type(overrides).__name__}")
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"overrides must be 'a.b=v' strings, got {type(item).__name__} {item!r:.80}")
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, a dotted key and a value")
        key, text = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set {item!r}: empty key")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p} is not a table")
        try:
            node[parts[-1]] = _parse_scalar(text.strip())
        except RecursionError:   # tomllib recurses once per level of [ or {
            raise ConfigError(f"--set {key.strip()[:80]}: the value is nested too deeply to read") from None
        except ValueError:   # not TOML is text (above): this is int()'s limit on digits
            raise ConfigError(f"--set {key.strip()[:80]}: an integer of more than {sys.get_int_max_str_digits()} "
                              "digits, more than Python reads") from None
    return data


#: largest spec or config file read, in bytes (16 MiB; a spec is a few KiB): a wrong path
#: (a checkpoint, a data set, /dev/zero) is refused at once, not read until memory runs out
MAX_FILE_BYTES = 16 * 1024 * 1024


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON file into a dict, with an error that names the file; one over
    :data:`MAX_FILE_BYTES` is refused."""
    if not str(path).strip():   # Path("") is ".", the current folder
        raise ConfigError(f"the config path {str(path)!r} is empty (an unset variable?): give a TOML or JSON file")
    p = Path(path)
    try:
        raw = _read_bounded(p)
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror}") from None
    try:
        # universal newlines, as a file opened as text reads them
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not a text file (byte {e.start} is not UTF-8)") from None
    if p.suffix.lower() in (".yaml", ".yml", ".ini", ".cfg"):
        raise ConfigError(f"{p}: a {p.suffix} file; settings files are TOML (.toml) or JSON (.json)")
    is_json = p.suffix.lower() == ".json"   # s.JSON too
    try:
        data = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: not valid {'JSON' if is_json else 'TOML'}: {e}") from None
    except RecursionError:   # both parsers recurse once per level of [ or {
        raise ConfigError(f"{p}: nested too deeply to read (thousands of levels of [ or {{)") from None
    except ValueError:   # after the parsers' own errors (ValueErrors too): int()'s limit on digits
        raise ConfigError(f"{p}: an integer of more than {sys.get_int_max_str_digits()} digits, more than Python "
                          "reads") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a table")
    return data


def _read_bounded(p: Path) -> bytes:
    """The bytes of file ``p``, read no further than :data:`MAX_FILE_BYTES` + 1 (past it,
    :class:`ConfigError`): a pipe or a device that never ends (/dev/zero) too."""
    with open(p, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{p}: more than {MAX_FILE_BYTES} bytes, too big for a spec or config file "
                          f"(the limit is {MAX_FILE_BYTES >> 20} MiB); is it the file you meant?")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                cls: type[T] = SwarmConfig) -> T:  # type: ignore[assignment]
    """Load a config file (TOML or JSON), apply ``--set`` overrides, validate."""
    data = read_file(path) if path is not None else {}   # "" is refused, not taken for none
    apply_overrides(data, [] if overrides is None else overrides)
    return from_dict(cls, data)
