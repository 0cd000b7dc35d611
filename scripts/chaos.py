"""Chaos run: a `swarm run` of 6 peers while a schedule kills, freezes and restarts peers and the coordinator.

    python scripts/chaos.py --duration 180          # then a fault-free run of the same spec and seed

The run uses ``restart_dead = true`` (the launcher restarts a crashed peer with
``--replace``: it resumes from its checkpoint and bootstraps from its
neighbours; a dead coordinator is started again on the same address), buffer
replication to one neighbour (``buffer.replicas = 1``) and frequent
checkpoints. Faults, one every ``--every`` seconds, from ``--warmup`` seconds
into the run until 25 s before its end, so that the last fault's survival check
(15 s) and the restart it causes finish within the run; a ``--duration`` that
leaves no time between the two (at most ``--warmup`` + 25 s) is refused:

``kill``         SIGKILL a random peer (the launcher restarts it)
``freeze``       SIGSTOP a random peer for ``--freeze`` seconds, then SIGCONT
``coordinator``  SIGKILL the coordinator (the launcher starts a fresh one)

Report:

faults          faults injected, by kind
survived        faults after which the other peers' env steps kept increasing (within 15 s, or
                by the run's end where that came sooner)
not_judged      faults taken before any other peer had reported env steps: nothing to compare
                with, so they count neither as survived nor as failed
steps_lost      env steps a killed peer had done minus the steps its checkpoint kept (sum)
samples_lost    acknowledged replay items (acked.bin) held by no peer at the end (target 0);
                the buffers are sized so that nothing is evicted
return_ratio_vs_clean  mean final return (last 10 episodes, over peers) / the fault-free run's
                (both runs have the same wall-clock budget: compare steps_total_summary with
                steps_total_clean, since a restart costs its setup time and CartPole's return
                grows with the steps trained)
nan_params      peers whose final parameters hold NaN or Inf (target 0)
rss_growth      largest relative RSS growth of any process, coordinator and peers, each by its pid,
                from its minute 1 to its end (target <= 0.05): (last - first) / first, where first
                is its reading once it has run min(60 s, duration / 3) and last its last reading
                while it ran. A restarted peer or coordinator is a new process: its minute 1 counts
                from its own start, and one that ran too short for that reading has no figure
                (listed as too short). ``rss_by_process`` holds every process's figures and
                ``RUN/rss.csv`` every reading (about two a second).

The last line is one JSON object. Without ``--root`` the runs go to a temporary
folder, removed at the end when nothing failed; it is kept, and named on the last
lines, when a fault was not survived, a sample was lost, a peer's parameters hold
NaN, or the script ended early (an error, Ctrl-C, SIGTERM): its logs are what tells why.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import numpy as np

from swarm.checks import finite_arg
from swarm.errors import ConfigError
from swarm.experiment import load_spec
from swarm.scripting import run_script

REPO = Path(__file__).resolve().parents[1]
#: seconds at the end of the run without faults: the last one's survival check (15 s) and restart fit in
QUIET_S = 25.0


def spec_overrides(peers: int, seed: int, seconds: float) -> list[str]:
    return [f"peers={peers}", f"seed={seed}", "name=chaos", "restart_dead=true",
            "buffer.replicas=1", "buffer.share=0", "buffer.capacity=200000",
            "budget.env_steps=100000000", f"budget.max_seconds={seconds}", "eval.every=0",
            "checkpoint.full_every_s=30", "checkpoint.incremental_every_steps=500"]


def status(addr: str) -> dict | None:
    from swarm.cli import query_status
    from swarm.errors import SwarmError

    try:
        return asyncio.run(query_status(addr, timeout=1.0))
    except SwarmError:
        return None


def steps_by_peer(st: dict | None) -> dict[str, int]:
    out = {}
    for m in (st or {}).get("members", []):
        s = m.get("stats") or {}
        if "env_steps" in s:
            out[m["id"]] = int(s["env_steps"])
    return out


def start_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds of the monotonic clock (its /proc start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.monotonic() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class RssLog:
    """RSS of every child process, by pid, through the run (also written to ``run/rss.csv``).

    A process's growth is ``(last - first) / first`` where *first* is its reading
    once it has run ``window`` seconds (minute 1, or a third of a short run) and
    *last* its last reading while it still ran. The processes started with the
    run take their first reading ``window`` s after the run started. A restarted
    peer or coordinator is a new process (a new pid): its own clock starts at its
    start, so its first reading comes ``window`` s after that, and it counts once
    it has run past that point; one that ended before has no growth figure and is
    listed as too short.
    """

    def __init__(self, run: Path, t0: float, window: float) -> None:
        self.t0, self.window = t0, window
        self.names: dict[int, str] = {}
        self.born: dict[int, float] = {}
        self.first: dict[int, tuple[float, int]] = {}   # pid -> (when, kB) at its minute 1
        self.last: dict[int, tuple[float, int]] = {}
        self.peak: dict[int, int] = {}
        self._csv = open(run / "rss.csv", "w")
        self._csv.write("t_s,name,pid,rss_kb\n")

    def sample(self, kids: dict[str, int]) -> None:
        now = time.monotonic()
        for name, pid in kids.items():
            r = rss_kb(pid)
            if not r:
                continue
            if pid not in self.born:
                self.names[pid] = name
                self.born[pid] = max(self.t0, start_time(pid) or now)
            if pid not in self.first and now - self.born[pid] >= self.window:
                self.first[pid] = (now, r)
            self.last[pid] = (now, r)
            self.peak[pid] = max(self.peak.get(pid, 0), r)
            self._csv.write(f"{now - self.t0:.1f},{name},{pid},{r}\n")
        self._csv.flush()

    def growth(self) -> dict[str, dict]:
        """Per process (``name:pid``): first and last kB, growth, seconds between them."""
        out = {}
        for pid, name in self.names.items():
            key = f"{name}:{pid}"
            if pid not in self.first or self.last[pid][0] <= self.first[pid][0]:
                out[key] = {"too_short": True, "lived_s": round(self.last[pid][0] - self.born[pid], 1)}
                continue
            (t1, r1), (t2, r2) = self.first[pid], self.last[pid]
            out[key] = {"first_kb": r1, "last_kb": r2, "peak_kb": self.peak[pid],
                        "growth": round((r2 - r1) / r1, 4), "from_s": round(t1 - self.t0, 1),
                        "to_s": round(t2 - self.t0, 1)}
        return out


def new_log(root: Path) -> IO[str]:
    """A fresh ``swarm-run-N.log`` in ``root``: a reused --root keeps the logs of earlier runs."""
    for n in itertools.count():
        try:
            return open(root / f"swarm-run-{n}.log", "x")
        except FileExistsError:
            continue


def pids(run: Path) -> dict:
    """The run folder's pids.json ({} until the launcher has written it)."""
    try:
        return json.loads((run / "pids.json").read_text())
    except (OSError, ValueError):
        return {}


def start_run(root: Path, overrides: list[str]) -> tuple[subprocess.Popen, Path]:
    """Start a `swarm run` in ``root``: its handle and the run folder it made, the one whose
    pids.json names it (another invocation sharing ``root`` may make one there meanwhile)."""
    args = [sys.executable, "-m", "swarm.cli", "run"]
    for o in overrides:
        args += ["--set", o]
    before = set(root.glob("runs/chaos-*"))
    with new_log(root) as log:
        p = subprocess.Popen(args, cwd=root, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            own = [d for d in root.glob("runs/chaos-*") if d not in before and pids(d).get("launcher") == p.pid]
            if own:
                return p, own[0]
            if p.poll() is not None:
                raise SystemExit(f"swarm run exited with {p.returncode}; see {log.name}")
            time.sleep(0.2)
        raise SystemExit(f"swarm run made no run folder within 60 s; see {log.name}")
    except BaseException:
        end_run(p)
        raise


def end_run(p: subprocess.Popen) -> None:
    """Stop a `swarm run` by its handle: SIGINT (it stops its peers and coordinator), then kill."""
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGINT)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def children(run: Path) -> dict[str, int]:
    return pids(run).get("children", {})


def coordinator_addr(run: Path) -> str:
    log = (run / "logs" / "coordinator.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for word in log.read_text(errors="replace").split() if log.exists() else []:
            if word.startswith("tcp://127.0.0.1:"):
                return word.rstrip(",")
        time.sleep(0.2)
    raise SystemExit("cannot find the coordinator's address in its log")


def total_steps(run: Path) -> int | None:
    """Env steps of all peers at the end, from the run's summary.json."""
    try:
        rows = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return sum(int(r.get("env_steps") or 0) for r in rows)


def final_returns(run: Path) -> list[float]:
    try:
        rows = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    return [r["final_mean_return"] for r in rows
            if r.get("final_mean_return") is not None and math.isfinite(r["final_mean_return"])]


def judge(others: dict[str, int], steps: dict[str, int]) -> bool | None:
    """Whether a fault was survived: the env steps of some peer other than its victim grew
    from ``others`` (theirs when the fault came) to ``steps`` (theirs 15 s later).

    None when no other peer had reported steps at the fault: nothing to compare with, so
    the fault is not judged (early in a run, before the peers' first status).

        >>> judge({"peer1": 10}, {"peer1": 12}), judge({"peer1": 10}, {"peer1": 10}), judge({}, {"peer1": 5})
        (True, False, None)
    """
    if not others:
        return None
    return any(steps.get(k, 0) > v for k, v in others.items())


def tally(checks: list, steps: dict[str, int]) -> tuple[int, int]:
    """(survived, not judged) of the faults in ``checks`` ((when, victim, others' steps at
    the fault) each), judged on ``steps``.

        >>> tally([(0.0, "peer0", {"peer1": 10}), (1.0, "peer1", {"peer0": 7}), (2.0, "peer0", {})],
        ...       {"peer0": 7, "peer1": 12})
        (1, 1)
    """
    verdicts = [judge(others, steps) for _, _, others in checks]
    return sum(v is True for v in verdicts), sum(v is None for v in verdicts)


def chaos(args: argparse.Namespace, root: Path) -> dict:
    rng = random.Random(args.seed)
    p, run = start_run(root, spec_overrides(args.peers, args.seed, args.duration))
    frozen = None   # the pid of a peer this script has stopped and not yet continued
    try:
        addr = coordinator_addr(run)
        print(f"chaos: run {run}, coordinator {addr}", flush=True)
        t0 = time.monotonic()
        faults: dict[str, int] = {"kill": 0, "freeze": 0, "coordinator": 0}
        checks: list[tuple[float, str, dict[str, int]]] = []   # (when, victim, others' steps at the fault)
        kills: list[tuple[str, int, float]] = []                # (peer, steps done at the kill, when)
        rss = RssLog(run, t0, window=min(60.0, args.duration / 3))
        next_fault = t0 + args.warmup
        end_faults = t0 + args.duration - QUIET_S
        last_steps: dict[str, int] = {}
        pending_checks: list = []
        survived = not_judged = 0
        while p.poll() is None:
            now = time.monotonic()
            st = status(addr)
            last_steps.update(steps_by_peer(st))
            rss.sample(children(run))
            due = [k for k in pending_checks if now - k[0] >= 15.0]
            pending_checks = [k for k in pending_checks if k not in due]
            ok, unjudged = tally(due, last_steps)
            survived, not_judged = survived + ok, not_judged + unjudged
            if now >= next_fault and now < end_faults:
                kind = rng.choice(["kill", "kill", "freeze", "coordinator"])
                kids = children(run)
                peers = sorted(k for k in kids if k.startswith("peer"))
                victim = "coordinator" if kind == "coordinator" else rng.choice(peers)
                pid = kids[victim]
                others = {k: v for k, v in last_steps.items() if k != victim}
                try:
                    if kind == "freeze":
                        os.kill(pid, signal.SIGSTOP)
                        frozen = pid
                        time.sleep(args.freeze)
                        os.kill(pid, signal.SIGCONT)
                        frozen = None
                    else:
                        if kind == "kill":
                            kills.append((victim, last_steps.get(victim, 0), time.time()))
                        os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    frozen = None
                    continue
                faults[kind] += 1
                checks.append((time.monotonic(), victim, others))
                pending_checks.append(checks[-1])
                print(f"chaos: {time.monotonic() - t0:5.0f} s  {kind:<11} {victim} (pid {pid})", flush=True)
                next_fault = time.monotonic() + args.every
            time.sleep(0.5)
            if now - t0 > args.duration + 120:
                break
        # The run ended within 15 s of a fault (it stopped early: its budget spent, or a
        # crash): judged on the steps last seen, the peers' figures up to the end. Left out,
        # such a fault counted as not survived.
        ok, unjudged = tally(pending_checks, last_steps)
        survived, not_judged = survived + ok, not_judged + unjudged
    finally:
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGCONT)
            except ProcessLookupError:
                pass
        end_run(p)
    return {"run": run, "faults": faults, "checks": checks, "kills": kills, "rss": rss,
            "last_steps": last_steps, "addr": addr, "survived": survived, "not_judged": not_judged}


def steps_lost(run: Path, kills: list) -> int:
    lost = 0
    for victim, done, when in kills:
        # the restarted process wrote resumed.json (the newest one covers the newest kill only)
        kept = None
        rj = run / victim / "resumed.json"
        if rj.exists() and rj.stat().st_mtime >= when:
            kept = json.loads(rj.read_text())["env_steps"]
        lost += max(0, done - (kept or 0)) if kept is not None else done
    return lost


def samples_lost(run: Path) -> tuple[int, int]:
    acked: set[tuple[str, int]] = set()
    held: set[tuple[str, int]] = set()
    for d in run.glob("peer*"):
        f = d / "acked.bin"
        if f.exists():
            acked.update((d.name, int(s)) for s in np.fromfile(f, dtype=np.int64))
        g = d / "ids.json"
        if g.exists():
            for origin, seqs in json.loads(g.read_text()).items():
                held.update((origin, int(s)) for s in seqs)
    return len(acked - held), len(acked)


def nan_params(run: Path) -> int:
    import torch

    bad = 0
    for d in run.glob("peer*"):
        f = d / "checkpoint.pt"
        if f.exists():
            x = torch.load(f, weights_only=True)["params"]   # runs no code, as swarm's own reads
            bad += int(not torch.isfinite(x).all())
    return bad


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a bad value exits with a usage error before any run starts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=finite_arg, default=180.0,
                    help=f"seconds of each run (default 180); no fault in its last {QUIET_S:.0f} s")
    ap.add_argument("--peers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=finite_arg, default=15.0, help="seconds between faults")
    ap.add_argument("--warmup", type=finite_arg, default=25.0,
                    help=f"seconds before the first fault (default 25); faults stop {QUIET_S:.0f} s before "
                         "the end, so --duration must exceed --warmup + that")
    ap.add_argument("--freeze", type=finite_arg, default=3.0, help="seconds a frozen peer stays stopped")
    ap.add_argument("--no-clean", action="store_true", help="skip the fault-free run")
    ap.add_argument("--root", help="folder for the runs and their logs, created if missing and kept (default: a "
                                   "temporary folder, removed at the end unless something failed: then it is "
                                   "kept and named)")
    args = ap.parse_args(argv)
    if args.duration <= 0:
        ap.error("--duration must be > 0 (each run's budget.max_seconds; 0 there would mean no limit)")
    for name in ("every", "warmup", "freeze"):
        if getattr(args, name) < 0:
            ap.error(f"--{name} must be >= 0")
    if args.duration - QUIET_S <= args.warmup:
        ap.error(f"--duration {args.duration:g} leaves no time for faults: they come after --warmup "
                 f"{args.warmup:g} s and stop {QUIET_S:.0f} s before the end; give --duration > "
                 f"{args.warmup + QUIET_S:g} or a shorter --warmup")
    try:
        load_spec(None, spec_overrides(args.peers, args.seed, args.duration))
    except ConfigError as e:
        ap.error(str(e))
    if args.root and Path(args.root).exists() and not Path(args.root).is_dir():
        ap.error(f"--root {args.root} is a file, not a folder")
    if args.root:   # the last check: a refused command line leaves no folder behind
        try:
            Path(args.root).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--root {args.root}: cannot create it ({e.strerror or e})")
    return args


def main() -> None:
    args = parse_args()
    if args.root:
        run_and_report(args, Path(args.root))
        return
    root = Path(tempfile.mkdtemp(prefix="swarm-chaos-"))
    try:
        failed = run_and_report(args, root)
    except BaseException:
        print(f"chaos: kept the run folder {root}: the script ended early; its logs are there", file=sys.stderr)
        raise
    if not failed:
        shutil.rmtree(root, ignore_errors=True)


def run_and_report(args: argparse.Namespace, root: Path) -> bool:
    """Run the chaos run (and the clean one) in ``root`` and print the report; whether
    something failed (a judged fault not survived, a lost sample, NaN parameters)."""
    c = chaos(args, root)
    run = c["run"]
    lost, acked = samples_lost(run)
    by_process = c["rss"].growth()
    growth = [g["growth"] for g in by_process.values() if "growth" in g]
    ret = final_returns(run)
    restarts = json.loads((run / "restarts.json").read_text()) if (run / "restarts.json").exists() else {}
    clean_ret: list[float] = []
    clean_steps = None
    if not args.no_clean:
        cp, clean_run = start_run(root, spec_overrides(args.peers, args.seed, args.duration))
        try:
            cp.wait(args.duration + 180)
        except subprocess.TimeoutExpired:
            pass
        finally:
            end_run(cp)
        clean_ret = final_returns(clean_run)
        clean_steps = total_steps(clean_run)
    # None, not NaN, where there is no figure: the last line is strict JSON
    mean = float(np.mean(ret)) if ret else None
    clean = float(np.mean(clean_ret)) if clean_ret else None
    faults = sum(c["faults"].values())
    bad = nan_params(run)
    failed = c["survived"] < faults - c["not_judged"] or lost > 0 or bad > 0
    kept = bool(args.root) or failed
    report = {
        "faults": faults, "faults_by_kind": c["faults"],
        "survived": c["survived"], "not_judged": c["not_judged"], "restarts": restarts,
        "steps_lost": steps_lost(run, c["kills"]),
        "steps_total": sum(c["last_steps"].values()), "steps_total_summary": total_steps(run),
        "steps_total_clean": clean_steps,
        "samples_lost": lost, "samples_acked": acked,
        "return": mean, "return_clean": clean,
        "return_ratio_vs_clean": mean / clean if mean is not None and clean else None,
        "nan_params": bad,
        "rss_growth": max(growth) if growth else None, "rss_by_process": by_process,
        "duration_s": args.duration, "peers": args.peers, "run": str(run), "run_kept": kept,
    }
    print(f"{'process':<22}{'minute 1 MB':>12}{'end MB':>9}{'peak MB':>9}{'growth':>8}")
    for k, g in by_process.items():
        if "growth" in g:
            print(f"{k:<22}{g['first_kb'] / 1024:12.1f}{g['last_kb'] / 1024:9.1f}{g['peak_kb'] / 1024:9.1f}"
                  f"{g['growth']:8.1%}")
        else:
            print(f"{k:<22}  (ran {g['lived_s']} s: too short for a minute-1 reading)")
    unjudged = (f", not judged {c['not_judged']} (no other peer had reported steps yet)"
                if c["not_judged"] else "")
    print(f"faults {faults} {c['faults']}, survived {c['survived']}{unjudged}, restarts {restarts}")
    returns = "return " + ("-" if mean is None else f"{mean:.1f}")
    if not args.no_clean:
        returns += " vs clean " + ("-" if clean is None else f"{clean:.1f}")
    print(f"steps lost {report['steps_lost']} of {report['steps_total']}; acknowledged samples lost "
          f"{lost} of {acked}; {returns}; NaN params {report['nan_params']}; "
          f"RSS growth {report['rss_growth']}")
    if args.root:
        print(f"runs and logs: {root}")
    elif failed:
        print(f"runs and logs: {root} (a temporary folder, kept: something failed)")
    else:
        print(f"runs and logs: {root} (a temporary folder, removed at the end: nothing failed; --root keeps them)")
    print(json.dumps(report))
    return failed


if __name__ == "__main__":
    run_script(main, "chaos")
