"""The benchmarks in scripts/ still run, each as a real process with tiny arguments.

Each benchmark compares against its anchor in the same run and prints, as its
last line, one JSON object; these tests check that the line parses, that every
number in it is finite, and that it holds the keys the script's docstring
promises. Figures are not judged (speed belongs to the benchmarks themselves).

Only the benchmarks that finish in seconds with tiny arguments run here, some
in part: bench_gossip's section 2 alone (--only bytes at d = 100; its other
sections are hard-wired to d = 1e5 and 1e6), bench_scale's part (a) with 8
members, bench_vs_hivemind with --skip-hivemind (it never installs hivemind
here) and one configuration at d = 1000, and bench_learning with one seed, 260
env steps and a swarm of 2 peers, not 4 (nothing solves, so its ratios are null; its
isolated learners run as many at a time as the swarm has peers: half the processes).
bench_scale's part (c) (4 then 16 peer processes) takes a minute and is left to be
run by hand.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def run_script(name: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run scripts/<name>.py to its end. It gets a process group of its own, so that
    whatever it started is ended with it if it overruns ``timeout`` or the test fails."""
    p = subprocess.Popen([sys.executable, str(SCRIPTS / f"{name}.py"), *args], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)   # the group is the script's: its pid is the group id
        p.communicate()
        raise
    try:   # anything of the script's still running (it should have ended all its processes)
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def numbers(obj: object, path: str = "") -> list[tuple[str, float]]:
    """Every number in a parsed JSON value, with where it sits (``a.b[0]``)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [n for k, v in obj.items() for n in numbers(v, f"{path}.{k}" if path else k)]
    if isinstance(obj, list):
        return [n for i, v in enumerate(obj) for n in numbers(v, f"{path}[{i}]")]
    return []


def last_json(res: subprocess.CompletedProcess) -> dict:
    """The script's last stdout line as a JSON object whose numbers are all finite."""
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    lines = res.stdout.strip().splitlines()
    assert lines, f"no output\n{res.stderr[-3000:]}"

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the last line: {lines[-1][:500]}")

    obj = json.loads(lines[-1], parse_constant=refuse)   # NaN and Infinity are not JSON
    assert isinstance(obj, dict), lines[-1][:500]
    bad = [(p, v) for p, v in numbers(obj) if not math.isfinite(v)]   # 1e999 parses as inf
    assert not bad, bad
    return obj


def has(obj: dict, *keys: str) -> None:
    """Each key is in ``obj`` and is a number (the ratios and figures a docstring promises)."""
    missing = [k for k in keys if k not in obj]
    assert not missing, f"missing {missing}; the line has {sorted(obj)}"
    wrong = {k: obj[k] for k in keys if isinstance(obj[k], bool) or not isinstance(obj[k], (int, float))}
    assert not wrong, f"not numbers: {wrong}"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- in-process benchmarks

def test_bench_compress():
    out = last_json(run_script("bench_compress", "--sizes", "1000", "--reps", "1"))
    has(out, "n", "memcpy_gbps", "torch_topk_gbps", "topk_vs_torch")
    assert out["n"] == 1000
    for spec in ("identity", "fp16", "int8", "topk:0.01", "sign", "ef+topk:0.01"):
        has(out["codecs"][spec], "encode_gbps", "decode_gbps", "decode_into_gbps", "ratio", "rel_error")
    assert set(out["targets"]) == {"topk_vs_torch", "fp16_gbps", "int8_gbps", "sign_gbps"}


def test_bench_dqn():
    out = last_json(run_script("bench_dqn", "--batches", "8", "--reps", "1"))
    [row] = out["rows"]
    has(row, "update_ms", "anchor_update_ms", "learn_ms", "act_us", "anchor_act_us", "update_speedup", "act_speedup")
    assert row["batch"] == 8 and out["threads"] == 1


@pytest.fixture(scope="module")
def bench_scale_a_b() -> dict:
    """bench_scale's parts (a) and (b) in one run (part (a) with 8 members and a 0.5 s
    quiet window), for a test of each part: one start-up, not two."""
    return last_json(run_script("bench_scale", "--quick", "--skip", "c", "--members", "8", "--workers", "2",
                                "--churn", "2", "--churn-s", "0.1", "--quiet-s", "0.5"))


def test_bench_scale_in_process_part(bench_scale_a_b):
    out = bench_scale_a_b
    for topo in ("ring", "torus"):
        has(out, f"inproc_{topo}_rounds_per_s", f"numpy_{topo}_rounds_per_s", f"inproc_{topo}_vs_numpy",
            f"inproc_{topo}_mb_per_peer")
    assert out["inproc_ok"] is True and out["inproc_peers"] == 64


def test_bench_gossip_bytes_section():
    out = last_json(run_script("bench_gossip", "--quick", "--only", "bytes", "--bytes-d", "100"))
    assert out["only"] == "bytes" and out["bytes_d"] == 100 and out["quick"] is True
    has(out, "sign_bytes_saving", "sign_gamma", "topk_bytes_saving", "topk_gamma", "topk_best_error",
        "topk_fp16_values_bytes_saving")


def test_bench_buffer_without_cpprb_says_what_is_missing():
    if importlib.util.find_spec("cpprb") is not None:
        pytest.skip("cpprb is installed: test_bench_buffer runs it")
    res = run_script("bench_buffer", "--capacity", "1000", "--rounds", "3", "--burst", "1")
    assert res.returncode != 0
    assert "cpprb is needed" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_bench_buffer():
    pytest.importorskip("cpprb")
    out = last_json(run_script("bench_buffer", "--capacity", "1000", "--rounds", "3", "--burst", "1"))
    has(out, "learner_step_vs_cpprb", "add_vs_cpprb", "decay_overhead", "add_one_vs_cpprb",
        "sample_vs_cpprb", "update_vs_cpprb")


# ---------------------------------------------------------------- multi-process benchmarks

def test_bench_transport():
    out = last_json(run_script("bench_transport", "--mb", "0.1", "--n", "2", "--small", "100", "--repeat", "1"))
    has(out, "raw_gbps", "swarm_gbps", "curve_gbps", "raw_small_msgs_per_s", "swarm_small_msgs_per_s",
        "transport_ratio", "curve_ratio", "small_ratio")


def test_bench_relay():
    out = last_json(run_script("bench_relay", "--n", "5"))
    has(out, "raw_cpu_us_per_msg", "swarm_cpu_us_per_msg", "direct_cpu_us_per_msg",
        "swarm_over_raw", "direct_over_raw")
    assert out["received"] == {"raw": 5, "swarm": 5, "direct": 5}


class _Stand:
    """What bench_relay's stop() uses of a multiprocessing.Process, over a plain child
    that sleeps. (A spawned Process would start multiprocessing's resource tracker,
    which outlives the test as a child of the pytest process, and other tests look for
    children left behind.)"""

    def __init__(self, name: str, seconds: float) -> None:
        self.name = name
        self._p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])

    def join(self, timeout: float | None = None) -> None:
        try:
            self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self._p.poll() is None

    def kill(self) -> None:
        self._p.kill()

    def terminate(self) -> None:
        self._p.terminate()

    @property
    def exitcode(self) -> int | None:
        return self._p.poll()


def test_bench_relay_stops_its_coordinator_instead_of_waiting_for_it():
    """A leg's coordinator serves until told to stop: the relay bench used to wait 10 s
    for it to exit on its own (20 s a run) and then kill it."""
    relay = load_script("bench_relay")
    procs = [_Stand("coordinator", 60), _Stand("receiving peer", 0.1)]
    coord, peer = procs
    try:
        relay.stop(procs, grace=10)
        assert peer.exitcode == 0             # a peer that ends on its own is left to
        assert coord.exitcode == -signal.SIGTERM, coord.exitcode
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def test_bench_failover():
    out = last_json(run_script("bench_failover", "--sizes", "2", "--faults", "1", "--startup-peers", "2",
                               "--quiet-s", "0.1", "--quiet-n", "1"))
    assert out["startup_peers"] == 2
    has(out, "startup_s", "startup_anchor_s", "startup_vs_anchor", "crash_relink_p99_ms", "freeze_relink_p99_ms",
        "crash_relink_vs_anchor", "freeze_relink_vs_anchor", "false_deaths", "quiet_epochs")
    for part in ("crash_2", "freeze_2", "anchor_crash", "anchor_freeze"):
        has(out[part], "p50_ms", "p99_ms", "max_ms")


def test_bench_scale_coordinator_part(bench_scale_a_b):
    out = bench_scale_a_b
    assert out["coord_members"] == 8
    has(out, "view_p50_ms", "view_p99_ms", "view_max_ms", "anchor_fanout_p99_ms", "coord_cpu", "coord_cpu_churn",
        "coord_hb_per_s", "coord_hb_nominal_per_s", "coord_cpu_us_per_hb", "view_formed_s")
    assert isinstance(out["target_view_p99_met"], bool) and isinstance(out["target_coord_cpu_met"], bool)


def test_bench_scale_refuses_an_empty_quiet_window():
    res = run_script("bench_scale", "--quick", "--skip", "b,c", "--quiet-s", "0", timeout=60)
    assert res.returncode == 2 and "--quiet-s must be > 0" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "bench_scale on" not in res.stdout, res.stdout[-2000:]


def test_bench_vs_hivemind_skipping_hivemind_reports_swarm_and_the_anchor():
    res = run_script("bench_vs_hivemind", "--skip-hivemind", "--d", "1000", "--repeats", "1",
                     "--configs", "full:identity")
    out = last_json(res)
    assert "hivemind setup" not in res.stderr, res.stderr[-2000:]   # nothing was installed
    assert out["d"] == 1000 and out["swarm_best_config"] == "full/identity"
    has(out, "swarm_best_wall_s", "swarm_cpu_s", "swarm_bytes", "swarm_final_err", "raw_pyzmq_wall_s",
        "swarm_vs_raw_pyzmq")
    has(out["swarm"]["full/identity"], "wall_s", "cpu_s", "rounds", "err", "bytes")
    assert out["vs_hivemind_ratio"] is None and out["hivemind_best_wall_s"] is None and out["hivemind"] == {}
    assert out["hivemind_status"].startswith("not run")


def test_bench_vs_hivemind_table_gives_small_byte_counts_in_kb():
    """At a small --d the table said '0 MB' for tens of kB."""
    fmt = load_script("bench_vs_hivemind").fmt_bytes
    assert (fmt(32_552), fmt(120_000_000), fmt(None)) == ("32.6 kB", "120 MB", "-")


#: bench_learning in brief: one seed, 260 env steps, the swarm (and so each batch of
#: isolated learners) of 2 peers
LEARNING_TINY = ["--seeds", "0", "--max-steps", "260", "--eval-every", "260", "--eval-episodes", "1",
                 "--skip-dense", "--skip-alone", "--set", "peers=2"]


def test_bench_learning():
    out = last_json(run_script("bench_learning", *LEARNING_TINY))
    assert out["seeds"] == [0] and out["exchange"] == "gradients"
    ratios = ("cpu_time_ratio_vs_isolated", "cpu_time_ratio_vs_isolated_alone", "steps_per_peer_ratio",
              "total_steps_ratio", "wall_time_ratio_vs_isolated", "bytes_saving")
    missing = [k for k in (*ratios, "ratio_seeds", "any_peer", "solver", "targets") if k not in out]
    assert not missing, missing
    # nothing solves CartPole in 260 steps: no seed to compare on, and every ratio is null, not NaN
    assert out["ratio_seeds"] == [] and all(out[k] is None for k in ratios), out
    has(out, "solved_fraction", "isolated_solved_fraction")
    [iso] = out["isolated"]
    has(iso, "steps", "cpu_s", "wall_s")
    assert iso["steps"] == 260 and iso["solved"] is False
    [sw] = out["swarm"]
    has(sw, "steps_per_peer", "total_steps", "cpu_s", "wall_s", "bytes_per_peer", "gossip_bytes_per_peer")
    assert sw["steps_at_end"] == [260] * 2 and sw["total_steps"] == 2 * 260
    assert sw["bytes_per_peer"] > 0   # read from the run's summary: the peers did talk
    assert out["isolated_alone"] == [] and out["swarm_dense"] == []


def test_bench_vs_hivemind_help_says_what_a_run_without_skip_installs():
    res = run_script("bench_vs_hivemind", "--help", timeout=60)
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "--skip-hivemind" in text and "build/hivemind-venv" in text and "pip-installs" in text, text


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc), children first."""
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [d for k in kids for d in (k, *_descendants(k))]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _peers(pids: list[int]) -> int:
    """How many of ``pids`` are `swarm peer` processes."""
    n = 0
    for pid in pids:
        try:
            n += b"--rank" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            pass
    return n


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("script,args,busy", [
    ("bench_scale", ["--quick", "--skip", "b,c"], lambda pids: len(pids) >= 2),   # coordinator and workers
    # in its swarm run, whose launcher takes SIGTERM over (it raised KeyboardInterrupt: the
    # script died by SIGINT, with a traceback); the isolated learners come first
    ("bench_learning", LEARNING_TINY, lambda pids: _peers(pids) == 2),
], ids=["bench_scale", "bench_learning"])
def test_a_benchmark_ended_by_sigterm_ends_the_processes_it_started(script, args, busy, tmp_path):
    """A `timeout` (SIGTERM) of bench_scale left its coordinator and workers running for
    good: the signal ended the script before its finally blocks. Every benchmark that
    starts processes now takes SIGTERM as SystemExit."""
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        p = subprocess.Popen([sys.executable, str(SCRIPTS / f"{script}.py"), *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not busy(started) and time.monotonic() < deadline and p.poll() is None:
            started = _descendants(p.pid)
            time.sleep(0.1)
        assert busy(started), f"{script} did not start its processes: {started}"
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 128 + signal.SIGTERM
        assert "Traceback" not in err.read_text(errors="replace"), err.read_text(errors="replace")[-3000:]
        deadline = time.monotonic() + 20
        while any(map(_running, started)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in started if _running(pid)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in started:   # what the script left behind, by pid
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
