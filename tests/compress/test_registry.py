"""Spec strings: what parses, what each part sets, and the errors for the rest."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.compress import (FP16, QSGD, ErrorFeedback, Identity, Int8, RandomK, Sign, TopK,
                            describe, get_codec, split_ef)
from swarm.errors import ConfigError


@pytest.mark.parametrize("spec,cls,attrs", [
    ("identity", Identity, {}),
    ("fp16", FP16, {}),
    ("int8", Int8, {"block": 256, "stochastic": False, "levels": 127}),
    ("int8:stochastic", Int8, {"stochastic": True}),
    ("INT8:Deterministic:block=64", Int8, {"block": 64, "stochastic": False}),
    ("qsgd", QSGD, {"levels": 16, "block": 512, "stochastic": True}),
    ("qsgd:4:bucket=128:seed=3", QSGD, {"levels": 4, "block": 128}),
    ("topk:0.01", TopK, {"fraction": 0.01}),
    ("topk:1", TopK, {"fraction": 1.0, "values": "fp32"}),
    ("topk:0.01:values=fp16", TopK, {"fraction": 0.01, "values": "fp16"}),
    ("randomk:0.25:seed=7", RandomK, {"fraction": 0.25}),
    ("sign", Sign, {"block": 256}),
    (" sign ", Sign, {}),
    ("sign:block=0", Sign, {"block": 0}),
    ("sign:block=64", Sign, {"block": 64}),
])
def test_specs_build_the_right_codec(spec, cls, attrs):
    c = get_codec(spec)
    assert type(c) is cls and c.spec == spec.strip()
    for k, v in attrs.items():
        assert getattr(c, k) == v


def test_ef_prefix_wraps_and_instances_are_independent():
    a, b = get_codec("ef+topk:0.01"), get_codec("ef+topk:0.01")
    assert isinstance(a, ErrorFeedback) and isinstance(a.inner, TopK) and a.name == "topk"
    assert a.inner is not b.inner
    a.encode(np.ones(100, np.float32))
    assert a.residual is not None and b.residual is None
    assert describe("ef+qsgd:4") == {"codec": "qsgd", "ef": True, "levels": 4, "block": 512,
                                      "stochastic": True}
    c = get_codec("sign")
    assert get_codec(c) is c


def test_seeds_make_streams_reproducible():
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    for spec in ["int8:stochastic:seed=4", "qsgd:8:seed=4", "randomk:0.1:seed=4"]:
        e1, e2 = get_codec(spec).encode(x), get_codec(spec).encode(x)
        assert e1.meta == e2.meta
        assert all(np.array_equal(f, g) for f, g in zip(e1.frames, e2.frames))


@pytest.mark.parametrize("spec,match", [
    ("gzip", "unknown codec 'gzip'"),
    ("", "unknown codec ''"),
    ("ef+", "unknown codec 'ef\\+'"),
    ("ef+ef+topk:0.1", "unknown codec"),
    ("topk", "needs exactly one ratio"),
    ("topk:0", "not in \\(0, 1\\]"),
    ("topk:1.5", "not in \\(0, 1\\]"),
    ("topk:-0.1", "not in \\(0, 1\\]"),
    ("topk:nan", "not in \\(0, 1\\]"),
    ("topk:abc", "'abc' is not a number"),
    ("randomk:0.1:0.2", "exactly one ratio"),
    ("randomk:0.1:seed=-1", "seed=-1"),
    ("randomk:0.1:seed=x", "seed='x'"),
    ("topk:0.1:bucket=3", "unknown parameter"),
    ("topk:0.1:values=int8", "not 'fp32', 'fp16' or 'fp8'"),
    ("randomk:0.1:values=fp16", "unknown parameter"),
    ("int8:fast", "'stochastic' or 'deterministic'"),
    ("int8:block=0", "block=0"),
    ("qsgd:0", "levels=0"),
    ("qsgd:40000", "levels=40000"),
    ("qsgd:4:8", "one level count"),
    ("fp16:2", "takes no arguments"),
    ("sign:", "empty parameter"),
    ("sign:block=12", "multiple of 8"),
    ("sign:block=-8", "outside"),
    ("sign:4", "takes only block"),
    ("int8:block=4:block=8", "given twice"),
])
def test_bad_specs_raise_config_error_naming_the_spec(spec, match):
    with pytest.raises(ConfigError, match=match) as e:
        get_codec(spec)
    assert repr(spec.strip()) in str(e.value) or repr(spec) in str(e.value)


@pytest.mark.parametrize("bad", [None, 3, 0.01, ["topk"]])
def test_non_string_spec(bad):
    with pytest.raises(ConfigError, match="codec spec must be a string"):
        get_codec(bad)


def test_direct_construction_checks_ratio():
    with pytest.raises(ConfigError, match="ratio"):
        TopK(ratio=0.0)


@pytest.mark.parametrize("spec,ratio", [
    ("identity", 1.0), ("fp16", 2.0),
    ("topk:0.1", 8.0),        # 100 one-byte gap codes and 100 float32 values for 1000 floats
    ("randomk:0.1", 10.0), ("ef+topk:0.1", 8.0), ("ef+randomk:0.1", 10.0),
])
def test_ratio_is_the_compression_ratio_for_every_codec(spec, ratio):
    c = get_codec(spec)
    assert c.ratio(1000) == ratio
    if isinstance(c, ErrorFeedback):
        assert c.residual is None    # measured on the inner codec: no residual kept
        c = c.inner
    if isinstance(c, (TopK, RandomK)):
        assert c.fraction == 0.1 and c.k_for(1000) == 100


@pytest.mark.parametrize("spec", ["EF+topk:0.5", "Ef+TopK:0.5", " ef+topk:0.5 "])
def test_ef_prefix_is_split_case_insensitively(spec):
    ef, inner = split_ef(spec)
    assert ef and inner.lower() == "topk:0.5"
    assert isinstance(get_codec(spec), ErrorFeedback) and type(get_codec(inner)) is TopK
    assert split_ef("topk:0.5") == (False, "topk:0.5") and split_ef("ef") == (False, "ef")
