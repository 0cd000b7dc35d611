"""A peer's summary.json on a disk that fails it, and its records (run.json, resumed.json,
ids.json, summary.json) written synced and whole.

The standard is that of the other result files (test_runner_disk.py): a write that
fails is logged and counted, the peer ends as it would have, and the file there before
stays whole; but an earlier process's summary.json goes before a process trains (it would
be read as this one's figures), so a summary.json that does not fit leaves none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from experiment.test_runner_disk import FILL
from swarmtest import on_small_disk

from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer

ROOT = Path(__file__).resolve().parents[2]

PREVIOUS = {"rank": 0, "id": "peer0", "reason": "budget", "env_steps": 100}

# A peer (run_peer, rank 0 of argv[2]'s coordinator, spec settings argv[4]) trains in the
# folder argv[1]. Once it has written checkpoint.pt, the last file before summary.json,
# the disk has no more room: argv[3] = "fill" fills it (a small disk), "limit" sets the
# process's file size limit (RLIMIT_FSIZE) to 64 bytes, after a previous summary.json
# (argv[5]) was put in the peer's folder. Prints what it returned (or raised) and what the
# folder holds.
PEER = FILL + """
    import json, logging, os, resource, signal, sys
    from pathlib import Path
    import swarm.experiment.runner as runner
    from swarm.experiment import load_spec

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    disk, coordinator, how, sets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    out = Path(disk) / "run" / "peer0"
    if how == "limit":
        out.mkdir(parents=True)
        (out / "summary.json").write_text(sys.argv[5])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails, not the process
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    save_whole = runner._save_whole

    def saving(obj, path):
        saved = save_whole(obj, path)
        if path.name == "checkpoint.pt":
            if how == "fill":
                fill(disk)
            else:
                resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
        return saved

    runner._save_whole = saving
    try:
        got = runner.run_peer(load_spec(None, sets), 0, coordinator, Path(disk) / "run", tensorboard=False,
                              join_timeout=20)
    except Exception as e:
        got = {"raised": f"{type(e).__name__}: {e}"}
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    summary = (out / "summary.json").read_text() if (out / "summary.json").exists() else None
    print(json.dumps({"returned": got, "summary": summary, "left": sorted(p.name for p in out.iterdir())}))
"""

SETS = ONE + ["budget.env_steps=200"]


def test_a_summary_json_that_does_not_fit_is_logged_and_the_peer_ends_as_it_would_have(coordinator, tmp_path):
    got = on_small_disk(tmp_path, "2m", PEER, coordinator, "fill", json.dumps(SETS))
    s = got["returned"]
    # the old runner raised the OSError out of run_peer (swarm peer: a traceback, exit 1)
    assert s.get("reason") == "budget" and s["env_steps"] == 200, s
    assert s["write_failures"]["summary.json"] == 1 and "No space left" in s["write_error"], s
    assert got["log"].count("cannot write summary.json (") == 1 and "No space left on device" in got["log"]
    assert "checkpoint.pt" in got["left"] and "run.json" in got["left"]
    # none written, not an empty one, and no temporary file
    assert got["summary"] is None and not [n for n in got["left"] if n.endswith(".tmp")], got["left"]


def test_a_summary_json_write_that_fails_part_way_leaves_no_torn_file_nor_the_previous_one(coordinator, tmp_path):
    src = tmp_path / "peer.py"
    src.write_text(textwrap.dedent(PEER))
    p = subprocess.run([sys.executable, str(src), str(tmp_path), coordinator, "limit", json.dumps(SETS),
                        json.dumps(PREVIOUS)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    s = got["returned"]
    # the old runner truncated the previous summary.json, left the first 64 bytes of the
    # new one (not JSON) and raised EFBIG out of run_peer; a later one left the previous
    # one whole, which the launcher's table then showed as this process's figures
    assert s.get("reason") == "budget" and s["env_steps"] == 200, s
    assert s["write_failures"]["summary.json"] == 1 and "too large" in s["write_error"], s
    assert got["summary"] is None, got["summary"]   # the previous one went before it trained
    assert p.stderr.count("cannot write summary.json (") == 1
    assert not [n for n in got["left"] if n.endswith(".tmp")], got["left"]


def test_run_json_resumed_json_ids_json_and_summary_json_are_synced_before_and_after_their_rename(
        coordinator, tmp_path, monkeypatch):
    """Each is written to a temporary file that is synced, renamed over the file, and the
    rename synced (the folder): a crash or power loss leaves the old record or the new one,
    never an empty file nor an old one that was already replaced."""
    done: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def syncing(fd: int) -> None:
        done.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def replacing(src, dst, **kw) -> None:
        replace(src, dst, **kw)
        done.append(("replace", str(dst)))

    monkeypatch.setattr(os, "fsync", syncing)
    monkeypatch.setattr(os, "replace", replacing)
    ids = ["buffer.sharing=false", "buffer.replicas=1"]   # ids.json, with no neighbour
    run_peer(load_spec(None, SETS + ids), 0, coordinator, tmp_path / "a", tensorboard=False, join_timeout=10)
    s = run_peer(load_spec(None, ONE + ids + ["budget.env_steps=300"]), 0, coordinator, tmp_path / "b",
                 tensorboard=False, join_timeout=10, resume_from=tmp_path / "a")
    assert s["reason"] == "budget" and "resumed_from" in s, s
    monkeypatch.undo()
    for folder, name in [("a", "run.json"), ("a", "ids.json"), ("a", "summary.json"), ("b", "run.json"),
                         ("b", "resumed.json"), ("b", "ids.json"), ("b", "summary.json")]:
        peer = str(tmp_path / folder / "peer0")
        path = f"{peer}/{name}"
        renamed = done.index(("replace", path))
        assert ("fsync", f"{peer}/.{name}.tmp") in done[:renamed], (path, done)
        # the folder, before the next rename into it
        after = done[renamed + 1:]
        nxt = next((i for i, (k, p) in enumerate(after) if k == "replace" and os.path.dirname(p) == peer),
                   len(after))
        assert ("fsync", peer) in after[:nxt], (path, done)
        json.loads(Path(path).read_text())
