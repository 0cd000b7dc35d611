"""A background save still running when the program ends (review 42): its thread was a
daemon, so the interpreter killed it at exit, with status 0, no snapshot and a
``<path>.tmp-PID-TID`` folder left for good. The exit now waits for it."""

import json
import subprocess
import sys
import textwrap

from swarm.buffer.persist import digest, load
from swarmtest import ROOT, reaped

# argv[1]: the snapshot's path; argv[2]: rows. Prints the buffer's digest, starts a
# background save and ends, never calling Snapshot.wait().
PROGRAM = """
import json, sys, threading, time
import numpy as np
from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import digest

path, n, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
buf = ReplayBuffer({"obs": ("float32", (256,)), "r": ("float32", ())}, n, seed=0)
buf.add({"obs": np.arange(n * 256, dtype=np.float32).reshape(n, 256), "r": np.ones(n, np.float32)})
print(json.dumps(digest(buf)), flush=True)
if not hold:
    buf.save(path, background=True)
else:
    # The buffer's lock, held from before the save until after the main thread has ended
    # (and a while longer): the snapshot cannot copy its first chunk before the program's
    # end, however fast the disk.
    started = threading.Event()

    def holder():
        with buf._lock:
            buf.save(path, background=True)
            started.set()
            threading.main_thread().join()
            time.sleep(0.5)

    threading.Thread(target=holder, daemon=True).start()
    started.wait()
"""


def run_program(tmp_path, rows, hold):
    """Run PROGRAM to the end; return the digest it printed of the buffer it saved."""
    src = tmp_path / "program.py"
    src.write_text(textwrap.dedent(PROGRAM))
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    p = subprocess.Popen([sys.executable, str(src), str(snaps / "final"), str(rows), "hold" if hold else "go"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    with reaped(p):
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[0])


def test_a_background_save_running_at_the_end_of_the_program_is_finished(tmp_path):
    want = run_program(tmp_path, 1024, hold=True)
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["final"]   # no .tmp folder left
    assert digest(load(tmp_path / "snaps" / "final")) == want


def test_a_program_whose_last_act_is_a_background_save_leaves_the_snapshot(tmp_path):
    """The review's case as a user meets it: 64 MB saved as the program's last line."""
    want = run_program(tmp_path, 65536, hold=False)
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["final"]
    assert digest(load(tmp_path / "snaps" / "final")) == want
