"""The body of one peer process in an experiment.

`swarm peer --spec config.json --rank R --coordinator ADDR --run-dir DIR` calls
:func:`run_peer`. It joins the swarm through a :class:`~swarm.peer.SyncPeer`
(network on its own thread), builds the DQN agent over a replay buffer that a
:class:`~swarm.buffer.Federation` shares with the neighbours, and trains on the
main thread with the same loop as the isolated learner
(:func:`swarm.rl.train.run_agent`). Every ``gossip.interval`` env steps it runs
one gossip round and one federation flush on the peer's loop.

It writes into ``DIR/peer{R}/``:

``metrics.csv``   one row per finished episode (return, mean of the last 10,
                  rounds, bytes, loss, epsilon, buffer size, wall time)
``rounds.csv``    one row per gossip round: ``round`` the run's count of rounds (as in
                  metrics.csv), ``gossip_round`` the gossip engine's round number (empty
                  without averaging), participants, bytes (the gossip's since the row before,
                  relayed gradients included), wait, disagreement, and
                  ``shared_items`` the replay items sent since the row before: a round
                  whose gossip raised GossipError has no row (it is logged and skipped),
                  but its federation flush still went, and acked.bin took its ids
``evals.csv``     greedy evaluations (when ``eval.every`` > 0)
``tb/``           TensorBoard event files (when tensorboard is installed); a run that starts
                  in the folder removes an earlier run's (:func:`_drop_old_results`)
``ckpt/``         full and incremental checkpoints (see :mod:`swarm.experiment.checkpoint`)
``checkpoint.pt`` ``{"agent": state_dict, "params": flat float32 tensor, ...}`` at the end
``best.pt``       the same at the best greedy evaluation so far (with its ``eval_return``)
``resumed.json``  on a resume: the checkpoint used, the digest of the state restored and
                  the old run's peer folder this one continues (kept by every restart)
``run.json``      the id of the run this folder holds and the runs it continues
                  (:class:`~swarm.experiment.checkpoint.Lineage`; kept by every restart)
``acked.bin``     with ``buffer.replicas`` > 0: int64 sequence numbers of this peer's items
                  that neighbours acknowledged (appended each round, whole entries only:
                  :func:`_append_whole`; a restarted process may append an id its
                  predecessor did; a run that starts in the folder removes an earlier run's)
``ids.json``      with ``buffer.replicas`` > 0, at the end: ids of every item held
``summary.json``  final figures, read by the launcher's summary table (``rounds_ok``: the
                  rounds that averaged with a neighbour, so none with ``gossip.average``
                  off); an earlier process's goes before this one trains (on a fresh start,
                  at once), and a resume or restart that fails before it trains leaves it,
                  and ids.json, as they were

SIGTERM or SIGINT ends the current step, writes all of the above and leaves
the swarm cleanly. SIGKILL loses the env steps since the last checkpoint.

A disk that fills (or goes read only) does not end the run: a checkpoint, ``best.pt``,
``checkpoint.pt``, ``ids.json``, an ``acked.bin`` append (its ids go unrecorded), a CSV
flush or a TensorBoard write that fails is logged (once per file) and counted, and
training goes on; the files written before stay whole.
summary.json records the counts (``checkpoint_failures``, ``write_failures``); one that
cannot be written itself is logged and leaves none (not an earlier process's, which the
launcher's table would show as this one's), and the peer still ends as it would have
(:func:`run_peer` returns the figures). Before it trains, a file
it cannot write (``run.json``, ``resumed.json``, the copy of ``best.pt``, a CSV file)
is a ConfigError that names it: the next start would meet the same disk.

A peer that joins a swarm already training bootstraps its parameters from its
neighbours (:meth:`swarm.gossip.Gossip.bootstrap`) before its first step: when
the coordinator's member table shows another member more than
``gossip.interval`` env steps ahead of this peer and past ``dqn.learning_starts``
(a late joiner, a restarted peer, a resume from a checkpoint older than the
neighbours'), or, when the table cannot be read, when this peer replaces a dead
member or resumes. A fresh run whose peers all start together does not
bootstrap (the first to start is a few steps ahead, but has not learned yet),
nor does a whole swarm resumed from one set of checkpoints.

A peer that continues its own folder (restarted with ``--replace`` or resumed from
its own run folder) appends to its CSV files, after rewriting them without the rows
past the env steps it continues from (:func:`_keep_rows_upto`), which it trains and
logs again; a resumed or restarted peer starts
from the counters of its checkpoint (env steps, episodes, rounds, bytes, and the wall
and CPU seconds that the CSVs' ``wall_s`` and ``cpu_s`` go on from) and from
the best evaluation of the process or run it continues (``best.pt``, copied into
a new run folder).
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import errno
import hashlib
import io
import json
import logging
import math
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from ..buffer.persist import create_new, no_link, refuse_foreign_link, resume_sequence, write_synced
from ..buffer.replay import seq_floor
from ..config import PeerConfig, read_file, to_dict
from ..errors import ConfigError, GossipError, PeerTimeout, SwarmError
from .checkpoint import (MAX_LINEAGE, Checkpointer, DivergedCheckpoint, Lineage, array_digest, json_bytes, latest,
                         load_newest, newest_lineage, nonfinite, read_checkpoint_pt, read_lineage, state_digest,
                         write_json, write_lineage, write_whole)
from .spec import BufferSpec, Spec, _plain_number

if TYPE_CHECKING:
    from ..gossip import GradientRelay

log = logging.getLogger("swarm.experiment")

__all__ = ["run_peer", "stop_on_signals", "peer_dir"]

EPISODE_FIELDS = ["wall_s", "env_steps", "episode", "episode_return", "mean_return", "rounds",
                  "gossip_bytes_out", "gossip_bytes_in", "bytes_out", "bytes_in", "loss", "epsilon",
                  "buffer_size"]
ROUND_FIELDS = ["round", "env_steps", "wall_s", "participants", "missing", "bytes_out", "bytes_in",
                "waited_s", "disagreement", "shared_items", "gossip_round"]
EVAL_FIELDS = ["wall_s", "cpu_s", "env_steps", "eval_return"]
#: the byte counters that a checkpoint carries over to the process that resumes from it
TRAFFIC_KEYS = ("gossip_bytes_out", "gossip_bytes_in", "bytes_out", "bytes_in")
#: ... and the seconds (the CSVs' wall_s, and evals.csv's cpu_s: CPU time since training started)
SECONDS_KEYS = ("wall_s", "cpu_s")
#: TensorBoard events (one per _Logs.scalars call) go to its writer together at each flush, or once this many wait,
#: or once the oldest has waited _TB_WAIT_S (the writer's own flush period: a live view lags no more than before)
_TB_BATCH = 32
_TB_WAIT_S = 10.0
#: with gossip.exchange = gradients, summary.json keeps a digest of the parameters every this many updates
DIGEST_EVERY = 100
#: ... all of the last 2 × this many, and fewer of the older ones the older they are (:func:`_thin_digests`,
#: run once every this many digest points)
DIGESTS_RECENT = 100


#: a warning that may come at every step or round (a neighbour's gradient refused, a gossip
#: round that raised) is logged at most once per this many seconds (:class:`_Recurring`)
RECURRING_LOG_S = 60.0


class _Recurring:
    """A warning that may come at every step or round: the first is logged, then at most
    one per ``every`` seconds, with how many came since the last one logged (a neighbour
    that sends a bad gradient every turn would otherwise flood the log). The caller still
    counts each, and keeps the latest in ``last_error``."""

    def __init__(self, every: float = RECURRING_LOG_S) -> None:
        self.every, self._next, self._since = every, -math.inf, 0

    def __call__(self, msg: str, *args: Any) -> None:
        self._since += 1
        now = time.monotonic()
        if now < self._next:
            return
        more = f" ({self._since - 1} more since the last one logged)" if self._since > 1 else ""
        log.warning(msg + "%s", *args, more)
        self._next, self._since = now + self.every, 0


def peer_dir(run_dir: str | Path, rank: int) -> Path:
    """Where the peer of this rank writes its files."""
    return Path(run_dir) / f"peer{rank}"


def make_peer_dir(run_dir: str | Path, rank: int, where: str = "") -> Path:
    """Create the folder of the peer of this rank (see `peer_dir`) and return it; a
    ConfigError that names ``where`` (default: the run folder) when it cannot, or when it,
    its ``tb/`` or its ``ckpt/`` is a symbolic link that another user made
    (:func:`~swarm.buffer.persist.refuse_foreign_link`)."""
    out = peer_dir(run_dir, rank)
    for folder in (out, out / "tb", out / "ckpt"):   # swarm writes into these, and prunes tb/ and ckpt/
        try:
            refuse_foreign_link(folder)
        except ConfigError as e:
            raise ConfigError(f"{where or f'run folder {run_dir}'}: {e}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{where or f'run folder {run_dir}'}: cannot create {out} ({in_the_way(out, e)}); "
                          "pass a --run-dir this process can write") from None
    return out


def in_the_way(folder: Path, e: OSError) -> str:
    """Why ``folder`` cannot be made, from the error ``e`` of its ``mkdir(parents=True)``: what
    is wrong with the folder above it that ``e`` names, or with ``folder`` itself. A link to
    a target that is gone (a scratch disk not mounted, or purged) is named with its target."""
    part = Path(e.filename) if e.filename else folder
    if os.path.islink(part) and not os.path.exists(part):   # (both False where part cannot be looked at)
        return f"{part} is a symbolic link to {os.readlink(part)}, which does not exist"
    # a file there: mkdir's "exists" reads as if the folder were there
    why = os.strerror(errno.ENOTDIR) if isinstance(e, FileExistsError) else e.strerror or str(e)
    return why if part == folder else f"{part}: {why}"


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM, SIGINT and SIGHUP (the terminal closed; not when it is
    ignored, as under ``nohup``) set (main thread only).

    The training loop checks it between env steps, so a signal ends the run
    after the current step instead of in the middle of a write.
    """
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)
    return stop


def _read_checkpoint_pt(path: Path, skipped: list[str], run: str | None = None) -> dict[str, Any] | None:
    """A peer's ``checkpoint.pt`` (agent state and env steps, no buffer), or None when
    there is none, it cannot be read or, with ``run``, another run wrote it (then why is
    logged and added to ``skipped``)."""
    if not path.is_file():
        return None
    try:
        ck = read_checkpoint_pt(path)
        if run is not None and ck.get("run") != run:
            raise ConfigError(f"{path} belongs to another run ({ck.get('run') or 'one from before run ids'}), "
                              f"not to run {run}")
        return ck
    except ConfigError as e:
        log.warning("%s", e)
        skipped.append(str(e))
        return None


def _thin_digests(digests: dict[int, str], newest: int, recent: int) -> None:
    """Drop the digests (update count -> digest, one per ``DIGEST_EVERY`` updates) that
    ``summary.json`` no longer keeps, ``newest`` being the latest update count.

    Of the digest points ``a`` points older than the newest, all of the last ``2·recent``
    are kept, and of those with ``a`` in ``[2^j·recent, 2^(j+1)·recent)`` (j >= 1) one in
    ``2^j``: those whose point number (count / DIGEST_EVERY) is a multiple of ``2^j``.
    That is ``recent·(2 + log2(n / (2·recent)))`` of ``n`` points: 1,195 after 20 million
    updates, 0.06 MB of summary.json (all 200,000 were kept: 33 MB in memory, 9.5 MB in
    the file). What is kept depends only on the counts and only shrinks as the run goes
    on, so peers that reached about the same count hold the same older counts, and the
    launcher still finds where their copies began to differ
    (:func:`swarm.experiment.launch._first_divergence`): exactly in the last
    ``2·recent`` points, else to within ``1/recent`` of how far before the end that was.
    """
    last = newest // DIGEST_EVERY
    for u in list(digests):
        point = u // DIGEST_EVERY
        stride = 1 << max(0, ((last - point) // recent).bit_length() - 1)   # 1 for the last 2·recent
        if point % stride:
            del digests[u]


def _goes_on(out: Path, old: Path | None, rejoin: bool, new_run: bool = False) -> Lineage | None:
    """The run recorded in ``out`` (its ``run.json``) when this process goes on with it,
    or None when it starts a run there.

    A restart into ``out`` (``--replace``, a resume from ``out`` itself) goes on with
    it. So does a resume from another peer folder ``old`` into an ``out`` whose run
    was itself resumed from the run that wrote ``old``'s newest checkpoint (by run id;
    with none in ``old``, the newest of the run it continues: :func:`resume_sources`),
    as ``swarm run`` restarts a peer that had no checkpoint in ``out`` yet, or as a
    person runs the same ``swarm peer --resume OLD`` again: the checkpoints it wrote
    in ``out`` since are newer than ``old``'s and come first. A fresh start, a resume
    from a run that ``out``'s does not continue, or one told that it is a ``new_run``
    (the folders alone cannot tell a new run resumed from the same checkpoint into the
    same folder from the same command run again), starts a run."""
    if new_run:
        return None
    here = read_lineage(out)
    if old is None:
        return here if rejoin and here.id is not None else None
    if old.resolve() == out.resolve():
        return here   # of no id when the folder predates run ids: then any checkpoint in it is its own
    for src, _ in resume_sources(old):   # where a resume from old takes its checkpoint
        theirs = newest_lineage(src)
        if theirs is not None:
            return here if here.continues[:1] == ((str(src.resolve()), theirs.id),) else None
    return None


def _at_start(run_dir: str | Path, change: Callable[[], Any], path: Path | None = None, verb: str = "write") -> Any:
    """``change`` the peer's folder before it trains (``run.json``, ``resumed.json``, the
    copy of the best evaluation it continues, its CSV files), or raise ConfigError
    naming the file (``path``, else the one the OSError names), why, and what to do (make
    room, or make it writable). A disk that is full or read only then would fail the
    next start the same way: the launcher does not restart the peer, and the user reads
    the file and the cause, not a traceback.
    No file descriptor left (EMFILE, ENFILE) is not the disk's: that OSError is raised
    as it is, a crash that a restart may cure.
    (Once it trains, a write that fails is logged and counted instead: :class:`_Unwritten`.)"""
    try:
        return change()
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):   # no file descriptor left: not the disk's fault,
            raise                                    # and another start may have them
        name = path or e.filename
        if isinstance(name, bytes):   # as some libraries name it (TensorBoard): shown as b'...'
            name = os.fsdecode(name)
        raise ConfigError(f"run folder {run_dir}: cannot {verb} {name} ({e.strerror or e}); "
                          f"{_remedy(e, name)}, or pass a --run-dir this process can write") from None


def _remedy(e: OSError, name: Any) -> str:
    """What to do about the OSError ``e`` met on the file or folder ``name``: a file or
    folder that is another's, or read only, wants to be made writable (room on the disk
    does not help there); a disk that is full, or mounted read only, wants its room."""
    if e.errno in (errno.EACCES, errno.EPERM):
        try:   # the file, else the folder it would be in
            owner = os.stat(name if os.path.lexists(name) else os.path.dirname(name)).st_uid
        except (OSError, TypeError, ValueError):
            return "make it writable by this user"
        return f"make it writable by this user (its owner is uid {owner}, this process's {os.geteuid()})"
    return "make room on its disk"


def _check_room(path: Path, data: bytes) -> None:
    """Raise the OSError (naming ``path``) that writing ``data`` to ``path`` would meet now
    (a full or read-only disk), without touching ``path``: ``data`` goes to a temporary
    file of this process beside it, synced (a full disk may fail only there), then removed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.check")   # not write_whole's: another process may use that
    try:
        create_new(tmp)   # a link planted there is not written through
        write_synced(tmp, data)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        _discard(tmp)


def _discard(path: Path) -> None:
    """Remove ``path`` if it is there (a temporary file, or a file that must not stay):
    a failure is logged, as it must not hide the error that led here."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)


def _record_resume(out: Path, rec: dict[str, Any], starts: Lineage | None = None) -> None:
    """Write ``out/resumed.json`` (``rec``) and, for a run that ``starts`` there, its
    ``run.json``: both or neither. run.json's temporary file is written first, then
    resumed.json whole, then the temporary file is renamed over run.json, so a write that
    fails (a full disk) leaves the folder's record of its run as it was, and its old
    resumed.json with it. Raises OSError naming the file that failed."""
    resumed = out / "resumed.json"

    def record_resumed() -> None:
        try:
            write_json(resumed, rec, indent=1)
        except OSError as e:   # named by the file, not by its temporary one
            raise OSError(e.errno, e.strerror, str(resumed)) from e

    if starts is None:
        return record_resumed()

    def both(tmp: Path) -> None:
        try:
            write_synced(tmp, json_bytes(starts.record(), indent=1))   # what write_lineage writes
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(out / "run.json")) from e
        record_resumed()

    write_whole(out / "run.json", both)


def _drop_old_results(run_dir: str | Path, out: Path) -> None:
    """Remove what an earlier run left in ``out`` that this run would add to: its
    ``acked.bin`` (scripts/chaos.py counted its ids as lost against this run's
    ``ids.json``) and ``tb/``'s event files (TensorBoard showed both runs at the same
    steps). For a run that starts in the folder, whose CSV files start afresh too; a
    restart that goes on with the folder's run keeps them. ConfigError (as
    :func:`_at_start`) when one cannot be removed, or when ``tb/`` is a symbolic link that
    another user made (its event files are not this peer's to remove)."""
    refuse_foreign_link(out / "tb")
    _at_start(run_dir, lambda: (out / "acked.bin").unlink(missing_ok=True), out / "acked.bin", "remove")
    for p in sorted((out / "tb").glob("events.out.tfevents.*")):
        _at_start(run_dir, lambda p=p: p.unlink(missing_ok=True), p, "remove")


#: bytes of one entry of ``acked.bin``: an int64 sequence number
ACKED_ENTRY_BYTES = 8


def _append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` (whole :data:`ACKED_ENTRY_BYTES`-byte entries) to ``path``, all of it or none.

    A write that fails part way (a full disk may take some of it, and refuse the rest)
    is cut back off and raises OSError: a torn entry would shift every entry appended
    after it. A torn last entry that a killed process left is cut off first.
    """
    with open(path, "ab", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        whole = size - size % ACKED_ENTRY_BYTES
        try:
            if whole != size:
                f.truncate(whole)
            left = memoryview(data)
            while left:
                left = left[f.write(left):]
        except OSError:
            try:
                f.truncate(whole)
            except OSError:
                pass   # what was written stays; the next append cuts back a torn entry
            raise


def _keep_rows_upto(path: Path, env_steps: int) -> int:
    """Rewrite the CSV file ``path`` without its rows past ``env_steps``; returns how many went.

    A peer restarted or resumed into its own folder trains again the env steps since
    the checkpoint it continues from: the rows its predecessor logged for them would
    appear twice. A last line without its newline (the writer was killed mid-row)
    goes too, and so does a line that is not UTF-8 (damaged: read as text, it ended the
    restart with a UnicodeDecodeError). The rows kept replace the file whole
    (:func:`~swarm.experiment.checkpoint.write_whole`).
    """
    try:
        text = path.read_bytes().decode("utf-8", "replace")   # a byte that is not UTF-8 reads as U+FFFD
    except FileNotFoundError:
        return 0
    lines = list(io.StringIO(text, newline=""))
    header = next(csv.reader(lines[:1]), [])
    if "env_steps" not in header:
        return 0   # empty, or not one of ours: nothing to go by
    col = header.index("env_steps")
    keep = [lines[0]]
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        try:
            ok = line.endswith("\n") and "\ufffd" not in line and int(row[col]) <= env_steps
        except (IndexError, ValueError):
            ok = False
        if ok:
            keep.append(line)
    if len(keep) == len(lines):
        return 0
    write_whole(path, lambda tmp: write_synced(tmp, "".join(keep).encode()))
    return len(lines) - len(keep)


def _header(path: Path) -> list[str]:
    """The column names on the first line of the CSV file ``path`` ([] if it has none)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:   # a damaged byte: U+FFFD, not an error
        return next(csv.reader([f.readline()]), [])


@dataclasses.dataclass
class _Outage:
    """A file's writes failing since ``since`` (time.monotonic): ``failed`` of them; ``logged``: its error."""
    since: float
    failed: int = 0
    logged: bool = False


class _Unwritten:
    """The peer's result files that could not be written (a full disk, one gone read only),
    counted by file; training goes on without them.

    The first failure of each outage of a file is logged as an error, the others only
    counted (a full disk fails a write at every flush), and the latest goes to the
    heartbeat's ``last_error``. For a file whose writes that succeed come to
    :meth:`written` (the CSV files) the first of them ends the outage, with a warning,
    and its next outage is logged again, but not sooner than ``RECURRING_LOG_S`` after
    its last error (a disk about full may fail every other flush). summary.json
    records both (``write_failures``, ``write_error``); summary.json itself, written
    once at the end, is only logged (its counts are in what :func:`run_peer` returns).
    """

    def __init__(self, rank: int, state: _State | None = None) -> None:
        self.rank, self.state = rank, state
        self.counts: dict[str, int] = {}
        self.last_error: str | None = None
        self._down: dict[str, _Outage] = {}   # the files failing now
        self._quiet: dict[str, float] = {}    # file -> until when a new outage's error waits (time.monotonic)

    def __call__(self, what: str, e: OSError, after: str = "training goes on") -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        if isinstance(e.filename, bytes):   # TensorBoard's: shown as b'...'
            e = OSError(e.errno, e.strerror, os.fsdecode(e.filename))
        self.last_error = f"{what}: {e.strerror or e}"
        if self.state is not None:
            self.state.error(f"cannot write {self.last_error}")
        now = time.monotonic()
        down = self._down.setdefault(what, _Outage(now))
        down.failed += 1
        if not down.logged and now >= self._quiet.get(what, -math.inf):
            down.logged, self._quiet[what] = True, now + RECURRING_LOG_S
            # summary.json is where the others are counted, written once: of its failure only this line tells
            then = (f"{after}, and this process's figures are not on disk" if what == "summary.json"
                    else f"{after} (further failures of it are only counted, in summary.json)")
            log.error("peer%d: cannot write %s (%s); %s", self.rank, what, e, then)

    def written(self, what: str) -> None:
        """A write of ``what`` succeeded: the end of its outage, if it had one (logged if its start was)."""
        down = self._down.pop(what, None)
        if down is not None and down.logged:
            log.warning("peer%d: %s written again after %.0f s (%d failed writes of it meanwhile)",
                        self.rank, what, time.monotonic() - down.since, down.failed)


class _Rows:
    """A CSV writer whose rows a full disk loses instead of ending the run (see :class:`_Unwritten`)."""

    def __init__(self, f: Any, fields: list[str], failed: _Unwritten, extra: str = "raise") -> None:
        self._w = csv.DictWriter(f, fieldnames=fields, extrasaction=extra)
        self._name, self._failed = Path(f.name).name, failed

    def writeheader(self) -> None:
        self._w.writeheader()

    def writerow(self, row: dict[str, Any]) -> None:
        try:
            self._w.writerow(row)
        except OSError as e:   # its buffer was full and could not go to disk: these rows are lost
            self._failed(self._name, e, "its rows are lost while this lasts; training goes on")


def _tb_logdir(path: Path) -> tuple[str | None, int | None]:
    """A name of the folder ``path`` that TensorBoard's writer can use, and the file
    descriptor to keep open while it does (None when the name needs none), or
    ``(None, None)`` when there is no such name.

    TensorBoard turns a file name into bytes as UTF-8, not as the file system does
    (os.fsencode): a name that is not UTF-8 in this locale (a non-ASCII one under a
    Latin-1 locale, one holding Latin-1 bytes under a UTF-8 one) named another file, or
    none. Linux reaches an open folder by the ASCII name ``/proc/self/fd/N`` too."""
    name = str(path)
    try:
        if name.encode("utf-8") == os.fsencode(name):
            return name, None
    except UnicodeEncodeError:   # a byte that is not UTF-8, kept as a lone surrogate
        pass
    if not os.path.isdir("/proc/self/fd"):
        return None, None
    path.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}", fd


class _Logs:
    """The peer's CSV files and (optionally) TensorBoard writer.

    With ``append``, existing files are continued; ``upto`` (env steps) then first drops
    their rows past it, which the peer is about to train and log again, and TensorBoard
    hides the events past it (``purge_step``). A file that an earlier version wrote with
    other columns is continued with its own (the new ones left out), so that its rows
    still line up with its header.

    A write that fails (a full disk) goes to ``failed`` and training goes on: rows that
    wait in a file's buffer are written at its next flush that succeeds, those that did
    not fit in it are lost; TensorBoard's writer, which stops at its first failure, is
    dropped (no event files after it), and its thread's traceback is logged at DEBUG,
    not printed raw to stderr.
    """

    #: how long closing waits for TensorBoard's writer thread to end before giving threading its hook back
    _TB_THREAD_END_S = 5.0

    def __init__(self, out: Path, tensorboard: bool = True, append: bool = False,
                 upto: int | None = None, failed: _Unwritten | None = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self._append = append   # a peer resumed into its own folder continues its files
        self._upto = upto
        self._failed = failed or _Unwritten(-1)
        self._files = []
        self.tb = None
        self._tb_fd: int | None = None   # tb/ kept open for the writer, which names it /proc/self/fd/N
        self._summary: Any = None   # tensorboard's Summary proto, with the writer
        self._events: list[tuple[Any, int, float]] = []   # (summary, step, wall time) not yet handed over
        self._tb_hook: tuple[Callable, Callable, list[threading.Thread], Callable] | None = None   # _hook_tb_thread
        try:
            self.episodes = self._csv(out / "metrics.csv", EPISODE_FIELDS)
            self.rounds = self._csv(out / "rounds.csv", ROUND_FIELDS)
            self.evals = self._csv(out / "evals.csv", EVAL_FIELDS)
            if tensorboard:
                try:
                    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415 - slow, optional
                    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
                except ImportError:
                    log.warning("tensorboard is not installed; no event files (pip install 'tensorboard>=2.15')")
                else:
                    refuse_foreign_link(out / "tb")   # its events would go where it points
                    logdir, self._tb_fd = _tb_logdir(out / "tb")
                    if logdir is None:
                        log.warning("TensorBoard events disabled: TensorBoard cannot name %s (it encodes file "
                                    "names as UTF-8, which this one is not in this locale, and there is no "
                                    "/proc/self/fd to reach it by)", out / "tb")
                    else:
                        # the events past upto, like the CSV rows dropped, are logged again now
                        purge = upto + 1 if append and upto is not None else None
                        # before the writer: its constructor writes and flushes its first event
                        self._hook_tb_thread()
                        try:
                            self.tb = SummaryWriter(logdir, flush_secs=10, purge_step=purge)
                        except OSError as e:   # tb/ read only, or full: as a writer that fails later
                            self._failed("tb/", e, "no TensorBoard event files in this run; training goes on")
                            self._unhook_tb_thread()
                            self._close_tb_fd()
                        else:
                            self._summary = Summary
                            self._tb_hook_known()
        except BaseException:
            # the files opened before the one that failed are closed now, not whenever the
            # error's traceback (which holds them) goes
            for f in self._files:
                try:
                    f.close()
                except OSError:
                    pass   # a header that did not fit: the caller reports the failure that came first
            self._unhook_tb_thread()
            self._close_tb_fd()
            raise

    def _csv(self, path: Path, fields: list[str]) -> _Rows:
        try:
            if self._append and self._upto is not None:
                dropped = _keep_rows_upto(path, self._upto)
                if dropped:
                    log.info("%s: dropped %d rows past env step %d (trained again now)", path, dropped, self._upto)
            fresh = not (self._append and path.is_file() and path.stat().st_size > 0)
            there = [] if fresh else _header(path)
            f = open(path, "w" if fresh else "a", newline="", opener=no_link)   # a link there: refused
        except OSError as e:   # named by the file, not by its temporary one (or by none: a failed write)
            raise OSError(e.errno, e.strerror, str(path)) from e
        self._files.append(f)
        if "env_steps" in there and there != fields:   # an earlier version's columns
            w = _Rows(f, there, self._failed, extra="ignore")
        else:
            w = _Rows(f, fields, self._failed)
        if fresh:
            w.writeheader()
        return w

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log the finite ``values`` (None is left out) to TensorBoard at ``step``.

        A reader sees the scalars that one ``add_scalar`` each would give, wall times
        included, but the writer's work is cut: its thread pays a CRC computed in pure
        Python per record and a wake-up per event, which for the two scalars of a gossip
        round cost more CPU than the round's own work. So one call is one event (its
        values share a step and a wall time), and events go to the writer at
        :meth:`flush` (the peer's, every 200 steps; its own comes every 10 s), once
        ``_TB_BATCH`` wait, or once the oldest has waited ``_TB_WAIT_S``, together, with
        the wall time of their call. A process killed outright (SIGKILL) loses those
        still waiting, as it loses the CSV rows since the last flush.
        """
        if self.tb is None:
            return
        kept = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()
                if v is not None and math.isfinite(v)]
        if kept:
            now = time.time()
            self._events.append((self._summary(value=kept), step, now))
            if len(self._events) >= _TB_BATCH or now - self._events[0][2] >= _TB_WAIT_S:
                self._hand_over()

    def _hand_over(self) -> None:
        """Give the waiting events to the TensorBoard writer (what add_scalar does with each)."""
        events, self._events = self._events, []
        if self.tb is None:
            return
        try:
            writer = self.tb._get_file_writer()
            for summary, step, wall in events:
                writer.add_summary(summary, step, wall)
        except OSError as e:   # its writer thread failed, and fails every write from now on
            self._drop_tb(e)

    def _hook_tb_thread(self) -> None:
        """Take the OSError that ends TensorBoard's writer thread (a full disk, a read-only
        ``tb/``) from threading's hook, which prints its traceback raw to stderr: the peer's
        log under ``swarm run``, where it reads as a crash. The writer raises it again (in its
        constructor, at its next write or at close), where it is logged once (:meth:`_drop_tb`);
        here it goes to the log at DEBUG, with its traceback. Any other thread's exception,
        or another kind, goes on to the hook that was there.

        Called before the writer is made, as its constructor's first write may fail already:
        until :meth:`_tb_hook_known` names its thread, any TensorBoard writer thread started
        since is taken for it."""
        try:
            from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread  # noqa: PLC0415
        except ImportError:
            return   # a TensorBoard that keeps its thread elsewhere: its traceback is printed, as before
        before, rank = threading.excepthook, self._failed.rank
        earlier = set(threading.enumerate())   # threads that are not this writer's
        mine: list[threading.Thread] = []      # its thread, once known

        def ours(t: threading.Thread | None) -> bool:
            return t in mine if mine else isinstance(t, _AsyncWriterThread) and t not in earlier

        def hook(args: threading.ExceptHookArgs) -> None:
            if ours(args.thread) and issubclass(args.exc_type, OSError):
                log.debug("peer%d: TensorBoard's writer thread stopped", rank,
                          exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
            else:
                before(args)

        threading.excepthook = hook
        self._tb_hook = (hook, before, mine, ours)

    def _tb_hook_known(self) -> None:
        """Narrow the hook of :meth:`_hook_tb_thread` to the writer's own thread, now that it is made."""
        if self._tb_hook is None:
            return
        try:
            self._tb_hook[2].append(self.tb._get_file_writer().event_writer._async_writer._worker)
        except AttributeError:
            pass   # kept elsewhere: the hook goes on taking the writer threads started since

    def _unhook_tb_thread(self) -> None:
        """Give threading back the hook that was there, once the writer's thread has ended (ours
        stays where another was set over it since, passing on all but that thread's)."""
        if self._tb_hook is None:
            return
        hook, before, mine, ours = self._tb_hook
        # (a writer whose constructor failed was not named: its thread is the one started since)
        threads = mine or [t for t in threading.enumerate() if ours(t)]
        for t in threads:
            t.join(self._TB_THREAD_END_S)   # one that failed may not have reached the hook yet
        if not any(t.is_alive() for t in threads):
            self._tb_hook = None
            if threading.excepthook is hook:
                threading.excepthook = before

    def _drop_tb(self, e: OSError) -> None:
        tb, self.tb = self.tb, None
        self._failed("tb/", e, "no more TensorBoard event files in this run; training goes on")
        try:
            tb.close()
        except OSError:
            pass   # what it still held is lost
        self._unhook_tb_thread()
        self._close_tb_fd()

    def _close_tb_fd(self) -> None:
        if self._tb_fd is not None:
            os.close(self._tb_fd)
            self._tb_fd = None

    def flush(self) -> None:
        self._hand_over()
        for f in self._files:
            try:
                f.flush()
            except OSError as e:   # the rows stay in its buffer for the next flush
                self._failed(Path(f.name).name, e, "its rows wait in memory (those past its buffer are "
                             "lost) until it is written again; training goes on")
            else:
                self._failed.written(Path(f.name).name)

    def close(self) -> None:
        self._hand_over()
        for f in self._files:
            try:
                f.close()
            except OSError as e:
                self._failed(Path(f.name).name, e, "its last rows are lost")
            else:
                self._failed.written(Path(f.name).name)
        if self.tb is not None:
            try:
                self.tb.close()
            except OSError as e:
                self._failed("tb/", e, "its last events are lost")
            self._unhook_tb_thread()
        self._close_tb_fd()


class _State:
    """Figures shared by the training thread (writer) and the heartbeat (reader)."""

    def __init__(self) -> None:
        self.env_steps = 0
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=10)
        self.rounds = 0
        self.rounds_ok = 0
        self.gossip_bytes_out = 0
        self.relay_vectors = 0      # relayed gradients (own and forwarded) counted into dense_bytes_out
        self.relay_applied = 0      # other peers' gradients applied
        self.relay_refused = 0      # other peers' gradients that apply_gradient refused (not applied)
        self.shared_pushed = 0      # replay items sent, as logged in rounds.csv
        self.gossip_bytes_in = 0
        self.disagreement = float("nan")
        self.eval_return = float("nan")
        self.dense_bytes_out = 0    # what the deltas sent would have cost as dense float32
        self.staleness = 0          # rounds the stalest neighbour lagged in the last round
        self.last_error = ""        # the last thing that went wrong (a round alone, a timeout ...)
        self.round_error = False    # last_error is a gossip round's: the next round that mixes clears it
        self.standing_error = ""    # the last error of any other kind, shown again then
        self.mixed = False          # a round of this process has mixed with a neighbour
        self.done = False
        # The traffic as training ended (run_peer's finally): summary.json, the last checkpoint,
        # checkpoint.pt and the heartbeats from then on (the leave's) all show these, though the
        # peer goes on receiving until it closes
        self.final_traffic: dict[str, int] | None = None
        # Traffic of the processes before this one (restored from a checkpoint): the
        # counters above are this process's, the figures logged are the run's.
        self.carried = dict.fromkeys(TRAFFIC_KEYS, 0)
        # ... and their seconds, so that the CSVs' wall_s and cpu_s go on as their counters do
        self.carried_s = dict.fromkeys(SECONDS_KEYS, 0.0)

    def carry_over(self, counters: dict[str, Any], source: Path) -> None:
        """Go on from the run counters saved in the checkpoint ``source`` (those of
        ``ckpt/`` or ``checkpoint.pt``; ``env_steps`` is the caller's): episodes, rounds,
        the recent returns, bytes and seconds. One saved by an older swarm may lack some:
        those start from 0. ConfigError naming the counter that is not a number (or, for
        ``returns``, a list of them), with nothing changed."""
        def read(key: str, kind: type, default: Any) -> Any:
            v = counters.get(key, default)
            try:
                return [float(x) for x in v] if kind is list else kind(v)
            except (TypeError, ValueError):
                what = "a list of numbers" if kind is list else "a number"
                raise ConfigError(f"resume: {source}: its run counter {key!r} = {v!r:.80} is not {what}; "
                                  "is the file damaged?") from None

        episodes, rounds = read("episodes", int, 0), read("rounds", int, 0)
        # a checkpoint from before rounds_ok counted rounds only: not known to have failed
        rounds_ok, returns = read("rounds_ok", int, rounds), read("returns", list, [])
        carried = {k: read(k, int, 0) for k in TRAFFIC_KEYS}
        carried_s = {k: read(k, float, 0.0) for k in SECONDS_KEYS}
        self.episodes, self.rounds, self.rounds_ok = episodes, rounds, rounds_ok
        self.carried, self.carried_s = carried, carried_s
        self.returns.extend(returns)

    def error(self, text: str, *, of_round: bool = False) -> None:
        """Show ``text`` as the heartbeat's ``last_error``. A gossip round's (``of_round``) is
        cleared by the next round that mixes (:meth:`round_done`): the status pages read it
        as the peer's current problem, and ``rounds_ok`` against ``rounds`` still counts
        every round that mixed with nobody. Any other stays until another replaces it, and
        shows again once a round's error is cleared (a disk that filled still has)."""
        if not of_round:
            self.standing_error = text
        self.last_error, self.round_error = text, of_round

    def round_done(self, res: Any) -> None:
        """Count the gossip round just run (``rounds`` is already its number: rounds.csv's ``round``).

        A round with nobody before this process's first round that mixed is no error: peers
        start apart, and the first one's first rounds find no neighbour's engine yet
        (docs/gossip.md), and a peer alone by design (a run of one) never mixes."""
        if res.ok:
            self.rounds_ok += 1
            self.mixed = True
            if self.round_error:
                self.error(self.standing_error)
        elif self.mixed:
            self.error(f"round {self.rounds}: {res.reason or 'averaged with nobody'}", of_round=True)

    def seconds(self, wall: float, cpu: float) -> dict[str, float]:
        """The run's seconds so far: this process's (``wall`` since it started, ``cpu`` since
        it started training) on top of what the checkpoint it resumed from had counted."""
        return {"wall_s": round(self.carried_s["wall_s"] + wall, 3), "cpu_s": round(self.carried_s["cpu_s"] + cpu, 3)}

    @staticmethod
    def gossip_now(gossip: Any, relay: GradientRelay | None) -> tuple[int, int]:
        """This process's gossip bytes (out, in) so far, from the engine's and the relay's
        cumulative counters (relayed gradients are gossip traffic too)."""
        r = relay.stats if relay is not None else None
        return gossip.stats.bytes_out + (r.bytes_out if r else 0), gossip.stats.bytes_in + (r.bytes_in if r else 0)

    def gossip_totals(self, gossip: Any, relay: GradientRelay | None) -> tuple[int, int]:
        """Take this process's gossip bytes (out, in) (:meth:`gossip_now`); return what they
        grew by since the last call."""
        out, into = self.gossip_now(gossip, relay)
        grew = (out - self.gossip_bytes_out, into - self.gossip_bytes_in)
        self.gossip_bytes_out, self.gossip_bytes_in = out, into
        return grew

    def traffic(self, sent: int, received: int, gossip: tuple[int, int] | None = None) -> dict[str, int]:
        """The run's traffic so far: this process's (``sent``, ``received`` and the gossip
        bytes, ``gossip`` (out, in) or else those taken at the last round) on top of what
        the checkpoint it resumed from had counted."""
        g_out, g_in = gossip if gossip is not None else (self.gossip_bytes_out, self.gossip_bytes_in)
        now = {"gossip_bytes_out": g_out, "gossip_bytes_in": g_in, "bytes_out": sent, "bytes_in": received}
        return {k: self.carried[k] + now[k] for k in TRAFFIC_KEYS}

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")


def _traffic(counters: Any, relay: GradientRelay | None) -> tuple[int, int]:
    """(bytes sent, bytes received) by this process: the peer's sockets and the relay's
    own (``direct``), which the peer's counters do not see."""
    sent, received = (counters.bytes_out, counters.bytes_in) if counters is not None else (0, 0)
    if relay is not None:
        sent, received = sent + relay.stats.direct_bytes_out, received + relay.stats.direct_bytes_in
    return sent, received


def _finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class _StatusClient:
    """Asks a coordinator for its member table (rows as `swarm status --json` shows them)
    on one event loop, kept for every query: the join wait asks every :data:`SPEC_POLL_S`,
    and a loop made for each query took three file descriptors more each time.

    A query that finds this process out of file descriptors (EMFILE: under a low
    ``ulimit -n`` the links to the members that join meanwhile can take them all) is no
    answer this time, as when none comes; the next one tries again, and only the first
    is logged. Close it when done."""

    def __init__(self, peer_config: Any, me: str) -> None:
        # imported now, while there are fds: under `python -m swarm.cli` the module is
        # __main__, so this import reads cli.py again
        import zmq.asyncio  # noqa: PLC0415 - the peer package loads zmq

        from ..cli import query_status  # noqa: PLC0415 - the status client; cli imports us lazily too

        self._query = query_status
        # one context, its I/O thread started now while there are fds: a context made
        # for each query when none are left aborted the process (libzmq asserts on the
        # epoll it could not create: "Too many open files (src/epoll.cpp:38)")
        self._ctx = zmq.asyncio.Context()
        self._ctx.socket(zmq.DEALER).close(0)
        self.me = me
        self.keys = getattr(peer_config, "keys_dir", "") or ""
        self.key_name = getattr(peer_config, "key_name", "peer") or "peer"
        self._loop = asyncio.new_event_loop()
        self._out_of_fds_logged = False

    def status(self, coordinator: str) -> dict[str, Any] | None:
        """``coordinator``'s status table; None when it does not answer, or this process
        has no file descriptor left to ask with."""
        import zmq  # noqa: PLC0415 - the peer package loads zmq

        try:
            return self._loop.run_until_complete(
                self._query(coordinator, timeout=2.0, keys_dir=self.keys, key_name=self.key_name, context=self._ctx))
        except SwarmError:
            return None
        except (OSError, zmq.ZMQError) as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            if not self._out_of_fds_logged:
                self._out_of_fds_logged = True
                log.warning("%s: out of file descriptors for a status query of %s (%s); it counts as no answer, "
                            "and later ones try again (logged once; a higher ulimit -n gives room)",
                            self.me, coordinator, e)
            return None

    def close(self) -> None:
        self._loop.close()
        self._ctx.term()


def _others(coordinators: list[str], client: _StatusClient, me: str) -> list[dict[str, Any]] | None:
    """The live members other than ``me`` in the table of the coordinator that holds
    ``me`` (rows as `swarm status --json` shows them); None when none answers."""
    for coordinator in coordinators:
        st = client.status(coordinator)
        if st is None:
            continue
        members = st.get("members", [])
        if not any(m.get("id") == me for m in members):
            continue   # a standby answers too, with a table that does not hold us
        return [m for m in members if m.get("id") != me and m.get("state", "alive") != "dead"]
    return None


def _should_bootstrap(coordinators: list[str], client: _StatusClient, me: str, own_steps: int, margin: int,
                      fallback: bool, learning_starts: int = 0) -> bool:
    """Whether another member is more than ``margin`` env steps ahead (see the module doc)
    and past ``learning_starts``: before that its network is still the initial one that
    every peer of the run builds, so the few steps by which the first of a fresh run's
    peers start ahead of the others are no reason to bootstrap."""
    from ..coordinator.report import num  # noqa: PLC0415 - the coordinator package loads zmq
    others = _others(coordinators, client, me)
    if others is None:
        return fallback
    ahead = max(own_steps + margin, learning_starts)
    # a member's stats are untrusted (docs/observability.md): a figure that is no finite number counts as none
    return any((num((m.get("stats") or {}).get("env_steps")) or 0) > ahead for m in others)


#: while waiting for the others to join, seconds between looks at their spec digests
SPEC_POLL_S = 2.0
#: and between looks at the stop event (SIGTERM, Ctrl-C)
STOP_POLL_S = 0.25
#: a look that came back more than this much after its timeout: the process was stopped
#: meanwhile (Ctrl-Z, SIGSTOP)
STOPPED_S = 5.0


def _stopped_for(took: float, most: float) -> float:
    """How much of ``took`` s, spent on a wait of at most ``most`` s, the process spent
    stopped: what it took beyond ``most`` when that is more than :data:`STOPPED_S`, else 0.
    Ctrl-Z stops the whole run (`swarm run` stops its children with it), so nobody joined
    meanwhile: a start-up deadline moves on by this time, as the coordinator's do
    (``Coordinator._check_stall``). A run continued past it failed, naming peers as not
    started that were only stopped."""
    return took - most if took > most + STOPPED_S else 0.0

#: spec keys that may differ between the peers of one run: how long each trains,
#: evaluates and checkpoints (a resumed peer may be given a larger budget), and its
#: links' settings (which a host's own peer.* settings override anyway)
PER_PEER_KEYS = ("name", "budget", "eval", "checkpoint", "link", "restart_dead")


def spec_tag(spec: Spec) -> dict[str, str]:
    """A short digest of each spec key that all peers must share (heartbeats carry it)."""
    return {k: hashlib.blake2b(json.dumps(v, sort_keys=True).encode(), digest_size=4).hexdigest()
            for k, v in to_dict(spec).items() if k not in PER_PEER_KEYS}


def _check_same_spec(coordinators: list[str], client: _StatusClient, me: str, tag: dict[str, str],
                     timeout: float, rank: int = -1) -> None:
    """Raise ConfigError when another member trains another spec, and this peer's is not
    the one that stays: their gossip and replay would be refused in silence (other
    sizes), or mix unlike models. The spec that the most members (this one included)
    train stays, and of as many, the lowest rank's: its peers go on (with a warning
    naming the others), so that peers started together with one odd spec do not all
    exit, only the odd one.

    Waits up to ``timeout`` seconds for every member's tag to reach the coordinator;
    a member that sends none (a plain `swarm peer`) is not compared. One status
    query per heartbeat that carries figures: a thousand peers starting together
    ask the coordinator for its table a few times each, not in a tight loop.
    """
    from ..peer.peer import HEARTBEAT_STATS_S  # noqa: PLC0415 - the peer package loads zmq
    deadline = time.monotonic() + timeout
    while True:
        others = _others(coordinators, client, me)
        if others is None:
            return   # no coordinator to ask (or no fd to ask with): the view was there a moment ago, so rarely
        if all("spec" in (m.get("stats") or {}) for m in others) or time.monotonic() > deadline:
            break
        time.sleep(HEARTBEAT_STATS_S)   # a member's next figures come with its next such beat
    differ: dict[str, list[str]] = {}
    groups: dict[str, list[int]] = {json.dumps(tag, sort_keys=True): [rank]}   # spec -> ranks that train it
    for m in others:
        theirs = (m.get("stats") or {}).get("spec")
        if not isinstance(theirs, dict):
            continue
        r = m.get("rank")
        groups.setdefault(json.dumps(theirs, sort_keys=True), []).append(r if isinstance(r, int) else 1 << 30)
        if theirs != tag:
            differ[str(m.get("id"))] = sorted(k for k in tag.keys() | theirs.keys() if tag.get(k) != theirs.get(k))
    if differ:
        where = ", ".join(f"{pid} ({', '.join(keys)})" for pid, keys in sorted(differ.items()))
        stays = max(groups, key=lambda g: (len(groups[g]), -min(groups[g])))
        if stays == json.dumps(tag, sort_keys=True):
            log.warning("%s: the spec differs at %s; this peer's is the one the most peers (of as many, the "
                        "lowest rank) train, so it goes on and they are refused", me, where)
            return
        raise ConfigError(f"{me}: the spec differs at {where}; every peer needs the same --spec")


def _save_whole(obj: dict[str, Any], path: Path) -> Path:
    """``torch.save`` ``obj`` into memory, then write and sync it to a temporary file
    renamed over ``path``: a peer killed while it writes ``best.pt`` or ``checkpoint.pt``
    leaves the previous file whole, not a torn one. A disk that is full or read only
    raises OSError (torch's own file writer would raise RuntimeError) and leaves the
    previous file as it was."""
    import torch  # noqa: PLC0415

    data = io.BytesIO()
    torch.save(obj, data)

    write_whole(path, lambda tmp: write_synced(tmp, data.getbuffer()))
    return path


def _read_best(path: Path, run: str | None = None, env: str | None = None) -> tuple[float, int] | None:
    """The evaluation return and env step recorded in a ``best.pt``; None when there is
    none, it cannot be read (a torn or foreign file: logged), with ``run``, another
    run wrote it, or, with ``env``, it was evaluated on another env (one whose spec it
    does not record counts)."""
    import torch  # noqa: PLC0415

    if not path.is_file():
        return None
    try:
        best = torch.load(path, weights_only=True, map_location="cpu")   # runs no code, as `swarm eval`
        got = float(best["eval_return"]), int(best["env_steps"])
    except Exception as e:   # torn or foreign: torch's unpickler raises IndexError, EOFError, RuntimeError ...
        log.warning("%s: cannot read its best evaluation (%s: %s); it does not count", path, type(e).__name__, e)
        return None
    if run is not None and best.get("run") != run:
        log.info("%s: another run's best evaluation; it does not count", path)
        return None
    was = best["spec"].get("env", env) if isinstance(best.get("spec"), dict) else env
    if env is not None and was != env:   # a resume on another env (--set env=...): returns do not compare
        log.warning("%s: the best evaluation of env = %r, and this run trains env = %r; it does not count, "
                    "and the next evaluation writes this run's best.pt", path, was, env)
        return None
    return got


def _carry_best(src: Path, out: Path, summary: dict[str, Any], continued: Path | None = None,
                run: Lineage | None = None, env: str | None = None) -> None:
    """Start from the best evaluation of the process (or run) this one continues:
    its ``src/best.pt``, copied into ``out`` when that is another folder. Otherwise
    the first evaluation after a restart or resume, however poor, would replace it.

    ``out`` may hold a ``best.pt`` already. When ``continued`` (the peer folder of the
    run that ``out``'s run continues, passed when this process goes on with it) is ``src``, a
    crashed process of this run, restarted from ``src``'s checkpoint, wrote it: that one
    did better than ``src``'s (it replaced the copy only by doing better) and stays; one
    that cannot be read does not. Any other was left by another run that used the folder
    and does not count: ``src``'s replaces it, or with none the next evaluation does.
    With ``run`` (the run this process goes on with), a ``best.pt`` in ``out`` counts only
    when that run wrote it, also when ``src`` is ``out``; the copy of ``src``'s is
    stamped as that run's (it is its best so far), so that a restart into ``out`` keeps it.
    With ``env`` (the env this process trains), one evaluated on another env (a resume with
    ``--set env=...``) does not count either: its returns do not compare with this env's.
    With neither readable, the next evaluation writes a new ``best.pt``."""
    import torch  # noqa: PLC0415

    rid = run.id if run is not None else None
    here = out / "best.pt"
    best = _read_best(src / "best.pt", rid if (src / "best.pt").resolve() == here.resolve() else None, env)
    if (src / "best.pt").resolve() != here.resolve():
        ours = continued is not None and continued.resolve() == src.resolve()
        mine = _read_best(here, rid, env) if ours else None
        if mine is not None and (best is None or mine[0] > best[0]):
            best = mine
        elif best is not None:
            theirs = torch.load(src / "best.pt", weights_only=True, map_location="cpu")   # read whole just above
            if run is not None:
                theirs.update(run.record())
            _save_whole(theirs, here)
    if best is not None:
        summary.update(best_eval_return=best[0], best_eval_at=best[1])


#: the replay-buffer settings (besides its capacity) that a buffer restored from a
#: checkpoint keeps: a resume's spec must not change them
BUFFER_KEPT = ("prioritized", "alpha", "eps", "decay")


#: the file in the folder of a `swarm run --resume PREV` that names PREV, written before
#: anything starts: its peers record the run they continue (run.json) only once started
RESUMED_FROM = "resumed_from.json"


def run_resumed_from(run_dir: str | Path) -> Path | None:
    """The run folder that the `swarm run --resume` in ``run_dir`` continues, as its
    :data:`RESUMED_FROM` names it; None without one, or with one that cannot be read (logged)."""
    path = Path(run_dir) / RESUMED_FROM
    if not path.is_file():
        return None
    try:
        prev = json.loads(path.read_text())["resumed_from"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s cannot be read (%r); the run it continues is not known", path, e)
        return None
    return Path(prev) if isinstance(prev, str) and prev and "\0" not in prev else None


def resume_sources(folder: Path) -> list[tuple[Path, str | None]]:
    """Where a resume from the peer folder ``folder`` (another run's) looks for a checkpoint,
    in order, as (peer folder, run id; None: any): ``folder``, whichever run wrote it, then
    each run that the run there continues (its ``run.json``), as a restart into that folder
    does. So a run that was itself resumed and ended before its first checkpoint resumes
    from the one it continues, not from nothing. A folder without ``run.json`` (a `swarm run
    --resume` interrupted before this peer recorded its run, or before it started) continues
    the run that its run folder's :data:`RESUMED_FROM` names, in that run's peer folder of
    the same rank."""
    out: list[tuple[Path, str | None]] = [(folder, None)]
    lineage = read_lineage(folder)
    while lineage.id is None and not lineage.continues and len(out) <= MAX_LINEAGE:
        prev = run_resumed_from(folder.parent)
        if prev is None or any((prev / folder.name).resolve() == f.resolve() for f, _ in out):
            break
        folder = prev / folder.name
        out.append((folder, None))
        lineage = read_lineage(folder)
    return [*out, *lineage.sources(folder)[1:]]


def resume_point(prev: str | Path, rank: int) -> Path | None:
    """The first peer folder of :func:`resume_sources` that holds a checkpoint (``ckpt/`` or
    ``checkpoint.pt``), looked up without loading it; None when none does."""
    for folder, _ in resume_sources(peer_dir(prev, rank)):
        if (folder / "checkpoint.pt").is_file() or latest(folder / "ckpt") is not None:
            return folder
    return None


def check_resume_kept(prev: str | Path, spec: Spec, ranks: Iterable[int]) -> None:
    """Refuse to resume the peers of ``ranks`` from the run in ``prev`` with a setting that
    their checkpoints keep and that differs from that run's ``config.json`` (``--set
    seed=7``, ``--set buffer.alpha=...``): the new config.json would record it, but the run
    would not train with it. Every checkpoint holds the network and the agent's random
    streams, which the run's ``seed`` made, and a network of its ``dqn.hidden`` widths; one
    in ``ckpt/`` also holds a replay buffer, which keeps its settings (peers that left only
    ``checkpoint.pt`` start new buffers; the checkpoint is the one :func:`resume_point` finds).
    `swarm run --resume` checks every peer before it starts anything, and each peer
    (``run_peer``, `swarm peer --resume`) its own before it writes anything. A folder
    without ``config.json`` (a `swarm peer` run's) has nothing to compare with here;
    ``run_peer`` still compares a restored buffer's own settings once it has loaded."""
    if not (Path(prev) / "config.json").is_file():
        return
    old = read_file(Path(prev) / "config.json")
    old_buffer = old.get("buffer") if isinstance(old.get("buffer"), dict) else {}
    old_dqn = old.get("dqn") if isinstance(old.get("dqn"), dict) else {}
    was = {"seed": old.get("seed", Spec.seed), "dqn.hidden": old_dqn.get("hidden", Spec().dqn.hidden),
           **{f"buffer.{k}": v for k, v in {**to_dict(BufferSpec()), **old_buffer}.items()}}
    now = {"seed": spec.seed, "dqn.hidden": list(spec.dqn.hidden),
           **{f"buffer.{k}": v for k, v in to_dict(spec.buffer).items()}}
    kept = ["seed", "dqn.hidden"]   # the network's widths: another one's parameters do not load
    if any((p := resume_point(prev, r)) is not None and latest(p / "ckpt") is not None for r in ranks):
        # the capacity too: run_peer refuses a restored buffer of another capacity
        kept += [f"buffer.{k}" for k in ("capacity", *BUFFER_KEPT)]
    changed = [k for k in kept if was[k] != now[k]]
    if changed:
        # numpy's numbers (a Spec changed in code) as Python's, as config.json has them
        then = ", ".join(f"{k} = {json.dumps(was[k], default=_plain_number)}" for k in changed)
        asked = ", ".join(f"{k} = {json.dumps(now[k], default=_plain_number)}" for k in changed)
        raise ConfigError(f"resume: {prev} trained with {then} and this run asks for {asked}; the peers' "
                          "checkpoints keep their network, random streams and replay buffers as that run made "
                          f"them: resume with {then}, or start a new run")


def _run_ends() -> float:
    """When the run's time ends on this host's monotonic clock, as `swarm run` gives its
    peers in ``SWARM_RUN_ENDS`` (inf without): budget.max_seconds limits the whole run, not
    each process, and a restarted one gets what is left. Not the wall clock, which may
    step (NTP, a VM resumed); Linux's monotonic clock is one for every process of a host,
    and the launcher's peers run on its host (seconds left instead would leave out each
    process's start-up)."""
    raw = os.environ.get("SWARM_RUN_ENDS") or "inf"
    try:
        ends = float(raw)
    except ValueError:
        ends = math.nan
    if math.isnan(ends):
        raise ConfigError(f"SWARM_RUN_ENDS = {raw!r}: expected when the run's time ends on this host's "
                          "monotonic clock, a number (set by `swarm run` for its peers)")
    return ends


def run_peer(spec: Spec, rank: int, coordinator: str | Sequence[str], run_dir: str | Path, *,
             stop: threading.Event | None = None,
             loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
             parent_pid: int | None = None, join_timeout: float = 60.0,
             tensorboard: bool = True, peer_config: Any = None,
             resume_from: str | Path | None = None, spec_check_timeout: float = 5.0,
             new_run: bool = False) -> dict[str, Any]:
    """Train one peer of ``spec`` until its budget is spent; return its summary.

    Torch runs one intra-op thread while the peer trains (many peers share few
    cores); the process has its own count back when this returns or raises.

    Args:
        spec: the resolved experiment spec (the same on every peer).
        rank: this peer's rank (0 .. spec.peers - 1); it is also its id ``peer{rank}``.
        coordinator: the coordinator's address, or several (primary first, then
            standbys): the peer fails over to the next when the one it uses dies.
        run_dir: the run folder; this peer writes into ``run_dir/peer{rank}/``.
        stop: when set, the run ends after the current step (see :func:`stop_on_signals`).
        loop_factory: event loop of the peer's network thread (the CLI passes uvloop's).
        parent_pid: end the run if this process's parent is no longer ``parent_pid``
            (the launcher died without ending us).
        join_timeout: how long to wait for all ``spec.peers`` peers to join.
        tensorboard: also write TensorBoard event files when tensorboard is installed.
        resume_from: a run folder (a previous one, or this one after a crash); the peer
            starts from the newest checkpoint in its ``peer{rank}/ckpt/`` (parameters,
            optimizer, replay buffer, counters, RNGs) and trains for what is left of
            the budget; an older run with only ``peer{rank}/checkpoint.pt`` gives the
            agent's state with an empty buffer. A checkpoint that cannot be read is
            skipped with a warning for the next older one, then ``checkpoint.pt``; with
            none left, resuming into ``run_dir`` itself tries the runs its folder's run
            continues (``run.json``), and starts from step 0 (with a warning) only when it
            continues none; otherwise it raises ConfigError. One holding NaN or infinite
            values (training diverged) is passed over the same way, but with none left
            that is a ConfigError, not a start from step 0. Into ``run_dir`` itself, and
            from a folder whose run ``run_dir``'s continues, only checkpoints of this
            folder's run (by run id, :class:`~swarm.experiment.checkpoint.Lineage`) and of
            the runs it continues count.
        new_run: with ``resume_from`` another run folder, start a new run in ``run_dir``
            from its newest checkpoint that loads, also when ``run_dir``'s folder holds
            a run resumed from the same checkpoint before (by default this process goes
            on with that run, as the same command run again after a crash does).
        spec_check_timeout: once joined, how long to wait for the other members' spec
            digests (heartbeats carry them) before comparing them with this one's; a
            peer whose spec differs is refused (ConfigError), one that sent none is
            not compared.
        peer_config: a :class:`swarm.config.PeerConfig` with this host's peer settings
            (bind and advertised address, keys, timeouts); its coordinators, id, rank
            and topology are replaced by the arguments above. None: the defaults,
            which bind to loopback only, with the spec's ``link`` settings.
    """
    # counted from here, before the imports below take their seconds of it
    run_ends = _run_ends()
    import torch  # noqa: PLC0415 - keep `swarm.experiment` importable without torch

    from ..buffer import Federation, ReplayBuffer  # noqa: PLC0415
    from ..gossip import Gossip, GradientRelay  # noqa: PLC0415
    from ..peer import SyncPeer  # noqa: PLC0415
    from ..rl import DQNAgent, dqn_schema  # noqa: PLC0415
    from ..rl.train import evaluate, make_env, run_agent  # noqa: PLC0415

    if not 0 <= rank < spec.peers:
        raise ConfigError(f"rank = {rank}: the spec has peers = {spec.peers}, so ranks are 0..{spec.peers - 1}")
    own = resume_from is not None and Path(resume_from).resolve() == Path(run_dir).resolve()
    rejoin = bool(getattr(peer_config, "replace", False)) or own
    if new_run and rejoin:
        how = "resumes from its own run folder" if own else "replaces a member"
        raise ConfigError(f"new_run (--new-run): peer{rank} {how}, so it goes on with the run there; a new run is "
                          "a fresh start or a resume from another run folder")
    if resume_from is not None:
        check_resume_kept(resume_from, spec, [rank])
    stop = stop or threading.Event()
    seed = spec.peer_seed(rank)
    g = spec.gossip
    t0 = time.monotonic()
    cpu0 = time.process_time()
    state = _State()
    unwritten = _Unwritten(rank, state)   # result files a full disk did not take
    summary: dict[str, Any] = {"rank": rank, "id": f"peer{rank}", "reason": "error"}
    # before joining: a folder it cannot write would otherwise fail only at the end
    out = make_peer_dir(run_dir, rank)
    # The run this process trains (run.json): the one the folder holds when it goes on
    # with it, else a new one. A fresh run records itself as soon as the coordinator has
    # admitted it (and drops the record of another run's resume, resumed.json), so that a
    # restart after a crash at any later point takes only its own checkpoints for its own;
    # a run resumed from another folder does once its checkpoint has loaded (a resume that
    # fails leaves the folder's record as it was). Not before the join: a second process
    # started for a rank that is alive (the same command run twice) is refused there, and
    # must leave the live one's folder as it is, or a later --replace of it would take its
    # checkpoints for another run's. Whether the folder can take the record (a full or
    # read-only disk cannot) is checked before the join, though: that is a ConfigError
    # before anything else, as every later start would meet it. A process killed before
    # the record wrote nothing here: the folder still holds the run it held, which is
    # what a restart then reads.
    run = _goes_on(out, peer_dir(resume_from, rank) if resume_from is not None else None, rejoin, new_run)
    same_run = run is not None
    fresh = resume_from is None and not rejoin   # a start that writes its own summary.json whatever happens
    new_here = run is None and resume_from is None   # a run starts here now (resumed: once its checkpoint loads)
    if new_here:
        run = Lineage.new()

    def drop_summary() -> None:
        # summary.json holds the figures of the process that wrote it. One that writes its own
        # (a fresh start once admitted, whether it trains or not; a resume or restart once it
        # trains: see `keep` below) removes the one there first, so that an own summary.json
        # that cannot be written (a full disk) leaves none: the launcher's table would show an
        # earlier one as this process's figures.
        _at_start(run_dir, lambda: (out / "summary.json").unlink(missing_ok=True), out / "summary.json", "remove")

    coordinators = [coordinator] if isinstance(coordinator, str) else list(coordinator)
    if peer_config is None:
        peer_config = PeerConfig(**spec.link.peer_settings())
    sp = SyncPeer(peer_config, coordinators=coordinators, id=f"peer{rank}", rank=rank, topology=g.topology,
                  edges=g.edges, loop_factory=loop_factory)
    if new_here:
        record = json_bytes(run.record(), indent=1)   # what write_lineage writes once it is in
        _at_start(run_dir, lambda: _check_room(out / "run.json", record), out / "run.json")
    try:
        sp.start(stop=stop)
    except SwarmError:
        if not stop.is_set():
            raise
        # stopped while it joined (its coordinator not up yet, say): nothing trained, as a stop
        # while it waits for the others below; the summary says so (a resume's or a
        # restart's summary.json there stays, as below)
        log.info("peer%d: stopped while joining", rank)
        summary.update(reason="stopped", env_steps=0, episodes=0, rounds=0, final_mean_return=None,
                       eval_return=None, wall_s=time.monotonic() - t0, cpu_s=time.process_time() - cpu0)
        if fresh or not (out / "summary.json").is_file():
            try:
                write_json(out / "summary.json", summary, indent=2)
            except OSError as e:   # a full disk: none is left (a fresh start's earlier one goes); it still ends
                log.error("peer%d: summary.json not written: %s", rank, e)
                if fresh:
                    _discard(out / "summary.json")
        return summary
    logs: _Logs | None = None
    agent = None
    gossip = relay = fed = None
    digests: dict[int, str] = {}   # update count -> parameter digest, every DIGEST_EVERY updates (relay)
    ckpt: Checkpointer | None = None
    status: _StatusClient | None = None
    threads = torch.get_num_threads()   # the caller's process gets its count back at the end
    try:
        torch.set_num_threads(1)  # many peers share few cores
        if new_here:   # admitted: the fresh run is this folder's now
            _at_start(run_dir, lambda: write_lineage(out, run), out / "run.json")
            _at_start(run_dir, lambda: (out / "resumed.json").unlink(missing_ok=True), out / "resumed.json",
                      "remove")
        if fresh:
            drop_summary()
            _drop_old_results(run_dir, out)
        peer = sp.peer
        assert peer is not None
        tag = spec_tag(spec)
        # Until training starts and stats() takes over. No byte counts: those then go on
        # from the checkpoint's, and a jump to them would read as traffic (a rate, /metrics).
        peer.stats = lambda: {"spec": tag, "bytes_in": None, "bytes_out": None}
        # A peer restarted into a running swarm (swarm run's restart_dead) trains as soon as
        # it is in: the others may be restarting too, and waiting for all of them could
        # outlast join_timeout and crash it again.
        need = 1 if rejoin else spec.peers
        status = _StatusClient(peer_config, peer.id)
        log.info("peer%d joined; waiting for %d peers (links time out after %g s, messages up to %d MiB)", rank,
                 need, peer.config.link_timeout_s, peer.config.max_message_mb)
        deadline = time.monotonic() + join_timeout
        next_check = time.monotonic() + SPEC_POLL_S
        polled = time.monotonic()   # when the last look ended: a stop since then does not count
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                sp.call(peer.wait_view(lambda v: len(v.members) >= need, timeout=min(STOP_POLL_S, left)),
                        timeout=min(STOP_POLL_S, left) + 5.0)
                break
            except PeerTimeout:
                if stop.is_set():
                    # stopped before training: nothing trained, nothing to restart; the
                    # summary says so (the launcher stops its peers so while they wait)
                    log.info("peer%d: stopped while waiting for the others to join", rank)
                    summary["reason"] = "stopped"
                    return summary
                if parent_pid is not None and os.getppid() != parent_pid:
                    raise SwarmError(f"peer{rank}: its launcher (pid {parent_pid}) is gone; not waiting "
                                     "for the others to join") from None
                now = time.monotonic()
                deadline += _stopped_for(now - polled, min(STOP_POLL_S, left))
                polled = now
                if now >= next_check:
                    # one that joined with another spec (its own `peers`, say) is named now,
                    # not after join_timeout
                    next_check = now + SPEC_POLL_S
                    _check_same_spec(coordinators, status, peer.id, tag, 0.0, rank)
                if now < deadline:
                    continue
                here = sorted(m.id for m in peer.view.members)
                raise PeerTimeout(f"peer{rank}: {len(here)} of the spec's {spec.peers} peers joined within "
                                  f"{join_timeout:.0f} s ({', '.join(here)}); start the others, ranks 0.."
                                  f"{spec.peers - 1}, with the same --spec and --coordinator") from None
        sp.wait_linked(timeout=10.0)
        _check_same_spec(coordinators, status, peer.id, tag, spec_check_timeout, rank)

        env = make_env(spec.env)
        n_actions = getattr(env.action_space, "n", None)
        obs_shape = env.observation_space.shape
        env.close()
        if n_actions is None:
            raise ConfigError(f"env = {spec.env!r}: its action space is not Discrete; DQN needs discrete actions")
        b = spec.buffer
        # It resumes from the newest checkpoint that loads in the folder it resumes from
        # (ckpt/, then checkpoint.pt). One that goes on with its folder's run (restart_dead
        # restarts it so) takes only that run's checkpoints there, then tries each run it
        # continues (swarm run --resume), which run.json records; with none that loads, one
        # that continues no other run starts again from step 0, as one that died before its
        # first checkpoint does. Otherwise that is an error. One holding NaN (in ckpt/ or
        # checkpoint.pt) is passed over the same way, but when none is left that is always
        # an error: starting over from step 0 would hide that training diverged.
        if resume_from is None:
            sources: list[tuple[Path, str | None]] = []
        elif same_run:
            sources = run.sources(out)
        else:
            sources = resume_sources(peer_dir(resume_from, rank))   # the folder named, then the runs it continues
        restored, ck, ck_path, skipped = None, None, None, []   # skipped: why each newer one could not be read
        folders: list[Path] = []   # those tried
        diverged = False   # a checkpoint was passed over for NaN (training diverged): no start from step 0
        for src, of_run in sources:
            folders.append(src)
            try:
                restored, why = load_newest(src / "ckpt", of_run)
            except DivergedCheckpoint as e:   # whole but NaN, none older in this ckpt/: older sources may hold one
                restored, why = None, e.skipped
                diverged = True
            skipped += why
            if restored is None:
                ck_path = src / "checkpoint.pt"
                ck = _read_checkpoint_pt(ck_path, skipped, of_run)
                bad = nonfinite(ck.get("params"), ck["agent"], "DQN checkpoint") if ck is not None else None
                if bad is not None:   # whole but NaN: passed over, as such a one in ckpt/ is
                    log.warning("%s: %s (training diverged?); passed over", ck_path, bad)
                    skipped.append(f"{ck_path}: {bad}")
                    ck, diverged = None, True
            if restored is not None or ck is not None:
                if len(folders) > 1 and skipped:
                    log.warning("peer%d: no checkpoint of its run in %s can be read (or all hold NaN); resuming "
                                "from the run it continues, %s", rank, ", ".join(map(str, folders[:-1])), src)
                elif len(folders) > 1:   # none there at all: nothing was passed over
                    log.warning("peer%d: %s has no checkpoint (that run ended before its first one); resuming "
                                "from the run it continues, %s", rank, ", ".join(map(str, folders[:-1])), src)
                break
        if restored is not None:
            buf = restored.buffer
            if buf.peer_id != peer.id or buf.capacity != b.capacity:
                raise ConfigError(f"resume: {restored.path} holds the buffer of {buf.peer_id} with capacity "
                                  f"{buf.capacity}; this is {peer.id} with buffer.capacity = {b.capacity}")
            # The restored buffer samples as it was saved: a spec that says otherwise would be
            # recorded (config.json, the spec's digest) but not trained with. `swarm run --resume`
            # checks these too, before it starts anything (check_resume_kept).
            for name in BUFFER_KEPT:
                key = f"buffer.{name}"
                was = buf.sampler == "prioritized" if name == "prioritized" else getattr(buf, name)
                now = getattr(b, name)
                if was != now:
                    was, now = json.dumps(was, default=_plain_number), json.dumps(now, default=_plain_number)
                    raise ConfigError(f"resume: {restored.path} holds a replay buffer with {key} = {was}, and "
                                      f"this spec asks for {key} = {now}; the buffer keeps its settings: resume "
                                      f"with {key} = {was}, or start a new run")
        else:
            buf = ReplayBuffer(dqn_schema(obs_shape), b.capacity, alpha=b.alpha, eps=b.eps, decay=b.decay,
                               prioritized=b.prioritized, seed=seed, peer_id=peer.id)
        # Every peer starts from the same network (init_seed = spec.seed); exploration,
        # env and buffer sampling differ per peer (seed = spec.seed + rank).
        agent = DQNAgent(obs_shape, int(n_actions), buf, spec.dqn, seed=seed, init_seed=spec.seed)

        done_steps = 0
        if restored is not None:
            restored.apply(agent)
            done_steps = int(restored.counters["env_steps"])
            state.carry_over(restored.counters, restored.path)
            summary["resumed_from"] = str(restored.path)
        elif ck is not None:
            if skipped:
                log.warning("peer%d: resuming from %s, which holds no replay buffer", rank, ck_path)
            try:
                agent.load_state_dict(ck["agent"])
            except SwarmError as e:   # another network's, or NaN: every start would meet it
                raise ConfigError(f"resume: {ck_path}: {e}") from None
            done_steps = int(ck.get("env_steps", 0))
            if isinstance(ck.get("counters"), dict):
                state.carry_over(ck["counters"], ck_path)
            else:
                log.warning("peer%d: %s holds no run counters (written before swarm saved them there); its "
                            "episodes, rounds, bytes and seconds start again from 0, its env steps go on from %d",
                            rank, ck_path, done_steps)
            summary["resumed_from"] = str(ck_path)
        elif own and not run.continues and not diverged:   # step 0 would hide that training diverged
            log.warning("peer%d: no checkpoint of its run in %s can be read; starting again from step 0",
                        rank, folders[0])
        elif folders:
            rest = ", ".join(map(str, folders[1:]))
            runs = "runs" if len(folders) > 2 else "run"
            if skipped:
                where = f"{folders[0]} nor in {rest} (the {runs} it continues)" if rest else folders[0]
                raise ConfigError(f"resume: no checkpoint of peer{rank} in {where} can be "
                                  f"{'used' if diverged else 'read'}: {'; '.join(skipped)}")
            if rest:
                raise ConfigError(f"resume: neither {folders[0]} nor {rest} (the {runs} it continues) has a "
                                  "checkpoint (ckpt/ or checkpoint.pt)")
            raise ConfigError(f"resume: {folders[0]} has no checkpoint (ckpt/ or "
                              f"checkpoint.pt); was peer{rank} part of that run?")
        starts = run is None
        if starts:
            # a run resumed from another folder starts here: it continues the run that
            # wrote the checkpoint it starts from, and what that one continued
            theirs = Lineage.of(restored.manifest if restored is not None else ck, src)
            run = Lineage.new(((str(src.resolve()), theirs.id), *theirs.continues))
        if "resumed_from" in summary:
            # the run this peer's folder continues goes on with every restart into it; a
            # run that starts here records itself (run.json) with it, both or neither
            rec = {"checkpoint": summary["resumed_from"], "env_steps": done_steps,
                   "digest": state_digest(agent.parameters(), buf), "run": run.id,
                   "continues": run.continues[0][0] if run.continues else None,
                   "continues_run": run.continues[0][1] if run.continues else None}
            _at_start(run_dir, lambda: _record_resume(out, rec, run if starts else None))
        elif starts:
            _at_start(run_dir, lambda: write_lineage(out, run), out / "run.json")
        if starts and not rejoin:   # recorded first: a resume that fails leaves the folder as it was
            _drop_old_results(run_dir, out)
        if skipped:
            summary["resume_skipped"] = skipped
        state.env_steps = done_steps
        # On every start: ids an earlier process under this peer id issued (after its
        # checkpoint, or all of them: it may have died before its first one, and then
        # this start is neither a --replace nor a resume) may live at neighbours, which
        # would drop new items that reuse them. New local items take numbers above any
        # that process could have used (a fresh buffer starts there already; a restored
        # one goes on from its checkpoint's).
        resume_sequence(buf, seq_floor())
        if rejoin or resume_from is not None:
            src = peer_dir(resume_from, rank) if resume_from is not None else out
            _at_start(run_dir, lambda: _carry_best(src, out, summary, continued=src if same_run else None, run=run,
                                                   env=spec.env), out / "best.pt")
        x = agent.parameters()

        repair = g.exchange == "gradients" and not g.average and g.relay_staleness == 1

        async def build() -> tuple[Any, Any]:
            # Handlers are registered from the peer's own thread, where messages are dispatched.
            gossip = Gossip(peer, x, topology=g.topology, codec=g.codec, gamma=g.step_size, sync=g.sync,
                            max_staleness=g.max_staleness, round_timeout=g.round_timeout_s,
                            edges=g.edges or None, seed=spec.seed)
            fed = None
            if b.sharing and (b.share > 0 or b.replicas > 0):
                fed = Federation(buf, peer, share=b.share, share_by=b.share_by, replicas=b.replicas,
                                 rate=b.rate or None, ack_timeout=b.ack_timeout_s,
                                 ack_timeout_max=b.ack_timeout_max_s, seed=seed,
                                 ride=b.ride and g.exchange == "gradients")
            relay = None
            if g.exchange == "gradients":
                # direct: this (training) thread sends and takes the gradients itself, and
                # with buffer.ride the shared transitions with them. Without averaging the
                # copies stay the same only by the turns: a copy that falls out of step is
                # replaced by a neighbour's (state; docs/gossip.md, "Out of step").
                relay = GradientRelay(peer, x.size, codec=g.codec, topology=g.topology, edges=g.edges or None,
                                      direct=True, rider=fed if fed is not None and fed.riding else None,
                                      state=agent.replica if repair else None, resync_timeout=g.round_timeout_s)
            return gossip, fed, relay

        gossip, fed, relay = sp.call(build())
        if relay is not None and not relay.ready(timeout=10.0):
            # a gradient sent to a neighbour without a relay yet would be lost
            log.warning("peer%d: not every neighbour's gradient inbox is known after 10 s; "
                        "early gradients may be lost", rank)
        # With the relay, a peer's turn is `per_turn` updates, numbered by a clock that
        # counts updates: steps · per_turn + k for the k-th update of the turn at `steps`.
        # They go out together, in one message, with the turn's last update.
        per_turn = spec.dqn.updates_per_train
        if relay is not None:
            turn = [-1, 0]   # (env steps of the current turn, updates published in it)
            # This process's turns start at learning_starts, or where its agent goes on from
            # (a resume, a restart): the gradients before are in the copy it loaded, and a
            # neighbour not heard from yet gets a turn's grace from there, as in a fresh run.
            # (Counted from learning_starts, which a resume is past, the others went on without
            # the peer slowest to start a resumed swarm, and it took a copy at once.)
            turns_from = max(spec.dqn.learning_starts, agent.steps) * per_turn

            def publish(grad: np.ndarray | None) -> np.ndarray | None:
                note_digest()   # after the turn's previous update: a turn of several would skip counts
                if turn[0] != agent.steps:
                    turn[0], turn[1] = agent.steps, 0
                turn[1] += 1
                try:
                    return relay.publish(grad, clock=agent.steps * per_turn + turn[1] - 1, hold=turn[1] < per_turn)
                except BaseException:   # refused, nothing sent: the pass that follows takes its clock
                    turn[1] -= 1
                    raise

            agent.publish = publish
            agent.phase = rank % spec.dqn.train_every   # peers take turns at computing gradients
        replacing = bool(getattr(peer_config, "replace", False))
        if _should_bootstrap(coordinators, status, peer.id, done_steps, g.interval,
                             fallback=replacing or resume_from is not None, learning_starts=spec.dqn.learning_starts):
            try:
                donors = sp.call(gossip.bootstrap(timeout=g.bootstrap_timeout_s),
                                 timeout=g.bootstrap_timeout_s + 10.0)
            except (GossipError, PeerTimeout) as e:
                log.warning("peer%d: bootstrap failed (%s); training on from its own parameters", rank, e)
                summary["bootstrap"] = f"failed: {e}"
                state.error(summary["bootstrap"])
            else:
                agent.on_parameters_changed()
                if donors:   # the online network is now the donors': so is the target (docs/rl.md)
                    agent.sync_target()
                summary["bootstrap"] = donors
                log.info("peer%d bootstrapped its parameters from %s", rank, donors)
        before = np.empty_like(x)
        acked_log = out / "acked.bin" if fed is not None and b.replicas else None

        async def exchange() -> tuple[Any, list[tuple[str, int]], SwarmError | None]:
            np.copyto(before, x)
            res = failed = None
            try:
                res = await gossip.round() if g.average else None
            # returned after the flush: the replay pushes and acks due go on. A ConfigError is
            # a view the topology cannot take (a hypercube of 3 once one of 4 has ended its
            # budget, or while it restarts): the peers exited 2 as if the spec were wrong
            except (GossipError, ConfigError) as e:
                failed = e
            if fed is not None:   # what it sent counts in rounds.csv from fed.stats (gossip_round)
                try:
                    await fed.flush()
                except BaseException as e:
                    # The flush's error goes up in place of the round's, which gossip_round
                    # then never logs: unless logged and chained here, it would be lost.
                    if failed is not None:
                        log.warning("peer%d: gossip round failed (%s); then its federation flush raised %s",
                                    rank, failed, type(e).__name__)
                        if e.__context__ is None:
                            e.__context__ = failed
                    raise
            # read on the peer's thread, which is where acknowledgements change the set
            acked = fed.take_acknowledged() if acked_log is not None else []
            return res, acked, failed

        def stats() -> dict[str, Any]:
            # Runs on the peer's thread at each heartbeat: plain reads, no locks needed.
            return {**(state.final_traffic or state.traffic(*_traffic(peer.counters, relay))),
                    "env_steps": state.env_steps, "episodes": state.episodes,
                    "mean_return": _finite(state.mean_return), "rounds": state.rounds,
                    "rounds_ok": state.rounds_ok,
                    "disagreement": _finite(state.disagreement), "eval_return": _finite(state.eval_return),
                    # the buffer as it is (what neighbours send goes in between the steps too)
                    "buffer_size": len(buf), "budget": spec.budget.env_steps, "done": state.done,
                    "codec_ratio": (state.gossip_bytes_out / state.dense_bytes_out
                                    if state.dense_bytes_out else None),
                    "staleness": state.staleness, "last_error": state.last_error, "spec": tag,
                    "skipped": agent.skipped, "unusable": agent.unusable,
                    # with buffer.replicas: local items fewer than k neighbours hold (docs/buffer.md)
                    **({"under_replicated": fed.stats.under_replicated} if fed is not None and b.replicas else {}),
                    # with gradient exchange: what the relay set aside (docs/observability.md)
                    **({"relay_held_dropped": relay.stats.held_dropped, "relay_stale": relay.stats.stale,
                         "relay_unlisted": relay.stats.unlisted}
                       if relay is not None else {})}

        peer.stats = stats

        def seconds() -> dict[str, float]:
            # wall_s and cpu_s for the CSVs and checkpoints: the run's (cpu0 is reset when training starts)
            return state.seconds(time.monotonic() - t0, time.process_time() - cpu0)

        # A peer restarted into its own folder continues its files, with or without a
        # checkpoint, less the rows past the env steps it continues from.
        logs = _at_start(run_dir, lambda: _Logs(out, tensorboard, append=rejoin or same_run, upto=done_steps,
                                                failed=unwritten))
        drop_summary()   # it trains from here on

        def run_counters() -> dict[str, Any]:
            # what every checkpoint (ckpt/, checkpoint.pt, best.pt) carries over to a resume (carry_over)
            return {"env_steps": state.env_steps, "episodes": state.episodes,
                    "rounds": state.rounds, "rounds_ok": state.rounds_ok,
                    "returns": list(state.returns),
                    # the relay's bytes up to now: it sends between rounds too, and
                    # a resume carries on from these
                    **(state.final_traffic or state.traffic(*_traffic(peer.counters, relay),
                                                             gossip=state.gossip_now(gossip, relay))),
                    **seconds()}

        def save_params(path: Path, **extra: Any) -> Path:
            counters = run_counters()
            out.mkdir(parents=True, exist_ok=True)
            return _save_whole({"agent": agent.state_dict(), "params": torch.from_numpy(agent.parameters().copy()),
                                "rank": rank, "env_steps": counters["env_steps"], "counters": counters,
                                "spec": to_dict(spec), **run.record(), **extra}, path)

        c = spec.checkpoint
        ckpt = Checkpointer(out / "ckpt", agent, buf, run_counters,
                            full_every_s=c.full_every_s, full_every_steps=c.full_every_steps,
                            incremental_every_steps=c.incremental_every_steps, run=run)
        last_loss: list[float] = [float("nan")]
        reason = ["budget"]
        call_timeout = g.round_timeout_s + 10.0

        # Whether a round has work on the peer's loop: averaging, or replay sharing and
        # replication that do not ride on the relay's messages. Without any, a round
        # only logs the traffic since the last one.
        loop_work = g.average or (fed is not None and (not fed.riding or fed.replicas > 0))

        round_failed = _Recurring()

        def gossip_round(step: int) -> None:
            res, shared, acked, failed = None, 0, [], None
            if loop_work:
                try:
                    res, acked, failed = sp.call(exchange(), timeout=call_timeout)
                except PeerTimeout:
                    log.warning("peer%d: gossip round did not finish within %.0f s; skipped", rank, call_timeout)
                    state.error(f"step {step}: gossip round timed out after {call_timeout:.0f} s", of_round=True)
                    return
            if acked:   # each id comes once: nothing to remember here
                try:
                    _append_whole(acked_log, np.array([s for _, s in acked], dtype=np.int64).tobytes())
                except OSError as e:   # a full disk: the file keeps the entries before, whole
                    unwritten("acked.bin", e, "the ids acknowledged meanwhile go unrecorded; training goes on")
            if failed is not None:   # it sent and changed nothing (x NaN, say): training goes on
                round_failed("peer%d: gossip round at env step %d skipped: %s", rank, step, failed)
                state.error(f"step {step}: gossip round skipped: {failed}", of_round=True)
                return
            if fed is not None:
                # What went since the last row: with buffer.ride what rode on the relay, and
                # what the flushes of rounds skipped since sent (they have no row of their own).
                shared = fed.stats.pushed - state.shared_pushed
                state.shared_pushed += shared
            state.rounds += 1
            if res is not None:
                agent.on_parameters_changed()
                state.round_done(res)
            bytes_out, bytes_in = state.gossip_totals(gossip, relay)   # (gossip.exchange = gradients)
            if relay is not None:   # one dense vector per gradient: a turn's go in one message, a pass has none
                state.dense_bytes_out += (relay.stats.vectors_out - state.relay_vectors) * x.nbytes
                state.relay_vectors = relay.stats.vectors_out
            if res is None:   # averaging is off: the round shared replay, and gradients went by
                logs.rounds.writerow({
                    "round": state.rounds, "env_steps": step, "wall_s": seconds()["wall_s"],
                    "participants": "", "missing": "", "bytes_out": bytes_out, "bytes_in": bytes_in,
                    "waited_s": 0, "disagreement": "", "shared_items": shared, "gossip_round": ""})
                logs.scalars(step, {"gossip/bytes_out": bytes_out, "gossip/bytes_in": bytes_in})
                return
            state.dense_bytes_out += res.sent * x.nbytes
            state.staleness = max(res.staleness.values(), default=0)

            # How far the round moved us, per parameter and per unit of step size:
            # with exact gossip this is the RMS distance to the neighbourhood average.
            if res.ok:
                state.disagreement = float(np.sqrt(np.mean(np.square(x - before)))) / g.step_size
            # round: the run's count (metrics.csv's rounds, which a resume goes on from);
            # the engine numbers its rounds itself, from its own start. The bytes are the
            # totals' growth, as without averaging: res.bytes_out leaves out the relay's.
            logs.rounds.writerow({
                "round": state.rounds, "env_steps": step, "wall_s": seconds()["wall_s"],
                "participants": len(res.participants), "missing": len(res.missing),
                "bytes_out": bytes_out, "bytes_in": bytes_in, "waited_s": round(res.waited_s, 4),
                "disagreement": f"{state.disagreement:.6g}" if res.ok else "", "shared_items": shared,
                "gossip_round": res.round})
            logs.scalars(step, {"gossip/bytes_out": bytes_out, "gossip/bytes_in": bytes_in,
                                "gossip/disagreement": state.disagreement if res.ok else None,
                                "gossip/participants": len(res.participants)})

        def note_digest() -> None:
            # With the relay every peer applies the same updates in one order: equal
            # digests at equal counts say their copies are the same (summary.json).
            u = agent.updates
            if u and u % DIGEST_EVERY == 0 and u not in digests:
                digests[u] = array_digest(x)
                relay.note_digest(u, digests[u])   # others compare theirs with it (repair)
                if (u // DIGEST_EVERY) % DIGESTS_RECENT == 0:
                    _thin_digests(digests, u, DIGESTS_RECENT)   # bounded: the older, the fewer

        def adopt(snap: Any) -> bool:
            """Load the copy a neighbour sent when this peer fell out of step; whether it did."""
            if snap is None:
                return False
            try:
                agent.load_replica(snap.body, snap.arrays)   # checks all of it first
            except SwarmError as e:
                relay.refuse(snap, str(e))
                return False
            relay.adopt(snap)
            if snap.next is not None:   # the others' turns went past this peer's: it starts again there
                agent.steps = snap.next // per_turn
            digests.clear()   # those of the copy it replaced
            log.warning("peer%d: out of step (%s); took %s's copy (update %d, clock %d)%s", rank, snap.why,
                        snap.src, agent.updates, snap.clock,
                        f", turns again from env step {agent.steps}" if snap.next is not None else "")
            note_digest()
            return True

        parent_check = [0.0]   # when the launcher is next looked for (monotonic)
        refused = _Recurring()
        warned_skipped = [False]

        def on_step(info: Any) -> bool:
            step = info.step + done_steps
            state.env_steps = step
            if agent.skipped and not warned_skipped[0]:
                # metrics.csv shows such a loss as inf or nan, TensorBoard leaves it out: a peer
                # whose every update is skipped learns nothing and still ends "budget"
                warned_skipped[0] = True
                log.warning("peer%d: an update's loss or gradient was not finite (NaN or inf) at env step %d; "
                            "such updates are skipped and counted (skipped in summary.json and the "
                            "heartbeat): check the env's rewards and observations, or lower dqn.lr",
                            rank, step)
            if relay is not None:
                relay.poll()    # take in gradients, and pass on those that travel further
                note_digest()   # after this step's own update, if it took one
            if relay is not None and agent.learns_at(agent.steps):
                # Turns: the gradient the next step computes includes the others' up to
                # relay_staleness rounds back (waiting is wall time; on a shared machine it
                # costs CPU too, docs/gossip.md). Every peer
                # applies the others' gradients at its turns, in (clock, origin) order, and
                # then its own: one order everywhere, so the copies stay the same.
                a = agent.steps * per_turn
                # A wait that ends with a copy from a neighbour (this peer was out of step):
                # load it, and wait again at the turn's clock, which may have moved with it.
                while not relay.wait(a, g.round_timeout_s, every=spec.dqn.train_every * per_turn,
                                     rounds=g.relay_staleness, first=turns_from,
                                     span=per_turn) and adopt(relay.snapshot()):
                    a = agent.steps * per_turn
                for grad in relay.take(before=a):
                    try:
                        agent.apply_gradient(grad)
                    except SwarmError as e:
                        # it changed nothing; the others applied it, so from here on this
                        # copy may differ from theirs (docs/gossip.md, "Out of step")
                        state.relay_refused += 1
                        state.error(f"step {step}: a neighbour's gradient refused: {e}")
                        refused("peer%d: a neighbour's gradient refused at env step %d (%s); not applied, "
                                "training goes on (refused in summary.json's relay)", rank, step, e)
                        continue
                    state.relay_applied += 1
                    note_digest()
            if info.episode_return is not None:
                state.episodes += 1
                state.returns.append(info.episode_return)
                m = agent.metrics()
                size = len(buf)   # once: a neighbour's insert between two reads made two sizes
                if "loss" in m:
                    last_loss[0] = m["loss"]
                logs.episodes.writerow({
                    "wall_s": seconds()["wall_s"], "env_steps": step, "episode": state.episodes,
                    "episode_return": info.episode_return, "mean_return": f"{state.mean_return:.4g}",
                    "rounds": state.rounds, **state.traffic(*_traffic(peer.counters, relay)),
                    "loss": f"{m['loss']:.6g}" if "loss" in m else "", "epsilon": f"{m['epsilon']:.4f}",
                    "buffer_size": size})
                logs.scalars(step, {"episode/return": info.episode_return, "episode/mean_return": state.mean_return,
                                    "train/loss": m.get("loss"), "train/epsilon": m["epsilon"],
                                    "train/q_mean": m.get("q_mean"), "buffer/size": size})
            if step % g.interval == 0:
                gossip_round(step)
            ckpt.step(step)
            ev = spec.eval
            if ev.every and step % ev.every == 0:
                state.eval_return = float(np.mean(evaluate(spec.env, agent, episodes=ev.episodes,
                                                           seed=10_000 + 100 * rank)))
                logs.evals.writerow({**seconds(), "env_steps": step, "eval_return": state.eval_return})
                logs.scalars(step, {"eval/return": state.eval_return})
                logs.flush()
                if state.eval_return > summary.get("best_eval_return", -math.inf):
                    # DQN's greedy return swings long after it first solves a task, so
                    # the final parameters need not be the best ones evaluated.
                    try:
                        save_params(out / "best.pt", eval_return=state.eval_return)
                    except OSError as e:   # a full disk: the best.pt there stays, and what summary.json says of it
                        unwritten("best.pt", e, "the one there (if any) stays; training goes on")
                    else:
                        summary.update(best_eval_return=state.eval_return, best_eval_at=step)
                if (spec.budget.stop_when_solved and state.eval_return >= ev.solve_return
                        and ev.solver in (-1, rank)):
                    reason[0] = "solved"
                    summary["solved_at"] = step
                    return True
            if stop.is_set():
                reason[0] = "stopped"
                return True
            # every step (one clock read): a check every 200 steps overshot the limit by seconds
            now = time.monotonic()
            if now > stop_at:
                reason[0] = "time limit"
                return True
            if step % 200 == 0:
                logs.flush()
            # once a second: every 200 steps took 40 s once the launcher's coordinator was gone
            # too (each gossip round waited out its timeout)
            if parent_pid is not None and now >= parent_check[0]:
                parent_check[0] = now + 1.0
                if os.getppid() != parent_pid:
                    reason[0] = "launcher gone"
                    return True
            return False

        # the earlier of this process's limit and the run's, on the monotonic clock
        stop_at = min(t0 + spec.budget.max_seconds, run_ends) if spec.budget.max_seconds else math.inf
        log.info("peer%d training: %d env steps, gossip every %d", rank, spec.budget.env_steps, g.interval)
        # CPU time counts from here: joining, imports and TensorBoard set-up are not training.
        summary["setup_cpu_s"] = time.process_time() - cpu0
        cpu0 = time.process_time()
        result = run_agent(spec.env, agent, max(0, spec.budget.env_steps - done_steps), seed=seed + done_steps,
                           on_step=on_step)
        summary.update(reason=reason[0], env_steps=result.steps + done_steps, episodes=len(result.returns),
                       final_mean_return=_finite(result.mean_return(10)), train_seconds=result.seconds)
    finally:
        try:   # whatever fails here, the relay and the peer are closed below
            state.done = True
            if gossip is not None:
                # the counters as they end: the relay's turns go on between rounds, and each
                # round took the totals only as they were then (the last one missed the turns after it)
                state.gossip_totals(gossip, relay)
            traffic = state.traffic(*_traffic(sp.peer.counters if sp.peer is not None else None, relay))
            state.final_traffic = traffic   # what the files written below record too, and the leave
            summary.update(
                env_steps=state.env_steps, episodes=state.episodes, rounds=state.rounds, rounds_ok=state.rounds_ok,
                final_mean_return=_finite(state.mean_return), eval_return=_finite(state.eval_return),
                **traffic, buffer_size=len(agent.buffer) if agent is not None else 0,
                wall_s=time.monotonic() - t0, cpu_s=time.process_time() - cpu0)
            if agent is not None:   # this process's: updates skipped for a non-finite loss or gradient,
                summary["skipped"] = agent.skipped   # and sampled items no update could learn from
                summary["unusable"] = agent.unusable
            if relay is not None:
                summary["relay"] = dict(dataclasses.asdict(relay.stats), applied=state.relay_applied,
                                        refused=state.relay_refused,
                                        mean_lag_s=_finite(relay.stats.mean_lag_s),
                                        digests={str(u): h for u, h in digests.items()}, resynced=relay.resynced)
            if fed is not None:
                summary["replay_sharing"] = dataclasses.asdict(fed.stats)
            # A resume or restart that fails before it trains (no checkpoint loads, or one does not
            # fit the spec) changes none of the folder's results: its checkpoint.pt, ids.json and
            # summary.json stay those of the process that wrote them (with none, one says why it ended).
            keep = ckpt is None and (resume_from is not None or rejoin)
            final_failed: str | None = None   # why the final full checkpoint failed
            if ckpt is not None:
                try:
                    summary["last_checkpoint"] = ckpt.close()
                except (SwarmError, OSError) as e:
                    log.error("peer%d: final checkpoint failed: %s", rank, e)
                    final_failed = str(e)
                summary.update(checkpoint_failures=ckpt.failures + (final_failed is not None),
                               checkpoint_error=final_failed or ckpt.last_error)
            if agent is not None and agent.buffer is not None and spec.buffer.replicas and not keep:
                held: dict[str, list[int]] = {}
                for o, s in agent.buffer.ids():
                    held.setdefault(o, []).append(s)
                try:
                    write_json(out / "ids.json", held, indent=None)
                except OSError as e:   # a full disk: the ids.json there (if any) stays
                    unwritten("ids.json", e, "the one there (if any) stays")
            if ckpt is not None:
                try:
                    summary["checkpoint"] = str(save_params(out / "checkpoint.pt"))
                except OSError as e:   # a full disk: the checkpoint.pt there (if any) stays
                    unwritten("checkpoint.pt", e, "the one there (if any) stays")
            if logs is not None:
                logs.close()
            summary.update(write_failures=dict(unwritten.counts), write_error=unwritten.last_error)
            if not (keep and (out / "summary.json").is_file()):
                try:
                    out.mkdir(parents=True, exist_ok=True)
                    write_json(out / "summary.json", summary, indent=2)
                except OSError as e:   # a full disk: none is left (an earlier one went); the run still ends
                    unwritten("summary.json", e, "none is left")
                    summary.update(write_failures=dict(unwritten.counts), write_error=unwritten.last_error)
        finally:
            torch.set_num_threads(threads)
            if relay is not None:
                relay.close()   # its sockets belong to this thread
            if status is not None:
                status.close()
            sp.close()
    return summary
