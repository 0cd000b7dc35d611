"""swarm vs hivemind: 4 processes average 4 different 10M float32 vectors.

    python scripts/bench_vs_hivemind.py [--d 10000000] [--repeats 2] [--skip-hivemind]

Each of N = 4 processes holds the vector of its rank (``vector(rank, d)``: seeded
uniform numbers plus the rank) and must come within relative error 1e-3 of the
mean of all four, ``max_i ‖x_i − x̄‖ / ‖x̄‖ ≤ 1e-3``. Every process regenerates all
four vectors from their seeds, so it knows x̄ and checks its own error.

swarm: a real :class:`swarm.coordinator.Coordinator` process and 4 real
:class:`swarm.peer.Peer` processes on 127.0.0.1, running :class:`swarm.gossip.Gossip`
in lockstep. Configurations: ``full`` (identity codec, γ = 1: exact averaging in
one round, 3 × 40 MB out per peer), ``one_peer_exponential`` (exact in log2 4 = 2
rounds, one neighbour per round: 2 × 40 MB out per peer), ``ring`` (ρ = 1/3,
several rounds), each with ``identity`` and ``fp16``. (The static ``exponential``
graph is the complete graph at n = 4, so it is ``full``.) Wall time runs from
"all peers joined, linked and past a start barrier" to the end of the round that
brought every peer within 1e-3. A probe run per configuration first finds how many
rounds that takes (after each round every peer posts its error to shared memory,
behind a barrier, and all stop in the same round); the timed runs then do exactly
that many rounds back to back and measure the error after the clock stops, as
hivemind's single step is timed, and count only if every peer is within the
tolerance. Bytes: the engine's ``RoundResult.bytes_out`` (wire bytes of every
message, headers included), summed over peers: measured, not modelled. Payload:
the array frames of every message the peers sent, summed as sent (a codec's
encoded frames: d × 2 B for fp16, about d B for int8, k values and indices for
top-k), which is what hivemind's figure below counts; the bytes comparisons use
it (the difference is about 300 B of header per message). The peers and the coordinator run with failure detection
as patient as hivemind's ``request_timeout`` (10 s), see ``_coordinator_proc`` and
``_swarm_peer_proc`` for why.

hivemind: the script makes ``build/hivemind-venv`` (``torch==2.13.0`` first,
then ``hivemind`` with ``numpy<2.4``; the wheel ships its ``p2pd`` daemon) and
runs 4 processes of this same file in it (``--hm-worker``): a DHT on rank 0,
the others bootstrap from it, all on 127.0.0.1; each runs one
``DecentralizedAverager.step()`` (a group of 4, butterfly all-reduce) on the same
vectors, without compression and with ``Float16Compression``. Wall time runs
from the same kind of start barrier to the last peer's step returning. hivemind's
bytes are not measured (its traffic goes through the p2pd daemon); the table
gives the butterfly all-reduce's payload, 2 · (n−1)/n · 4d bytes per peer, as a
model figure.

CPU s: user + system CPU time of every peer's process tree between its own
start and end of the clock, summed over the 4 peers (hivemind's tree includes
its averager and DHT processes and their p2pd daemons). On a shared machine
this varies less than wall time; the table prints the load average with it.

Anchor: a bare pyzmq full exchange of the same vectors (``run_raw_zmq``: PUSH to
every other process without a copy, PULL the others, average; no framework), in
the same run.

Both sides run in the same invocation, interleaved (swarm, hivemind, swarm,
hivemind ...), since the machine's cores are shared and absolute times drift;
each configuration's best (minimum) wall over the repeats is reported.
If hivemind cannot be installed or run, the script says exactly what failed and
still reports swarm. Last line: one JSON object (``vs_hivemind_ratio`` = swarm's
best wall / hivemind's best wall; target ≤ 0.35).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HM_VENV = ROOT / "build" / "hivemind-venv"
N = 4
TOL = 1e-3
SWARM_CONFIGS = [  # (gossip topology, codec)
    ("full", "identity"), ("full", "fp16"),
    ("one_peer_exponential", "identity"), ("one_peer_exponential", "fp16"),
    ("ring", "identity"), ("ring", "fp16"),
]
HM_CONFIGS = ["none", "fp16"]


# --------------------------------------------------------------------- shared

def vector(rank: int, d: int) -> np.ndarray:
    """Peer ``rank``'s starting vector: uniform in [rank, rank + 1), seeded."""
    x = np.random.default_rng(1000 + rank).random(d, dtype=np.float32)
    x += np.float32(rank)
    return x


def true_mean(n: int, d: int) -> np.ndarray:
    acc = np.zeros(d, np.float64)
    for r in range(n):
        acc += vector(r, d)
    acc /= n
    return acc.astype(np.float32)


class ErrorMeter:
    """Relative error ‖x − x̄‖ / ‖x̄‖ against the known mean, without temporaries."""

    def __init__(self, mean: np.ndarray):
        self.mean = mean
        self.norm = float(np.sqrt(np.dot(mean.astype(np.float64), mean.astype(np.float64))))
        self.buf = np.empty_like(mean)

    def __call__(self, x: np.ndarray) -> float:
        np.subtract(x, self.mean, out=self.buf)
        return float(np.sqrt(np.dot(self.buf, self.buf))) / self.norm


def tree_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (default: this
    one) and every live descendant, read from /proc: hivemind's averager, DHT and
    p2pd daemons are child processes, and their work counts as much as ours.
    Children that already exited are not counted (none do inside the clock)."""
    tick = os.sysconf("SC_CLK_TCK")
    seen, todo, total = set(), [pid or os.getpid()], 0.0
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            f = stat[stat.rindex(")") + 2:].split()
            total += (int(f[11]) + int(f[12])) / tick   # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # exited meanwhile
    return total


def wait_files(paths: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier: {[str(p) for p in paths if not p.exists()]} missing after {timeout} s")
        time.sleep(0.0005)


# ---------------------------------------------------------------------- swarm

def _coordinator_proc(q, stop) -> None:
    import asyncio

    from swarm.coordinator import Coordinator

    async def main() -> None:
        # Failure detection as patient as hivemind's request_timeout (10 s): with the
        # defaults (0.3 s ZMTP timeout, 1 s probes) peers that the shared, overloaded
        # cores leave off-CPU during a 40 MB round were declared dead mid-run and the
        # view churn lost round messages; this bench measures averaging, not that.
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="", heartbeat_timeout_s=10.0,
                               probe_timeout_s=10.0, zmtp_heartbeat_s=1.0, zmtp_timeout_s=10.0) as coord:
            q.put(coord.address)
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(main())


def _swarm_peer_proc(coord: str, rank: int, n: int, d: int, topology: str, codec: str,
                     max_rounds: int, fixed: bool, ready, done, conv, fin, epoch, q) -> None:
    import asyncio

    from swarm.gossip import Gossip
    from swarm.peer import Peer

    meter = ErrorMeter(true_mean(n, d))
    x = vector(rank, d)
    err0 = meter(x)

    async def wait_all(arr, value: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while min(arr[:]) < value:
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer {rank}: barrier not reached: {arr[:]} < {value}")
            await asyncio.sleep(0.0002)

    async def main() -> dict:
        # one_peer_exponential's rounds reach i ± 2^k: link everyone (n = 4)
        link_topo = "full" if topology == "one_peer_exponential" else topology
        # ZMTP heartbeats travel behind the data on a link, so a PONG waits until the
        # receiver has read the whole 40 MB message in front of it; with the default
        # 0.3 s timeout a receiver that the busy cores leave off-CPU that long has its
        # links dropped mid-message and the message is lost (measured: a 200 MB send to
        # a receiver stopped for 1 s never arrives at 0.3 s, always does at 5 s). A
        # 10 s timeout matches hivemind's request_timeout below.
        async with Peer(coordinators=[coord], id=f"p{rank}", rank=rank, topology=link_topo,
                        link_heartbeat_s=1.0, link_timeout_s=10.0) as peer:
            await peer.wait_view(lambda v: len(v.members) == n, timeout=60.0)
            await peer.wait_linked(60.0)
            # every peer on the same n-member view (the coordinator may still be
            # publishing joins when the first peers see n members)
            deadline = time.monotonic() + 60
            while True:
                epoch[rank] = peer.view.epoch
                e = epoch[:]
                if min(e) == max(e) == peer.view.epoch and len(peer.view.members) == n:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"peer {rank}: views did not agree: epochs {e}")
                await asyncio.sleep(0.01)
            await peer.wait_linked(60.0)
            # the payload: the array frames of every message that went out, as encoded
            sent_frames = 0
            send = peer.send

            async def counting_send(dst, t, body=None, arrays=(), **kw) -> bool:
                nonlocal sent_frames
                ok = await send(dst, t, body, arrays, **kw)
                if ok:
                    sent_frames += sum(int(np.asarray(a).nbytes) for a in arrays)
                return ok
            peer.send = counting_send
            g = Gossip(peer, x, topology=topology, codec=codec, gamma=1.0, round_timeout=60.0,
                       send_timeout=30.0)
            # warm the codec outside the clock (fp16 imports torch on first use, ~seconds),
            # as hivemind's side is timed after its own set-up
            from swarm.compress import get_codec
            get_codec(codec).encode(x[:1024].copy())
            torch = sys.modules.get("torch")   # only the codecs that cast to fp16 import it (~3 s a process)
            if torch is not None:
                # one thread per peer process, as `swarm peer` does: 4 peers on 2 cores with torch's
                # default pool measured 3x slower fp16 casts (1.23 s against 0.39 s at d = 2M)
                torch.set_num_threads(1)
            ready[rank] = 1
            await wait_all(ready, 1)
            t0, cpu0 = time.monotonic(), tree_cpu()
            t_conv, cpu_conv, bytes_out, bytes_in, rounds, err, fails, sent = None, None, 0, 0, 0, err0, 0, 0
            history = []
            for t in range(max_rounds):
                res = await g.round()
                t_round, cpu_round = time.monotonic(), tree_cpu()
                history.append(res)
                if not res.ok or res.missing or res.dropped:
                    print(f"swarm peer {rank} round {t}: ok={res.ok} reason={res.reason!r} missing={res.missing} "
                          f"dropped={res.dropped} waited={res.waited_s:.1f}s epoch={peer.view.epoch} "
                          f"members={peer.view.ids}", file=sys.stderr, flush=True)
                rounds += 1
                fails += not res.ok
                bytes_out += res.bytes_out
                sent += res.sent
                bytes_in += res.bytes_in
                if fixed and t < max_rounds - 1:
                    continue   # timed run: rounds back to back, the error is measured after the last
                err = meter(x)
                if err <= TOL and t_conv is None:
                    t_conv, cpu_conv = t_round, cpu_round
                conv[t * n + rank] = int(err <= TOL)
                done[rank] = t + 1
                await wait_all(done, t + 1)
                if all(conv[t * n + j] for j in range(n)):
                    break
            t_end = time.monotonic()
            # stay until every peer is through, so nobody's last round loses a neighbour
            fin[rank] = 1
            await wait_all(fin, 1)
            return dict(rank=rank, t0=t0, t_conv=t_conv, t_end=t_end,
                        cpu_s=None if cpu_conv is None else cpu_conv - cpu0, rounds=rounds, err=err, err0=err0,
                        bytes_out=bytes_out, bytes_in=bytes_in, failed_rounds=fails, sent=sent,
                        payload=sent_frames,
                        dropped=g.stats.dropped_sends,
                        stats={k: v for k, v in vars(g.stats).items() if v and k not in ("bytes_out", "bytes_in")},
                        first=[(r.ok, r.reason, r.rejected, r.full_sent) for r in history[:3]])

    try:
        q.put(asyncio.run(main()))
    except BaseException as e:  # report, never hang the parent
        q.put(dict(rank=rank, error=f"{type(e).__name__}: {e}"))
        raise


def _gather(q, n: int, procs: list, timeout: float) -> list[dict]:
    """The children's ``n`` results from ``q``, or fewer: it stops at the first error a
    child reports and at a child that exited without reporting (the others would wait
    out their barriers for nothing), and after ``timeout`` s."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            out.append(q.get(timeout=1.0))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                out.append(dict(error=f"{dead[0].name} exited with code {dead[0].exitcode}"))
            elif time.monotonic() > deadline:
                out.append(dict(error=f"no result from {n - len(out)} of {n} processes within {timeout:.0f} s"))
            else:
                continue
        if "error" in out[-1]:
            break
    return out


def _end(procs: list, grace: float) -> None:
    """Join each child process, terminating (by its handle) any still alive after ``grace`` s."""
    for p in procs:
        p.join(timeout=grace)
        if p.is_alive():
            p.terminate()
            p.join(5)


def run_swarm(topology: str, codec: str, d: int, n: int = N, max_rounds: int = 60, fixed: bool = False,
              timeout: float = 300.0) -> dict:
    """One swarm run. ``fixed=False`` (the probe) measures every peer's error after
    every round, behind a barrier, and stops in the round where all are within the
    tolerance; ``fixed=True`` runs exactly ``max_rounds`` rounds back to back and
    measures the error once after the clock, as hivemind's step is measured."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cq, stop = ctx.Queue(), ctx.Event()
    coord = ctx.Process(target=_coordinator_proc, args=(cq, stop), daemon=True, name="coordinator")
    coord.start()
    procs = []
    out: list[dict] = []
    try:
        address = cq.get(timeout=60)
        ready, done, fin = ctx.Array("i", n), ctx.Array("i", n), ctx.Array("i", n)
        epoch = ctx.Array("q", [-1] * n)
        conv = ctx.Array("b", n * max_rounds)
        q = ctx.Queue()
        for r in range(n):
            p = ctx.Process(target=_swarm_peer_proc, daemon=True, name=f"swarm peer {r}",
                            args=(address, r, n, d, topology, codec, max_rounds, fixed, ready, done, conv, fin,
                                  epoch, q))
            p.start()
            procs.append(p)
        out = _gather(q, n, procs + [coord], timeout)
    finally:
        # after a failure the other peers wait at barriers that will not open: end them now
        _end(procs, 20 if len(out) == n and not any("error" in o for o in out) else 0)
        stop.set()
        _end([coord], 10)
    errors = [o["error"] for o in out if "error" in o]
    if errors:
        return dict(ok=False, error="; ".join(errors))
    start = max(o["t0"] for o in out)
    converged = all(o["t_conv"] is not None for o in out)
    return dict(
        ok=converged,
        wall_s=(max(o["t_conv"] for o in out) - start) if converged else None,
        rounds=max(o["rounds"] for o in out),
        err=max(o["err"] for o in out),
        err0=max(o["err0"] for o in out),
        bytes=sum(o["bytes_out"] for o in out),
        # array bytes alone (the frames as encoded and sent, any codec), comparable
        # with hivemind's payload model, which leaves out its own framing as well
        payload=sum(o["payload"] for o in out),
        messages=sum(o["sent"] for o in out),
        cpu_s=sum(o["cpu_s"] for o in out) if converged else None,
        bytes_per_peer=max(o["bytes_out"] for o in out),
        failed_rounds=sum(o["failed_rounds"] for o in out),
        stats=[o["stats"] for o in out], first=out[0]["first"],
        dropped=sum(o["dropped"] for o in out),
    )


# ------------------------------------------------------------ raw pyzmq anchor

def _zmq_peer_proc(rank: int, n: int, d: int, ports, ready, q) -> None:
    """The floor: a full exchange in bare pyzmq. PULL bound per process, PUSH to every
    other; each sends its vector without a copy, receives the n − 1 others without a
    copy and averages them. No framework, no checks, no membership."""
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    ports[rank] = pull.bind_to_random_port("tcp://127.0.0.1")
    meter = ErrorMeter(true_mean(n, d))
    x = vector(rank, d)
    while min(ports[:]) == 0:
        time.sleep(0.001)
    pushes = []
    for r in range(n):
        if r != rank:
            s = ctx.socket(zmq.PUSH)
            s.connect(f"tcp://127.0.0.1:{ports[r]}")
            pushes.append(s)
    time.sleep(0.5)  # connections up before the clock, as swarm's peers are linked
    ready[rank] = 1
    while min(ready[:]) < 1:
        time.sleep(0.0002)
    t0, cpu0 = time.monotonic(), tree_cpu()
    for s in pushes:
        s.send(x, copy=False)
    got = [np.frombuffer(pull.recv(copy=False), np.float32) for _ in range(n - 1)]
    acc = x.copy()
    for g in got:
        acc += g
    acc *= np.float32(1 / n)
    t1, cpu1 = time.monotonic(), tree_cpu()
    q.put(dict(rank=rank, t0=t0, t1=t1, cpu_s=cpu1 - cpu0, err=meter(acc)))
    ready[rank] = 2
    while min(ready[:]) < 2:   # nobody leaves while others still read from it
        time.sleep(0.001)
    for s in pushes:
        s.close(linger=0)
    pull.close(linger=0)
    ctx.term()


def run_raw_zmq(d: int, n: int = N, timeout: float = 120.0) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ports, ready, q = ctx.Array("i", n), ctx.Array("i", n), ctx.Queue()
    procs = [ctx.Process(target=_zmq_peer_proc, args=(r, n, d, ports, ready, q), daemon=True,
                         name=f"pyzmq peer {r}") for r in range(n)]
    for p in procs:
        p.start()
    out: list[dict] = []
    try:
        out = _gather(q, n, procs, timeout)
    finally:
        _end(procs, 10 if len(out) == n and not any("error" in o for o in out) else 0)
    errors = [o["error"] for o in out if "error" in o]
    if errors:
        return dict(ok=False, error="; ".join(errors))
    return dict(ok=True, wall_s=max(o["t1"] for o in out) - max(o["t0"] for o in out),
                cpu_s=sum(o["cpu_s"] for o in out), err=max(o["err"] for o in out),
                bytes=n * (n - 1) * 4 * d)


# ------------------------------------------------------------------- hivemind

def hm_python() -> Path:
    return HM_VENV / "bin" / "python"


def last_error(output: str) -> str:
    """The line of a failed command's output that says why: pip's last ``ERROR:`` line
    (its retry warnings come before it), else the last line (a traceback's exception)."""
    lines = [s.strip() for s in output.splitlines() if s.strip()]
    errors = [s for s in lines if s.startswith("ERROR")]
    return (errors or lines or ["(no output)"])[-1]


def ensure_hivemind(log) -> tuple[bool, str]:
    """Create build/hivemind-venv with torch 2.13.0 then hivemind (numpy < 2.4).
    Returns (ok, what failed or the version)."""
    py = hm_python()

    def sh(cmd: list[str], what: str, timeout: float = 1800) -> None:
        log(f"hivemind setup: {what}: {' '.join(cmd)}")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            log((r.stderr or r.stdout)[-2000:])   # in full on stderr; the status keeps one line
            raise RuntimeError(f"{what} failed (exit {r.returncode}): {last_error(r.stderr or r.stdout)}")

    check = [str(py), "-c", "import hivemind, torch, numpy, os, sys; "
             "from hivemind.averaging import DecentralizedAverager; "
             "from hivemind.compression import Float16Compression; "
             "p = os.path.join(os.path.dirname(hivemind.__file__), 'hivemind_cli', 'p2pd'); "
             "assert os.access(p, os.X_OK), 'p2pd daemon missing or not executable: ' + p; "
             "print(hivemind.__version__, torch.__version__, numpy.__version__)"]
    try:
        if py.exists():
            r = subprocess.run(check, capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                return True, "hivemind %s, torch %s, numpy %s" % tuple(r.stdout.split())
        with tempfile.TemporaryDirectory() as tmp:  # does PyPI have it at all?
            sh([sys.executable, "-m", "pip", "download", "--no-deps", "hivemind", "-d", tmp],
               "pip download --no-deps hivemind", timeout=600)
        if not py.exists():
            sh([sys.executable, "-m", "venv", str(HM_VENV)], "python -m venv")
        sh([str(py), "-m", "pip", "install", "torch==2.13.0"], "pip install torch==2.13.0")
        sh([str(py), "-m", "pip", "install", "hivemind", "numpy<2.4"], "pip install hivemind numpy<2.4")
        r = subprocess.run(check, capture_output=True, text=True, timeout=300)
        if r.returncode:
            log(r.stderr[-2000:])
            return False, f"hivemind installed but does not import/run: {last_error(r.stderr)}"
        return True, "hivemind %s, torch %s, numpy %s" % tuple(r.stdout.split())
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"


def hm_worker(args) -> None:
    """One hivemind process (runs inside build/hivemind-venv): prints one JSON line.

    Matchmaking runs before the start barrier (``step(wait=False, require_trigger=True)``
    until the group of n is formed and waits for the trigger), so the timed part
    is the all-reduce itself, as swarm's timed part starts once peers are linked."""
    out = {"rank": args.rank}
    try:
        import torch
        from hivemind import DHT
        from hivemind.averaging import DecentralizedAverager
        from hivemind.averaging.control import AveragingStage
        from hivemind.compression import Float16Compression, NoCompression

        torch.set_num_threads(1)
        d, n, rank, tmp = args.d, args.n, args.rank, Path(args.dir)
        meter = ErrorMeter(true_mean(n, d))
        x = vector(rank, d)
        out["err0"] = meter(x)
        maddrs = tmp / "maddrs.txt"
        if rank == 0:
            dht = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
            (tmp / "maddrs.tmp").write_text("\n".join(str(a) for a in dht.get_visible_maddrs()))
            (tmp / "maddrs.tmp").rename(maddrs)
        else:
            wait_files([maddrs], 120)
            dht = DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                      initial_peers=maddrs.read_text().split())
        comp = Float16Compression() if args.compression == "fp16" else NoCompression()
        avg = DecentralizedAverager([torch.from_numpy(x)], dht, start=True, prefix="bench_vs_swarm",
                                    target_group_size=n, min_group_size=n, min_matchmaking_time=3.0,
                                    request_timeout=10.0, compression=comp)
        ctl = avg.step(wait=False, require_trigger=True, timeout=120, allow_retries=False)
        deadline = time.monotonic() + 120
        while ctl.stage != AveragingStage.AWAITING_TRIGGER:
            if ctl.done() or time.monotonic() > deadline:
                raise RuntimeError(f"matchmaking did not form a group of {n}: stage {ctl.stage}")
            time.sleep(0.001)
        (tmp / f"ready{rank}").touch()
        wait_files([tmp / f"ready{r}" for r in range(n)], 120)
        out["t0"], cpu0 = time.monotonic(), tree_cpu()
        ctl.allow_allreduce()
        group = ctl.result(timeout=120)
        out["t1"] = time.monotonic()
        out["cpu_s"] = tree_cpu() - cpu0
        if group is None:
            raise RuntimeError("averager step failed (returned None)")
        out["group"] = len(group)
        with avg.get_tensors() as ts:
            out["err"] = meter(ts[0].numpy())
        (tmp / f"fin{rank}").touch()  # stay until all are done, then leave
        wait_files([tmp / f"fin{r}" for r in range(n)], 120)
        avg.shutdown()
        dht.shutdown()
    except BaseException as e:
        out["error"] = f"rank {args.rank}: {type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)


def run_hivemind(compression: str, d: int, n: int = N, timeout: float = 300.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_hm_") as tmp:
        tmp = Path(tmp)
        procs = []
        try:
            for r in range(n):
                cmd = [str(hm_python()), str(Path(__file__).resolve()), "--hm-worker", "--rank", str(r),
                       "--n", str(n), "--d", str(d), "--compression", compression, "--dir", str(tmp)]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              env={**os.environ, "OMP_NUM_THREADS": "1"}))
            outs = []
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    so, se = p.communicate()
                outs.append((p.returncode, so, se))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        res = []
        for r, (rc, so, se) in enumerate(outs):
            line = [s for s in so.splitlines() if s.startswith("{")]
            if rc or not line:
                return dict(ok=False, error=f"hivemind rank {r} exit {rc}: {se.strip()[-1500:]}")
            res.append(json.loads(line[-1]))
    errors = [o["error"] for o in res if "error" in o]
    if errors:
        return dict(ok=False, error="; ".join(errors))
    start = max(o["t0"] for o in res)
    err = max(o["err"] for o in res)
    per_peer = 2 * (n - 1) / n * d * (2 if compression == "fp16" else 4)
    return dict(ok=err <= TOL, wall_s=max(o["t1"] for o in res) - start, err=err,
                err0=max(o["err0"] for o in res), group=min(o["group"] for o in res),
                bytes_model=int(per_peer * n), bytes_per_peer_model=int(per_peer),
                cpu_s=sum(o["cpu_s"] for o in res),
                step_s=max(o["t1"] - o["t0"] for o in res))


# ----------------------------------------------------------------------- main

def fmt_bytes(b) -> str:
    """Bytes for the table: MB, or kB below 1 MB (a small --d printed 0 MB)."""
    if b is None:
        return "-"
    return f"{b / 1e6:,.0f} MB" if b >= 1e6 else f"{b / 1e3:,.1f} kB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, default=10_000_000, help="floats per vector (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each side; the best is kept")
    ap.add_argument("--skip-hivemind", action="store_true",
                    help="do not run hivemind: the JSON line has swarm's figures and the raw pyzmq "
                         "anchor, and null for hivemind's. Without this flag the script makes "
                         "build/hivemind-venv and pip-installs torch and hivemind into it (once; a large download)")
    ap.add_argument("--max-rounds", type=int, default=30, help="swarm gives up after this many rounds")
    ap.add_argument("--configs", default="",
                    help="comma list of swarm TOPOLOGY:CODEC, e.g. ring:fp16 (default: full, "
                         "one_peer_exponential and ring, each with identity and fp16)")
    ap.add_argument("--hm-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=N, help=argparse.SUPPRESS)
    ap.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hm_worker:
        hm_worker(args)
        return

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # checked here, not at import: the hivemind workers run this file where swarm is not installed
    from swarm.compress import get_codec
    from swarm.errors import ConfigError
    from swarm.gossip.topology import TOPOLOGIES

    for name in ("d", "repeats", "max_rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    configs = SWARM_CONFIGS
    if args.configs:
        configs = []
        topologies = [t for t in TOPOLOGIES if t != "custom"]   # custom needs edges this script has none of
        for c in args.configs.split(","):
            topology, _, codec = c.partition(":")   # a codec may hold colons itself (topk:0.1)
            if topology not in topologies or not codec:
                ap.error(f"--configs {c!r}: expected TOPOLOGY:CODEC with TOPOLOGY one of {', '.join(topologies)}")
            try:
                get_codec(codec)
            except ConfigError as e:
                ap.error(f"--configs {c!r}: {e}")
            configs.append((topology, codec))
    hm_ok, hm_status = (False, "skipped (--skip-hivemind)") if args.skip_hivemind else ensure_hivemind(log)
    log(f"hivemind: {'ready, ' if hm_ok else 'NOT AVAILABLE: '}{hm_status}")

    sw: dict[str, list[dict]] = {f"{t}/{c}": [] for t, c in configs}
    hm: dict[str, list[dict]] = {c: [] for c in HM_CONFIGS}
    raw: list[dict] = []
    # probes: how many rounds each configuration needs (error checked after every round)
    need: dict[str, int | None] = {}
    for t, c in configs:
        r = run_swarm(t, c, args.d, max_rounds=args.max_rounds)
        need[f"{t}/{c}"] = r["rounds"] if r.get("ok") else None
        log(f"[probe] swarm {t}/{c}: " + json.dumps(r))
    for rep in range(args.repeats):
        jobs = [("raw", None)] + [("swarm", tc) for tc in configs]
        if hm_ok:  # interleave: a hivemind run after every few swarm runs
            k = max(1, len(jobs) // len(HM_CONFIGS))
            for i, c in enumerate(HM_CONFIGS):
                jobs.insert(min(len(jobs), (i + 1) * k + i), ("hivemind", c))
        for side, what in jobs:
            if side == "raw":
                key = "full exchange"
                r = run_raw_zmq(args.d)
                raw.append(r)
            elif side == "swarm":
                key = f"{what[0]}/{what[1]}"
                if need[key] is None:
                    r = dict(ok=False, error=f"the probe did not reach {TOL:g} within {args.max_rounds} rounds")
                else:
                    r = run_swarm(what[0], what[1], args.d, max_rounds=need[key], fixed=True)
                sw[key].append(r)
            else:
                key = what
                r = run_hivemind(what, args.d)
                hm[key].append(r)
            log(f"[{rep + 1}/{args.repeats}] {side} {key}: " + json.dumps(r))

    def best(runs: list[dict]) -> dict | None:
        ok = [r for r in runs if r.get("ok") and r.get("wall_s") is not None]
        return min(ok, key=lambda r: r["wall_s"]) if ok else None

    rows = []
    print(f"\n{N} processes, d = {args.d:,} float32 each, target max_i ‖x_i − x̄‖/‖x̄‖ ≤ {TOL:g}"
          f" (start: ‖x_i − x̄‖/‖x̄‖ ≈ {next((r['err0'] for v in sw.values() for r in v if 'err0' in r), 0):.2f})")
    print(f"{'side':9} {'config':32} {'best wall s':>11} {'walls s':>18} {'CPU s':>6} {'rounds':>6} "
          f"{'final err':>9} {'bytes total':>12} {'per peer':>10}")
    sw_best = {}
    for key, runs in sw.items():
        b = best(runs)
        sw_best[key] = b
        walls = ",".join(f"{r['wall_s']:.2f}" if r.get("wall_s") is not None else "fail" for r in runs)
        if b:
            print(f"{'swarm':9} {key:32} {b['wall_s']:11.3f} {walls:>18} {b['cpu_s']:6.2f} {b['rounds']:6d} {b['err']:9.2e} "
                  f"{fmt_bytes(b['bytes']):>12} {fmt_bytes(b['bytes_per_peer']):>10}")
        else:
            print(f"{'swarm':9} {key:32} {'FAILED':>11} {walls:>18}  {runs[-1] if runs else ''}")
    hm_best = {}
    for key, runs in hm.items():
        if not hm_ok:
            break
        b = best(runs)
        hm_best[key] = b
        walls = ",".join(f"{r['wall_s']:.2f}" if r.get("wall_s") is not None else "fail" for r in runs)
        name = f"DecentralizedAverager {key}"
        if b:
            print(f"{'hivemind':9} {name:32} {b['wall_s']:11.3f} {walls:>18} {b['cpu_s']:6.2f} {1:6d} {b['err']:9.2e} "
                  f"{fmt_bytes(b['bytes_model']) + '*':>12} {fmt_bytes(b['bytes_per_peer_model']) + '*':>10}")
        else:
            print(f"{'hivemind':9} {name:32} {'FAILED':>11} {walls:>18}  {runs[-1] if runs else ''}")
    raw_best = best(raw)
    if raw_best:
        walls = ",".join(f"{r['wall_s']:.2f}" if r.get("wall_s") is not None else "fail" for r in raw)
        print(f"{'pyzmq':9} {'raw full exchange (anchor)':32} {raw_best['wall_s']:11.3f} {walls:>18} "
              f"{raw_best['cpu_s']:6.2f} {1:6d} {raw_best['err']:9.2e} {fmt_bytes(raw_best['bytes']):>12} "
              f"{fmt_bytes(raw_best['bytes'] // N):>10}")
    if hm_ok:
        print("* hivemind bytes: butterfly all-reduce payload model 2·(n−1)/n·d·itemsize per peer, not measured")
    else:
        print(f"hivemind NOT RUN: {hm_status}")
    rows = [(k, b) for k, b in sw_best.items() if b]
    sw_top = min(rows, key=lambda kb: kb[1]["wall_s"]) if rows else None
    hm_rows = [(k, b) for k, b in hm_best.items() if b]
    hm_top = min(hm_rows, key=lambda kb: kb[1]["wall_s"]) if hm_rows else None
    ratio = sw_top[1]["wall_s"] / hm_top[1]["wall_s"] if sw_top and hm_top else None
    cpu_ratio = (sw_top[1]["cpu_s"] / hm_top[1]["cpu_s"]
                 if sw_top and hm_top and hm_top[1].get("cpu_s") else None)
    bytes_ok = sw_top[1]["payload"] <= hm_top[1]["bytes_model"] if sw_top and hm_top else None
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores shared; walls are noisy, CPU s is "
          "the CPU time of all 4 peer process trees inside the clock)")
    if cpu_ratio is not None:
        print(f"CPU: swarm {sw_top[1]['cpu_s']:.2f} s / hivemind {hm_top[1]['cpu_s']:.2f} s = {cpu_ratio:.3f}; "
              f"payload: swarm {fmt_bytes(sw_top[1]['payload'])} ({fmt_bytes(sw_top[1]['bytes'])} on the wire, "
              f"measured) vs hivemind {fmt_bytes(hm_top[1]['bytes_model'])} (model): "
              f"{'no more' if bytes_ok else 'MORE'}")
    # per hivemind configuration: the fastest swarm configuration sending no more bytes
    bytes_matched = {}
    for hk, hb in hm_rows:
        lean = [(k, b) for k, b in rows if b["payload"] <= hb["bytes_model"]]
        top = min(lean, key=lambda kb: kb[1]["wall_s"]) if lean else None
        bytes_matched[hk] = None if top is None else {
            "swarm_config": top[0], "swarm_payload": top[1]["payload"], "swarm_wire_bytes": top[1]["bytes"],
            "hivemind_bytes_model": hb["bytes_model"],
            "ratio": round(top[1]["wall_s"] / hb["wall_s"], 4)}
        print(f"vs hivemind {hk} ({fmt_bytes(hb['bytes_model'])}*): fastest swarm config sending no more payload: "
              + (f"{top[0]} {top[1]['wall_s']:.3f} s, {fmt_bytes(top[1]['payload'])} payload, ratio "
                 f"{top[1]['wall_s'] / hb['wall_s']:.3f}" if top else "none"))
    vs_raw = sw_top[1]["wall_s"] / raw_best["wall_s"] if sw_top and raw_best else None
    if vs_raw is not None:
        print(f"swarm best / raw pyzmq full exchange = {vs_raw:.3f}"
              + (f"; hivemind best / raw = {hm_top[1]['wall_s'] / raw_best['wall_s']:.3f}" if hm_top else ""))
    if ratio is not None:
        print(f"swarm best ({sw_top[0]}) {sw_top[1]['wall_s']:.3f} s / hivemind best ({hm_top[0]}) "
              f"{hm_top[1]['wall_s']:.3f} s = {ratio:.3f} (target ≤ 0.35)")
    summary = {
        "bench": "vs_hivemind", "n": N, "d": args.d, "tol": TOL, "repeats": args.repeats,
        "vs_hivemind_ratio": None if ratio is None else round(ratio, 4),
        "vs_hivemind_cpu_ratio": None if cpu_ratio is None else round(cpu_ratio, 4),
        "swarm_bytes_le_hivemind": bytes_ok,
        "bytes_matched": bytes_matched,
        "swarm_vs_raw_pyzmq": None if vs_raw is None else round(vs_raw, 4),
        "raw_pyzmq_wall_s": round(raw_best["wall_s"], 4) if raw_best else None,
        "loadavg": [round(v, 2) for v in load],
        "swarm_best_config": sw_top[0] if sw_top else None,
        "swarm_best_wall_s": round(sw_top[1]["wall_s"], 4) if sw_top else None,
        "swarm_final_err": sw_top[1]["err"] if sw_top else None,
        "swarm_bytes": sw_top[1]["bytes"] if sw_top else None,
        "swarm_cpu_s": sw_top[1]["cpu_s"] if sw_top else None,
        "hivemind_cpu_s": hm_top[1]["cpu_s"] if hm_top else None,
        "hivemind_best_config": hm_top[0] if hm_top else None,
        "hivemind_best_wall_s": round(hm_top[1]["wall_s"], 4) if hm_top else None,
        "hivemind_final_err": hm_top[1]["err"] if hm_top else None,
        "hivemind_bytes_model": hm_top[1]["bytes_model"] if hm_top else None,
        "hivemind_status": hm_status if hm_ok else f"not run: {hm_status}",
        "swarm": {k: (None if b is None else {x: b[x] for x in ("wall_s", "cpu_s", "rounds", "err", "bytes",
                                                                   "payload", "messages")})
                  for k, b in sw_best.items()},
        "hivemind": {k: (None if b is None else {x: b[x] for x in ("wall_s", "cpu_s", "err", "bytes_model")})
                     for k, b in hm_best.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    # SIGTERM (a `timeout`, a job runner) as SystemExit: the finally blocks that end
    # the processes this script started still run (killed outright, they were left behind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if "--hm-worker" in sys.argv[1:]:   # in the hivemind venv, which has no swarm: main only
        sys.exit(main())
    from swarm.scripting import run_script
    run_script(main, "bench_vs_hivemind")
