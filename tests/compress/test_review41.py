"""Review 41 of the quantizing codecs: what qsgd sends for an element that carries its
bucket's whole norm, at every s.

From 256 levels up it gets exactly s. Below 256 the docs said nothing of it: float32
can put it an ulp under s, and the 16-bit dither then sends s - 1 once in 2**16 (the
dither's documented bias). Making it exact there cost ~14% of qsgd:16's encode, so
the behaviour is documented (docs/compress.md, QSGD's docstring) and pinned here.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.compress import get_codec

#: elements of bucket 1: below 256 levels a few of them get s - 1 (1 to 16 at the s here)
N = 1 << 22


@pytest.mark.parametrize("s", [1, 3, 15, 127, 255, 256, 1000])
def test_qsgd_element_with_its_bucket_whole_norm_gets_s_as_documented(s):
    """Exactly s from 256 up; below, s or, once in 2**16 at most, s - 1: no other level,
    and the decode is x to float32's rounding wherever it got s."""
    x = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    c = get_codec(f"qsgd:{s}:bucket=1:seed=0")
    enc = c.encode(x)
    q = enc.frames[0].astype(np.int64)
    assert np.array_equal(q, np.where(x < 0, -1, 1) * np.abs(q))   # the sign kept (0 at s - 1 = 0)
    short = np.abs(q) != s
    if s >= 256:
        assert not short.any(), f"{int(short.sum())} elements not at ±s"
    else:
        assert (np.abs(q[short]) == s - 1).all()
        # the dither is 0 once in 2**16; 8 standard deviations over that rate
        assert short.sum() <= N / 2**16 + 8 * np.sqrt(N / 2**16)
    y = c.decode(enc)
    # s levels of the multiplier norm / s, rounded to float32 twice
    assert np.allclose(y[~short], x[~short], rtol=2.0 ** -22, atol=0)

    # a sparse gradient: one nonzero in each bucket of 512 carries the bucket's norm
    rng = np.random.default_rng(6)
    buckets = N // 512
    g = np.zeros(N, np.float32)
    pos = rng.integers(0, 512, buckets) + 512 * np.arange(buckets)
    g[pos] = rng.standard_normal(buckets)
    q = np.abs(get_codec(f"qsgd:{s}:seed=0").encode(g).frames[0][pos].astype(np.int64))
    assert (q == s).all() if s >= 256 else np.isin(q, [s - 1, s]).all()
