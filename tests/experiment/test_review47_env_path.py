"""Review 47: ``env = "module:EnvId"`` whose module only the working directory holds.

``python -m swarm run`` puts the working directory on the launcher's path, so the spec
check imported such a module and passed; the fork server and the peers start with
``python -P``, which leaves it off, so every peer then failed to import it, after a run
folder, a coordinator and the peers had started. The check now refuses a module imported
from the working directory up front, naming ``env`` and PYTHONPATH, unless PYTHONPATH gives
that folder to the peers. Its refusal of a Discrete observation space now gives the hint
``DQNAgent.for_env`` gives.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from swarmtest import reaped

from swarm.errors import ConfigError
from swarm.experiment import load_spec

ROOT = Path(__file__).resolve().parents[2]
MODULE = "walk_envs_review47"
ENV = f"{MODULE}:Walk-v0"
#: the smallest run: were the check to pass, it would end by itself
SMALL = ["peers=1", "budget.env_steps=200", "dqn.learning_starts=50", "dqn.batch_size=16", "eval.every=0",
         "checkpoint.full_every_s=0"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A working folder that holds a module registering ``Walk-v0``, and nothing else."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(f"""\
        import gymnasium as gym
        import numpy as np
        from gymnasium import spaces


        class Walk(gym.Env):
            observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
            action_space = spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.zeros(2, np.float32), {{}}

            def step(self, action):
                return np.zeros(2, np.float32), 1.0, False, False, {{}}


        gym.register("Walk-v0", entry_point="{MODULE}:Walk", max_episode_steps=20)
        """))
    return folder


def _swarm_run(cwd: Path, pythonpath: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m swarm run --set env=ENV ARGS`` from ``cwd`` (the form used from a source checkout)."""
    sets = [w for kv in [f"env={ENV}", *args] for w in (("--set", kv) if "=" in kv else (kv,))]
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1")
    with reaped(subprocess.Popen([sys.executable, "-m", "swarm", "run", *sets], cwd=cwd, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL)) as p:
        out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_a_module_only_the_working_directory_holds_is_refused_before_anything_starts(work):
    r = _swarm_run(work, str(ROOT), *SMALL)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"env = {ENV!r}" in r.stderr
    assert "PYTHONPATH" in r.stderr and str(work) in r.stderr
    assert sorted(p.name for p in work.iterdir()) == [f"{MODULE}.py"], "a run folder (or more) was made"


@pytest.mark.parametrize("entry", ["absolute", "relative"])
def test_the_same_module_on_pythonpath_passes_the_check(work, entry):
    # "." is the working directory as well, but one the peers have: PYTHONPATH reaches them
    folder = str(work) if entry == "absolute" else "."
    r = _swarm_run(work, folder + os.pathsep + str(ROOT), "--show")
    assert r.returncode == 0, r.stderr
    assert f"env = {ENV!r}" in r.stdout or f'env = "{ENV}"' in r.stdout


def test_a_discrete_observation_space_is_refused_with_the_one_hot_hint():
    # as DQNAgent.for_env refuses it
    with pytest.raises(ConfigError, match=r"env = 'FrozenLake-v1': its observation space Discrete\(16\) .*; "
                                          r"one-hot encode a Discrete observation$"):
        load_spec(None, ["env=FrozenLake-v1"])


def test_the_same_module_installed_by_a_pth_file_passes_the_check(work, tmp_path):
    """``pip install -e .`` of a flat project writes a ``.pth`` that names the project folder:
    ``python -P`` reads it too, so the peers find the module, run from that folder or not.
    (The first form of the check refused it as "imported from the working directory".)"""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (site / "deps.pth").write_text(f"{deps}\n{ROOT}\n")    # numpy, torch, gymnasium; swarm
    (site / f"__editable__{MODULE}.pth").write_text(f"{work}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with reaped(subprocess.Popen([str(venv / "bin" / "python"), "-m", "swarm", "run", "--set", f"env={ENV}",
                                  "--show"], cwd=work, env=env, text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)) as p:
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert ENV in out


def test_a_script_that_puts_another_folder_first_still_has_its_module_refused(work):
    """The working directory was then sys.path[1], and a check that read this process's
    path from its second entry on took the module for one the peers have (own-diff review)."""
    (work / "lib").mkdir()
    (work / "check.py").write_text(textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, os.path.abspath("lib"))
        from swarm.errors import ConfigError
        from swarm.experiment import load_spec
        try:
            load_spec(None, ["env={ENV}"])
        except ConfigError as e:
            print("refused:", e)
        else:
            print("accepted")
        """))
    r = subprocess.run([sys.executable, "check.py"], cwd=work, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("refused:") and "PYTHONPATH" in r.stdout, (r.stdout, r.stderr)
