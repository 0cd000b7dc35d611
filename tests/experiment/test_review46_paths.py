"""Review 46: run folders under names TensorBoard cannot encode, ``~`` in a path given
in an ``--opt=~/x`` word, and a ``runs`` folder that is a link to a missing target.

TensorBoard's writer turns a file name into bytes as UTF-8, not as the file system
does (os.fsencode): under a Latin-1 locale a non-ASCII run folder named another file
(FileNotFoundError), and under a UTF-8 one a name holding Latin-1 bytes could not be
encoded at all (UnicodeEncodeError); either way every peer died at its start, the
first reported as a full disk. Bash expands ``~`` only at the start of a word: with
``--out=~/x`` swarm was given a literal ``~`` and made a folder of that name in the
current folder. A ``runs`` link whose target was gone was taken for a run folder of
every name: "cannot make a fresh run folder" after 100 tries.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture
from test_scripts_review42_cohost import _run

from swarm.errors import SwarmError
from swarm.experiment import load_spec, run_experiment
from swarm.experiment.launch import new_run_dir
from swarm.experiment.runner import _Logs, run_peer

ROOT = Path(__file__).resolve().parents[2]
ONE = ["peers=1", "budget.env_steps=200", "dqn.learning_starts=50", "dqn.batch_size=16",
       "eval.every=0", "gossip.codec=identity", "gossip.step_size=1.0"]
#: a folder name holding Latin-1 bytes ("été"), as a name copied from an old disk has
LATIN1_NAME = os.fsdecode(b"runs-\xe9t\xe9")


def _utf8_file_names() -> None:
    if sys.getfilesystemencoding() != "utf-8":
        pytest.skip("the test names a folder by its Latin-1 bytes under a UTF-8 locale")


def _scalars(tb: Path, copy_to: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files in ``tb``, read from copies in ``copy_to`` (an ASCII
    folder: TensorBoard's reader has the writer's trouble with other names)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    copy_to.mkdir()
    for f in os.listdir(tb):
        shutil.copy(tb / f, copy_to / f)
    acc = EventAccumulator(str(copy_to))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_writes_under_a_folder_whose_name_is_not_utf8(tmp_path):
    pytest.importorskip("tensorboard")
    _utf8_file_names()
    out = tmp_path / LATIN1_NAME / "peer0"
    logs = _Logs(out)
    try:
        assert logs.tb is not None
        logs.scalars(5, {"episode/return": 12.5})
        logs.scalars(9, {"episode/return": 20.0})
    finally:
        logs.close()
    # a restart from the checkpoint at step 5 hides what the first wrote past it
    again = _Logs(out, append=True, upto=5)
    try:
        again.scalars(8, {"episode/return": 15.0})
    finally:
        again.close()
    assert _scalars(out / "tb", tmp_path / "copy") == {"episode/return": [(5, 12.5), (8, 15.0)]}


def _latin1_locale(tmp_path: Path) -> dict[str, str]:
    """The environment of a process under a Latin-1 locale, built here (skips where it cannot be)."""
    if shutil.which("localedef") is None:
        pytest.skip("no localedef to build a Latin-1 locale")
    loc = tmp_path / "locales"
    loc.mkdir()
    made = subprocess.run(["localedef", "-i", "en_US", "-f", "ISO-8859-1", str(loc / "en_US.ISO-8859-1")],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"cannot build a Latin-1 locale: {made.stderr.strip()}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "PYTHONIOENCODING")}
    env.update(LOCPATH=str(loc), LANG="en_US.ISO-8859-1", LC_ALL="en_US.ISO-8859-1", PYTHONPATH=str(ROOT))
    took = subprocess.run([sys.executable, "-c", "import sys; print(sys.getfilesystemencoding())"], env=env,
                          capture_output=True, text=True, timeout=60).stdout.strip()
    if took != "iso8859-1":
        pytest.skip(f"the Latin-1 locale built did not take (file names: {took})")
    return env


def test_tensorboard_writes_under_a_non_ascii_folder_in_a_latin1_locale(tmp_path):
    """There the name's UTF-8 bytes, read as Latin-1, are other characters, which
    TensorBoard encoded again: the file it opened was in a folder that is not there."""
    pytest.importorskip("tensorboard")
    _utf8_file_names()   # this process reads what the other wrote
    name = "runs 日本 é".encode()
    child = textwrap.dedent("""
        import os, sys
        from pathlib import Path
        from swarm.experiment.runner import _Logs
        logs = _Logs(Path(sys.argv[1]) / os.fsdecode(bytes.fromhex(sys.argv[2])) / "peer0")
        try:
            logs.scalars(7, {"episode/return": 3.0})
        finally:
            logs.close()
    """)
    p = subprocess.run([sys.executable, "-c", child, str(tmp_path), name.hex()], env=_latin1_locale(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    tb = tmp_path / os.fsdecode(name) / "peer0" / "tb"
    assert _scalars(tb, tmp_path / "copy") == {"episode/return": [(7, 3.0)]}


def test_a_peer_trains_into_a_run_folder_whose_name_is_not_utf8(coordinator, tmp_path):  # noqa: F811
    pytest.importorskip("tensorboard")
    _utf8_file_names()
    run_dir = tmp_path / LATIN1_NAME
    summary = run_peer(load_spec(None, ONE), 0, coordinator, run_dir, join_timeout=20)
    assert summary["reason"] == "budget" and summary["env_steps"] == 200, summary
    assert list((run_dir / "peer0" / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert (run_dir / "peer0" / "metrics.csv").is_file()


# ------------------------------------------------------------------------- ~ in a path


def test_run_experiment_expands_a_runs_root_under_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    told = io.StringIO()
    r = run_experiment(None, ONE, runs_root="~/swarm-runs", stream=told)
    assert r.exit_code == 0, told.getvalue()
    assert r.run_dir.parent == home / "swarm-runs", r.run_dir
    assert str(home / "swarm-runs") in told.getvalue()   # the folder it says it writes to is that one
    assert not (tmp_path / "~").exists()


def test_compare_runs_expands_an_out_under_home(tmp_path):
    """``--out=~/cmp`` names $HOME/cmp: here a file, which is refused by its own name."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (home / "cmp").write_text("a file\n")
    res = _run("compare_runs", "codec", "--only", "fp16", "--steps", "500", "--set", "peers=1",
               "--out=~/cmp", cwd=cwd, timeout=120, env={**os.environ, "HOME": str(home)})
    assert res.returncode == 2, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert f"--out {home / 'cmp'}: is a file, not a folder" in res.stderr, res.stderr
    assert os.listdir(cwd) == []


# ------------------------------------------------------------- a runs link to nowhere


@pytest.mark.parametrize("root", ["runs", "scratch/runs"])
def test_a_runs_link_whose_target_is_missing_is_named_with_its_target(tmp_path, root):
    link = tmp_path / root.split("/")[0]
    target = tmp_path / "mnt" / "scratch-not-mounted" / "runs"
    link.symlink_to(target)
    with pytest.raises(SwarmError) as e:
        new_run_dir(tmp_path / root, "cartpole-ring")
    assert f"cannot create the run folder {tmp_path / root}/cartpole-ring-" in str(e.value)
    assert str(e.value).endswith(f": {link} is a symbolic link to {target}, which does not exist"), e.value
    assert os.listdir(tmp_path) == [link.name] and not target.parent.exists()   # nothing made


def test_swarm_run_names_a_runs_link_whose_target_is_missing(tmp_path):
    (tmp_path / "runs").symlink_to("/nonexistent-scratch/runs")
    p = subprocess.run([sys.executable, "-m", "swarm.cli", "run", "--set", "peers=1"], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "runs is a symbolic link to /nonexistent-scratch/runs, which does not exist" in p.stderr, p.stderr


def test_a_run_name_taken_in_the_same_second_still_gets_the_next_one(tmp_path):
    """Only the run folder's own "exists" means that its name is taken."""
    first = new_run_dir(tmp_path / "runs", "x")
    second = new_run_dir(tmp_path / "runs", "x")
    assert first != second and first.parent == second.parent == tmp_path / "runs"
