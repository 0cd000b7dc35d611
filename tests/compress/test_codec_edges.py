"""Codec edge cases at the limits of float32: many qsgd levels, float32's largest value,
norms past its range, the top-k accelerator path's ranking, and the ef+ residual."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from swarm.compress import get_codec
from swarm.compress.sparse import TopK
from swarm.errors import GossipError

F32_MAX = np.finfo(np.float32).max


# ---- qsgd with 256 levels or more ---------------------------------------------------------------

@pytest.mark.parametrize("s", [256, 1000, 4096, 32767])
def test_qsgd_many_levels_round_an_element_at_its_norm_to_exactly_s(s):
    # bucket=1: every element carries its bucket's whole norm, so v = s (exactly, for
    # powers of two). float32's v + u rounded up to s + 1 for u near 1 (and 32768 wrapped
    # to -32768 in int16), which the sender's own decode then refused.
    x = np.tile(np.array([1.0, -2.0, 0.125, -1024.0], np.float32), 25_000)
    c = get_codec(f"qsgd:{s}:bucket=1:seed=3")
    for _ in range(3):
        enc = c.encode(x)
        q = enc.frames[0]
        assert np.array_equal(np.abs(q.astype(np.int64)), np.full(x.size, s))
        assert np.array_equal(np.sign(q), np.sign(x).astype(q.dtype))
        assert np.array_equal(c.decode(enc), x)


def test_qsgd_one_nonzero_per_bucket_survives_encode_decoded_under_ef():
    rng = np.random.default_rng(0)
    c = get_codec("ef+qsgd:32767:seed=0")
    for _ in range(20):
        g = np.zeros(512 * 200, np.float32)
        g[rng.integers(0, 512, 200) + np.arange(200) * 512] = rng.standard_normal(200)
        enc, y = c.encode_decoded(g)
        assert int(np.abs(enc.frames[0].astype(np.int64)).max()) == 32767
        assert np.isfinite(y).all() and np.isfinite(c.residual).all()


def test_qsgd_many_levels_is_unbiased_where_float32_would_round_v_plus_u():
    # Buckets [3, 1, 1, 1, 1, 1, 1, 1] have norm 4: with s = 32767 element 0 sits at exactly
    # v = 24575.25 levels and the others at 8191.75. float32's v + u rounded there, which
    # biased the levels up by about 2^-10 and 2^-12 (6 and 4 standard errors below).
    s, reps = 32767, 64
    x = np.tile(np.array([3, 1, 1, 1, 1, 1, 1, 1], np.float32), 1 << 17)
    c = get_codec(f"qsgd:{s}:bucket=8:seed=11")
    first = rest = 0
    for _ in range(reps):
        q = c.encode(x).frames[0].reshape(-1, 8).astype(np.int64)
        first += int(q[:, 0].sum())
        rest += int(q[:, 1:].sum())
    n0, n1 = reps * (1 << 17), reps * 7 * (1 << 17)
    v0, v1 = 3 * s / 4, s / 4
    # Bernoulli(frac) rounding: standard deviation sqrt(f (1 - f)) = sqrt(3)/4 for both
    se0, se1 = np.sqrt(3) / 4 / np.sqrt(n0), np.sqrt(3) / 4 / np.sqrt(n1)
    assert abs(first / n0 - v0) < 3 * se0
    assert abs(rest / n1 - v1) < 3 * se1


# ---- float32's largest value ------------------------------------------------------------------

@pytest.mark.parametrize("spec,bound", [("int8", 254), ("int8:stochastic:seed=2", 127),
                                        ("int8:block=1", 254)])
def test_int8_at_float32_max_decodes_finite_within_its_bound(spec, bound):
    x = np.array([F32_MAX, -F32_MAX, 1.0, 3e38], np.float32)
    y = get_codec(spec).decode(get_codec(spec).encode(x))
    assert np.isfinite(y).all()
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert err.max() <= float(F32_MAX) / bound


@pytest.mark.parametrize("s", [127, 200])
def test_qsgd_at_float32_max_decodes_finite(s):
    x = np.array([-F32_MAX, 0.0], np.float32)
    y = get_codec(f"qsgd:{s}:seed=0").decode(get_codec(f"qsgd:{s}:seed=0").encode(x))
    assert np.isfinite(y).all()
    assert abs(float(y[0]) - float(x[0])) < float(F32_MAX) / s and y[1] == 0


@pytest.mark.parametrize("spec", ["ef+int8", "ef+int8:stochastic:seed=1", "ef+fp16",
                                  "ef+topk:0.5:values=fp16"])
def test_ef_residual_stays_finite_at_float32_max(spec):
    # x + residual passes float32's range: it saturates instead of turning Inf, which
    # made ef+int8 raise on the next call and ef+fp16 carry an Inf residual for ever.
    c = get_codec(spec)
    x = np.array([F32_MAX, 1.0, -F32_MAX, 0.5], np.float32)
    for _ in range(5):
        enc, y = c.encode_decoded(x)
        assert np.isfinite(y).all() and np.isfinite(c.residual).all()
        assert np.abs(c.residual).max() <= float(F32_MAX) / 127


def test_ef_keeps_inf_input_in_the_residual_as_documented():
    c = get_codec("ef+fp16")
    c.encode(np.array([np.inf, 1.0], np.float32))
    assert np.isinf(c.residual[0]) and c.residual[1] == 0


# ---- qsgd norms past float32's range ----------------------------------------------------------

def test_qsgd_names_a_norm_past_float32_rather_than_nan_or_inf():
    x = np.full(4, 2e38, np.float32)
    with pytest.raises(GossipError, match=r"L2 norm of elements \[0, 4\) is 4e\+38") as info:
        get_codec("qsgd:seed=0").encode(x)
    assert "NaN" not in str(info.value)
    c = get_codec("ef+qsgd:seed=0")
    c.encode(np.ones(4, np.float32))
    before = c.residual
    with pytest.raises(GossipError, match="L2 norm"):
        c.encode(x)
    assert np.array_equal(c.residual, before)
    # a norm whose float32 sum of squares overflows but which fits float32 still works
    y = get_codec("qsgd:seed=0").decode(get_codec("qsgd:seed=0").encode(np.full(600, 1e20, np.float32)))
    assert np.isfinite(y).all()
    bad = np.full(4, 2e38, np.float32)
    bad[2] = np.nan
    with pytest.raises(GossipError, match="NaN or Inf"):
        get_codec("qsgd:seed=0").encode(bad)


# ---- top-k's accelerator path -----------------------------------------------------------------

def test_topk_device_path_ranks_nan_last_and_breaks_ties_by_index():
    # The accelerator path is plain torch code; run it on CPU tensors here.
    import torch

    c = TopK(ratio=0.25)
    for x in [np.array([1, 5, np.nan, 2, 5, 5, 0, 3], np.float32),
              np.array([5, 1, 5, 2, 5, 5, 0, 5], np.float32),
              np.array([np.nan, 0, np.nan, 0, np.nan, np.nan, 0, 0], np.float32),
              np.array([np.nan, np.nan, 1, np.nan, np.nan, np.nan, np.nan, np.nan], np.float32),
              np.array([-np.inf, 1, np.nan, np.inf, 2, 3, 4, 5], np.float32)]:
        enc = c._encode_device(torch.from_numpy(x))
        want = c.encode(x)
        assert enc.meta == want.meta and np.array_equal(enc.frames[0], want.frames[0])
        assert np.array_equal(enc.frames[1], want.frames[1], equal_nan=True)


def test_topk_device_path_agrees_with_numpy_on_ties_nan_and_zeros():
    import torch

    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(1, 300))
        # few distinct magnitudes, so ties at the cut are common
        x = (rng.integers(-3, 4, n) * rng.choice([1.0, 0.5])).astype(np.float32)
        x[rng.random(n) < 0.1] = np.nan
        x[rng.random(n) < 0.02] = np.inf
        x[rng.random(n) < 0.2] = -0.0
        c = TopK(ratio=float(rng.choice([0.01, 0.1, 0.3, 0.7, 1.0])))
        enc, want = c._encode_device(torch.from_numpy(x)), c.encode(x)
        assert np.array_equal(enc.frames[0], want.frames[0]), (trial, x)
        assert np.array_equal(enc.frames[1], want.frames[1], equal_nan=True), (trial, x)


def test_importing_the_codecs_does_not_import_torch():
    code = "import sys, swarm.compress; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# ---- the ef+ residual -------------------------------------------------------------------------

def test_ef_residual_is_a_snapshot_that_later_encodes_do_not_change():
    rng = np.random.default_rng(0)
    c = get_codec("ef+topk:0.25")
    c.encode(rng.standard_normal(8).astype(np.float32))
    r = c.residual
    saved = r.copy()
    for _ in range(3):
        c.encode(rng.standard_normal(8).astype(np.float32))
        assert np.array_equal(r, saved)
        assert not np.array_equal(c.residual, saved)
    r[:] = 1e9   # the caller's own copy: the codec's residual does not change
    assert not np.array_equal(c.residual, r)
