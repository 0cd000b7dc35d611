"""A peer's result files when the disk fills: best.pt, checkpoint.pt, the CSV files, TensorBoard,
acked.bin and ids.json.

The standard (as for checkpoints, test_checkpoint_disk.py): a write that fails is logged
and counted, training goes on, summary.json is still written, and the files written
before stay whole. The disk is real: a small tmpfs in a user and mount namespace of the
test's own (skipped where the machine does not allow one), filled by a file of the
test's when the test says so.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from swarmtest import on_small_disk

from swarm.experiment import load_spec
from swarm.experiment.runner import run_peer

ROOT = Path(__file__).resolve().parents[2]

# Fills the disk it is given (argv[1]) with a file of its own, to the last byte.
FILL = """
    def fill(disk):
        with open(os.path.join(disk, "filler"), "ab", buffering=0) as f:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        f.write(bytes(size))
                except OSError:
                    pass
"""

# A peer (run_peer, rank 0 of argv[2]'s coordinator) trains on the disk argv[1] with the
# spec settings argv[4]; with argv[3] > 0 the disk is filled at that env step (with argv[6],
# a file of the peer's: at the first one after it at which that file is not empty), and
# emptied again for the final checkpoint, checkpoint.pt and summary.json (with argv[5] =
# "checkpoint.pt": only for checkpoint.pt and summary.json, after the final checkpoint and
# ids.json). Prints what it returned and what its folder holds (acked.bin in hex).
PEER = FILL + """
    import json, logging, os, sys
    from pathlib import Path
    import swarm.experiment.runner as runner
    from swarm.experiment import load_spec

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    disk, coordinator, fill_at, sets = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    room_at = sys.argv[5] if len(sys.argv) > 5 else "close"
    after = Path(disk) / "run" / "peer0" / sys.argv[6] if len(sys.argv) > 6 else None
    filler = os.path.join(disk, "filler")

    class Filling(runner.Checkpointer):   # the runner calls its step() at every env step
        filled = False

        def step(self, env_steps):
            if (not self.filled and env_steps >= fill_at
                    and (after is None or after.exists() and after.stat().st_size > 0)):
                fill(disk)
                self.filled = True
            return super().step(env_steps)

        def close(self):
            if room_at == "close":
                os.unlink(filler)
            return super().close()

    save_whole = runner._save_whole

    def saving(obj, path):
        if room_at == path.name and os.path.exists(filler):
            os.unlink(filler)
        return save_whole(obj, path)

    if fill_at:
        runner.Checkpointer = Filling
        runner._save_whole = saving
    try:
        got = runner.run_peer(load_spec(None, sets), 0, coordinator, Path(disk) / "run", tensorboard=fill_at > 0,
                              join_timeout=20)
    except Exception as e:
        got = {"raised": f"{type(e).__name__}: {e}"}
    out = Path(disk) / "run" / "peer0"
    files = {p.name: p.read_text() for p in out.iterdir() if p.suffix in (".csv", ".json")}
    acked = (out / "acked.bin").read_bytes().hex() if (out / "acked.bin").exists() else None
    print(json.dumps({"returned": got, "files": files, "left": sorted(p.name for p in out.iterdir()),
                      "ckpt": sorted(p.name for p in (out / "ckpt").iterdir()), "acked": acked}))
"""

# best.pt's writer and the CSV and TensorBoard logs, on a disk that fills under them.
UNITS = FILL + """
    import json, logging, os, sys, time
    from pathlib import Path
    import torch
    from swarm.experiment.runner import _Logs, _save_whole

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    disk = Path(sys.argv[1])
    got = {}
    _save_whole({"eval_return": 10.0, "w": torch.zeros(4)}, disk / "best.pt")
    fill(disk)
    try:
        _save_whole({"eval_return": 20.0, "w": torch.zeros(100_000)}, disk / "best.pt")
    except Exception as e:
        got["raised"] = type(e).__name__ + ": " + str(e)
    got["best"] = float(torch.load(disk / "best.pt", weights_only=True)["eval_return"])
    got["left"] = sorted(os.listdir(disk))
    os.unlink(disk / "filler")

    logs = _Logs(disk / "logs", tensorboard=True)
    got["tb"] = logs.tb is not None
    logs.scalars(0, {"a": 1.0})
    logs.flush()
    fill(disk)
    try:
        row = {"wall_s": 1, "env_steps": 1, "episode": 1, "episode_return": "1" * 30}
        for i in range(150):        # more than the file's last page has room for, less than its buffer
            logs.episodes.writerow(row)
        logs.flush()
        logs.flush()                # the second failure of a file is not logged again
        for i in range(400):        # past its buffer: rows are lost, whole
            logs.episodes.writerow(row)
        deadline = time.monotonic() + 60
        while got["tb"] and logs.tb is not None and time.monotonic() < deadline:
            logs.scalars(1, {"a": 1.0})   # until its writer thread meets the full disk
        got["tb_dropped"] = logs.tb is None
        logs.scalars(2, {"a": 1.0})
        got["counts"] = dict(logs._failed.counts)
    except Exception as e:
        got["raised_logs"] = type(e).__name__ + ": " + str(e)
    os.unlink(disk / "filler")
    logs.close()
    got["metrics"] = (disk / "logs" / "metrics.csv").read_text()
    print(json.dumps(got))
"""


def _rows(text: str) -> list[dict[str, str]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    assert all(None not in r and None not in r.values() for r in rows), "a torn row"
    return rows


def test_a_disk_that_fills_while_training_fails_best_pt_and_the_logs_and_training_goes_on(coordinator, tmp_path):
    sets = ONE + ["budget.env_steps=600", "eval.every=200", "eval.episodes=1", "buffer.capacity=2000",
                  "checkpoint.full_every_s=0", "checkpoint.full_every_steps=100"]
    got = on_small_disk(tmp_path, "2m", PEER, coordinator, "150", json.dumps(sets))
    s = got["returned"]
    # the old runner died at step 200: torch.save's RuntimeError writing best.pt
    assert s.get("reason") == "budget" and s["env_steps"] == 600, s
    # every evaluation tried to write best.pt (none was), and one error says so
    assert s["write_failures"]["best.pt"] == 3 and "best_eval_return" not in s, s
    assert got["log"].count("cannot write best.pt (") == 1, got["log"]
    assert "No space left on device" in got["log"]
    assert "best.pt" not in got["left"] and not [n for n in got["left"] if n.endswith(".tmp")], got["left"]
    # the checkpoints due meanwhile failed; the final one, with room again, did not
    assert s["checkpoint_failures"] >= 1 and "No space left on device" in s["checkpoint_error"]
    assert len(got["ckpt"]) == 1 and got["ckpt"][0].startswith("full-") and "checkpoint.pt" in got["left"]
    saved = json.loads(got["files"]["summary.json"])
    assert saved["write_failures"] == s["write_failures"] and saved["env_steps"] == 600
    # the rows logged before the disk filled are all there, whole
    rows = _rows(got["files"]["metrics.csv"])
    before = [int(r["episode"]) for r in rows if int(r["env_steps"]) <= 150]
    assert before and before == list(range(1, len(before) + 1))
    assert _rows(got["files"]["rounds.csv"])


def test_a_checkpoint_pt_that_does_not_fit_still_leaves_summary_json(coordinator, tmp_path):
    sets = ONE + ["budget.env_steps=300", "checkpoint.full_every_s=0", "checkpoint.full_every_steps=100"]
    got = on_small_disk(tmp_path, "48k", PEER, coordinator, "0", json.dumps(sets))
    s = got["returned"]
    # the old runner raised torch.save's RuntimeError before it wrote summary.json
    assert s.get("reason") == "budget" and s["env_steps"] == 300, s
    assert "summary.json" in got["files"], got["left"]
    saved = json.loads(got["files"]["summary.json"])
    assert saved["write_failures"] == {"checkpoint.pt": 1} and "No space left" in saved["write_error"], saved
    assert "checkpoint" not in saved and saved["checkpoint_failures"] >= 2   # those due, and the final one
    assert "No space left on device" in saved["checkpoint_error"]
    assert "cannot write checkpoint.pt (" in got["log"] and "final checkpoint failed: " in got["log"]
    assert got["ckpt"] == [] and [n for n in got["left"] if "checkpoint" in n] == []
    assert len(_rows(got["files"]["metrics.csv"])) == saved["episodes"]


def test_best_pt_and_the_logs_on_a_full_disk_fail_with_an_error_that_is_logged(tmp_path):
    got = on_small_disk(tmp_path, "1m", UNITS)
    # best.pt: an OSError (the old writer's torch.save raised RuntimeError), the one there kept
    assert got["raised"].startswith("OSError: [Errno 28] No space left on device"), got["raised"]
    assert got["best"] == 10.0 and got["left"] == ["best.pt", "filler"]
    # the CSV files and TensorBoard: logged once each, counted, nothing raised
    assert "raised_logs" not in got, got["raised_logs"]
    assert got["counts"]["metrics.csv"] >= 3 and got["log"].count("cannot write metrics.csv (") == 1
    if got["tb"]:
        assert got["tb_dropped"] and got["counts"]["tb/"] == 1 and "cannot write tb/ (" in got["log"]
    # the rows that waited in memory were written once there was room again, those past
    # the buffer are lost, none torn
    assert 150 <= len(_rows(got["metrics"])) < 550


def test_acked_bin_appends_on_a_full_disk_are_logged_and_the_file_keeps_whole_entries(coordinator, tmp_path):
    """With buffer.replicas each gossip round appends the ids a neighbour acknowledged to
    acked.bin. peer0 (on the small disk, filled once acked.bin has ids) and peer1 (on tmp_path) replicate
    to each other. After the fill acked.bin grows only within its last page (4096 bytes on
    tmpfs, 512 ids; one id per env step): the append that crosses it is part written."""
    probe = tmp_path / "probe"   # skips now where there is no small disk, before peer1 waits for peer0
    probe.mkdir()
    on_small_disk(probe, "64k", "print('{}')")
    both = ONE + ["peers=2", "buffer.replicas=1", "buffer.capacity=4000", "gossip.interval=20"]
    other: dict = {}
    stop = threading.Event()
    # a larger budget (a per-peer key): peer1 acknowledges peer0's items until peer0 is done
    peer1 = threading.Thread(target=lambda: other.update(run_peer(
        load_spec(None, both + ["budget.env_steps=1600"]), 1, coordinator, tmp_path / "run", stop=stop,
        tensorboard=False, join_timeout=120)))
    peer1.start()
    try:
        got = on_small_disk(tmp_path, "2m", PEER, coordinator, "1", json.dumps(both + ["budget.env_steps=800"]),
                             "close", "acked.bin")
    finally:
        stop.set()
        peer1.join(60)
    assert not peer1.is_alive() and other.get("reason") in ("budget", "stopped"), other
    s = got["returned"]
    # the old runner's OSError ended the run at the first round after the fill that had ids
    assert s.get("reason") == "budget" and s["env_steps"] == 800, s
    assert s["write_failures"]["acked.bin"] >= 1, s
    assert got["log"].count("cannot write acked.bin (") == 1 and "No space left on device" in got["log"]
    # whole rounds of whole int64 entries, each id once (local seqs count up from the start's
    # floor, one per env step: within 800 of each other): the part
    # of the append that crossed the page was cut back off
    raw = bytes.fromhex(got["acked"])
    assert raw and len(raw) % 8 == 0 and len(raw) < 4096, len(raw)
    ids = np.frombuffer(raw, dtype=np.int64)
    assert len(set(ids.tolist())) == len(ids) and 0 <= ids.min() and ids.max() - ids.min() < 800, ids
    # its reader, scripts/chaos.py, finds every id recorded (peer1's too) in the other's ids.json
    found = importlib.util.spec_from_file_location("chaos", ROOT / "scripts" / "chaos.py")
    chaos = importlib.util.module_from_spec(found)
    found.loader.exec_module(chaos)
    (tmp_path / "run" / "peer0").mkdir()
    (tmp_path / "run" / "peer0" / "acked.bin").write_bytes(raw)
    theirs = (tmp_path / "run" / "peer1" / "acked.bin").stat().st_size // 8
    assert chaos.samples_lost(tmp_path / "run") == (0, len(ids) + theirs)


def test_an_ids_json_that_does_not_fit_still_leaves_summary_json(coordinator, tmp_path):
    # buffer.replicas without sharing: ids.json, with no neighbour; the disk fills at step 250
    # and has room again only for checkpoint.pt and summary.json, after ids.json
    sets = ONE + ["budget.env_steps=300", "buffer.sharing=false", "buffer.replicas=1"]
    got = on_small_disk(tmp_path, "2m", PEER, coordinator, "250", json.dumps(sets), "checkpoint.pt")
    s = got["returned"]
    # the old runner raised ids.json's OSError before it wrote summary.json
    assert s.get("reason") == "budget" and s["env_steps"] == 300, s
    saved = json.loads(got["files"]["summary.json"])
    assert saved["write_failures"]["ids.json"] == 1 and saved["env_steps"] == 300, saved
    assert got["log"].count("cannot write ids.json (") == 1 and "No space left on device" in got["log"]
    # none written, not a torn one (the old runner left an empty ids.json), and no temporary file
    assert "ids.json" not in got["left"] and not [n for n in got["left"] if n.endswith(".tmp")], got["left"]
    assert "checkpoint.pt" in got["left"]


# Appends to a file (argv[1]) with the process's file size limit (RLIMIT_FSIZE) below what
# the append needs: the kernel takes the bytes up to the limit, then refuses (EFBIG).
APPEND = """
    import json, resource, signal, sys
    import numpy as np
    from swarm.experiment.runner import _append_whole

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails, not the process
    path, got = sys.argv[1], {}
    _append_whole(path, np.arange(3, dtype=np.int64).tobytes())
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (28, hard))   # room for half an entry more
    try:
        _append_whole(path, np.arange(3, 6, dtype=np.int64).tobytes())
    except OSError as e:
        got["raised"] = e.errno
    got["size"] = len(open(path, "rb").read())
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    _append_whole(path, np.arange(6, 8, dtype=np.int64).tobytes())
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")   # a torn last entry, as a process killed mid-write leaves
    _append_whole(path, np.arange(8, 9, dtype=np.int64).tobytes())
    got["ids"] = np.fromfile(path, dtype=np.int64).tolist()
    print(json.dumps(got))
"""


def test_an_acked_bin_append_that_fails_part_way_leaves_no_torn_entry(tmp_path):
    """A part-written append left a torn int64 entry: every id appended after it read wrong."""
    src = tmp_path / "append.py"
    src.write_text(textwrap.dedent(APPEND))
    p = subprocess.run([sys.executable, str(src), str(tmp_path / "acked.bin")], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["raised"] == 27 and got["size"] == 24, got   # EFBIG, and the 4 bytes written cut back off
    assert got["ids"] == [0, 1, 2, 6, 7, 8], got
