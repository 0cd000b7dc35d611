"""Training that diverged (NaN or Inf in the agent's state) does not cost the checkpoints before it.

A full checkpoint holding NaN keeps, when the Checkpointer prunes, the newest older
full one that is finite (and its increments), so load_newest has one to fall back to.
A ``checkpoint.pt`` holding NaN is passed over on resume as a NaN checkpoint in
``ckpt/`` is, for the runs the folder's run continues; with nothing usable anywhere
the resume is one ConfigError naming each checkpoint passed over and why.
"""

from __future__ import annotations

import json

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from experiment.test_runner import coordinator  # noqa: F401 - a fixture
from experiment.test_checkpoint_fallback import _full_and_increment, _poison
from experiment.test_resume_lineage import _peer, _tear

from swarm.errors import ConfigError
from swarm.experiment.checkpoint import Checkpointer, committed, latest, load_checkpoint, load_newest
from swarm.rl.train import run_agent


def _finite(path) -> bool | None:
    return json.loads((path / "manifest.json").read_text()).get("finite")


@pytest.mark.parametrize("where", ["q", "target", "optimizer"])
def test_a_full_checkpoint_holding_nan_keeps_the_newest_finite_one(tmp_path, caplog, where):
    """Committing a full checkpoint whose state holds NaN pruned every older one, so a
    resume had nothing finite to fall back to; now the newest finite full one stays."""
    root = tmp_path / "ckpt"
    agent, ck, full, inc = _full_and_increment(root)
    run_agent("CartPole-v1", agent, 10, seed=2)
    _poison(agent, where)
    caplog.set_level("WARNING", logger="swarm.experiment")
    bad = root / ck.full(background=False)

    # the older full one and its increment stay (they used to be pruned): the fall-back has one to load
    assert committed(root) == [bad, inc, full]
    assert (_finite(full), _finite(inc), _finite(bad)) == (True, True, False)
    assert f"checkpoint {bad.name} holds NaN or infinite values" in caplog.text and full.name in caplog.text
    r, skipped = load_newest(root)
    assert r is not None and r.path == inc and len(skipped) == 1 and "NaN or infinite" in skipped[0]

    # a second diverged full one: the diverged one before it goes, the finite one stays
    worse = root / ck.full(background=False)
    assert committed(root) == [worse, inc, full]

    # manifests from before the field (no "finite"): the older full one still counts as one
    # to keep, and loads as before
    for p in (full, inc):
        m = json.loads((p / "manifest.json").read_text())
        del m["finite"]
        (p / "manifest.json").write_text(json.dumps(m))
    worst = root / ck.full(background=False)
    assert committed(root) == [worst, inc, full]
    assert load_checkpoint(full).path == full
    r, skipped = load_newest(root)
    assert r is not None and r.path == inc and len(skipped) == 1

    # training goes on from the finite state: the next finite full one prunes every older one, as before
    r.apply(agent)
    fresh = root / ck.full(background=False)
    assert committed(root) == [fresh] and _finite(fresh) is True


def test_a_checkpoint_pt_holding_nan_is_passed_over_for_the_run_it_continues(coordinator, tmp_path, monkeypatch):
    """Run NEW resumed from OLD; training diverged before NEW's first checkpoint, so its
    only ckpt/ one and its checkpoint.pt both hold NaN. A restart into NEW passes over
    both for OLD's checkpoint (it raised checkpoint.pt's ConfigError without looking
    further); with OLD's unusable too, one ConfigError names all four and changes nothing."""
    old, new = tmp_path / "old", tmp_path / "new"
    _peer(coordinator, old, 200)
    was = latest(old / "peer0" / "ckpt")
    real_close = Checkpointer.close

    def diverged(self):
        _poison(self.agent, "target")
        return real_close(self)

    with monkeypatch.context() as m:
        m.setattr(Checkpointer, "close", diverged)
        _peer(coordinator, new, 230, resume_from=old)   # its first periodic checkpoint would be at 250
    ckpt, ck_pt = new / "peer0" / "ckpt", new / "peer0" / "checkpoint.pt"
    nan = latest(ckpt)
    assert committed(ckpt) == [nan] and ck_pt.is_file()

    # OLD's checkpoints unusable too: one error naming what was passed over, and why
    old_pt = old / "peer0" / "checkpoint.pt"
    kept = {f: f.read_bytes() for f in (was / "state.pt", old_pt)}
    _tear(was / "state.pt")
    _tear(old_pt)
    before = {f: f.read_bytes() for f in (ck_pt, nan / "state.pt", nan / "manifest.json")}
    with pytest.raises(ConfigError, match="^resume: no checkpoint of peer0 in .*new/peer0 nor in .*old/peer0 "
                                          r"\(the run it continues\) can be used: ") as e:
        _peer(coordinator, new, 300, resume_from=new)
    said = str(e.value)
    assert f"checkpoint {nan}: its agent state target" in said and f"{ck_pt}: DQN checkpoint target" in said
    assert said.count("NaN or infinite") == 2, said
    assert f"checkpoint {was} cannot be read" in said and f"{old_pt} cannot be read" in said, said
    assert {f: f.read_bytes() for f in before} == before and committed(ckpt) == [nan]

    for f, data in kept.items():
        f.write_bytes(data)
    r = _peer(coordinator, new, 300, resume_from=new)
    assert r["resumed_from"] == str(was) and r["env_steps"] == 300, r
    assert [s.split(": ")[0] for s in r["resume_skipped"]] == [f"checkpoint {nan}", str(ck_pt)], r["resume_skipped"]
    assert all("NaN or infinite" in s for s in r["resume_skipped"]), r["resume_skipped"]
