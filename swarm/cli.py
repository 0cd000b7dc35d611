"""`swarm` — the command line. It and `launch_ray`'s peer actors are the only places that pick uvloop.

    swarm coordinator --bind tcp://0.0.0.0:5555 [--keys DIR] [--others ADDR,...]
    swarm peer --coordinator tcp://HOST:5555[,tcp://STANDBY:5555] [--bind ADDR] [--id ID] [--rank N]
               [--replace ID] [--keys DIR] [--spec FILE --run-dir DIR [--resume DIR]]
    swarm status --coordinator tcp://HOST:5555 [--json] [--watch [--interval S]]
    swarm run [SPEC] [--set key=value ...] [--resume RUN_DIR] [--show]
    swarm eval PATH... [--episodes N] [--seed S]
    swarm keys generate DIR [--names coordinator,peer]
    swarm launch --ray [ADDRESS] [SPEC] [--per-node N] [--set key=value ...]

Every command takes -v (INFO logging) or -vv (DEBUG), before or after its name
(they add up: `swarm -v run -v` is -vv); `swarm run -v` and `swarm launch -v`
pass it on to the coordinator and the peers they start (their logs in the run
folder's logs/). The `swarm` script's entry point is
swarm/__main__.py (so `python -m swarm` runs it too).

Peers also read SWARM_COORDINATOR and SWARM_RANK, and fall back to what Slurm
(SLURM_PROCID) and torchrun (RANK, MASTER_ADDR) set, so existing launchers can
start them.

Exit status: 0; 2 for an error (`swarm: error: ...`); 130 for Ctrl-C; 1 when stdout
or stderr cannot be written (the reader of `| head` left, a full disk), without a
traceback; `swarm run` adds its own (1: a process crashed). A run (`swarm run`,
`swarm launch`) goes on without printing when its stderr fails and exits with the
run's status; `swarm coordinator` and `swarm peer` go on without their lines when
stdout fails, and end cleanly on Ctrl-C, SIGTERM or SIGHUP at any time after start-up,
also while a peer waits to join. A closed fd 0, 1 or 2 (`>&-`) is opened on /dev/null
first.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import errno
import ipaddress
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Coroutine, Mapping

from .config import (MAX_RANK, PeerConfig, SwarmConfig, apply_overrides, from_dict, load_config, read_file,
                     to_dict)
from .checks import printable, process_gone
from .errors import ConfigError, SwarmError, TransportError

log = logging.getLogger("swarm.cli")

DEFAULT_PORT = 5555
#: The line a process started by `swarm run` (SWARM_PARENT_PID set) writes after the
#: `swarm: error:` line of a ConfigError. Its exit code, 2, is that of every error, and some
#: of those a restart cures (a refused takeover, a join that timed out); this one it does
#: not, so `swarm run` reads the line from the log and does not start the peer again.
CONFIG_ERROR_NOTE = "swarm: (a configuration error: another start would fail the same way)"
#: the key pair `swarm status --keys DIR` authenticates with when --key-name is left out
STATUS_KEY_NAME = "peer"


def _standard_fds() -> None:
    """Open /dev/null on each of fds 0, 1 and 2 that is closed (`swarm coordinator >&-`),
    with a Python stream on it where there was none.

    Otherwise the first socket or pipe made takes the number, and libuv (uvloop) asserts
    that what it closes is above fd 2: the process aborted at exit (SIGABRT, 134). And
    with ``2>&-`` ``sys.stderr`` is None, which `swarm run` could not write to.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError as e:
            if e.errno != errno.EBADF:
                continue
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:   # the lowest free number: fd itself, as the ones below it are open
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)   # the processes `swarm run` starts get it too
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)
    if sys.stderr is None:
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` while :func:`main` runs: a write or flush that
    fails (the reader of a pipe left: EPIPE; a full disk: ENOSPC; a terminal gone: EIO)
    raises its OSError marked with the stream's name (``swarm_stream``), which
    :func:`main` tells from other OSErrors (of files a command writes); a character the
    stream's encoding cannot take is written escaped."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream = stream
        self.name = name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:
            # a stdout that is not UTF-8 (PYTHONIOENCODING=ascii, a latin-1 locale) and a
            # character it lacks: escaped (\xe9), as stderr does, not a traceback after the
            # work was done (`swarm keys generate` had written the keys)
            encoding = self._stream.encoding
            return self.write(text.encode(encoding, "backslashreplace").decode(encoding))
        except OSError as e:
            e.swarm_stream = self.name  # type: ignore[attr-defined]
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            e.swarm_stream = self.name  # type: ignore[attr-defined]
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_devnull(fd: int) -> None:
    """Point ``fd`` at /dev/null: what is still buffered for it goes nowhere at exit,
    instead of failing again there (with an "Exception ignored" message)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def _tell(line: str) -> None:
    """A line on stderr, if it can still be written (else nothing more goes there)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        _to_devnull(2)


def _output_failed(e: OSError, prog: str = "swarm") -> int:
    """:func:`main`'s (and a script's: ``prog``) answer to a write to stdout or stderr that
    failed: exit status 1, no traceback; a failed stdout is named on stderr, except for
    EPIPE (`swarm status | head -1`), where the reader chose to leave."""
    name = getattr(e, "swarm_stream", "stdout")
    _to_devnull(1 if name == "stdout" else 2)
    if name == "stdout" and e.errno != errno.EPIPE:
        _tell(f"{prog}: cannot write to stdout ({e.strerror or e}); output lost")
    return 1


class _Lines:
    """The lines a long-running command (`swarm coordinator`, `swarm peer`) prints on
    stdout. Once stdout cannot be written (``| head -1`` left, a full disk, a closed
    terminal) the process goes on without them and ends as it would: one line on stderr
    says so, except for EPIPE."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, line: str) -> None:
        if self.failed:
            return
        try:
            print(line, flush=True)
        except OSError as e:
            self.failed = True
            _to_devnull(1)
            if e.errno != errno.EPIPE:
                _tell(f"swarm: cannot write to stdout ({e.strerror or e}); going on without printing")


def _runner(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:  # uvloop is a dependency, but a plain loop works too
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def _stop_event() -> asyncio.Event:
    """An event set on SIGINT, SIGTERM or SIGHUP (Ctrl-C, or the terminal closing, leaves
    cleanly), the handlers in place when it returns; a SIGHUP ignored at start (``nohup``)
    stays ignored. Call it on the running loop (main thread only).

    The signals stay caught for the rest of the process's life: once the loop has closed
    they do nothing, and at exit they are ignored. The loop's own handlers
    (``loop.add_signal_handler``) went with it, and the interpreter puts the default action
    back for any signal it handles before its teardown (the zmq context, the modules:
    100-300 ms): a second SIGTERM or SIGHUP then, as a closing terminal, ``timeout`` or
    systemd send, killed a process that had left cleanly (exit 143 or 129, not 0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def handler(signum: int, frame: Any) -> None:
        # run between the loop's callbacks (it wakes on the signal): stop.set() is the
        # loop's to call, as asyncio.Runner does for Ctrl-C
        if not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)

    for sig in _STOP_SIGNALS:
        if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)
    atexit.register(_ignore_stop_signals)
    return stop


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _ignore_stop_signals() -> None:
    """At exit (atexit runs before the interpreter drops its signal handlers): ignored is
    the one disposition that its teardown keeps."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _parent_pid() -> int | None:
    """The pid of the `swarm run` that started this process (SWARM_PARENT_PID), else None."""
    value = os.environ.get("SWARM_PARENT_PID", "")
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 10):   # int() reads at most 4,300 digits
        raise SwarmError(f"SWARM_PARENT_PID={value!r:.80} is not a pid (`swarm run` sets it for its children; "
                         "unset it)")
    return int(value)


#: seconds between looks at whether a coordinator's `swarm run` is still its parent
ORPHAN_POLL_S = 1.0


async def _until_orphaned(parent: int) -> None:
    """Return once this process's parent is no longer ``parent`` (it died, even by SIGKILL)."""
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_POLL_S)


def env_coordinator(environ: dict[str, str] | None = None) -> list[str]:
    """Coordinator addresses from SWARM_COORDINATOR (comma-separated) or MASTER_ADDR.

    MASTER_ADDR must be a host name or an IPv4 address: the transport does not
    enable IPv6, so an IPv6 address is refused rather than tried in vain, as is one
    that is no address to dial (``0.0.0.0``, ``bad host``).
    """
    env = os.environ if environ is None else environ
    if env.get("SWARM_COORDINATOR"):   # set but empty is unset; set but blank is refused
        return _coordinators(env["SWARM_COORDINATOR"], f"SWARM_COORDINATOR={env['SWARM_COORDINATOR']!r}")
    host = env.get("MASTER_ADDR", "").strip()
    if not host:
        return []
    if ":" in host or "[" in host:
        what = "is an IPv6 address" if _is_ipv6(host.strip("[]")) else "is not a host name or IPv4 address"
        raise SwarmError(f"MASTER_ADDR={env['MASTER_ADDR']!r} {what}: swarm connects over IPv4 only; "
                         "give a host name or an IPv4 address (the port goes in SWARM_COORDINATOR_PORT), "
                         "or set SWARM_COORDINATOR=tcp://HOST:PORT")
    port = env.get("SWARM_COORDINATOR_PORT", "").strip() or str(DEFAULT_PORT)
    # the length first: int() of over 4,300 digits raises ValueError
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise SwarmError(f"SWARM_COORDINATOR_PORT={env['SWARM_COORDINATOR_PORT']!r:.80} is not a port: "
                         "expected a number in 1..65535")
    addr = f"tcp://{host}:{int(port)}"
    if why := _dial_error(addr):
        raise ConfigError(f"MASTER_ADDR={env['MASTER_ADDR']!r} is not a host name or IPv4 address to dial: "
                          f"{why}; give the coordinator's host name or IPv4 address, or set SWARM_COORDINATOR")
    return [addr]


def _coordinators(text: str, source: str) -> list[str]:
    """The coordinator addresses in ``text`` (comma-separated), each checked as the
    coordinator checks a member's address; ``source`` (``--coordinator 'TEXT'``,
    ``SWARM_COORDINATOR='TEXT'``) names where they came from in the error. Checked
    here, as libzmq would take some (an IPv6 address) and retry them in vain until
    the join timeout. An empty entry (a stray comma) or a repeated one is refused too:
    a list that is only commas read as no list at all ("no coordinator ... set
    SWARM_COORDINATOR", when it was set)."""
    addrs = [a.strip() for a in text.split(",")]
    for a in addrs:
        why = ("no address in it" if not any(addrs) else "an empty entry (a stray comma?)" if not a
               else f"{a!r} is listed twice" if addrs.count(a) > 1 else _dial_error(a))
        if why:
            raise ConfigError(f"{source}: {why} (a comma-separated list of coordinator addresses)")
    return addrs


#: seconds `swarm peer` waits at start for its coordinators' host names to be looked up
RESOLVE_WAIT_S = 2.0


def _warn_unresolved(addrs: list[str], source: str, join_timeout_s: float) -> None:
    """Log a warning naming ``source`` (``--coordinator 'TEXT'``) for each host of
    ``addrs`` that does not resolve to an IPv4 address. libzmq retries such a name in
    silence, and the join's error said so only after peer.join_timeout_s (60 s with the
    advice for launchers). A warning, not a refusal: the name may resolve later (a DNS
    record made as the coordinator's host comes up). The lookup runs on a thread of its
    own, which nothing can cancel: one slower than RESOLVE_WAIT_S is left to end by
    itself, and the join goes on meanwhile."""
    from .transport import unresolved_hint  # noqa: PLC0415 - zmq only when needed

    said: list[str] = []
    look = threading.Thread(target=lambda: said.append(unresolved_hint(addrs)), name="swarm-resolve",
                            daemon=True)
    look.start()
    look.join(RESOLVE_WAIT_S)
    if said and said[0]:
        log.warning("%s: %s; the peer tries to join all the same, for peer.join_timeout_s = %s s", source,
                    said[0].removeprefix("; "), join_timeout_s)


def _dial_error(addr: str) -> str:
    """Why ``addr`` cannot be dialled as a coordinator's address, or "": the check the
    coordinator applies to a member's address (``tcp://HOST:PORT``), and HOST neither
    0.0.0.0 (what a coordinator binds to listen on every interface: dialled, it reaches
    only the dialler's own host) nor a name starting with '-' (no host name does).
    libzmq takes both, and retries them in vain."""
    from .transport import member_address_error, unspecified_host  # noqa: PLC0415 - zmq only when needed

    if why := member_address_error(addr):
        return why + _form_hint(addr)
    host = addr.removeprefix("tcp://").rpartition(":")[0]
    if unspecified_host(host):
        return f"{addr!r} is an address to listen on (every interface), not one to dial"
    if host.startswith("-"):
        return f"{addr!r} has {host!r}, which is not a host name"
    return ""


def _bind_error(addr: str) -> str:
    """Why ``addr`` cannot be a peer's bind address, or "": ``tcp://HOST:PORT`` as a
    member's address must be (neighbours dial what it binds), where HOST may also be
    ``*`` (every interface) and PORT ``*`` or 0 (a free one)."""
    from .transport import member_address_error  # noqa: PLC0415 - zmq only when needed

    head, sep, port = addr.rpartition(":")
    if sep and port in ("*", "0"):
        port = "1"
    if head == "tcp://*":
        head = "tcp://0.0.0.0"
    if not member_address_error(f"{head}{sep}{port}"):
        return ""
    return (f"{addr!r:.80} is not tcp://HOST:PORT (HOST a host name, an IPv4 address or *; PORT in 1..65535, "
            f"or * for a free one){_form_hint(addr)}")


def _form_hint(addr: str) -> str:
    """A hint for an address that is not ``tcp://HOST:PORT``: for a ``tcp://`` one whose
    host looks like IPv6 (brackets, or colons in it), that the transport does not enable
    IPv6; for another scheme (``http://``, ``TCP://``, ``tcp:/``) or none, that it must
    begin with ``tcp://``; else ""."""
    if not addr.startswith("tcp://"):
        return "; it must begin with tcp://"
    host = addr.removeprefix("tcp://").rpartition(":")[0]
    return "; swarm connects over IPv4 only" if "[" in host or ":" in host else ""


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _env_rank(env: Mapping[str, str]) -> tuple[str, int] | None:
    """``(KEY='VALUE', rank)``: the rank requested by SWARM_RANK, else SLURM_PROCID, else
    torchrun's RANK; None if none is set.

    In a torchrun worker (TORCHELASTIC_RUN_ID set) RANK comes before SLURM_PROCID:
    under ``srun torchrun ...`` every worker on a node inherits its srun task's
    SLURM_PROCID, and only RANK tells them apart.
    """
    keys = (("SWARM_RANK", "RANK", "SLURM_PROCID") if "TORCHELASTIC_RUN_ID" in env
            else ("SWARM_RANK", "SLURM_PROCID", "RANK"))
    for key in keys:
        value = env.get(key, "")
        if value == "":
            continue
        digits = value.strip().removeprefix("-")
        if not (digits.isascii() and digits.isdigit()):    # int() also takes "1_0" and "+1"
            raise SwarmError(f"{key}={value!r:.80} is not an integer rank")
        r = int(value) if len(digits) <= 10 else None   # int() of over 4,300 digits raises ValueError
        if r is not None and r < 0:
            raise SwarmError(f"{key}={r} must be >= 0")
        if r is None or r > MAX_RANK:
            # named here: the config's check of it would name peer.rank, which the user did not set
            raise SwarmError(f"{key}={value!r:.80} is out of range: a rank (peer.rank) is in 0..{MAX_RANK}")
        return f"{key}={value!r}", r
    return None


#: the variables that give the launcher's number of processes, for each that gives a rank
#: (SWARM_RANK has none: swarm's own launchers pass --rank)
_WORLD_KEYS = {"SLURM_PROCID": ("SLURM_NTASKS", "SLURM_NPROCS"), "RANK": ("WORLD_SIZE",)}


def _env_world(env: Mapping[str, str], from_env: str) -> tuple[str, int] | None:
    """``(KEY='VALUE', n)``: the number of processes that the launcher which set the rank
    variable of ``from_env`` (``KEY='VALUE'``, from :func:`_env_rank`) started, from its
    own variable (Slurm's SLURM_NTASKS, torchrun's WORLD_SIZE); None when it sets none."""
    for key in _WORLD_KEYS.get(from_env.partition("=")[0], ()):
        value = env.get(key, "").strip()
        if value == "":
            continue
        if not (value.isascii() and value.isdigit() and len(value) <= 10 and int(value) > 0):
            raise SwarmError(f"{key}={env[key]!r:.80} is not a number of processes ({from_env} gives the rank)")
        return f"{key}={env[key]!r}", int(value)
    return None


def _spec_rank(peer_id: str, flag: str) -> int:
    """The rank in an experiment peer's id ``peer{RANK}``."""
    digits = peer_id[4:] if peer_id.startswith("peer") else ""
    if not (digits.isascii() and digits.isdigit()) or digits != str(int(digits)):
        raise SwarmError(f"{flag} {peer_id}: with --spec peer ids are peer{{RANK}} (peer0, peer1, ...)")
    return int(digits)


def _set_keys(overrides: list[str] | None) -> set[str]:
    """The dotted keys of ``--set KEY=VALUE`` overrides, as :func:`apply_overrides` reads them."""
    return {".".join(p for p in o.partition("=")[0].strip().split(".") if p) for o in overrides or []}


def _config(args: argparse.Namespace, *later: str) -> SwarmConfig:
    """The config file with ``--set`` overrides, then ``later`` ones (from flags) on top."""
    return load_config(getattr(args, "config", None), [*(getattr(args, "set", None) or []), *later])


def _same_graph(edges: Any, theirs: Any) -> bool:
    """Whether two edge lists name the same undirected edges, in any order or direction."""
    def pairs(es: Any) -> set[frozenset[Any]] | None:
        try:
            return {frozenset(e) for e in es}
        except TypeError:   # not a list of pairs: from_dict says what is wrong with it
            return None
    mine = pairs(edges)
    return mine is not None and mine == pairs(theirs)


def _peer_config(args: argparse.Namespace, spec: Any) -> PeerConfig:
    """`swarm peer`'s config: the file, ``--set`` overrides, then --topology and --bind,
    checked once with all of them in place (a ``peer.advertise`` beside --bind's fixed
    port was checked against the default free one). Under --spec (``spec``) the peer's
    graph is the spec's (run_peer gives it the spec's topology and edges): one given
    here, by a flag, ``--set`` or the file, must agree with it, and a custom one needs
    no edge list of its own. The spec's ``link`` section gives ``peer.link_timeout_s``
    and ``peer.max_message_mb`` where neither ``--set`` nor the file does."""
    data = read_file(args.config) if args.config is not None else {}
    apply_overrides(data, list(args.set or []))
    peer = data.setdefault("peer", {})
    if isinstance(peer, dict):   # else from_dict says what is wrong with it
        if args.topology:
            peer["topology"] = args.topology
        if args.bind:
            peer["bind"] = args.bind
        if spec is not None:
            given = _set_keys(args.set)
            for key, theirs in (("topology", spec.gossip.topology), ("edges", spec.gossip.edges)):
                if key not in peer or peer[key] == theirs or (key == "edges" and _same_graph(peer[key], theirs)):
                    continue
                if key == "topology" and args.topology:
                    where, drop = f"--topology {args.topology}", "drop --topology"
                elif f"peer.{key}" in given or not args.config:
                    where, drop = f"--set peer.{key}={peer[key]}", "drop it"
                else:
                    where, drop = f"peer.{key} = {peer[key]!r} in {args.config}", "remove it there"
                raise ConfigError(f"{where} disagrees with the spec's gossip.{key} = {theirs}; {drop}")
            peer["topology"], peer["edges"] = spec.gossip.topology, spec.gossip.edges
            for key, value in spec.link.peer_settings().items():   # this host's own, given, win
                peer.setdefault(key, value)
    return from_dict(SwarmConfig, data).peer


# ---------------------------------------------------------------- commands

def _keys_folder(value: str | None) -> str:
    """``--keys`` as given ("" when left out). An empty or blank value is refused: it is
    what `--keys "$KEYS"` gives with KEYS unset, and it ran the swarm in plaintext."""
    if value is not None and not value.strip():
        raise ConfigError(f"--keys {value!r} is empty (an unset variable?): give the key folder from "
                          "`swarm keys generate`, or leave --keys out to run without keys")
    return value or ""


def _check_key_pair(keys_dir: str, name: str, source: str) -> None:
    """Refuse (:class:`ConfigError`) a key folder ``keys_dir`` that lacks the key pair
    ``name``, naming where the name came from (``source``: ``--key-name peer, the default``)
    and the pairs the folder has. The key loader's own error says to create the pair, which
    with one pair per host (docs/multihost.md) is not the fix: the name is. What else is wrong
    with the folder or the name, the key loader says."""
    from .transport import _key_name_error  # noqa: PLC0415 - zmq only when needed

    base = Path(keys_dir)
    if not keys_dir or _key_name_error(name) or not base.is_dir() or (base / f"{name}.key_secret").exists():
        return
    # the coordinator's secret is for coordinator hosts only: not one to suggest
    pairs = sorted(n for f in base.glob("*.key_secret")
                   if (n := f.name.removesuffix(".key_secret")) != "coordinator" and not _key_name_error(n))
    shown = ", ".join(pairs[:10]) + (f", ... ({len(pairs)} in all)" if len(pairs) > 10 else "")
    how = (f"the folder has the key pair{'s' if len(pairs) > 1 else ''} {shown}: pass --key-name with this "
           "host's" if pairs else f"create it with `swarm keys generate {base} --names {name}`")
    raise ConfigError(f"keys: {base / f'{name}.key_secret'} does not exist ({source}); {how}")


def _pid_of(text: str, owner: int) -> bool:
    """Whether ``text`` (a ``.lock``'s content) names a live process of the file's owner:
    the pid of the holder that wrote it, not one left by an earlier one."""
    if not text.isdigit():
        return False
    try:
        return os.stat(f"/proc/{int(text)}").st_uid == owner
    except (OSError, ValueError, OverflowError):
        return False


def _hold_folder(folder: Path, who: str) -> None:
    """Lock ``folder`` (an exclusive flock on its ``.lock``) for the rest of this process's
    life, or refuse with :class:`ConfigError`: two `swarm peer --spec` processes of two
    swarms started into one default folder spliced their metrics.csv rows and took each
    other's checkpoints (the run.json check sees a run only once its coordinator admitted
    it). The kernel drops the lock of a process that ends, crashed or not, so a restart
    into the folder is not refused. Where the file system has no locks, or takes no file
    (read only, full: the run's first write then says so, naming its file), nothing is held.

    A ``.lock`` this user may only read (another user's, in a folder the two share) is
    locked all the same (flock takes a read-only file), without its pid (skipped, it let
    two swarms write one folder). One that cannot be opened at all, or that is a symbolic
    link (followed, the pid overwrote the file it points to), is refused, naming it."""
    import fcntl  # noqa: PLC0415 - POSIX only, as swarm is

    lock = folder / ".lock"
    fd = None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            break
        except OSError as e:
            why = e
    if fd is None:
        if lock.is_symlink():
            raise ConfigError(f"{lock} is a symbolic link (to {os.readlink(lock)}): swarm writes its pid there, "
                              "and writes through no link; remove it, or pass --run-dir DIR for this run")
        if why.errno in (errno.EACCES, errno.EPERM):
            raise ConfigError(f"{lock} cannot be opened ({why.strerror}), so this process cannot hold {folder} "
                              "against another swarm writing there; make it readable, or pass --run-dir DIR "
                              "for this run")
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.read(fd, 20).decode("ascii", "replace").strip()
            owner = os.fstat(fd).st_uid
        except OSError:   # a folder there: it holds no pid
            holder, owner = "", -1
        os.close(fd)
        if not _pid_of(holder, owner):
            # the pid of a holder that could not write it (a .lock it may only read) is its
            # last writer's, long gone or another's: named, it sent users to a wrong process
            holder = ""
        raise ConfigError(f"{folder}: another process{f' (pid {holder})' if holder else ''} writes {who}'s "
                          "results there now; pass --run-dir DIR for this run") from None
    except OSError:   # ENOLCK: a file system without locks
        os.close(fd)
        return
    try:   # the holder's pid, for the refusal above
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:   # a full disk, a .lock opened read only: the lock holds without it
        pass
    # fd stays open, and the lock held, until the process ends


def cmd_coordinator(args: argparse.Namespace) -> int:
    from . import transport as tp
    from .coordinator import Coordinator

    tp.raise_fd_limit()   # a connection past ulimit -n is not refused: libzmq retries its accept, spinning
    cfg = _config(args).coordinator
    if args.bind:
        cfg.bind = args.bind
    # peers and `swarm status` dial it as tcp://HOST:PORT: an ipc:// or inproc:// one started
    # a coordinator that no one could reach
    if why := _bind_error(cfg.bind):
        raise SwarmError(f"{'--bind' if args.bind else 'coordinator.bind'}: {why}")
    if args.keys is not None:
        cfg.keys_dir = _keys_folder(args.keys)
    # the others are dialled, as a peer dials its coordinators: the same check (a port 0
    # or an IPv6 one started a coordinator that watched nothing)
    if args.others:
        cfg.others = _coordinators(args.others, f"--others {args.others!r}")
    elif cfg.others:
        cfg.others = _coordinators(",".join(cfg.others), f"coordinator.others = {cfg.others!r}")

    parent = _parent_pid()
    say = _Lines()

    async def main() -> int:
        async with Coordinator(cfg) as coord:
            # before the first line: a SIGTERM right after it stops it cleanly. (Installed
            # before the coordinator started, 1 in 5 runs of test_status's junk test then
            # got no welcome for its joins; not understood, and not seen this way round.)
            stop = _stop_event()
            say(f"swarm coordinator on {coord.address} (pid {os.getpid()})"
                + (f", status page {coord.http_url}" if coord.http_url else ""))
            done = asyncio.create_task(coord.closed())
            ends = [done, asyncio.create_task(stop.wait())]
            # a coordinator of `swarm run` ends with it, even a killed one (one whose parent is
            # some other process, e.g. started by hand with the variable set, does not watch);
            # one whose `swarm run` died before it got here ends now (it watched nothing, and
            # ran on with nobody to end it)
            if parent is not None and os.getppid() == parent:
                ends.append(asyncio.create_task(_until_orphaned(parent)))
            elif parent is not None and process_gone(parent):
                say(f"swarm coordinator: its swarm run (pid {parent}, SWARM_PARENT_PID) is gone; stopping "
                    "(unset SWARM_PARENT_PID to run one by hand)")
                return 0
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            for t in ends[1:]:
                t.cancel()
            if done.done():
                done.result()
            elif len(ends) > 2 and ends[2].done():
                say(f"swarm coordinator: its swarm run (pid {parent}) is gone; stopping")
        return 0

    return _runner(main)


def cmd_peer(args: argparse.Namespace) -> int:
    from . import transport as tp
    from .peer import Peer

    tp.raise_fd_limit()   # a link past ulimit -n is not refused: libzmq retries its accept, spinning
    spec = None
    if args.spec:
        from .experiment.spec import load_spec

        spec = load_spec(args.spec)
    cfg = _peer_config(args, spec)
    # every address is checked before anything starts: libzmq would take an IPv6 one and
    # retry it in vain until the join timeout ("no coordinator answered")
    if args.coordinator:
        source = f"--coordinator {args.coordinator!r}"
        coords = _coordinators(args.coordinator, source)
    elif cfg.coordinators:
        source = f"peer.coordinators = {cfg.coordinators!r}"
        coords = _coordinators(",".join(cfg.coordinators), source)
    else:
        coords = env_coordinator()
        variable = "SWARM_COORDINATOR" if os.environ.get("SWARM_COORDINATOR") else "MASTER_ADDR"
        source = f"{variable}={os.environ.get(variable)!r}"
    if not coords:
        raise SwarmError("no coordinator: pass --coordinator tcp://HOST:PORT or set SWARM_COORDINATOR")
    cfg.coordinators = coords
    if why := _bind_error(cfg.bind):
        raise SwarmError(f"{'--bind' if args.bind else 'peer.bind'}: {why}")
    if args.id:
        cfg.id = args.id
    from_env = None
    if args.rank is not None:
        cfg.rank = args.rank
    elif cfg.rank < 0 and not (args.replace or (cfg.replace and cfg.id)):
        # a replacement (--replace, or peer.replace in the config) takes the dead member's rank
        # (the coordinator's, or with --spec the one its id names), not the launcher's: in an
        # sbatch shell SLURM_PROCID is 0
        from_env, cfg.rank = _env_rank(os.environ) or (None, -1)
    if args.replace:
        if args.id and args.id != args.replace:
            raise SwarmError(f"--replace {args.replace} and --id {args.id} disagree; --replace sets the id")
        cfg.id, cfg.replace = args.replace, True
    replace_flag = "--replace" if args.replace else "peer.replace with peer.id ="   # how the user said it
    # the flags and variables above skip the config's checks: an id longer than a message's
    # sender or a rank past a C int failed only at the join, with errors that named neither
    from_dict(PeerConfig, to_dict(cfg), prefix="peer")
    if args.keys is not None:
        cfg.keys_dir = _keys_folder(args.keys)
    if args.key_name is not None:   # "" too: the key folder's check names it, not a silent "peer"
        cfg.key_name = args.key_name
        named_by = f"--key-name {cfg.key_name}"
    elif cfg.key_name != PeerConfig().key_name or "peer.key_name" in _set_keys(args.set):
        named_by = f"peer.key_name = {cfg.key_name!r}"
    else:
        named_by = f"--key-name {cfg.key_name}, the default"
    _check_key_pair(cfg.keys_dir, cfg.key_name, named_by)
    _warn_unresolved(coords, source, cfg.join_timeout_s)
    if spec is not None:
        # Train this peer's share of an experiment (see swarm.experiment.runner).
        from .experiment.runner import check_resume_kept, make_peer_dir, peer_dir, run_peer, stop_on_signals

        # A peer of an experiment is peer{RANK}: its id and its rank say the same thing,
        # so `--replace peer3` is enough to take over rank 3.
        # (with no id, peer.replace takes the rank it is given: the id is then peer{RANK})
        named = _spec_rank(cfg.id, replace_flag) if cfg.replace and cfg.id else None
        if named is not None:
            if args.rank is not None and args.rank != named:
                raise SwarmError(f"{replace_flag} {cfg.id} and --rank {args.rank} disagree; drop --rank")
            cfg.rank = named
        if cfg.rank < 0:
            raise SwarmError("--spec needs a rank: pass --rank N (or set SWARM_RANK)")
        if from_env and (world := _env_world(os.environ, from_env)) and world[1] < spec.peers:
            # each task would wait for peers that never come (60 s). More tasks than peers may
            # be on purpose (srun --multi-prog: the last ones standby coordinators); a task of
            # a rank past the spec's peers is refused just below
            raise SwarmError(f"{world[0]}: the launcher started {world[1]} processes (this one's rank is "
                             f"{from_env}), but the spec {args.spec} has peers = {spec.peers}; start one "
                             "process per peer, or change the spec's peers")
        if cfg.rank >= spec.peers:
            # named as the user gave it (run_peer's own check names its `rank` argument)
            if named is not None:
                given = f"{replace_flag} {cfg.id}"
            elif args.rank is not None:
                given = f"--rank {args.rank}"
            else:
                given = f"{from_env} gives rank = {cfg.rank}" if from_env else f"peer.rank = {cfg.rank}"
            raise ConfigError(f"{given}: the spec has peers = {spec.peers}, so ranks are 0..{spec.peers - 1}")
        if args.id and args.id != f"peer{cfg.rank}":
            raise SwarmError(f"--id {args.id}: with --spec a peer's id is peer{{RANK}} (here peer{cfg.rank}); "
                             "drop --id")
        # the same as --set: the spec's id replaced it in silence (its topology and edges:
        # _peer_config)
        if "peer.id" in _set_keys(args.set) and not (args.id or args.replace) and cfg.id != f"peer{cfg.rank}":
            raise SwarmError(f"--set peer.id={cfg.id}: with --spec a peer's id is peer{{RANK}} (here "
                             f"peer{cfg.rank}); drop it")
        if args.new_run and not args.resume_from:
            raise SwarmError("--new-run goes with --resume RUN_DIR (a start without it is a new run anyway)")
        if args.resume_from:   # as run_peer does, but before this process makes and locks its folder
            check_resume_kept(args.resume_from, spec, [cfg.rank])
        run_dir = args.run_dir or os.path.join("runs", f"{spec.name}-peer{cfg.rank}")
        fresh = not (args.run_dir or args.resume_from or cfg.replace)
        if fresh and (peer_dir(run_dir, cfg.rank) / "run.json").is_file():
            # A fresh start replaces the results of the run a folder holds (run.json: one the
            # coordinator admitted). Into a folder named by hand that is asked for; into the
            # default one it was a second experiment that silently took the first one's place.
            # A restart (--replace, --resume) goes on with that run, and is not refused.
            raise ConfigError(f"{run_dir} (the default --run-dir) holds an earlier run of peer{cfg.rank} (its "
                              "run.json), whose results a fresh start would replace: pass --run-dir DIR for this "
                              f"run (--run-dir {run_dir} to replace them), or --resume {run_dir} to go on with "
                              "that run")
        stop = stop_on_signals()
        try:
            import uvloop
            factory = uvloop.new_event_loop
        except ImportError:
            factory = None
        parent = _parent_pid()
        # (run_peer makes it too) before the line that says it writes there
        out = make_peer_dir(run_dir, cfg.rank, f"--run-dir {args.run_dir}" if args.run_dir
                            else f"run folder {run_dir} (the default --run-dir)")
        _hold_folder(out, f"peer{cfg.rank}")
        say = _Lines()
        # escaped: a folder's name that is not UTF-8 failed the print on a strict stdout
        say(f"swarm peer peer{cfg.rank}: {spec.name}, {spec.budget.env_steps} env steps, writing to "
            f"{printable(run_dir)} (pid {os.getpid()})")
        # cfg carries --bind, --keys and --set peer.*: a peer on another host must
        # bind an address its neighbours can reach, not the loopback default.
        summary = run_peer(spec, cfg.rank, coords, run_dir, stop=stop, loop_factory=factory,
                           parent_pid=parent, peer_config=cfg,
                           resume_from=args.resume_from, new_run=args.new_run)
        ret = summary["final_mean_return"]    # None: no episode ended (a budget shorter than one)
        said = f"mean return {ret:.1f}" if ret is not None else "no episode finished"
        say(f"swarm peer peer{cfg.rank} done ({summary['reason']}): {summary['env_steps']} env steps, "
            f"{summary['rounds']} rounds, {said}")
        return 0
    if args.run_dir or args.resume_from or args.new_run:
        flag = "--run-dir" if args.run_dir else "--resume" if args.resume_from else "--new-run"
        raise SwarmError(f"{flag} is used with --spec (a peer without a spec trains nothing)")

    say = _Lines()

    async def main() -> int:
        peer = Peer(cfg)
        # The handlers go in before the join: a signal while it waits for a coordinator
        # (one not up yet is waited for peer.join_timeout_s) ends it at once, as one after
        # the join does; and one after the first line cannot kill it without leaving.
        stop = _stop_event()
        signalled = asyncio.ensure_future(stop.wait())
        try:
            joining = asyncio.ensure_future(peer.start())
            await asyncio.wait([joining, signalled], return_when=asyncio.FIRST_COMPLETED)
            if not joining.done():
                joining.cancel()    # a cancelled start closes what it made
                await asyncio.wait([joining])
                say(f"swarm peer {peer.id}: stopped before it joined")
                return 0
            joining.result()
            # the one that took the join, which need not be the first listed (Peer has no
            # public name for it; _active is read only)
            say(f"swarm peer {peer.id} on {peer.address}, rank {peer.rank}, "
                f"coordinator {peer.config.coordinators[peer._active]} (pid {os.getpid()})")
            last = -1
            leaving = False

            def show(view: Any) -> None:
                nonlocal last
                # views that arrive while it leaves (the others' leaves) are no news to the user
                if view.epoch != last and not leaving:
                    last = view.epoch
                    say(f"epoch {view.epoch}: {len(view.members)} members, neighbours {peer.neighbours()}")

            peer.on_view(show)
            show(peer.view)
            # until Ctrl-C/SIGTERM, or until the peer fails (e.g. another process took its id)
            stopped = asyncio.ensure_future(peer.wait_stopped())
            await asyncio.wait([signalled, stopped], return_when=asyncio.FIRST_COMPLETED)
            if stopped.done():
                stopped.result()    # the failure: `swarm: error: ...`, exit 2
            stopped.cancel()
            leaving = True
            say(f"swarm peer {peer.id} leaving")
        finally:
            signalled.cancel()
            await peer.close()
        return 0

    return _runner(main)


async def query_status(address: str, timeout: float = 2.0, keys_dir: str = "",
                       key_name: str = STATUS_KEY_NAME, context: Any = None) -> dict[str, Any]:
    """Ask a coordinator for its member table and view (with CURVE keys if given), on
    ``context`` (a zmq.asyncio.Context the caller keeps) or on one of its own."""
    import zmq
    import zmq.asyncio
    from zmq.utils.monitor import parse_monitor_message

    from . import transport as tp
    from . import wire

    ctx = context or zmq.asyncio.Context()
    s = tp.dealer(ctx, hwm=4)
    events = None
    try:
        if keys_dir:
            curve = tp.Curve(keys_dir, key_name)
            curve.client(s, curve.coordinator_public)
        # how far the connection got (accepted, its handshake), for the error when no answer comes
        events = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        tp.connect(s, address)
        await s.send_multipart(wire.encode("status", f"status-{os.getpid()}"))
        if not await s.poll(int(timeout * 1000)):
            seen = []
            # what is queued now, without waiting: a refused handshake is retried, and its
            # events keep coming
            for frames in tp.drain(tp.shadow(events)):
                ev = parse_monitor_message([f.bytes for f in frames])
                seen.append((ev["event"], ev["value"]))
            raise _no_status(address, timeout, seen, keys_dir, key_name)
        msg = wire.decode(await s.recv_multipart(), wire.Limits(max_header_bytes=64 * 1024 * 1024))
        if isinstance(msg.body.get("error"), str):   # it answered, but cannot send its table
            # no "coordinator at": a peer answers so too, to say that it is not one
            raise StatusUnavailable(f"{address} answered but cannot send its status: "
                                    f"{printable(msg.body['error'][:1000])}")
        # whatever answers at the address (another program, another version): the printers
        # below index and format what they read, and raised KeyError or ValueError
        why = f"a {msg.t!r:.40} message" if msg.t != "status_reply" else _not_a_status_table(msg.body)
        if why:
            raise StatusUnavailable(f"{address} answered with something that is not a status table ({why}); "
                                    "is it a swarm coordinator of this version?")
        return msg.body
    finally:
        if events is not None:
            s.disable_monitor()
            events.close(0)
        s.close(0)
        if context is None:
            ctx.term()


def _no_status(address: str, timeout: float, seen: list[tuple[int, int]], keys_dir: str,
               key_name: str) -> SwarmError:
    """Why nothing answered a status query at ``address`` within ``timeout``, by the
    events ``seen`` on its socket's monitor (event, value)."""
    import zmq

    from . import transport as tp

    events = {e for e, _ in seen}
    if zmq.EVENT_HANDSHAKE_SUCCEEDED in events:
        # reached, keys and all (a coordinator far away, or a busy one: 2.2 s at 600 ms RTT)
        return SwarmError(f"the coordinator at {address} was reached (handshake done) but did not answer "
                          f"within {timeout} s: it is busy or far away; give it a longer timeout (--timeout)")
    if zmq.EVENT_CONNECTED in events and not any(tp.handshake_refused(e, v) for e, v in seen):
        return SwarmError(f"no coordinator answered at {address} within {timeout} s: {tp.silent_hint(address)}")
    # with CURVE, a coordinator that does not know our key does not answer either
    hint = (f"; with keys, also when it runs without them or does not list the key {key_name!r}"
            if keys_dir else "; a coordinator started with --keys answers only a client with --keys")
    return SwarmError(f"no coordinator answered at {address} within {timeout} s"
                      f"{tp.unresolved_hint([address]) or hint}")


class StatusUnavailable(SwarmError):
    """A coordinator answered ``status`` with why it cannot send its table (it is too big),
    or something answered with what is not a status table."""


def _not_a_status_table(st: Any) -> str:
    """What in a ``status_reply`` body differs from a coordinator's status table, as
    :func:`format_status`, ``--json`` and ``--watch`` (``status_document``) read it; "" if nothing."""
    number, maybe = (int, float), type(None)

    def wrong(where: dict[str, Any], *kinds: tuple[str, Any]) -> str:
        for key, kind in kinds:
            if key not in where or not isinstance(where[key], kind):
                return f"{key} = {where.get(key)!r:.60}"
        return ""

    if not isinstance(st, dict):
        return "not a table"
    why = wrong(st, ("coordinator", str), ("epoch", int), ("uptime_s", number), ("view", dict), ("members", list))
    if why or (why := wrong(st["view"], ("members", list))):
        return why
    if not isinstance(st.get("others"), (list, maybe)) or not isinstance(st.get("log", []), list):
        return "others or log not a list"
    for o in st.get("others") or []:
        if not isinstance(o, dict) or wrong(o, ("address", str), ("state", str)):
            return f"others: {o!r:.60}"
    for r in st["members"]:
        if (not isinstance(r, dict) or wrong(r, ("id", str), ("rank", int), ("state", str), ("addr", str),
                                              ("linked_epoch", int), ("neighbours", list),
                                              ("heartbeat_age_s", (*number, maybe)))
                or not all(isinstance(n, str) for n in r["neighbours"])):
            return f"members: {r!r:.60}"
    for e in st.get("log", []):
        # (time, event, peer id); --watch shows the time with time.localtime
        if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], number) and abs(e[0]) < 1e11):
            return f"log: {e!r:.60}"
    try:
        json.dumps(st)   # what --json prints: msgpack also carries bytes
    except (TypeError, ValueError):
        return "values JSON cannot hold"
    return ""


def format_status(st: dict[str, Any]) -> str:
    """A coordinator's ``status`` reply as `swarm status` prints it: one line per member,
    a member that left shown as ``left``, and after an alive one's neighbours those its
    links cannot reach."""
    from .coordinator.report import STANDBY_NOTE, has_left, pad, unreachable_ids

    lines = [f"coordinator {st['coordinator']}  epoch {st['epoch']}  uptime {st['uptime_s']:.1f} s  "
             f"members {len(st['view']['members'])}"]
    if st.get("others"):
        # with standby coordinators: this one's mode, and each other as it sees it (and why it cannot tell)
        seen = [f"{o['address']}: {o['state']}" + (f" ({o['error']})" if o.get("error") else "")
                for o in st["others"]]
        lines.append(f"mode {st.get('mode')}  " + "  ".join(seen))
        if st.get("mode") == "standby":
            lines.append(STANDBY_NOTE)
    head = f"{'id':<20} {'rank':>4} {'state':<8} {'hb age':>7} {'linked':>6}  {'address':<24} neighbours"
    lines += [head, "-" * len(head)]
    for r in st["members"]:
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.2f}"
        linked = "-" if r["linked_epoch"] < 0 else r["linked_epoch"]   # -1: not linked yet
        state = "left" if has_left(r) else r["state"]   # dead by its own wish: no failure
        neighbours = ",".join(r["neighbours"])
        unreachable = unreachable_ids(r.get("stats")) if r["state"] != "dead" else []
        if unreachable:   # its links cannot reach them, though the coordinator lists them
            neighbours += f"  (cannot reach {','.join(unreachable)})"
        # each cell escaped before it is padded (escaped after, a control character in an
        # address took four columns of the padding's one), and padded by the columns it
        # takes on the screen (a wide character takes two, a combining one none)
        lines.append(f"{pad(r['id'], 20)} {r['rank']:>4} {pad(state, 8)} {age:>7} {linked:>6}  "
                     f"{pad(r['addr'], 24)} {printable(neighbours)}")
    # what peers sent (ids, neighbours) must not reach the terminal as control characters
    return "\n".join(printable(line) for line in lines)


def _status_of_any(addrs: list[str], args: argparse.Namespace, key_name: str) -> dict[str, Any]:
    """The status of the active coordinator among ``addrs``: the first that answers, unless
    that one stands by (as an old primary started again after a failover does, at the first
    address): then the others are asked, first the one it sees as active. A standby's
    answer, with its empty table, is the answer only when no active coordinator answers."""
    keys = _keys_folder(args.keys)
    todo, standby, last = list(addrs), None, None
    while todo:
        addr = todo.pop(0)
        try:
            st = asyncio.run(query_status(addr, args.timeout, keys, key_name))
        except (TransportError, StatusUnavailable):
            raise   # a bad address stays bad, and one that cannot send its table says so
        except SwarmError as e:
            if len(addrs) == 1:
                raise
            last = e
            continue
        if st.get("mode") != "standby":
            return st
        standby = standby or st
        active = [o["address"] for o in st.get("others") or [] if o["state"] == "active"]
        todo.sort(key=lambda a: a not in active)   # stable: else in the order given
    if standby is not None:
        return standby
    raise SwarmError(f"no coordinator answered at {', '.join(addrs)} within {args.timeout} s each") from last


def cmd_status(args: argparse.Namespace) -> int:
    # checked as a peer checks them: a port 0 waited out the timeout, then blamed --keys
    addrs = (_coordinators(args.coordinator, f"--coordinator {args.coordinator!r}") if args.coordinator
             else env_coordinator())
    if not addrs:
        raise SwarmError("no coordinator: pass --coordinator tcp://HOST:PORT or set SWARM_COORDINATOR")
    if not 0 < args.timeout <= 3600:   # also refuses nan
        raise SwarmError(f"--timeout must be > 0 and at most 3600 seconds, got {args.timeout}")
    key_name = STATUS_KEY_NAME if args.key_name is None else args.key_name
    if args.keys:
        _check_key_pair(args.keys, key_name, f"--key-name {key_name}"
                        + (", the default" if args.key_name is None else ""))
    if not args.watch:
        st = _status_of_any(addrs, args, key_name)
        print(json.dumps(st, indent=2) if args.json else format_status(st))
        return 0
    if args.json:
        raise SwarmError("--json prints one reply and --watch redraws a table: choose one "
                         "(for JSON over time, run `swarm status --json` in a loop)")
    if not 0 < args.interval <= 3600:
        raise SwarmError(f"--interval must be > 0 and at most 3600 seconds, got {args.interval}")
    from .coordinator.report import PeerRates, format_table, status_document

    rates = PeerRates()
    # a terminal's screen is cleared for each redraw; a file, a pipe, or a terminal that
    # cannot clear (TERM=dumb: an Emacs shell) gets the tables one after another, each
    # after a line with the time it was taken, not the escapes
    clear = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    # Ends on Ctrl-C as `swarm run` and `swarm peer` do, also when started with SIGINT
    # ignored (a background job of a non-interactive shell), where Ctrl-C would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:   # redraw until Ctrl-C; a coordinator that does not answer is shown, not fatal
            try:
                st = _status_of_any(addrs, args, key_name)
                rates.observe_rows(st["members"])
                width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 1000
                text = format_table(status_document(st, rates, http=st.get("http", "")), width=width)
            except TransportError:
                raise
            except SwarmError as e:
                text = f"{time.strftime('%H:%M:%S')}  {e}"
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
            else:
                sys.stdout.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}\n")
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0   # also main()'s answer to a Ctrl-C before the first redraw


def cmd_keys(args: argparse.Namespace) -> int:
    from . import transport as tp

    names = [n.strip() for n in args.names.split(",") if n.strip()]
    if not names:   # `--names "$N"` with N unset: it made only the coordinator's pair below
        raise ConfigError(f"--names {args.names!r} is empty (an unset variable?): give comma-separated key "
                          "pair names, or leave --names out for coordinator,peer")
    # every key folder needs the coordinator's pair; one that has it can take new names
    if "coordinator" not in names and not (Path(args.dir) / "coordinator.key").exists():
        names.insert(0, "coordinator")
    # escaped: a folder's name that is not UTF-8 failed the print on a strict stdout, after
    # the keys were written
    for public in tp.generate_keys(args.dir, names):
        print(f"{printable(public)}  (secret: {printable(public)}_secret)")
    print(f"authorized public keys: {printable(Path(args.dir) / 'authorized')}/ - copy a host's NAME.key there to "
          "admit it")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.show:
        if args.resume:
            raise SwarmError("--show with --resume: a run's spec is its config.json")
        from .experiment import load_spec
        from .experiment.spec import show_spec

        spec = load_spec(args.spec, list(args.set or []))

        def shown(text: str) -> str:
            # quoted when it holds a line break (or any character a TOML comment may not
            # hold): it would end the comment, and the file would not load back
            return text if text.isprintable() else json.dumps(text)

        print(f"# swarm run {shown(args.spec) if args.spec else '(built-in default)'}"
              + "".join(f" --set {shown(o)}" for o in args.set or []) + ", resolved\n")
        print(show_spec(spec), flush=True)   # not read again: a pipe (`<(make-spec)`) gives it once
        # stderr, as `swarm run` says them: stdout stays a spec file (`--show > my.toml`)
        for line in spec.warnings():
            print(f"swarm run: warning: {line}", file=sys.stderr, flush=True)
        return 0
    from .experiment.launch import run_experiment

    return run_experiment(args.spec, list(args.set or []), resume=getattr(args, "resume", None),
                          verbose=args.verbose).exit_code


def _policies_in(folder: Path) -> list[Path]:
    """The policies `swarm eval FOLDER` plays: each peer's best.pt (peer2 before peer10),
    or its checkpoint.pt when it has none (eval.every = 0, or a swarm from before best.pt);
    of a peer folder given itself, its own."""
    def policy(d: Path) -> Path | None:
        return next((f for f in (d / "best.pt", d / "checkpoint.pt") if f.is_file()), None)

    peers = sorted((d for d in folder.glob("peer*") if d.is_dir()), key=lambda d: (len(d.name), d.name))
    for ds in (peers, [folder]):
        found = [f for f in map(policy, ds) if f is not None]
        if found:
            return found
    return []


def cmd_eval(args: argparse.Namespace) -> int:
    """`swarm eval PATH...`: greedy episodes of saved policies (best.pt, checkpoint.pt,
    or a run folder: each peer's best.pt, else its checkpoint.pt)."""
    if args.episodes < 1:
        raise SwarmError(f"--episodes must be >= 1, got {args.episodes}")
    if args.seed < 0:
        raise SwarmError(f"--seed must be >= 0, got {args.seed}")
    files: list[Path] = []
    for given in args.paths:
        if not given.strip():   # Path("") is ".": the policies in the current folder
            raise ConfigError(f"PATH {given!r} is empty (an unset variable?): give a policy file or a run folder")
        p = Path(given)
        if p.is_dir():
            found = _policies_in(p)
            if not found:
                raise SwarmError(f"{p}: no peer*/best.pt nor peer*/checkpoint.pt in it (a run folder written "
                                 "by swarm run, or one of its peer folders)")
            for f in found:
                if f.name != "best.pt":
                    print(f"swarm eval: {f.parent} has no best.pt (no evaluation ran, or a swarm from before "
                          f"best.pt); playing its {f.name}, the policy at the end of its training",
                          file=sys.stderr, flush=True)
            files += found
        elif p.is_file():
            files.append(p)
        elif p.exists():
            raise SwarmError(f"{p}: not a regular file or folder")
        else:
            raise SwarmError(f"{p}: no such file or folder")
    from .coordinator.report import columns, pad
    from .experiment.checkpoint import load_policy
    from .rl.train import evaluate

    # every file is read before any episode runs: a bad one is refused before minutes of play
    policies = [(f, *load_policy(f)) for f in files]
    for f, _, spec, meta in policies:
        if "spec_error" in meta:
            print(f"swarm eval: {f}: its spec no longer loads whole ({meta['spec_error']}); playing it with its "
                  f"env ({spec.env}) and dqn settings", file=sys.stderr, flush=True)
    # escaped (a path that is not UTF-8 failed the print on a strict stdout), and padded by
    # the columns it takes on the screen
    width = max(len("policy"), *(columns(f) for f in files))
    print(f"{'policy':<{width}} {'steps':>7} {'eval then':>9} {'mean':>7} {'min':>6} {'max':>6}")
    for f, agent, spec, meta in policies:
        returns = evaluate(spec.env, agent, episodes=args.episodes, seed=args.seed)
        then = meta.get("eval_return")
        print(f"{pad(f, width)} {meta.get('env_steps', '-'):>7} "
              f"{(f'{then:.1f}' if then is not None else '-'):>9} "
              f"{sum(returns) / len(returns):>7.1f} {min(returns):>6.0f} {max(returns):>6.0f}", flush=True)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    """`swarm launch --ray [ADDRESS] SPEC`: the experiment's peers as Ray actors, one
    (or --per-node N) per node; traffic stays on ZeroMQ, failover with the coordinator."""
    spec, address = args.spec, args.ray
    if address is None:
        raise SwarmError("choose where to launch: --ray [ADDRESS] (the only engine so far)")
    if address is _RAY_ALONE:
        address = ""
    elif not address.strip():   # `--ray "$ADDR"` with ADDR unset: not --ray alone
        raise ConfigError(f"--ray {address!r} is empty (an unset variable?): give the cluster's address, "
                          "or --ray alone for RAY_ADDRESS or a local Ray")
    if spec is None and address and (address.endswith((".toml", ".json")) or os.path.isfile(address)):
        # `swarm launch --ray spec.toml`: the optional ADDRESS swallowed the spec
        spec, address = address, ""
    from .experiment.ray_launch import launch_ray

    return launch_ray(spec, list(args.set or []), address or None, per_node=args.per_node,
                      cpus_per_peer=args.cpus_per_peer, host=args.host, verbose=args.verbose)


# ---------------------------------------------------------------- parser

#: ``--ray`` given without an address (RAY_ADDRESS, or a local Ray): not a string, so that
#: an empty one given (``--ray "$ADDR"``) can be told from it
_RAY_ALONE: Any = object()


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose --help that cannot be written raises (and so exits 1, as any
    stdout that fails): argparse drops the OSError, and `swarm run --help > /dev/full`
    exited 0 having said nothing. A usage error keeps its 2 when stderr fails, as others do."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if file is not sys.stdout:
            super()._print_message(message, file)
        elif message:
            file.write(message)
            file.flush()   # a full disk fails at the flush, after the write went to the buffer


def user_path(value: str) -> str:
    """A file or folder given on the command line, ``~`` (or ``~USER``) at its start
    expanded to the home folder (argparse's ``type`` of every option that names one): a
    shell expands it only at the start of a word, so in ``--run-dir=~/x`` it came as a
    ``~`` that made a folder of that name in the current one. A config's path keys
    (``peer.keys_dir``, from a file or ``--set``) are expanded so where they are read
    (:func:`swarm.config.from_dict`)."""
    return os.path.expanduser(value)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="swarm", description="Decentralized RL over ZeroMQ gossip.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    # -v after the command too (`swarm run -v`). A dest of its own: the command's parser
    # counts into a namespace of its own, which would replace the count before the command
    # with the same dest; parse_args adds the two up.
    loud = _Parser(add_help=False)
    loud.add_argument("-v", "--verbose", dest="verbose_after", action="count", default=0,
                      help="more logging (-vv for debug); `swarm run` and `swarm launch` pass it on "
                           "to their coordinator and peers")
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("coordinator", help="run a coordinator (membership and failover only)", parents=[loud])
    c.add_argument("--bind", default=None, help=f"address to bind (default tcp://127.0.0.1:{DEFAULT_PORT})")
    c.add_argument("--keys", type=user_path,
                   help="CurveZMQ key folder (from `swarm keys generate`): encrypt and authenticate")
    c.add_argument("--others", help="comma-separated addresses of the other coordinators (primary/standbys)")
    c.add_argument("--config", type=user_path, help="TOML or JSON config file")
    c.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value")
    c.set_defaults(func=cmd_coordinator)

    q = sub.add_parser("peer", help="run one peer; joins the coordinator and links to its neighbours", parents=[loud])
    q.add_argument("--coordinator", help="coordinator address, or several comma-separated (primary first; "
                   "else SWARM_COORDINATOR or MASTER_ADDR)")
    q.add_argument("--bind", help="address to bind (default tcp://127.0.0.1:*)")
    q.add_argument("--id", help="peer id (default HOSTNAME-PID)")
    q.add_argument("--replace", metavar="ID", help="take over the role (rank, seeds) of dead member ID")
    q.add_argument("--rank", type=int, help="requested rank (else SWARM_RANK, SLURM_PROCID or RANK; with "
                   "--replace, the dead member's)")
    q.add_argument("--topology", help="ring, grid, torus, exponential, full ...")
    q.add_argument("--keys", type=user_path, help="CurveZMQ key folder (from `swarm keys generate`)")
    q.add_argument("--key-name", default=None, help="this peer's key pair in --keys (default peer)")
    q.add_argument("--config", type=user_path, help="TOML or JSON config file")
    q.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value")
    q.add_argument("--spec", type=user_path,
                   help="experiment spec (e.g. a run's config.json): train this peer's share of it")
    q.add_argument("--run-dir", type=user_path,
                   help="with --spec: the run folder this peer writes into (peer{RANK}/); default "
                        "runs/NAME-peerRANK (NAME the spec's name), where a fresh start is refused if an earlier "
                        "run is there")
    q.add_argument("--resume", "--resume-from", dest="resume_from", metavar="RUN_DIR", type=user_path,
                   help="with --spec: start from the newest checkpoint in RUN_DIR/peer{RANK}/ckpt/ "
                        "(parameters, optimizer, buffer, counters) and train what is left of the budget")
    q.add_argument("--new-run", action="store_true",
                   help="with --resume: a new run from RUN_DIR's checkpoint, also into a --run-dir that holds "
                        "an earlier resume from it (by default the same command again goes on with that run)")
    q.set_defaults(func=cmd_peer)

    s = sub.add_parser("status", help="show the member table and current view", parents=[loud])
    s.add_argument("--coordinator", help="coordinator address(es), comma-separated: the active one that answers, "
                   "a standby only if none does (else SWARM_COORDINATOR or MASTER_ADDR)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--keys", type=user_path, help="CurveZMQ key folder, when the swarm uses keys")
    s.add_argument("--key-name", help=f"key pair to authenticate with (default {STATUS_KEY_NAME})")
    s.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for an answer (default 2)")
    s.add_argument("--watch", action="store_true", help="redraw a live table (with rates) until Ctrl-C")
    s.add_argument("--interval", type=float, default=1.0, help="with --watch: seconds between redraws (default 1)")
    s.set_defaults(func=cmd_status)

    k = sub.add_parser("keys", help="CurveZMQ keys: `swarm keys generate DIR`", parents=[loud])
    k.add_argument("action", choices=["generate"], help="what to do")
    k.add_argument("dir", type=user_path, help="key folder to create, or an existing one to add new key pairs to")
    k.add_argument("--names", default="coordinator,peer",
                   help="comma-separated key pair names (default coordinator,peer; coordinator is added "
                        "when DIR has no coordinator.key); an existing key is never overwritten")
    k.set_defaults(func=cmd_keys)

    r = sub.add_parser("run", help="run an experiment: a coordinator and N peers on this host", parents=[loud])
    r.add_argument("spec", nargs="?", type=user_path,
                   help="spec file (TOML or JSON); none runs the built-in default")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec value")
    r.add_argument("--resume", metavar="RUN_DIR", type=user_path,
                   help="continue a run from its checkpoints (its config.json is the spec; a new run folder)")
    r.add_argument("--show", action="store_true",
                   help="print the resolved spec as TOML, every key with its help, and exit without running "
                        "(`swarm run --show > my.toml` starts a spec file)")
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("eval", help="greedy episodes of saved policies: best.pt, checkpoint.pt or run folders",
                       parents=[loud])
    e.add_argument("paths", nargs="+", metavar="PATH", type=user_path,
                   help="a peer's best.pt or checkpoint.pt, or a run folder (each peer's best.pt, else its "
                        "checkpoint.pt)")
    e.add_argument("--episodes", type=int, default=10, help="episodes per policy (default 10)")
    e.add_argument("--seed", type=int, default=20_000,
                   help="seed of the first episode (default 20000; training evaluations use 10000 + 100 * rank)")
    e.set_defaults(func=cmd_eval)

    la = sub.add_parser("launch", help="run an experiment on a cluster: `swarm launch --ray [ADDRESS] SPEC`",
                        parents=[loud])
    la.add_argument("--ray", nargs="?", const=_RAY_ALONE, metavar="ADDRESS",
                    help="place the peers on a Ray cluster (auto, HOST:PORT, ray://HOST:10001; none: "
                         "RAY_ADDRESS or a local Ray); needs Ray: pip install 'ray>=2.9'")
    la.add_argument("spec", nargs="?", type=user_path,
                    help="spec file (TOML or JSON); none runs the built-in default")
    la.add_argument("--per-node", type=int, default=1, help="peers per node (spec's peers = nodes x this; default 1)")
    la.add_argument("--cpus-per-peer", type=float, default=1.0, help="CPUs each peer actor reserves (default 1.0)")
    la.add_argument("--host", help="address the coordinator and peers bind (default: each node's own address)")
    la.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec value")
    la.set_defaults(func=cmd_launch)
    return p


#: The options, by dest, that name a file, a folder, an address or an id (SPEC and DIR
#: are positional). An empty value is what `"$SPEC"` gives with the variable unset, and
#: each was taken for one left out: `swarm run ""` ran the built-in default, `swarm keys
#: generate ""` wrote keys into the current folder. (--keys has its own: _keys_folder.)
_NOT_EMPTY = {"config": "--config", "bind": "--bind", "others": "--others", "coordinator": "--coordinator",
              "id": "--id", "replace": "--replace", "topology": "--topology", "spec": "--spec",
              "run_dir": "--run-dir", "resume_from": "--resume", "resume": "--resume", "dir": "DIR",
              "host": "--host"}


def _refuse_empty(args: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` for an option of :data:`_NOT_EMPTY` given an empty or blank value."""
    for dest, flag in _NOT_EMPTY.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            if dest == "spec" and args.cmd != "peer":
                flag = "SPEC"   # the positional of `swarm run` and `swarm launch`
            raise ConfigError(f"{flag} {value!r} is empty (an unset variable?)"
                              + ("" if dest == "dir" else f"; leave {flag} out for its default"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed; ``verbose`` counts each -v, before and after the
    command's name (``swarm -v run -v`` is -vv). An empty value of an option that
    names a file, folder, address or id is refused (:class:`ConfigError`)."""
    args = build_parser().parse_args(argv)
    args.verbose += vars(args).pop("verbose_after")
    _refuse_empty(args)
    if getattr(args, "bind", None):
        args.bind = args.bind.strip()   # as each --coordinator address is (a quoted " $ADDR")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns its exit status:
    0, 2 for an error (``swarm: error: ...`` on stderr), 130 for Ctrl-C, 1 when stdout or
    stderr cannot be written (the reader of a pipe left, a full disk: no traceback; a
    failed stdout is named on stderr unless the reader left), or what the command says
    (`swarm run`'s codes)."""
    _standard_fds()
    # (not again in a main() called while another runs, from another thread)
    wrap = not isinstance(sys.stdout, _Stream)
    if wrap:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Stream(sys.stdout, "stdout"), _Stream(sys.stderr, "stderr")
    try:
        return _main(argv)
    finally:
        try:
            sys.stdout.flush()   # after an error too: what is left fails here, in silence, not at exit
        except OSError:
            _to_devnull(1)
        if wrap:
            sys.stdout, sys.stderr = saved


def _main(argv: list[str] | None) -> int:
    args = None
    try:
        args = parse_args(argv)
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        code = args.func(args) or 0
        sys.stdout.flush()   # a pipe's or a file's buffer: failing here, not at exit
        return code
    except SwarmError as e:
        # the error's code also when stderr cannot take the message
        _tell(f"swarm: error: {e}")
        if isinstance(e, ConfigError) and os.environ.get("SWARM_PARENT_PID"):
            _tell(CONFIG_ERROR_NOTE)
        return 2
    except KeyboardInterrupt:
        # `swarm status --watch` runs until Ctrl-C: that is its normal end, however early it comes
        return 0 if getattr(args, "watch", False) else 130
    except OSError as e:
        if hasattr(e, "swarm_stream"):
            # `swarm run --show | head`, `swarm status > /dev/full`: say nothing more, not even at exit
            return _output_failed(e)
        # a path given or made that this user may not enter (EACCES), a name too long, a full
        # disk: pathlib's is_dir() and exists() raise too; or one of no path, which the system
        # ran out of (EMFILE from the pipes of `swarm run`'s first start; -vv logs where).
        # Not a ConfigError: under `swarm run` a restart is still tried, as for a crash.
        if e.filename is None:
            log.debug("the OSError, where it was raised", exc_info=True)
            _tell(f"swarm: error: {e.strerror or e}")
            return 2
        _tell(f"swarm: error: {e.filename}" + (f" -> {e.filename2}" if e.filename2 else "")
              + f": {e.strerror or e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
