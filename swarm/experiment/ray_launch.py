"""`swarm launch --ray [ADDRESS] SPEC`: place an experiment's peers on a Ray cluster.

Ray only *places* the peers; it is not on the data path. The launcher

1. connects to the cluster (``ADDRESS``, else ``RAY_ADDRESS``, else a local
   Ray instance) and lists the alive nodes that have CPUs;
2. sets ``peers`` = nodes × ``per_node`` (a ``peers`` that the spec file or a
   ``--set`` gives and that differs is refused) and writes the resolved spec to
   ``runs/<name>-<time>/config.json``;
3. starts ``swarm coordinator`` as a child process of its own, bound to this
   node's address (failover stays the coordinator's job);
4. creates ``per_node`` peer actors on each node (strict node affinity,
   ``max_restarts=0``: Ray never restarts a peer behind the coordinator's
   back; a lost peer is detected and routed around by the coordinator like
   any other), each running :func:`swarm.experiment.runner.run_peer` — the
   same body as ``swarm peer --spec`` — bound to its node's address, so all
   gossip and replay traffic goes peer to peer over ZeroMQ;
5. records where each peer runs (node, address, pid) in ``placement.json``,
   shows the same progress line as ``swarm run``, and at the end collects the
   peers' summaries (also where the run folder is not on a shared file
   system), writes the summary table and plots, and ends the actors and the
   coordinator.

Peers on other nodes write ``peer{r}/`` under the same absolute path on their
own node; with a shared file system the run folder is complete. With ``-v``
(``verbose``) the coordinator and each peer log INFO lines (``-vv``: DEBUG) to
``logs/coordinator.log`` and ``logs/peer{r}.log``, as with ``swarm run -v``.

>>> from swarm.experiment.ray_launch import launch_ray
>>> launch_ray("spec.toml", ["budget.env_steps=5000"], address="ray://head:10001", per_node=2)
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, TextIO

from ..config import PeerConfig, read_file
from ..errors import ConfigError, SwarmError
from .checkpoint import write_json
from .launch import POLL_S, Launch, _Interrupt, _Output, _Progress, _status, _table, _warn, new_run_dir
from .launch import _plots, _wait_coordinator, summarize
from .runner import peer_dir
from .spec import Spec, check_env_for_peers, load_spec, save_resolved

__all__ = ["launch_ray", "PeerActor", "cluster_nodes"]

#: seconds peers get to finish their current step and write their files after a stop
STOP_GRACE_S = 20.0
#: seconds the peer actors get to start (a worker process per actor, importing swarm)
START_TIMEOUT_S = 120.0


def _ray() -> Any:
    try:
        import ray  # noqa: PLC0415 - optional dependency (the `ray` extra)
    except ImportError:
        raise SwarmError("swarm launch --ray needs Ray: pip install 'ray>=2.9'") from None
    return ray


class PeerActor:
    """One peer of an experiment, living in a Ray worker process.

    Created by :func:`launch_ray` as a Ray actor with ``max_concurrency=2``, so
    that :meth:`stop` can reach it while :meth:`run` trains.
    """

    def __init__(self) -> None:
        self._stop = threading.Event()

    def where(self) -> dict[str, Any]:
        """This worker's node id, address and pid."""
        import ray  # noqa: PLC0415

        return {"node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def run(self, spec: Spec, rank: int, coordinator: str, run_dir: str, host: str | None,
            verbose: int = 0) -> dict[str, Any]:
        """Train peer ``rank`` of ``spec`` (see :func:`~swarm.experiment.runner.run_peer`),
        bound to ``host`` (None: this node's address); returns its summary. ``verbose``
        1 logs swarm's INFO lines to ``run_dir/logs/peer{rank}.log``, 2 DEBUG too."""
        import ray  # noqa: PLC0415

        from .runner import run_peer  # noqa: PLC0415

        try:
            import uvloop  # noqa: PLC0415
            factory = uvloop.new_event_loop
        except ImportError:
            factory = None
        cfg = PeerConfig(bind=f"tcp://{host or ray.util.get_node_ip_address()}:*", **spec.link.peer_settings())
        with _peer_log(run_dir, rank, verbose):
            return run_peer(spec, rank, coordinator, run_dir, stop=self._stop, loop_factory=factory,
                            peer_config=cfg)

    def stop(self) -> None:
        """End the run after the peer's current step (it writes its files and leaves)."""
        self._stop.set()


@contextlib.contextmanager
def _peer_log(run_dir: str | Path, rank: int, verbose: int) -> Iterator[None]:
    """Within it, with ``verbose`` >= 1, swarm's log records of INFO and above (2: DEBUG)
    go to ``run_dir/logs/peer{rank}.log`` and nowhere else, as a `swarm run -v` peer's do
    (on a terminal they would break into the launcher's progress line). ``verbose`` 0
    changes nothing."""
    if verbose <= 0:
        yield
        return
    path = Path(run_dir) / "logs" / f"peer{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("swarm")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))   # the CLI's
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO if verbose == 1 else logging.DEBUG)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(level)
        logger.propagate = propagate


def cluster_nodes(ray: Any) -> list[dict[str, Any]]:
    """Alive Ray nodes that offer CPUs, head first, as ``{id, ip, cpus}``."""
    nodes = []
    for n in ray.nodes():
        cpus = float(n.get("Resources", {}).get("CPU", 0))
        if n.get("Alive") and cpus > 0:
            nodes.append({"id": n["NodeID"], "ip": n["NodeManagerAddress"], "cpus": cpus,
                          "head": "node:__internal_head__" in n.get("Resources", {})})
    return sorted(nodes, key=lambda n: (not n["head"], n["ip"], n["id"]))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _not_ipv4(host: str) -> str:
    """Why ``host`` cannot be bound and dialled by swarm, or "" when it can: the
    transport does not enable IPv6 (see :func:`swarm.transport.member_address_error`)."""
    from ..transport import member_address_error  # noqa: PLC0415 - zmq only when needed

    if not member_address_error(f"tcp://{host}:1"):
        return ""
    try:
        ipaddress.IPv6Address(host.strip("[]"))
    except ValueError:
        return "is not a host name or IPv4 address"
    return "is an IPv6 address"


def _coordinator_port(host: str) -> int:
    """A free port on ``host`` for the coordinator; a host this machine cannot bind is an error."""
    try:
        return _free_port(host)
    except OSError as e:   # socket.gaierror too: a name that resolves to IPv6 only, or not at all
        raise SwarmError(f"cannot bind the coordinator to {host}: {e.strerror or e}; swarm binds IPv4 "
                         "addresses of this machine (give --host with one)") from None


def _peers_given(spec_path: str | Path | Spec | None, overrides: list[str]) -> str | None:
    """Where ``peers`` is set by the user: ``"--set peers=5"``, ``"spec.toml"``, or None
    when neither sets it (the default). ``"?"`` for a :class:`Spec` made in code, whose
    ``peers`` may be its default or set on purpose: there is no telling."""
    given = [o for o in overrides if o.split("=", 1)[0].strip() == "peers"]
    if given:
        return f"--set {given[-1].strip()}"
    if isinstance(spec_path, Spec):
        return "?"
    if spec_path and "peers" in read_file(spec_path):
        return str(spec_path)
    return None


def _why(e: BaseException) -> str:
    """``Kind: first line`` of a Ray error, for a summary row. A task's own error comes
    wrapped in a RayTaskError whose ``cause`` is the peer's exception (a PeerTimeout...)."""
    for _ in range(3):
        cause = getattr(e, "cause", None)
        if not isinstance(cause, BaseException):
            break
        e = cause
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = lines[0] if lines else "(no message)"
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(e).__name__}: {first}"


def launch_ray(spec_path: str | Path | Spec | None, overrides: list[str] | None = None, address: str | None = None,
               *, per_node: int = 1, cpus_per_peer: float = 1.0, host: str | None = None,
               runs_root: str | Path = "runs", stream: TextIO | None = None,
               init_kwargs: dict[str, Any] | None = None, verbose: int = 0) -> int:
    """Run the experiment ``spec_path`` with ``per_node`` peers on every Ray node.

    Args:
        spec_path: spec file (None: the built-in default; or a :class:`Spec`); ``overrides`` as ``--set``.
        address: the Ray cluster (``auto``, ``HOST:PORT``, ``ray://HOST:10001``); None:
            ``RAY_ADDRESS`` or a new local instance. Ignored when Ray is already
            initialised in this process (then that cluster is used and left running).
        per_node: peer actors per node; the spec's ``peers`` becomes nodes × per_node.
        cpus_per_peer: CPUs each peer actor reserves (a node needs per_node × this).
        host: address the coordinator and every peer bind; None: each node's own
            address (right on a cluster; ``127.0.0.1`` keeps a one-machine test on loopback).
        runs_root: where the run folder is made.
        init_kwargs: extra arguments for ``ray.init`` (e.g. ``num_cpus`` of a local instance).
        verbose: ``swarm launch -v``: 1 adds the coordinator's and the peers' INFO log
            lines to their logs in ``logs/``, 2 DEBUG too (as ``swarm run -v``).

    Returns the exit code: 0 when every peer finished, 1 when one failed (the
    others went on: the coordinator routes around it) or the coordinator crashed
    (the peers went on without it), 130 when interrupted.
    """
    if per_node < 1:
        raise ConfigError(f"--per-node must be >= 1, got {per_node}")
    if not 0 < cpus_per_peer <= 1024:   # also refuses nan
        raise ConfigError(f"--cpus-per-peer must be > 0 and at most 1024, got {cpus_per_peer}")
    if host is not None and (what := _not_ipv4(host)):
        raise ConfigError(f"--host {host!r} {what}: swarm connects over IPv4 only; give a host name or an "
                          "IPv4 address")
    from ..transport import unspecified_host  # noqa: PLC0415 - zmq only when needed

    if host is not None and unspecified_host(host):
        # the coordinator binds it, but every peer is handed tcp://HOST:PORT to dial
        raise ConfigError(f"--host {host!r} is no address to dial: the peers connect to the coordinator at it; "
                          "give this machine's IPv4 address or host name (127.0.0.1 on one machine), or leave "
                          "--host out to use each node's Ray address")
    # a bad spec fails before Ray is imported or a cluster touched
    asked = load_spec(spec_path, overrides)
    check_env_for_peers(asked.env)
    peers_from = _peers_given(spec_path, list(overrides or []))
    ray = _ray()
    # messages start on a line of their own, not at the end of the progress line
    out = _Output(stream or sys.stderr)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address=address, **(init_kwargs or {}))
    launch: Launch | None = None
    actors: list[Any] = []
    try:
        nodes = cluster_nodes(ray)
        if not nodes:
            raise SwarmError("the Ray cluster has no alive node with CPUs")
        short = [n for n in nodes if n["cpus"] < per_node * cpus_per_peer]
        if short:
            raise ConfigError(f"--per-node {per_node} × {cpus_per_peer} CPU per peer does not fit node(s) "
                              + ", ".join(f"{n['ip']} ({n['cpus']:g} CPUs)" for n in short)
                              + "; lower --per-node or cpus_per_peer")
        n_peers = len(nodes) * per_node
        if asked.peers != n_peers and peers_from == "?":
            print(f"swarm launch: warning: the spec's peers = {asked.peers} becomes {n_peers} "
                  f"({len(nodes)} Ray node(s) × --per-node {per_node})", file=out, flush=True)
        elif asked.peers != n_peers and peers_from is not None:
            raise ConfigError(f"peers = {asked.peers} ({peers_from}) but the Ray cluster takes {n_peers} peers "
                              f"({len(nodes)} node(s) × --per-node {per_node}): swarm launch --ray sets peers "
                              "itself; leave it out of the spec and --set, or make --per-node agree")
        coord_host = host or ray.util.get_node_ip_address()
        if host is None:   # the coordinator binds this node's address, each peer its node's (--host: checked)
            named = [("this node's Ray address", coord_host), *((f"Ray node {n['id']}'s address", n["ip"])
                                                                for n in nodes)]
            for what, ip in named:
                if why := _not_ipv4(ip):
                    raise SwarmError(f"{what} {ip!r} {why}: swarm connects over IPv4 only; start Ray on IPv4 "
                                     "addresses (ray start --node-ip-address), or on one machine give "
                                     "--host 127.0.0.1")
        addr = f"tcp://{coord_host}:{_coordinator_port(coord_host)}"
        spec = load_spec(spec_path, [*(overrides or []), f"peers={n_peers}"])
        run_dir = new_run_dir(Path(runs_root), spec.name).resolve()
        save_resolved(spec, run_dir)
        print(f"swarm launch: {spec.name}: {n_peers} peers ({len(nodes)} Ray node(s) × {per_node}) on a "
              f"{spec.gossip.topology}, {spec.env}, codec {spec.gossip.codec} -> {run_dir}", file=out, flush=True)
        _warn(spec, run_dir, out, "swarm launch")

        launch = Launch(run_dir, verbose=verbose)
        coord = launch.start("coordinator", ["coordinator", "--bind", addr, "--set",
                                             # quoted: a name like 123 or true reads as a TOML scalar
                                             f"coordinator.run_name={json.dumps(spec.name)}"])
        _wait_coordinator(launch, coord, addr)

        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

        remote = ray.remote(PeerActor)
        refs: dict[Any, int] = {}
        for r in range(n_peers):
            node = nodes[r // per_node]
            a = remote.options(
                num_cpus=cpus_per_peer, max_restarts=0, max_task_retries=0, max_concurrency=2,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["id"], soft=False),
            ).remote()
            actors.append(a)
            refs[a.run.remote(spec, r, addr, str(run_dir), host, verbose)] = r
        where = _where(ray, actors, nodes, per_node)
        write_json(run_dir / "placement.json",
                   {"coordinator": addr, "peers": {f"peer{r}": w for r, w in enumerate(where)}}, indent=2)
        code, summaries = _supervise(ray, spec, actors, refs, coord, addr, out, launch.given_up)
    finally:
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone; nothing left to end
                pass
        if launch is not None:
            launch.close()
        if owns_ray:
            ray.shutdown()

    rows = _write_results(run_dir, spec, summaries, launch.given_up)
    print(_table(rows), file=out)
    _plots(run_dir, out)
    print(f"run folder: {run_dir}", file=out, flush=True)
    return code


def _write_results(run_dir: Path, spec: Spec, summaries: dict[int, dict[str, Any]],
                   given_up: dict[str, str]) -> list[dict[str, Any]]:
    """Put each peer's summary that Ray handed back in its folder where its node did not
    (no shared file system), then the run's ``summary.json``; returns the rows. Each is
    written whole or not at all, as `swarm run` writes them: a kill or a full disk
    meanwhile leaves the previous file (or none), not a torn one."""
    for r, s in summaries.items():
        f = peer_dir(run_dir, r) / "summary.json"
        if not f.exists():   # that peer ran on a node without our file system
            f.parent.mkdir(parents=True, exist_ok=True)
            write_json(f, s, indent=2)
    rows = summarize(run_dir, spec)
    for row in rows:   # a failed peer's row says what Ray reported, as swarm run's given_up rows do
        if row.get("id") in given_up:
            row["reason"] = given_up[row["id"]]
    write_json(run_dir / "summary.json", rows, indent=2)
    return rows


def _where(ray: Any, actors: list[Any], nodes: list[dict[str, Any]], per_node: int) -> list[dict[str, Any]]:
    """Where each peer actor runs (node, ip, pid), waiting up to :data:`START_TIMEOUT_S` for
    them all. An actor Ray cannot place or start (its node is gone, its worker died) is an
    error that names the peer and its node."""
    refs = [a.where.remote() for a in actors]
    deadline = time.monotonic() + START_TIMEOUT_S
    where = []
    for r, ref in enumerate(refs):
        try:
            where.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
        except ray.exceptions.GetTimeoutError:
            raise SwarmError(f"the peer actors did not start within {START_TIMEOUT_S:.0f} s; is swarm "
                             "installed on every node, with the same Python?") from None
        except ray.exceptions.RayError as e:
            node = nodes[r // per_node]
            raise SwarmError(f"peer{r}'s actor on Ray node {node['id']} ({node['ip']}) did not start: "
                             f"{_why(e)}") from None
    return where


def _supervise(ray: Any, spec: Spec, actors: list[Any], refs: dict[Any, int], coord: Any, addr: str,
               out: TextIO, given_up: dict[str, str] | None = None) -> tuple[int, dict[int, dict[str, Any]]]:
    """Wait for the peers, drawing progress; a failed peer is reported, not fatal. Each
    failed peer (``peer{r}``), and a crashed coordinator, goes into ``given_up`` with why;
    any makes the exit code 1."""
    progress = _Progress(spec, out)
    out = progress.out   # each message clears the progress line first
    given_up = {} if given_up is None else given_up
    summaries: dict[int, dict[str, Any]] = {}
    pending = list(refs)
    stop_sent = 0.0
    code = 0
    with _Interrupt() as intr:
        try:
            while pending:
                if intr.count and not stop_sent:
                    progress.done()
                    print("swarm launch: interrupted; stopping the peers (they write their metrics first)",
                          file=out, flush=True)
                    for a in actors:
                        a.stop.remote()
                    stop_sent = time.monotonic()
                    code = 130
                if stop_sent and (intr.count > 1 or time.monotonic() - stop_sent > STOP_GRACE_S):
                    break   # the actors are killed by the caller
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                for ref in done:
                    r = refs[ref]
                    try:
                        summaries[r] = ray.get(ref)
                    except Exception as e:  # RayActorError (node or process lost) or run_peer's own error
                        given_up[f"peer{r}"] = f"failed: {_why(e)}"
                        progress.done()
                        print(f"swarm launch: peer{r} failed: {type(e).__name__}: {str(e).strip()[-2000:]}",
                              file=out, flush=True)
                        if pending:
                            print("swarm launch: the coordinator routes around it; the others go on",
                                  file=out, flush=True)
                if coord.proc.poll() is not None and not coord.ended_by_us:
                    print(f"swarm launch: the coordinator exited with code {coord.proc.returncode}; "
                          "peers keep training without it (see logs/coordinator.log)", file=out, flush=True)
                    given_up["coordinator"] = f"exited with {coord.how()}"
                    coord.ended_by_us = True   # reported once
                progress.update(_status(addr) if coord.proc.poll() is None else None, len(pending))
        finally:
            progress.done()
    return (code or (1 if given_up else 0)), summaries
