"""The launchers' files are written whole or not at all, a run folder's stray folders
are left out of its summary and plots, and `swarm launch --ray` refuses a --host that
peers cannot dial and says the bounds of --cpus-per-peer. No Ray and no run: the
ending of a Ray launch is tested as the function it calls."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import types
from pathlib import Path
from typing import Iterator

import pytest

from swarm.errors import ConfigError
from swarm.experiment import ray_launch
from swarm.experiment.launch import Launch, _Child, _warn, summarize, write_plots
from swarm.experiment.spec import load_spec


@contextlib.contextmanager
def disk_full_after(nbytes: int) -> Iterator[None]:
    """Within it, writing past ``nbytes`` of any file fails (EFBIG) as on a full disk:
    a file written in place is left cut at ``nbytes``. SIGXFSZ, which would kill the
    test process, is ignored meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_pids_json_on_a_full_disk_keeps_its_previous_version(tmp_path):
    """pids.json was rewritten in place on each child's start: a full disk (or a kill)
    left half of it, and a user lost the pids to clean up after a killed launcher."""
    launch = Launch(tmp_path)
    launch.children.append(_Child("coordinator", types.SimpleNamespace(pid=101), tmp_path / "c.log"))
    launch._write_pids()
    before = (tmp_path / "pids.json").read_text()
    launch.children += [_Child(f"peer{r}", types.SimpleNamespace(pid=200 + r), tmp_path / "p.log")
                        for r in range(20)]
    with pytest.raises(OSError), disk_full_after(len(before)):
        launch._write_pids()
    assert (tmp_path / "pids.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pids.json"]   # no temporary file left behind
    launch._write_pids()
    assert json.loads((tmp_path / "pids.json").read_text())["children"]["peer19"] == 219


def test_warnings_txt_on_a_full_disk_is_not_left_half_written(tmp_path):
    spec = types.SimpleNamespace(warnings=lambda: [f"setting {i} does nothing in this run" for i in range(10)])
    with pytest.raises(OSError), disk_full_after(40):
        _warn(spec, tmp_path, io.StringIO(), "swarm run")
    assert list(tmp_path.iterdir()) == []
    _warn(spec, tmp_path, io.StringIO(), "swarm run")
    assert (tmp_path / "warnings.txt").read_text().splitlines() == spec.warnings()


def test_a_ray_launchs_summaries_on_a_full_disk_keep_their_previous_versions(tmp_path):
    """The peers' summaries Ray handed back, and the run's summary.json, were written in
    place: a full disk left them cut short, where `swarm run` leaves the previous one."""
    spec = load_spec(None, ["peers=2"])
    (tmp_path / "peer0").mkdir()
    (tmp_path / "peer0" / "summary.json").write_text(json.dumps({"rank": 0, "id": "peer0", "reason": "budget"}))
    summaries = {r: {"rank": r, "id": f"peer{r}", "reason": "budget", "notes": "x" * 500} for r in range(2)}
    with pytest.raises(OSError), disk_full_after(100):   # peer1's, from a node without our file system
        ray_launch._write_results(tmp_path, spec, summaries, {})
    assert not (tmp_path / "peer1" / "summary.json").exists()   # none rather than a torn one
    (tmp_path / "peer1").mkdir(exist_ok=True)
    (tmp_path / "peer1" / "summary.json").write_text(json.dumps(summaries[1]))
    (tmp_path / "summary.json").write_text("[]\n")
    with pytest.raises(OSError), disk_full_after(100):   # the run's
        ray_launch._write_results(tmp_path, spec, summaries, {})
    assert (tmp_path / "summary.json").read_text() == "[]\n"
    (tmp_path / "peer1" / "summary.json").unlink()
    rows = ray_launch._write_results(tmp_path, spec, summaries, {"peer1": "failed: RayActorError: gone"})
    assert json.loads((tmp_path / "summary.json").read_text()) == rows
    assert [(r["id"], r["reason"]) for r in rows] == [("peer0", "budget"), ("peer1", "failed: RayActorError: gone")]
    assert json.loads((tmp_path / "peer1" / "summary.json").read_text()) == summaries[1]


def _run_folder_with_strays(run: Path) -> None:
    for r in range(2):
        (run / f"peer{r}").mkdir(parents=True)
        (run / f"peer{r}" / "metrics.csv").write_text(f"env_steps,mean_return\n10,{r + 1}\n")
    for stray in ["peer0-old", "peer\u00b2", "peer", "peer01", "peers.txt"]:
        (run / stray).mkdir()


def test_summarize_leaves_out_folders_that_are_not_a_peers(tmp_path):
    """``peer²`` passed str.isdigit and then failed int(); ``peer01`` was read as peer1's."""
    _run_folder_with_strays(tmp_path)
    assert [(r["id"], r["final_mean_return"]) for r in summarize(tmp_path)] == [("peer0", 1.0), ("peer1", 2.0)]


def test_write_plots_leaves_out_folders_that_are_not_a_peers(tmp_path):
    """``peer0-old/`` (a user's copy) made int() fail: no plots at the end of the run."""
    pytest.importorskip("matplotlib")
    _run_folder_with_strays(tmp_path)
    names = [p.name for p in write_plots(tmp_path)]
    assert names == ["returns.png", "bytes_per_round.png", "consensus.png"]


@pytest.mark.parametrize("host", ["0.0.0.0", "0"])
def test_launch_ray_refuses_an_unspecified_host(tmp_path, host):
    """--host 0.0.0.0 passed as an IPv4 address, and tcp://0.0.0.0:PORT went to every
    peer actor as the coordinator's address: one on another node dials itself."""
    with pytest.raises(ConfigError) as e:
        ray_launch.launch_ray(None, [], host=host, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (f"--host {host!r} is no address to dial: the peers connect to the coordinator "
                            "at it; give this machine's IPv4 address or host name (127.0.0.1 on one "
                            "machine), or leave --host out to use each node's Ray address")
    assert not (tmp_path / "runs").exists()


def test_launch_ray_says_the_upper_bound_of_cpus_per_peer(tmp_path):
    with pytest.raises(ConfigError) as e:
        ray_launch.launch_ray(None, [], cpus_per_peer=2000, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == "--cpus-per-peer must be > 0 and at most 1024, got 2000"
