"""Run folders and checkpoints written by older swarm versions, opened by this one.

Each old format is made here from a current one, edited the way the older code wrote
it (no git history needed): a ``resumed.json`` from before its ``continues`` key, and
manifests, ``state.pt``, ``checkpoint.pt`` and ``best.pt`` from before run ids, digests
of ``state.pt``, ``finite`` and ``rounds_ok``; a ``best.pt`` whose optimizer state is
``torch.optim.Adam``'s (before FlatAdam); a spec holding values refused since
(``seed`` above 2**32, ``gossip.round_timeout_s`` above 3600); a run folder from before
``best.pt``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
# in-process peers of one run, and a coordinator process for them (tests/ is on the path)
from experiment.test_resume_lineage import _killed, _peer
from experiment.test_runner import coordinator  # noqa: F401 - a fixture

from swarm.buffer import ReplayBuffer
from swarm.cli import main
from swarm.config import to_dict
from swarm.errors import ConfigError
from swarm.experiment import load_spec, save_resolved
from swarm.experiment.checkpoint import continued_folder, latest, load_policy, read_lineage
from swarm.experiment.spec import Spec
from swarm.rl import DQNAgent, dqn_schema
from swarm.rl.dqn import QNetwork
from swarm.rl.hparams import DQNConfig
from swarm.rl.train import make_env


# ------------------------------------------------------------------ old formats

def _make_old(peer: Path) -> None:
    """Turn a peer folder written now into one as swarm wrote it before run ids: no
    run.json, manifests without ``run``, ``continues``, ``finite`` and the digest of
    state.pt, counters without ``rounds_ok``, checkpoint.pt and best.pt without a run."""
    (peer / "run.json").unlink(missing_ok=True)
    for c in (peer / "ckpt").iterdir():
        m = json.loads((c / "manifest.json").read_text())
        for k in ("run", "continues", "finite", "files"):
            m.pop(k, None)
        m["counters"].pop("rounds_ok", None)
        (c / "manifest.json").write_text(json.dumps(m))
        st = torch.load(c / "state.pt", weights_only=False)
        st["counters"].pop("rounds_ok", None)
        torch.save(st, c / "state.pt")
    for name in ("checkpoint.pt", "best.pt"):
        if (peer / name).is_file():
            ck = torch.load(peer / name, weights_only=False)
            for k in ("run", "continues"):
                ck.pop(k, None)
            torch.save(ck, peer / name)


def _old_resumed_json(peer: Path, checkpoint: str) -> None:
    """``peer/resumed.json`` as swarm wrote it before ``continues`` (commit 45744dd): the
    checkpoint as its launcher named it (relative to the folder it ran in), the steps
    and the digest only."""
    rec = json.loads((peer / "resumed.json").read_text())
    (peer / "resumed.json").write_text(json.dumps({"checkpoint": checkpoint, "env_steps": rec["env_steps"],
                                                   "digest": rec["digest"]}, indent=1))


def _entries(**spec_changes) -> dict:
    """What the runner writes into a peer's best.pt, for an untrained agent (test_eval_cli),
    its spec changed (``gossip__round_timeout_s=5000.0``: that key of that section)."""
    d = to_dict(Spec())
    for key, value in spec_changes.items():
        section, _, name = key.rpartition("__")
        (d[section] if section else d)[name] = value
    env = make_env(d["env"])
    try:
        agent = DQNAgent.for_env(env, ReplayBuffer(dqn_schema(env.observation_space.shape), 1),
                                 DQNConfig(**d["dqn"]))
    finally:
        env.close()
    with torch.no_grad():   # weights that are not an untrained agent's, to tell them apart when loaded
        agent.q.net[0].weight.mul_(-1.5)
    return {"agent": agent.state_dict(), "params": torch.from_numpy(agent.parameters().copy()),
            "rank": 0, "env_steps": 300, "spec": d, "eval_return": 12.5}


def _torch_adam_state(hidden: list[int]) -> dict:
    """An optimizer state as swarm saved it before FlatAdam: torch.optim.Adam's state_dict."""
    q = QNetwork(4, 2, hidden)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    q(torch.ones(1, 4)).sum().backward()
    opt.step()
    return opt.state_dict()


def _eval(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["eval", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


# ------------------------------------------------------------------ resumed.json without `continues`

def test_an_old_resumed_json_names_the_run_it_continues_by_its_checkpoint(tmp_path, monkeypatch):
    """continued_folder: a resumed.json from before `continues` records the checkpoint only;
    the folder that holds it is the run continued, found as the old code opened it (from the
    working folder) or, from elsewhere, from a folder above the peer folder."""
    a, b = tmp_path / "runs" / "a" / "peer0", tmp_path / "runs" / "b" / "peer0"
    (a / "ckpt" / "full-000002").mkdir(parents=True)
    b.mkdir(parents=True)

    def old(checkpoint: str) -> Path | None:
        (b / "resumed.json").write_text(json.dumps({"checkpoint": checkpoint, "env_steps": 600}))
        return continued_folder(b)

    monkeypatch.chdir(tmp_path)
    assert old("runs/a/peer0/ckpt/full-000002") == a.resolve()
    assert old("runs/a/peer0/ckpt/full-000002-inc-0003") == a.resolve()   # gone since: the folder still counts
    assert old("runs/a/peer0/checkpoint.pt") == a.resolve()
    assert old(str(a / "ckpt" / "full-000002")) == a.resolve()
    assert read_lineage(b).continues == ((str(a.resolve()), None),)
    monkeypatch.chdir(b)   # another working folder: the relative path is found above the peer folder
    assert old("runs/a/peer0/ckpt/full-000002") == a.resolve()
    # a restart of the old run into its own folder recorded its own checkpoint: it continues none
    assert old(str(b / "ckpt" / "full-000001")) is None
    assert old("checkpoint.pt") is None and old("") is None
    # a record with the key says it all, also that it continues none
    (b / "resumed.json").write_text(json.dumps({"checkpoint": str(a / "ckpt" / "full-000002"), "continues": None}))
    assert continued_folder(b) is None


def test_an_old_resume_killed_before_its_first_checkpoint_goes_on_from_the_run_it_continues(coordinator, tmp_path,
                                                                                             monkeypatch):
    """A run B that an older swarm resumed from A (`swarm run --resume runs/A`) and that was
    killed before its first own checkpoint, continued in place by this swarm: it resumes from
    A's checkpoint, which its resumed.json names, not from step 0 (A's training lost)."""
    monkeypatch.chdir(tmp_path)   # where the old `swarm run` ran: its resumed.json names runs/a/... from here
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    _peer(coordinator, a, 200)
    was = latest(a / "peer0" / "ckpt")
    s = _killed(coordinator, b, 330, monkeypatch, resume_from=a, sets=("checkpoint.incremental_every_steps=1000",))
    assert s["resumed_from"] == str(was) and latest(b / "peer0" / "ckpt") is None, s
    for peer in (a / "peer0", b / "peer0"):
        _make_old(peer)
    _old_resumed_json(b / "peer0", str(was.relative_to(tmp_path)))

    s = _peer(coordinator, b, 400, resume_from=b)
    assert s["resumed_from"] == str(was) and s["env_steps"] == 400, s
    # its counters have no rounds_ok: the rounds before are not failures (it said 0 of them were ok)
    restored = json.loads((was / "manifest.json").read_text())["counters"]["rounds"]
    assert restored > 0 and s["rounds_ok"] >= restored, s


# ------------------------------------------------------------------ swarm eval of old files

def test_an_old_best_pt_whose_spec_holds_values_refused_now_still_plays(tmp_path, capsys):
    ck = _entries(seed=5_000_000_000, gossip__round_timeout_s=5000.0, dqn__hidden=[32])
    torch.save(ck, tmp_path / "best.pt")
    agent, spec, meta = load_policy(tmp_path / "best.pt")
    assert (spec.env, spec.dqn.hidden) == ("CartPole-v1", [32])
    assert meta["spec_error"] == "seed = 5000000000: must be in [0, 4294967295]"
    assert (meta["env_steps"], meta["eval_return"]) == (300, 12.5)
    assert torch.equal(torch.from_numpy(agent.parameters()), ck["params"])   # the saved policy, not a fresh one

    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"), "--episodes", "1")
    assert rc == 0, err
    assert out.splitlines()[1].split()[:3] == [str(tmp_path / "best.pt"), "300", "12.5"], out
    assert "its spec no longer loads whole (seed = 5000000000" in err, err


def test_an_old_checkpoint_pt_with_torch_adams_optimizer_state_still_plays(tmp_path, capsys):
    ck = _entries()
    ck["agent"]["optimizer"] = _torch_adam_state([64, 64])
    del ck["eval_return"]
    torch.save(ck, tmp_path / "checkpoint.pt")
    agent, _, _ = load_policy(tmp_path / "checkpoint.pt")
    assert torch.equal(torch.from_numpy(agent.parameters()), ck["params"])
    rc, out, err = _eval(capsys, str(tmp_path / "checkpoint.pt"), "--episodes", "1")
    assert rc == 0 and err == "", err
    assert out.splitlines()[1].split()[:3] == [str(tmp_path / "checkpoint.pt"), "300", "-"], out


@pytest.mark.parametrize("change,says", [
    (lambda ck: ck["agent"]["q"].__setitem__("net.0.weight", torch.full((64, 4), float("nan"))),
     "DQN checkpoint q.net.0.weight has NaN or infinite entries"),
    (lambda ck: ck["spec"]["dqn"].__setitem__("hidden", [16, 16]),
     "DQN checkpoint does not fit this network: q.net.0.weight is (64, 4), the network's (16, 4)"),
    (lambda ck: ck["agent"].pop("q"), "its agent holds no Q-network (no 'q' in it"),
    (lambda ck: ck["spec"]["dqn"].__setitem__("gamma", 1.5), "its spec: dqn.gamma = 1.5: must be in [0, 1)"),
    (lambda ck: ck["spec"].__setitem__("env", "NoSuchEnv-v0"), "its spec: env = 'NoSuchEnv-v0': not a registered"),
])
def test_what_play_needs_is_still_checked_in_an_old_file(tmp_path, capsys, change, says):
    """The Q-network, and the env and dqn sections, are checked as before, also in a file
    whose spec does not load whole (its seed) and whose optimizer is of the old format."""
    ck = _entries(seed=5_000_000_000)
    ck["agent"]["optimizer"] = _torch_adam_state([64, 64])
    change(ck)
    torch.save(ck, tmp_path / "best.pt")
    with pytest.raises(ConfigError) as e:
        load_policy(tmp_path / "best.pt")
    assert str(e.value).startswith(f"{tmp_path / 'best.pt'}: ") and says in str(e.value), e.value
    rc, out, err = _eval(capsys, str(tmp_path / "best.pt"), "--episodes", "1")
    assert rc == 2 and out == "" and says in err, err


def test_a_run_folder_without_best_pt_plays_each_peers_checkpoint_pt(tmp_path, capsys):
    """A run folder from before best.pt (or run with eval.every = 0): `swarm eval RUN` plays
    each peer's checkpoint.pt, saying so, where the peer has no best.pt."""
    run = tmp_path / "run"
    for r, name in ((0, "checkpoint.pt"), (1, "best.pt"), (2, "checkpoint.pt")):
        (run / f"peer{r}").mkdir(parents=True)
        torch.save(_entries(), run / f"peer{r}" / name)
    (run / "peer1" / "checkpoint.pt").write_bytes((run / "peer0" / "checkpoint.pt").read_bytes())
    rc, out, err = _eval(capsys, str(run), "--episodes", "1")
    assert rc == 0, err
    assert [r.split()[0] for r in out.splitlines()[1:]] == [
        str(run / "peer0" / "checkpoint.pt"), str(run / "peer1" / "best.pt"), str(run / "peer2" / "checkpoint.pt")]
    assert err.count("has no best.pt") == 2 and f"{run / 'peer0'} has no best.pt" in err, err
    # a peer folder given itself, and a folder with neither file
    rc, out, err = _eval(capsys, str(run / "peer0"), "--episodes", "1")
    assert rc == 0 and out.splitlines()[1].split()[0] == str(run / "peer0" / "checkpoint.pt"), err
    (tmp_path / "empty" / "peer0").mkdir(parents=True)
    rc, out, err = _eval(capsys, str(tmp_path / "empty"))
    assert rc == 2 and out == ""
    assert f"{tmp_path / 'empty'}: no peer*/best.pt nor peer*/checkpoint.pt in it" in err, err


# ------------------------------------------------------------------ swarm run --resume of an old config.json

def _old_run(tmp_path: Path, **changes) -> Path:
    """A run folder whose config.json holds values that an older swarm took."""
    old = tmp_path / "runs" / "old"
    save_resolved(load_spec(None, ["peers=2"]), old)
    d = json.loads((old / "config.json").read_text())
    for key, value in changes.items():
        section, _, name = key.rpartition("__")
        (d[section] if section else d)[name] = value
    (old / "config.json").write_text(json.dumps(d))
    return old


def test_resume_of_an_old_config_json_names_it_and_the_override(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = _old_run(tmp_path, gossip__round_timeout_s=5000.0, seed=5_000_000_000)
    cfg = Path("runs", "old", "config.json")

    def resume(*sets: str) -> str:
        rc = main(["run", "--resume", str(Path("runs", "old")), *[a for s in sets for a in ("--set", s)]])
        out, err = capsys.readouterr()
        assert rc == 2 and "Traceback" not in out + err
        assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["old"]   # no new run folder
        return err.strip()

    assert resume("budget.env_steps=900") == (
        f"swarm: error: resume: {cfg}: gossip.round_timeout_s = 5000.0: must be in (0, 3600]; that run's "
        "config.json holds a value this swarm refuses: override it with --set gossip.round_timeout_s=VALUE")
    # that one overridden, the next refused value of the file is named the same way
    assert resume("gossip.round_timeout_s=60") == (
        f"swarm: error: resume: {cfg}: seed = 5000000000: must be in [0, 4294967295]; that run's "
        "config.json holds a value this swarm refuses: override it with --set seed=VALUE")
    # an override refused is the override's error, as it was
    assert resume("gossip.round_timeout_s=9000") == "swarm: error: gossip.round_timeout_s = 9000: must be in (0, 3600]"
    assert resume("gossip.round_timeout_s=60", "seed=1", "budget.env_steps=50") == (
        "swarm: error: dqn.learning_starts = 250 is not below budget.env_steps = 50; the agent would never learn")
    # a key this swarm does not know: no --set removes it, but the file is named
    _old_run(tmp_path, gossip__fanout=3)
    said = resume("budget.env_steps=900")
    assert said.startswith(f"swarm: error: resume: {cfg}: unknown key gossip.fanout; known keys: "), said
    assert old.is_dir()


def test_resume_whose_override_clashes_with_a_value_of_the_file_blames_the_override(tmp_path, capsys, monkeypatch):
    """A cross-check between an override and a value the file holds names the file's key;
    the file loads alone, so the error is the override's (it named the file and told to
    override gossip.sync, which was never refused)."""
    monkeypatch.chdir(tmp_path)
    _old_run(tmp_path, gossip__exchange="gradients", gossip__average=False, gossip__sync="bounded")
    rc = main(["run", "--resume", str(Path("runs", "old")), "--set", "gossip.average=true"])
    err = capsys.readouterr().err
    assert rc == 2 and "gossip.sync" in err and "config.json" not in err and "--set" not in err, err
