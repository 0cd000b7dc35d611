"""A peer or coordinator under a low limit on open files (``ulimit -n``; review 42): the
warning of a link that found none names that limit, and ``raise_fd_limit`` lifts the
soft limit to the hard one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from swarmtest import ROOT, status, wait_for

resource = pytest.importorskip("resource")


def test_a_link_out_of_fds_names_the_processs_limit(procs):
    """Under ``ulimit -n 64`` the warning said "this context allows 1023 sockets", a limit
    nowhere near; every socket holds a file, so where the process may open fewer files
    than the context allows sockets, the files ran out."""
    if not hasattr(resource, "prlimit"):
        pytest.skip("no prlimit to lower a running process's fd limit")
    from swarm.peer import SyncPeer

    coord = procs.coordinator(None)
    peer = procs.start("peer", "--coordinator", coord.addr, "--id", "p0", "--topology", "full", name="p0")
    members: list = []
    try:
        wait_for(lambda: any(m["id"] == "p0" for m in status(coord.addr)["members"]), 30, what="p0 admitted")
        limit = len(os.listdir(f"/proc/{peer.pid}/fd")) + 6   # a link or so more
        resource.prlimit(peer.pid, resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        for i in range(4):
            members.append(SyncPeer(coordinators=[coord.addr], id=f"m{i}", topology="ring",
                                    join_timeout_s=20).start())
        wait_for(lambda: "cannot open a link to" in procs.log(peer), 30, what="a link out of fds")
    finally:
        for m in members:
            m.close()
    log = procs.log(peer)
    assert f"Too many open files (this process may open {limit} files, ulimit -n, and a link takes about four)" \
        in log, log
    assert "this context allows" not in log, log


_RAISE = """
import json, resource
from swarm.transport import raise_fd_limit
got = raise_fd_limit()
print(json.dumps([got, *resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


@pytest.mark.parametrize("soft, hard", [(48, 200), (200, 200)])
def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one(soft, hard):
    """A process started with a low soft limit (the common ``ulimit -n 1024``) ends up with
    the hard one, and never above it."""
    top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if top != resource.RLIM_INFINITY and top < hard:
        pytest.skip(f"this process's hard limit on open files is under {hard}")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    p = subprocess.run([sys.executable, "-c", _RAISE], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       preexec_fn=low, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [hard, hard, hard]
