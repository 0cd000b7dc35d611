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
