"""Experiments: a spec file → a coordinator and N peers on this host → a run folder.

What `swarm run grid.toml --set peers=9` does (the examples that need a spec file or
start a run are left out of doctest runs):

>>> from swarm.experiment import load_spec, run_experiment
>>> spec = load_spec("grid.toml", ["peers=9"])  # doctest: +SKIP
>>> run_experiment("grid.toml", ["peers=9"])  # doctest: +SKIP

From a script, a spec changed in code runs as it is (it is checked first), and
the result says where the run folder is and what each peer reached:

>>> spec = load_spec(None, ["peers=2", "budget.env_steps=2000"])
>>> for seed in (0, 1):  # doctest: +SKIP
...     r = run_experiment(dataclasses.replace(spec, seed=seed), stream=io.StringIO())
...     print(r.exit_code, r.run_dir, [p["final_mean_return"] for p in r.summary])

The peer-side loop (:func:`swarm.experiment.runner.run_peer`) imports torch on
first use, so specs load and validate without it.
"""

from .launch import RunResult, run_experiment
from .spec import DEFAULT_SPEC, Spec, load_spec, save_resolved

__all__ = ["Spec", "DEFAULT_SPEC", "load_spec", "save_resolved", "run_experiment", "RunResult"]
