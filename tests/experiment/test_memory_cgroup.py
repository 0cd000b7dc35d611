"""The memory check of `swarm run` counts a container's limit: the smaller of the host's
MemAvailable and what the process's cgroup (v2 ``memory.max``, v1
``memory.limit_in_bytes``) has left. Past that limit the OOM killer ends a peer, whatever
the host has free. The tests point the check at a folder of fake /proc and cgroup files."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from swarm.errors import ConfigError
from swarm.experiment import launch as launch_mod
from swarm.experiment.launch import Launch, _available_memory, _replay_bytes, run_experiment

GB = 1024**3


def fake_host(tmp_path: Path, monkeypatch, membership: str | None, available_kb: int = GB // 1024) -> Path:
    """A /proc with ``available_kb`` of MemAvailable and ``membership`` as /proc/self/cgroup
    (None: no such file), and an empty cgroup mount; returns the mount."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    cgroup.mkdir()
    (proc / "meminfo").write_text(f"MemTotal:       {4 * available_kb} kB\nMemFree:        1000 kB\n"
                                  f"MemAvailable:   {available_kb} kB\n")
    if membership is not None:
        (proc / "self" / "cgroup").write_text(membership)
    monkeypatch.setattr(launch_mod, "PROC_ROOT", proc)
    monkeypatch.setattr(launch_mod, "CGROUP_ROOT", cgroup)
    return cgroup


def cgroup_dir(root: Path, rel: str, **files: str) -> Path:
    """A cgroup folder under ``root`` holding ``files`` (memory_max: memory.max)."""
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", ".", 1)).write_text(text)
    return d


def no_start(monkeypatch) -> list[str]:
    started: list[str] = []

    def start(self, name, *args, **kwargs):
        started.append(name)
        raise RuntimeError(f"{name} started")

    monkeypatch.setattr(Launch, "start", start)
    return started


def test_a_cgroup_v2_limit_refuses_buffers_the_host_alone_would_take(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "0::/user.slice/app.scope\n")     # 1 GiB MemAvailable
    cgroup_dir(root, "user.slice/app.scope", memory_max="8000000\n", memory_current="2000000\n",
               memory_stat="anon 1500000\nfile 500000\ninactive_file 0\n")
    assert _available_memory() == 6_000_000
    started = no_start(monkeypatch)
    each = _replay_bytes(50_000, 4)     # CartPole-v1: 5.9 MB a peer, 11.8 MB for two
    assert 2 * each < GB
    with pytest.raises(ConfigError) as e:
        run_experiment(None, ["peers=2", "buffer.capacity=50000"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert str(e.value) == (
        f"buffer.capacity = 50000: the replay buffers of the 2 peers would take about 11.8 MB (5.9 MB each, "
        f"{each / 50_000:.0f} bytes a transition of CartPole-v1), more than the 6 MB of memory this host has "
        "available; lower buffer.capacity or peers, or raise this process's cgroup memory limit (8 MB, 2 MB of "
        "it in use)")
    assert started == [] and not (tmp_path / "runs").exists()
    # a buffer within the limit (one peer, 3.3 MB) goes past the check
    with pytest.raises(RuntimeError, match="coordinator started"):
        run_experiment(None, ["peers=1", "buffer.capacity=30000"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert started == ["coordinator"]


def test_max_is_no_limit_and_the_host_figure_stays(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "0::/app\n")
    cgroup_dir(root, "app", memory_max="max\n", memory_current="2000000\n")
    assert _available_memory() == GB
    started = no_start(monkeypatch)
    with pytest.raises(RuntimeError, match="coordinator started"):
        run_experiment(None, ["peers=2", "buffer.capacity=50000"], runs_root=tmp_path / "runs", stream=io.StringIO())
    assert started == ["coordinator"]


def test_the_smaller_of_host_and_cgroup_wins(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "0::/app\n", available_kb=5_000)    # 5.12 MB free on the host
    cgroup_dir(root, "app", memory_max=str(GB), memory_current="0")
    assert _available_memory() == 5_000 * 1024


def test_an_ancestors_limit_applies_and_inactive_page_cache_is_not_in_use(tmp_path, monkeypatch):
    # a container's limit sits on its own cgroup; the process lives in a child without one
    root = fake_host(tmp_path, monkeypatch, "0::/pod/worker\n")
    cgroup_dir(root, "pod", memory_max="100000000", memory_current="70000000",
               memory_stat="anon 30000000\ninactive_file 50000000\nactive_file 1\n")
    cgroup_dir(root, "pod/worker", memory_max="max", memory_current="60000000")
    # 70 MB charged, 50 MB of it cache the kernel drops before any OOM kill: 80 MB left
    assert _available_memory() == 80_000_000
    # the tightest of several limits
    cgroup_dir(root, "pod/worker", memory_max="70000000", memory_stat="inactive_file 0\n")
    assert _available_memory() == 10_000_000


def test_a_container_whose_mount_is_its_own_cgroup(tmp_path, monkeypatch):
    # no cgroup namespace: /proc/self/cgroup names the host's path, which the mount lacks
    root = fake_host(tmp_path, monkeypatch, "0::/docker/0123abcd\n")
    cgroup_dir(root, ".", memory_max="9000000", memory_current="1000000")
    assert _available_memory() == 8_000_000
    # a path outside the namespace's view reads the mount's own cgroup only
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/../../elsewhere\n")
    assert _available_memory() == 8_000_000


def test_cgroup_v1_memory_controller(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "9:pids:/ctr\n5:cpu,cpuacct:/ctr\n4:memory:/ctr\n0::/\n")
    cgroup_dir(root, "memory/ctr", memory_limit_in_bytes="12000000\n", memory_usage_in_bytes="5000000\n",
               memory_stat="cache 3000000\ninactive_file 99\ntotal_inactive_file 1000000\n")
    assert _available_memory() == 8_000_000
    # v1's "no limit" is a number near 2**63, not "max"
    cgroup_dir(root, "memory/ctr", memory_limit_in_bytes="9223372036854771712\n")
    assert _available_memory() == GB


def test_usage_past_the_limit_leaves_nothing(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "0::/\n")
    cgroup_dir(root, ".", memory_max="1000000", memory_current="3000000")
    assert _available_memory() == 0


@pytest.mark.parametrize("case", ["no /proc/self/cgroup", "garbled membership", "no cgroup files",
                                  "no memory.current", "a limit that is no number", "usage that is no text",
                                  "folders in place of files"])
def test_missing_or_unreadable_cgroup_files_fall_back_to_memavailable(tmp_path, monkeypatch, case):
    membership = {"no /proc/self/cgroup": None, "garbled membership": "nonsense\n\n::\n"}.get(case, "0::/app\n")
    root = fake_host(tmp_path, monkeypatch, membership)
    if case == "no memory.current":
        cgroup_dir(root, "app", memory_max="1000")
    elif case == "a limit that is no number":
        cgroup_dir(root, "app", memory_max="lots\n", memory_current="1000")
    elif case == "usage that is no text":
        cgroup_dir(root, "app", memory_max="1000")
        (root / "app" / "memory.current").write_bytes(b"\xff\xfe\x00")
    elif case == "folders in place of files":
        for name in ("memory.max", "memory.current", "memory.stat"):
            (root / "app" / name).mkdir(parents=True)
    else:
        (root / "app").mkdir()
    assert _available_memory() == GB


def test_an_unreadable_memory_stat_counts_all_usage(tmp_path, monkeypatch):
    root = fake_host(tmp_path, monkeypatch, "0::/app\n")
    cgroup_dir(root, "app", memory_max="9000000", memory_current="4000000")
    (root / "app" / "memory.stat").mkdir()
    assert _available_memory() == 5_000_000
