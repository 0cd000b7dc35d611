"""Snapshots when the disk misbehaves: full part way, a rename that fails, a path taken meanwhile.

The standard: the save fails with a ReplayError, the snapshot already at the path
stays whole and loadable, no temporary folder is left using the disk, and the
process lives. A full disk is real where the machine allows it (a small tmpfs in a
mount namespace of the test's own); a failing rename is made with monkeypatch.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from swarmtest import on_small_disk

from swarm.buffer import ReplayBuffer
from swarm.buffer import persist
from swarm.buffer.persist import digest, load_incremental, save_incremental
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (8,)), "action": ("int64", ()), "reward": ("float32", ())}


def items(n, start=0):
    k = np.arange(start, start + n)
    return {"obs": np.tile(k[:, None], (1, 8)).astype(np.float32), "action": k, "reward": k.astype(np.float32)}


def test_a_disk_that_fills_during_a_save_fails_it_cleanly_and_keeps_the_snapshot_there(tmp_path):
    """A real full disk: the first snapshot fits, the second (both exist until the
    rename) does not. The old code wrote through a memory map and died of SIGBUS."""
    got = on_small_disk(tmp_path, "2m", """
        import json, os, sys
        import numpy as np
        from swarm.buffer import ReplayBuffer
        from swarm.buffer.persist import digest
        disk = sys.argv[1]
        schema = {"obs": ("float32", (64,)), "action": ("int64", ())}
        buf = ReplayBuffer(schema, 5000, seed=0)          # ~1.4 MB a snapshot
        buf.add({"obs": np.ones((5000, 64), np.float32), "action": np.arange(5000)})
        buf.save(disk + "/snap")
        first = digest(buf)
        buf.add({"obs": np.full((100, 64), 2, np.float32), "action": np.arange(100)})
        out = {}
        for background in (False, True):
            try:
                snap = buf.save(disk + "/snap", background=background)
                snap.wait(120)
                out[str(background)] = "saved"
            except Exception as e:
                out[str(background)] = f"{type(e).__name__}: {e}"
        out["left"] = sorted(os.listdir(disk))
        out["same"] = digest(ReplayBuffer.load(disk + "/snap")) == first
        print(json.dumps(out))
    """)
    for background in ("False", "True"):
        assert got[background].startswith("ReplayError: snapshot to ") and "No space left on device" in got[background]
    assert got["left"] == ["snap"]          # no temporary folder left using the full disk
    assert got["same"]                      # the earlier snapshot, whole


def _failing_replace(monkeypatch, nth: int):
    """os.replace fails with ENOSPC at its ``nth`` call (rename(2) may, as a directory grows),
    on the path of a file system that cannot swap two names in one step."""
    real, calls = os.replace, [0]
    monkeypatch.setattr(persist, "_exchange", lambda a, b: False)

    def replace(src, dst, *a, **k):
        calls[0] += 1
        if calls[0] == nth:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, "replace", replace)


def test_a_rename_that_fails_puts_the_earlier_snapshot_back(tmp_path, monkeypatch):
    buf = ReplayBuffer(SCHEMA, 64, seed=0)
    buf.add(items(40))
    buf.save(tmp_path / "snap")
    first = digest(buf)
    buf.add(items(10, 100))
    _failing_replace(monkeypatch, 2)        # the earlier one is moved aside, the new one is not moved in
    with pytest.raises(ReplayError, match="No space left on device"):
        buf.save(tmp_path / "snap")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]
    assert digest(ReplayBuffer.load(tmp_path / "snap")) == first


@pytest.mark.parametrize("where", ["write", "rename"])
def test_an_incremental_save_that_fails_leaves_the_earlier_one_and_no_temporary_folder(tmp_path, monkeypatch, where):
    buf = ReplayBuffer(SCHEMA, 64, seed=0)
    buf.add(items(40))
    buf.save(tmp_path / "full")
    buf.add(items(5, 100))
    save_incremental(buf, tmp_path / "inc", 40)
    want = digest(buf)
    buf.add(items(5, 200))
    if where == "rename":
        _failing_replace(monkeypatch, 1)
    else:
        from swarm.buffer import persist
        real, calls = persist._Rows.append, [0]

        def append(*a, **k):   # the third column's rows, written as they are read: the disk fills part way
            calls[0] += 1
            if calls[0] == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*a, **k)
        monkeypatch.setattr(persist._Rows, "append", append)
    with pytest.raises(ReplayError, match=f"incremental snapshot to {tmp_path / 'inc'} failed: .*No space left"):
        save_incremental(buf, tmp_path / "inc", 40)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "inc"]
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    assert digest(back) == want


def test_a_file_put_at_the_path_while_a_snapshot_is_written_is_left_alone(tmp_path):
    from swarm.buffer.persist import Snapshot

    buf = ReplayBuffer(SCHEMA, 64, seed=0)
    buf.add(items(40))
    buf.save(tmp_path / "snap")
    snap = Snapshot(buf, tmp_path / "snap")   # checked here: a snapshot, may be replaced
    shutil.rmtree(tmp_path / "snap")
    (tmp_path / "snap").write_text("results")
    with pytest.raises(ReplayError, match="is not a replay snapshot"):
        snap.run().wait()
    assert (tmp_path / "snap").read_text() == "results"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]


def test_a_crash_while_a_snapshot_replaces_another_leaves_one_at_the_path(tmp_path):
    """A save over an earlier snapshot renamed the old one aside, then the new one in: a
    process that died between the two left nothing at the path (the old one under
    ``snap.old-PID-TID``). Where the file system can swap two names in one step it now
    does, so the path holds the old snapshot or the new one at every moment."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    if not persist._exchange(a, b):
        pytest.skip("this file system cannot swap two names in one step (renameat2 RENAME_EXCHANGE)")
    script = f"""
import os, numpy as np
from swarm.buffer import ReplayBuffer
buf = ReplayBuffer({{"obs": ("float32", (4,))}}, 64, seed=0)
buf.add({{"obs": np.ones((40, 4), np.float32)}})
buf.save({str(tmp_path / "snap")!r})
buf.add({{"obs": np.zeros((10, 4), np.float32)}})
real = os.replace
def replace(src, dst, *a, **k):   # the process dies right after its first rename
    real(src, dst, *a, **k)
    os._exit(3)
os.replace = replace
buf.save({str(tmp_path / "snap")!r})
"""
    subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    back = ReplayBuffer.load(tmp_path / "snap")
    assert len(back) == 50
