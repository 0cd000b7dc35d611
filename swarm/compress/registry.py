"""Codec specs: the config form ``[ef+]name[:arg]...`` and the registry behind it.

Grammar (case-insensitive, no spaces)::

    spec  := ["ef+"] name (":" param)*
    param := value | key "=" value

    identity | fp16
    sign[:block=256]                            block=0: one scale for the whole vector
    int8[:stochastic|:deterministic][:block=256][:seed=N]
    qsgd[:S][:bucket=512][:seed=N]             S levels, 16 if left out: qsgd:4:bucket=1024
    topk:RATIO[:values=fp16|fp8][:seed=N]       e.g. topk:0.01   (0 < RATIO <= 1)
    randomk:RATIO[:seed=N]                      e.g. randomk:0.05:seed=7

A bad spec raises :class:`~swarm.errors.ConfigError` whose message quotes it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..checks import shown
from ..errors import ConfigError
from ._base import Codec
from .dense import FP16, Identity
from .feedback import ErrorFeedback
from .quantize import QSGD, Int8, Sign
from .sparse import RandomK, TopK

__all__ = ["CODECS", "get_codec", "split_ef"]

#: The built-in codec families, name -> class: read-only. A spec names one of these
#: (every peer process must be able to build what another sends, so a family is not
#: added at run time); a codec of one's own is used as an instance (``encode``/``decode``).
CODECS: Mapping[str, type[Codec]] = MappingProxyType({
    c.name: c for c in (Identity, FP16, Int8, QSGD, TopK, RandomK, Sign)
})


def _int(spec: str, key: str, text: str, lo: int, hi: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ConfigError(f"codec {spec!r}: {key}={text!r} is not an integer") from None
    if not lo <= v <= hi:
        raise ConfigError(f"codec {spec!r}: {key}={v} is outside [{lo}, {hi}]")
    return v


def _ratio(spec: str, pos: list[str]) -> float:
    if len(pos) != 1:
        raise ConfigError(f"codec {spec!r}: needs exactly one ratio in (0, 1], "
                          f"e.g. {spec.split(':')[0]}:0.01")
    try:
        r = float(pos[0])
    except ValueError:
        raise ConfigError(f"codec {spec!r}: ratio {pos[0]!r} is not a number") from None
    if not 0.0 < r <= 1.0:
        raise ConfigError(f"codec {spec!r}: ratio {r} is not in (0, 1]")
    return r


def _seed(spec: str, kw: dict[str, str]) -> int | None:
    return _int(spec, "seed", kw.pop("seed"), 0, (1 << 63) - 1) if "seed" in kw else None


def _build_plain(cls: type[Codec]) -> Callable[[str, list[str], dict[str, str]], Codec]:
    def build(spec: str, pos: list[str], kw: dict[str, str]) -> Codec:
        if pos:
            raise ConfigError(f"codec {spec!r}: {cls.name} takes no arguments, got {':'.join(pos)!r}")
        return cls(spec)
    return build


def _build_sign(spec: str, pos: list[str], kw: dict[str, str]) -> Codec:
    if pos:
        raise ConfigError(f"codec {spec!r}: sign takes only block=B, got {':'.join(pos)!r}")
    block = _int(spec, "block", kw.pop("block"), 0, 1 << 24) if "block" in kw else 256
    if block % 8:
        raise ConfigError(f"codec {spec!r}: block={block} is not a multiple of 8")
    return Sign(spec, block=block)


def _build_int8(spec: str, pos: list[str], kw: dict[str, str]) -> Codec:
    stochastic = False
    for p in pos:
        if p not in ("stochastic", "deterministic"):
            raise ConfigError(f"codec {spec!r}: int8 rounding must be 'stochastic' or "
                              f"'deterministic', got {p!r}")
        stochastic = p == "stochastic"
    block = _int(spec, "block", kw.pop("block"), 1, 1 << 24) if "block" in kw else 256
    return Int8(spec, block=block, stochastic=stochastic, seed=_seed(spec, kw))


def _build_qsgd(spec: str, pos: list[str], kw: dict[str, str]) -> Codec:
    if len(pos) > 1:
        raise ConfigError(f"codec {spec!r}: qsgd takes one level count, e.g. qsgd:16")
    s = _int(spec, "levels", pos[0], 1, 32767) if pos else 16
    bucket = _int(spec, "bucket", kw.pop("bucket"), 1, 1 << 24) if "bucket" in kw else 512
    return QSGD(spec, s=s, bucket=bucket, seed=_seed(spec, kw))


def _build_sparse(cls: type[TopK] | type[RandomK]) -> Callable[[str, list[str], dict[str, str]], Codec]:
    def build(spec: str, pos: list[str], kw: dict[str, str]) -> Codec:
        if cls is TopK and "values" in kw:
            values = kw.pop("values")
            if values not in ("fp32", "fp16", "fp8"):
                raise ConfigError(f"codec {spec!r}: values={values!r} is not 'fp32', 'fp16' or 'fp8'")
            return TopK(spec, ratio=_ratio(spec, pos), seed=_seed(spec, kw), values=values)
        return cls(spec, ratio=_ratio(spec, pos), seed=_seed(spec, kw))
    return build


_BUILDERS: dict[str, Callable[[str, list[str], dict[str, str]], Codec]] = {
    "identity": _build_plain(Identity),
    "fp16": _build_plain(FP16),
    "sign": _build_sign,
    "int8": _build_int8,
    "qsgd": _build_qsgd,
    "topk": _build_sparse(TopK),
    "randomk": _build_sparse(RandomK),
}


def split_ef(spec: str) -> tuple[bool, str]:
    """``(whether spec asks for error feedback, the spec without the "ef+")``, with
    the prefix matched case-insensitively as :func:`get_codec` does (outer spaces
    dropped; the rest is not checked)::

        split_ef("EF+topk:0.5")   # (True, "topk:0.5")
    """
    if not isinstance(spec, str):
        raise ConfigError(f"codec spec must be a string like 'ef+topk:0.01', got {type(spec).__name__} "
                          f"{shown(spec)}")
    text = spec.strip()
    if text[:3].lower() == "ef+":
        return True, text[3:]
    return False, text


def get_codec(spec: str | Codec) -> Codec:
    """A new codec instance for ``spec`` (see the module doc for the grammar).

    Stateful codecs keep state per instance, so call this once per stream::

        get_codec("ef+topk:0.01")    # ErrorFeedback(TopK(ratio=0.01))
        get_codec("int8:stochastic") # unbiased int8, fresh random seed
        get_codec("qsgd:4:seed=1")   # reproducible QSGD with 4 levels

    A codec instance passed in is returned as is.
    """
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(f"codec spec must be a string like 'topk:0.01', got {spec!r}")
    ef, body = split_ef(spec)
    name, *params = body.lower().split(":")
    if name not in _BUILDERS:
        raise ConfigError(f"unknown codec {spec!r}; known: {', '.join(sorted(_BUILDERS))} "
                          f"(prefix 'ef+' for error feedback)")
    pos: list[str] = []
    kw: dict[str, str] = {}
    for p in params:
        if not p:
            raise ConfigError(f"codec {spec!r}: empty parameter")
        if "=" in p:
            key, _, value = p.partition("=")
            if key in kw:
                raise ConfigError(f"codec {spec!r}: {key} given twice")
            kw[key] = value
        else:
            pos.append(p)
    codec = _BUILDERS[name](spec.strip(), pos, kw)
    if kw:
        raise ConfigError(f"codec {spec!r}: unknown parameter(s) {', '.join(sorted(kw))} for {name}")
    return ErrorFeedback(codec, spec.strip()) if ef else codec


def describe(spec: str) -> dict[str, Any]:
    """The parsed form of a spec (family, error feedback, parameters), for logs and configs."""
    c = get_codec(spec)
    inner = c.inner if isinstance(c, ErrorFeedback) else c
    params = {k: v for k, v in vars(inner).items()
              if not k.startswith("_") and isinstance(v, (int, float, bool, str)) and k != "spec"}
    return {"codec": inner.name, "ef": isinstance(c, ErrorFeedback), **params}
