"""Save and restore a replay buffer exactly, without stalling the learner.

A snapshot is a directory::

    meta.json         schema, capacity, config, counters, peers, decay base, saved_at, rng state
    <field>.npy       one file per schema field, capacity rows
    _leaf.npy         tree leaves (stored priorities)
    _ticket.npy _origin.npy _seq.npy _time.npy

The snapshot is the buffer's state at the moment ``save`` is called, although
copying takes a while at 1M items: the rows are copied in chunks, each under
the buffer's lock for a millisecond or two, and a write that lands on a row not
yet copied first sets the old row aside (copy-on-write). Sampling therefore
waits at most one chunk copy. A snapshot is written to a temporary directory,
each file synced to disk, and renamed into place, so a crash never leaves half
a snapshot at ``path``. The files are written with plain writes, not through a
memory map: on a full disk a store into a mapped page kills the process with
SIGBUS, where a write raises ``ENOSPC``. A save that fails (a full disk, a
folder it may not write) raises :class:`ReplayError`, removes its temporary
directory and leaves the snapshot already at ``path`` as it was. A background
save still running when the program ends is finished before the interpreter
exits (see :meth:`Snapshot.start`). An increment
(:func:`take_incremental`, the rows written since a full snapshot) is copied
the same way, and written chunk by chunk as it is read (:func:`save_incremental`);
:func:`load_incremental` applies it from the files, memory-mapped, a chunk at a time.

A save (``digest=True``) and an increment (``take_incremental(..., digest=True)``)
can also hash the whole buffer as it was at their moment, with :func:`digest`'s
result, by the same chunked copy-on-write reading: the lock is not held while
the rows are hashed (about a millisecond per MB).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import glob
import json
import math
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ..checks import is_int, is_real, process_gone, seconds
from ..errors import ConfigError, ReplayError
from .limiter import RateLimiter

if TYPE_CHECKING:
    from .replay import ReplayBuffer

__all__ = ["Increment", "Snapshot", "save", "load", "save_incremental", "take_incremental", "load_incremental",
           "digest", "resume_sequence"]

FORMAT = 1
_CHUNK = 1 << 15  # most rows per locked copy: ~3 MB for obs float32[8] transitions
_CHUNK_BYTES = 4 << 20   # and most bytes: image observations make rows of tens of kB
_OWN = ("_leaf", "_ticket", "_origin", "_seq", "_time")   # the columns every snapshot has besides its fields


def _columns(buf: "ReplayBuffer") -> dict[str, np.ndarray]:
    cols = dict(buf._data)
    cols.update(zip(_OWN, (buf._tree.leaves, buf._ticket, buf._origin, buf._seq, buf._time)))
    return cols


def _check_target(path: Path, increment: bool = False) -> None:
    """Raise unless ``path`` may be replaced by a snapshot (an incremental one if
    ``increment``): absent, an empty directory or a snapshot of the same kind (its
    meta.json one this module writes, or, damaged, with nothing but snapshot files).

    Anything else would be renamed aside and deleted with the old snapshot: a
    results directory given by mistake would lose every file in it, and an
    increment written to its full snapshot's path the base it cannot load without.
    """
    size = len(os.fsencode(path.name))
    if size > _NAME_MAX:   # else refused only by the last rename, after every row was written
        raise ReplayError(f"snapshot path {path}: its name is {size} bytes, longer than the {_NAME_MAX} "
                          "bytes a file name may have; give a shorter one")
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return
    if path.is_dir() and not path.is_symlink() and (path / "meta.json").is_file():
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            meta = None
        if not (isinstance(meta, dict) and meta.get("format") == FORMAT and "schema" in meta
                and "capacity" in meta):
            # Any folder may hold a meta.json: replaced only if all else there is a snapshot's
            if _snapshot_files(path):
                return
            raise ReplayError(f"{path} exists and is not a replay snapshot (its meta.json is not one, and it holds "
                              "other files): a snapshot replaces its directory whole, so give a new path "
                              "(or remove it first)")
        held = "since" in meta
        if held == increment:
            return
        if increment:
            raise ReplayError(f"{path} holds a full snapshot: an increment written there would replace it, "
                              "and cannot be loaded without it; give the increment a path of its own")
        raise ReplayError(f"{path} holds an incremental snapshot: a full one would replace it; "
                          "give a new path (or remove it first)")
    raise ReplayError(f"{path} exists and is not a replay snapshot: a snapshot replaces its directory "
                      "whole, so give a new path (or remove it first)")


def _snapshot_files(path: Path) -> bool:
    """Whether the directory ``path`` holds only files a snapshot (or an increment) writes:
    meta.json and ``.npy`` files, its own columns among them."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    names = {p.name for p in entries}
    return (all(p.name == "meta.json" or (p.suffix == ".npy" and p.is_file() and not p.is_symlink())
                for p in entries)
            and {f"{k}.npy" for k in _OWN} <= names)


class _Frozen:
    """A buffer's rows as they were when this was made, read afterwards chunk by chunk.

    Made under the buffer's lock, it registers as the buffer's saver: each chunk is
    then copied under the lock for a millisecond or two, and a write that lands on a
    row not yet copied first sets the old row aside (:meth:`preserve`), so the chunks
    put together are the buffer at that moment. One at a time per buffer; whoever
    makes one must :meth:`_release` it (the buffer defers rebases and origin-list
    compactions while it is registered).

    ``whole``: a mask of the slots whose every column is read (None: all of them);
    of the others only the priority leaves are read (and set aside).
    """

    def __init__(self, buf: "ReplayBuffer", whole: np.ndarray | None = None) -> None:
        self._buf = buf
        self.max_stall_s = 0.0   # longest time the buffer's lock was held for one chunk
        self._whole = whole
        # the chunks depend on the columns' shapes and the mask only: laid out before the lock
        self._spans = _spans(_columns(buf), buf.capacity, whole)
        self._starts = np.array([a for a, _, _ in self._spans], dtype=np.int64)
        self._span_whole = np.array([w for _, _, w in self._spans], dtype=bool)
        with buf._lock:
            if buf._saver is not None:
                raise ReplayError("a snapshot of this buffer is already being written (or an increment or digest read)")
            t0 = time.perf_counter()
            self._meta = _meta(buf)
            self._counters = _counters(buf)
            self._cursor = 0
            self._kept = np.zeros(buf.capacity, dtype=bool)
            # chunk number -> the rows set aside for it: (slots, their old columns, the
            # chunk's rows slots[x:y], where they start in the columns other than _leaf,
            # None where only leaves were kept). Each row is copied once, and the chunk
            # that reads it takes it (joining them all at every chunk copied them again and
            # again: 27 GiB for a 1 GB buffer of frames)
            self._aside: dict[int, list[tuple[np.ndarray, dict[str, np.ndarray], int, int, int | None]]] = {}
            buf._saver = self
            self.max_stall_s = time.perf_counter() - t0

    def _release(self) -> None:
        with self._buf._lock:
            if self._buf._saver is self:
                self._buf._saver = None

    def preserve(self, slots: np.ndarray) -> None:
        """Called by the buffer, lock held, before it changes ``slots``: keep rows not yet copied."""
        s = slots[slots >= self._cursor]
        if s.size == 0:
            return
        s = np.unique(s[~self._kept[s]])
        if s.size == 0:
            return
        self._kept[s] = True
        cols = _columns(self._buf)
        chunk = np.searchsorted(self._starts, s, side="right") - 1
        # each column copied once for all the rows (fancy indexing copies); each chunk they
        # fall in gets where its rows are in them, and copies them when it is read
        if self._whole is None:   # a full snapshot: every row read whole
            old = {k: c[s] for k, c in cols.items()}
            at = None
        else:   # rows not read whole: their leaves only
            whole = self._span_whole[chunk]
            old = {k: c[s] if k == "_leaf" else c[s[whole]] for k, c in cols.items()}
            # where each row read whole is in the copies of the columns other than _leaf
            at = [i if w else None for i, w in zip((np.cumsum(whole) - 1).tolist(), whole.tolist())]
        # s is sorted: each chunk's slots are one run of it
        edges = [0, *(np.flatnonzero(chunk[1:] != chunk[:-1]) + 1).tolist(), s.size]
        for a, b in zip(edges[:-1], edges[1:]):
            self._aside.setdefault(int(chunk[a]), []).append((s, old, a, b, a if at is None else at[a]))

    def _read(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """``(a, part)`` in slot order, ``part`` the columns of rows ``a ..`` as they were when
        this was made: every column, or only ``_leaf`` for rows not read whole."""
        buf = self._buf
        cols = _columns(buf)
        for i, (a, b, whole) in enumerate(self._spans):
            with buf._lock:
                t0 = time.perf_counter()
                part = {k: c[a:b].copy() for k, c in cols.items() if whole or k == "_leaf"}
                self._cursor = b
                aside = self._aside.pop(i, [])
                self.max_stall_s = max(self.max_stall_s, time.perf_counter() - t0)
            for slots, old, x, y, lo in aside:   # outside the lock, back to the old values
                rows = slots[x:y] - a
                part["_leaf"][rows] = old["_leaf"][x:y]
                if lo is not None:   # (rows, leaves and all, at lo.. of the other columns' copies)
                    for k, v in old.items():
                        if k != "_leaf":
                            part[k][rows] = v[lo:lo + y - x]
            yield a, part

    def _chunks(self) -> Iterator[dict[str, np.ndarray]]:
        """Every column's rows in order, chunk by chunk, each chunk as it was when this was made."""
        for _, part in self._read():
            yield part


def _spans(cols: dict[str, np.ndarray], cap: int, whole: np.ndarray | None) -> list[tuple[int, int, bool]]:
    """The locked copies of a :class:`_Frozen` in slot order: ``(a, b, whole)``, rows
    ``a .. b-1`` read whole or their leaves only, each copy at most _CHUNK rows and
    _CHUNK_BYTES bytes."""
    # 32k rows of 84x84 frames would hold the lock over half a GB of copying
    row = sum(c[:1].nbytes for c in cols.values())
    steps = {True: max(1, min(_CHUNK, _CHUNK_BYTES // max(1, row))),
             False: max(1, min(_CHUNK, _CHUNK_BYTES // max(1, cols["_leaf"][:1].nbytes)))}
    if whole is None:
        runs = [(0, cap, True)]
    else:   # the mask's runs of equal values
        edges = [0, *(np.flatnonzero(np.diff(whole.view(np.int8))) + 1).tolist(), cap]
        runs = [(a, b, bool(whole[a])) for a, b in zip(edges[:-1], edges[1:])]
    return [(a, min(hi, a + steps[w]), w) for lo, hi, w in runs for a in range(lo, hi, steps[w])]


class _Hashes:
    """:func:`digest`'s column hashes, fed chunk by chunk in row order (equal to hashing
    each column whole)."""

    def __init__(self, cols: dict[str, np.ndarray]) -> None:
        self._h = {k: hashlib.blake2b(digest_size=16) for k in cols}

    def update(self, part: dict[str, np.ndarray]) -> None:
        for k, v in part.items():
            self._h[k].update(np.ascontiguousarray(v).reshape(-1).view(np.uint8))

    def result(self, counters: str) -> dict[str, str]:
        return {**{k: h.hexdigest() for k, h in self._h.items()}, "_counters": counters}


class Snapshot(_Frozen):
    """A save in progress (or done). ``wait()`` returns once it is on disk, re-raising its error.

    It writes once, by :meth:`run` or :meth:`start`: a second call raises
    :class:`ReplayError` (call :func:`save` again for a new snapshot).

    With ``digest=True``, :attr:`digest` is then :func:`digest` of the buffer as it
    was when the save began (what the snapshot holds), hashed as the rows are written.
    """

    def __init__(self, buf: "ReplayBuffer", path: str | os.PathLike, *, digest: bool = False) -> None:
        from .replay import ReplayBuffer  # noqa: PLC0415 - replay imports this module

        if not isinstance(buf, ReplayBuffer):   # an AttributeError from deep inside before
            raise ReplayError(f"buf must be a ReplayBuffer, got {type(buf).__name__}")
        self.path = Path(path)
        _check_target(self.path)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._hash = digest
        self.digest: dict[str, str] | None = None
        self._claimed = False
        super().__init__(buf)

    def _claim(self) -> None:
        """Take this snapshot's one write, or raise: run again, it wrote the rows as they
        were then under its first moment's meta.json (and two starts shared one cursor)."""
        with self._buf._lock:
            if self._claimed:
                raise ReplayError(f"snapshot to {self.path} was already run: a snapshot is written once; "
                                  "call save() again for a new one")
            self._claimed = True

    def run(self) -> "Snapshot":
        """Write the snapshot on this thread; :meth:`wait` raises its error, if any. A
        KeyboardInterrupt or SystemExit (any BaseException not an Exception) goes on up
        once the temporary directory is removed: it is the caller's, not a failed save."""
        self._claim()
        return self._run(foreground=True)

    def _run(self, foreground: bool = False) -> "Snapshot":
        try:
            self._write()
        except BaseException as e:  # surfaced by wait()
            self._error = e
            if foreground and not isinstance(e, Exception):
                # Ctrl-C during buf.save(path) became ReplayError("... failed: "), which a
                # loop that carries on after a failed save (a full disk) swallowed
                raise
        finally:
            self._release()
            self._done.set()
        return self

    def start(self) -> "Snapshot":
        """Write the snapshot on a thread of its own; :meth:`wait` for it. Raises
        :class:`ReplayError` if the thread cannot start (the snapshot is then done, failed).

        The program's end waits for it too: the thread is not a daemon, which the
        interpreter would kill at exit, leaving no snapshot and its temporary directory
        on disk for good (the directory's name holds this process's id).
        """
        self._claim()
        self._thread = threading.Thread(target=self._run, name="replay-snapshot", daemon=False)
        try:
            self._thread.start()
        except BaseException as e:   # RuntimeError: can't start new thread
            # registered as the buffer's saver, it would refuse every later save for good
            self._thread, self._error = None, e
            self._release()
            self._done.set()
            raise ReplayError(f"snapshot to {self.path}: its thread cannot start ({e})") from e
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> "Snapshot":
        """Block until written; raise :class:`ReplayError` on timeout or the save's own error.

        ``timeout``: finite seconds >= 0, or None (no deadline); anything else raises
        :class:`~swarm.errors.ConfigError` (and the save goes on).
        """
        timeout = seconds(timeout, none_ok=True)
        # past threading's own limit (~9.2e9 s) Event.wait raised OverflowError: no deadline
        if not self._done.wait(None if timeout is not None and timeout > threading.TIMEOUT_MAX else timeout):
            raise ReplayError(f"snapshot to {self.path} not finished after {timeout} s")
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise ReplayError(f"snapshot to {self.path} failed: {self._error}") from self._error
        return self

    def _write(self) -> None:
        tmp = _beside(self.path, "tmp")
        try:
            _clear_stale(self.path)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            self._write_columns(tmp)
            write_synced(tmp / "meta.json", json.dumps(self._meta).encode())
            _replace(tmp, self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)   # a failed save leaves no half snapshot using the disk
            raise

    def _write_columns(self, tmp: Path) -> None:
        """One ``.npy`` file per column, chunk by chunk, each chunk as it was when the save began."""
        cols = _columns(self._buf)
        hashes = _Hashes(cols) if self._hash else None
        out = _Rows({k: (c.dtype, c.shape) for k, c in cols.items()}, tmp)
        try:
            for part in self._chunks():   # disk writes and hashing outside the lock
                for k, v in part.items():
                    out.append(k, v)
                if hashes is not None:
                    hashes.update(part)
            out.sync()
        finally:
            out.close()
        if hashes is not None:
            self.digest = hashes.result(self._counters)


class _Rows:
    """Columns of the given ``(dtype, shape)`` filled in row order, part after part: in
    :attr:`arrays`, or with a ``folder`` in one ``.npy`` file per column there, written as
    the parts come (none is held whole in memory)."""

    def __init__(self, shapes: dict[str, tuple[np.dtype, tuple[int, ...]]], folder: Path | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._files: dict[str, Any] = {}
        self._at = dict.fromkeys(shapes, 0)
        try:
            for k, (dtype, shape) in shapes.items():
                if folder is None:
                    self.arrays[k] = np.empty(shape, dtype)
                    continue
                self._files[k] = f = open(folder / f"{k}.npy", "wb")
                np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                         "fortran_order": False, "shape": shape})
        except BaseException:
            self.close()
            raise

    def append(self, k: str, v: np.ndarray) -> None:
        """Rows ``v`` of column ``k``, after those appended before."""
        if self._files:
            self._files[k].write(np.ascontiguousarray(v).reshape(-1).view(np.uint8))
        else:
            self.arrays[k][self._at[k]:self._at[k] + len(v)] = v
        self._at[k] += len(v)

    def sync(self) -> None:
        """Flush the files and sync them to disk."""
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._files.values():
            f.close()


#: the longest file name, in bytes, of the usual file systems (ext4, xfs, btrfs, tmpfs, APFS)
_NAME_MAX = 255
#: the most bytes a temporary folder's name adds to its stem: ``.tmp-`` (or ``.old-``), a
#: pid of up to 10 digits, ``-`` and a thread id of up to 20 (or mkdtemp's 8 characters)
_SUFFIX_MAX = 36


def _stem(path: Path) -> str:
    """What the names of the temporary folders beside ``path`` start with: its name, or,
    where a suffix would make that longer than a file name may be, its first bytes, ``~``
    and a hash of the whole name (so each path's are its own, and found again by
    :func:`_clear_stale`). Before, a name of 231-255 bytes, valid for the file system,
    failed deep in the save with "File name too long"."""
    name = os.fsencode(path.name)
    if len(name) + _SUFFIX_MAX <= _NAME_MAX:
        return path.name
    tag = "~" + hashlib.blake2b(name, digest_size=8).hexdigest()
    keep = path.name[:_NAME_MAX - _SUFFIX_MAX - len(tag)]
    while len(os.fsencode(keep)) > _NAME_MAX - _SUFFIX_MAX - len(tag):   # cut whole characters
        keep = keep[:-1]
    return keep + tag


def _beside(path: Path, kind: str) -> Path:
    """This thread's temporary folder beside ``path``: ``<stem>.tmp-PID-THREAD`` (``kind``
    "tmp") or ``<stem>.old-PID-THREAD`` (an old snapshot renamed aside)."""
    return path.with_name(f"{_stem(path)}.{kind}-{os.getpid()}-{threading.get_ident()}")


#: a temporary folder in which nothing was written for this long, of a process not seen
#: here, is a killed save's (see _clear_stale)
_STALE_S = 600.0


def _clear_stale(path: Path) -> None:
    """Remove the temporary folders that saves to ``path`` by processes now gone left beside
    it (killed mid-save: an increment's is there for its whole read, up to as large as the
    increment, and no later save, by another pid, reused its name). Only folders of the
    names this module gives them (``<stem>.tmp-PID-THREAD`` or ``<stem>.tmp-PID-`` and 8
    characters, ``<stem>`` the name of ``path``, shortened if long: :func:`_stem`), without
    a ``meta.json`` (never a snapshot), whose process this one cannot see and in which
    nothing was written for ``_STALE_S`` (a save in another pid namespace on a shared disk
    may still be writing one)."""
    stem = _stem(path)
    name = re.compile(re.escape(stem) + r"\.tmp-(\d{1,10})-(\d+|[a-z0-9_]{8})")
    now = time.time()
    for old in path.parent.glob(glob.escape(stem) + ".tmp-*-*"):
        m = name.fullmatch(old.name)
        if m is None or not process_gone(int(m.group(1))) or (old / "meta.json").exists():
            continue
        try:
            if now - max((f.stat().st_mtime for f in (old, *old.iterdir())), default=0.0) < _STALE_S:
                continue
        except OSError:   # gone meanwhile, or not a folder
            continue
        shutil.rmtree(old, ignore_errors=True)


def no_link(path: str | Path, flags: int) -> int:
    """:func:`open`'s ``opener`` for a file swarm writes: a symbolic link in its place is
    refused (OSError naming it), not followed. One planted in a run folder that others
    may write had swarm overwrite the file it points to, anywhere this user may write."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(e.errno, "a symbolic link is there, and swarm writes through none: remove it",
                          str(path)) from None
        raise


def refuse_foreign_link(path: Path) -> None:
    """Raise ConfigError naming ``path`` when it is a symbolic link that another user made:
    in a run folder that others may write (a group-shared one, a ``--run-dir /tmp/x``
    another user made first), one planted as ``peer0/``, ``tb/`` or ``ckpt/`` had swarm
    write into, and prune (old event files, ``full-*`` folders), the folder it points to,
    anywhere this user may write. A link of this user's own (``ckpt`` on a scratch disk)
    is followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return   # not there yet (made as a folder), or not to be looked at: its use says why
    if stat.S_ISLNK(st.st_mode) and st.st_uid != os.geteuid():
        raise ConfigError(f"{path} is a symbolic link (to {os.readlink(path)}) that another user (uid "
                          f"{st.st_uid}) made, and swarm writes through no link planted in a run folder; "
                          "remove it, or pass --run-dir DIR for this run")


def create_new(path: Path) -> None:
    """Create ``path``, a temporary file, empty and this process's own: what is there goes
    first (a file that a killed write left; a link planted there, not the file it points
    to), and one that comes back meanwhile is not opened (FileExistsError)."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and sync it to disk (a crash after a rename must not leave
    it empty). A link in ``path``'s place is refused (:func:`no_link`); an OSError names
    ``path`` (a full disk's write names no file)."""
    try:
        with open(path, "wb", opener=no_link) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def _save_array(path: Path, a: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, a)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Sync a directory's entries (a rename into it) to disk, where the system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: renameat2's flag: swap two names in one step (Linux 3.15; not every file system has it)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directory entries ``a`` and ``b`` in one atomic step; False, with nothing
    changed, where the system or the file system cannot."""
    libc = _libc()
    rename2 = getattr(libc, "renameat2", None)
    if rename2 is None:
        return False
    if rename2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _LIBC = False
    return _LIBC


_LIBC: Any = None


def _replace(tmp: Path, path: Path, increment: bool = False) -> None:
    """Rename the complete snapshot ``tmp`` (an incremental one if ``increment``) to
    ``path``, replacing an earlier snapshot of its kind there; when the rename fails
    the earlier one is put back.

    Where the file system can, the two are swapped in one step (a crash leaves the old
    or the new snapshot at ``path``, and the old one's files under ``tmp`` at worst);
    elsewhere the old one is renamed aside first, and a crash between the two renames
    leaves it at ``path.old-PID-TID``, nothing at ``path``."""
    fsync_dir(tmp)
    if os.path.lexists(path):
        _check_target(path, increment)   # checked again: something else may have been put there meanwhile
        if _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)   # the old snapshot, now under tmp's name
            fsync_dir(path.parent)
            return
        old = _beside(path, "old")
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)


def _meta(buf: "ReplayBuffer") -> dict[str, Any]:
    return {
        "format": FORMAT, "schema": buf.schema.to_dict(), "capacity": buf.capacity,
        "alpha": buf.alpha, "eps": buf.eps, "decay": buf.decay, "sampler": buf.sampler,
        "stratified": buf.stratified, "peer_id": buf.peer_id, "peers": list(buf._peers),
        "next": buf._next, "next_seq": buf._next_seq, "read": buf._read, "max_p": buf._max_p,
        "base": buf._base, "saved_at": buf._now(), "limiter": buf.limiter.state(),
        "rng": buf._rng.bit_generator.state, "seed": buf._seed,
    }


def save(buf: "ReplayBuffer", path: str | os.PathLike, background: bool = False, *,
         digest: bool = False) -> Snapshot:
    """Write a snapshot of ``buf`` to the directory ``path`` (see module doc); with
    ``digest=True`` the snapshot's :attr:`Snapshot.digest` is that of what it holds."""
    snap = Snapshot(buf, path, digest=digest)
    return snap.start() if background else snap.run().wait()


def _read_meta(path: Path, what: str) -> dict[str, Any]:
    """A snapshot's meta.json, or a ReplayError that says what is wrong with it."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise ReplayError(f"{path} is not {what} (no meta.json)") from None
    except (OSError, ValueError) as e:   # unreadable, not UTF-8, not JSON
        raise ReplayError(f"{path}/meta.json is corrupt: {e}") from None
    if not isinstance(meta, dict):
        raise ReplayError(f"{path}/meta.json is corrupt: not a JSON object")
    return meta


def _check_meta(path: Path, meta: dict[str, Any]) -> None:
    """Raise ReplayError unless :func:`_apply_meta` can apply ``meta`` whole (checked before any change)."""
    try:
        counters = [int(meta[k]) for k in ("next", "next_seq", "read")]
        max_p, base = float(meta["max_p"]), float(meta["base"])
        peers = meta["peers"]
        np.random.default_rng().bit_generator.state = meta["rng"]
    except (KeyError, TypeError, ValueError) as e:
        raise ReplayError(f"{path}/meta.json is corrupt: {type(e).__name__}: {e}") from None
    if min(counters) < 0 or not (math.isfinite(max_p) and max_p > 0 and math.isfinite(base)):
        raise ReplayError(f"{path}/meta.json is corrupt: counters {counters}, max_p {max_p!r}, base {base!r}")
    saved_at = meta.get("saved_at", 0.0)   # snapshots before it have none
    if not (is_real(saved_at) and math.isfinite(saved_at)):
        raise ReplayError(f"{path}/meta.json is corrupt: saved_at {saved_at!r:.80} is not a finite number of seconds")
    if not (isinstance(peers, list) and peers and all(isinstance(p, str) and p for p in peers)):
        raise ReplayError(f"{path}/meta.json is corrupt: peers {peers!r:.200}")


def _check_values(path: Path, k: str, a: np.ndarray, meta: dict[str, Any]) -> None:
    """Stored priorities must be finite and >= 0, times finite: one NaN would poison the sum-tree.
    Origin numbers must index the snapshot's origin list (compacting it reads them), and
    tickets be below its ``next`` (the buffer would hand out again ids it holds)."""
    if k == "_origin" and a.size and (a.min() < 0 or a.max() >= len(meta["peers"])):
        raise ReplayError(f"{path}: column '_origin' holds origin numbers outside the "
                          f"{len(meta['peers'])} origins in meta.json")
    if k == "_leaf" and not (np.isfinite(a).all() and (a >= 0).all()):
        raise ReplayError(f"{path}: column '_leaf' holds priorities that are negative, NaN or Inf")
    if k == "_ticket" and a.size and a.max() >= int(meta["next"]):   # a snapshot written twice, before
        raise ReplayError(f"{path}: column '_ticket' holds item numbers >= {meta['next']}, the count of "
                          "items meta.json says were written: the snapshot is inconsistent")
    if k == "_time" and not np.isfinite(a).all():
        raise ReplayError(f"{path}: column '_time' holds NaN or Inf origin times")


def load(path: str | os.PathLike, clock: Callable[[], float] = time.time,
         limiter: RateLimiter | None = None) -> "ReplayBuffer":
    """Restore a buffer saved with :func:`save`: same items, priorities, ids, counters and rng.

    With decay, the time since the save (``saved_at``) is not age: the restored buffer's
    time goes on from the save's, running behind ``clock`` by the pause (see :func:`_lag`)."""
    from .replay import ReplayBuffer

    path = Path(path)
    meta = _read_meta(path, "a replay snapshot")
    if meta.get("format") != FORMAT:
        raise ReplayError(f"{path}: snapshot format {meta.get('format')!r}, expected {FORMAT}")
    _check_meta(path, meta)
    try:
        schema = {k: (d, tuple(s)) for k, (d, s) in meta["schema"].items()}
        buf = ReplayBuffer(schema, meta["capacity"], alpha=meta["alpha"], eps=meta["eps"],
                           decay=meta["decay"], sampler=meta["sampler"], stratified=meta["stratified"],
                           seed=meta["seed"], clock=clock, peer_id=meta["peer_id"],
                           limiter=limiter or RateLimiter.from_state(meta["limiter"]))
    except ReplayError as e:
        raise ReplayError(f"{path}/meta.json: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ReplayError(f"{path}/meta.json is corrupt: {type(e).__name__}: {e}") from None
    for k, col in _columns(buf).items():
        try:
            a = np.load(path / f"{k}.npy", mmap_mode="r")
        except FileNotFoundError:
            raise ReplayError(f"{path}: column {k!r} missing from the snapshot") from None
        except (OSError, ValueError, EOFError) as e:   # truncated, not .npy, unreadable
            raise ReplayError(f"{path}: column {k!r} cannot be read: {e}") from None
        if not isinstance(a, np.ndarray):   # an .npz archive under an .npy name
            raise ReplayError(f"{path}: column {k!r} is not a .npy array")
        if a.shape != col.shape or a.dtype != col.dtype:
            raise ReplayError(f"{path}: column {k!r} is {a.dtype}{a.shape}, expected {col.dtype}{col.shape}")
        _check_values(path, k, a, meta)
        if k == "_leaf":
            buf._tree.assign(np.asarray(a))
        else:
            col[...] = a
    _apply_meta(buf, meta, _lag(buf, meta))
    return buf


def _lag(buf: "ReplayBuffer", meta: dict[str, Any]) -> float:
    """How far behind ``buf.clock()`` the time of a buffer restored from ``meta`` runs (see
    ``ReplayBuffer._lag``): the seconds since the snapshot was saved, by the snapshot's own
    time, so that the pause is not counted as age. 0 without decay (age does not matter),
    for a snapshot without ``saved_at`` (older than it), and for one saved "in the
    future" (the clock was set back since): never ahead of the clock, whose times the
    buffer takes and hands out. Reads the clock: a ReplayError before anything changes."""
    if not buf.decay or "saved_at" not in meta:
        return 0.0
    return max(0.0, buf._now() + buf._lag - float(meta["saved_at"]))


def _apply_meta(buf: "ReplayBuffer", meta: dict[str, Any], lag: float) -> None:
    """Counters, origin table, rng and the time's ``lag`` from ``meta``; rebuild the id index
    from the columns.

    The columns' times, the decay base and ``saved_at`` are in the snapshot's time; with
    ``lag`` the restored buffer's time goes on from ``saved_at`` (the leaves, the columns
    and so the digest stay as saved)."""
    buf._peers = list(meta["peers"])
    buf._peer_index = {p: i for i, p in enumerate(buf._peers)}
    buf.peer_id = buf._peers[0]   # an increment's, where the buffer took its peer's id since the base
    buf._next, buf._next_seq, buf._read = int(meta["next"]), int(meta["next_seq"]), int(meta["read"])
    buf._max_p, buf._base = float(meta["max_p"]), float(meta["base"])
    buf._lag = lag
    buf._rng.bit_generator.state = meta["rng"]
    buf._foreign.clear()
    buf._foreign.add(np.flatnonzero((buf._ticket >= 0) & (buf._origin != 0)))


# ------------------------------------------------------------ incremental

class Increment:
    """What changed in a buffer since a full snapshot, copied by :func:`take_incremental`
    at one moment; :meth:`write` puts it on disk without the buffer's lock. ``digest``:
    :func:`digest` of the whole buffer at that moment, when it was asked for (else None).

    ``rows``: the columns' rows at ``slots`` (all the priority leaves), or None when
    they were written to the directory ``folder`` as they were taken (then removed
    if the increment is dropped unwritten)."""

    def __init__(self, since: int, slots: np.ndarray, rows: dict[str, np.ndarray] | None, meta: dict[str, Any],
                 digest: dict[str, str] | None = None, *, folder: Path | None = None) -> None:
        self.since, self.slots, self.rows, self.meta = since, slots, rows, meta
        self.digest = digest
        self._folder = folder
        self._unwritten = weakref.finalize(self, shutil.rmtree, folder, True) if folder is not None else None

    def write(self, path: str | os.PathLike) -> int:
        """Write the increment to the directory ``path`` (a temporary directory renamed into
        place); returns the rows written. ``path`` must be absent, empty or an earlier
        increment (never the full snapshot it needs): else :class:`ReplayError`, before
        anything is written. A write that fails (a full disk) raises
        :class:`ReplayError`, removes the temporary directory and leaves ``path`` as it was.

        An increment taken with a ``path`` has its rows on disk already, in a temporary
        directory beside that path (give the same one here): ``write`` adds the rest and
        renames that directory into place, so it writes once (a second call raises)."""
        path = Path(path)
        _check_target(path, increment=True)
        if self._folder is not None and not self._folder.is_dir():
            raise ReplayError(f"incremental snapshot to {path}: its rows, written to {self._folder} as it was "
                              "taken, are gone (it was written, or failed, already); take it again")
        tmp = self._folder or _beside(path, "tmp")
        try:
            if self._folder is None:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
                for k, v in self.rows.items():
                    _save_array(tmp / f"{k}.npy", v)
            _save_array(tmp / "_slots.npy", self.slots)
            write_synced(tmp / "meta.json", json.dumps(self.meta).encode())
            _replace(tmp, path, increment=True)
        except ReplayError:   # _replace's second look at path
            raise
        except (OSError, ValueError) as e:   # ValueError: a file name open() refuses (a NUL)
            raise ReplayError(f"incremental snapshot to {path} failed: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)   # gone once renamed; what a failed save left
            if self._unwritten is not None:
                self._unwritten.detach()
        return int(self.slots.size)


def take_incremental(buf: "ReplayBuffer", since: int, *, digest: bool = False,
                     path: str | os.PathLike | None = None) -> Increment:
    """Copy what changed in ``buf`` since a full snapshot whose ``next`` counter was ``since``.

    Only the ring writes at the head change rows, so the rows of items
    ``since .. next-1`` are copied, with all priority leaves (priority updates
    and rebases touch old rows too) and the counters: at most ``capacity`` rows
    and the leaves, as they were at one moment. They are copied as a full snapshot
    reads (chunk by chunk, copy-on-write): inserts and samples wait one chunk copy
    at most, not the copy of every row (100k rows of two 84x84x4 uint8 frames,
    ``obs`` and ``next_obs``: 5.6 GB). Taken
    with the (reentrant) lock already held, to pair it with other reads of the
    same moment, it holds the lock over the whole copy.

    With ``path``, the directory :meth:`Increment.write` will be given, the rows go to
    disk chunk by chunk as they are read, into a temporary directory beside it, as a
    full snapshot's do: the increment holds none of them in memory (without it, all
    of them: as many bytes again as the rows changed).
    With ``digest=True`` the increment's :attr:`~Increment.digest` is that of the
    whole buffer at the same moment, hashed without the lock held from the same
    chunks (the increment's rows are among them); the buffer must then have no
    snapshot in progress (a ReplayError). Without it only the increment's rows (and the leaves)
    are read; while a full snapshot is being written they are copied in one hold
    of the lock, and held in memory, the buffer's one copy-on-write reader being taken.
    Raises :class:`ReplayError` when ``since`` is not an int in ``0 .. next``, or more
    than ``capacity`` items were written since (every row changed: take a full
    snapshot instead), or (with ``path``) when ``path`` may not be replaced or the
    rows cannot be written there.
    """
    if not is_int(since):   # a bool is no count; a float would fail in slicing
        raise ReplayError(f"incremental snapshot since {since!r}: give an int, the full snapshot's "
                          "`next` counter (the buffer's total_added when it was saved)")
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise ReplayError(f"incremental snapshot path={path!r:.80}: give the directory it will be written "
                              "to (a str or os.PathLike), or None to hold its rows in memory")
        path = Path(path)
        _check_target(path, increment=True)
    cap = buf.capacity
    with buf._lock:
        nxt = buf._next
        if not 0 <= since <= nxt:
            raise ReplayError(f"incremental snapshot since item {since}: the buffer has written {nxt} items")
        if nxt - since > cap:
            raise ReplayError(f"{nxt - since} items written since the full snapshot, more than capacity "
                              f"{cap}: take a full snapshot instead")
        n, first = nxt - since, since % cap
        # the increment's slots in slot order: one run of the ring, or two where it wraps
        runs = [(first, min(cap, first + n))]
        if first + n > cap:
            runs.insert(0, (0, first + n - cap))
        slots = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])
        if buf._saver is not None and not digest:
            rows = {k: c[slots] for k, c in _columns(buf).items() if k != "_leaf"}   # fancy indexing copies
            rows["_leaf"] = np.array(buf._tree.leaves, copy=True)
            return Increment(int(since), slots, rows, {**_meta(buf), "since": int(since)})
        whole = None
        if not digest:
            whole = np.zeros(cap, dtype=bool)
            for lo, hi in runs:
                whole[lo:hi] = True
        frozen = _Frozen(buf, whole)
    folder = None
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _clear_stale(path)
            folder = Path(tempfile.mkdtemp(prefix=f"{_stem(path)}.tmp-{os.getpid()}-", dir=path.parent))
        cols = _columns(buf)
        shapes = {k: (c.dtype, (n, *c.shape[1:])) for k, c in cols.items() if k != "_leaf"}
        fields = list(shapes)
        shapes["_leaf"] = (cols["_leaf"].dtype, cols["_leaf"].shape)
        out = _Rows(shapes, folder)
        try:
            hashes = _Hashes(cols) if digest else None
            for a, part in frozen._read():   # the increment's rows, and hashing, outside the lock
                b = a + len(part["_leaf"])
                out.append("_leaf", part["_leaf"])
                if hashes is not None:
                    hashes.update(part)
                for lo, hi in runs:
                    x, y = max(a, lo), min(b, hi)
                    if x < y:
                        for k in fields:
                            out.append(k, part[k][x - a:y - a])
            out.sync()
        finally:
            out.close()
    except BaseException as e:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(e, (OSError, ValueError)) and path is not None:
            raise ReplayError(f"incremental snapshot to {path} failed: {e}") from e
        raise
    finally:
        frozen._release()
    meta = {**frozen._meta, "since": int(since)}
    return Increment(int(since), slots, None if folder is not None else out.arrays, meta,
                     hashes.result(frozen._counters) if hashes is not None else None, folder=folder)


def save_incremental(buf: "ReplayBuffer", path: str | os.PathLike, since: int) -> int:
    """Write what changed in ``buf`` since a full snapshot whose ``next`` counter was ``since``
    (:func:`take_incremental` with ``path``, then :meth:`Increment.write`: the lock is held a
    chunk copy at a time, not over the disk writes, and the rows go to disk as they are read).
    Returns the rows written; raises :class:`ReplayError`
    as those do, before anything is written when ``path`` may not be replaced (it holds
    something other than an incremental snapshot: the full one it is taken against, say)."""
    return take_incremental(buf, since, path=path).write(path)


def load_incremental(buf: "ReplayBuffer", path: str | os.PathLike) -> "ReplayBuffer":
    """Apply an incremental snapshot to ``buf``, restored from the full snapshot it was taken against.

    Raises :class:`ReplayError` (and leaves ``buf`` unchanged) when the files are
    missing or do not fit: another schema or capacity, or a base buffer whose
    ``next`` counter is not the one the increment was taken since.
    """
    path = Path(path)
    meta = _read_meta(path, "an incremental replay snapshot")
    if meta.get("format") != FORMAT or "since" not in meta:
        raise ReplayError(f"{path}: not an incremental snapshot of format {FORMAT}")
    if meta.get("schema") != buf.schema.to_dict() or meta.get("capacity") != buf.capacity:
        raise ReplayError(f"{path}: taken from a buffer of another schema or capacity")
    _check_meta(path, meta)
    lim = meta.get("limiter")   # snapshots write it; the counters go on from the increment's
    counts = (lim.get("inserted"), lim.get("sampled")) if isinstance(lim, dict) else None
    if lim is not None and not (counts and all(is_int(c) and c >= 0 for c in counts)):
        raise ReplayError(f"{path}: meta.json's limiter holds no counts of inserts and samples: {lim!r:.100}")
    if meta["since"] != buf._next:
        raise ReplayError(f"{path}: taken since item {meta['since']}, but the base buffer has written "
                          f"{buf._next} items; it belongs to another full snapshot")
    cols = _columns(buf)
    rows = {}
    for k in ["_slots", *cols]:
        try:   # mapped, not read: the rows are applied a chunk at a time, after every check
            rows[k] = np.load(path / f"{k}.npy", mmap_mode="r")
        except FileNotFoundError as e:
            raise ReplayError(f"{path}: incomplete incremental snapshot ({e.filename} missing)") from None
        except (OSError, ValueError, EOFError) as e:   # truncated, not .npy, unreadable
            raise ReplayError(f"{path}: column {k!r} cannot be read: {e}") from None
        if not isinstance(rows[k], np.ndarray):   # an .npz archive under an .npy name
            raise ReplayError(f"{path}: column {k!r} is not a .npy array")
    slots = rows.pop("_slots")
    if slots.ndim != 1 or slots.dtype.kind not in "iu":
        raise ReplayError(f"{path}: row slots are {slots.dtype}{slots.shape}, expected a 1-D integer array")
    slots = np.array(slots, dtype=np.int64)   # 8 bytes a row
    for k, c in cols.items():
        want = c.shape if k == "_leaf" else (slots.size,) + c.shape[1:]
        if rows[k].shape != want or rows[k].dtype != c.dtype:
            raise ReplayError(f"{path}: column {k!r} is {rows[k].dtype}{rows[k].shape}, expected {c.dtype}{want}")
        _check_values(path, k, rows[k], meta)
    if slots.size and (slots.min() < 0 or slots.max() >= buf.capacity):
        raise ReplayError(f"{path}: row slots outside the capacity {buf.capacity}")
    with buf._lock:
        lag = _lag(buf, meta)
        number = _renumbering(path, buf, meta["peers"], slots)
        if number is not None:
            buf._origin[...] = number[buf._origin]
        for k, c in cols.items():
            if k == "_leaf":
                buf._tree.assign(np.asarray(rows[k]))
                continue
            step = max(1, _CHUNK_BYTES // max(1, c[:1].nbytes))
            for i in range(0, slots.size, step):
                c[slots[i:i + step]] = rows[k][i:i + step]
        _apply_meta(buf, meta, lag)
        if counts is not None:   # they stood at the full snapshot's before
            buf.limiter.inserted, buf.limiter.sampled = int(counts[0]), int(counts[1])
    return buf


def _renumbering(path: Path, buf: "ReplayBuffer", peers: list[str], slots: np.ndarray) -> np.ndarray | None:
    """New origin numbers, in the increment's origin list ``peers``, of the base buffer's
    (None: they stay). Raises ReplayError before anything changes if the increment does
    not list the origin of a row it leaves in place.

    The rows an increment does not rewrite keep the base's origin numbers, but the
    buffer may have compacted its origin list since the full snapshot (dropping the
    ids no stored item referred to and renumbering the others): those rows are
    renumbered by name. Rows still stored then were stored when it compacted, so
    their origins are listed. Origin 0 is the buffer's own under any name (one made
    with the default id takes its peer's when federated).
    """
    old = buf._peers
    if peers[1:len(old)] == old[1:]:
        return None                       # the list only grew: every number stays
    index = {p: i for i, p in enumerate(peers)}
    number = np.array([0] + [index.get(p, -1) for p in old[1:]], dtype=np.int32)
    kept = np.ones(buf.capacity, dtype=bool)
    kept[slots] = False
    lost = np.unique(buf._origin[kept & (number[buf._origin] < 0)])
    if lost.size:
        raise ReplayError(f"{path}: the base buffer holds items from {[old[o] for o in lost[:5]]} that the "
                          "increment does not list; it belongs to another full snapshot")
    return number


def digest(buf: "ReplayBuffer") -> dict[str, str]:
    """A hash of every column (and the counters) of ``buf``: equal digests, equal buffers.

    Reads the whole buffer under its lock (about a millisecond per MB); a buffer in
    use is hashed without the lock held by ``save(..., digest=True)`` and
    ``take_incremental(..., digest=True)``, which give the same result.
    """
    with buf._lock:
        out = {k: hashlib.blake2b(np.ascontiguousarray(c).tobytes(), digest_size=16).hexdigest()
               for k, c in _columns(buf).items()}
        out["_counters"] = _counters(buf)
    return out


def _counters(buf: "ReplayBuffer") -> str:
    """The counters' part of :func:`digest` (lock held)."""
    return f"{buf._next}/{buf._next_seq}/{buf._read}/{buf._max_p!r}/{buf._base!r}/{buf._peers}"


def resume_sequence(buf: "ReplayBuffer", floor: int) -> None:
    """Issue local sequence numbers from at least ``floor`` on.

    After a restore from a checkpoint older than the crash, ids issued between
    the checkpoint and the crash may already live at neighbours; a resumed peer
    must not hand them out again for other items (neighbours would drop the new
    items as duplicates).
    """
    with buf._lock:
        buf._next_seq = max(buf._next_seq, int(floor))
