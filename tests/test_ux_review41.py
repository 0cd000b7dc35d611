"""What a newcomer met first: the README's Python example, overrides given as a string,
the join's log about a refused handshake, and the gossip engine's error for a tensor."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import numpy as np
import pytest
from swarmtest import ROOT

from swarm.config import load_config
from swarm.coordinator import Coordinator
from swarm.errors import ConfigError, MembershipError
from swarm.experiment import load_spec, run_experiment
from swarm.gossip import Gossip
from swarm.gossip.sim import SimHub
from swarm.peer import Peer
from swarm.transport import generate_keys


def _readme_python_example() -> str:
    """The first ```python block under README's "Use it from Python"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_example_run_twice_prints_one_line_in_each(procs, tmp_path):
    # it sent to peer.neighbours() as soon as `async with peer:` joined, before a view
    # listed the other copy: two copies started together printed one line, not two
    coord = procs.coordinator(None)
    code = _readme_python_example().replace("tcp://127.0.0.1:5555", coord.addr)
    assert coord.addr in code
    script = tmp_path / "example.py"
    script.write_text(code)
    copies = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=60) for p in copies]
    finally:
        for p in copies:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(copies, outs):
        assert p.returncode == 0, err
        assert len(out.splitlines()) == 1 and "{'round': 1}" in out, (out, err)


@pytest.mark.parametrize("load", [
    lambda o: load_spec(None, o),
    lambda o: run_experiment(None, o),
    lambda o: load_config(None, o),
], ids=["load_spec", "run_experiment", "load_config"])
def test_overrides_given_as_one_string_are_refused_as_such(load, tmp_path, monkeypatch):
    # the string was split into characters: "--set 'p': expected KEY=VALUE", naming a
    # flag the Python caller never used
    monkeypatch.chdir(tmp_path)   # where run_experiment would make runs/, had it accepted
    with pytest.raises(ConfigError, match=r"^overrides must be a list of 'a.b=v' strings, got str"):
        load("peers=2")
    assert not (tmp_path / "runs").exists()


def test_overrides_in_a_generator_are_refused():
    # load_config took them, and load_spec too (it made a list of them), but show_spec
    # reads them twice and found the generator empty the second time
    with pytest.raises(ConfigError, match=r"^overrides must be a list of 'a.b=v' strings, got generator"):
        load_config(None, (o for o in ["peer.rank=2"]))


def test_an_override_that_is_not_a_string_is_a_config_error():
    # `"=" not in 2` raised a bare TypeError
    with pytest.raises(ConfigError, match=r"overrides must be 'a.b=v' strings, got int 2"):
        load_config(None, ["peer.rank=2", 2])


def test_overrides_as_a_list_or_tuple_still_apply():
    assert load_spec(None, ("peers=3",)).peers == 3
    assert load_config(None, ["peer.rank=2"]).peer.rank == 2


def test_a_join_refused_in_the_handshake_does_not_promise_to_dial_until_it_succeeds(tmp_path, caplog):
    # the log said "Dialling it again, every 10 s at most, until it succeeds", and the
    # peer gave up on its join deadline a moment later
    caplog.set_level("ERROR", logger="swarm.peer")
    keys = tmp_path / "keys"
    generate_keys(str(keys), ["coordinator", "peer"])

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(keys), http_bind="") as coord:
            with pytest.raises(MembershipError, match="it runs with --keys and this peer without them"):
                async with Peer(id="p", coordinators=[coord.address], join_timeout_s=1.0):
                    pass

    asyncio.run(main())
    [line] = [r.getMessage() for r in caplog.records if "the handshake with coordinator" in r.getMessage()]
    assert "until it succeeds" not in line, line
    assert line.endswith("until the join deadline (peer.join_timeout_s = 1 s)"), line


@pytest.mark.parametrize("params, said", [
    ([0.0] * 10, r"got list$"),
    (np.zeros(10), r"got ndarray float64 shape \(10,\)$"),
], ids=["list", "float64"])
def test_params_of_the_wrong_type_are_named(params, said):
    # a list read "got list  shape " (empty fields)
    link = SimHub(topology="ring").add_many(1)[0]
    with pytest.raises(ConfigError, match=r"^params must be a writeable 1-D contiguous float32 numpy array, "
                                          + said):
        Gossip(link, params)


def test_a_torch_tensor_as_params_gets_told_what_to_pass():
    # it read "got Tensor torch.float32 shape torch.Size([10])", with no hint
    torch = pytest.importorskip("torch")
    link = SimHub(topology="ring").add_many(1)[0]
    with pytest.raises(ConfigError, match=r"got Tensor torch.float32 shape torch.Size\(\[10\]\): for a model, pass "
                                          r"swarm.gossip.flat_parameters\(model\); for a tensor, tensor.numpy\(\) "
                                          r"of a contiguous float32 CPU one$"):
        Gossip(link, torch.zeros(10))
