"""The files a run writes and reads, where others may write its folder or a disk fails it
(review 48).

- A peer folder's ``.lock`` that this user may only read (another user's, in a shared
  folder), or that is a folder: the lock was skipped without a word, and two swarms wrote
  one peer folder.
- A symbolic link planted where swarm writes (``.summary.json.tmp``, ``.lock``, a CSV
  file, a launcher log): the file it points to was overwritten, and ``summary.json`` left
  a link to it.
- ``checkpoint.pt`` went to the full unpickler on a resume: one from elsewhere ran code.
- A CSV line that is not UTF-8 ended a restart with a UnicodeDecodeError traceback, and
  crashed the launcher's table and plots.
- A full disk: ``swarm: error: No space left on device`` naming no file, and an empty
  ``config.json`` left in the new run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_old_versions import _torch_adam_state
from experiment.test_runner import ONE, coordinator  # noqa: F401 - a fixture
from experiment.test_runner_disk import FILL
from swarmtest import on_small_disk, reaped

from swarm.cli import _hold_folder
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import _bytes_digest, load_newest, newest_lineage, read_checkpoint_pt, write_json
from swarm.experiment.launch import Launch, read_csv, summarize, write_plots
from swarm.experiment.runner import EPISODE_FIELDS, _check_room, _keep_rows_upto, _Logs, run_peer

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"precious data\n"

# Holds argv[1] (a peer folder) as `swarm peer` does, prints "held" and keeps it until its
# stdin closes; refused, prints why and exits 2.
HOLD = """
import sys
from pathlib import Path
from swarm.cli import _hold_folder
from swarm.errors import ConfigError
try:
    _hold_folder(Path(sys.argv[1]), "peer0")
except ConfigError as e:
    print(f"refused: {e}", flush=True)
    sys.exit(2)
print("held", flush=True)
sys.stdin.read()
"""


def _holder(folder: Path, unprivileged: bool = False) -> list[str]:
    """The command that runs HOLD on ``folder``; with ``unprivileged``, without root's
    bypass of file modes (CAP_DAC_OVERRIDE), so that a mode-0444 file is read only to it."""
    cmd = [sys.executable, "-c", HOLD, str(folder)]
    if unprivileged and os.geteuid() == 0:
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *cmd]
    return cmd


def _second_holder_refused(folder: Path, unprivileged: bool = False) -> str:
    """Hold ``folder`` from one process, then try from a second: what the second printed
    (it exits 2 when refused, 0 when it held the folder too)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen(_holder(folder, unprivileged), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env=env)
    with reaped(first):
        assert first.stdout.readline().strip() == "held"
        second = subprocess.run(_holder(folder, unprivileged), stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, cwd=ROOT, env=env, timeout=60)
        first.stdin.close()
        first.wait(timeout=30)
        first.stdout.close()
    assert second.returncode == 2, (second.returncode, second.stdout, second.stderr[-2000:])
    return second.stdout


# ------------------------------------------------------------------ 1. the lock, skipped

@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="needs setpriv to drop root's bypass")
def test_a_lock_this_user_may_only_read_still_keeps_a_second_swarm_out(tmp_path):
    """Before: O_RDWR on the read-only .lock failed, nothing was held, and both processes
    wrote the folder (both `swarm peer`s exited 0, their metrics.csv rows mixed)."""
    folder = tmp_path / "run" / "peer0"
    folder.mkdir(parents=True)
    (folder / ".lock").touch()
    (folder / ".lock").chmod(0o444)
    said = _second_holder_refused(folder, unprivileged=True)
    assert f"refused: {folder}: another process writes peer0's results there now" in said, said


def test_a_lock_that_is_a_folder_still_keeps_a_second_swarm_out(tmp_path):
    folder = tmp_path / "run" / "peer0"
    (folder / ".lock").mkdir(parents=True)
    said = _second_holder_refused(folder)
    assert f"refused: {folder}: another process writes peer0's results there now" in said, said


# ------------------------------------------------------------------ 2. links planted

def _planted(link: Path, tmp_path: Path) -> Path:
    """A symbolic link at ``link`` to a file of SECRET; returns that file."""
    target = tmp_path / "victim.txt"
    target.write_bytes(SECRET)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


def test_a_link_planted_at_a_temporary_name_is_not_written_through(tmp_path):
    """write_whole's ``.NAME.tmp`` (every summary.json, run.json, best.pt, ...) and
    _check_room's ``.NAME.PID.check``. Before: the link's target got the JSON, and
    summary.json became a link to it."""
    peer = tmp_path / "peer0"
    target = _planted(peer / ".summary.json.tmp", tmp_path)
    write_json(peer / "summary.json", {"env_steps": 1}, indent=None)
    assert target.read_bytes() == SECRET
    assert not (peer / "summary.json").is_symlink()
    assert json.loads((peer / "summary.json").read_text()) == {"env_steps": 1}
    assert sorted(p.name for p in peer.iterdir()) == ["summary.json"]   # the link went, not its target

    (peer / f".run.json.{os.getpid()}.check").symlink_to(target)
    _check_room(peer / "run.json", b"x" * 100)
    assert target.read_bytes() == SECRET
    assert sorted(p.name for p in peer.iterdir()) == ["summary.json"]


def test_a_link_planted_at_the_lock_is_refused_and_its_target_left_alone(tmp_path):
    """Before: the lock was taken on the link's target, truncated and given the pid."""
    folder = tmp_path / "run" / "peer0"
    target = _planted(folder / ".lock", tmp_path)
    with pytest.raises(ConfigError) as e:
        _hold_folder(folder, "peer0")
    assert str(e.value).startswith(f"{folder / '.lock'} is a symbolic link (to {target})"), e.value
    assert target.read_bytes() == SECRET


def test_a_link_in_place_of_a_csv_file_or_a_log_is_refused_naming_it(tmp_path):
    """The peer's CSV files (opened "w" on a fresh start) and the launcher's logs. Before:
    the link's target was truncated and written."""
    out = tmp_path / "run" / "peer0"
    target = _planted(out / "metrics.csv", tmp_path)
    with pytest.raises(OSError) as e:
        _Logs(out, tensorboard=False)
    assert e.value.filename == str(out / "metrics.csv") and "symbolic link" in e.value.strerror, e.value
    assert target.read_bytes() == SECRET

    run = tmp_path / "run"
    (run / "logs").mkdir()
    (run / "logs" / "peer0.log").symlink_to(target)
    launch = Launch(run)
    try:
        with pytest.raises(OSError) as e:
            launch.start("peer0", ["--version"])
    finally:
        for c in launch.children:   # started, before: ended by its pid
            with reaped(c.proc):
                c.proc.wait(timeout=60)
    assert e.value.filename == str(run / "logs" / "peer0.log") and "symbolic link" in e.value.strerror, e.value
    assert target.read_bytes() == SECRET and launch.children == []


# ------------------------------------------------------------------ 3. checkpoint.pt unpickled

class _Plants:
    """Unpickled, it creates the file ``path`` (what a foreign checkpoint.pt could do)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_checkpoint_pt_that_would_run_code_is_refused_and_a_genuine_one_still_resumes(coordinator, tmp_path):
    """A run folder copied from elsewhere, its ckpt/ gone: a resume reads checkpoint.pt.
    Before: torch.load(weights_only=False) ran what it held (here: created a file)."""
    x = tmp_path / "x"
    first = run_peer(load_spec(None, ONE), 0, coordinator, x, tensorboard=False, join_timeout=10)
    assert first["reason"] == "budget"
    shutil.rmtree(x / "peer0" / "ckpt")
    genuine = x / "peer0" / "checkpoint.pt"
    ck = read_checkpoint_pt(genuine)
    assert {"agent", "counters", "run", "spec", "params"} <= set(ck) and ck["env_steps"] == 200, sorted(ck)
    assert newest_lineage(x / "peer0").id == ck["run"]

    # as older releases wrote it: before run ids, and with torch.optim.Adam's state (before FlatAdam)
    old = dict(ck)
    for k in ("run", "continues"):
        old.pop(k, None)
    old["agent"] = dict(ck["agent"], optimizer=_torch_adam_state([64, 64]))
    torch.save(old, tmp_path / "old.pt")
    assert read_checkpoint_pt(tmp_path / "old.pt")["env_steps"] == 200

    # a genuine one still resumes (the runner's own reading of it)
    s = run_peer(load_spec(None, ONE + ["budget.env_steps=300"]), 0, coordinator, tmp_path / "y",
                 tensorboard=False, join_timeout=10, resume_from=x)
    assert s["reason"] == "budget" and s["env_steps"] == 300 and "resumed_from" in s, s

    evil, planted = tmp_path / "evil", tmp_path / "pwned"
    shutil.copytree(x, evil)
    torch.save(dict(ck, x=_Plants(planted)), evil / "peer0" / "checkpoint.pt")
    with pytest.raises(ConfigError) as e:
        read_checkpoint_pt(evil / "peer0" / "checkpoint.pt")
    assert str(e.value).startswith(f"{evil / 'peer0' / 'checkpoint.pt'} cannot be read: not a peer's checkpoint.pt"
                                   ), e.value
    assert newest_lineage(evil / "peer0") is None
    with pytest.raises(ConfigError) as e:
        run_peer(load_spec(None, ONE + ["budget.env_steps=300"]), 0, coordinator, tmp_path / "z",
                 tensorboard=False, join_timeout=10, resume_from=evil)
    assert str(evil / "peer0" / "checkpoint.pt") in str(e.value), e.value
    assert not planted.exists()


def test_a_state_pt_that_would_run_code_is_passed_over_though_its_digest_matches(coordinator, tmp_path):
    """The digest in manifest.json is no guard: anyone can write the one that matches. Before,
    a state.pt whose digest matched went to torch's full unpickler and ran what it held."""
    x = tmp_path / "x"
    assert run_peer(load_spec(None, ONE), 0, coordinator, x, tensorboard=False, join_timeout=10)["reason"] == "budget"
    root = x / "peer0" / "ckpt"
    restored, skipped = load_newest(root)
    assert restored is not None and skipped == []
    newest = sorted(root.glob("full-*"))[-1]
    planted = tmp_path / "pwned"
    state = torch.load(newest / "state.pt", weights_only=True)
    torch.save(dict(state, x=_Plants(planted)), newest / "state.pt")
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["state.pt"] = _bytes_digest((newest / "state.pt").read_bytes())
    (newest / "manifest.json").write_text(json.dumps(manifest))
    restored, skipped = load_newest(root)
    assert any(newest.name in s and "state.pt: UnpicklingError" in s for s in skipped), skipped   # passed over, named
    assert restored is None or restored.path != newest
    assert not planted.exists()


# ------------------------------------------------------------------ 4. a CSV line not UTF-8

HEADER = ",".join(EPISODE_FIELDS) + "\r\n"


def _row(steps: int, episode: int, damaged: bool = False) -> bytes:
    row = {k: "1" for k in EPISODE_FIELDS} | {"env_steps": str(steps), "episode": str(episode),
                                              "episode_return": str(10 + episode)}
    line = ",".join(row[k] for k in EPISODE_FIELDS).encode()
    return line.replace(b"1,", b"4\xe9,", 1) + b"\r\n" if damaged else line + b"\r\n"


def test_a_csv_line_that_is_not_utf8_is_left_out_not_a_traceback(tmp_path):
    """Before: UnicodeDecodeError from _keep_rows_upto, read_csv, write_plots and summarize."""
    run = tmp_path / "run"
    (run / "peer0").mkdir(parents=True)
    path = run / "peer0" / "metrics.csv"
    path.write_bytes(HEADER.encode() + _row(100, 1) + _row(200, 2, damaged=True) + _row(300, 3) + _row(900, 4))
    assert [r["episode"] for r in read_csv(path)] == ["1", "3", "4"]
    assert summarize(run)[0]["env_steps"] == 900   # from its last whole row: it has no summary.json
    assert {p.name for p in write_plots(run)} >= {"returns.png"}

    assert _keep_rows_upto(path, 500) == 2   # the damaged line, and the one past the steps
    assert path.read_bytes() == HEADER.encode() + _row(100, 1) + _row(300, 3)


def test_a_restart_into_a_folder_whose_metrics_csv_has_a_byte_not_utf8_goes_on(coordinator, tmp_path):
    """The review's case: a resume into its own folder. Before: run_peer raised
    UnicodeDecodeError (`swarm peer`: a 39-line traceback, exit 1, restarted to the same end)."""
    x = tmp_path / "x"
    run_peer(load_spec(None, ONE), 0, coordinator, x, tensorboard=False, join_timeout=10)
    path = x / "peer0" / "metrics.csv"
    with open(path, "ab") as f:
        f.write(b"12.5,150,30,4\xe9,\r\n")
    s = run_peer(load_spec(None, ONE + ["budget.env_steps=300"]), 0, coordinator, x, tensorboard=False,
                 join_timeout=10, resume_from=x)
    assert s["reason"] == "budget" and s["env_steps"] == 300, s
    assert b"\xe9" not in path.read_bytes()
    assert all(int(r["env_steps"]) <= 300 for r in read_csv(path)) and read_csv(path)


# ------------------------------------------------------------------ 5. a full disk

# `swarm run` in argv[1], a small disk filled up (argv[2] bytes left free once it is: room
# for config.json and not for warnings.txt, or none). Prints its exit code and what runs/ holds.
FULL = FILL + """
    import json, os, sys
    from swarm import cli
    disk, free = sys.argv[1], int(sys.argv[2])
    os.chdir(disk)
    os.mkdir("runs")
    fill(".")
    os.truncate("filler", os.path.getsize("filler") - free)
    rc = cli.main(["run", "--set", "peers=2", "--set", "budget.env_steps=300"])
    left = sorted(os.path.relpath(os.path.join(d, n), "runs") for d, ds, fs in os.walk("runs") for n in ds + fs)
    print(json.dumps({"rc": rc, "left": left}))
"""


@pytest.mark.parametrize("free", [0, 4096])
def test_a_full_disk_names_the_file_and_leaves_no_empty_config_json(tmp_path, free):
    """Before: `swarm: error: No space left on device`, naming no file, and an empty
    config.json in the new run folder (a resume of it then blamed the file)."""
    assert load_spec(None, ["peers=2", "budget.env_steps=300"]).warnings()   # so warnings.txt is written
    got = on_small_disk(tmp_path, "64k", textwrap.dedent(FULL), str(free))
    assert got["rc"] == 2, got
    if free == 0:
        assert "/config.json: No space left on device" in got["log"], got["log"][-2000:]
        assert got["left"] == [], got["left"]   # the new run folder went with it
    else:
        assert "/warnings.txt: No space left on device" in got["log"], got["log"][-2000:]
        (run,) = got["left"][:1]
        assert got["left"] == [run, f"{run}/config.json"], got["left"]   # whole, and no temporary file


def test_a_refusal_names_no_pid_left_by_a_holder_that_is_gone(tmp_path):
    """A holder that could only read .lock writes no pid, so the file kept its last
    writer's: the refusal named that process, long gone (own-diff review)."""
    folder = tmp_path / "peer0"
    folder.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (folder / ".lock").write_text(f"{gone.pid}\n")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(folder / '.lock')!r}, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    with reaped(holder):
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as e:
            _hold_folder(folder, "peer0")
        assert str(e.value) == (f"{folder}: another process writes peer0's results there now; pass --run-dir DIR "
                                "for this run"), e.value
    # a live holder that wrote its own pid is still named
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        import time
        from swarm.cli import _hold_folder
        _hold_folder(Path({str(folder)!r}), "peer0")
        print("held", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
    with reaped(holder):
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"another process \(pid {holder.pid}\) writes"):
            _hold_folder(folder, "peer0")
