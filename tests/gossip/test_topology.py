"""Topologies checked against closed forms from spectral graph theory."""

import math

import numpy as np
import pytest

from swarm.errors import ConfigError
from swarm.gossip.topology import (
    TOPOLOGIES, all_receivers, mixing_matrix, neighbours, period, receivers, rounds_to_epsilon, senders,
    spectrum, weights, within,
)

TOL = 1e-9


@pytest.mark.parametrize("n", [4, 5, 16, 33])
def test_ring_lambda2_closed_form(n):
    s = spectrum(mixing_matrix("ring", n))
    assert abs(s.lambda2 - (1 + 2 * math.cos(2 * math.pi / n)) / 3) < TOL


def test_ring16_figure_from_issue():
    assert abs(spectrum(mixing_matrix("ring", 16)).lambda2 - 0.949253) < 1e-6


@pytest.mark.parametrize("k", [3, 4, 5])
def test_torus_lambda2_closed_form(k):
    w = mixing_matrix("torus", k * k)
    assert np.allclose(w[w > 0][w[w > 0] < 0.5], 0.2, atol=TOL)  # off-diagonal weights are 1/5
    assert abs(spectrum(w).lambda2 - (3 + 2 * math.cos(2 * math.pi / k)) / 5) < TOL


@pytest.mark.parametrize("d", [2, 3, 4, 5])
def test_hypercube_lambda2(d):
    assert abs(spectrum(mixing_matrix("hypercube", 2 ** d)).lambda2 - (d - 1) / (d + 1)) < TOL


def _one_peer_product(n):
    p = np.eye(n)
    for t in range(period("one_peer_exponential", n)):
        p = mixing_matrix("one_peer_exponential", n, t) @ p
    return p


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_one_peer_exponential_exact_for_powers_of_two(n):
    assert np.abs(_one_peer_product(n) - 1.0 / n).max() < TOL


@pytest.mark.parametrize("n", [3, 7, 12])
def test_hypercube_refuses_other_sizes(n):
    with pytest.raises(ConfigError, match="power of two"):
        mixing_matrix("hypercube", n)


def test_one_peer_exponential_not_exact_for_12():
    assert np.abs(_one_peer_product(12) - 1.0 / 12).max() > 1e-3


@pytest.mark.parametrize("topology,n", [(t, n) for t in TOPOLOGIES if t != "custom"
                                        for n in [1, 2, 3, 7, 12, 16]
                                        if not (t == "hypercube" and n & (n - 1))])
def test_every_matrix_doubly_stochastic(topology, n):
    for t in range(3):
        w = mixing_matrix(topology, n, t, seed=5)
        assert np.all(w >= -TOL)
        assert np.allclose(w.sum(0), 1, atol=TOL) and np.allclose(w.sum(1), 1, atol=TOL)
        if topology != "one_peer_exponential":
            assert np.allclose(w, w.T, atol=TOL)
        for i in range(n):
            nb = neighbours(topology, n, i, t, seed=5)
            assert i not in nb and len(nb) == len(set(nb))
            # support of the row is exactly the senders plus self
            assert set(np.nonzero(w[i] > 0)[0]) - {i} == set(senders(topology, n, i, t, seed=5))
            # j receives from i iff i sends to j
            for j in receivers(topology, n, i, t, seed=5):
                assert i in senders(topology, n, j, t, seed=5)


def test_small_rings_are_sane():
    assert neighbours("ring", 1, 0) == [] and weights("ring", 1, 0) == {0: 1.0}
    assert neighbours("ring", 2, 0) == [1] and neighbours("ring", 2, 1) == [0]
    assert weights("ring", 2, 0) == {1: 0.5, 0: 0.5}
    assert neighbours("ring", 3, 1) == [0, 2]


def test_grid_partial_last_row():
    # n = 10: 4 columns, rows of 4, 4, 2
    assert neighbours("grid", 10, 9) == [5, 8]
    assert neighbours("grid", 10, 7) == [3, 6]  # nothing below: row 3 has only 2 cells
    w = mixing_matrix("grid", 10)
    assert np.allclose(w, w.T) and np.allclose(w.sum(1), 1)
    assert spectrum(w).rho < 1  # connected


def test_torus_of_prime_is_ring():
    assert np.allclose(mixing_matrix("torus", 7), mixing_matrix("ring", 7))


def test_random_pairing_is_deterministic_and_changes():
    a = [neighbours("random_pairing", 8, 0, t, seed=1) for t in range(6)]
    b = [neighbours("random_pairing", 8, 0, t, seed=1) for t in range(6)]
    assert a == b and len({tuple(x) for x in a}) > 1
    assert period("random_pairing", 8) is None


def test_custom_edges():
    edges = [(0, 1), (1, 2), (2, 3)]
    assert neighbours("custom", 4, 1, edges=edges) == [0, 2]
    w = mixing_matrix("custom", 4, edges=edges)
    assert w[0, 1] == pytest.approx(1 / 3) and w[1, 2] == pytest.approx(1 / 3)
    assert np.allclose(w.sum(0), 1)


def test_a_view_smaller_than_the_custom_graph_links_what_it_has():
    edges = [[0, 1], [1, 2], [2, 3], [3, 0]]
    assert within(edges, 4) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert within(edges, 3) == [(0, 1), (1, 2)]      # position 3 is not there (yet, or any more)
    assert within(edges, 1) == []
    assert neighbours("custom", 3, 0, edges=within(edges, 3)) == [1]
    with pytest.raises(ConfigError, match="self-loop"):
        within([[0, 1], [2, 2]], 3)
    with pytest.raises(ConfigError, match="needs edges"):
        within(None, 3)


@pytest.mark.parametrize("bad", [
    dict(topology="star", n=4, i=0), dict(topology="ring", n=0, i=0),
    dict(topology="ring", n=4, i=4), dict(topology="ring", n=4, i=-1),
    dict(topology="ring", n=True, i=0), dict(topology="hypercube", n=12, i=0),
    dict(topology="custom", n=4, i=0), dict(topology="custom", n=4, i=0, edges=[(0, 7)]),
    dict(topology="custom", n=4, i=0, edges=[(1, 1)]), dict(topology="ring", n=4, i=0, t=-1),
])
def test_bad_input_raises_config_error(bad):
    with pytest.raises(ConfigError) as e:
        neighbours(bad.pop("topology"), bad.pop("n"), bad.pop("i"), **bad)
    assert str(e.value)


def test_unknown_topology_named_in_message():
    with pytest.raises(ConfigError, match="star"):
        mixing_matrix("star", 4)


def test_rounds_bound_matches_issue():
    assert rounds_to_epsilon(spectrum(mixing_matrix("ring", 16)).rho) == 133
    assert rounds_to_epsilon(spectrum(mixing_matrix("torus", 16)).rho) == 14


@pytest.mark.parametrize("topology", [t for t in TOPOLOGIES if t != "custom"])
def test_all_receivers_is_receivers_of_every_position(topology):
    for n in (1, 2, 3, 4, 7, 8, 16):
        for t in range(6):
            try:
                each = [receivers(topology, n, i, t, seed=3) for i in range(n)]
            except ConfigError:   # hypercube: powers of two only
                continue
            assert all_receivers(topology, n, t, seed=3) == each, (n, t)


@pytest.mark.parametrize("n,want", [
    (8, [1, 2, 4, 6, 7]),            # 4 = 0 + 4 = 0 - 4: the top power is its own antipode
    (11, [1, 2, 3, 4, 7, 8, 9, 10]),  # 0 + 8 = 0 - 3 and 0 - 8 = 0 + 3: links no lower power makes
    (16, [1, 2, 4, 8, 12, 14, 15]),
])
def test_exponential_links_every_power_of_two_below_n(n, want):
    """i ± 2^k (mod n) for every 2^k < n (docs/gossip.md), the largest one included."""
    assert neighbours("exponential", n, 0) == want
    assert neighbours("exponential", n, 3) == sorted({(3 + s * 2 ** k) % n for k in range(n.bit_length())
                                                      if 2 ** k < n for s in (1, -1)})


@pytest.mark.parametrize("n", [4, 8, 16])
def test_rho_of_the_directed_one_peer_exponential_graph_is_the_2_norm(n):
    """Round 0's W = (I + shift)/2 is not symmetric: rho = ||W - J/n||_2 = cos(pi/n), not the
    real part of lambda2 ((1 + cos(2 pi/n))/2, 0.854 for n = 8), which would undercount rounds."""
    s = spectrum(mixing_matrix("one_peer_exponential", n, 0))
    assert abs(s.rho - math.cos(math.pi / n)) < TOL
    assert abs(s.gap - (1 - math.cos(math.pi / n))) < TOL


@pytest.mark.parametrize("rho,eps,k", [
    (0.5, 0.4, 2),                   # ln 0.4 / ln 0.5 = 1.32: rounding would say 1, and 0.5 > 0.4
    (0.9, 0.5, 7),                   # 6.58
    (0.8, 1e-3, 31),                 # 30.96
    (0.5, 0.25, 2), (0.25, 0.0625, 2), (0.5, 2 ** -10, 10),   # exact powers: no extra round
])
def test_rounds_to_epsilon_is_the_least_k_with_rho_to_the_k_at_most_eps(rho, eps, k):
    assert rounds_to_epsilon(rho, eps) == k
    assert rho ** k <= eps < rho ** (k - 1)
