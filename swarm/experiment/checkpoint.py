"""Periodic full and incremental checkpoints of one peer, and restoring from them.

A peer's checkpoints live in ``peer{r}/ckpt/``::

    full-000003/               a full checkpoint
        state.pt               agent state_dict (Q and target nets, Adam moments, step
                               counters, its numpy RNG), the flat float32 parameters,
                               run counters (env steps, episodes, rounds, returns), torch RNG
        buffer/                the replay buffer (swarm.buffer.persist snapshot)
        manifest.json          what it holds, the digests of parameters and buffer, and of state.pt,
                               and whether its state is finite (no NaN or infinite values)
    full-000003-inc-0002/      an incremental checkpoint against full-000003
        state.pt               agent state without the Q-net (rebuilt from the parameters),
                               ``params_xor``: the parameters' float32 bit patterns XOR those
                               of the full checkpoint, counters, torch RNG
        buffer/                rows written since the full one, every priority leaf, counters
        manifest.json

Each incremental one is taken against the full one (not against the previous
incremental), so restoring needs the full one and the newest incremental one.
As each holds every row written since the full one, a newer one holds all that an
older one does: only the newest two are kept (the one before is the fall-back
for a damaged newest one), and the newest finite one when newer ones hold NaN.
The parameter delta is a bitwise XOR rather than a float difference because
``a + (b - a)`` is not always ``b`` in float32; the XOR restores the values bit
for bit, and its mostly-zero high bits compress well.

Loading checks the state restored against the manifest's digests (parameters,
every buffer column and the buffer's counters; an incremental one's are those
of its full one with the increment applied) and ``state.pt`` against its own
digest, so a byte changed after the commit in a file that still parses (a
``.npy`` column, a tensor) makes the checkpoint damaged, as a torn file does.
``state.pt`` is compared before it is unpickled: one replaced by another pickle
is refused without running what it holds.

Each manifest also names the run that wrote it (``run``: see :class:`Lineage`) and
the runs that one continues, so that a restarted peer resumes only from its own
run's checkpoints or those of a run it continues, whatever else a reused folder holds.

Numbers go on from the highest in the folder, of full, incremental and half-written
checkpoints alike, so a restart never writes under the name of one left there.
Everything is written into ``ckpt/.tmp-NAME`` and renamed to ``ckpt/NAME`` once
complete (the manifest is written last), so a crash never leaves half a
checkpoint under a name that :func:`latest` picks. A full checkpoint's buffer
is written on a background thread (sampling waits at most one chunk copy); it
is committed at a later step once the write is done, and only then are the
older full checkpoints and their incremental ones deleted (and what a crashed
process left half written in ``.tmp-`` folders of older numbers); when the new
one is not finite (training diverged), the newest older full one that is stays,
with its incremental ones, for a resume to fall back to. Every file is
synced to disk before the rename, so that a power cut after it cannot leave a
committed checkpoint with empty files while the older ones are already gone.

A checkpoint that cannot be written (a full disk, a ``ckpt`` folder that is read
only, gone or replaced by a file) removes its temporary folder and leaves the
committed ones as they were. :meth:`Checkpointer.step` logs it as an error (the
first, then at most one a minute with a count) and returns: training goes on, and
the next checkpoint due tries again. One that failed for lack of space first deletes
the increments older than the newest committed one, to make room for it. Such a folder
when the Checkpointer is made is logged and counted so too; one that cannot be listed
then (no read permission) gets no checkpoint until it can be, as numbered from 1
again new ones would take the names of those there.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import time
import warnings
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..buffer.persist import create_new, fsync_dir, refuse_foreign_link, write_synced
from ..errors import ConfigError, ReplayError, SwarmError

log = logging.getLogger("swarm.experiment")

__all__ = ["Checkpointer", "DivergedCheckpoint", "Lineage", "Restored", "committed", "continued_folder", "latest", "load_checkpoint",
           "load_newest", "load_policy", "newest_lineage", "nonfinite", "read_checkpoint_pt", "read_lineage",
           "state_digest", "write_json", "write_lineage", "write_whole"]

_FULL = re.compile(r"^full-(\d{6,})$")
_INC = re.compile(r"^full-(\d{6,})-inc-(\d{4,})$")   # past 9999 the names grow a digit
_TMP = re.compile(r"^\.tmp-full-(\d{6,})(-inc-\d{4,})?$")   # a checkpoint being written, or left by a crash


def array_digest(a: np.ndarray) -> str:
    """A 128-bit digest of an array's bytes: equal digests, equal arrays."""
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()


def state_digest(params: np.ndarray, buf: Any) -> dict[str, Any]:
    """Digests of the parameters and of every buffer column: equal digests, equal state."""
    from ..buffer.persist import digest  # noqa: PLC0415

    return _state_digest(params, digest(buf))


def _state_digest(params: np.ndarray, buffer_digest: dict[str, str]) -> dict[str, Any]:
    """:func:`state_digest` from the buffer's digest taken already (by a snapshot or an increment)."""
    return {"params": array_digest(params), "buffer": buffer_digest}


def _torch_rng() -> Any:
    import torch  # noqa: PLC0415

    return torch.get_rng_state()


#: after the first, a failed checkpoint is logged at most once per this many seconds, with how
#: many failed meanwhile (as the peer's other files do: :class:`swarm.experiment.runner._Recurring`)
FAILURE_LOG_S = 60.0


def _out_of_space(e: BaseException | None) -> bool:
    """Whether ``e``, or an error it was raised from, is a full disk (ENOSPC)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


class Checkpointer:
    """Takes a peer's checkpoints when they are due (call :meth:`step` after every env step).

    Args:
        root: the peer's ``ckpt`` folder.
        agent: the agent (``state_dict``, ``load_state_dict``, ``parameters()``).
        buf: its replay buffer.
        counters: returns the run counters to save (must include ``env_steps``): numbers
            (numpy scalars too), strings, and lists and dicts of them; another value fails
            the checkpoint (a ConfigError naming it).
        full_every_s, full_every_steps, incremental_every_steps: the cadence
            (see :class:`~swarm.experiment.spec.CheckpointSpec`).
        run: the run these checkpoints belong to, recorded in each manifest (None: no record).
    """

    def __init__(self, root: str | Path, agent: Any, buf: Any, counters: Callable[[], dict[str, Any]], *,
                 full_every_s: float = 0.0, full_every_steps: int = 0, incremental_every_steps: int = 0,
                 clock: Callable[[], float] = time.monotonic, run: Lineage | None = None) -> None:
        self.root = Path(root)
        self.run = run
        self.agent, self.buf, self.counters = agent, buf, counters
        self.full_every_s, self.full_every_steps = full_every_s, full_every_steps
        self.incremental_every_steps = incremental_every_steps
        self.clock = clock
        # names committed by this process, in order: the newest 64 (a run of days takes thousands)
        self.written: deque[str] = deque(maxlen=64)
        self.failures = 0                    # checkpoints that could not be written (see step)
        self.last_error: str | None = None   # why the latest of them failed
        # The highest number in the folder; None until it could be listed (see full)
        self._n: int | None = None
        self._next_log, self._unlogged = -math.inf, 0   # when a failure is logged next, and those not logged
        try:
            refuse_foreign_link(self.root)   # before anything is written or pruned in it
            self.root.mkdir(parents=True, exist_ok=True)
            self._n = self._highest()
        except (OSError, ConfigError) as e:   # a folder that is read only, or a file: as a failed checkpoint
            self.failures = 1
            self.last_error = str(e) if isinstance(e, ConfigError) else f"checkpoint folder {self.root}: {e}"
            log.error("%s; training goes on, and each checkpoint due tries again", self.last_error)
            self._next_log = clock() + FAILURE_LOG_S   # the first failure: the next ones wait, as in _failed
        self._base: tuple[str, np.ndarray, int] | None = None   # committed full: name, params, buffer next
        self._pending: tuple[str, Path, Any, np.ndarray, int, dict[str, Any]] | None = None
        self._inc = 0
        # the increments committed against the committed full one, oldest first, and whether
        # each is finite (see _prune_increments)
        self._incs: list[tuple[str, bool]] = []
        self._last_full_t = clock()
        self._last_full_step = self._last_inc_step = None

    # ------------------------------------------------------------- cadence
    def step(self, env_steps: int) -> str | None:
        """Commit a finished full checkpoint, or start the one that is due; returns a name committed.

        A checkpoint that cannot be written (a full disk, an unwritable folder) is logged
        as an error and counted in :attr:`failures`; the committed ones stay, and
        training goes on: the next one due tries again.
        """
        try:
            return self._step(env_steps)
        except (OSError, SwarmError) as e:
            self._failed(e, "training goes on")
            return None

    def _failed(self, e: BaseException, then: str) -> None:
        """Count and log checkpoint failure ``e``; ``then``: what happens next.

        Out of space, the increments older than the newest committed one go: the next
        checkpoint gets their room. The first failure is logged, then at most one per
        :data:`FAILURE_LOG_S` with how many came meanwhile (a full disk fails every one
        due, as often as every few env steps); :attr:`failures` counts each."""
        self.failures += 1
        self.last_error = str(e)
        if _out_of_space(e):
            self._prune_increments(keep=1)
        now = self.clock()
        if now < self._next_log:
            self._unlogged += 1
            return
        try:   # what a restart would load: an increment, if one is newer than the full one
            kept = committed(self.root)[:1]
        except SwarmError:
            kept = []
        more = f" ({self._unlogged} more failed since the last one logged)" if self._unlogged else ""
        log.error("checkpoint failed: %s; %s (%s)%s", e, then,
                  f"the newest checkpoint stays {kept[0].name}" if kept else "no checkpoint is committed yet", more)
        self._next_log, self._unlogged = now + FAILURE_LOG_S, 0

    def _step(self, env_steps: int) -> str | None:
        done = self._poll()
        if self._pending is not None:
            return done  # one full checkpoint at a time; no increments against an uncommitted base
        if self._last_full_step is None:
            self._last_full_step = self._last_inc_step = env_steps
        due_full = ((self.full_every_steps and env_steps - self._last_full_step >= self.full_every_steps)
                    or (self.full_every_s and self.clock() - self._last_full_t >= self.full_every_s))
        if due_full:
            self.full(background=True)
            return self._poll() or done
        if (self.incremental_every_steps and env_steps - self._last_inc_step >= self.incremental_every_steps):
            return self.incremental() or done
        return done

    # ------------------------------------------------------------- writing
    def full(self, background: bool = True) -> str | None:
        """Start a full checkpoint; with ``background=False`` wait for it and return its name.

        One still in flight is finished first; its failure is counted in :attr:`failures`
        and logged, and this one is taken all the same.
        """
        import torch  # noqa: PLC0415

        from ..buffer.persist import save  # noqa: PLC0415

        if self._pending is not None:
            # One that failed (a disk full for a while) is counted, not raised: the new one,
            # newer state, may well be written, and close() depends on it being tried.
            try:
                self._wait_pending()
            except (OSError, SwarmError) as e:
                self._failed(e, "taking a new full checkpoint")
        c = _plain_counters(self.counters())
        self._last_full_t, self._last_full_step, self._last_inc_step = self.clock(), c["env_steps"], c["env_steps"]
        if self._n is None:   # the folder could not be made or listed when this Checkpointer was
            refuse_foreign_link(self.root)
            self.root.mkdir(parents=True, exist_ok=True)
            self._n = self._highest()
        self._n += 1
        name = f"full-{self._n:06d}"
        tmp = self.root / f".tmp-{name}"
        with _removed_on_error(tmp):
            _fresh_dir(tmp)
            params = self.agent.parameters().copy()
            agent_state = self.agent.state_dict()
            state = _write_state(tmp / "state.pt", {
                "kind": "full", "agent": agent_state, "params": torch.from_numpy(params),
                "counters": c, "torch_rng": _torch_rng()})
            # The snapshot hashes the rows as it writes them (snap.digest, in _wait_pending):
            # the digest describes exactly what it writes, and the buffer's lock is held
            # one chunk copy at a time, not over the hashing of the whole buffer.
            with self.buf._lock:
                nxt = self.buf.total_added
                snap = save(self.buf, tmp / "buffer", background=True, digest=True)
        self._pending = (name, tmp, snap, params, nxt,
                         {"counters": c, "files": state, "finite": nonfinite(params, agent_state) is None})
        if not background:
            return self._wait_pending()
        return None

    def incremental(self) -> str | None:
        """Write an incremental checkpoint against the committed full one (or a full one if none)."""
        import torch  # noqa: PLC0415

        from ..buffer.persist import take_incremental  # noqa: PLC0415

        if self._pending is not None:
            self._wait_pending()
        if self._base is not None and not (self.root / self._base[0] / "manifest.json").is_file():
            log.warning("checkpoint %s is gone from %s; taking a full checkpoint, not an increment against it",
                        self._base[0], self.root)
            self._base = None
        if self._base is None or self.buf.total_added - self._base[2] > self.buf.capacity:
            return self.full(background=False)  # nothing to take a delta against, or every row changed
        base_name, base_params, since = self._base
        c = _plain_counters(self.counters())
        name = f"{base_name}-inc-{self._inc + 1:04d}"
        tmp = self.root / f".tmp-{name}"
        with _removed_on_error(tmp):
            _fresh_dir(tmp)
            # The increment's rows and the buffer's digest describe one moment: both come
            # from one chunk-by-chunk, copy-on-write reading of the buffer as it was then, as
            # a full snapshot reads it, hashed and written to disk outside the lock (inserts
            # and samples wait one chunk copy at most, neither for the hashing nor for the
            # disk), a chunk at a time: the increment is never held whole in memory (as
            # many bytes again as the rows changed; a buffer of image frames, gigabytes).
            try:
                inc = take_incremental(self.buf, since, digest=True, path=tmp / "buffer")
            except ReplayError:
                if self.buf.total_added - since <= self.buf.capacity:
                    raise
                # a neighbour's items (inserted on the peer's thread) came after the check
                # above: every row may have changed since the full one
                shutil.rmtree(tmp, ignore_errors=True)
                return self.full(background=False)
            self._last_inc_step = c["env_steps"]
            self._inc += 1
            params = self.agent.parameters().copy()
            state = self.agent.state_dict()
            state.pop("q")  # the Q-net's weights are the parameter vector, saved as a delta below
            xor = np.bitwise_xor(params.view(np.uint32), base_params.view(np.uint32))
            files = _write_state(tmp / "state.pt", {
                "kind": "incremental", "base": base_name, "agent": state,
                "params_xor": torch.from_numpy(xor.view(np.int32)), "counters": c, "torch_rng": _torch_rng()})
            dig = _state_digest(params, inc.digest)
            rows = inc.write(tmp / "buffer")
            finite = nonfinite(params, state) is None
            self._commit(name, tmp, {"counters": c, "digest": dig, "base": base_name, "rows": rows, "files": files,
                                     "finite": finite})
        self._incs.append((name, finite))
        self._prune_increments(keep=2)
        return name

    def close(self) -> str | None:
        """Finish a full checkpoint in flight, then write a final full one (synchronously).

        The one in flight failing is counted in :attr:`failures` and logged; the final one
        is written all the same (its own failure raises).
        """
        return self.full(background=False)   # which finishes the one in flight first

    # ------------------------------------------------------------- plumbing
    def _poll(self) -> str | None:
        if self._pending is not None and self._pending[2].done:
            return self._wait_pending()
        return None

    def _wait_pending(self) -> str:
        name, tmp, snap, params, nxt, info = self._pending
        self._pending = None
        with _removed_on_error(tmp):
            snap.wait()
            self._commit(name, tmp, {**info, "digest": _state_digest(params, snap.digest), "base": None})
        self._base = (name, params, nxt)
        self._inc, self._incs = 0, []
        # Only now is the new full one safe: drop the older ones and their increments,
        # and what a crash left half written. One holding NaN or infinite values (training
        # diverged) keeps the newest older full one that does not, and its increments: the
        # checkpoint that a resume falls back to (load_newest). Increments named after this
        # full one are not its own (none is written before it is committed): left from
        # before, they would sort newest.
        keep = None if info["finite"] else self._newest_finite_full()
        for p in self.root.iterdir():
            m = _FULL.match(p.name) or _INC.match(p.name) or _TMP.match(p.name)
            if not m:
                continue
            n = int(m.group(1))
            if (n < self._n and (m.re is _TMP or n != keep)) or (n == self._n and m.re is _INC):
                shutil.rmtree(p, ignore_errors=True)
        return name

    def _prune_increments(self, keep: int) -> None:
        """Delete the increments of the committed full checkpoint but the newest ``keep`` and
        the newest finite one. Each holds every row written since the full one, so a newer
        one holds all that an older one does: kept, they would use the disk quadratically
        in the number of increments. The one before the newest is the fall-back for a
        damaged newest one (:func:`load_newest`), the finite one for a newest one holding
        NaN (training diverged)."""
        finite = [n for n, ok in self._incs if ok][-1:]
        drop = [n for n, _ in self._incs[:-keep] if n not in finite]
        self._incs = [(n, ok) for n, ok in self._incs if n not in drop]
        for n in drop:
            shutil.rmtree(self.root / n, ignore_errors=True)

    def _highest(self) -> int:
        """The highest number of a checkpoint in the folder; a ConfigError naming the folder
        if it cannot be listed: from 0, new checkpoints would take the names of those there,
        and the older ones sort newest."""
        try:
            names = [p.name for p in self.root.iterdir()]
        except OSError as e:
            raise ConfigError(f"checkpoint folder {self.root} cannot be listed ({e.strerror or e}); no checkpoint "
                              "is written until it can be, as the numbers of those there are unknown: give this "
                              "process read access to it") from None
        # Numbers go on across restarts, from the increments and the half-written ones
        # too: a new full-N beside a full-N-inc-* left without its full-N could not
        # commit its increments, and the stale ones sorted newest.
        found = [m for m in (_FULL.match(n) or _INC.match(n) or _TMP.match(n) for n in names) if m]
        return max((int(m.group(1)) for m in found), default=0)

    def _newest_finite_full(self) -> int | None:
        """The number of the newest full checkpoint older than the one just committed whose
        manifest does not say it holds NaN or infinite values (one from before the manifests
        said, too), or None; logs what the pruning keeps."""
        for p in committed(self.root):
            m = _FULL.match(p.name)
            if not m or int(m.group(1)) >= self._n:
                continue
            try:
                finite = json.loads((p / "manifest.json").read_text()).get("finite", True)
            except (OSError, ValueError, AttributeError):
                continue   # damaged: nothing a resume could load
            if finite is not False:
                log.warning("checkpoint full-%06d holds NaN or infinite values (training diverged?); keeping %s, "
                            "the newest full checkpoint that does not, for a resume", self._n, p.name)
                return int(m.group(1))
        log.warning("checkpoint full-%06d holds NaN or infinite values (training diverged?), and no older full "
                    "checkpoint is finite", self._n)
        return None

    def _commit(self, name: str, tmp: Path, info: dict[str, Any]) -> None:
        # info["files"]: state.pt's own digest, which covers what the state digest does not:
        # nets, optimizer, RNGs
        manifest = {"name": name, "kind": "incremental" if info.get("base") else "full",
                    "written_at": time.time(), **(self.run.record() if self.run is not None else {}), **info}
        write_synced(tmp / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
        fsync_dir(tmp)
        os.replace(tmp, self.root / name)
        fsync_dir(self.root)
        self.written.append(name)
        log.info("checkpoint %s at %s env steps", name, info["counters"].get("env_steps"))


def _plain_counters(counters: dict[str, Any]) -> dict[str, Any]:
    """``counters`` with numpy scalars as Python numbers, as the manifest (JSON) holds
    them; ConfigError naming a counter that JSON cannot hold."""
    def plain(x: Any) -> Any:
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, list):
            return [plain(v) for v in x]
        if isinstance(x, tuple):
            return tuple(plain(v) for v in x)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    out = {}
    for k, v in counters.items():
        out[k] = plain(v)
        try:
            json.dumps(out[k])
        except (TypeError, ValueError) as e:
            raise ConfigError(f"checkpoint counter {k!r} = {v!r:.80} cannot be saved in the manifest ({e}): "
                              "counters must be numbers, strings, or lists and dicts of them") from None
    return out


def _bytes_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    """Remove the checkpoint folder being written, ``tmp``, when the block fails: a
    checkpoint that cannot be written leaves no half of it using the disk."""
    try:
        yield
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _write_state(path: Path, state: dict[str, Any]) -> dict[str, str]:
    """``torch.save`` ``state`` to ``path``; returns the manifest's ``files`` entry (its digest)."""
    import torch  # noqa: PLC0415

    out = io.BytesIO()
    torch.save(state, out)
    write_synced(path, out.getvalue())
    return {"state.pt": _bytes_digest(out.getvalue())}


# ------------------------------------------------------------- restoring

def committed(root: str | Path) -> list[Path]:
    """The committed checkpoints under ``root`` (a ``ckpt`` folder), newest first.

    A ``root`` that is there but cannot be listed (no read permission) is a ConfigError
    naming it: its checkpoints are not taken for none.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    try:
        names = list(root.iterdir())
    except OSError as e:
        raise ConfigError(f"checkpoint folder {root} cannot be listed ({e.strerror or e}); "
                          "give this process read access to it") from None
    found = []
    for p in names:
        m = _FULL.match(p.name) or _INC.match(p.name)
        if m and (p / "manifest.json").is_file():
            found.append(((int(m.group(1)), int(m.group(2)) if m.re is _INC else 0), p))
    return [p for _, p in sorted(found, reverse=True)]


def latest(root: str | Path) -> Path | None:
    """The newest committed checkpoint under ``root`` (a ``ckpt`` folder), or None."""
    return next(iter(committed(root)), None)


class DivergedCheckpoint(ConfigError):
    """The newest whole checkpoint in a folder holds NaN or infinite values and none older
    there loads (:func:`load_newest`); ``skipped`` says why each one was passed over."""

    def __init__(self, message: str, skipped: list[str]) -> None:
        super().__init__(message)
        self.skipped = skipped


#: How many times :func:`load_newest` lists a folder again that changed while it read a
#: checkpoint that failed: a live peer's commits come seconds apart, so a few suffice.
_RELISTS = 10


def load_newest(root: str | Path, run: str | None = None) -> tuple[Restored | None, list[str]]:
    """The newest checkpoint under ``root`` that can be read, and why each newer one could not.

    A checkpoint damaged after its commit (a torn ``state.pt``, a truncated buffer
    column, a lost full base, a changed byte that its digests catch) is skipped with
    a warning and the next older one is tried: an incremental one's earlier siblings,
    then its full one, then any older full one still kept. The damaged ones stay where they are, for inspection.
    With ``run`` (a run id), one that another run wrote is skipped too (see :class:`Lineage`).
    None when no checkpoint loads (or there is none).

    One written whole but holding NaN or infinite values (training had diverged) is
    skipped the same way, and stays too. When no older one loads, that is a
    :class:`DivergedCheckpoint` (a ConfigError) naming the newest such checkpoint, as
    :meth:`Restored.apply` would raise: every start would meet it again, and starting
    over from step 0 would hide it (a caller with older places to look catches it).

    The folder may belong to a peer still running, which commits new checkpoints and
    deletes older ones as it goes: when one fails to load and the folder has changed
    meanwhile, it is listed again (a few times at most) and the newest one there
    now is tried, so that one deleted while it was read is not taken for damaged.
    """
    skipped: list[str] = []
    diverged: ConfigError | None = None   # the newest one skipped for NaN or infinite values
    passed: set[Path] = set()             # those in skipped
    listed, relists = committed(root), 0
    while (path := next((p for p in listed if p not in passed), None)) is not None:
        try:
            if run is not None:
                _check_run(path, run)
            r = load_checkpoint(path)
        except ConfigError as e:
            now = committed(root)
            if now != listed and relists < _RELISTS:
                # A live peer committed or pruned checkpoints meanwhile (a resume or an eval
                # of a run still going): files gone from under the read are no damage, and
                # those listed before may all be gone. From the newest there now.
                listed, relists = now, relists + 1
                continue
            why = e
        else:
            bad = nonfinite(r.params, r.agent_state)
            if bad is None:
                if diverged is not None:
                    log.warning("%s; resuming from the older checkpoint %s instead (the newer ones stay "
                                "in place)", diverged, path)
                return r, skipped
            why = ConfigError(f"checkpoint {path}: {bad}")
            diverged = diverged or why
        log.warning("%s; trying the next older checkpoint", why)
        skipped.append(str(why))
        passed.add(path)
    if diverged is not None:
        raise DivergedCheckpoint(str(diverged), skipped)
    return None, skipped


def nonfinite(params: Any, agent_state: Any, what: str = "its agent state") -> str | None:
    """What of a saved state holds NaN or infinite values, or None: ``params`` (the flat
    parameters, an array or a tensor; None when not saved) or a float tensor of
    ``agent_state`` (target net, optimizer moments), which the answer calls ``what``.
    Checked without an agent, so that a resume can pass over such a checkpoint for an
    older one (:func:`load_newest`) and the Checkpointer can keep an older one."""
    import torch  # noqa: PLC0415

    if isinstance(params, torch.Tensor):
        params = params.numpy()
    if isinstance(params, np.ndarray) and params.dtype.kind == "f":
        n = int(np.count_nonzero(~np.isfinite(params)))
        if n:
            return f"its parameters have {n} NaN or infinite entries"
    todo: list[tuple[str, Any]] = [("", agent_state)]
    while todo:
        name, x = todo.pop()
        if isinstance(x, dict):
            todo += [(f"{name}.{k}" if name else str(k), v) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            todo += [(f"{name}.{i}", v) for i, v in enumerate(x)]
        elif isinstance(x, torch.Tensor) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            return f"{what} {name} has NaN or infinite entries"
        elif isinstance(x, np.ndarray) and x.dtype.kind == "f" and not np.isfinite(x).all():
            return f"{what} {name} has NaN or infinite entries"
    return None


def _check_run(path: Path, run: str) -> None:
    """ConfigError unless the checkpoint ``path`` was written by the run ``run``."""
    try:
        theirs = json.loads((path / "manifest.json").read_text()).get("run")
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"checkpoint {path} cannot be read (damaged?): manifest.json: {e}") from None
    if theirs != run:
        raise ConfigError(f"checkpoint {path} belongs to another run ({theirs or 'one from before run ids'}), "
                          f"not to run {run}")


@dataclass
class Restored:
    """A checkpoint read back: apply it to a fresh agent built over ``buffer``."""

    path: Path
    manifest: dict[str, Any]
    buffer: Any
    params: np.ndarray
    agent_state: dict[str, Any]
    counters: dict[str, Any]
    torch_rng: Any

    def apply(self, agent: Any) -> None:
        """Load parameters, nets, optimizer, step counters and RNGs into ``agent`` (built over ``buffer``).

        A state that does not fit the agent (parameters of another number or dtype), or
        holds NaN, is a ConfigError naming the checkpoint (every start that loads it
        would fail the same way), and ``agent`` is left as it was.
        """
        import torch  # noqa: PLC0415

        x = agent.parameters()
        if x.shape != self.params.shape:
            raise ConfigError(f"checkpoint {self.path}: {self.params.size} parameters, the agent has {x.size}")
        if x.dtype != self.params.dtype:   # a cast would change them (float64 1e300 is inf in float32)
            raise ConfigError(f"checkpoint {self.path}: its parameters are {self.params.dtype}, the agent's {x.dtype}")
        if not np.isfinite(self.params).all():
            raise ConfigError(f"checkpoint {self.path}: its parameters have "
                              f"{np.count_nonzero(~np.isfinite(self.params))} NaN or infinite entries")
        # The RNG first: one torch refuses then leaves the agent as it was (set last, it
        # failed with the agent already loaded).
        rng_was = torch.get_rng_state()
        if self.torch_rng is not None:
            try:
                torch.set_rng_state(self.torch_rng)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ConfigError(f"checkpoint {self.path}: its torch RNG state cannot be restored: {e}") from None
        state = dict(self.agent_state)
        was = x.copy()
        try:
            if "q" not in state:
                np.copyto(x, self.params)
                state["q"] = agent.q.state_dict()   # the Q-net lives in x: copy it onto itself
            agent.load_state_dict(state)
        except SwarmError as e:
            np.copyto(x, was)
            torch.set_rng_state(rng_was)
            raise ConfigError(f"checkpoint {self.path}: {e}") from None
        np.copyto(x, self.params)
        agent.on_parameters_changed()


def load_checkpoint(path: str | Path) -> Restored:
    """Read a checkpoint folder (full, or incremental with its full one beside it).

    Raises ConfigError naming the checkpoint when a file is missing, torn or foreign
    (parameters that are not a float32 vector, say), or when what it restores does not
    match the digests in its ``manifest.json``.
    """
    from ..buffer import ReplayBuffer  # noqa: PLC0415
    from ..buffer.persist import load_incremental  # noqa: PLC0415

    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        files = manifest.get("files") or {}
        want = files.get("state.pt")   # manifests from before this digest have none
    except Exception as e:   # torn, empty, not JSON, not an object
        why = _unreadable(path / "manifest.json", e)
        raise ConfigError(f"checkpoint {path} cannot be read (damaged?): manifest.json: {why}") from None
    try:
        st = _load_state_pt((path / "state.pt").read_bytes(), want)
    except _NotItsDigest:
        raise ConfigError(f"checkpoint {path} is damaged: state.pt does not match the digest in its manifest.json") \
            from None
    except Exception as e:   # a torn or foreign file: RuntimeError, EOFError, UnpicklingError ...
        why = _unreadable(path / "state.pt", e)
        raise ConfigError(f"checkpoint {path} cannot be read (damaged?): state.pt: {why}") from None
    try:
        if not isinstance(st, dict):   # indexed, a tensor warns, and may mean something else to a later torch
            raise TypeError(f"state.pt holds a {type(st).__name__}, not a dict")
        if st["kind"] == "full":
            buf = ReplayBuffer.load(path / "buffer")
            params = _vector(st, "params", np.float32).copy()
        else:
            base = path.parent / st["base"]
            try:
                base_want = (json.loads((base / "manifest.json").read_text()).get("files") or {}).get("state.pt")
                full = _load_state_pt((base / "state.pt").read_bytes(), base_want)
            except _NotItsDigest:
                raise ConfigError(f"checkpoint {path}: its full checkpoint {base} is damaged: state.pt does "
                                  "not match the digest in its manifest.json") from None
            except Exception as e:
                raise ConfigError(f"checkpoint {path}: its full checkpoint {base} cannot be read (damaged?): "
                                  f"{_unreadable(base / 'state.pt', e)}") from None
            if not isinstance(full, dict):
                raise TypeError(f"its full checkpoint's state.pt holds a {type(full).__name__}, not a dict")
            buf = load_incremental(ReplayBuffer.load(base / "buffer"), path / "buffer")
            bits = np.bitwise_xor(_vector(full, "params", np.float32).view(np.uint32),
                                  _vector(st, "params_xor", np.int32).view(np.uint32))
            params = bits.view(np.float32).copy()
        agent, counters = st["agent"], dict(st["counters"])
    except ReplayError as e:
        raise ConfigError(f"checkpoint {path}: replay buffer: {e}") from None
    except ConfigError:   # its full one's, above, names the checkpoint already (a ValueError too)
        raise
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        # ValueError, IndexError: a full checkpoint's state.pt of other parameters than its
        # increment's (a foreign or damaged one that still loads), which load_newest skips
        raise ConfigError(f"checkpoint {path}: not a peer's checkpoint ({type(e).__name__}: {e})") from None
    _check_digest(path, manifest, params, buf)
    return Restored(path, manifest, buf, params, agent, counters, st.get("torch_rng"))


class _NotItsDigest(Exception):
    """A state.pt whose bytes are not those its manifest's digest describes."""


class _Unloadable(RuntimeError):
    """Why torch's restricted unpickler refused a state.pt (torn, or holding more than
    tensors and plain values, whatever its digest says), in one line."""


def _load_state_pt(data: bytes, want: str | None) -> Any:
    """A state.pt's bytes unpickled once they match ``want``, the digest in its manifest
    (None: a manifest from before it); _NotItsDigest when they do not.

    Read by torch's restricted unpickler, which runs nothing (the file holds tensors and
    plain values only): the digest is no guard against a file made to match it, and a
    run folder copied from elsewhere and resumed ran whatever its state.pt held. A torn or
    foreign file's error goes up as ``_Unloadable``, in one line (torch's own text ran to
    ~750 characters advising ``weights_only=False``, and a foreign pickle's warnings went
    to stderr).
    """
    import torch  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:
            raise _Unloadable(_refused(e)) from None
    if want is not None and want != _bytes_digest(data):
        raise _NotItsDigest
    return state


def _refused(e: Exception) -> str:
    """Why torch's restricted unpickler refused a file, in one line: torch's text wraps the
    unpickler's own in ~750 characters of advice to load with ``weights_only=False``."""
    found = (re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
             or re.search(r"^(Trying to load .+)$", str(e), re.M))   # a global it refused
    line = found.group(1) if found else (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def _vector(st: dict[str, Any], key: str, dtype: Any) -> np.ndarray:
    """``st[key]``, a tensor, as a 1-D array of ``dtype``; TypeError if it is not one: cast
    from another dtype, the values would change (a float64 1e300 is inf in float32)."""
    a = st[key].numpy()
    if a.dtype != dtype or a.ndim != 1:
        raise TypeError(f"{key} is {a.dtype} of shape {a.shape}, not a 1-D {np.dtype(dtype)} array")
    return a


def _check_digest(path: Path, manifest: dict[str, Any], params: np.ndarray, buf: Any) -> None:
    """Raise ConfigError unless ``params`` and ``buf`` are the state whose digests the
    manifest holds (taken from the live state when the checkpoint was written)."""
    want = manifest.get("digest")
    if not (isinstance(want, dict) and isinstance(want.get("buffer"), dict)):
        raise ConfigError(f"checkpoint {path}: not a peer's checkpoint (its manifest.json holds no digests)")
    got = state_digest(params, buf)
    differ = ["the parameters"] if got["params"] != want.get("params") else []
    for k in sorted(got["buffer"].keys() | want["buffer"].keys()):
        if got["buffer"].get(k) != want["buffer"].get(k):
            differ.append("the buffer's counters" if k == "_counters" else f"buffer column {k!r}")
    if differ:
        base = manifest.get("base")
        how = f" (restored from {base} with this increment applied)" if base else ""
        raise ConfigError(f"checkpoint {path} is damaged: the digests in its manifest.json do not match "
                          f"{', '.join(differ)}{how}")


def continued_folder(peer_folder: str | Path) -> Path | None:
    """The peer folder of the old run that ``peer_folder`` continues (``swarm run --resume``,
    ``swarm peer --resume OLD``), as its ``resumed.json`` records it: the resume that started
    this run there wrote it and every restart into the folder keeps it. None when it
    continues no other run, or the record cannot be read (logged).

    A record that an older swarm wrote, before ``continues``, names only the
    ``checkpoint`` it resumed from: the old run's peer folder is the one that holds it
    (see :func:`_checkpoint_folder`)."""
    path = Path(peer_folder) / "resumed.json"
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        log.warning("%s cannot be read (%s); the run it continues is not known", path, e)
        return None
    if not isinstance(rec, dict):
        return None
    if "continues" not in rec:   # null says it continues none; absent, the record predates the key
        return _checkpoint_folder(rec.get("checkpoint"), Path(peer_folder))
    old = rec["continues"]
    return Path(old) if isinstance(old, str) and old else None


def _checkpoint_folder(checkpoint: Any, peer_folder: Path) -> Path | None:
    """The peer folder that holds ``checkpoint`` (``.../peer0/ckpt/full-000002`` or
    ``.../peer0/checkpoint.pt``), as an old ``resumed.json`` records it, resolved; None
    when there is none, or it is ``peer_folder`` itself (a restart of that run there).

    The old code wrote the path as its launcher was given it, often relative to the
    folder ``swarm run`` ran in, and opened it from there: it is taken from this
    process's working folder, as the old code took it, else from the nearest folder
    above ``peer_folder`` under which it exists (``swarm run`` was run in the folder
    that holds ``runs/``, so that is where a relative ``runs/...`` starts)."""
    if not isinstance(checkpoint, str) or not checkpoint:
        return None
    ck = Path(checkpoint)
    folder = ck.parent.parent if ck.parent.name == "ckpt" else ck.parent
    if not folder.name:   # a bare file name: no folder recorded
        return None
    if not folder.is_absolute() and not folder.is_dir():
        here = Path(peer_folder).resolve()
        folder = next((a / folder for a in here.parents if (a / folder).is_dir()), folder)
    folder = folder.resolve()
    return None if folder == Path(peer_folder).resolve() else folder


#: how many runs back a restart looks for a checkpoint that loads (the chain of resumes)
MAX_LINEAGE = 16


@dataclass(frozen=True)
class Lineage:
    """The run a peer folder holds (``run.json`` in it), and the runs it continues.

    A run starts in a folder with a fresh start or with a resume from another run's
    folder; it draws a random ``id`` then, and every restart into the folder keeps
    it. Every checkpoint (``manifest.json``), ``checkpoint.pt`` and ``best.pt`` it
    writes records the id, so a restart can tell its own files from those another
    run left in a reused folder. ``continues`` is the chain of runs it was resumed
    from, newest first: ``(peer folder, run id)`` of the run whose checkpoint it
    started from, then the one that run continued, and so on (at most
    :data:`MAX_LINEAGE`). A run id of None stands for a run from before run ids,
    known only by its folder: any checkpoint there counts as its own.

    Example::

        lin = Lineage.new((("/runs/old/peer0", "9f3a..."),))
        write_lineage(folder, lin)
        assert read_lineage(folder) == lin
    """

    id: str | None
    continues: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def new(cls, continues: tuple[tuple[str, str | None], ...] = ()) -> Lineage:
        """A new run (a fresh id) that continues ``continues``."""
        return cls(secrets.token_hex(8), continues[:MAX_LINEAGE])

    def record(self) -> dict[str, Any]:
        """What manifests, ``checkpoint.pt`` and ``run.json`` hold: plain JSON types."""
        return {"run": self.id, "continues": [list(c) for c in self.continues]}

    @classmethod
    def of(cls, record: Any, folder: str | Path) -> Lineage:
        """The run that wrote ``record`` (a manifest, a ``checkpoint.pt``'s dict, a ``run.json``)
        in the peer folder ``folder``. One from before run ids has none: its run is known by
        its folder only, and what it continued by the folder's ``resumed.json``."""
        if not isinstance(record, dict) or "run" not in record:
            old = continued_folder(folder)
            return cls(None, ((str(old), None),) if old is not None else ())
        rid = record.get("run")
        chain = record.get("continues") or []
        try:
            pairs = [(f, r if isinstance(r, str) else None) for f, r in chain]
        except (TypeError, ValueError):   # hand-edited or foreign: not a chain of pairs
            log.warning("%s: the runs it continues cannot be read (%r); following none", folder, chain)
            pairs = []
        # a folder no path can be (a NUL in it) failed every restart, in sources()
        bad = [f for f, _ in pairs if not (isinstance(f, str) and f and "\0" not in f)]
        if bad:
            log.warning("%s: the runs it continues in %r cannot be read; following the others", folder, bad)
        continues = tuple((f, r) for f, r in pairs if f not in bad)
        return cls(rid if isinstance(rid, str) and rid else None, continues[:MAX_LINEAGE])

    def sources(self, folder: str | Path) -> list[tuple[Path, str | None]]:
        """Where a restart of this run into ``folder`` may resume from, in order: its own
        checkpoints there, then each run it continues in its folder. Each (folder, run)
        once, so a chain that comes round again ends."""
        out: list[tuple[Path, str | None]] = []
        seen: set[tuple[Path, str | None]] = set()
        for f, r in ((str(folder), self.id), *self.continues):
            if (Path(f).resolve(), r) not in seen:
                seen.add((Path(f).resolve(), r))
                out.append((Path(f), r))
        return out[:MAX_LINEAGE + 1]


def read_lineage(peer_folder: str | Path) -> Lineage:
    """The run that ``peer_folder`` holds, from its ``run.json``. A folder without one (written
    before run ids, or never used) holds a run of no id: it continues what its ``resumed.json``
    names, if anything. A ``run.json`` that cannot be read is logged and read the same way."""
    path = Path(peer_folder) / "run.json"
    rec = None
    if path.is_file():
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            log.warning("%s cannot be read (%s); this folder's run is not known", path, e)
    return Lineage.of(rec, peer_folder)


def write_whole(path: Path, write: Callable[[Path], Any]) -> None:
    """``write`` a temporary file, then rename it over ``path`` and sync the folder: a
    process killed meanwhile, or a write that fails (a full disk), leaves the previous
    file whole, not a torn one. ``write`` syncs what it writes (a crash after the
    rename must not leave an empty file).

    The temporary file, ``.NAME.tmp`` beside ``path``, is made anew (:func:`create_new`):
    what a killed write left there goes, and a link planted there is neither written
    through (its target overwritten) nor renamed over ``path``. An OSError names ``path``,
    not the temporary file (a full disk's write named no file at all)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        create_new(tmp)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        if e.errno is None or (e.filename is not None and os.fspath(e.filename) != str(tmp)):
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        with suppress(OSError):   # a folder there: the error above says so
            tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def json_bytes(obj: Any, indent: int | None) -> bytes:
    """``obj`` as the JSON file :func:`write_json` writes."""
    return (json.dumps(obj, indent=indent) + "\n").encode()


def write_json(path: Path, obj: Any, indent: int | None) -> None:
    """Write ``obj`` as JSON to ``path``, synced and replaced whole (:func:`write_whole`)."""
    write_whole(path, lambda tmp: write_synced(tmp, json_bytes(obj, indent)))


def write_lineage(peer_folder: str | Path, lineage: Lineage) -> None:
    """Record in ``peer_folder/run.json`` that it holds ``lineage``'s run (replaced whole)."""
    write_json(Path(peer_folder) / "run.json", lineage.record(), indent=1)


def newest_lineage(peer_folder: str | Path) -> Lineage | None:
    """The run that wrote the newest checkpoint in ``peer_folder`` (``ckpt/``, else
    ``checkpoint.pt``), read without loading it; None when there is none that reads."""
    folder = Path(peer_folder)
    for p in committed(folder / "ckpt"):
        try:
            return Lineage.of(json.loads((p / "manifest.json").read_text()), folder)
        except (OSError, ValueError):
            continue   # damaged: load_newest says so when it comes to it
    if (folder / "checkpoint.pt").is_file():
        try:
            return Lineage.of(read_checkpoint_pt(folder / "checkpoint.pt"), folder)
        except ConfigError:
            return None
    return None


def read_checkpoint_pt(path: str | Path) -> dict[str, Any]:
    """A peer's ``checkpoint.pt`` as saved (agent state, env steps; no buffer), or
    ConfigError saying why it cannot be read (torn, empty, foreign).

    Read by torch's restricted unpickler (``weights_only``), as :func:`load_policy` reads
    it: the file has tensors and plain containers only (its RNG state is a dict of ints),
    and unlike ``state.pt`` it has no digest to check before the full unpickler gets it. A
    run folder copied from elsewhere and resumed ran whatever its checkpoint.pt held."""
    import torch  # noqa: PLC0415

    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a foreign pickle's warnings went to stderr
            ck = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:   # what the restricted unpickler refuses (loaded, it could run code)
        raise ConfigError(f"{path} cannot be read: not a peer's checkpoint.pt, which holds tensors and plain "
                          f"values only ({_refused(e)}); it is not loaded") from None
    except Exception as e:   # a torn or foreign file: RuntimeError, EOFError ...
        raise ConfigError(f"{path} cannot be read (damaged?): {_unreadable(path, e)}") from None
    if not isinstance(ck, dict) or not isinstance(ck.get("agent"), dict):
        raise ConfigError(f"{path} cannot be read (damaged?): not a peer's checkpoint.pt (no agent state in it)")
    return ck


def load_policy(path: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """The DQN agent saved in a peer's ``checkpoint.pt`` or ``best.pt``, ready to act
    greedily (``agent.act``), with the run's spec and the file's other entries
    (``rank``, ``env_steps``, ``eval_return`` for ``best.pt``).

    Greedy play needs the env, the network (the spec's ``env`` and ``dqn`` sections) and
    the Q-network's weights (the agent's ``q``), and only those are checked and loaded:
    a file written by an older swarm plays although its optimizer state is of another
    format, or its spec holds a value that is refused now in a section play does not use
    (``seed``, ``gossip.round_timeout_s``). The spec returned is then the file's ``env``
    and ``dqn`` with the rest at their defaults, and the entries say why the whole spec
    did not load (``spec_error``).

    Raises ConfigError for a file that is not a peer's checkpoint, a spec whose ``env`` or
    ``dqn`` section is refused, or a Q-network state that does not fit that network or
    holds NaN or infinite values."""
    import torch  # noqa: PLC0415

    from ..buffer import ReplayBuffer  # noqa: PLC0415
    from ..rl import DQNAgent, dqn_schema  # noqa: PLC0415
    from ..rl.train import make_env  # noqa: PLC0415

    path = Path(path)
    try:
        # weights_only: tensors and plain containers only, so a file from elsewhere runs no code
        ck = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"{path}: not a checkpoint (a torch file of tensors and plain values)") from None
    except Exception as e:   # on bytes that are no torch file the unpickler raises KeyError and the like
        raise ConfigError(f"{path}: cannot be read as a checkpoint: {_unreadable(path, e)}") from None
    lacks = _not_a_policy(ck)
    if lacks:
        raise ConfigError(f"{path}: not a peer's checkpoint.pt or best.pt ({lacks})")
    try:
        spec, spec_error = _play_spec(ck["spec"])
    except ConfigError as e:
        raise ConfigError(f"{path}: its spec: {e}") from None
    env = make_env(spec.env)
    try:   # acting needs no replay: a buffer of one
        agent = DQNAgent.for_env(env, ReplayBuffer(dqn_schema(env.observation_space.shape), 1), spec.dqn)
    finally:
        env.close()
    if "q" not in ck["agent"]:
        raise ConfigError(f"{path}: its agent holds no Q-network (no 'q' in it: "
                          f"{', '.join(sorted(map(str, ck['agent'])))})")
    q = ck["agent"]["q"]
    try:   # the Q-network only: the target net, optimizer, counters and RNG are the agent's own, as built
        agent.load_state_dict({**agent.state_dict(), "q": q, "target": q})
    except SwarmError as e:
        raise ConfigError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"{path}: its agent is not a DQN agent's state ({type(e).__name__}: {e})") from None
    meta = {k: v for k, v in ck.items() if k not in ("agent", "spec", "params")}
    if spec_error is not None:
        meta["spec_error"] = spec_error
    return agent, spec, meta


def _play_spec(data: dict[str, Any]) -> tuple[Any, str | None]:
    """The :class:`Spec` recorded in a ``checkpoint.pt`` or ``best.pt``, and None; or, when
    the whole no longer loads, one of its ``env`` and ``dqn`` sections alone (checked, the
    rest at the defaults) and why the whole did not. ConfigError when those two are refused."""
    from ..config import from_dict, to_dict  # noqa: PLC0415
    from ..rl.hparams import DQNConfig  # noqa: PLC0415
    from .spec import ALGORITHMS, Spec, _check_env, swarm_dqn  # noqa: PLC0415

    try:
        return from_dict(Spec, data), None
    except ConfigError as e:
        why = str(e)
    env = data.get("env", Spec().env)
    if not isinstance(env, str):
        raise ConfigError(f"env = {env!r}: expected a Gymnasium environment id")
    algorithm = data.get("algorithm", "dqn")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm = {algorithm!r}: unknown; choose one of {', '.join(ALGORITHMS)}")
    _check_env(env)
    dqn = data.get("dqn", {})
    if not isinstance(dqn, dict):
        raise ConfigError(f"dqn: expected a table, got {dqn!r}")
    cfg = from_dict(DQNConfig, {**to_dict(swarm_dqn()), **dqn}, "dqn")   # as Spec's own dqn section merges
    cfg.check("dqn.")
    return Spec(env=env, algorithm=algorithm, dqn=cfg), why


def _unreadable(path: Path, e: Exception) -> str:
    """Why torch.load failed, never an empty string (EOFError on an empty file says nothing)."""
    if path.is_file() and path.stat().st_size == 0:
        return "empty file"
    if isinstance(e, (OSError, RuntimeError, ValueError, EOFError)) and str(e):
        return str(e)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _not_a_policy(ck: Any) -> str | None:
    """What a loaded file lacks of a peer's checkpoint.pt or best.pt, or None: checked
    before any of it is used, as the file may come from anywhere."""
    if not isinstance(ck, dict) or not {"agent", "spec"} <= set(ck):
        return "no agent and spec in it"
    if not isinstance(ck["agent"], dict):
        return f"its agent is of type {type(ck['agent']).__name__}, not the agent's state_dict"
    if not isinstance(ck["spec"], dict):
        return f"its spec is of type {type(ck['spec']).__name__}, not a table"
    steps, ret = ck.get("env_steps"), ck.get("eval_return")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)):
        return f"its env_steps is of type {type(steps).__name__}, not a whole number"
    if ret is not None and (isinstance(ret, bool) or not isinstance(ret, (int, float))):
        return f"its eval_return is of type {type(ret).__name__}, not a number"
    return None
