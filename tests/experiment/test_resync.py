"""`swarm run` relaying gradients without averaging: a peer that falls out of step
(frozen past the others' turn timeout, or killed and started again from step 0 by
restart_dead) takes a neighbour's copy, and the copies are the same again: equal
parameter digests in summary.json. Real coordinator and peer processes on loopback;
each run is ended by its handle (SIGINT, once the peers went on after the repair)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from pathlib import Path

from swarmtest import freeze, wait_for
# the other `swarm run` tests' helper (tests/ is on the path; experiment/ is a namespace package)
from experiment.test_run import swarm_run

# Three peers taking turns (a turn every 3 steps by rank, two updates each: 100
# updates every ~50 env steps), no averaging, a short turn timeout; a budget that the
# test ends first.
RELAY = ["peers=3", "budget.env_steps=200000", "dqn.learning_starts=100", "dqn.batch_size=32", "eval.every=0",
         "buffer.capacity=2000", "gossip.exchange=gradients", "gossip.sync=async", "gossip.average=false",
         "dqn.train_every=3", "dqn.updates_per_train=2", "gossip.round_timeout_s=1"]


def run_dir(cwd: Path) -> Path | None:
    dirs = list((cwd / "runs").glob("cartpole-ring-*"))
    return dirs[0] if dirs and (dirs[0] / "pids.json").exists() else None


def steps(d: Path, rank: int) -> int:
    """The env steps of peer ``rank``'s last finished episode (0 before the first)."""
    try:
        with open(d / f"peer{rank}" / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("env_steps", "").isdigit()]
    except FileNotFoundError:
        return 0
    return int(rows[-1]["env_steps"]) if rows else 0


def pid_of(d: Path, rank: int) -> int:
    return json.loads((d / "pids.json").read_text())["children"][f"peer{rank}"]


def stop_and_read(p: subprocess.Popen, d: Path) -> tuple[str, list[dict]]:
    """End the run as Ctrl-C does (the peers write their summaries on the way out)."""
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"swarm run did not end within 40 s of SIGINT:\n{out}") from None
    assert p.returncode == 130, out
    return out, [json.loads((d / f"peer{r}" / "summary.json").read_text()) for r in range(3)]


def assert_same_copies(summaries: list[dict], out: str, after: int) -> None:
    """Equal digests at every update count the three hold (a peer's begin at the copy
    it took), but the last two (the peers stopped a step apart), with three or more of
    them past update ``after``."""
    digests = [s["relay"]["digests"] for s in summaries]
    common = sorted(int(u) for u in digests[0] if all(u in g for g in digests))[:-2]
    assert len([u for u in common if u > after]) >= 3, (after, [sorted(map(int, g)) for g in digests])
    for u in common:
        assert len({g[str(u)] for g in digests}) == 1, (u, [g[str(u)] for g in digests])
    assert "parameters differ" not in out, out
    # and the end of the run says who took a copy
    took = [s["id"] for s in summaries if s["relay"]["resynced"]]
    assert took and all(f"swarm run: {i} fell out of step with the relay's turns and took another peer's copy"
                        in out for i in took), out


def test_a_frozen_peer_takes_a_copy_and_the_copies_agree_again(tmp_path):
    """peer1 is stopped (SIGSTOP) past the others' 1 s turn timeout: they go on without it
    and drop its gradients that come after their turns; it takes a copy from one of them,
    its turns start again a round after that copy's clock, and the three copies are the
    same from then on. Without the repair they differed for good."""
    p = swarm_run(tmp_path, RELAY)
    stopped = None
    try:
        d = wait_for(lambda: (d := run_dir(tmp_path)) and all(steps(d, r) >= 250 for r in range(3)) and d,
                     timeout=60, what="three peers past env step 250")
        stopped = pid_of(d, 1)
        freeze(stopped)
        # The others' turns time out on it, and they go on without it: 200 steps take them
        # through dozens of its turns, and they pass the first only when their wait times out.
        was = {r: steps(d, r) for r in (0, 2)}
        wait_for(lambda: all(steps(d, r) >= was[r] + 200 for r in (0, 2)), timeout=60,
                 what="peer0 and peer2 200 steps on without peer1")
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        log = d / "logs" / "peer1.log"
        wait_for(lambda: "s copy (update" in log.read_text(), timeout=60, what="peer1 taking a copy")
        at = steps(d, 1)
        wait_for(lambda: steps(d, 1) >= at + 400, timeout=60, what="peer1 400 steps further")
        out, summaries = stop_and_read(p, d)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
    # the digests of peer1's copy start at the one it took
    assert_same_copies(summaries, out, after=min(int(u) for u in summaries[1]["relay"]["digests"]))
    (first, *_) = summaries[1]["relay"]["resynced"]
    assert first["next"] is not None and "came after" in first["why"], first
    assert "peer1: out of step (its message at clock" in (d / "logs" / "peer1.log").read_text()
    assert sum(s["relay"]["late"] for s in summaries) > 0
    served = sum(s["relay"]["served"] for s in summaries)
    assert served == sum(s["relay"]["resyncs"] for s in summaries) >= 1


def test_a_restarted_peer_takes_a_copy_and_the_copies_agree_again(tmp_path):
    """peer1 is killed (SIGKILL) and restart_dead starts it again from step 0 (no
    checkpoint): its first turn comes long after the others' turns went past its
    clock, it takes a copy, and the copies are the same again. Before, it trained on
    out of step for the rest of the run, waiting for nobody."""
    p = swarm_run(tmp_path, RELAY + ["restart_dead=true", "checkpoint.full_every_s=0"])
    try:
        d = wait_for(lambda: (d := run_dir(tmp_path)) and all(steps(d, r) >= 250 for r in range(3)) and d,
                     timeout=60, what="three peers past env step 250")
        dead = pid_of(d, 1)
        os.kill(dead, signal.SIGKILL)
        # the new process rewrites its metrics without the dead one's rows: it starts from 0
        wait_for(lambda: pid_of(d, 1) != dead and steps(d, 1) < 300, timeout=60, what="peer1 restarted")
        wait_for(lambda: steps(d, 1) >= 500, timeout=60, what="peer1 500 steps on")
        out, summaries = stop_and_read(p, d)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "peer1 (pid" in out and "restarting it" in out, out
    assert_same_copies(summaries, out, after=min(int(u) for u in summaries[1]["relay"]["digests"]))
    (first, *_) = summaries[1]["relay"]["resynced"]
    assert first["next"] is not None and "came after" in first["why"], first
