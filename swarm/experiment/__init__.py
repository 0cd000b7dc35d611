"""Experiments: a spec file → a coordinator and N peers on this host → a run folder.

>>> from swarm.experiment import load_spec, run_experiment
>>> spec = load_spec("grid.toml", ["peers=9"])
>>> run_experiment("grid.toml", ["peers=9"])     # what `swarm run grid.toml --set peers=9` does

The peer-side loop (:func:`swarm.experiment.runner.run_peer`) imports torch on
first use, so specs load and validate without it.
"""

from .launch import run_experiment
from .spec import DEFAULT_SPEC, Spec, load_spec, save_resolved

__all__ = ["Spec", "DEFAULT_SPEC", "load_spec", "save_resolved", "run_experiment"]
