"""A peer's records when a write fails: its summary.json, the pair run.json and
resumed.json, and its CSV files opened part way.

The failures are real files in the way: a folder where the file (or its temporary file)
goes, so that the write fails with the OSError the system gives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture

from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.launch import summarize
from swarm.experiment.runner import _Logs, run_peer


def _peer(addr: str, run_dir: Path, steps: int, **kw) -> dict:
    spec = load_spec(None, ONE + [f"budget.env_steps={steps}"])
    return run_peer(spec, 0, addr, run_dir, tensorboard=False, join_timeout=10, **kw)


@pytest.mark.parametrize("how", ["restart", "fresh"])
def test_a_summary_json_that_cannot_be_written_leaves_none_not_the_one_of_an_earlier_process(
        coordinator, tmp_path, how):
    """A process restarted into its folder (resumed from it), or a fresh start into a folder
    another run used, whose summary.json cannot be written: the folder holds none, so the
    launcher's table says that peer has no summary. The old runner left the earlier
    process's summary.json (100 env steps, reason budget), which the table showed as this
    process's figures."""
    x = tmp_path / "x"
    first = _peer(coordinator, x, 100)
    assert first["reason"] == "budget" and (x / "peer0" / "summary.json").is_file()
    (x / "peer0" / ".summary.json.tmp").mkdir()   # where the next summary.json is written first
    s = _peer(coordinator, x, 200, **({"resume_from": x} if how == "restart" else {}))
    assert s["reason"] == "budget" and s["env_steps"] == 200, s
    assert s["write_failures"] == {"summary.json": 1} and s["write_error"].startswith("summary.json: "), s
    assert not (x / "peer0" / "summary.json").exists()
    row = summarize(x)[0]
    assert row["id"] == "peer0" and row["reason"].startswith("no summary"), row


def test_a_restart_that_fails_before_it_trains_keeps_the_summary_json_there(coordinator, tmp_path):
    """A restart that fails before it trains (no checkpoint of its run loads) leaves the
    earlier process's summary.json: only a process that trains replaces it."""
    x = tmp_path / "x"
    _peer(coordinator, x, 100)
    before = (x / "peer0" / "summary.json").read_bytes()
    spec = load_spec(None, ONE + ["budget.env_steps=200", "buffer.capacity=500"])   # not the checkpoint's buffer
    with pytest.raises(ConfigError, match="buffer.capacity = 500"):
        run_peer(spec, 0, coordinator, x, tensorboard=False, join_timeout=10, resume_from=x)
    assert (x / "peer0" / "summary.json").read_bytes() == before


def test_a_resume_that_cannot_write_resumed_json_leaves_run_json_as_it_was(coordinator, tmp_path):
    """A resume from another run's folder starts a run in X: its run.json and resumed.json
    go in together. When resumed.json cannot be written, X's run.json still records the
    run it held (the old runner had already replaced it with the new run's)."""
    old, x = tmp_path / "old", tmp_path / "x"
    _peer(coordinator, old, 100)
    out = x / "peer0"
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"run": "0123456789abcdef", "continues": []}) + "\n")
    (out / "resumed.json").mkdir()   # the record cannot go where a folder is
    before = (out / "run.json").read_bytes()
    with pytest.raises(ConfigError) as e:
        _peer(coordinator, x, 200, resume_from=old)
    assert f"cannot write {out / 'resumed.json'} (Is a directory)" in str(e.value), e.value
    assert (out / "run.json").read_bytes() == before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    # with room for both, both go in: the new run, and the record of where it started
    (out / "resumed.json").rmdir()
    s = _peer(coordinator, x, 200, resume_from=old)
    run = json.loads((out / "run.json").read_text())
    resumed = json.loads((out / "resumed.json").read_text())
    assert run["run"] == resumed["run"] != "0123456789abcdef" and resumed["checkpoint"] == s["resumed_from"]
    assert run["continues"][0][0] == resumed["continues"] == str((old / "peer0").resolve()), (run, resumed)


def _open_here(folder: Path) -> list[str]:
    """The files under ``folder`` that this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue   # the listing's own descriptor, closed by now
    return [p for p in held if p.startswith(str(folder))]


@pytest.mark.parametrize("blocked", ["rounds.csv", "evals.csv"])
def test_logs_that_fail_part_way_through_opening_close_the_files_they_opened(tmp_path, blocked):
    """The second (or third) CSV file cannot be created: the error names it, and the files
    opened before it are closed, not left to the garbage collector (the old _Logs left
    metrics.csv open for as long as the error's traceback lived)."""
    (tmp_path / blocked).mkdir()
    with pytest.raises(IsADirectoryError) as e:
        _Logs(tmp_path, tensorboard=False)
    assert e.value.filename == str(tmp_path / blocked)
    assert _open_here(tmp_path) == [], _open_here(tmp_path)
    assert (tmp_path / "metrics.csv").read_text().startswith("wall_s,env_steps,")   # its header went to disk
