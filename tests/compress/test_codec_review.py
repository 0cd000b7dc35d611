"""Defects a review found: fp8 top-k payloads its own decoder refused, an alpha past
float32's range, Int8/QSGD constructors without checks, and error feedback's state
after a failed first encode."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.compress import get_codec
from swarm.compress.quantize import QSGD, Int8
from swarm.errors import ConfigError, GossipError

F32_MAX = float(np.finfo(np.float32).max)


# ---- topk values=fp8: never a code the decoder refuses -----------------------------------------

@pytest.mark.parametrize("x", [
    [1e-42, 0.0, 0.0],                 # scale amax / 2**15 underflowed to 0: Inf codes
    [1e-42, -3e-43, 1e-45],
    [3e-38, 1e-38, -2e-38],            # scale subnormal in float32
    [np.inf, 1e37, -np.inf],           # Inf saturates, as before
])
@pytest.mark.parametrize("spec", ["topk:1:values=fp8", "ef+topk:1:values=fp8"])
def test_topk_fp8_tiny_or_infinite_values_decode(spec, x):
    x = np.array(x, np.float32)
    c = get_codec(spec)
    enc = c.encode(x)
    y = get_codec("topk:1").decode(enc)
    assert np.isfinite(y).all()
    assert np.array_equal(np.sign(y), np.sign(x))   # nothing lost to zero or flipped
    enc2, dec = get_codec(spec).encode_decoded(x)
    assert np.array_equal(dec, get_codec("topk:1").decode(enc2))


def test_topk_fp8_tiny_values_keep_their_relative_precision():
    x = np.array([1e-40, -5e-41, 2.5e-41], np.float32)
    y = get_codec("topk:1:values=fp8").decode(get_codec("topk:1:values=fp8").encode(x))
    assert np.allclose(y, x, rtol=0.125, atol=0)


@pytest.mark.parametrize("spec", ["topk:1:values=fp8", "ef+topk:1:values=fp8"])
def test_topk_fp8_kept_nan_is_a_gossip_error(spec):
    # k = 3 with two numbers: the NaN is kept, and fp8 has no code that decodes to it
    c = get_codec(spec)
    with pytest.raises(GossipError, match="NaN"):
        c.encode(np.array([np.nan, 1.0, 2.0], np.float32))
    with pytest.raises(GossipError, match="NaN"):
        c.encode_decoded(np.array([np.nan, 1.0, 2.0], np.float32))


def test_topk_fp8_unkept_nan_is_fine():
    c = get_codec("topk:0.5:values=fp8")
    y = c.decode(c.encode(np.array([np.nan, 1.0, 2.0, 0.0], np.float32)))
    assert np.array_equal(y, [0.0, 1.0, 2.0, 0.0])


# ---- decode_into: alpha within float32's range ------------------------------------------------

@pytest.mark.parametrize("spec", ["int8:block=8", "identity", "topk:0.5", "fp16", "qsgd", "sign"])
@pytest.mark.parametrize("alpha", [1e39, -1e39, 2 * F32_MAX])
def test_decode_into_alpha_past_float32_is_a_gossip_error(spec, alpha):
    x = np.zeros(64, np.float32)
    x[0] = 1.0
    c = get_codec(spec)
    enc = c.encode(x)
    out = np.arange(64, dtype=np.float32)
    with pytest.raises(GossipError, match="alpha"):
        c.decode_into(enc, out, alpha=alpha)
    assert np.array_equal(out, np.arange(64, dtype=np.float32))


def test_decode_into_alpha_at_float32_max_is_accepted():
    c = get_codec("int8:block=8")
    out = np.zeros(16, np.float32)
    c.decode_into(c.encode(np.zeros(16, np.float32)), out, alpha=F32_MAX)
    assert np.array_equal(out, np.zeros(16, np.float32))


# ---- Int8 and QSGD constructors check their arguments -------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: Int8(block=0), lambda: Int8(block=-4), lambda: Int8(block=(1 << 24) + 1),
    lambda: Int8(block=2.0), lambda: Int8(block=True),
    lambda: QSGD(s=0), lambda: QSGD(s=-1), lambda: QSGD(s=40000, bucket=1), lambda: QSGD(s=1.5),
    lambda: QSGD(bucket=0), lambda: QSGD(bucket=1 << 25), lambda: QSGD(s=True),
])
def test_int8_qsgd_constructors_refuse_bad_values(make):
    with pytest.raises(ConfigError):
        make()


def test_int8_qsgd_constructors_accept_the_registry_limits():
    x = np.linspace(-1, 1, 40, dtype=np.float32)
    for c in (Int8(block=1), Int8(block=1 << 24), QSGD(s=1, bucket=1, seed=0),
              QSGD(s=32767, bucket=1 << 24, seed=0)):
        assert get_codec(c.spec.split(":")[0]).decode(c.encode(x)).shape == x.shape


# ---- ef+: a failed first encode leaves no residual ------------------------------------------------

@pytest.mark.parametrize("method", ["encode", "encode_decoded"])
@pytest.mark.parametrize("spec", ["ef+int8", "ef+topk:1:values=fp8"])
def test_ef_failed_first_encode_leaves_no_residual(spec, method):
    ef = get_codec(spec)
    with pytest.raises(GossipError):
        getattr(ef, method)(np.array([np.nan, 1.0, 2.0], np.float32))
    assert ef.residual is None
    enc = getattr(ef, method)(np.ones(5, np.float32))   # another length is fine now
    enc = enc[0] if method == "encode_decoded" else enc
    assert enc.meta["n"] == 5
    assert ef.residual.shape == (5,)
    getattr(ef, method)(np.ones(5, np.float32))         # and the buffers alternate as before
