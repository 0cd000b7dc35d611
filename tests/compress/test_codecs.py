"""Codec properties: round trips, error bounds, unbiasedness, exact top-k, byte counts."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from swarm import wire
from swarm.compress import CODECS, Encoded, ErrorFeedback, get_codec
from swarm.compress.sparse import TopK, pack_gaps, strata_indices, unpack_gaps
from swarm.errors import GossipError, WireError

FAST = settings(max_examples=25, deadline=None)
ALL = ["identity", "fp16", "int8", "int8:stochastic", "qsgd:16", "qsgd:300", "topk:0.1",
       "randomk:0.1", "sign", "sign:block=0", "sign:block=8", "ef+topk:0.05", "ef+sign"]

finite = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)


def vec(min_size=0, max_size=600, elements=finite):
    return arrays(np.float32, st.integers(min_size, max_size), elements=elements)


def through_wire(enc: Encoded) -> Encoded:
    """Send an Encoded through swarm.wire as bytes and back (read-only frombuffer frames)."""
    frames = wire.encode("hello", "p0", body={"meta": enc.meta}, arrays=enc.frames)
    raw = [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in frames]
    msg = wire.decode(raw)
    return Encoded(msg.body["meta"], msg.arrays)


def blocks(x: np.ndarray, B: int):
    for a in range(0, x.size, B):
        yield a, x[a:a + B]


# ---- every codec ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ALL)
@FAST
@given(x=vec())
def test_wire_round_trip_and_decode_into_agree(spec, x):
    codec = get_codec(spec)
    enc = codec.encode(x)
    assert enc.meta["n"] == x.size
    msgpack.packb(enc.meta)  # meta holds plain scalars only
    assert enc.nbytes == sum(f.nbytes for f in enc.frames)
    back = through_wire(enc)
    y = codec.decode(back)
    assert y.dtype == np.float32 and y.shape == (x.size,)
    assert np.array_equal(y, codec.decode(enc))
    acc = np.full(x.size, 2.0, np.float32)
    codec.decode_into(back, acc)
    np.testing.assert_allclose(acc, y + 2.0, rtol=1e-6, atol=1e-6 * (1 + np.abs(y).max(initial=0)))
    acc = np.zeros(x.size, np.float32)
    codec.decode_into(back, acc, alpha=-0.5)
    np.testing.assert_allclose(acc, -0.5 * y, rtol=1e-6, atol=1e-30)


def test_every_family_is_in_the_registry():
    assert set(CODECS) == {"identity", "fp16", "int8", "qsgd", "topk", "randomk", "sign"}


def _index_bytes(ratio, n):
    # gap codes of the k largest of standard_normal(n) with seed n, as the test draws them
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    k = max(1, round(ratio * n))
    idx = np.sort(np.argsort(-np.abs(x), kind="stable")[:k])
    gaps = np.diff(idx, prepend=-1) - 1
    return int((gaps // 255 + 1).sum())


@pytest.mark.parametrize("spec,expect", [
    ("identity", lambda n: 4 * n),
    ("fp16", lambda n: 2 * n),
    ("int8", lambda n: n + 4 * math.ceil(n / 256)),
    ("int8:block=64", lambda n: n + 4 * math.ceil(n / 64)),
    ("qsgd:16", lambda n: n + 4 * math.ceil(n / 512)),
    ("qsgd:1000", lambda n: 2 * n + 4 * math.ceil(n / 512)),
    ("topk:0.01", lambda n: 4 * max(1, round(0.01 * n)) + _index_bytes(0.01, n)),
    ("randomk:0.01", lambda n: 4 * max(1, round(0.01 * n))),
    ("sign", lambda n: math.ceil(n / 8) + 4 * math.ceil(n / 256)),
    ("sign:block=64", lambda n: math.ceil(n / 8) + 4 * math.ceil(n / 64)),
    ("sign:block=0", lambda n: math.ceil(n / 8)),
])
@pytest.mark.parametrize("n", [1, 7, 256, 1000, 12345])
def test_byte_counts_match_frames_and_formula(spec, expect, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    enc = get_codec(spec).encode(x)
    assert enc.nbytes == expect(n)
    frames = wire.encode("hello", "p0", body={"meta": enc.meta}, arrays=enc.frames)
    assert sum(len(memoryview(f).cast("B")) for f in frames[1:]) == enc.nbytes
    assert enc.meta_nbytes() < 100


@pytest.mark.parametrize("spec", ["identity", "fp16", "int8", "qsgd:16", "sign", "sign:block=0",
                                  "randomk:0.01", "topk:0.1", "topk:0.01", "topk:0.003", "topk:0.001",
                                  "topk:0.001:values=fp16", "topk:0.001:values=fp8",
                                  "ef+topk:0.001"])
def test_ratio_matches_the_bytes_sent_for_unstructured_data(spec):
    """ratio(n) is what docs/compress.md quotes: on standard-normal data it must be
    the ratio of the bytes really sent. Top-k's index codes grow as the kept share
    falls (4.4 bytes per index at 0.1%); ratio(n) once counted one byte each (800
    for topk:0.001 against 474 sent)."""
    n = 200_000
    sent = []
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        sent.append(4 * n / get_codec(spec).encode(x).nbytes)
    assert get_codec(spec).ratio(n) == pytest.approx(np.mean(sent), rel=0.01)


def test_empty_vector():
    for spec in ALL:
        enc = get_codec(spec).encode(np.zeros(0, np.float32))
        assert get_codec(spec).decode(enc).size == 0


# ---- identity, fp16 -------------------------------------------------------------------------

@FAST
@given(x=vec(elements=st.floats(width=32, allow_nan=True, allow_infinity=True)))
def test_identity_is_exact(x):
    c = get_codec("identity")
    y = c.decode(through_wire(c.encode(x)))
    assert np.array_equal(y.view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("spec", ["fp16", "topk:1:values=fp16"])
@pytest.mark.parametrize("mul", [1.0, 1e-12, 1e30])
@FAST
@given(x=vec(elements=st.floats(-1e7, 1e7, width=32)))
def test_fp16_error_bound(spec, mul, x):
    """float16's own error at every range: relative 2⁻¹¹, or 2⁻²⁵ absolute below
    2⁻¹⁴, both times the power-of-two scale sent when the largest value's float16
    would be Inf (1e6 keeps 11 bits instead of saturating at 65504); small values
    are never scaled up (an older peer ignores the scale)."""
    x = (x * np.float32(mul)).astype(np.float32)
    c = get_codec(spec)
    enc = c.encode(x)
    s = enc.meta.get("scale", 1.0)
    y = c.decode(through_wire(enc))
    a = np.abs(x.astype(np.float64))
    bound = np.maximum(a * 2.0 ** -11, 2.0 ** -25 * s)
    assert np.all(np.abs(y - x.astype(np.float64)) <= bound)
    amax = float(a.max(initial=0))
    if amax < 65520:   # its float16 is finite
        assert "scale" not in enc.meta
    else:
        assert s == 2.0 ** round(math.log2(s)) and 2 ** 14 <= amax / s < 2 ** 15


@pytest.mark.parametrize("spec", ["fp16", "topk:0.5:values=fp16"])
@pytest.mark.parametrize("size", [1e6, 1e30])
def test_fp16_values_outside_its_range_keep_their_relative_precision(spec, size):
    """Values around 1e6 (or 1e30) used to arrive as 65504; sent scaled, every kept
    value keeps float16's 2⁻¹¹."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(5000) * size).astype(np.float32)
    c = get_codec(spec)
    enc = c.encode(x)
    s = enc.meta["scale"]
    assert 2 ** 14 <= np.abs(x).max() / s < 2 ** 15
    assert enc.nbytes == c.encode(x / np.float32(s)).nbytes   # the scale costs no frame bytes
    y = get_codec(spec.split(":values")[0]).decode(through_wire(enc), x.size)
    kept = np.ones(x.size, bool) if spec == "fp16" else y != 0
    assert kept.sum() == (5000 if spec == "fp16" else 2500)
    err = np.abs(y.astype(np.float64) - x)[kept]
    # the smallest of 5000 normals may be a float16 subnormal once scaled: 2⁻²⁵ · scale
    assert np.all(err <= np.maximum(np.abs(x[kept]) * 2.0 ** -11, 2.0 ** -25 * s))
    assert np.median(err / np.abs(x[kept])) < 2.0 ** -12
    out = np.ones(x.size, np.float32)
    c.decode_into(through_wire(enc), out, alpha=-0.5)
    np.testing.assert_allclose(out, 1.0 - 0.5 * y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec", ["ef+fp16", "ef+topk:1:values=fp16"])
def test_error_feedback_residual_stays_small_for_values_past_65504(spec):
    """A delta of 1e6 sent again and again: saturated at 65504, the residual grew by
    934,496 a call; scaled, it stays within a float16 rounding step (16 · 32)."""
    ef = get_codec(spec)
    x = np.full(100, 1e6, np.float32)
    x[::2] = -3e5
    for _ in range(50):
        enc, dec = ef.encode_decoded(x)
        np.testing.assert_allclose(dec, x, rtol=2.0 ** -10)
    assert np.abs(ef.residual).max() <= 16 * 32


@pytest.mark.parametrize("spec", ["fp16", "topk:0.5:values=fp16"])
@pytest.mark.parametrize("size", [0.0, 1e-6, 1e-9])
def test_small_fp16_values_go_unscaled_as_an_older_peer_reads_them(spec, size):
    """A scale below 1 (small values sent scaled up) would be read by a peer of an older
    version, which ignores it, as values 2¹⁴/size times too large: finite, so nothing
    refused them. Small values go as float16 subnormals, as they always did, and all
    zeros too (they took the slow path that looks for a scale)."""
    x = (np.random.default_rng(9).standard_normal(3000) * size).astype(np.float32)
    enc = get_codec(spec).encode(x)
    assert "scale" not in enc.meta
    y = get_codec(spec.split(":values")[0]).decode(through_wire(enc), x.size)
    kept = y != 0 if spec != "fp16" else np.ones(x.size, bool)
    assert np.all(np.abs(y - x)[kept] <= np.maximum(np.abs(x[kept]) * 2.0 ** -11, 2.0 ** -25))


def test_fp16_decoders_accept_payloads_without_a_scale():
    """A payload as peers sent it before scales existed (and as every in-range one still is)."""
    h = np.array([1.5, -65504.0, 2.0 ** -20, 0.0], np.float16)
    want = h.astype(np.float32)
    assert np.array_equal(get_codec("fp16").decode(Encoded({"codec": "fp16", "n": 4}, [h])), want)
    codes = pack_gaps(np.array([1, 3, 5, 8]))
    meta = {"codec": "topk", "n": 9, "k": 4, "ib": int(codes.size)}
    y = get_codec("topk:0.5").decode(Encoded(meta, [codes, h]))
    assert np.array_equal(y[[1, 3, 5, 8]], want) and not y[[0, 2, 4, 6, 7]].any()


def test_fp16_device_path_leaves_out_of_range_vectors_to_the_cpu_path():
    # The accelerator path is plain torch code; run it on CPU tensors here.
    import torch

    c = get_codec("fp16")
    x = np.random.default_rng(8).standard_normal(3000).astype(np.float32)
    with_inf = x.copy()
    with_inf[5] = np.inf
    for v, in_range in [(x, True), (x * np.float32(1e6), False), (x * np.float32(1e-9), True),
                        (np.zeros_like(x), True), (with_inf, False)]:
        enc = c._encode_device(torch.from_numpy(v))
        if in_range:
            assert enc.meta == c.encode(v).meta and np.array_equal(enc.frames[0], c.encode(v).frames[0])
        else:   # left to the CPU path, which picks a scale (or saturates Inf)
            assert enc is None
        assert np.isfinite(c.decode(c.encode(v))).all()


# ---- int8, qsgd -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec,div", [("int8", 254), ("int8:stochastic", 127),
                                      ("int8:block=17", 254)])
@FAST
@given(x=vec())
def test_int8_error_bound(spec, div, x):
    c = get_codec(spec)
    enc = c.encode(x)
    y = c.decode(enc)
    B = enc.meta["block"]
    for a, xb in blocks(x, B):
        amax = float(np.abs(xb).max())
        err = np.abs(y[a:a + B].astype(np.float64) - xb)
        assert np.all(err <= amax / div * (1 + 1e-5) + 1e-30)


@pytest.mark.parametrize("spec", ["int8", "int8:stochastic", "qsgd:16", "sign", "sign:block=0",
                                  "topk:0.5"])
@pytest.mark.parametrize("v", [1e-40, 1e-29, 1e20, 3e38])
def test_extreme_magnitudes(spec, v):
    x = np.array([v, -v / 3, 0, v / 7], np.float32)
    c = get_codec(spec)
    y = c.decode(c.encode(x)).astype(np.float64)
    assert np.all(np.isfinite(y))
    err = np.abs(y - x).max()
    if spec.startswith("int8") and v > 2.0 ** -100:
        assert err <= v / 127 * (1 + 1e-5)
    elif spec == "qsgd:16" and v > 2.0 ** -100:
        assert err <= np.linalg.norm(x.astype(np.float64)) / 16 * (1 + 1e-5)
    elif not spec.startswith("sign"):
        assert err <= max(v, 2.0 ** -100) * (1 + 1e-6)


@pytest.mark.parametrize("spec", ["int8", "int8:stochastic:seed=1", "qsgd:16:bucket=256:seed=1"])
def test_a_block_below_2_to_the_minus_100_gets_multiplier_0_and_decodes_to_zeros(spec):
    """The documented flush to zero: a block whose max-abs (int8) or norm (qsgd) is below
    2**-100 sends multiplier 0 and decodes to zeros; the blocks beside it (1, and 1e-29,
    above 2**-100) are quantized as usual."""
    x = np.concatenate([np.full(256, 1.0), np.linspace(-1e-33, 1e-33, 256), np.full(256, 1e-29)]).astype(np.float32)
    c = get_codec(spec)
    enc = c.encode(x)
    y = c.decode(through_wire(enc), x.size)
    mult = enc.frames[1]
    assert mult[1] == 0.0 and not y[256:512].any()
    # the blocks beside it: multiplier max-abs / L (int8) or norm / L (qsgd), every element at its top level
    L = enc.meta["levels"]
    norm = 16.0 if spec.startswith("qsgd") else 1.0   # ||ones(256)|| = 16
    assert mult[0] == np.float32(norm / L) and mult[2] == np.float32(np.float32(1e-29) * norm / L)
    np.testing.assert_allclose(y[:256], 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[512:], np.float32(1e-29), rtol=1e-6)


@pytest.mark.parametrize("s", [1, 4, 16, 127, 1000])
@FAST
@given(x=vec())
def test_qsgd_error_bound(s, x):
    c = get_codec(f"qsgd:{s}:bucket=64")
    enc = c.encode(x)
    y = c.decode(enc)
    q = enc.frames[0]
    assert np.abs(q.astype(np.int64)).max(initial=0) <= s
    for a, xb in blocks(x, 64):
        norm = float(np.linalg.norm(xb.astype(np.float64)))
        assert np.all(np.abs(y[a:a + 64] - xb.astype(np.float64)) <= norm / s * (1 + 1e-5) + 1e-30)


@pytest.mark.parametrize("spec", ["int8:stochastic:block=16:seed=1", "qsgd:2:bucket=16:seed=2",
                                  "qsgd:8:seed=3"])
def test_stochastic_codecs_are_unbiased(spec):
    # Fixed seed, T draws: each element's mean must sit within 5 standard errors of x.
    # Stochastic rounding to a grid of step h has variance <= h^2 / 4, so the standard
    # error of the mean is <= h / (2 sqrt(T)); at 5 of them a false alarm is ~6e-7 per
    # element. Deterministic rounding to the same grid fails the same check, so the
    # test has the power to see a bias.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(64) * rng.choice([0.01, 1, 100], 64)).astype(np.float32)
    codec = get_codec(spec)
    T = 4000
    acc = np.zeros(64, np.float64)
    for _ in range(T):
        enc = codec.encode(x)
        acc += codec.decode(enc)
    mean = acc / T
    mult = enc.frames[1].astype(np.float64)
    h = np.repeat(mult, enc.meta["block"])[:64]
    se = h / (2 * math.sqrt(T))
    assert np.all(np.abs(mean - x) <= 5 * se + 1e-6 * np.abs(x))
    nearest = np.rint(x / h) * h
    assert np.any(np.abs(nearest - x) > 5 * se)


# ---- top-k ----------------------------------------------------------------------------------

tied = st.sampled_from([0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0])


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
@FAST
@given(x=st.one_of(vec(1), vec(1, elements=tied)))
def test_topk_keeps_exactly_the_k_largest_magnitudes(ratio, x):
    c = get_codec(f"topk:{ratio}")
    enc = c.encode(x)
    k = max(1, round(ratio * x.size))
    codes, vals = enc.frames
    idx = unpack_gaps(codes, k, x.size)
    assert enc.meta["k"] == k == idx.size and enc.meta["ib"] == codes.size
    assert np.all(np.diff(idx.astype(np.int64)) > 0)
    assert np.array_equal(vals, x[idx])
    assert np.array_equal(np.sort(np.abs(vals)), np.sort(np.abs(x))[x.size - k:])
    y = c.decode(enc)
    assert np.count_nonzero(y != x) <= x.size - k


@pytest.mark.parametrize("kind", ["normal", "ties", "mostly_zero", "heavy_tail", "sorted"])
def test_topk_sampled_path_matches_exact(kind):
    n = 400_000  # large enough to take the sampled-threshold path
    rng = np.random.default_rng(3)
    x = {
        "normal": lambda: rng.standard_normal(n),
        "ties": lambda: rng.integers(-4, 5, n).astype(float),
        "mostly_zero": lambda: np.where(rng.random(n) < 0.003, rng.standard_normal(n), 0.0),
        "heavy_tail": lambda: rng.standard_cauchy(n),
        "sorted": lambda: np.linspace(-1, 1, n),
    }[kind]().astype(np.float32)
    t = TopK(ratio=0.01, seed=1)
    k = t.k_for(n)
    got = t.select(x, k)
    assert got.size == k and np.all(np.diff(got) > 0)
    assert np.array_equal(got, t._exact(x, k))  # same set, same tie rule (lowest index)
    assert np.array_equal(np.sort(np.abs(x[got])), np.sort(np.abs(x))[n - k:])


def test_topk_ties_at_the_cut_go_to_the_lowest_indices():
    t = TopK(ratio=0.6)
    x = np.array([1, -2, 2, 0, 2, 3], np.float32)
    assert t.select(x, 3).tolist() == [1, 2, 5]        # three 2s at the cut, two kept
    assert t.select(x, 4).tolist() == [1, 2, 4, 5]     # all of them: no tie to break
    assert t.select(-x, 2).tolist() == [1, 5]


def encoded_both_ways(a, b, seed):
    """Five vectors (60% zeros) through ``a.encode`` and ``b.encode_decoded``; checks
    that the payloads are the same and yields b's (payload, decoded vector) each time."""
    rng = np.random.default_rng(seed)
    for _ in range(5):
        x = rng.standard_normal(300).astype(np.float32)
        x[rng.random(300) < 0.6] = 0.0
        enc = a.encode(x)
        enc2, dec = b.encode_decoded(x)
        assert enc2.meta == enc.meta and all(np.array_equal(f, g) for f, g in zip(enc2.frames, enc.frames))
        yield enc2, dec


@pytest.mark.parametrize("spec", ["topk:0.05", "topk:0.15:values=fp16", "topk:0.3:values=fp8"])
def test_topk_encode_decoded_is_encode_and_decode(spec):
    """The sender's shortcut (no check of its own payload) gives the payload and the
    vector that encode and a receiver's decode give, bit for bit."""
    for enc2, dec in encoded_both_ways(get_codec(spec), get_codec(spec), seed=2):
        want = get_codec(spec).decode(through_wire(enc2))
        assert dec.dtype == np.float32 and np.array_equal(dec.view(np.uint32), want.view(np.uint32))


def test_topk_nan_is_not_selected_and_inf_is():
    x = np.arange(1, 301, dtype=np.float32)
    x[5], x[6] = np.nan, -np.inf
    enc = get_codec("topk:0.01").encode(x)
    idx = unpack_gaps(enc.frames[0], enc.meta["k"], x.size)
    assert 6 in idx and 5 not in idx and idx.size == 3


def test_topk_fp16_values_are_the_kept_values_rounded_and_scaled_past_65504():
    x = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    c = get_codec("topk:0.01:values=fp16")
    top = np.finfo(np.float32).max
    for big, scale in [(None, None), ([1e6, -2e6], 64.0), ([1e6, -3e38], 2.0 ** 113),
                       ([1e6, -top], 2.0 ** 113)]:
        if big is not None:
            x[[10, 20]] = big
        enc = c.encode(x)
        assert enc.frames[1].dtype == np.float16 and enc.nbytes == enc.meta["ib"] + 2 * 30
        assert enc.meta.get("scale") == scale
        idx = unpack_gaps(enc.frames[0], 30, x.size)
        assert np.array_equal(idx, get_codec("topk:0.01").select(x, 30))
        y = get_codec("topk:0.01").decode(through_wire(enc))  # any topk decoder reads fp16 values
        s = np.float32(scale or 1.0)
        expect = np.zeros_like(x)
        with np.errstate(over="ignore"):
            expect[idx] = (x[idx] / s).astype(np.float16).astype(np.float32) * s
        if x[20] == -top:   # top / 2**113 rounds up to 2**15, which times 2**113 is Inf
            expect[20] = -32752 * s
        assert np.array_equal(y, expect) and np.isfinite(y).all()


def test_topk_fp8_values_keep_an_eighth_of_each_value_and_refuse_bad_codes():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(4000) * rng.lognormal(0, 2, 4000)).astype(np.float32)
    c = get_codec("topk:0.3:values=fp8")
    enc = c.encode(x)
    assert enc.frames[1].dtype == np.uint8 and enc.nbytes == enc.meta["ib"] + 1200
    y = get_codec("topk:0.3").decode(through_wire(enc))
    idx = unpack_gaps(enc.frames[0], 1200, x.size)
    assert not np.delete(y, idx).any()
    big = np.abs(x[idx]) >= 2.0 ** -14 * np.abs(x).max()   # e5m2's normal range under the scale
    rel = np.abs(y[idx] - x[idx]) / np.abs(x[idx])
    assert rel[big].max() <= 2.0 ** -3 and big.mean() > 0.99
    # the scale maps the largest magnitude to 2^15, so nothing overflows
    huge = get_codec("topk:0.5:values=fp8").decode(c.encode(np.array([3e38, -1e-3, 2.0, 0.5], np.float32)))
    assert np.isfinite(huge).all() and abs(huge[0] / 3e38 - 1) <= 2.0 ** -3
    # an Inf or NaN code, or a missing or negative scale, is refused
    for codes, meta in ((np.full(1200, 0x7C, np.uint8), enc.meta), (enc.frames[1], dict(enc.meta, scale=-1.0)),
                        (enc.frames[1], {k: v for k, v in enc.meta.items() if k != "scale"})):
        with pytest.raises(WireError, match="fp8|scale"):
            c.decode(Encoded(meta, [enc.frames[0], codes]))


def test_topk_fp8_values_round_to_nearest_even():
    """e5m2 keeps 2 mantissa bits; a value exactly halfway between two codes goes to the
    one with the even mantissa (1.125 -> 1.0, 1.375 -> 1.5, 3.25 -> 3.0, 3.75 -> 4.0),
    anything past halfway to the nearer. The largest value, 2**15 (FP8_TOP), gives scale 1."""
    x = np.array([32768.0, 1.125, 1.375, 3.25, 3.75, -1.125, -3.25, 1.126, 0.15625, 2.5], np.float32)
    c = get_codec("topk:1.0:values=fp8")
    enc = c.encode(x)
    assert enc.meta["scale"] == 1.0
    y = c.decode(through_wire(enc), x.size)
    assert y.tolist() == [32768.0, 1.0, 1.5, 3.0, 4.0, -1.0, -3.0, 1.25, 0.15625, 2.5]


@FAST
@given(n=st.integers(1, 5000), data=st.data())
def test_gap_codes_round_trip(n, data):
    idx = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=min(n, 300)))), np.int64)
    codes = pack_gaps(idx)
    gaps = np.diff(idx, prepend=-1) - 1
    assert codes.dtype == np.uint8 and codes.size == int((gaps // 255 + 1).sum())
    assert np.array_equal(unpack_gaps(codes, idx.size, n), idx)


def test_gap_codes_examples():
    assert pack_gaps(np.array([0, 3, 300])).tolist() == [0, 2, 255, 41]
    assert pack_gaps(np.array([254, 255, 510])).tolist() == [254, 0, 254]
    assert pack_gaps(np.array([255])).tolist() == [255, 0]
    assert unpack_gaps(np.array([255, 0], np.uint8), 1, 256).tolist() == [255]


# ---- random-k -------------------------------------------------------------------------------

@FAST
@given(n=st.integers(1, 5000), ratio=st.floats(0.001, 1.0), seed=st.integers(0, 2**63 - 1))
def test_strata_indices_are_one_per_stratum(n, ratio, seed):
    k = max(1, min(n, round(ratio * n)))
    idx = strata_indices(n, k, seed)
    bounds = (np.arange(k + 1) * n) // k
    assert idx.size == k
    assert np.all(idx >= bounds[:-1]) and np.all(idx < bounds[1:])
    assert np.array_equal(idx, strata_indices(n, k, seed))


def test_randomk_keeps_values_at_seeded_positions_and_covers_uniformly():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    c = get_codec("randomk:0.1:seed=5")
    hits = np.zeros(1000)
    for _ in range(2000):
        enc = c.encode(x)
        y = get_codec("randomk:0.5").decode(through_wire(enc))  # any instance decodes
        kept = np.flatnonzero(y)
        assert kept.size == 100 and np.array_equal(y[kept], x[kept])
        hits[kept] += 1
    # each element kept with probability 0.1: 2000 draws, sd ~13.4 around 200
    assert np.all(np.abs(hits - 200) < 6 * 13.4)
    a, b = get_codec("randomk:0.1:seed=9"), get_codec("randomk:0.1:seed=9")
    assert a.encode(x).meta == b.encode(x).meta


# ---- sign -----------------------------------------------------------------------------------

@FAST
@given(x=vec(1))
def test_sign_is_scaled_sign(x):
    c = get_codec("sign:block=0")
    y = c.decode(through_wire(c.encode(x)))
    scale = np.abs(x.astype(np.float64)).sum() / x.size
    expect = np.where(np.signbit(x), -scale, scale)
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("B", [8, 64, 256])
@FAST
@given(x=vec(1))
def test_sign_scales_each_block_by_its_mean_magnitude(B, x):
    c = get_codec(f"sign:block={B}")
    enc = c.encode(x)
    assert enc.meta["block"] == B and enc.frames[1].size == math.ceil(x.size / B)
    y = c.decode(through_wire(enc))
    for a, xb in blocks(x, B):  # the last block may be short: its own mean
        scale = np.abs(xb.astype(np.float64)).mean()
        np.testing.assert_allclose(y[a:a + B], np.where(np.signbit(xb), -scale, scale),
                                   rtol=1e-5, atol=1e-30)
    out = np.ones(x.size, np.float32)
    c.decode_into(through_wire(enc), out, alpha=-2.0)
    np.testing.assert_allclose(out, 1.0 - 2.0 * y, rtol=1e-5, atol=1e-5 * (1 + np.abs(y).max()))


# ---- error feedback -------------------------------------------------------------------------

@pytest.mark.parametrize("inner", ["topk:0.05", "randomk:0.1", "sign", "int8", "qsgd:4", "fp16",
                                   "identity"])
@FAST
@given(xs=st.lists(vec(200, 200, st.floats(-100, 100, width=32)), min_size=1, max_size=6))
def test_error_feedback_conserves_the_sum(inner, xs):
    ef = get_codec(f"ef+{inner}")
    assert isinstance(ef, ErrorFeedback)
    dec = get_codec(inner)
    total_in = np.zeros(200, np.float64)
    total_out = np.zeros(200, np.float64)
    for x in xs:
        enc = ef.encode(x)
        assert enc.meta["codec"] == dec.name
        total_in += x
        total_out += dec.decode(through_wire(enc))
    scale = sum(np.abs(x.astype(np.float64)).sum() for x in xs) / 200 + 1e-3
    np.testing.assert_allclose(total_out + ef.residual, total_in, atol=1e-4 * scale * len(xs))


@pytest.mark.parametrize("inner", ["topk:0.05", "topk:0.15:values=fp16", "topk:0.3:values=fp8", "sign",
                                   "sign:block=8", "int8", "fp16", "identity", "qsgd:2:seed=1"])
def test_error_feedback_encode_decoded_is_encode_and_decode(inner):
    """encode_decoded gives the payload encode gives, what a receiver decodes from it,
    and leaves the same residual, bit for bit (the relay's copies depend on it)."""
    a, b = get_codec(f"ef+{inner}"), get_codec(f"ef+{inner}")
    for enc2, dec in encoded_both_ways(a, b, seed=0):
        assert np.array_equal(dec, get_codec(inner).decode(through_wire(enc2)))
        assert np.array_equal(b.residual, a.residual)
    with pytest.raises(GossipError, match="length 301"):
        b.encode_decoded(np.ones(301, np.float32))
    assert np.array_equal(b.residual, a.residual)


# Every family, with the coarse QSGDs (omega >= 1: qsgd:11 and coarser with buckets of
# 512) that error feedback has to send scaled; plain, ef+qsgd:8 reached ||e|| = 1e5 ||x||
# within 300 calls and ef+qsgd:1 overflowed.
EF_EVERY = ["identity", "fp16", "int8", "int8:stochastic:block=65536:seed=1", "qsgd:256:seed=1",
            "qsgd:16:seed=1", "qsgd:11:seed=1", "qsgd:8:seed=1", "qsgd:4:seed=1", "qsgd:2:seed=1",
            "qsgd:1:seed=1", "topk:0.05", "topk:0.15:values=fp16", "topk:0.05:values=fp8",
            "randomk:0.05:seed=1", "sign", "sign:block=0"]


@pytest.mark.parametrize("inner", EF_EVERY)
@pytest.mark.parametrize("fixed", [False, True], ids=["fresh", "fixed"])
def test_error_feedback_residual_stays_bounded(inner, fixed):
    """300 calls with standard-normal inputs of 2000, fresh each call or one repeated:
    ||e|| / ||x|| levels off (at most 4.5 fresh and 30 repeated, for qsgd:1, whose
    scaled form contracts by 1/(1 + omega) = 1/23.6) instead of growing without bound."""
    ef = get_codec(f"ef+{inner}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2000).astype(np.float32)
    worst = 0.0
    for _ in range(300):
        if not fixed:
            x = rng.standard_normal(2000).astype(np.float32)
        ef.encode(x)
        worst = max(worst, float(np.linalg.norm(ef.residual) / np.linalg.norm(x)))
    assert worst < (50.0 if fixed else 10.0), f"ef+{inner}: ||e|| reached {worst:.3g} ||x||"


@pytest.mark.parametrize("spec,n,scale", [("qsgd:8:seed=1", 1000, 1 / 3),    # omega = 2
                                          ("qsgd:1:seed=1", 1000, 1 / (1 + 512 ** 0.5)),
                                          ("qsgd:8:bucket=256:seed=1", 1000, 1 / 2),   # omega = 1: scaled
                                          ("qsgd:16:seed=1", 1000, 1.0),  # omega = 0.5: as it was
                                          ("qsgd:8:seed=1", 100, 1.0)])   # one bucket of 100: omega = 0.39
def test_error_feedback_scales_a_coarse_qsgd_inside_its_payload(spec, n, scale):
    """ef+qsgd sends y / (1 + omega) when omega >= 1, in the block multipliers: the meta
    and levels are a plain qsgd payload's, a plain receiver decodes the scaled vector
    (nothing is scaled twice), and the residual is what that receiver did not get."""
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    plain = get_codec(spec).encode(x)
    ef = get_codec(f"ef+{spec}")
    enc, dec = ef.encode_decoded(x)
    assert enc.meta == plain.meta and np.array_equal(enc.frames[0], plain.frames[0])
    assert np.array_equal(enc.frames[1], plain.frames[1] * np.float32(scale))
    got = get_codec(spec.split(":seed")[0]).decode(through_wire(enc), n)
    assert np.array_equal(got, dec)
    assert np.array_equal(ef.residual, x - got)


def test_error_feedback_topk_sends_everything_eventually():
    ef = get_codec("ef+topk:0.1")
    x = np.random.default_rng(1).standard_normal(50).astype(np.float32)
    acc = np.zeros(50, np.float32)
    ef.decode_into(ef.encode(x), acc)
    for _ in range(20):
        ef.decode_into(ef.encode(np.zeros(50, np.float32)), acc)
    np.testing.assert_allclose(acc, x, rtol=0, atol=1e-6)
    assert not ef.residual.any()


def test_error_feedback_rejects_size_change_and_keeps_state():
    ef = get_codec("ef+int8")
    ef.encode(np.ones(10, np.float32))
    before = ef.residual.copy()
    with pytest.raises(GossipError, match="length 11"):
        ef.encode(np.ones(11, np.float32))
    bad = np.ones(10, np.float32)
    bad[3] = np.nan
    with pytest.raises(GossipError, match="NaN"):
        ef.encode(bad)
    assert np.array_equal(ef.residual, before)
    ef.reset()
    assert ef.residual is None
    ef.encode(np.ones(11, np.float32))


# ---- inputs ---------------------------------------------------------------------------------

def test_accepts_torch_tensors_and_other_shapes():
    import torch

    x = np.random.default_rng(2).standard_normal((30, 40)).astype(np.float32)
    for spec in ["fp16", "int8", "topk:0.1", "sign"]:
        a = get_codec(spec).decode(get_codec(spec).encode(x))
        b = get_codec(spec).decode(get_codec(spec).encode(torch.from_numpy(x)))
        c = get_codec(spec).decode(get_codec(spec).encode(x.astype(np.float64)))
        assert a.shape == (1200,) and np.array_equal(a, b) and np.array_equal(a, c)
    t = torch.from_numpy(x).requires_grad_(True)
    assert get_codec("identity").decode(get_codec("identity").encode(t)).shape == (1200,)


def test_device_paths_agree_with_numpy_paths():
    # The accelerator paths are plain torch code; run them on CPU tensors here.
    import torch

    x = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    t = torch.from_numpy(x)
    for spec in ["fp16", "topk:0.02"]:
        c = get_codec(spec)
        enc = c._encode_device(t)
        assert enc is not None and enc.meta == c.encode(x).meta
        assert np.array_equal(c.decode(through_wire(enc)), c.decode(c.encode(x)))


@pytest.mark.parametrize("bad", [np.arange(5), np.array([True]), [1.0, 2.0], "x",
                                 np.zeros(3, np.complex64)])
def test_rejects_non_float_input(bad):
    with pytest.raises(GossipError):
        get_codec("fp16").encode(bad)


@pytest.mark.parametrize("spec", ["int8", "int8:stochastic", "qsgd:4", "sign", "sign:block=0"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_scale_codecs_reject_non_finite_input(spec, value):
    x = np.ones(1000, np.float32)
    x[700] = value
    with pytest.raises(GossipError, match="NaN or Inf"):
        get_codec(spec).encode(x)


def test_error_feedback_saturates_an_overflowing_sum_at_the_float32_max():
    """x + e past float32's range for finite x and e is set to +-max (what is kept stays as
    large as it can), not +-Inf and not 0. ef+topk keeps 1 of 10 (index 0 on the tie), so
    the residual carries -max and +max into the next call, where x + e overflows."""
    big = float(np.finfo(np.float32).max)
    ef = get_codec("ef+topk:0.1")
    x = np.zeros(10, np.float32)
    x[[0, 1, 2, 9]] = [big, -big, big, 3.0]
    for sent in range(1, 4):
        _, dec = ef.encode_decoded(x)
        assert dec.tolist() == [big] + [0.0] * 9
        assert ef.residual.tolist() == [0.0, -big, big] + [0.0] * 6 + [3.0 * sent], sent
