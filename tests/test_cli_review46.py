"""The command line, forty-sixth review: ``~`` in a path option given as ``--opt=~/x``,
`swarm status` and `swarm eval` columns that wide or combining characters pushed off,
and `swarm status --watch`'s clear-screen escapes in files, pipes and dumb terminals.

Bash expands ``~`` only at the start of a word: ``--run-dir=~/x`` reached swarm as a
literal ``~``, which made a folder of that name in the current one while the log said
``writing to ~/x``. The one-shot status table and the eval table padded their cells by
characters, not by the columns a terminal gives them (`status --watch` pads by columns).
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import sys
import time
import unicodedata

import pytest
import torch
from experiment.test_eval_cli import _entries   # what a peer's best.pt holds (tests/ is on the path)
from swarmtest import ROOT, SWARM, free_port, reap_all, wait_for

from swarm.cli import format_status, main, parse_args, query_status

# --------------------------------------------------------------------- ~ in a path option


@pytest.mark.parametrize("argv,dest", [
    (["coordinator", "--keys=~/k"], "keys"),
    (["coordinator", "--config=~/c.toml"], "config"),
    (["peer", "--keys=~/k"], "keys"),
    (["peer", "--config=~/c.toml"], "config"),
    (["peer", "--spec=~/s.toml"], "spec"),
    (["peer", "--run-dir=~/r"], "run_dir"),
    (["peer", "--resume=~/r"], "resume_from"),
    (["peer", "--resume-from=~/r"], "resume_from"),
    (["status", "--keys=~/k"], "keys"),
    (["keys", "generate", "~/k"], "dir"),
    (["run", "~/s.toml"], "spec"),
    (["run", "--resume=~/r"], "resume"),
    (["eval", "~/r"], "paths"),
    (["launch", "--ray", "auto", "~/s.toml"], "spec"),
])
def test_every_path_option_expands_a_leading_tilde(tmp_path, monkeypatch, argv, dest):
    monkeypatch.setenv("HOME", str(tmp_path))
    got = getattr(parse_args(argv), dest)
    expected = str(tmp_path / argv[-1].rsplit("~/", 1)[1])
    assert (got[0] if dest == "paths" else got) == expected


def test_swarm_peer_writes_a_run_dir_given_as_tilde_under_home_and_says_so(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    spec = subprocess.run([*SWARM, "run", "--show", "--set", "peers=1"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout
    (tmp_path / "spec.toml").write_text(spec)
    log = tmp_path / "peer.log"
    with open(log, "w") as out:   # no coordinator answers: it waits to join once it has said where it writes
        p = subprocess.Popen([*SWARM, "peer", "--spec", str(tmp_path / "spec.toml"), "--rank", "0",
                              "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--run-dir=~/swarm-runs/exp1"],
                             cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "writing to" in log.read_text() or p.poll() is not None, 60, what="the peer's first line")
    finally:
        reap_all([p])
    assert f"writing to {home / 'swarm-runs' / 'exp1'} (pid" in log.read_text(), log.read_text()
    assert (home / "swarm-runs" / "exp1" / "peer0").is_dir()
    assert os.listdir(cwd) == []


# ------------------------------------------------------------------ columns by screen width


def _cols(s: str) -> int:
    """Terminal columns of printable ``s`` (the test's own count: wide 2, combining 0)."""
    return sum(0 if unicodedata.category(c) in ("Mn", "Me") else 2 if unicodedata.east_asian_width(c) in "WF"
               else 1 for c in s)


#: ids of 13, 6 and 5 columns (8, 7 and 5 characters)
IDS = ["東京-ノード-1", "cafe\u0301-✓", "ascii"]


def test_swarm_status_lines_up_wide_and_combining_ids_by_their_columns():
    from swarm.coordinator import Coordinator
    from swarm.peer import Peer

    async def table() -> str:
        async with Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", http_bind="") as coord:
            peers = [Peer(id=i, coordinators=[coord.address], heartbeat_s=0.2) for i in IDS]
            try:
                for p in peers:
                    await p.start()
                for p in peers:
                    await p.wait_view(lambda v: len(v.members) == len(IDS), timeout=10)
                return format_status(await query_status(coord.address, 5.0))
            finally:
                for p in reversed(peers):
                    await p.close()

    lines = asyncio.run(table()).splitlines()
    head = next(ln for ln in lines if ln.startswith("id "))
    rows = {i: next(ln for ln in lines if ln.startswith(i + " ")) for i in IDS}
    for column in ("alive", "tcp://"):   # the state and address cells start where their headings do
        at = _cols(head[:head.index("state" if column == "alive" else "address")])
        assert {i: _cols(r[:r.index(column)]) for i, r in rows.items()} == dict.fromkeys(IDS, at), lines


def test_swarm_eval_lines_up_paths_with_wide_and_combining_characters(tmp_path, capsys):
    files = [tmp_path / name / "best.pt" for name in ("日本 é 🐝", "cafe\u0301", "plain")]
    for f in files:
        f.parent.mkdir()
        torch.save(_entries(), f)
    rc = main(["eval", *map(str, files), "--episodes", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert [ln.split(" 300 ")[0].rstrip() for ln in lines[1:]] == list(map(str, files))
    assert {_cols(ln) for ln in lines} == {_cols(lines[0])}, out   # every column ends where its heading does


# ------------------------------------------------------------ status --watch and the screen


def _frames(text: str) -> int:
    return text.count("coordinator tcp://")


def test_status_watch_into_a_file_writes_no_escapes_and_stamps_each_table(procs, tmp_path):
    coord = procs.coordinator(None)
    out = tmp_path / "watch.log"
    with open(out, "w") as f:
        p = subprocess.Popen([*SWARM, "status", "--coordinator", coord.addr, "--watch", "--interval", "0.2"],
                             cwd=ROOT, stdout=f, stderr=subprocess.PIPE, env={**os.environ, "TERM": "xterm"})
    try:
        wait_for(lambda: _frames(out.read_text()) >= 3 or p.poll() is not None, 60, what="three frames")
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0, p.stderr.read()
    finally:
        reap_all([p])
    text = out.read_text()
    assert "\x1b" not in text, repr(text[:300])
    frames = re.split(r"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\n", text, flags=re.MULTILINE)
    assert frames[0] == "" and len(frames) >= 4, repr(text[:600])   # each table after the time it was taken
    assert all(fr.startswith("coordinator tcp://") and "steps/s" in fr for fr in frames[1:]), repr(text[:600])


@pytest.mark.parametrize("term,clears", [("dumb", False), ("xterm", True)])
def test_status_watch_clears_the_screen_only_of_a_terminal_that_can(procs, term, clears):
    coord = procs.coordinator(None)
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([*SWARM, "status", "--coordinator", coord.addr, "--watch", "--interval", "0.2"],
                             cwd=ROOT, stdout=slave, stderr=subprocess.PIPE, env={**os.environ, "TERM": term})
    finally:
        os.close(slave)
    got = b""
    try:
        deadline = time.monotonic() + 60
        while _frames(got.decode(errors="replace")) < 3 and time.monotonic() < deadline and p.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                got += os.read(master, 65536)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0, p.stderr.read()
    finally:
        reap_all([p])
        os.close(master)
    assert _frames(got.decode(errors="replace")) >= 3, got[-600:]
    assert (b"\x1b[H\x1b[2J" in got) is clears and (b"\x1b" in got) is clears, got[:300]


def test_a_coordinator_whose_swarm_run_died_before_it_started_watching_ends(tmp_path):
    # swarm run killed just as it started its coordinator: the coordinator's parent was no
    # longer that swarm run when it looked, so it watched nothing and ran on for good
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()   # its pid: a swarm run that is gone
    addr = f"tcp://127.0.0.1:{free_port()}"
    p = subprocess.run([sys.executable, "-m", "swarm.cli", "coordinator", "--bind", addr], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, env=dict(os.environ, SWARM_PARENT_PID=str(dead.pid)))
    assert p.returncode == 0, p.stderr
    assert f"its swarm run (pid {dead.pid}, SWARM_PARENT_PID) is gone; stopping" in p.stdout + p.stderr
