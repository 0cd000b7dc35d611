import subprocess
import sys

import numpy as np
import pytest

from swarm.errors import SwarmError
from swarm.peer.agent import BaseAgent


class Echo(BaseAgent):
    def perceive(self, observations):
        self.obs = observations

    def deliberate(self):
        return self.obs

    def reflect(self, reward, terminal, *, truncated=False, next_observations=None):
        self.last = (reward, terminal, truncated)


def test_abstract_methods_are_required():
    class Half(BaseAgent):
        def perceive(self, observations):
            pass

    with pytest.raises(TypeError, match="deliberate"):
        Half()


def test_defaults_of_an_agent_without_parameters():
    a = Echo()
    a.perceive(3)
    assert a.deliberate() == 3
    vec = a.parameters()
    assert vec.dtype == np.float32 and vec.size == 0 and not vec.flags.writeable
    assert a.state_dict() == {} and a.metrics() == {}
    a.load_state_dict({})
    a.on_parameters_changed()
    with pytest.raises(SwarmError, match="keeps no state"):
        a.load_state_dict({"w": 1})
    with pytest.raises(NotImplementedError, match="Echo"):
        a.act(0)


def test_agent_module_does_not_import_torch():
    code = "import sys; import swarm.peer.agent; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
