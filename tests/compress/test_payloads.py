"""Decoders reject lying or corrupt payloads with WireError and never write to ``out``."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.compress import MAX_N, Encoded, get_codec
from swarm.errors import GossipError, WireError

SPECS = ["identity", "fp16", "int8", "qsgd:16", "qsgd:1000", "topk:0.1", "topk:0.1:values=fp16",
         "randomk:0.1", "sign", "sign:block=0", "sign:block=8"]
X = np.random.default_rng(0).standard_normal(1000).astype(np.float32)


def good(spec: str) -> tuple:
    codec = get_codec(spec)
    return codec, codec.encode(X)


def rejects(codec, enc: Encoded, match: str | None = None) -> None:
    """decode (told the length it expects) and decode_into both raise WireError,
    and out is left as it was. A sparse payload for another n can be consistent
    in itself; the expected length is what exposes it, as in gossip."""
    with pytest.raises(WireError, match=match):
        codec.decode(enc, n=1000)
    out = np.full(1000, 3.0, np.float32)
    with pytest.raises(WireError, match=match):
        codec.decode_into(enc, out)
    assert np.all(out == 3.0)


def readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("spec", SPECS)
def test_meta_lies_are_rejected(spec):
    codec, enc = good(spec)
    for key, value in [("codec", "other"), ("codec", None), ("n", -1), ("n", True), ("n", "1000"),
                       ("n", 999), ("n", 1001), ("n", 2**70)]:
        meta = dict(enc.meta, **{key: value})
        rejects(codec, Encoded(meta, enc.frames))
    rejects(codec, Encoded({k: v for k, v in enc.meta.items() if k != "n"}, enc.frames), "n=None")
    rejects(codec, Encoded([1, 2], enc.frames), "not a dict")
    with pytest.raises(WireError):
        codec.decode(("meta", "frames"))


@pytest.mark.parametrize("spec", SPECS)
def test_frame_lies_are_rejected(spec):
    codec, enc = good(spec)
    f0 = enc.frames[0]
    rejects(codec, Encoded(enc.meta, enc.frames[:-1]), "frames")
    rejects(codec, Encoded(enc.meta, enc.frames + [f0]), "frames")
    rejects(codec, Encoded(enc.meta, [f0[:-1]] + enc.frames[1:]), "elements")
    rejects(codec, Encoded(enc.meta, [np.concatenate([f0, f0[:1]])] + enc.frames[1:]), "elements")
    wrong = np.zeros(f0.size, np.float64 if f0.dtype != np.float64 else np.float32)
    rejects(codec, Encoded(enc.meta, [wrong] + enc.frames[1:]), "dtype")
    rejects(codec, Encoded(enc.meta, [f0.tobytes()] + enc.frames[1:]), "not an array")
    rejects(codec, Encoded(enc.meta, tuple(enc.frames)[:0]), "frames")


@pytest.mark.parametrize("spec", ["fp16", "topk:0.1:values=fp16"])
def test_fp16_scale_must_be_a_positive_float32(spec):
    """A scaled float16 payload (largest value past 65504) names its divisor in the
    meta; one that is not a positive, finite float32 is refused before any write."""
    codec = get_codec(spec)
    enc = codec.encode(X * np.float32(1e6))
    assert enc.meta["scale"] == 2.0 ** 7 and codec.decode(enc, n=1000).size == 1000
    for bad in [0, 0.0, -2.0, float("nan"), float("inf"), -float("inf"), 1e39, 1e-300, "2", None,
                True, [2.0]]:
        rejects(codec, Encoded(dict(enc.meta, scale=bad), enc.frames), "scale")


def test_expected_n_and_out_size_are_enforced():
    codec, enc = good("int8")
    with pytest.raises(WireError, match="expected n=999"):
        codec.decode(enc, n=999)
    with pytest.raises(WireError, match="out has 999"):
        codec.decode_into(enc, np.zeros(999, np.float32))
    for out in [np.zeros(1000, np.float64), np.zeros((10, 100), np.float32),
                readonly(np.zeros(1000, np.float32)), np.zeros(2000, np.float32)[::2]]:
        with pytest.raises(GossipError, match="out must be"):
            codec.decode_into(enc, out)


def test_sparse_decoder_caps_n():
    codec, enc = good("topk:0.001")
    rejects(codec, Encoded(dict(enc.meta, n=MAX_N + 1), enc.frames))


@pytest.mark.parametrize("spec", ["topk:0.1", "randomk:0.1"])
def test_k_must_fit_n_and_frames(spec):
    codec, enc = good(spec)
    rejects(codec, Encoded(dict(enc.meta, k=1001), enc.frames), "k=1001")
    rejects(codec, Encoded(dict(enc.meta, k=-1), enc.frames), "k=-1")
    rejects(codec, Encoded(dict(enc.meta, k=99), enc.frames), "elements")


def test_topk_indices_are_checked():
    codec, enc = good("topk:0.1")
    codes, vals = enc.frames
    k, ib = enc.meta["k"], enc.meta["ib"]
    last_big = codes.copy()
    last_big[-1] = 254  # pushes the last index past n = 1000 unless it is tiny
    last_big[0] = 254
    for bad, meta, why in [
        (np.full(ib, 255, np.uint8), {}, "last byte 255"),
        (np.concatenate([codes[:-1], [255]]).astype(np.uint8), {}, "last byte 255"),
        (np.concatenate([[7], codes[1:]]).astype(np.uint8), {}, None),  # still k indices: fine
        (np.concatenate([codes, [0]]).astype(np.uint8), {"ib": ib + 1}, "expected k"),
        (np.concatenate([[255], codes[1:]]).astype(np.uint8), {}, "expected k"),
        (np.full(ib, 254, np.uint8), {}, "outside"),
    ]:
        e = Encoded(dict(enc.meta, **meta), [readonly(bad), vals])
        if why is None:
            assert codec.decode(e, n=1000).size == 1000
        else:
            rejects(codec, e, why)
    for ib_bad in [k - 1, k + 999 // 255 + 1, -1, None, 1.0]:
        rejects(codec, Encoded(dict(enc.meta, ib=ib_bad), enc.frames), "ib")
    rejects(codec, Encoded(enc.meta, [codes.astype(np.int8), vals]), "dtype")
    rejects(codec, Encoded(enc.meta, [codes.astype(np.uint32), vals]), "dtype")


def test_quantizer_payload_values_are_checked():
    codec, enc = good("int8")
    q, mult = enc.frames
    q2 = q.copy()
    q2[10] = -128
    rejects(codec, Encoded(enc.meta, [q2, mult]), "outside")
    for v in [np.nan, np.inf, -1.0]:
        m2 = mult.copy()
        m2[1] = v
        rejects(codec, Encoded(enc.meta, [q, m2]), "finite")
    rejects(codec, Encoded(dict(enc.meta, block=0), enc.frames), "block")
    rejects(codec, Encoded(dict(enc.meta, block=512), enc.frames), "elements")
    rejects(codec, Encoded(dict(enc.meta, levels=100), enc.frames), "outside")
    rejects(codec, Encoded(dict(enc.meta, levels=1000), enc.frames), "dtype")
    qs, enc = good("qsgd:4")
    q, mult = enc.frames
    q2 = q.copy()
    q2[0] = 5
    rejects(qs, Encoded(enc.meta, [q2, mult]), "outside")


def test_sign_and_randomk_meta_values_are_checked():
    codec, enc = good("sign:block=0")
    # 1e39 and 2**200 are finite but overflow float32: every value would decode to Inf
    for v in [float("nan"), float("inf"), -1.0, 1e39, 2**200, "1", None, True]:
        rejects(codec, Encoded(dict(enc.meta, scale=v), enc.frames), "scale")
    codec, enc = good("topk:0.1:values=fp8")
    rejects(codec, Encoded(dict(enc.meta, scale=1e39), enc.frames), "scale")
    codec, enc = good("sign")
    for v in [0, 4, 12, -8, 2**25, 1.5, None, True]:
        rejects(codec, Encoded(dict(enc.meta, block=v), enc.frames), "block")
    # a block size that is valid but not the sender's: the scales frame no longer fits
    rejects(codec, Encoded(dict(enc.meta, block=128), enc.frames), "scales")
    bits, scales = enc.frames
    for v in [np.nan, np.inf, -1.0]:
        bad = scales.copy()
        bad[3] = v
        rejects(codec, Encoded(enc.meta, [bits, bad]), "scales")
    codec, enc = good("randomk:0.1")
    for v in [-1, 2**64, 1.5, None]:
        rejects(codec, Encoded(dict(enc.meta, seed=v), enc.frames), "seed")


_junk = st.one_of(st.none(), st.booleans(), st.integers(-2**65, 2**65), st.floats(),
                  st.text(max_size=5), st.lists(st.integers(), max_size=3))


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fuzzed_payloads_decode_or_raise_wire_error(spec, data):
    # Whatever is changed, decoding either works (a consistent payload) or raises
    # WireError; no other exception, no write to out on failure.
    codec, enc = good(spec)
    meta = copy.deepcopy(enc.meta)
    frames = list(enc.frames)
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(meta) + ["extra"]))
            meta[key] = data.draw(_junk)
        else:
            i = data.draw(st.integers(0, len(frames) - 1))
            raw = frames[i].view(np.uint8).copy()
            pos = data.draw(st.integers(0, max(0, raw.size - 1)))
            if raw.size:
                raw[pos] = data.draw(st.integers(0, 255))
            cut = data.draw(st.sampled_from([None, 1, frames[i].dtype.itemsize]))
            if cut:
                raw = raw[:raw.size - raw.size % cut]
            dtype = data.draw(st.sampled_from([frames[i].dtype, np.dtype(np.uint8), np.dtype(np.int64)]))
            frames[i] = readonly(raw[:raw.size // dtype.itemsize * dtype.itemsize].view(dtype))
    bad = Encoded(meta, frames)
    out = np.zeros(1000, np.float32)
    try:
        # A changed byte can make a value NaN or Inf, and adding it may make numpy
        # warn; codecs leave finiteness to their callers (the gossip engine and the
        # relay refuse non-finite payloads), so that is not a failure.
        with np.errstate(all="ignore"):
            codec.decode_into(bad, out)
    except WireError:
        assert not out.any()
        return
    assert out.shape == (1000,)


@pytest.mark.parametrize("alpha", ["1", None, True, [1.0], 1j, float("nan"), float("inf")])
@pytest.mark.parametrize("spec", ["identity", "fp16", "topk:0.1", "ef+topk:0.1"])
def test_decode_into_alpha_must_be_a_finite_real_number(spec, alpha):
    codec, enc = good(spec)
    out = np.full(1000, 3.0, np.float32)
    with pytest.raises(GossipError, match="alpha must be a finite real number"):
        codec.decode_into(enc, out, alpha=alpha)
    assert np.all(out == 3.0)
    codec.decode_into(enc, out, alpha=np.float32(-0.5))   # numpy scalars are real numbers
    np.testing.assert_allclose(out, 3.0 - 0.5 * codec.decode(enc), rtol=1e-6)


@pytest.mark.parametrize("meta,match", [
    ({}, "meta n=None is not an integer"), ({"codec": "fp16"}, "fp16: meta n=None"),
    ({"codec": "fp16", "n": "4"}, "is not an integer"), ({"codec": "fp16", "n": True}, "is not an integer"),
    ({"codec": "fp16", "n": -1}, "outside"), ("n=4", "meta is a str, not a dict"),
])
def test_encoded_n_without_an_integer_n_is_a_wire_error(meta, match):
    with pytest.raises(WireError, match=match):
        Encoded(meta, []).n
    assert Encoded({"codec": "fp16", "n": 4}, []).n == 4
