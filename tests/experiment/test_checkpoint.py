"""Checkpoints: full + incremental restore exactly; kill -9 → resume restores the last one bit for bit."""

from __future__ import annotations

import json
import re
import shutil
import signal

import numpy as np
import pytest
from swarmtest import status, wait_for

from swarm.buffer import ReplayBuffer
from swarm.buffer.persist import load_incremental, save_incremental
from swarm.errors import ConfigError, ReplayError
from swarm.experiment import load_spec
from swarm.experiment.checkpoint import Checkpointer, latest, load_checkpoint, state_digest
from swarm.experiment.runner import run_peer
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import run_agent


def _agent(capacity: int = 300, seed: int = 0) -> DQNAgent:
    buf = ReplayBuffer(dqn_schema((4,)), capacity, seed=seed, peer_id="peer0")
    cfg = DQNConfig(learning_starts=20, batch_size=8, hidden=[16])
    return DQNAgent((4,), 2, buf, cfg, seed=seed)


def _train(agent: DQNAgent, steps: int, ck: Checkpointer | None = None, seed: int = 0) -> None:
    def on_step(info):
        if ck is not None:
            ck.step(info.step)
    run_agent("CartPole-v1", agent, steps, seed=seed, on_step=on_step)


def test_incremental_buffer_snapshot_round_trip_and_refusals(tmp_path):
    buf = ReplayBuffer({"x": ("float32", (3,))}, 16, seed=1, decay=0.01)
    buf.add({"x": np.ones((5, 3), np.float32)})
    buf.save(tmp_path / "full")
    buf.add({"x": np.full((7, 3), 2, np.float32)})      # wraps nothing yet
    buf.update_priorities(np.arange(0, 5), np.linspace(0.1, 3, 5))   # touches rows of the full one
    assert save_incremental(buf, tmp_path / "inc", since=5) == 7
    back = load_incremental(ReplayBuffer.load(tmp_path / "full"), tmp_path / "inc")
    from swarm.buffer.persist import digest
    assert digest(back) == digest(buf)
    # applying it to the wrong base changes nothing and says why
    other = ReplayBuffer.load(tmp_path / "full")
    other.add({"x": np.zeros((1, 3), np.float32)})
    before = digest(other)
    with pytest.raises(ReplayError, match="another full snapshot"):
        load_incremental(other, tmp_path / "inc")
    assert digest(other) == before
    buf.add({"x": np.zeros((20, 3), np.float32)})
    with pytest.raises(ReplayError, match="more than capacity"):
        save_incremental(buf, tmp_path / "inc2", since=5)


def test_full_then_incremental_restores_agent_and_buffer_exactly(tmp_path):
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps},
                      full_every_steps=120, incremental_every_steps=40)
    _train(agent, 200, ck)
    ck._wait_pending() if ck._pending else None
    name = ck.written[-1]
    newest = latest(tmp_path / "ckpt")
    assert newest is not None and newest.name == name
    # one full and its increments only: older full ones were dropped once the new one was committed
    fulls = [p.name for p in (tmp_path / "ckpt").iterdir() if "-inc-" not in p.name]
    assert len(fulls) == 1, fulls
    inc = ck.incremental()
    want = state_digest(agent.parameters(), agent.buffer)
    want_opt = agent.optimizer.state_dict()
    r = load_checkpoint(tmp_path / "ckpt" / inc)
    assert r.manifest["kind"] == "incremental" and r.manifest["digest"] == want
    fresh = _agent(seed=5)               # other seed: other weights and RNG until restored
    fresh.buffer = r.buffer
    r.apply(fresh)
    assert np.array_equal(fresh.parameters().view(np.uint32), agent.parameters().view(np.uint32))
    assert state_digest(fresh.parameters(), r.buffer) == want
    got_opt = fresh.optimizer.state_dict()
    assert want_opt["t"] == got_opt["t"] > 0
    for name_ in ("exp_avg", "exp_avg_sq"):
        assert want_opt[name_].equal(got_opt[name_])
    assert fresh.steps == agent.steps and fresh.rng.bit_generator.state == agent.rng.bit_generator.state


def test_a_half_written_checkpoint_is_never_picked(tmp_path):
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    first = ck.full(background=False)
    (tmp_path / "ckpt" / ".tmp-full-000002").mkdir()                 # a crash in the middle of a write
    (tmp_path / "ckpt" / "full-000009").mkdir()                      # no manifest: not committed
    assert latest(tmp_path / "ckpt").name == first
    with pytest.raises(ConfigError, match="cannot be read"):
        load_checkpoint(tmp_path / "ckpt" / "full-000009")



@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "foreign", "base truncated"])
def test_a_damaged_checkpoint_is_a_clear_error(tmp_path, damage):
    """A state.pt torn or replaced after its commit (a disk, a hand) is a ConfigError
    that names the checkpoint, never a raw RuntimeError from torch."""
    import torch

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    full = tmp_path / "ckpt" / ck.full(background=False)
    inc = tmp_path / "ckpt" / ck.incremental()
    target = full / "state.pt" if damage == "base truncated" else inc / "state.pt"
    data = target.read_bytes()
    if damage == "foreign":
        torch.save({"what": "else"}, target)
    else:
        target.write_bytes({"empty": b"", "garbage": b"not a checkpoint" * 10}.get(damage, data[:len(data) // 2]))
    with pytest.raises(ConfigError, match=f"checkpoint {inc}"):
        load_checkpoint(inc)


def test_a_damaged_checkpoint_is_skipped_for_the_next_older_one(tmp_path, caplog):
    """load_newest: a checkpoint damaged after its commit is skipped with a warning that
    names it, for its earlier increments, its full one, then an older full one still
    there (a crash cut the pruning short); damaged ones stay, and a later full
    checkpoint is numbered past them and prunes them as usual."""
    import shutil

    from swarm.experiment.checkpoint import load_newest

    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    shutil.copytree(root / ck.full(background=False), tmp_path / "older")   # full-000001 at 30 steps
    _train(agent, 20)
    full = root / ck.full(background=False)                                   # full-000002, prunes 000001
    incs = [root / ck.incremental() for _ in range(2)]
    shutil.copytree(tmp_path / "older", root / "full-000001")                 # the pruning never happened

    def tear(f):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    tear(incs[1] / "state.pt")
    caplog.set_level("WARNING", logger="swarm.experiment")
    r, skipped = load_newest(root)
    assert r.path == incs[0] and len(skipped) == 1 and str(incs[1]) in skipped[0]
    assert f"checkpoint {incs[1]} cannot be read" in caplog.text
    tear(full / "state.pt")           # its increments need it too: back to the older full one
    r, skipped = load_newest(root)
    assert r.path == root / "full-000001" and r.counters["env_steps"] == 30
    assert [s.split(" cannot")[0].split(":")[0] for s in skipped] == [f"checkpoint {p}" for p in [*incs[::-1], full]]
    (root / "full-000001" / "buffer" / "meta.json").write_text("{")
    r, more = load_newest(root)
    assert r is None and more[:3] == skipped and more[3].startswith(f"checkpoint {root / 'full-000001'}: replay")
    assert sorted(p.name for p in root.iterdir()) == ["full-000001", "full-000002", "full-000002-inc-0001",
                                                       "full-000002-inc-0002"]   # left for inspection
    again = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    assert again.full(background=False) == "full-000003"
    assert [p.name for p in root.iterdir()] == ["full-000003"] and load_newest(root)[0].path == root / "full-000003"


KILL = ["peers=1", "budget.env_steps=1000000", "dqn.learning_starts=50", "dqn.batch_size=16", "dqn.hidden=[32]",
        "eval.every=0", "gossip.codec=identity", "gossip.step_size=1.0", "buffer.capacity=3000",
        "checkpoint.full_every_s=0", "checkpoint.full_every_steps=600", "checkpoint.incremental_every_steps=150"]


def test_sigkill_then_resume_restores_parameters_and_buffer_bit_for_bit(procs, tmp_path):
    from swarm.experiment.spec import save_resolved

    addr = procs.coordinator(None, name="coordinator").addr   # its log if it fails to answer
    spec = load_spec(None, KILL)
    cfg = save_resolved(spec, tmp_path / "spec.json")
    run = tmp_path / "run"
    p = procs.start("peer", "--spec", str(cfg), "--rank", "0", "--coordinator", addr, "--run-dir", str(run),
                    name="peer0")
    ckpt = run / "peer0" / "ckpt"

    def two_increments_past_a_full_one():
        newest = latest(ckpt)
        return newest is not None and "full-000002-inc-0002" <= newest.name

    wait_for(two_increments_past_a_full_one, timeout=90, what="an incremental checkpoint after the second full one")
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    newest = latest(ckpt)
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["kind"] == "incremental"
    assert not (run / "peer0" / "checkpoint.pt").exists()     # it never reached its clean exit

    # The files alone give back the state the process hashed when it took the checkpoint.
    r = load_checkpoint(newest)
    assert state_digest(r.params, r.buffer) == manifest["digest"]
    assert r.buffer.total_added == manifest["counters"]["env_steps"]   # one transition per env step

    # Resume in this process once the coordinator has declared the killed peer dead.
    wait_for(lambda: any(m["id"] == "peer0" and m["state"] == "dead" for m in status(addr, 0.5)["members"]),
             timeout=20, what="peer0 declared dead")
    steps = manifest["counters"]["env_steps"]
    more = load_spec(None, KILL[:1] + [f"budget.env_steps={steps + 60}"] + KILL[2:])
    s = run_peer(more, 0, addr, run, tensorboard=False, join_timeout=10, resume_from=run)
    assert s["resumed_from"] == str(newest) and s["env_steps"] == steps + 60
    resumed = json.loads((run / "peer0" / "resumed.json").read_text())
    assert resumed["env_steps"] == steps
    assert resumed["digest"] == manifest["digest"]            # parameters and every buffer column, exactly
    assert "bootstrap" not in s                                 # alone: nobody to take parameters from


def _flip(f, needle: bytes, times: int = 1) -> None:
    """Change one bit in the middle of the last of the ``times`` copies of ``needle`` in ``f``:
    the file still parses."""
    data = bytearray(f.read_bytes())
    assert data.count(needle) == times, f"{f}: the bytes to change are there {data.count(needle)} times"
    at = data.rfind(needle)
    data[at + len(needle) // 2] ^= 0x10
    f.write_bytes(bytes(data))


def test_a_changed_byte_that_still_parses_is_a_damaged_checkpoint(tmp_path, caplog):
    """A byte changed after the commit inside a file that still loads (a .npy column, a
    tensor in state.pt) does not match the manifest's digests: the checkpoint is damaged,
    with an error that names it and what did not match, and load_newest skips it for the
    next older one. An increment's digests are those of the state restored: its full
    one's rows as well as its own."""
    import torch

    from swarm.experiment.checkpoint import load_newest

    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 60)
    full = root / ck.full(background=False)
    _train(agent, 20, seed=1)
    older = root / ck.incremental()
    _train(agent, 20, seed=2)
    newest = root / ck.incremental()
    caplog.set_level("WARNING", logger="swarm.experiment")

    # a row the newest increment wrote, in its obs column
    obs = np.load(newest / "buffer" / "obs.npy")
    _flip(newest / "buffer" / "obs.npy", obs[len(obs) // 2].tobytes())
    r, skipped = load_newest(root)
    assert r.path == older and skipped == [f"checkpoint {newest} is damaged: the digests in its manifest.json do "
                                           f"not match buffer column 'obs' (restored from {full.name} with this "
                                           "increment applied)"]
    assert skipped[0] in caplog.text

    # the optimizer's moments in the older increment's state.pt: only state.pt's own digest sees them
    moments = torch.load(older / "state.pt", weights_only=False)["agent"]["optimizer"]["exp_avg"]
    _flip(older / "state.pt", moments.numpy().tobytes())
    with pytest.raises(ConfigError, match=f"checkpoint {older} is damaged: state.pt does not match"):
        load_checkpoint(older)

    # the full one's parameters, with a manifest from before state.pt had a digest: the parameters' digest
    manifest = json.loads((full / "manifest.json").read_text())
    del manifest["files"]
    (full / "manifest.json").write_text(json.dumps(manifest))
    load_checkpoint(full)                 # whole, it still loads
    # twice: the Q-net's weights (a view of the flat vector) and, saved after them, the parameters
    _flip(full / "state.pt", torch.load(full / "state.pt", weights_only=False)["params"].numpy().tobytes(), times=2)
    with pytest.raises(ConfigError, match=f"checkpoint {full} is damaged: the digests in its manifest.json do not "
                                          "match the parameters$"):
        load_checkpoint(full)


def test_a_changed_row_of_the_full_checkpoint_damages_its_increments_too(tmp_path):
    """A row of the full checkpoint's buffer that no increment rewrites is part of every
    state restored from it: the full one and each increment are damaged."""
    from swarm.experiment.checkpoint import load_newest

    agent = _agent()
    root = tmp_path / "ckpt"
    ck = Checkpointer(root, agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 60)
    full = root / ck.full(background=False)
    _train(agent, 20, seed=1)
    inc = root / ck.incremental()
    assert load_checkpoint(inc).manifest["rows"] == 20
    rows = np.load(full / "buffer" / "obs.npy")[:60]                  # rows 0..59: the increment wrote 60..79
    _flip(full / "buffer" / "obs.npy", rows[10:13].tobytes())
    r, skipped = load_newest(root)
    assert r is None and [s.split(" is damaged")[0] for s in skipped] == [f"checkpoint {inc}", f"checkpoint {full}"]
    assert all("buffer column 'obs'" in s for s in skipped), skipped


def test_a_run_id_in_the_manifest_picks_the_checkpoints_of_one_run(tmp_path):
    """Each manifest records the run that wrote it; load_newest with a run id skips another
    run's checkpoints (and those from before run ids) as it skips damaged ones; without one
    it takes any, old ones included."""
    from swarm.experiment.checkpoint import Lineage, load_newest

    agent = _agent()
    _train(agent, 30)
    mine = Lineage.new(((str(tmp_path / "old"), "0123abcd"),))
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps}, run=mine)
    ours = ck.full(background=False)
    m = json.loads((tmp_path / "ckpt" / ours / "manifest.json").read_text())
    assert (m["run"], m["continues"]) == (mine.id, [[str(tmp_path / "old"), "0123abcd"]])
    assert Lineage.of(m, tmp_path) == mine
    # another run's newer one beside it (a reused folder): the same files, another id
    other = "full-000002"
    shutil.copytree(tmp_path / "ckpt" / ours, tmp_path / "ckpt" / other)
    (tmp_path / "ckpt" / other / "manifest.json").write_text(json.dumps({**m, "name": other, "run": "feed"}))

    r, skipped = load_newest(tmp_path / "ckpt", mine.id)
    assert r.path.name == ours and len(skipped) == 1 and f"{other} belongs to another run" in skipped[0]
    assert load_newest(tmp_path / "ckpt")[0].path.name == other
    # a manifest from before run ids: any run's for load_newest without an id, nobody's with one
    m = json.loads((tmp_path / "ckpt" / other / "manifest.json").read_text())
    del m["run"], m["continues"]
    (tmp_path / "ckpt" / other / "manifest.json").write_text(json.dumps(m))
    assert load_newest(tmp_path / "ckpt")[0].path.name == other
    assert load_newest(tmp_path / "ckpt", mine.id)[0].path.name == ours


def test_the_chain_of_runs_a_restart_follows_is_bounded_and_ends_where_it_comes_round(tmp_path):
    """Lineage.sources: the folder's own run, then each run it continues, each once and at most
    MAX_LINEAGE back; run.json round-trips and a torn or odd one is read as no record."""
    from swarm.experiment.checkpoint import MAX_LINEAGE, Lineage, read_lineage, write_lineage

    a, b, c = (str(tmp_path / n) for n in "abc")
    lin = Lineage("r3", ((b, "r2"), (a, "r1"), (b, "r2"), (c, "r3"), (c, "r0")))
    assert [(str(f), r) for f, r in lin.sources(c)] == [(c, "r3"), (b, "r2"), (a, "r1"), (c, "r0")]
    long = Lineage.of({"run": "r", "continues": [[f"/f{i}", f"r{i}"] for i in range(100)]}, tmp_path)
    assert len(long.continues) == MAX_LINEAGE and len(long.sources(tmp_path)) == MAX_LINEAGE + 1
    chain = tuple((f"/f{i}", f"r{i}") for i in range(MAX_LINEAGE + 3))   # a new run after a long chain
    new = Lineage.new(chain)
    assert new.continues == chain[:MAX_LINEAGE]      # its oldest run is still searched
    assert [r for _, r in new.sources(tmp_path)][1:] == [f"r{i}" for i in range(MAX_LINEAGE)]

    write_lineage(tmp_path, lin)
    assert read_lineage(tmp_path) == lin
    assert read_lineage(tmp_path / "nothing") == Lineage(None, ())
    (tmp_path / "run.json").write_text('{"run": "r3", "contin')
    assert read_lineage(tmp_path) == Lineage(None, ())
    assert Lineage.of({"run": "r", "continues": [1, 2]}, tmp_path) == Lineage("r", ())
    assert Lineage.of({"run": 7, "continues": None}, tmp_path) == Lineage(None, ())


def test_newest_lineage_passes_over_a_torn_newest_manifest_to_the_next_one(tmp_path):
    """A torn manifest in the newest checkpoint made a resume from the folder start a new run
    where it goes on with the one that wrote the older checkpoints."""
    from swarm.experiment.checkpoint import Lineage, newest_lineage

    for n in ("full-000001", "full-000002"):
        (tmp_path / "ckpt" / n).mkdir(parents=True)
    (tmp_path / "ckpt" / "full-000001" / "manifest.json").write_text(
        json.dumps({"run": "abc", "continues": [["/old", "r0"]]}))
    (tmp_path / "ckpt" / "full-000002" / "manifest.json").write_text('{"run": "ab')   # torn
    assert newest_lineage(tmp_path) == Lineage("abc", (("/old", "r0"),))
    (tmp_path / "ckpt" / "full-000001" / "manifest.json").write_text("")             # none reads
    assert newest_lineage(tmp_path) is None


def test_a_full_checkpoint_comes_exactly_full_every_steps_after_the_last(tmp_path):
    """full_every_steps = N: the full one at step N after the last, not N + 1, with increments
    every M steps between."""
    agent = _agent()
    steps = {"n": 0}
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": steps["n"]},
                      full_every_steps=100, incremental_every_steps=30)

    def at(n):
        steps["n"] = n
        got = ck.step(n)
        return ck._wait_pending() if ck._pending is not None else got

    assert ck.full(background=False) == "full-000001"          # at env step 0
    got = {n: at(n) for n in (29, 30, 59, 60, 89, 90, 99, 100, 190, 199, 200)}
    assert got == {29: None, 30: "full-000001-inc-0001", 59: None, 60: "full-000001-inc-0002",
                   89: None, 90: "full-000001-inc-0003", 99: None, 100: "full-000002",
                   190: "full-000002-inc-0001", 199: None, 200: "full-000003"}, got


@pytest.mark.parametrize("where", ["q", "target", "optimizer"])
def test_a_checkpoint_holding_nan_is_a_config_error_naming_it(tmp_path, where):
    """A checkpoint whose state holds NaN (written so: its digests match) fails the same way
    at every start, so it is a ConfigError (swarm run does not restart the peer) that names
    the checkpoint, and the agent it was applied to is left as it was."""
    import torch

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    from experiment.test_checkpoint_fallback import _poison

    _train(agent, 60)
    _poison(agent, where)
    paths = [tmp_path / "ckpt" / ck.full(background=False), tmp_path / "ckpt" / ck.incremental()]
    for path in paths:
        r = load_checkpoint(path)                 # whole and as written: its digests match
        fresh = _agent(seed=5)
        fresh.buffer = r.buffer
        before = (fresh.parameters().copy(), fresh.target_flat.clone(), fresh.optimizer.exp_avg.clone())
        with pytest.raises(ConfigError, match=f"^checkpoint {re.escape(str(path))}: .*NaN or infinite"):
            r.apply(fresh)
        assert np.array_equal(fresh.parameters(), before[0]), path
        assert torch.equal(fresh.target_flat, before[1]) and torch.equal(fresh.optimizer.exp_avg, before[2])


def test_increments_past_9999_are_found_and_pruned(tmp_path):
    # the names' patterns took four digits: increment 10,000 of one full checkpoint was not
    # found (a resume took 9,999 and lost what came after) nor ever pruned
    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    ck.full(background=False)
    ck._inc = 9998                       # stands for 9,998 increments taken against it
    for _ in range(2):
        _train(agent, 2)
        ck.incremental()
    assert latest(tmp_path / "ckpt").name == "full-000001-inc-10000"
    assert load_checkpoint(tmp_path / "ckpt" / "full-000001-inc-10000").manifest["digest"] == \
        state_digest(agent.parameters(), agent.buffer)
    (tmp_path / "ckpt" / ".tmp-full-000001-inc-10001").mkdir()     # left by a crash
    ck.full(background=False)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["full-000002"]


@pytest.mark.parametrize("base", ["other length", "a bare tensor"])
def test_an_increment_whose_full_checkpoint_holds_other_parameters_is_a_clear_error(tmp_path, base):
    # a full state.pt that still loads but holds other parameters raised ValueError
    # (np.bitwise_xor of two lengths) or IndexError out of load_checkpoint, past
    # load_newest, which skips only ConfigError
    import torch

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 30)
    full = ck.full(background=False)
    _train(agent, 5)
    inc = ck.incremental()
    st = tmp_path / "ckpt" / full / "state.pt"
    if base == "other length":
        torch.save({"kind": "full", "params": torch.zeros(3)}, st)
    else:
        torch.save(torch.zeros(3), st)
    with pytest.raises(ConfigError, match=f"checkpoint .*{inc}"):
        load_checkpoint(tmp_path / "ckpt" / inc)


def test_a_torch_rng_state_that_cannot_be_restored_leaves_the_agent_as_it_was(tmp_path):
    # the RNG was set last, after the agent was loaded: a refused one left it changed
    import dataclasses

    import torch

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 60)
    path = tmp_path / "ckpt" / ck.full(background=False)
    r = dataclasses.replace(load_checkpoint(path), torch_rng=torch.zeros(3, dtype=torch.float32))
    fresh = _agent(seed=5)
    fresh.buffer = r.buffer
    before, rng = fresh.parameters().copy(), torch.get_rng_state()
    with pytest.raises(ConfigError, match="torch RNG state cannot be restored"):
        r.apply(fresh)
    assert np.array_equal(fresh.parameters(), before) and torch.equal(torch.get_rng_state(), rng)


def test_an_increments_full_checkpoint_is_checked_against_its_own_digest(tmp_path):
    import torch

    agent = _agent()
    ck = Checkpointer(tmp_path / "ckpt", agent, agent.buffer, lambda: {"env_steps": agent.steps})
    _train(agent, 60)
    full = tmp_path / "ckpt" / ck.full(background=False)
    _train(agent, 4)
    inc = tmp_path / "ckpt" / ck.incremental()
    # the full one's state.pt rewritten with other counters: it loads, its parameters are the
    # same, and the increment read it without a word
    st = torch.load(full / "state.pt", weights_only=False)
    st["counters"] = dict(st["counters"], env_steps=10**9)
    torch.save(st, full / "state.pt")
    with pytest.raises(ConfigError, match=f"its full checkpoint {re.escape(str(full))} is damaged"):
        load_checkpoint(inc)
