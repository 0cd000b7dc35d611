"""Review 48, extending swarm from its docs: a ``SyncPeer`` given to an engine where its
``.peer`` belongs (accepted, then a TypeError from inside the first round); custom edges
read as ranks where the code reads positions (peers left without neighbours, silently); an
env registered only in the calling process (the spec check passed it, every peer failed);
a codec family added to ``CODECS`` (ignored without a word); an empty parameter vector
told it is read-only; a codec missing a hook failing with an empty NotImplementedError.
Real processes, sockets and files; each process is ended by its handle."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from swarmtest import ROOT

from swarm import Coordinator, Peer
from swarm.buffer import Federation, ReplayBuffer
from swarm.compress import CODECS, Codec, Encoded
from swarm.config import PeerConfig
from swarm.errors import ConfigError, ReplayError
from swarm.gossip import Gossip, GradientRelay
from swarm.gossip.sim import SimHub
from swarm.peer import BaseAgent, SyncPeer

# ------------------------------------------------------------ 1. a SyncPeer where its .peer belongs


def test_the_engines_refuse_a_sync_peer_and_name_its_peer():
    sp = SyncPeer(coordinators=["tcp://127.0.0.1:9"])   # never started: the refusal needs no swarm
    try:
        x = np.zeros(8, np.float32)
        with pytest.raises(ConfigError, match=r"SyncPeer.*pass its \.peer"):
            Gossip(sp, x)
        with pytest.raises(ReplayError, match=r"SyncPeer.*pass its \.peer"):
            Federation(ReplayBuffer({"x": ("<f4", (2,))}, 16), sp)
        with pytest.raises(ConfigError, match=r"SyncPeer.*pass its \.peer"):
            GradientRelay(sp, 8)
        assert not x.any()
    finally:
        sp.close()


def test_a_link_whose_send_blocks_is_refused_when_the_engine_is_built():
    link = SimHub(topology="ring").add_many(2)[0]

    class Blocking:
        id, view = link.id, link.view
        neighbours, on, on_view = link.neighbours, link.on, link.on_view

        def send(self, *a, **kw) -> bool:
            return True

    with pytest.raises(ConfigError, match=r"link\.send of Blocking is not a coroutine function"):
        Gossip(Blocking(), np.zeros(4, np.float32))
    Gossip(link, np.zeros(4, np.float32)).close()   # the real one still builds


# ------------------------------------------------------------ 2. custom edges are over positions


def test_the_edges_help_says_positions_not_ranks():
    help_ = {f.name: f.metadata["help"] for f in dataclasses.fields(PeerConfig)}["edges"]
    assert "positions in the view" in help_ and "not over ranks" in help_


async def _custom_swarm(edges: list[list[int]], join_timeout_s: float, check) -> None:
    """A coordinator and peers of ranks 0, 3 and 5 on a custom graph of ``edges``, started
    and waited for in a view of 3; ``check(peers)`` is awaited, then everything closed."""
    coord = Coordinator(bind="tcp://127.0.0.1:*", http_bind="")
    await coord.start()
    peers = [Peer(coordinators=[coord.address], id=f"c{r}", rank=r, topology="custom", edges=edges,
                  join_timeout_s=join_timeout_s) for r in (0, 3, 5)]
    try:
        for p in peers:
            await p.start()
        for p in peers:
            await p.wait_view(lambda v: len(v.members) == 3, timeout=20)
        await check(peers)
    finally:
        for p in peers:
            await p.close()
        await coord.close()


def test_custom_edges_that_leave_a_peer_alone_are_warned_of(caplog):
    # ranks 0, 3, 5 with edges written over the ranks: positions 0-1-2 take [[0,3],[3,5]]
    # as edges past the view, so nobody had a neighbour, and nothing was logged
    def warned() -> set[str]:
        return {r.getMessage().split(":")[0] for r in caplog.records
                if r.levelno == logging.WARNING and "not over ranks" in r.getMessage()}

    async def check(peers: list[Peer]) -> None:
        while len(warned()) < 3:
            await asyncio.sleep(0.05)
        assert warned() == {"peer c0", "peer c3", "peer c5"}
        assert all(p.neighbours() == [] for p in peers)

    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        asyncio.run(asyncio.wait_for(_custom_swarm([[0, 3], [3, 5]], 1.0, check), 60))


def test_custom_edges_over_positions_link_and_warn_of_nothing(caplog):
    async def check(peers: list[Peer]) -> None:
        await asyncio.sleep(1.5)   # past join_timeout_s
        assert [p.neighbours() for p in peers] == [["c3"], ["c0", "c5"], ["c3"]]

    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        asyncio.run(asyncio.wait_for(_custom_swarm([[0, 1], [1, 2]], 0.5, check), 60))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# ------------------------------------------------------------ 3. an env registered in this process only


def test_an_env_registered_only_in_the_calling_process_is_refused_before_anything_starts(tmp_path):
    # run_experiment's check passed it; every peer then failed: "not a registered
    # Gymnasium environment", with no word of module:EnvId. A spec alone still loads (a
    # peer knows what its own registry holds, and asks no other process)
    script = textwrap.dedent("""
        import io, sys, gymnasium as gym
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv
        class Local(CartPoleEnv):
            pass
        gym.register("Local-v0", entry_point=Local, max_episode_steps=50)
        gym.register("LocalText-v0", entry_point="__main__:Local", max_episode_steps=50)
        # Gymnasium's own class under an id of this process (own-diff review: passed)
        gym.register("LocalGym-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     max_episode_steps=200)
        from swarm.errors import ConfigError
        from swarm.experiment import load_spec, run_experiment
        for env in ("Local-v0", "LocalText-v0", "LocalGym-v0"):
            load_spec(None, ["env=" + env, "peers=2"])
            try:
                run_experiment(None, ["env=" + env, "peers=2"], runs_root="runs", stream=io.StringIO())
            except ConfigError as e:
                print("refused:", e)
            else:
                print("accepted:", env)
        print("cartpole ok")
    """)
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 4 and lines[-1] == "cartpole ok", res.stdout
    for line, env in zip(lines, ("Local-v0", "LocalText-v0", "LocalGym-v0")):
        assert line.startswith(f"refused: env = '{env}' is registered in this process only") \
            and "module:EnvId" in line, line
    assert not (tmp_path / "runs").exists()   # refused before a run folder was made


def test_a_peer_loads_a_spec_of_an_env_its_own_process_registers_without_asking_another(tmp_path):
    # the check started a Python per load_spec for such an id (one in each peer, ~0.2-0.5 s;
    # performance review); a sitecustomize registers it here, as a plugin's .pth would
    (tmp_path / "sitecustomize.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('SiteCart-v0', entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv',"
        " max_episode_steps=100)\n")
    script = textwrap.dedent("""
        import subprocess
        from swarm.experiment import load_spec
        from swarm.experiment.spec import check_env_for_peers
        started = []
        run = subprocess.run
        subprocess.run = lambda *a, **kw: started.append(a) or run(*a, **kw)
        load_spec(None, ["env=SiteCart-v0", "peers=2"])
        print("spec", len(started))
        check_env_for_peers("SiteCart-v0")   # the peers have it too: accepted, asked once
        check_env_for_peers("SiteCart-v0")
        print("launch", len(started))
    """)
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["spec", "0", "launch", "1"], res.stdout


def test_an_unknown_env_id_is_told_the_module_form():
    from swarm.experiment import load_spec

    with pytest.raises(ConfigError, match=r"not a registered Gymnasium environment.*module:EnvId"):
        load_spec(None, ["env=NoSuchEnvAnywhere-v0"])


# ------------------------------------------------------------ 4-6. codecs and empty parameters


def test_the_codec_families_are_read_only():
    with pytest.raises(TypeError):
        CODECS["half"] = CODECS["identity"]     # type: ignore[index]
    assert "half" not in CODECS


def test_a_codec_without_a_hook_names_the_hook_and_itself():
    class OnlyEncode(Codec):
        name = "onlyenc"

        def _encode(self, x):
            return Encoded({"codec": self.name, "n": int(x.size)}, [x.copy()])

    c = OnlyEncode()
    enc = c.encode(np.arange(10, dtype=np.float32))
    with pytest.raises(NotImplementedError, match=r"OnlyEncode \(codec 'onlyenc'\) must implement _frame_specs"):
        c.decode(enc)


def test_an_agent_with_nothing_to_learn_is_told_its_vector_is_empty():
    class NoParams(BaseAgent):
        def perceive(self, o): ...
        def deliberate(self): return 0
        def reflect(self, r, t, **kw): ...

    link = SimHub(topology="ring").add_many(2)[0]
    with pytest.raises(ConfigError, match="params is empty") as e:
        Gossip(link, NoParams().parameters())
    assert "copy" not in str(e.value)
