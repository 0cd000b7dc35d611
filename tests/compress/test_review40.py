"""Defects review 40 found in the codecs: float64 input past float32's range cast
silently to Inf, arrays whose strides are not a multiple of their item size handed
to torch, and QSGD's many-level rounding done in float32."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from swarm.compress import Encoded, get_codec
from swarm.errors import GossipError

_F32_MAX = float(np.finfo(np.float32).max)


def _same(a: Encoded, b: Encoded) -> bool:
    return a.meta == b.meta and all(np.array_equal(p, q, equal_nan=True)
                                    for p, q in zip(a.frames, b.frames))


# ---- float64 past float32's range ---------------------------------------------------------------

_BIG = np.array([1e39, 1.0, -2.0, 3.0])   # finite float64; 1e39 has no float32


@pytest.mark.parametrize("spec", ["identity", "fp16", "topk:0.5", "topk:0.5:values=fp8",
                                  "randomk:0.5", "int8", "qsgd", "sign"])
def test_float64_past_float32_range_is_refused(spec):
    # Before the fix the cast made 1e39 Inf with only a RuntimeWarning: fp16 sent 65504,
    # identity and topk sent Inf, int8/qsgd/sign blamed "NaN or Inf" in the input.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(GossipError, match="float32's range"):
            get_codec(spec).encode(_BIG)
        with pytest.raises(GossipError, match="float32's range"):
            get_codec(spec).encode_decoded(_BIG.reshape(2, 2))


@pytest.mark.parametrize("spec", ["identity", "fp16", "int8"])
def test_float64_tensor_past_float32_range_is_refused(spec):
    # Before the fix torch's .to(float32) made 1e39 Inf without a word.
    torch = pytest.importorskip("torch")
    with pytest.raises(GossipError, match="float32's range"):
        get_codec(spec).encode(torch.tensor(_BIG, dtype=torch.float64))


@pytest.mark.parametrize("spec", ["ef+topk:0.5", "ef+fp16", "ef+identity", "ef+qsgd"])
def test_error_feedback_residual_is_untouched_when_float64_is_refused(spec):
    # Before the fix the Inf went into x + residual: ef+topk kept NaN in the residual for
    # every later round (docs: finite input keeps it finite); ef+qsgd blamed NaN/Inf.
    ef = get_codec(spec)
    ef.encode(np.array([0.5, 1.0, -2.0, 3.0], np.float32))
    before = ef.residual
    with pytest.raises(GossipError, match="float32's range"):
        ef.encode(_BIG)
    assert np.array_equal(ef.residual, before)
    ef.encode(np.ones(4))   # and the stream goes on
    assert np.isfinite(ef.residual).all()


def test_float64_infinities_and_values_that_round_to_float32_max_still_pass():
    # Guards the fix: Inf and NaN are not "past the range" (identity passes them through,
    # docs/compress.md), and a float64 within half an ulp above float32's max rounds to it.
    torch = pytest.importorskip("torch")
    x = np.array([np.inf, -np.inf, np.nan, _F32_MAX * (1 + 2.0 ** -30), -1.5])
    want = x.astype(np.float32)
    c = get_codec("identity")
    assert np.array_equal(c.decode(c.encode(x)), want, equal_nan=True)
    assert np.array_equal(c.decode(c.encode(torch.from_numpy(x))), want, equal_nan=True)


# ---- strides that are not a multiple of the item size ---------------------------------------------

def _field(values: np.ndarray) -> np.ndarray:
    """``values`` as a field of a structured array: same dtype, byte stride itemsize + 1."""
    values = np.asarray(values)
    rec = np.zeros(values.size, dtype=[("a", values.dtype), ("b", "u1")])
    rec["a"] = values
    out = rec["a"]
    assert out.strides == (values.itemsize + 1,)
    return out


@pytest.mark.parametrize("spec", ["fp16", "ef+fp16", "identity", "int8", "topk:0.1:values=fp16"])
def test_odd_stride_input_encodes_as_its_copy(spec):
    # Before the fix fp16 handed such a view to torch.from_numpy: a raw ValueError
    # ("strides not a multiple of the element byte size").
    x = _field(np.linspace(-1, 1, 1000, dtype=np.float32))
    assert _same(get_codec(spec).encode(x), get_codec(spec).encode(x.copy()))


@pytest.mark.parametrize("spec,alpha", [("fp16", 1.0), ("fp16", 0.5), ("identity", 0.5),
                                        ("identity", 1.0), ("int8", 0.5)])
def test_odd_stride_frames_decode(spec, alpha):
    # Before the fix fp16 decode/decode_into and identity decode_into(alpha != 1) handed
    # such frames to torch.from_numpy: a raw ValueError.
    c = get_codec(spec)
    enc = c.encode(np.linspace(-1, 1, 1000, dtype=np.float32))
    odd = Encoded(dict(enc.meta), [_field(f) for f in enc.frames])
    assert np.array_equal(c.decode(odd), c.decode(enc))
    out, want = np.ones(1000, np.float32), np.ones(1000, np.float32)
    c.decode_into(odd, out, alpha)
    c.decode_into(enc, want, alpha)
    assert np.array_equal(out, want)


# ---- QSGD with many levels ----------------------------------------------------------------------

@pytest.mark.parametrize("s", [256, 4096, 32767])
def test_qsgd_element_with_its_bucket_whole_norm_gets_exactly_s(s):
    # Before the fix x * inv in float32 could land just under s, and stochastic rounding
    # then sent s - 1 now and then: 44 of 10^5 elements at s=32767 with bucket=1, each
    # off by a whole level (docs/compress.md says such an element gets exactly s).
    rng = np.random.default_rng(2)
    x = rng.standard_normal(100_000).astype(np.float32)
    q = get_codec(f"qsgd:{s}:bucket=1:seed=0").encode(x).frames[0].astype(np.int64)
    assert np.array_equal(q, np.where(x < 0, -s, s))
    # a sparse gradient: one nonzero in each bucket of 512 carries the bucket's norm
    g = np.zeros(512 * 20_000, np.float32)
    pos = rng.integers(0, 512, 20_000) + 512 * np.arange(20_000)
    g[pos] = rng.standard_normal(20_000)
    q = get_codec(f"qsgd:{s}:seed=0").encode(g).frames[0].astype(np.int64)
    assert np.array_equal(q[pos], np.where(g[pos] < 0, -s, s))


def test_qsgd_32767_error_stays_within_a_level():
    # Before the fix the levels x * inv were taken in float32, against an inv that
    # differs from the sent 1 / mult by up to 2**-23: near s that is 0.004 of a level,
    # and an element whose level sat just above an integer was now and then rounded
    # to the integer below that, |q * mult - x| up to 1.0015 * norm / s here
    # (documented: < norm / s). Buckets [a, b] put a's level at s - 1 + 0.0015.
    # Measured on q * mult (what the encoder chose), not on the float32 decode, whose
    # own rounding (half an ulp of y) is 0.002 of a level at s = 32767.
    rng = np.random.default_rng(7)
    s, m = 32767, 100_000
    a = rng.uniform(1, 2, m)
    x = np.stack([a, a * np.sqrt(2 * (1 - 0.0015) / s)], 1).reshape(-1).astype(np.float32)
    q, mult = get_codec(f"qsgd:{s}:bucket=2:seed=1").encode(x).frames
    y = q.astype(np.float64) * np.repeat(mult.astype(np.float64), 2)
    norm = np.repeat(np.linalg.norm(x.astype(np.float64).reshape(-1, 2), axis=1), 2)
    # slack: float32's rounding of the norm and of mult = norm / s
    assert (np.abs(y - x) <= norm / s * (1 + 2.0 ** -21)).all()


def test_topk_device_path_leaves_float64_past_float32_range_to_the_cpu_check():
    # The accelerator path cast with .float() and sent Inf for 1e39 (run here on a CPU
    # tensor: the path is plain torch). It now falls back to the CPU path, which refuses it.
    torch = pytest.importorskip("torch")
    from swarm.compress import get_codec
    codec = get_codec("topk:0.5")
    t = torch.tensor([1e39, 1.0, -2.0, 3.0], dtype=torch.float64)
    assert codec._encode_device(t) is None
    ok = codec._encode_device(torch.tensor([1e30, 1.0, -2.0, 3.0], dtype=torch.float64))
    assert ok is not None
