import dataclasses

import numpy as np
import pytest

from swarm.config import apply_overrides, from_dict, to_dict
from swarm.errors import ConfigError
from swarm.rl import DQNConfig


@pytest.mark.parametrize("kw, match", [
    # zero periods were ZeroDivisionErrors deep in training (target_every after the Adam step)
    ({"eps_steps": 0}, "eps_steps = 0: must be > 0"),
    ({"train_every": 0}, "train_every = 0: must be > 0"),
    ({"target_every": 0}, "target_every = 0: must be > 0"),
    ({"beta_steps": 0}, "beta_steps = 0: must be > 0"),
    ({"lr": -1}, r"lr = -1: must be > 0"),
    ({"lr": float("nan")}, "lr = nan: expected a finite number"),
    ({"lr": float("inf")}, "lr = inf: expected a finite number"),
    ({"lr": "0.1"}, "lr = '0.1': expected a finite number"),
    ({"lr": 10**400}, "lr = 1000.*: expected a finite number"),   # was an OverflowError
    ({"gamma": 1.5}, r"gamma = 1.5: must be in \[0, 1\)"),
    ({"tau": 0}, r"tau = 0: must be in \(0, 1\]"),
    ({"hidden": []}, "hidden = \\[\\]: must be a non-empty list"),
    ({"hidden": [64, 0]}, "hidden = .*: must be a non-empty list of positive widths"),
    ({"hidden": 64}, "hidden = 64: expected a list of integers"),
    ({"batch_size": 1.5}, "batch_size = 1.5: expected an integer"),
    ({"batch_size": True}, "batch_size = True: expected an integer"),
    ({"double": "yes"}, "double = 'yes': expected true or false"),
])
def test_a_config_built_in_python_gets_the_config_files_checks(kw, match):
    with pytest.raises(ConfigError, match=match):
        DQNConfig(**kw)
    with pytest.raises(ConfigError, match=match):   # and so does a copy with a change
        dataclasses.replace(DQNConfig(), **kw)


def test_good_values_pass_and_the_file_path_still_names_the_full_key():
    cfg = DQNConfig(lr=np.float32(0.01), batch_size=np.int64(32), hidden=(32, 32), tau=1)
    assert cfg.batch_size == 32
    assert from_dict(DQNConfig, apply_overrides(to_dict(DQNConfig()), ["lr=0.004", "tau=0.12"])).lr == 0.004
    with pytest.raises(ConfigError, match="dqn.lr = -1: must be > 0"):
        from_dict(DQNConfig, {"lr": -1}, prefix="dqn")


def test_check_sees_fields_assigned_after_the_config_was_built():
    cfg = DQNConfig()
    cfg.target_every = 0
    with pytest.raises(ConfigError, match="dqn.target_every = 0"):
        cfg.check("dqn.")


def test_lr_has_a_typo_guard():
    # Any finite lr > 0 passed: lr = 1e39 (a typo for 1e-3) made every parameter NaN or
    # infinite in the first update.
    with pytest.raises(ConfigError, match=r"lr = 1e\+39: must be > 0 and at most 1"):
        DQNConfig(lr=1e39)
    with pytest.raises(ConfigError, match="dqn.lr = 2: must be > 0 and at most 1"):
        from_dict(DQNConfig, {"lr": 2}, prefix="dqn")
    assert DQNConfig(lr=1).lr == 1.0


def test_numpy_scalars_are_stored_as_plain_values():
    # DQNConfig took numpy scalars but kept them: a spec built in code with one was then
    # refused by load_spec ("dqn.batch_size: expected an integer, got np.int64(32)"), and
    # to_toml could not write it.
    from swarm.config import to_toml
    from swarm.experiment import load_spec

    cfg = DQNConfig(batch_size=np.int64(32), lr=np.float32(0.5), hidden=(np.int64(32), 16), tau=1)
    assert type(cfg.batch_size) is int and type(cfg.lr) is float and type(cfg.tau) is float
    assert cfg.hidden == [32, 16] and all(type(w) is int for w in cfg.hidden)
    assert "batch_size = 32\n" in to_toml(cfg)
    spec = load_spec(dataclasses.replace(load_spec(None, []), dqn=cfg), [])
    assert (spec.dqn.batch_size, spec.dqn.lr, spec.dqn.hidden) == (32, 0.5, [32, 16])
    cfg.batch_size = np.int32(8)                  # assigned after construction: check() stores it plain too
    cfg.check()
    assert type(cfg.batch_size) is int


def test_a_failed_check_changes_no_field():
    """Storing plain values happens only once every field has passed: a refused config
    keeps what it held."""
    cfg = DQNConfig(batch_size=32)
    cfg.batch_size, cfg.gamma = np.int64(8), 2.0
    with pytest.raises(ConfigError, match="gamma = 2.0"):
        cfg.check()
    assert type(cfg.batch_size) is np.int64
