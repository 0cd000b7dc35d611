"""A peer's logs when its result files cannot be written (review 49).

- TensorBoard's writer thread, failing on a full disk, printed an uncaught "Exception in
  thread Thread-1" traceback to stderr (the peer's log under ``swarm run``), raw, beside
  the handled ``cannot write tb/`` error.
- A CSV file that could not be written was logged once per process: its recovery was
  never logged, and a later outage of the same file was silent.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
import types
from pathlib import Path

import pytest
from swarmtest import Clock, run_child

from swarm.experiment import runner
from swarm.experiment.runner import _Logs, _Unwritten


# A _Logs whose TensorBoard writes fail (gfile's _write raises ENOSPC, as a full disk does)
# in a process of its own, so that threading's hook is Python's default one, which prints
# to stderr; logged as under `swarm run` (INFO). Writes events until the writer is dropped,
# then goes on logging; prints what it saw.
FULL_TB = """
    import errno, json, logging, sys, threading
    from pathlib import Path
    from tensorboard.compat.tensorflow_stub.io import gfile
    from swarm.experiment.runner import _Logs, _Unwritten

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    hook = threading.excepthook
    out = Path(sys.argv[1])
    logs = _Logs(out, tensorboard=True, failed=_Unwritten(0))

    def full(self, filename, content, mode):
        raise OSError(errno.ENOSPC, "No space left on device")

    gfile.LocalFileSystem._write = full
    step = 0
    while logs.tb is not None and step < 2000:   # until its writer thread meets the full disk
        logs.scalars(step, {"a": 1.0})
        logs.flush()
        step += 1
    logs.scalars(step, {"a": 1.0})   # training goes on: a no-op now
    logs.episodes.writerow({"env_steps": step, "episode": 1})
    logs.flush()
    logs.close()
    print(json.dumps({"dropped": logs.tb is None, "counts": logs._failed.counts,
                      "hook_back": threading.excepthook is hook,
                      "metrics": (out / "metrics.csv").read_text()}))
"""


def test_a_tensorboard_writer_thread_that_fails_prints_no_traceback_and_is_logged_once(tmp_path):
    pytest.importorskip("tensorboard")
    code, out, err = run_child(tmp_path, FULL_TB, str(tmp_path / "peer0"))
    assert code == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    assert got["dropped"] and got["counts"] == {"tb/": 1}, (got, err)
    # the old runner: "Exception in thread Thread-1:" and TensorBoard's traceback, raw
    assert "Exception in thread" not in err and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "peer0: cannot write tb/ ([Errno 28] No space left on device)" in errors[0], err
    # the CSV files went on, and threading has its own hook back
    assert got["metrics"].splitlines()[-1].startswith(",") and got["hook_back"], got


def test_only_the_tensorboard_writer_threads_oserror_is_taken_from_threading_s_hook(tmp_path, monkeypatch,
                                                                                      caplog):
    """Its traceback is in the log at DEBUG (-v); another thread's exception, and one while
    no writer is held, go to the hook that was there."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.tensorflow_stub.io import gfile

    seen: list[tuple[str, type]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append((args.thread.name, args.exc_type)))
    before = threading.excepthook

    def boom() -> None:
        raise OSError(errno.EIO, "Input/output error")

    def fail(name: str) -> None:
        t = threading.Thread(target=boom, name=name)
        t.start()
        t.join()

    caplog.set_level(logging.DEBUG, logger="swarm.experiment")
    logs = _Logs(tmp_path, tensorboard=True, failed=_Unwritten(3))
    try:
        fail("other-thread")
        writer = logs.tb._get_file_writer().event_writer._async_writer._worker

        def full(self, filename, content, mode):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)
        logs.scalars(1, {"a": 1.0})
        logs.flush()
        writer.join(30)   # it failed at its first write
        assert not writer.is_alive()
        logs.scalars(2, {"a": 1.0})
        logs.flush()   # the writer raises it again here at the latest: dropped
        assert logs.tb is None and logs._failed.counts == {"tb/": 1}
    finally:
        logs.close()
    fail("after-close")
    assert threading.excepthook is before
    # the old runner: ("Thread-N", OSError) of TensorBoard's writer among them, printed raw
    assert seen == [("other-thread", OSError), ("after-close", OSError)], seen
    stopped = [r for r in caplog.records if "TensorBoard's writer thread stopped" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].levelno == logging.DEBUG and stopped[0].exc_info[0] is OSError
    assert stopped[0].getMessage().startswith("peer3: ")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "peer3: cannot write tb/ " in errors[0].getMessage(), caplog.text


class _Flaky:
    """A file whose flushes fail (ENOSPC, as on a full disk) where ``fails`` says so, one a flush."""

    def __init__(self, f, fails: list[bool]) -> None:
        self._f, self._fails, self.name = f, list(fails), f.name

    def flush(self) -> None:
        if self._fails and self._fails.pop(0):
            raise OSError(errno.ENOSPC, "No space left on device")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _flaky_rounds(logs: _Logs, fails: list[bool]) -> None:
    logs._files = [_Flaky(f, fails) if Path(f.name).name == "rounds.csv" else f for f in logs._files]


def _lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if "rounds.csv" in r.getMessage()]


def test_each_outage_of_a_csv_file_is_logged_when_it_starts_and_when_it_ends(tmp_path, monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=clock, time=time.time))
    caplog.set_level(logging.INFO, logger="swarm.experiment")
    logs = _Logs(tmp_path, tensorboard=False, failed=_Unwritten(0))
    _flaky_rounds(logs, [True] * 3 + [False] + [True] * 2 + [False])
    try:
        for i in range(7):   # a flush every 30 s: 3 fail, one writes, 2 fail (from t = 120 s), one writes
            logs.rounds.writerow({"round": i, "env_steps": i})
            logs.flush()
            clock.t += 30
    finally:
        logs.close()
    got = _lines(caplog)
    # the old runner: the first ERROR only
    assert [level for level, _ in got] == ["ERROR", "WARNING", "ERROR", "WARNING"], got
    assert got[0][1].startswith("peer0: cannot write rounds.csv ([Errno 28] No space left on device); its rows "
                                "wait in memory (those past its buffer are lost) until it is written again")
    assert got[1][1] == "peer0: rounds.csv written again after 90 s (3 failed writes of it meanwhile)"
    assert got[3][1] == "peer0: rounds.csv written again after 60 s (2 failed writes of it meanwhile)"
    assert logs._failed.counts == {"rounds.csv": 5}
    # the rows that waited are all there
    assert [line.split(",")[0] for line in (tmp_path / "rounds.csv").read_text().splitlines()[1:]] == \
        [str(i) for i in range(7)]


def test_a_csv_file_that_fails_every_other_flush_is_logged_at_most_once_a_minute(tmp_path, monkeypatch, caplog):
    """An outage that starts within RECURRING_LOG_S of the last one logged is logged once it
    has lasted past then; one that ended before is only counted."""
    clock = Clock()
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=clock, time=time.time))
    caplog.set_level(logging.INFO, logger="swarm.experiment")
    logs = _Logs(tmp_path, tensorboard=False, failed=_Unwritten(0))
    fails = [True, False, True, False] + [True] * 4 + [False]
    _flaky_rounds(logs, fails)
    try:
        for _ in fails:   # a flush every 10 s: fail, write, fail, write, then from t = 40 s four fail, one writes
            logs.flush()
            clock.t += 10
    finally:
        logs.close()
    got = _lines(caplog)
    assert [level for level, _ in got] == ["ERROR", "WARNING", "ERROR", "WARNING"], got
    assert got[1][1] == "peer0: rounds.csv written again after 10 s (1 failed writes of it meanwhile)"
    # the one at t = 20 s is only counted; the one from t = 40 s is logged at t = 60 s (60 s after
    # the first error), and ends at t = 80 s
    assert got[3][1] == "peer0: rounds.csv written again after 40 s (4 failed writes of it meanwhile)"
    assert logs._failed.counts == {"rounds.csv": 6}
