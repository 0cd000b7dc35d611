"""Topology arguments a reviewer found mishandled: generator edges, numpy sizes, edge
values, seeds, and the spectral helpers' edge cases."""

from fractions import Fraction

import numpy as np
import pytest

from swarm import checks
from swarm.checks import seconds
from swarm.errors import ConfigError
from swarm.gossip.topology import (
    all_receivers, eccentricity, mixing_matrix, neighbours, period, receivers, rounds_to_epsilon, spectrum, weights,
    within,
)

PATH3 = [(0, 1), (1, 2)]


# ------------------------------------------------------------ generator edges

def test_all_receivers_reads_generator_edges_once():
    assert all_receivers("custom", 3, edges=iter(PATH3)) == [[1], [0, 2], [1]]


@pytest.mark.parametrize("fn", [neighbours, receivers, weights])
def test_one_peer_calls_take_generator_edges(fn):
    assert fn("custom", 3, 1, edges=iter(PATH3)) == fn("custom", 3, 1, edges=PATH3)


def test_generator_edges_agree_with_list_everywhere():
    assert np.array_equal(mixing_matrix("custom", 3, edges=iter(PATH3)), mixing_matrix("custom", 3, edges=PATH3))
    assert eccentricity("custom", 3, 0, edges=iter(PATH3)) == 2


# ------------------------------------------------------------ numpy sizes

def test_numpy_n_is_taken_as_an_int():
    assert neighbours("one_peer_exponential", np.int64(5), 0) == [1, 4]
    assert period("one_peer_exponential", np.int64(5)) == 3
    assert weights("hypercube", np.int64(4), 0) == weights("hypercube", 4, 0)
    out = neighbours("ring", np.int64(5), np.int64(0), np.int64(0))
    assert out == [1, 4] and all(type(j) is int for j in out)


# ------------------------------------------------------------ edge values

@pytest.mark.parametrize("edges", [[(0, 1.9)], [(True, 2)], [(0, "2")], [(0, float("nan"))], [(0, 1, 2)],
                                   [(0, np.float64(1.0))], ["01"]])
def test_bad_edge_values_are_refused(edges):
    with pytest.raises(ConfigError, match="edge"):
        neighbours("custom", 3, 0, edges=edges)
    with pytest.raises(ConfigError, match="edge"):
        within(edges, 3)


@pytest.mark.parametrize("edges", [5, None, object()])
def test_edges_not_a_list_is_a_config_error(edges):
    with pytest.raises(ConfigError, match="edges"):
        neighbours("custom", 3, 0, edges=edges)


def test_numpy_integer_edges_are_fine():
    edges = np.array([[0, 1], [1, 2]], dtype=np.int64)
    assert neighbours("custom", 3, 1, edges=edges) == [0, 2]
    assert within(edges, 2) == [(0, 1)] and all(type(a) is int for e in within(edges, 3) for a in e)


# ------------------------------------------------------------ seeds

@pytest.mark.parametrize("seed", [None, "x", 1.0, True, -1, 2**32, np.float64(3)])
def test_bad_random_pairing_seed_is_a_config_error(seed):
    with pytest.raises(ConfigError, match="seed"):
        neighbours("random_pairing", 4, 0, seed=seed)
    with pytest.raises(ConfigError, match="seed"):
        all_receivers("random_pairing", 4, seed=seed)


def test_seed_range_ends_are_accepted():
    for seed in (0, 2**32 - 1, np.uint32(7), np.int64(7)):
        pairs = all_receivers("random_pairing", 6, 3, seed=seed)
        assert sorted(len(p) for p in pairs) == [1] * 6
    assert all_receivers("random_pairing", 6, seed=np.int64(7)) == all_receivers("random_pairing", 6, seed=7)


def test_rng_seed_helper():
    assert checks.rng_seed(np.int64(5)) == 5 and type(checks.rng_seed(np.int64(5))) is int
    with pytest.raises(ConfigError, match="base_seed"):
        checks.rng_seed(-3, "base_seed")


# ------------------------------------------------------------ spectral helpers

def test_rounds_to_epsilon_tiny_rho_is_one_round():
    assert rounds_to_epsilon(1e-320) == 1
    assert rounds_to_epsilon(5e-324, 0.999) == 1


def test_rounds_to_epsilon_tiny_eps():
    assert rounds_to_epsilon(0.5, 5e-324) == 1074     # 5e-324 is 2**-1074
    assert rounds_to_epsilon(0.5, 0.25) == 2


@pytest.mark.parametrize("rho", ["0.5", False, True, None, float("nan"), 1.0, -0.1, Fraction(10**400 - 1, 10**400)])
def test_rounds_to_epsilon_bad_rho(rho):
    with pytest.raises(ConfigError, match="rho"):
        rounds_to_epsilon(rho)


@pytest.mark.parametrize("eps", ["0.1", True, None, float("nan"), 0, 1, Fraction(1, 10**400)])
def test_rounds_to_epsilon_bad_eps(eps):
    with pytest.raises(ConfigError, match="eps"):
        rounds_to_epsilon(0.5, eps)


def test_rounds_to_epsilon_takes_numpy_and_fractions():
    assert rounds_to_epsilon(np.float64(0.5), Fraction(1, 4)) == 2


@pytest.mark.parametrize("w", [np.full((2, 2), np.nan), [[1.0, np.inf], [0.0, 1.0]], [["a"]], [[object()]]])
def test_spectrum_bad_matrix_is_a_config_error(w):
    with pytest.raises(ConfigError, match="mixing matrix"):
        spectrum(w)


# ------------------------------------------------------------ seconds()

@pytest.mark.parametrize("v", [10**400, Fraction(10**400), -(10**400)])
def test_seconds_past_float_range_is_a_config_error(v):
    with pytest.raises(ConfigError, match="wait_s"):
        seconds(v, "wait_s")


def test_seconds_large_but_finite_is_fine():
    assert seconds(10**300) == 1e300 and seconds(Fraction(1, 2)) == 0.5
