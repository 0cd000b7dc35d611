"""Review 47: snapshot folders whose names are near the file system's limit (255 bytes), and
snapshots whose stored priorities (``_leaf.npy``) are NaN, Inf or negative.

A save writes into a temporary folder beside ``path`` and renames it into place; that
folder was named ``<name>.tmp-PID-THREAD`` (an increment's ``<name>.tmp-PID-xxxxxxxx``),
up to ~25 bytes longer than the name, so a name of 231-255 bytes, valid for the file
system, failed deep in the save with "File name too long"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from swarm.buffer import ReplayBuffer, persist
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (3,)), "action": ("int64", ())}
NAME_MAX = 255


def buffer(n: int = 6, cap: int = 16) -> ReplayBuffer:
    buf = ReplayBuffer(SCHEMA, cap, seed=0, peer_id="a", first_seq=0, clock=lambda: 1.0)
    buf.add({"obs": np.arange(3 * n, dtype=np.float32).reshape(n, 3), "action": np.arange(n)})
    return buf


def long_name(size: int, ch: str = "s") -> str:
    """A folder name of ``size`` bytes in UTF-8 (``ch`` may be several bytes: the rest is ASCII)."""
    k = size // len(ch.encode())
    return ch * k + "s" * (size - k * len(ch.encode()))


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


# ------------------------------------------------ 1. names at the file system's limit
@pytest.mark.parametrize("size,ch", [(231, "s"), (NAME_MAX, "s"), (NAME_MAX, "é"), (NAME_MAX, "€")])
@pytest.mark.parametrize("background", [False, True])
def test_a_snapshot_named_up_to_the_file_systems_limit_saves_and_loads(tmp_path, size, ch, background):
    """Before: OSError "File name too long" on the temporary folder ``<name>.tmp-PID-THREAD``."""
    path = tmp_path / long_name(size, ch)
    assert len(os.fsencode(path.name)) == size
    buf = buffer()
    snap = buf.save(path, background=background)
    if background:
        snap.wait(timeout=60)
    buf.add({"obs": np.ones((3, 3), np.float32), "action": np.arange(3)})
    buf.save(path)                                    # replacing the snapshot there
    back = ReplayBuffer.load(path)
    assert persist.digest(back) == persist.digest(buf)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("on_disk", [False, True])
def test_an_increment_named_up_to_the_file_systems_limit_saves_and_loads(tmp_path, on_disk):
    """Before: ``Increment.write`` failed on ``<name>.tmp-PID-THREAD``, and ``take_incremental``
    with a ``path`` on mkdtemp's ``<name>.tmp-PID-xxxxxxxx``."""
    buf = buffer()
    full, inc = tmp_path / long_name(NAME_MAX, "f"), tmp_path / long_name(NAME_MAX, "i")
    buf.save(full)
    since = buf.total_added
    buf.add({"obs": np.ones((4, 3), np.float32), "action": np.arange(4)})
    if on_disk:
        assert persist.save_incremental(buf, inc, since) == 4
    else:
        assert persist.take_incremental(buf, since).write(inc) == 4
    back = persist.load_incremental(ReplayBuffer.load(full), inc)
    assert persist.digest(back) == persist.digest(buf)
    assert leftovers(tmp_path) == []


KILLED_MID_INCREMENT = textwrap.dedent("""
    import os, sys
    import numpy as np
    from swarm.buffer import ReplayBuffer, persist
    buf = ReplayBuffer({"obs": ("float32", (3,)), "action": ("int64", ())}, 16, seed=0, peer_id="a")
    buf.add({"obs": np.zeros((6, 3), np.float32), "action": np.arange(6)})
    inc = persist.take_incremental(buf, 2, path=sys.argv[1])   # its rows are on disk in a temporary folder
    os._exit(0)                                                # killed before write(): the folder stays
""")


def test_the_temporary_folders_of_a_long_name_a_killed_save_left_are_removed_and_no_others(tmp_path):
    """A long name's temporary folder has a name of its own (shortened): a later save to the
    same path still finds and removes it once its process is gone, and a save to another
    long path that shares the shortened part leaves it alone."""
    prefix = long_name(240, "p")
    a, b = tmp_path / (prefix + "a" * 15), tmp_path / (prefix + "b" * 15)
    for p in (a, b):
        subprocess.run([sys.executable, "-c", KILLED_MID_INCREMENT, str(p)], check=True, timeout=120)
    stale = leftovers(tmp_path)
    assert len(stale) == 2 and len(set(stale)) == 2, stale
    long_ago = time.time() - 3600
    for name in stale:
        for f in (*(tmp_path / name).iterdir(), tmp_path / name):
            os.utime(f, (long_ago, long_ago))
    buf = buffer()
    persist.save_incremental(buf, a, 2)
    left = leftovers(tmp_path)
    assert len(left) == 1, left                        # a's removed, b's kept
    persist.save_incremental(buf, b, 2)
    assert leftovers(tmp_path) == []
    for p in (a, b):
        assert persist.digest(persist.load_incremental(buffer(2), p)) == persist.digest(buf)


def test_a_name_longer_than_the_file_systems_limit_fails_clearly_and_writes_nothing(tmp_path):
    path = tmp_path / long_name(NAME_MAX + 1)
    with pytest.raises(ReplayError, match=f"its name is {NAME_MAX + 1} bytes, longer than the {NAME_MAX}"):
        buffer().save(path)
    with pytest.raises(ReplayError, match=f"its name is {NAME_MAX + 1} bytes, longer than the {NAME_MAX}"):
        persist.take_incremental(buffer(), 2, path=path)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------ 2. priorities that are not finite or negative
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -1.0])
@pytest.mark.parametrize("kind", ["full", "increment"])
def test_a_snapshot_with_a_nan_inf_or_negative_priority_is_refused_clearly(tmp_path, bad, kind):
    buf = buffer()
    buf.save(tmp_path / "full")
    target = tmp_path / "full"
    if kind == "increment":
        buf.add({"obs": np.ones((2, 3), np.float32), "action": np.arange(2)})
        persist.save_incremental(buf, tmp_path / "inc", 6)
        target = tmp_path / "inc"
    leaf = np.load(target / "_leaf.npy")
    leaf[3] = bad
    np.save(target / "_leaf.npy", leaf)
    base = ReplayBuffer.load(tmp_path / "full") if kind == "increment" else None
    before = persist.digest(base) if base is not None else None
    with pytest.raises(ReplayError, match=r"column '_leaf' holds priorities that are negative, NaN or Inf"):
        if base is None:
            ReplayBuffer.load(target)
        else:
            persist.load_incremental(base, target)
    if base is not None:
        assert persist.digest(base) == before   # nothing applied
