import json
from dataclasses import replace

import pytest

from swarm.config import to_dict
from swarm.errors import ConfigError
from swarm.experiment.spec import DEFAULT_SPEC, Spec, load_spec, save_resolved, swarm_dqn

# Most tests pin the cheapest codec so that they check one thing each.
ID = ["gossip.codec=identity"]


def test_default_spec_loads_and_is_the_built_in_default():
    spec = load_spec(None)
    assert spec == DEFAULT_SPEC
    assert (spec.env, spec.peers, spec.gossip.topology, spec.gossip.codec, spec.buffer.sharing) == \
        ("CartPole-v1", 4, "ring", "ef+topk:0.15:values=fp16", True)


def test_default_values():
    d = DEFAULT_SPEC
    assert (d.env, d.peers, d.gossip.topology, d.gossip.codec, d.buffer.sharing, d.algorithm) == \
        ("CartPole-v1", 4, "ring", "ef+topk:0.15:values=fp16", True, "dqn")


def test_a_section_changes_only_what_it_names(tmp_path):
    """The spec's dqn defaults are the swarm's (swarm_dqn), not DQNConfig's; a [dqn]
    table in a file or a dqn.* override keeps the spec's value of every other key."""
    from swarm.rl.hparams import DQNConfig

    assert DEFAULT_SPEC.dqn == swarm_dqn() != DQNConfig()
    f = tmp_path / "exp.toml"
    f.write_text('[dqn]\nhidden = [32]\n[budget]\nenv_steps = 3000\n')
    spec = load_spec(f, ID + ["dqn.gamma=0.98"])
    assert (spec.dqn.hidden, spec.dqn.gamma, spec.budget.env_steps) == ([32], 0.98, 3000)
    assert replace(spec.dqn, hidden=swarm_dqn().hidden, gamma=swarm_dqn().gamma) == swarm_dqn()
    assert spec.budget.max_seconds == DEFAULT_SPEC.budget.max_seconds
    # and the resolved config loads back as it was
    assert load_spec(save_resolved(spec, tmp_path / "run")) == spec


def test_overrides_reach_nested_sections_with_types():
    spec = load_spec(None, ID + ["peers=8", "gossip.topology=grid", "dqn.lr=5e-4", "dqn.hidden=[32, 16]",
                                 "buffer.sharing=false", "name=my-run"])
    assert spec.peers == 8 and spec.gossip.topology == "grid"
    assert spec.dqn.lr == 5e-4 and spec.dqn.hidden == [32, 16]
    assert spec.buffer.sharing is False and spec.name == "my-run"
    assert spec.peer_seed(3) == spec.seed + 3


def test_a_number_for_a_text_setting_says_how_to_quote_it():
    # `--set name=2024` reads a TOML number; the error says how to give it as text
    with pytest.raises(ConfigError, match=r"name: expected a string, got 2024; quote it to give it as text"):
        load_spec(None, ID + ["name=2024"])
    assert load_spec(None, ID + ['name="2024"']).name == "2024"


def test_file_then_overrides(tmp_path):
    f = tmp_path / "exp.toml"
    f.write_text('name = "from-file"\npeers = 6\n[gossip]\ncodec = "identity"\ninterval = 10\n')
    spec = load_spec(f, ["peers=3"])
    assert (spec.name, spec.peers, spec.gossip.interval) == ("from-file", 3, 10)
    assert spec.dqn == DEFAULT_SPEC.dqn  # untouched sections keep defaults


def test_save_resolved_round_trips(tmp_path):
    spec = load_spec(None, ID + ["peers=5", "dqn.tau=0.05"])
    path = save_resolved(spec, tmp_path)
    assert path == tmp_path / "config.json"
    assert json.loads(path.read_text()) == to_dict(spec)
    assert load_spec(path) == spec
    fresh = save_resolved(spec, tmp_path / "runs" / "x-1")       # a run folder not made yet
    assert fresh == tmp_path / "runs" / "x-1" / "config.json" and load_spec(fresh) == spec
    named = save_resolved(spec, tmp_path / "resolved.json")
    assert named.name == "resolved.json" and load_spec(named) == spec


@pytest.mark.parametrize("override, key", [
    ("peers=0", "peers"),
    ("peers=four", "peers"),
    ("seed=-1", "seed"),
    ("seed=99999999999999999999", "seed"),
    ("seed=4294967296", "seed"),
    ("peers=1025", "peers"),
    ("peers=100000", "peers"),
    ("name=has space", "name"),
    ("env=CartPole-v9000", "env"),
    ("algorithm=ppo", "algorithm"),
    ("gossip.topology=star", "gossip.topology"),
    ("gossip.sync=sometimes", "gossip.sync"),
    ("gossip.max_staleness=-1", "gossip.max_staleness"),
    ("gossip.interval=0", "gossip.interval"),
    ("gossip.step_size=1.5", "gossip.step_size"),
    ("gossip.codec=nonsense:9", "gossip.codec"),
    ("gossip.edges=[[0, 1]]", "gossip.edges"),
    ("gossip.topology=custom", "gossip.edges"),
    ("buffer.capacity=0", "buffer.capacity"),
    ("buffer.capacity=10", "buffer.capacity"),
    ("buffer.share=2.0", "buffer.share"),
    ("buffer.alpha=-0.1", "buffer.alpha"),
    ("buffer.share_by=oldest", "buffer.share_by"),
    ("buffer.replicas=-1", "buffer.replicas"),
    ("buffer.replicas=4", "buffer.replicas"),
    ("buffer.rate=-1", "buffer.rate"),
    ("dqn.lr=0", "dqn.lr"),
    ("dqn.gamma=1.0", "dqn.gamma"),
    ("dqn.hidden=[]", "dqn.hidden"),
    ("dqn.hidden=[64, 0]", "dqn.hidden"),
    ("dqn.tau=0", "dqn.tau"),
    ("dqn.eps_start=0.01", "dqn.eps_end"),
    ("dqn.eps_start=2", "dqn.eps_start"),
    ("dqn.learning_starts=50000", "dqn.learning_starts"),
    ("dqn.double=maybe", "dqn.double"),
    ("budget.env_steps=0", "budget.env_steps"),
    ("eval.episodes=0", "eval.episodes"),
    ("eval.every=-5", "eval.every"),
    ("dqn.colour=blue", "dqn.colour"),
    ("gossip.exchange=weights", "gossip.exchange"),
    ("gossip.relay_staleness=0", "gossip.relay_staleness"),
    ("nonsense=1", "nonsense"),
])
def test_every_error_names_the_key(override, key):
    overrides = ID + [override] if not override.startswith("gossip.codec") else [override]
    with pytest.raises(ConfigError) as info:
        load_spec(None, overrides)
    assert key in str(info.value), str(info.value)


def test_codec_names_are_checked_by_swarm_compress():
    assert load_spec(None, ["gossip.codec=ef+int8"]).gossip.codec == "ef+int8"
    with pytest.raises(ConfigError, match="gossip.codec.*topk"):
        load_spec(None, ["gossip.codec=topk:2.0"])


def test_loading_a_spec_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from swarm.experiment.spec import load_spec; load_spec(None); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_env_typo_gets_a_suggestion():
    with pytest.raises(ConfigError, match="CartPole-v1"):
        load_spec(None, ID + ["env=CartPole-v2"])


@pytest.mark.parametrize("env, why", [
    ("Pendulum-v1", "action space Box.* is not Discrete"),
    ("LunarLander-v3", "cannot be made: Box2D is not installed"),
    ("Blackjack-v1", "observation space Tuple.* is not a Box"),
    ("FrozenLake-v1", "observation space Discrete.* is not a Box"),
])
def test_envs_the_dqn_cannot_use_are_refused(env, why):
    """Made once at validation, so that neither `swarm run --show` nor `swarm run`
    gets past the spec with an env every peer would crash on."""
    if env == "LunarLander-v3":
        try:
            import Box2D  # noqa: F401
        except ImportError:
            pass
        else:
            pytest.skip("Box2D is installed here")
    with pytest.raises(ConfigError, match=f"env = '{env}': .*{why}"):
        load_spec(None, ID + [f"env={env}"])
    assert load_spec(None, ID + ["env=Acrobot-v1"]).env == "Acrobot-v1"


def test_the_largest_seed_and_swarm_are_accepted():
    spec = load_spec(None, ID + ["seed=4294967295", "peers=1024", "gossip.topology=random_pairing"])
    assert spec.peer_seed(1023) == 4294967295 + 1023


def test_topology_size_constraints_are_checked():
    with pytest.raises(ConfigError, match="gossip.topology.*hypercube"):
        load_spec(None, ID + ["gossip.topology=hypercube", "peers=6"])
    assert load_spec(None, ID + ["gossip.topology=hypercube", "peers=8"]).peers == 8
    spec = load_spec(None, ID + ["gossip.topology=custom", "gossip.edges=[[0, 1], [1, 2], [2, 3]]"])
    assert spec.gossip.edges == [[0, 1], [1, 2], [2, 3]]
    with pytest.raises(ConfigError, match=r"gossip.edges: the graph is not connected: .* peers 2, 3,"):
        load_spec(None, ID + ["gossip.topology=custom", "gossip.edges=[[0, 1], [2, 3]]"])
    with pytest.raises(ConfigError, match=r"gossip.edges: .* peers 3,"):     # peer 3 has no edge
        load_spec(None, ID + ["gossip.topology=custom", "gossip.edges=[[0, 1], [1, 2]]"])


def test_stop_when_solved_needs_evaluation():
    with pytest.raises(ConfigError, match="budget.stop_when_solved"):
        load_spec(None, ID + ["budget.stop_when_solved=true", "eval.every=0"])


def test_eval_solver_is_a_rank_or_any():
    assert load_spec(None, ID).eval.solver == -1
    assert load_spec(None, ID + ["peers=4", "eval.solver=3"]).eval.solver == 3
    with pytest.raises(ConfigError, match="eval.solver"):
        load_spec(None, ID + ["peers=4", "eval.solver=4"])
    with pytest.raises(ConfigError, match="eval.solver"):
        load_spec(None, ID + ["eval.solver=-2"])


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path / "missing.toml")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json"):
        load_spec(bad)
    nested = tmp_path / "nested.toml"
    nested.write_text('[gossip]\ntopology = 3\n')
    with pytest.raises(ConfigError, match="gossip.topology"):
        load_spec(nested, ID)


def test_spec_is_a_plain_dataclass_without_loading():
    assert isinstance(Spec(peers=2), Spec)


def test_gradient_relay_needs_a_fixed_graph_and_async_rounds():
    with pytest.raises(ConfigError, match="gossip.exchange = gradients with gossip.topology"):
        load_spec(None, ["gossip.exchange=gradients", "gossip.topology=random_pairing", "gossip.sync=async"])
    with pytest.raises(ConfigError, match="gossip.sync = 'bounded' with gossip.exchange = gradients"):
        load_spec(None, ["gossip.exchange=gradients"])
    with pytest.raises(ConfigError, match="gossip.average = false with gossip.exchange = params"):
        load_spec(None, ["gossip.average=false"])
    with pytest.raises(ConfigError, match="dqn.learning_starts = 100 with gossip.exchange = gradients"):
        load_spec(None, ["gossip.exchange=gradients", "gossip.sync=async", "dqn.learning_starts=100",
                         "dqn.batch_size=128"])
    # without averaging there are no parameter rounds to stall against the turns
    assert load_spec(None, ["gossip.exchange=gradients", "gossip.average=false"]).gossip.sync == "bounded"
    spec = load_spec(None, ["gossip.exchange=gradients", "gossip.topology=grid", "peers=6", "gossip.sync=async"])
    assert spec.gossip.exchange == "gradients" and spec.gossip.relay_staleness == 1


def test_show_prints_a_toml_spec_that_loads_back(tmp_path):
    """`swarm run --show` prints the resolved spec, each key under its help, and
    runs nothing; the output is a spec file for the same experiment."""
    import os
    import subprocess
    import sys

    from swarmtest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    sets = ["peers=3", "dqn.lr=0.01", "dqn.hidden=[32, 16]", "gossip.codec=int8", "buffer.eps=1e-7",
            "gossip.edges=[[0, 1], [1, 2], [2, 0]]", "gossip.topology=custom", "name=shown"]
    args = [sys.executable, "-m", "swarm.cli", "run", "--show"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "runs").exists()
    f = tmp_path / "shown.toml"
    f.write_text(p.stdout)
    assert load_spec(f) == load_spec(None, sets)
    assert "# Adam learning rate\nlr = 0.01\n" in p.stdout and "\n[dqn]\n" in p.stdout
    # a bad value is the usual error, naming the key, and nothing is printed
    bad = subprocess.run(args + ["--set", "dqn.tau=2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "dqn.tau" in bad.stderr and bad.stdout == "", (bad.stdout, bad.stderr)


def test_the_default_name_follows_the_env_and_the_topology(tmp_path):
    # `swarm run --set gossip.topology=grid` was filed under runs/cartpole-ring-*
    assert load_spec().name == "cartpole-ring"
    assert load_spec(None, ["gossip.topology=grid"]).name == "cartpole-grid"
    assert load_spec(None, ["env=Acrobot-v1", "gossip.topology=full"]).name == "acrobot-full"
    assert load_spec(None, ["gossip.topology=grid", "name=mine"]).name == "mine"
    # the resolved name is saved in config.json: a resumed run keeps it whatever it overrides
    saved = save_resolved(load_spec(None, ["gossip.topology=grid"]), tmp_path)
    assert load_spec(saved, ["gossip.topology=ring"]).name == "cartpole-grid"


def test_a_round_timeout_is_at_most_an_hour():
    # 1e12 loaded, and every peer's first gossip round failed with an OverflowError from
    # the wait for the round (round_timeout_s + 10 s, past threading.TIMEOUT_MAX)
    with pytest.raises(ConfigError, match=r"gossip.round_timeout_s = 1000000000000.0: must be in"):
        load_spec(None, ID + ["gossip.round_timeout_s=1e12"])
    with pytest.raises(ConfigError, match=r"gossip.round_timeout_s = 3601: must be in \(0, 3600\]"):
        load_spec(None, ID + ["gossip.round_timeout_s=3601"])
    assert load_spec(None, ID + ["gossip.round_timeout_s=3600"]).gossip.round_timeout_s == 3600.0
    # the bootstrap's deadline (it was a fixed 5 s: a slow link could never bootstrap a large model)
    with pytest.raises(ConfigError, match=r"gossip.bootstrap_timeout_s = 0: must be in \(0, 3600\]"):
        load_spec(None, ID + ["gossip.bootstrap_timeout_s=0"])
    assert load_spec(None, ID + ["gossip.bootstrap_timeout_s=60"]).gossip.bootstrap_timeout_s == 60.0


def test_a_name_too_long_for_a_run_folder_is_refused():
    # 300 characters loaded, and `swarm run` failed later making runs/NAME-TIME ("File name too long")
    with pytest.raises(ConfigError, match=r"^name = 'a{201}': .*at most 200"):
        load_spec(None, ID + ["name=" + "a" * 201])
    assert load_spec(None, ID + ["name=" + "a" * 200]).name == "a" * 200


def test_a_train_every_that_leaves_no_update_within_the_budget_is_refused():
    # updates come at the steps >= learning_starts that are multiples of train_every:
    # 300 here, and the steps end at 299; the agent never learnt, without a word
    never = ["budget.env_steps=300", "dqn.learning_starts=250", "dqn.train_every=100"]
    with pytest.raises(ConfigError, match=r"dqn.train_every = 100 with dqn.learning_starts = 250: the first update "
                                          r"would come at env step 300, not below budget.env_steps = 300"):
        load_spec(None, ID + never)
    assert load_spec(None, ID + never + ["budget.env_steps=301"]).budget.env_steps == 301
    with pytest.raises(ConfigError, match="dqn.learning_starts = 300 is not below budget.env_steps = 300"):
        load_spec(None, ID + ["budget.env_steps=300", "dqn.learning_starts=300"])


def test_stop_when_solved_needs_an_evaluation_within_the_budget():
    # eval.every past the budget: no evaluation ever ran, so the run could not stop when solved
    with pytest.raises(ConfigError, match=r"budget.stop_when_solved = true with eval.every = 10001 above "
                                          r"budget.env_steps = 10000"):
        load_spec(None, ID + ["budget.stop_when_solved=true", "eval.every=10001"])
    assert load_spec(None, ID + ["budget.stop_when_solved=true", "eval.every=10000"]).eval.every == 10000
    assert load_spec(None, ID + ["eval.every=10001"]).eval.every == 10001   # without it: only no evaluation


@pytest.mark.parametrize("edges, why", [
    ("[[0, 1], [1, 2], [2, 3], [3, 4]]", r"edge \[3, 4\] has a position outside \[0, 4\)"),
    ("[[0, 0], [0, 1], [1, 2], [2, 3]]", r"edge \[0, 0\] is a self-loop"),
    ("[[0, 1, 2]]", r"edge \[0, 1, 2\] is not a pair"),
])
def test_a_bad_custom_edge_is_named_as_gossip_edges(edges, why):
    # the error named gossip.topology (= 'custom', which is right), not the edge list
    with pytest.raises(ConfigError, match=rf"^gossip.edges with peers = 4: .*{why}"):
        load_spec(None, ID + ["gossip.topology=custom", f"gossip.edges={edges}"])


@pytest.mark.parametrize("override", ["dqn.lr=1" + "0" * 400, "gossip.step_size=1" + "0" * 400,
                                      "eval.solve_return=-1" + "0" * 400])
def test_an_integer_too_large_for_a_number_is_a_config_error(override):
    # TOML integers have no bound: one past the largest float was an OverflowError
    # (a traceback from `swarm run --show`), not an error naming the key
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{key}: must be finite, got an integer beyond the largest float"):
        load_spec(None, ID + [override])


def test_a_spec_started_from_show_derives_name_and_threshold_again(tmp_path):
    # `swarm run --show > my.toml` pinned name = "cartpole-ring" and solve_return = 475.0:
    # with another env and topology set in it, the run kept both (Acrobot never reaches 475)
    from swarm.experiment.spec import show_spec

    f = tmp_path / "my.toml"
    f.write_text(show_spec())
    assert load_spec(f) == load_spec()
    spec = load_spec(f, ["env=Acrobot-v1", "gossip.topology=grid"])
    assert (spec.name, spec.eval.solve_return) == ("acrobot-grid", -100.0)
    # what the file or the overrides set is written as set
    f.write_text(show_spec(None, ["name=mine", "eval.solve_return=400"]))
    spec = load_spec(f, ["env=Acrobot-v1"])
    assert (spec.name, spec.eval.solve_return) == ("mine", 400.0)


def test_the_link_section_is_shown_and_an_older_config_json_without_it_loads_at_its_defaults(tmp_path):
    # `swarm run --show` lists link.* under their help; a run folder's config.json written
    # before the section existed still loads (swarm run --resume), with PeerConfig's defaults
    from swarm.config import PeerConfig
    from swarm.experiment.spec import show_spec

    shown = show_spec(None, ["link.timeout_s=2.5"])
    assert "\n[link]\n" in shown and "\ntimeout_s = 2.5\n" in shown and "\nmax_message_mb = 512" in shown, shown
    old = to_dict(load_spec(None, ID))
    del old["link"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    link = load_spec(tmp_path / "config.json").link
    assert (link.timeout_s, link.max_message_mb) == (PeerConfig().link_timeout_s, PeerConfig().max_message_mb)


_GRAD = ["gossip.exchange='gradients'", "gossip.topology='ring'", "gossip.sync='async'"]


@pytest.mark.parametrize("at, got, past, match", [
    (["buffer.ack_timeout_s=5.0", "buffer.ack_timeout_max_s=5.0"], lambda s: s.buffer.ack_timeout_max_s == 5.0,
     ["buffer.ack_timeout_s=5.0", "buffer.ack_timeout_max_s=4.9"],
     r"^buffer\.ack_timeout_max_s = 4\.9 is below buffer\.ack_timeout_s = 5: the longest wait"),
    (_GRAD + ["dqn.learning_starts=32"], lambda s: s.dqn.learning_starts == s.dqn.batch_size == 32,
     _GRAD + ["dqn.learning_starts=31"],
     r"^dqn\.learning_starts = 31 with gossip\.exchange = gradients: must be at least dqn\.batch_size = 32,"),
    (["buffer.capacity=32"], lambda s: s.buffer.capacity == s.dqn.batch_size == 32, ["buffer.capacity=31"],
     r"^buffer\.capacity = 31 is below dqn\.batch_size = 32; a batch could never be sampled$"),
    (["checkpoint.full_every_steps=500", "checkpoint.incremental_every_steps=499"],
     lambda s: (s.checkpoint.incremental_every_steps, s.checkpoint.full_every_steps) == (499, 500),
     ["checkpoint.full_every_steps=500", "checkpoint.incremental_every_steps=500"],
     r"^checkpoint\.incremental_every_steps = 500 is not below checkpoint\.full_every_steps = 500; every "
     "incremental one would coincide with a full one$"),
], ids=["ack_timeout_max_s", "learning_starts_with_gradients", "capacity", "incremental_every_steps"])
def test_each_cross_field_rule_takes_its_bound_and_refuses_the_first_value_past_it(at, got, past, match):
    # "must be at least dqn.batch_size = 32" must take 32
    base = ID + ["budget.env_steps=1000", "dqn.batch_size=32", "dqn.learning_starts=100", "dqn.train_every=1"]
    assert got(load_spec(None, base + at))
    with pytest.raises(ConfigError, match=match):
        load_spec(None, base + past)
