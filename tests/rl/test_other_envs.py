"""Environments other than CartPole-v1: their own solve threshold, the ``module:EnvId``
form, evaluation of an env without a time limit, and clear errors for the rest.

Real Gymnasium envs throughout; the few made up here are registered under
``test_other_envs/`` for the test that needs them and removed after it.
"""

from __future__ import annotations

import io
import json
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from test_scripts import SCRIPTS, load_script

from swarm.errors import ConfigError
from swarm.experiment.launch import RunResult, run_experiment
from swarm.experiment.spec import DEFAULT_SPEC, load_spec, save_resolved
from swarm.rl import DQNAgent
from swarm.rl import train
from swarm.rl.train import evaluate, make_env

ID = ["gossip.codec=identity"]
CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
# CartPole-v0 is one of the envs checked; gymnasium warns that v1 is newer
pytestmark = pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date:DeprecationWarning")


@pytest.fixture
def register():
    """``register(id, **kw)``: a Gymnasium env for this test only."""
    made: list[str] = []

    def add(env_id: str, **kwargs) -> str:
        gym.register(env_id, **kwargs)
        made.append(env_id)
        return env_id

    yield add
    for env_id in made:
        gym.registry.pop(env_id, None)


class Endless(gym.Env):
    """Never ends an episode. Past CAP steps it raises, so that a loop without a bound
    fails the test instead of hanging it."""

    CAP = 50_000
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t > self.CAP:
            raise RuntimeError(f"stepped {self.t} times: the caller has no step bound")
        return np.zeros(2, np.float32), 1.0, False, False, {}


# ---------------------------------------------------------------- eval.solve_return


@pytest.mark.parametrize(("env", "threshold"), [("CartPole-v1", 475.0), ("CartPole-v0", 195.0),
                                                 ("Acrobot-v1", -100.0), ("MountainCar-v0", -110.0)])
def test_solve_return_defaults_to_the_envs_reward_threshold(env, threshold, tmp_path):
    """It was 475 whatever the env: Acrobot, MountainCar and CartPole-v0 never counted as
    solved, and budget.stop_when_solved never fired."""
    spec = load_spec(None, ID + [f"env={env}", "budget.stop_when_solved=true"])
    assert spec.eval.solve_return == threshold
    # the resolved spec records the number, and loads back as it was
    assert json.loads(save_resolved(spec, tmp_path).read_text())["eval"]["solve_return"] == threshold
    assert load_spec(tmp_path / "config.json") == spec
    # one given is kept
    assert load_spec(None, ID + [f"env={env}", "eval.solve_return=-400"]).eval.solve_return == -400.0


def test_the_default_spec_resolves_as_before():
    spec = load_spec(None)
    assert spec == DEFAULT_SPEC
    assert (spec.eval.every, spec.eval.episodes, spec.eval.solve_return, spec.eval.solver) == (1000, 5, 475.0, -1)


def test_show_prints_the_envs_threshold(capsys):
    from swarm.cli import main

    assert main(["run", "--show", "--set", "env=Acrobot-v1"]) == 0
    # as a comment: a file started from it and given another env takes that env's
    assert "\n# solve_return = -100.0   # the env's reward_threshold while unset\n" in capsys.readouterr().out


def test_an_env_without_a_threshold_needs_solve_return_to_stop_when_solved(register, tmp_path):
    env = register("test_other_envs/NoThreshold-v0", entry_point=CARTPOLE, max_episode_steps=100)
    with pytest.raises(ConfigError, match=r"eval\.solve_return is unset and env = 'test_other_envs/NoThreshold-v0'"):
        load_spec(None, ID + [f"env={env}", "budget.stop_when_solved=true"])
    assert load_spec(None, ID + [f"env={env}", "budget.stop_when_solved=true",
                                 "eval.solve_return=80"]).eval.solve_return == 80.0
    # without stop_when_solved it stays unset, and loads back so
    spec = load_spec(None, ID + [f"env={env}"])
    assert spec.eval.solve_return is None
    assert load_spec(save_resolved(spec, tmp_path)) == spec


# ---------------------------------------------------------------- env = module:EnvId


@pytest.fixture
def env_module(tmp_path, monkeypatch):
    """``env_module(name, body)``: a module file on sys.path, forgotten (with what it
    registered) after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)
    gym.registry.pop("test_other_envs/FromModule-v0", None)


def test_env_may_name_the_module_that_registers_it(env_module):
    """Each peer makes its env with gymnasium.make, which imports MODULE of MODULE:EnvId; the
    spec check refused that form as not registered (a register() in the calling process
    does not reach the peers)."""
    mod = env_module("swarm_test_envs_ok", "import gymnasium\n"
                     f"gymnasium.register('test_other_envs/FromModule-v0', entry_point={CARTPOLE!r}, "
                     "max_episode_steps=50, reward_threshold=40.0)\n")
    spec = load_spec(None, ID + [f"env={mod}:test_other_envs/FromModule-v0"])
    assert (spec.env, spec.eval.solve_return) == (f"{mod}:test_other_envs/FromModule-v0", 40.0)
    env = make_env(spec.env)
    env.close()


def test_env_names_a_module_that_cannot_be_imported(env_module):
    bad = env_module("swarm_test_envs_bad", "raise RuntimeError('no license for this simulator')\n")
    with pytest.raises(ConfigError, match=rf"env = '{bad}:Walk-v0': cannot import module '{bad}'.*"
                                          "RuntimeError: no license"):
        load_spec(None, ID + [f"env={bad}:Walk-v0"])
    with pytest.raises(ConfigError, match=r"cannot import module 'swarm_test_no_such_module'.*ModuleNotFoundError"):
        load_spec(None, ID + ["env=swarm_test_no_such_module:CartPole-v1"])
    ok = env_module("swarm_test_envs_empty", "")
    with pytest.raises(ConfigError, match=rf"not a registered Gymnasium environment after importing '{ok}'"):
        load_spec(None, ID + [f"env={ok}:Walk-v0"])


# ---------------------------------------------------------------- evaluate


def test_evaluate_ends_an_episode_that_never_ends(register):
    """evaluate had no step bound: a greedy policy that never ended an episode of an env
    without a time limit held its peer for ever."""
    env = register("test_other_envs/Endless-v0", entry_point=Endless)   # no max_episode_steps
    agent = SimpleNamespace(act=lambda obs: 0)
    assert evaluate(env, agent, episodes=1) == [float(train.EVAL_MAX_STEPS)] == [10_000.0]
    assert evaluate(env, agent, episodes=2, max_steps=30) == [30.0, 30.0]
    with pytest.raises(ConfigError, match="max_steps"):
        evaluate(env, agent, max_steps=0)
    # an env's own time limit still ends its episodes
    limited = register("test_other_envs/Limited-v0", entry_point=Endless, max_episode_steps=40)
    assert evaluate(limited, agent, episodes=1) == [40.0]


# ---------------------------------------------------------------- make_env, for_env


def test_make_env_names_the_env_whatever_its_constructor_raised(register):
    def needs_jax(**kwargs):
        raise ModuleNotFoundError("No module named 'jax'")

    env = register("test_other_envs/NeedsJax-v0", entry_point=needs_jax)
    with pytest.raises(ConfigError, match=r"env = 'test_other_envs/NeedsJax-v0'.*ModuleNotFoundError.*jax"):
        make_env(env)


@pytest.mark.parametrize(("env_id", "space"), [("Blackjack-v1", r"Tuple\(Discrete"),
                                                ("FrozenLake-v1", r"Discrete\(16\)")])
def test_for_env_names_an_observation_space_it_cannot_take(env_id, space, replay):
    env = make_env(env_id)
    try:
        with pytest.raises(ConfigError, match=rf"observation space {space}.* is not a Box"):
            DQNAgent.for_env(env, replay)
    finally:
        env.close()


# ---------------------------------------------------------------- resume on another env


def test_resume_on_an_env_of_other_sizes_is_refused_naming_both(tmp_path):
    """It was accepted, and then every peer crashed on the replay schema."""
    prev = tmp_path / "acrobot"
    save_resolved(load_spec(None, ID + ["env=Acrobot-v1", "peers=2"]), prev)
    with pytest.raises(ConfigError, match=r"trained env = 'Acrobot-v1' \(observations of shape \(6,\), 3 actions\), "
                                          r"but env = 'CartPole-v1' has observations of shape \(4,\), 2 actions"):
        run_experiment(None, ["env=CartPole-v1"], resume=prev, runs_root=tmp_path / "runs", stream=io.StringIO())
    assert not (tmp_path / "runs").exists()
    # the same sizes pass this check (and stop at the next: there are no checkpoints here)
    prev = tmp_path / "v1"
    save_resolved(load_spec(None, ID + ["peers=2"]), prev)
    with pytest.raises(ConfigError, match="no peer of .* has a checkpoint"):
        run_experiment(None, ["env=CartPole-v0"], resume=prev, runs_root=tmp_path / "runs", stream=io.StringIO())


# ---------------------------------------------------------------- the scripts


def _fake_run(run_dir, spec, evals: dict[int, list[tuple[int, float]]]):
    """A finished run folder: its config.json, each peer's metrics and evaluations."""
    save_resolved(spec, run_dir)
    for rank in range(spec.peers):
        peer = run_dir / f"peer{rank}"
        peer.mkdir()
        (peer / "metrics.csv").write_text("env_steps,mean_return\n500,-300\n")
        (peer / "evals.csv").write_text("env_steps,eval_return\n"
                                        + "".join(f"{s},{r}\n" for s, r in evals.get(rank, [])))
    return RunResult(0, run_dir, [{"rank": r, "eval_return": -150.0} for r in range(spec.peers)])


def test_compare_runs_counts_a_solve_at_the_runs_own_solve_return(tmp_path, monkeypatch):
    """It counted against a fixed 475: an Acrobot peer at -92 did not count as solved."""
    monkeypatch.syspath_prepend(str(SCRIPTS))   # compare_runs imports bench_learning
    cr = load_script("compare_runs")
    spec = load_spec(None, ID + ["env=Acrobot-v1", "peers=2"])
    result = _fake_run(tmp_path / "run", spec, {0: [(500, -150.0), (1000, -92.0)], 1: [(500, -120.0)]})
    monkeypatch.setattr(cr, "run_experiment", lambda *a, **kw: result)
    out = cr.one_run(["env=Acrobot-v1"], tmp_path / "cmp")
    assert (out["peers_solved"], out["first_solve_steps"]) == (1, 1000)
    assert out["solve_return"] == -100.0


@pytest.mark.parametrize("key", ["env=Acrobot-v1", "eval.solve_return=-100"])
def test_bench_learning_refuses_a_set_of_what_it_sets_itself(key, monkeypatch, capsys):
    """--set env=... changed only the swarm side (the isolated side stays on CartPole-v1),
    and --set eval.solve_return=... was silently replaced."""
    bl = load_script("bench_learning")

    def runs(*a, **kw):
        raise AssertionError(f"--set {key} was taken: the benchmark started")

    monkeypatch.setattr(bl, "isolated_together", runs)
    monkeypatch.setattr(sys, "argv", ["bench_learning.py", "--set", key, "--set", "peers=2"])
    with pytest.raises(SystemExit) as e:
        bl.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--set {key.split('=')[0]}: each swarm run sets it itself" in err and "Traceback" not in err, err


# ---------------------------------------------------------------- review 45: spaces the agent cannot index


class Shifted(gym.Env):
    """Actions -1, 0, 1 (``Discrete(3, start=-1)``, as Gymnasium allows): it refuses any other."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), f"action {action} outside {self.action_space}"
        return np.zeros(1, np.float32), 0.0, False, False, {}


class Featureless(Shifted):
    """A bandit with no features: observations of shape (0,)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (0,), np.float32)
    action_space = gym.spaces.Discrete(2)


@pytest.mark.parametrize(("cls", "why"), [(Shifted, r"action space Discrete\(3, start=-1\).* 0\.\.n-1"),
                                          (Featureless, r"observation space Box.*\(0,\).* none of them 0")])
def test_spaces_the_agent_cannot_index_are_refused_up_front(register, replay, cls, why):
    # accepted, then every peer died at its first out-of-range action (start != 0: the
    # agent sends the indices 0..n-1 of its Q-values) or its first stored transition
    # (shape (0,)), after `swarm run` had made the run folder
    env_id = register(f"test_other_envs/{cls.__name__}-v0", entry_point=cls, max_episode_steps=20)
    with pytest.raises(ConfigError, match=f"env = '{env_id}': .*{why}"):
        load_spec(None, ID + [f"env={env_id}"])
    env = make_env(env_id)
    try:
        with pytest.raises(ConfigError, match=why):
            DQNAgent.for_env(env, replay)
    finally:
        env.close()


def test_the_isolated_scripts_random_baseline_ends_on_an_env_without_a_time_limit(register):
    # it looped until killed: its random episodes had no step cap, where evaluate's have
    env_id = register("test_other_envs/Endless-v0", entry_point=Endless)
    returns = load_script("dqn_isolated").random_returns(env_id, 1, 0)
    assert len(returns) == 1 and 0 < returns[0] <= train.EVAL_MAX_STEPS
