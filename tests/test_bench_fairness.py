"""The benchmarks' anchors do the same work as swarm, and a failed side gives null.

Each scripts/bench_*.py compares swarm with an anchor in the same run; these tests
check what makes such a comparison fair, not the figures themselves: bench_vs_hivemind
counts the payload a codec really sends, bench_gossip reports no ratio for a run that missed
its target, and bench_compress times its anchor as often as the codecs.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_scripts import last_json, load_script, run_script

# ---------------------------------------------------------------- bench_vs_hivemind


def test_vs_hivemind_payload_is_the_frames_a_compressed_codec_sends():
    """The payload (behind bytes_matched and swarm_bytes_le_hivemind) was messages x d x 4
    for every codec but fp16: int8 and top-k were counted as float32."""
    from swarm.compress import get_codec

    d = 1000
    # ring: several rounds (on the full graph the first round's full states average exactly)
    configs = ["ring:int8", "ring:topk:0.5"]
    res = run_script("bench_vs_hivemind", "--skip-hivemind", "--d", str(d), "--repeats", "1",
                     "--configs", ",".join(configs), timeout=240)
    out = last_json(res)
    # the timed run of each configuration, as the script logs it: run_swarm's whole result
    logged = {line.split(": ", 1)[0].split()[-1]: json.loads(line.split(": ", 1)[1])
              for line in res.stderr.splitlines() if line.startswith("[1/1] swarm ")}
    for config in configs:
        topology, _, codec = config.partition(":")
        key = f"{topology}/{codec}"
        run = logged[key]
        assert run["ok"], f"{config} did not reach the tolerance: {run}"
        frames = get_codec(codec).encode(np.zeros(d, np.float32)).nbytes   # these codecs: one size for all d
        # a ring of 4: 2 messages per peer per round; the first round's are each stream's full
        # state (float32 x), every later one a delta as the codec encodes it
        assert run["rounds"] > 1, run
        assert run["payload"] == 4 * 2 * 4 * d + (run["rounds"] - 1) * 4 * 2 * frames, (config, run, frames)
        assert out["swarm"][key]["payload"] == run["payload"]
        assert out["swarm"][key]["messages"] == run["rounds"] * 4 * 2


# ---------------------------------------------------------------- bench_gossip

D = 1000


def _fake_to_epsilon(miss: set[str]):
    """bench_gossip.to_epsilon without the engine: a codec in ``miss`` does not reach eps."""

    async def to_epsilon(d, codec, gamma, max_rounds, eps=1e-3, byte_budget=None, n=16, **hub_kw):
        reached = codec.split(":")[0] not in miss
        dense = codec == "identity"
        return {"codec": codec, "gamma": gamma, "rounds": 100, "bytes": 8_000_000 if dense else 500_000,
                "wall_s": 10.0 if dense else 1.0, "error": eps / 2 if reached else 0.1, "min_error": eps / 2,
                "reached": reached, "wall_5e-3_s": None, "trace": [0.1]}
    return to_epsilon


def _fake_per_host_model(miss: set[str]):
    async def per_host_model(d, codec, gamma, max_rounds, eps=1e-3, bps=100e6, latency_s=0.0005):
        reached = codec.split(":")[0] not in miss
        rounds = 100
        # dense's link time as the bench's own check computes it, so that the check passes
        link = rounds * 2 * d * 4 * 8 / bps if codec == "identity" else 0.01
        return {"codec": codec, "gamma": gamma, "rounds": rounds, "error": eps / 2 if reached else 0.1,
                "reached": reached, "failure": "", "compute_s": 0.5, "link_s": link,
                "latency_s": rounds * latency_s, "total_s": 0.5 + link + rounds * latency_s,
                "total_per_link_s": 0.5 + link + rounds * latency_s}
    return per_host_model


def _gossip_main(monkeypatch, miss: set[str]) -> dict:
    """bench_gossip.main with every section faked (no engine, no namespaces), the real
    link run included: the JSON it builds from the runs is what is under test."""
    bg = load_script("bench_gossip")
    monkeypatch.setattr(bg, "to_epsilon", _fake_to_epsilon(miss))
    monkeypatch.setattr(bg, "per_host_model", _fake_per_host_model(miss))

    async def rounds_per_s(d, rounds):
        return 50.0, 60.0
    monkeypatch.setattr(bg, "rounds_per_s", rounds_per_s)
    monkeypatch.setattr(bg, "numpy_anchor", lambda d, rounds: (100.0, 100.0))
    monkeypatch.setattr(bg.NetnsLab, "unusable", staticmethod(lambda: None))

    def real_link_run(n, d, codec, gamma, eps=1e-3, max_s=90.0):
        reached = codec.split(":")[0] not in miss
        return {"codec": codec, "gamma": gamma, "n": n, "d": d, "reached": reached,
                "wall_s": (8.0 if codec == "identity" else 2.0) if reached else None,
                "rounds": 10 if reached else None}
    monkeypatch.setattr(bg, "real_link_run", real_link_run)
    return asyncio.run(bg.main(quick=True, netns=True, topk=True, bytes_d=D))


SPEEDUPS = ("slow_link_speedup", "slow_link_speedup_per_host_model", "slow_link_speedup_per_host_model_per_edge",
            "real_link_speedup")


def test_gossip_ratios_are_numbers_when_both_sides_reach(monkeypatch):
    out = _gossip_main(monkeypatch, miss=set())
    for key in (*SPEEDUPS, "sign_bytes_saving", "topk_bytes_saving", "topk_fp16_values_bytes_saving",
                "slow_link_speedup_per_host_model_topk"):
        assert isinstance(out[key], float) and out[key] > 1, (key, out[key])
    assert out["slow_link_speedup"] == 10.0 and out["real_link_speedup"] == 4.0
    assert out["slow_link_dense_s"] == 10.0 and out["slow_link_dense_reached"] is True
    assert out["slow_link_sign_s"] == 1.0 and out["slow_link_sign_reached"] is True
    assert out["bytes_dense_reached"] is out["sign_reached"] is out["topk_reached"] is True


def test_gossip_a_sign_run_that_misses_gives_null_speed_ups_not_zero(monkeypatch):
    """ef+sign never reaches 1e-3: every speed-up and saving against it was 0.0, and
    slow_link_sign_s a plain number with nothing saying it was no time to 1e-3."""
    out = _gossip_main(monkeypatch, miss={"ef+sign"})
    for key in (*SPEEDUPS, "sign_bytes_saving"):
        assert out[key] is None, (key, out[key])
    assert out["real_link"]["speedup"] is None and out["real_link"]["sign_reached"] is False
    assert out["slow_link_sign_reached"] is False and out["slow_link_sign_s"] is None
    assert out["slow_link_dense_reached"] is True and out["slow_link_dense_s"] == 10.0
    assert out["sign_reached"] is False
    # the other codec still reached, against a dense run that did
    assert out["topk_bytes_saving"] == 16.0 and out["slow_link_speedup_per_host_model_topk"] > 1


def test_gossip_a_dense_anchor_that_misses_gives_no_ratio_at_all(monkeypatch):
    """The byte savings never checked that the dense run itself reached 1e-3."""
    out = _gossip_main(monkeypatch, miss={"identity"})
    for key in (*SPEEDUPS, "sign_bytes_saving", "topk_bytes_saving", "topk_fp16_values_bytes_saving",
                "slow_link_speedup_per_host_model_topk"):
        assert out[key] is None, (key, out[key])
    assert out["bytes_dense_reached"] is False and out["sign_reached"] is True
    assert out["slow_link_dense_reached"] is False and out["slow_link_dense_s"] is None
    assert out["real_link"]["dense_reached"] is False


def test_gossip_bytes_section_gives_a_saving_only_for_a_codec_that_reached():
    """The real section 2 at d = 100, where the compressed codecs miss 1e-3 within the
    quick caps: their savings were 0.0 in the JSON line."""
    out = last_json(run_script("bench_gossip", "--quick", "--only", "bytes", "--bytes-d", "100"))
    assert out["bytes_dense_reached"] is True
    for name in ("sign", "topk", "topk_fp16_values"):
        reached, saving = out[f"{name}_reached"], out[f"{name}_bytes_saving"]
        assert isinstance(reached, bool), (name, reached)
        assert (saving is None) if not reached else (isinstance(saving, float) and saving > 0), (name, out)


# ---------------------------------------------------------------- bench_compress


def test_compress_anchor_gets_as_many_timed_calls_as_each_codec(monkeypatch):
    """torch.topk was timed best of reps // 2, the codecs best of reps: the anchor's best
    of fewer calls is slower, which flattered topk_vs_torch."""
    pytest.importorskip("torch")
    bc = load_script("bench_compress")
    reps_seen: list[int] = []
    real_best = bc.best

    def best(fn, reps):
        reps_seen.append(reps)
        return real_best(fn, reps)
    monkeypatch.setattr(bc, "best", best)
    bc.run_size(1000, 4)
    # memcpy, 2 torch.topk, then encode/decode/decode_into per codec
    assert len(reps_seen) == 3 + 3 * len(bc.SPECS)
    assert set(reps_seen) == {4}, reps_seen
