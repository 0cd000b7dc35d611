"""save_resolved writes a file that loads back, whatever the path (found by the forty-sixth
session's review of docstring examples)."""

import pytest

from swarm.errors import ConfigError
from swarm.experiment import load_spec, save_resolved


def test_a_run_folder_with_a_dot_in_its_name_gets_config_json(tmp_path):
    # "runs/lr-1e-3.v2" has a suffix (".v2"): it was written as a file of that name
    spec = load_spec(None, ["budget.env_steps=500"])
    written = save_resolved(spec, tmp_path / "lr-1e-3.v2")
    assert written == tmp_path / "lr-1e-3.v2" / "config.json"
    assert load_spec(written).budget.env_steps == 500


def test_a_toml_path_is_refused_and_nothing_is_written(tmp_path):
    # it got JSON, which load_spec then read as TOML and failed on
    spec = load_spec(None)
    with pytest.raises(ConfigError, match="show_spec gives the spec as TOML"):
        save_resolved(spec, tmp_path / "resolved.toml")
    assert list(tmp_path.iterdir()) == []
    assert load_spec(save_resolved(spec, tmp_path / "resolved.JSON")) == spec
