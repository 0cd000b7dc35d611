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
import queue
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from swarmtest import alive

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
    has(out, "sign_gamma", "topk_gamma", "topk_best_error")
    # at d = 100 the codecs miss 1e-3 within the quick caps: their savings are null, not 0.0
    # (tests/test_bench_fairness.py checks them against the reached flags)
    for name in ("sign", "topk", "topk_fp16_values"):
        assert f"{name}_bytes_saving" in out and isinstance(out[f"{name}_reached"], bool)


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
    # the standby's takeover was measured nowhere (a test's time limit on it was dropped)
    out = last_json(run_script("bench_failover", "--sizes", "2", "--faults", "1", "--startup-peers", "2",
                               "--quiet-s", "0.1", "--quiet-n", "1", "--standby-peers", "2"))
    assert out["startup_peers"] == 2 and out["standby_peers"] == 2
    has(out, "startup_s", "startup_anchor_s", "startup_vs_anchor", "crash_relink_p99_ms", "freeze_relink_p99_ms",
        "crash_relink_vs_anchor", "freeze_relink_vs_anchor", "false_deaths", "quiet_epochs",
        "standby_takeover_s", "standby_takeover_floor_s", "standby_takeover_vs_floor")
    for part in ("crash_2", "freeze_2", "anchor_crash", "anchor_freeze"):
        has(out[part], "p50_ms", "p99_ms", "max_ms")
    has(out["standby_takeover"], "p50_s", "p99_s", "max_s")
    assert out["standby_takeover_s"] > 0 and out["standby_takeover_floor_s"] > 0


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


def _peers(pids: list[int]) -> int:
    """How many of ``pids`` are `swarm peer` processes: started with ``--rank``, or forked by
    `swarm run`'s fork server, which names them ``swarm peer{r}``."""
    n = 0
    for pid in pids:
        try:
            n += (b"--rank" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                  or Path(f"/proc/{pid}/comm").read_text().startswith("swarm peer"))
        except OSError:
            pass
    return n


def _signal_ends_script(script: str, args: list[str], busy, tmp_path: Path, sig: int, code: int,
                        said: str = "") -> None:
    """Start ``script``, wait until ``busy`` holds for the processes under it, send it
    ``sig``: it exits with ``code``, no traceback (``said`` on stderr), and leaves no
    process behind. It starts with SIGINT at its default: one started from a shell's
    background job inherits it ignored (Python then raises no KeyboardInterrupt)."""
    err = tmp_path / "stderr"
    with open(err, "wb") as f:   # in tmp_path: what a script writes relative to it stays there
        p = subprocess.Popen([sys.executable, str(SCRIPTS / f"{script}.py"), *args], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=f, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not busy(started) and time.monotonic() < deadline and p.poll() is None:
            started = _descendants(p.pid)
            time.sleep(0.1)
        assert busy(started), f"{script} did not start its processes: {err.read_text(errors='replace')[-3000:]}"
        p.send_signal(sig)
        assert p.wait(60) == code, err.read_text(errors="replace")[-3000:]
        text = err.read_text(errors="replace")
        assert "Traceback" not in text and said in text, text[-3000:]
        deadline = time.monotonic() + 20
        while any(map(alive, started)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in started if alive(pid)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in started:   # what the script left behind, by pid
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("script,args,busy", [
    ("bench_scale", ["--quick", "--skip", "b,c"], lambda pids: len(pids) >= 2),   # coordinator and workers
    # in its swarm run, whose launcher takes SIGTERM over (it raised KeyboardInterrupt: the
    # script died by SIGINT, with a traceback); the isolated learners come first
    ("bench_learning", LEARNING_TINY, lambda pids: _peers(pids) == 2),
    # the same for the experiment scripts: they died by SIGINT (-2) with a traceback
    ("compare_runs", ["codec", "--only", "fp16", "--steps", "500", "--set", "peers=2", "--out", "out"],
     lambda pids: _peers(pids) == 2),
    # its isolated learner first (250 steps), then a swarm run of the benchmark's 4 peers
    ("eval_schedules", ["--seeds", "0", "--every", "250", "--schedules", "250", "--episodes", "1",
                        "--isolated-steps", "250", "--swarm-steps", "500"], lambda pids: _peers(pids) == 4),
], ids=["bench_scale", "bench_learning", "compare_runs", "eval_schedules"])
def test_a_script_ended_by_sigterm_ends_the_processes_it_started(script, args, busy, tmp_path):
    """A `timeout` (SIGTERM) of bench_scale left its coordinator and workers running for
    good: the signal ended the script before its finally blocks. Every script that
    starts processes now takes SIGTERM as SystemExit (exit status 143, no traceback)."""
    _signal_ends_script(script, args, busy, tmp_path, signal.SIGTERM, 128 + signal.SIGTERM)


def test_run_script_takes_sigterm_as_system_exit_so_finally_blocks_run(tmp_path):
    """run_script installs the SIGTERM handler that nine scripts each installed before it
    (five did not: a `timeout` of them skipped their finally blocks)."""
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from swarm.scripting import run_script

        def main():
            try:
                print("started", file=sys.stderr, flush=True)
                time.sleep(60)
            finally:
                print("finally ran", file=sys.stderr, flush=True)

        run_script(main, "sleeper")
    """))
    p = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr.readline() == "started\n"
        p.terminate()
        assert p.wait(30) == 128 + signal.SIGTERM
        assert p.stderr.read() == "finally ran\n"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- experiment scripts: arguments, folders, signals

@pytest.mark.parametrize("args", [["--every", "nan"], ["--every", "inf"], ["--freeze", "nan"],
                                  ["--warmup", "nan"], ["--duration", "inf"]])
def test_chaos_refuses_a_float_option_that_is_not_finite(args, capsys):
    """--freeze nan crashed at the first freeze; --every nan or inf injected a single fault."""
    chaos = load_script("chaos")
    with pytest.raises(SystemExit) as e:
        chaos.parse_args(args)
    assert e.value.code == 2
    assert f"argument {args[0]}: '{args[1]}' is not a finite number" in capsys.readouterr().err


def test_chaos_refuses_a_root_it_cannot_create(tmp_path, capsys):
    """It ended in a FileNotFoundError traceback once the arguments had been accepted."""
    (tmp_path / "file").write_text("")
    chaos = load_script("chaos")
    with pytest.raises(SystemExit) as e:
        chaos.parse_args(["--root", str(tmp_path / "file" / "runs")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--root {tmp_path / 'file' / 'runs'}: cannot create it" in err, err
    made = tmp_path / "made" / "runs"
    assert chaos.parse_args(["--root", str(made)]).root == str(made) and made.is_dir()


def test_chaos_does_not_judge_a_fault_taken_before_any_other_peer_reported_steps():
    """Such a fault has no other peer's steps to compare with: it counted as not survived
    (--warmup 2: "faults 4, survived 0" while the peers trained on)."""
    judge = load_script("chaos").judge
    assert judge({}, {"peer0": 100, "peer1": 100}) is None
    assert judge({"peer1": 10}, {"peer1": 11}) is True
    assert judge({"peer1": 10}, {"peer1": 10}) is False
    assert judge({"peer1": 10}, {}) is False   # an other that stopped reporting did not go on


def test_chaos_judges_the_faults_its_run_ended_within_15_s_of(tmp_path, monkeypatch):
    """A run that ends early (its budget spent) left the faults of its last 15 s unjudged,
    and they counted as not survived. They are judged on the steps last seen.

    chaos() runs against a stand-in `swarm run` (a process that ends 4 s in) whose
    "children" are real sleeping processes, with faults every 0.3 s from the start and the
    others' steps growing at every status."""
    chaos = load_script("chaos")
    checks = [(0.0, "peer0", {"peer1": 10}), (1.0, "peer1", {"peer0": 7}), (2.0, "peer0", {})]
    assert chaos.tally(checks, {"peer0": 7, "peer1": 12}) == (1, 1)
    assert chaos.tally(checks, {"peer0": 8, "peer1": 12}) == (2, 1)
    assert chaos.tally([], {"peer0": 8}) == (0, 0)

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    kids = {name: subprocess.Popen(sleeper) for name in ("coordinator", "peer0", "peer1")}
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    polls = iter(range(10**6))
    try:
        monkeypatch.setattr(chaos, "start_run", lambda root, overrides: (run, tmp_path))
        monkeypatch.setattr(chaos, "coordinator_addr", lambda r: "tcp://127.0.0.1:9")
        monkeypatch.setattr(chaos, "children", lambda r: {k: p.pid for k, p in kids.items()})
        monkeypatch.setattr(chaos, "status", lambda addr: {"members": [
            {"id": f"peer{i}", "stats": {"env_steps": 10 * next(polls)}} for i in range(2)]})
        args = chaos.parse_args(["--duration", "26", "--warmup", "0", "--every", "0.3", "--freeze", "0.05",
                                 "--peers", "2", "--no-clean", "--root", str(tmp_path)])
        c = chaos.chaos(args, tmp_path)
    finally:
        for p in [run, *kids.values()]:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait(10)
    faults = sum(c["faults"].values())
    # every fault came within 15 s of the end; one before the first status would be unjudged
    assert faults >= 2 and c["survived"] >= 1 and c["survived"] + c["not_judged"] == faults, c


@pytest.mark.parametrize("failed", [False, True, "raises"])
def test_chaos_removes_its_temporary_folder_unless_something_failed(failed, tmp_path, monkeypatch, capsys):
    """Without --root it kept a temporary folder (33 MB after 8 s of 2 peers) after every run,
    named only on the first line."""
    import tempfile

    chaos = load_script("chaos")
    roots = []

    def run_and_report(args, root):
        roots.append(root)
        (root / "swarm-run-0.log").write_text("a log\n")
        if failed == "raises":
            raise SystemExit("swarm run exited with 1")
        return failed

    monkeypatch.setattr(chaos, "run_and_report", run_and_report)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["chaos.py", "--duration", "30", "--warmup", "1"])
    if failed == "raises":
        with pytest.raises(SystemExit):
            chaos.main()
        assert f"kept the run folder {roots[0]}" in capsys.readouterr().err
    else:
        chaos.main()
    assert roots and roots[0].parent == tmp_path
    assert (roots[0] / "swarm-run-0.log").exists() == bool(failed)


def test_compare_runs_refuses_an_out_folder_it_cannot_create(tmp_path):
    """It ended in a FileNotFoundError (here NotADirectoryError) traceback after checking the runs."""
    (tmp_path / "file").write_text("")
    res = run_script("compare_runs", "codec", "--only", "fp16", "--steps", "500",
                     "--out", str(tmp_path / "file" / "out"), timeout=60)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "--out" in res.stderr and "cannot create it" in res.stderr, res.stderr


def test_learning_bound_counts_a_solve_at_the_envs_own_threshold():
    """The threshold was CartPole-v1's 475 whatever --env: CartPole-v0 (returns up to 200)
    could never be solved, and said nothing about it."""
    tiny = ["--env", "CartPole-v0", "--actors", "1", "--seeds", "0", "--max-steps", "1001",
            "--eval-every", "1000", "--eval-episodes", "1"]
    assert last_json(run_script("learning_bound", *tiny, timeout=120))["solve_at"] == 195.0
    assert last_json(run_script("learning_bound", *tiny, "--solve-at", "20", timeout=120))["solve_at"] == 20.0


def test_learning_bound_needs_solve_at_for_an_env_without_a_threshold():
    import gymnasium as gym

    from swarm.errors import ConfigError

    lb = load_script("learning_bound")
    name = "test_scripts/CartPoleNoThreshold-v0"
    gym.register(name, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=100)
    try:
        with pytest.raises(ConfigError, match="--solve-at"):
            lb.solve_threshold(name)
        assert lb.solve_threshold(name, 80.0) == 80.0
        assert lb.solve_threshold("CartPole-v1") == 475.0
    finally:
        del gym.registry[name]


def test_learning_bound_refuses_a_solve_at_that_is_not_finite():
    res = run_script("learning_bound", "--solve-at", "nan", timeout=60)
    assert res.returncode == 2 and "argument --solve-at: 'nan' is not a finite number" in res.stderr, res.stderr


def test_dqn_isolated_refuses_steps_that_leave_no_update():
    """--steps 300 with learning_starts = 1000 reported a curve from a learner that never
    updated (learning_bound already refused it)."""
    res = run_script("dqn_isolated", "--steps", "300", timeout=60)
    assert res.returncode == 2, res.stdout[-2000:]
    assert "--steps 300 is not above learning_starts = 1000" in res.stderr, res.stderr


# ---------------------------------------------------------------- errors and bad input: failover, scale, gossip, relay, transport

@pytest.mark.parametrize("error", [RuntimeError("did not settle"), SystemExit(128 + signal.SIGTERM)],
                         ids=["timeout", "sigterm"])
def test_bench_failover_a_failed_relink_wait_leaves_no_stopped_peer(error, tmp_path, monkeypatch):
    """fault_relink_ms took the victim out of the swarm's peers before it sent SIGSTOP: when
    the wait for the re-link failed (a timeout, an assert, SIGTERM as SystemExit), close()
    did not know that peer, and it stayed stopped for good."""
    import random

    fo = load_script("bench_failover")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    try:
        sw = fo.Swarm(tmp_path)
        sw.peers = {"p0": procs[0], "p1": procs[1]}
        monkeypatch.setattr(fo, "status", lambda addr: {"epoch": 1})

        def wait_settled(n: int, timeout: float = 60.0) -> dict:
            raise error
        monkeypatch.setattr(sw, "wait_settled", wait_settled)
        with pytest.raises(type(error)):
            fo.fault_relink_ms(sw, 2, "freeze", random.Random(0))
        sw.close()
        assert [p.poll() is not None for p in procs] == [True, True], "a peer was left running or stopped"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()   # a stopped process too
                p.wait()


def test_bench_failover_says_at_once_why_the_swarm_will_not_settle(tmp_path, monkeypatch):
    """The error pointed to logs in the run's temporary folder, which is removed as the
    error leaves the run; a coordinator that had exited was waited for until the deadline."""
    fo = load_script("bench_failover")
    sw = fo.Swarm(tmp_path)
    with open(tmp_path / "coordinator.log", "w") as log:
        sw.coord = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('swarm: error: unknown key bogus')"],
                                    stdout=log, stderr=subprocess.STDOUT)
    try:
        sw.coord.wait(30)

        def no_answer(addr: str) -> dict:
            raise TimeoutError("no answer")
        monkeypatch.setattr(fo, "status", no_answer)
        with pytest.raises(RuntimeError) as e:
            sw.wait_settled(2, timeout=10)
        assert "coordinator exited" in str(e.value) and "exited with code 1" in str(e.value), str(e.value)
        assert "unknown key bogus" in str(e.value), str(e.value)   # the log's end, not where it was
    finally:
        if sw.coord.poll() is None:
            sw.coord.kill()
            sw.coord.wait()


def test_bench_scale_reports_a_coordinator_that_exited_with_the_end_of_its_log():
    """A bad --coord-set: the coordinator exited with code 2 and said why into a log in a
    folder removed with the error, and the bench waited 20 s, then printed a traceback
    ("the coordinator did not answer status")."""
    res = run_script("bench_scale", "--quick", "--skip", "b,c", "--coord-set", "bogus=1", timeout=90)
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    assert "the coordinator exited with code 2" in res.stderr and "unknown key bogus" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]


#: tiny sizes, so that the old code (which took these values) ran to its late failure quickly
FAILOVER_TINY = ["--sizes", "2", "--faults", "1", "--startup-peers", "2", "--quiet-n", "1"]
SCALE_TINY = ["--quick", "--skip", "b,c", "--members", "8", "--workers", "2", "--churn", "2"]


@pytest.mark.parametrize("script,args,option", [
    ("bench_failover", [*FAILOVER_TINY, "--quiet-s", "nan"], "--quiet-s"),
    ("bench_failover", [*FAILOVER_TINY, "--quiet-s", "inf"], "--quiet-s"),
    ("bench_scale", [*SCALE_TINY, "--churn-s", "0.1", "--quiet-s", "nan"], "--quiet-s"),
    ("bench_scale", [*SCALE_TINY, "--churn-s", "inf", "--quiet-s", "0.5"], "--churn-s"),
    ("bench_relay", ["--n", "3", "--every-ms", "nan"], "--every-ms"),
    ("bench_transport", ["--mb", "nan", "--n", "2", "--small", "100", "--repeat", "1"], "--mb"),
    ("bench_transport", ["--mb", "inf", "--n", "2", "--small", "100", "--repeat", "1"], "--mb"),
], ids=["failover-quiet-nan", "failover-quiet-inf", "scale-quiet-nan", "scale-churn-inf", "relay-every-nan",
        "transport-mb-nan", "transport-mb-inf"])
def test_a_benchmark_refuses_a_float_option_that_is_not_finite(script, args, option):
    """nan and inf passed the checks (nan < 0 is false) and failed late: after every fault
    was measured (bench_failover, at time.sleep), in a child process (bench_relay), or with
    a traceback (bench_transport: int() of them)."""
    res = run_script(script, *args, timeout=90)
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-2000:])
    assert f"error: {option} must be" in res.stderr and "usage:" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not res.stdout.strip(), (res.stdout[-1000:], res.stderr[-2000:])


def test_bench_gossip_netns_lab_deletes_the_bridge_namespace_when_the_bridge_fails(tmp_path, monkeypatch):
    """NetnsLab.__init__ made the bridge's namespace, then raised when the bridge could not
    be made: there was no lab to close, and the namespace stayed. A fake `ip` on PATH
    stands in for iproute2 (no namespace is made)."""
    import shlex

    calls = tmp_path / "calls.log"
    ip = tmp_path / "ip"
    ip.write_text("#!/bin/sh\n"
                  f'echo "ip $*" >> {shlex.quote(str(calls))}\n'
                  'case "$*" in *"link add br0"*) echo "RTNETLINK answers: Operation not supported" >&2; exit 2;; esac\n'
                  "exit 0\n")
    ip.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    bg = load_script("bench_gossip")
    with pytest.raises(subprocess.CalledProcessError):
        bg.NetnsLab()
    lines = calls.read_text().splitlines()
    added = [line.split()[-1] for line in lines if line.startswith("ip netns add ")]
    assert len(added) == 1 and "ip -n {} link add br0 type bridge".format(added[0]) in lines, lines
    assert f"ip netns del {added[0]}" in lines, lines


def test_bench_gossip_reports_its_rounds_per_s_against_the_numpy_anchor(monkeypatch):
    """Section 1 reported swarm's rounds/s and numpy's, but no ratio (each benchmark
    compares against its anchor in the same run). The sections are stubbed: they are
    hard-wired to d = 1e5 and 1e6, minutes here."""
    import asyncio

    bg = load_script("bench_gossip")

    async def rounds_per_s(d: int, rounds: int) -> tuple[float, float]:
        return (10.0, 20.0) if d == 100_000 else (1.0, 2.0)

    async def bytes_to_epsilon(d: int, quick: bool) -> dict:
        return {"sign_gamma": 1.0}

    async def to_epsilon(d, codec, gamma, max_rounds, **kw) -> dict:
        return {"codec": codec, "min_error": 1e-5, "error": 1e-5, "trace": [1e-5]}

    async def slow_link(*args) -> dict:
        return {}
    monkeypatch.setattr(bg, "rounds_per_s", rounds_per_s)
    monkeypatch.setattr(bg, "numpy_anchor", lambda d, rounds: (40.0, 50.0) if d == 100_000 else (4.0, 8.0))
    monkeypatch.setattr(bg, "bytes_to_epsilon", bytes_to_epsilon)
    monkeypatch.setattr(bg, "to_epsilon", to_epsilon)
    monkeypatch.setattr(bg, "slow_link", slow_link)
    out = json.loads(json.dumps(asyncio.run(bg.main(True, False, False, 100))))
    assert out["rounds_per_s_1e5"] == 10.0 and out["numpy_anchor_rounds_per_s_1e5"] == 40.0   # kept
    assert out["rounds_per_s_1e5_vs_numpy"] == 0.25 and out["rounds_per_cpu_s_1e5_vs_numpy"] == 0.4
    assert out["rounds_per_s_1e6_vs_numpy"] == 0.25 and out["numpy_anchor_rounds_per_s_1e6"] == 4.0


def test_bench_scale_coordinator_part_compares_view_p99_with_its_anchor(bench_scale_a_b):
    """Part (a) reported view_p99_ms and anchor_fanout_p99_ms but not their ratio."""
    out = bench_scale_a_b
    has(out, "view_p99_ms", "anchor_fanout_p99_ms", "view_p99_vs_anchor")
    # the ratio comes from the unrounded figures; the line's figures are rounded to 0.01 ms
    v, a = out["view_p99_ms"], out["anchor_fanout_p99_ms"]
    low, high = (v - 0.005) / (a + 0.005), (v + 0.005) / max(a - 0.005, 1e-9)
    assert low - 5e-4 <= out["view_p99_vs_anchor"] <= high + 5e-4, (v, a, out["view_p99_vs_anchor"])


# ---------------------------------------------------------------- Ctrl-C, internal modes, curve points

@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("script,args,busy", [
    ("bench_scale", ["--quick", "--skip", "b,c"], lambda pids: len(pids) >= 2),   # coordinator and workers
    # in its swarm run, whose launcher takes SIGINT over, ends its processes, then raises KeyboardInterrupt
    ("compare_runs", ["codec", "--only", "fp16", "--steps", "500", "--set", "peers=2", "--out", "out"],
     lambda pids: _peers(pids) == 2),
], ids=["bench_scale", "compare_runs"])
def test_a_script_ended_by_ctrl_c_ends_its_processes_and_says_so_in_one_line(script, args, busy, tmp_path):
    """A SIGINT (Ctrl-C) ended the processes a script started, then the script died by the
    signal with a KeyboardInterrupt traceback. It now exits 130 with one line."""
    _signal_ends_script(script, args, busy, tmp_path, signal.SIGINT, 130, f"{script}: interrupted")


@pytest.mark.parametrize("change,message", [
    ({"--count": "0"}, "--worker: --count 0 must be >= 1"),          # an IndexError
    ({"--hz": "0"}, "--worker: --hz 0.0 must be > 0"),               # a division by zero
    ({"--duration": "nan"}, "argument --duration: 'nan' is not a finite number"),   # it never ended
    ({"--out": None}, "--worker needs --out"),                      # a TypeError
], ids=["count-0", "hz-0", "duration-nan", "no-out"])
def test_bench_scale_worker_mode_refuses_values_out_of_range(change, message, tmp_path):
    """The internal --worker mode took any value the parent could have passed."""
    opts = {"--coord": "tcp://127.0.0.1:9", "--first": "0", "--count": "2", "--hz": "4", "--duration": "1",
            "--stop": str(tmp_path / "stop"), "--out": str(tmp_path / "worker.json")}
    opts.update(change)
    res = run_script("bench_scale", "--worker", *[x for k, v in opts.items() if v is not None for x in (k, v)],
                     timeout=60)
    assert res.returncode == 2 and message in res.stderr, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and not (tmp_path / "worker.json").exists(), res.stderr[-2000:]


def test_bench_scale_gossip_peer_mode_refuses_a_rank_outside_the_swarm(tmp_path):
    """--rank 2 of --n 2 started a peer that waited for a view of 2 that it could not be in."""
    res = run_script("bench_scale", "--gossip-peer", "--coord", "tcp://127.0.0.1:9", "--rank", "2", "--n", "2",
                     "--d", "10", "--go", str(tmp_path / "go"), "--window", "1", "--sync", "bounded",
                     "--ready-timeout", "1", "--out", str(tmp_path / "g.json"), timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "--gossip-peer: --rank 2 must be in [0, --n) = [0, 2)" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not (tmp_path / "g.json").exists(), res.stderr[-2000:]


def test_dqn_isolated_refuses_every_above_steps():
    """--every 2000 (the default) with --steps 1500 reported a curve without a point."""
    res = run_script("dqn_isolated", "--steps", "1500", timeout=60)
    assert res.returncode == 2, res.stdout[-2000:]
    assert "--every 2000 is above --steps 1500" in res.stderr, res.stderr


# ---------------------------------------------------------------- benchmarks report what they measured

def test_bench_dqn_refuses_a_batch_larger_than_its_buffer():
    """--batches 25000 against the 20,000-transition buffer: DQNAgent.learn() returned at
    once (too few items for a batch) and the row reported that no-op as learn_ms (0.001 ms
    against an update_ms of 16)."""
    res = run_script("bench_dqn", "--batches", "64", "25000", "--reps", "1", timeout=120)
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:])
    assert "--batches 25000 is above the buffer's 20000 transitions" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and not res.stdout.strip(), res.stdout[-1000:]


def test_bench_dqn_times_learn_only_when_it_updates():
    """run() timed learn() whatever it did: with a batch larger than the buffer each call
    took no update, and learn_ms was the cost of returning at once."""
    dqn = load_script("bench_dqn")
    with pytest.raises(RuntimeError, match="learn\\(\\) took no update"):
        dqn.run(25_000, 1)   # the buffer holds 20,000 transitions


def test_bench_relay_receives_for_as_long_as_the_sends_it_accepts_take(monkeypatch):
    """The argument check allowed up to 180 s of sends (a leg's deadline), but both receivers
    stopped counting after a fixed 120 s: --n 1300 --every-ms 100 (130 s of sends) gave
    partial counts and exit 1, and sends near 180 s no JSON line at all."""
    import threading
    from types import SimpleNamespace

    relay = load_script("bench_relay")
    for n, every in ((1300, 0.1), (2000, 0.002), (1, 0.0), (100_000, 0.0025)):
        receive_s, leg_s = relay.windows(n, every)
        assert receive_s > n * every and leg_s > receive_s, (n, every, receive_s, leg_s)
    # each leg's receiver gets that window: its processes are stand-ins that exit at once
    started = []

    def process(target, args, name, daemon=False):
        started.append((target.__name__, args))
        stand = _Stand(name, 0)
        stand.start = lambda: None   # it started as it was made
        return stand

    def results():
        q = queue.Queue()
        q.put({"n": 1300, "cpu_us_per_msg": 1.0})
        return q
    ctx = SimpleNamespace(Queue=results, Event=threading.Event, Process=process)
    monkeypatch.setattr(relay, "mp", SimpleNamespace(get_context=lambda method: ctx))
    for kind in ("raw", "swarm", "direct"):
        relay.run(kind, 1300, 10, 0.1)
    window = relay.windows(1300, 0.1)[0]
    receivers = [args for target, args in started
                 if target == "raw_receiver" or (target == "swarm_peer" and args[5] is not None)]   # args[5]: out
    assert len(receivers) == 3 and all(args[-1] == window for args in receivers), started


def _fake_swarm_run(tmp_path: Path, evals: dict[int, str], metrics: dict[int, str], summary: list[dict]):
    """A stand-in for run_experiment: a run folder with each peer's evals.csv and
    metrics.csv, and the summary rows its peers' summary.json would give."""
    from types import SimpleNamespace

    run_dir = tmp_path / "run"
    for r in range(len(summary)):
        (run_dir / f"peer{r}").mkdir(parents=True)
        (run_dir / f"peer{r}" / "evals.csv").write_text(evals.get(r, "wall_s,cpu_s,env_steps,eval_return\n"))
        (run_dir / f"peer{r}" / "metrics.csv").write_text(metrics[r])

    def run_experiment(spec, sets, runs_root=None, stream=None):
        return SimpleNamespace(run_dir=run_dir, summary=summary, exit_code=0)
    return run_experiment


def test_bench_learning_counts_the_compressed_runs_gossip_bytes_at_the_solve(tmp_path, monkeypatch):
    """bytes_saving compared the dense run's bytes over S steps per peer (the step at which
    peer 0 solved) with the compressed run's bytes at the end of its run, which includes
    the steps its peers took after S: the saving was understated."""
    bl = load_script("bench_learning")
    head = "wall_s,env_steps,episode,gossip_bytes_out\n"
    # 10 gossip bytes per env step on both peers; peer 0 solves at step 1000, the run ends at 2000
    metrics = {r: head + "".join(f"1.0,{s},{i},{10 * s}\n" for i, s in enumerate((400, 900, 1400, 1900), 1))
               for r in range(2)}
    evals = {0: "wall_s,cpu_s,env_steps,eval_return\n1.0,0.5,1000,500.0\n2.0,1.0,2000,500.0\n"}
    summary = [{"env_steps": 2000, "gossip_bytes_out": 20_000, "bytes_out": 30_000, "cpu_s": 2.0, "wall_s": 3.0}
               for _ in range(2)]
    monkeypatch.setattr(bl, "run_experiment", _fake_swarm_run(tmp_path, evals, metrics, summary))
    res = bl.swarm(0, [], 2000, 1000, 1, tmp_path / "runs")
    assert res["solved"] and res["steps_per_peer"] == 1000, res
    assert res["gossip_bytes_per_peer"] == 10_000, res   # at step 1000, between the episodes at 900 and 1400
    # the dense run (no stop when solved) counts at its end, as many steps as the compressed run's S
    dense = bl.swarm(0, bl.DENSE, 2000, 1000, 1, tmp_path / "runs", until_solved=False)
    assert dense["gossip_bytes_per_peer"] == 20_000, dense


def test_bench_learning_reads_evals_csv_past_a_row_cut_short(tmp_path):
    """A last row cut short (a peer killed mid-write) made _solved_steps raise a TypeError
    (float(None)), and _eval_at returned that row, its missing fields None."""
    bl = load_script("bench_learning")
    p = tmp_path / "evals.csv"
    p.write_text("wall_s,cpu_s,env_steps,eval_return\n1.0,0.9,1000,120.5\n2.0,1.8,2000")
    assert bl._solved_steps(p) == []
    assert bl._eval_at(p, 2000) is None
    assert bl._eval_at(p, 1000) == {"wall_s": "1.0", "cpu_s": "0.9", "env_steps": "1000", "eval_return": "120.5"}
    p.write_text("wall_s,cpu_s,env_steps,eval_return\n1.0,0.9,1000,480.0\n2.0,1.8,2000,12")
    assert bl._solved_steps(p) == [1000]


@pytest.mark.parametrize("per_s", [10, 40])
def test_bench_failover_counts_every_false_death_of_the_quiet_run(per_s, monkeypatch, capsys):
    """The quiet run counted deaths in the log of one status reply after the run, which holds
    the coordinator's last 50 log entries: a false death and its rejoin are two, so past
    about 25 false deaths the count stopped growing. The coordinator is a stand-in that
    declares ``per_s`` false deaths a second (each with its rejoin) from when it formed:
    at 40 a second more entries come between two reads than a reply holds."""
    fo = load_script("bench_failover")
    made: list = []

    class Coordinator:
        """What main() uses of a Swarm; its log grows with the time since it formed."""

        def __init__(self, logdir: Path) -> None:
            self.declared: list[float] = []
            made.append(self)

        def start_coordinator(self) -> None:
            self.t0 = time.time()
            self.log = [(self.t0, "join", "p0"), (self.t0, "join", "p1")]

        def add_peer(self) -> str:
            return "p"

        def close(self) -> None:
            pass

        def status(self) -> dict:
            while self.t0 + (len(self.declared) + 1) / per_s <= time.time():
                t = self.t0 + (len(self.declared) + 1) / per_s
                self.declared.append(t)
                self.log += [(t, "heartbeat timeout", "p1"), (t, "join", "p1")]
            return {"epoch": 1 + 2 * len(self.declared), "log": [list(x) for x in self.log[-50:]],
                    "members": [{"linked_at": self.t0}], "view": {"members": [["p0"], ["p1"]]}}

        def wait_settled(self, n: int, timeout: float = 60.0) -> dict:
            return self.status()

    monkeypatch.setattr(fo, "Swarm", Coordinator)
    monkeypatch.setattr(fo, "startup_anchor_s", lambda n: 1.0)
    monkeypatch.setattr(fo, "detect_anchor_ms", lambda kind: 1.0)
    monkeypatch.setattr(fo, "fault_relink_ms", lambda sw, n, kind, rng: 1.0)
    monkeypatch.setattr(sys, "argv", ["bench_failover.py", "--sizes", "2", "--faults", "1", "--startup-peers", "2",
                                      "--quiet-n", "2", "--quiet-s", "3"])
    fo.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    quiet = made[-1]   # each of its deaths came after it formed, up to the last status read
    assert len(quiet.declared) >= 30, len(quiet.declared)
    if per_s == 10:
        assert out["false_deaths"] == len(quiet.declared) and out["false_deaths_exact"] is True, out
    else:   # a floor, and said to be one
        assert 25 < out["false_deaths"] < len(quiet.declared) and out["false_deaths_exact"] is False, out


class _StopAtStart:
    """A stand-in for bench_scale's ``subprocess`` module: each Popen starts a sleeping
    process (what is asked for is not needed), and the ``fail_at``-th raises SystemExit
    143, as a SIGTERM that comes while the processes start does."""

    TimeoutExpired = subprocess.TimeoutExpired
    DEVNULL, STDOUT = subprocess.DEVNULL, subprocess.STDOUT

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.started: list[subprocess.Popen] = []

    def Popen(self, *args, **kwargs) -> subprocess.Popen:  # noqa: N802 - subprocess's name
        if len(self.started) + 1 == self.fail_at:
            raise SystemExit(128 + signal.SIGTERM)
        self.started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        return self.started[-1]


@pytest.mark.parametrize("part", ["raw_fanout_anchor", "bench_processes"])
def test_bench_scale_ends_the_processes_it_started_when_stopped_while_starting_them(part, tmp_path, monkeypatch):
    """The processes were started in one list comprehension, so a SIGTERM (SystemExit)
    while it ran left the list unassigned: the finally block ended none of those already
    started, and they lingered for minutes (bench_processes: peers waiting ~220 s for a go
    signal; raw_fanout_anchor: its workers, before the try altogether)."""
    bs = load_script("bench_scale")
    fake = _StopAtStart(fail_at=3)
    monkeypatch.setattr(bs, "subprocess", fake)
    try:
        with pytest.raises(SystemExit):
            if part == "raw_fanout_anchor":
                bs.raw_fanout_anchor(str(tmp_path), n_workers=4, per=1, size=10, rounds=1)
            else:
                bs.bench_processes(str(tmp_path), n=4, d=10, window=1.0)
        assert len(fake.started) == 2
        assert [p.poll() is not None for p in fake.started] == [True, True], "a started process was left running"
    finally:
        for p in fake.started:
            if p.poll() is None:
                p.kill()
                p.wait()
