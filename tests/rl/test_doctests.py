"""The examples in swarm.rl's docstrings run as written (a user copies them first)."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["swarm.rl.dqn", "swarm.rl.train", "swarm.rl.flat"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, f"{module}: {result}"
