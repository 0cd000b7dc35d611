"""`swarm launch` argument handling (no Ray needed: the launcher is replaced or Ray hidden)."""

from __future__ import annotations

import sys

import pytest

from swarm import cli
from swarm.errors import ConfigError
from swarm.experiment import ray_launch


@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple] = []

    def fake(spec, overrides, address, **kw):
        seen.append((spec, overrides, address, kw))
        return 0

    monkeypatch.setattr(ray_launch, "launch_ray", fake)
    return seen


def test_ray_address_and_spec(calls, tmp_path):
    assert cli.main(["launch", "--ray", "ray://head:10001", "s.toml", "--per-node", "3",
                     "--set", "budget.env_steps=10"]) == 0
    assert calls == [("s.toml", ["budget.env_steps=10"], "ray://head:10001",
                      {"per_node": 3, "cpus_per_peer": 1.0, "host": None, "verbose": 0})]


def test_ray_without_address_takes_the_spec_as_spec(calls, tmp_path):
    # `--ray spec.toml`: the optional ADDRESS must not swallow the spec
    assert cli.main(["launch", "--ray", "my.toml"]) == 0
    assert calls[-1][:3] == ("my.toml", [], None)
    assert cli.main(["launch", "--ray"]) == 0           # default spec, local or RAY_ADDRESS
    assert calls[-1][:3] == (None, [], None)


def test_launch_needs_an_engine(calls, capsys):
    assert cli.main(["launch", "s.toml"]) == 2
    assert "--ray" in capsys.readouterr().err
    assert calls == []


def test_without_ray_installed_the_error_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)       # `import ray` raises ImportError
    assert cli.main(["launch", "--ray", "auto"]) == 2
    assert "pip install 'ray>=2.9'" in capsys.readouterr().err


def test_bad_per_node_is_refused_before_ray_is_touched(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match="--per-node must be >= 1"):
        ray_launch.launch_ray(None, [], per_node=0)
    with pytest.raises(ConfigError, match="--cpus-per-peer must be > 0"):
        ray_launch.launch_ray(None, [], cpus_per_peer=float("nan"))
    with pytest.raises(ConfigError, match="peers: expected an integer"):   # the spec before Ray
        ray_launch.launch_ray(None, ["peers=abc"])
