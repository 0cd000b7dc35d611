"""The command line and its configs, fortieth review: derived spec keys kept across a
change of env, `swarm peer --spec`'s default run folder, an advertised address beside a
free bind port, custom graphs under --spec, peer ids that cannot go on the wire or on a
line, paths that a strict stdout cannot print, the coordinator a peer names, and an
OSError of no file at `swarm run`'s first start."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
from pathlib import Path

import pytest
# the stand-ins for what a command starts, and the one-line refusal (tests/ is on the path)
from swarmtest import SWARM, free_port, wait_for
from test_cli_review import Started, nothing_starts, refused  # noqa: F401 - nothing_starts is a fixture

from swarm import cli
from swarm.config import load_config
from swarm.errors import ConfigError
from swarm.experiment.spec import DEFAULT_SPEC, load_spec, save_resolved

# ------------------------------------------------------------ 1. keys derived from the env and topology


@pytest.mark.parametrize("make", [
    lambda: load_spec(dataclasses.replace(DEFAULT_SPEC, env="Acrobot-v1")),
    lambda: load_spec(load_spec(None), ["env=Acrobot-v1"]),
    lambda: load_spec(dataclasses.replace(load_spec(None, ["peers=2"]), env="Acrobot-v1")),
])
def test_a_spec_given_another_env_in_code_derives_its_name_and_solve_return_again(make):
    # they kept cartpole-ring and CartPole's 475 (what --set env=Acrobot-v1 gives: acrobot-ring
    # and -100), so budget.stop_when_solved never fired on Acrobot
    spec = make()
    assert (spec.name, spec.eval.solve_return) == ("acrobot-ring", -100.0)


def test_a_spec_given_another_topology_in_code_is_named_after_it():
    # it kept "cartpole-ring" while it ran a grid
    grid = dataclasses.replace(DEFAULT_SPEC, gossip=dataclasses.replace(DEFAULT_SPEC.gossip, topology="grid"))
    assert load_spec(grid).name == "cartpole-grid"
    assert load_spec(load_spec(None), ["gossip.topology=grid"]).name == "cartpole-grid"


def test_a_name_and_solve_return_set_by_hand_stay():
    # what the fix leaves as it was: only values load_spec derived are derived again
    mine = load_spec(None, ["name=mine", "eval.solve_return=300"])
    assert (mine.name, mine.eval.solve_return) == ("mine", 300.0)
    moved = load_spec(mine, ["env=Acrobot-v1"])
    assert (moved.name, moved.eval.solve_return) == ("mine", 300.0)
    spec = load_spec(None)
    changed = dataclasses.replace(spec, name="other", env="Acrobot-v1",
                                  eval=dataclasses.replace(spec.eval, solve_return=-50.0))
    assert (load_spec(changed).name, load_spec(changed).eval.solve_return) == ("other", -50.0)
    # and a spec that keeps its env keeps what was derived for it
    assert load_spec(load_spec(None), ["peers=2"]).name == "cartpole-ring"
    assert load_spec(DEFAULT_SPEC) == load_spec(None)


def test_a_resumed_runs_config_json_keeps_its_name(tmp_path):
    # what the fix leaves as it was: config.json records the resolved name, and a run
    # resumed from it keeps it whatever it overrides
    saved = save_resolved(load_spec(None, ["gossip.topology=grid"]), tmp_path)
    assert load_spec(saved, ["gossip.topology=ring"]).name == "cartpole-grid"


# ------------------------------------------------------------ 2. `swarm peer --spec`'s default run folder

@pytest.fixture
def one_peer(tmp_path, monkeypatch) -> Path:
    """A one-peer spec file in a working folder of its own (where runs/ goes)."""
    monkeypatch.chdir(tmp_path)
    return save_resolved(load_spec(None, ["peers=1"]), tmp_path / "one.json")


def _earlier_run(folder: Path) -> None:
    """What a run admitted into ``folder``'s peer0/ leaves there: its run.json."""
    from swarm.experiment.checkpoint import Lineage, write_lineage

    (folder / "peer0").mkdir(parents=True)
    write_lineage(folder / "peer0", Lineage.new())


def test_a_fresh_peer_is_refused_a_default_folder_that_holds_another_run(nothing_starts, capsys, one_peer):
    # a second `swarm peer --spec` without --run-dir went into runs/NAME-peer0 and replaced the
    # first one's results there in silence
    _earlier_run(Path("runs/cartpole-ring-peer0"))
    line = refused(capsys, ["peer", "--spec", str(one_peer), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9"])
    assert "runs/cartpole-ring-peer0" in line and "--run-dir" in line and "--resume" in line, line


@pytest.mark.parametrize("more", [["--run-dir", "runs/cartpole-ring-peer0"],   # asked for by name
                                  ["--replace", "peer0"],                      # a restart goes on with it
                                  ["--resume", "runs/cartpole-ring-peer0"],
                                  ["--run-dir", "elsewhere"]])
def test_a_restart_or_a_folder_named_still_starts(nothing_starts, one_peer, more):
    # what the fix leaves as it was: a restart finds its run there, and a folder named is asked for
    _earlier_run(Path("runs/cartpole-ring-peer0"))
    with pytest.raises(Started):
        cli.main(["peer", "--spec", str(one_peer), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9", *more])


def test_a_fresh_peer_takes_a_default_folder_that_holds_no_run(nothing_starts, one_peer):
    # what the fix leaves as it was: one stopped while it joined leaves only its
    # summary.json, no run to keep, and the next start takes the folder
    (Path("runs/cartpole-ring-peer0/peer0")).mkdir(parents=True)
    (Path("runs/cartpole-ring-peer0/peer0/summary.json")).write_text('{"reason": "stopped"}\n')
    with pytest.raises(Started):
        cli.main(["peer", "--spec", str(one_peer), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9"])


def test_the_run_dir_help_names_the_default(capsys):
    # neither --help nor docs/ said where a peer without --run-dir writes
    with pytest.raises(SystemExit):
        cli.main(["peer", "--help"])
    assert "runs/NAME-peerRANK" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------ 3. peer.advertise beside a free bind port

@pytest.mark.parametrize("bind", [None, "tcp://127.0.0.1:*", "tcp://0.0.0.0:0"])
def test_an_advertised_address_beside_a_free_bind_port_is_refused(bind):
    # it was taken: the peer bound a random port and advertised another, so no neighbour
    # could link to it
    sets = ["peer.advertise=tcp://127.0.0.1:5000", *([f"peer.bind={bind}"] if bind else [])]
    with pytest.raises(ConfigError, match=r"^peer\.advertise = 'tcp://127\.0\.0\.1:5000'.*fixed port"):
        load_config(None, sets)


def test_an_advertised_address_with_a_fixed_bind_port_from_the_flag_starts(nothing_starts):
    # what the fix must not refuse: docs/multihost.md's --bind of a fixed port with --set
    # peer.advertise (the config is checked with --bind's port, not the default *)
    with pytest.raises(Started):
        cli.main(["peer", "--coordinator", "tcp://127.0.0.1:9", "--bind", "tcp://0.0.0.0:7000",
                  "--set", "peer.advertise=tcp://10.0.0.5:7000"])


def test_the_cli_refuses_an_advertised_address_beside_a_free_port(nothing_starts, capsys):
    # the peer started, bound a free port and advertised 7000
    line = refused(capsys, ["peer", "--coordinator", "tcp://127.0.0.1:9", "--bind", "tcp://0.0.0.0:*",
                            "--set", "peer.advertise=tcp://10.0.0.5:7000"])
    assert "peer.advertise" in line, line


# ------------------------------------------------------------ 4. custom graphs under --spec

@pytest.fixture
def custom(tmp_path) -> Path:
    path = tmp_path / "custom.toml"
    path.write_text('peers = 3\n[gossip]\ntopology = "custom"\nedges = [[0, 1], [1, 2]]\n')
    return path


@pytest.mark.parametrize("more", [["--topology", "custom"],
                                  ["--set", "peer.topology=custom", "--set", "peer.edges=[[0, 1], [1, 2]]"],
                                  # the same undirected edges, in another order and direction
                                  ["--set", "peer.topology=custom", "--set", "peer.edges=[[2, 1], [1, 0]]"],
                                  []])
def test_a_custom_graph_that_agrees_with_the_spec_starts(nothing_starts, custom, tmp_path, more):
    # --topology custom, the spec's own, was refused: "peer.edges: topology = custom needs an edge list"
    with pytest.raises(Started):
        cli.main(["peer", "--spec", str(custom), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9",
                  "--run-dir", str(tmp_path / "run"), *more])


@pytest.mark.parametrize("more, key", [
    (["--set", "peer.edges=[[0, 2], [1, 2]]"], "--set peer.edges"),
    (["--topology", "custom", "--set", "peer.edges=[[0, 2], [1, 2]]"], "--set peer.edges"),
    (["--topology", "ring"], "--topology ring"),
    (["--set", "peer.topology=ring"], "--set peer.topology=ring"),
])
def test_a_custom_graph_that_disagrees_with_the_spec_is_refused(nothing_starts, capsys, custom, tmp_path,
                                                                 more, key):
    # --set peer.edges was taken, then replaced by the spec's edges in silence
    line = refused(capsys, ["peer", "--spec", str(custom), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9",
                            "--run-dir", str(tmp_path / "run"), *more])
    assert line.startswith(f"swarm: error: {key}") and "disagrees with the spec's gossip." in line, line


def test_a_config_files_graph_that_disagrees_with_the_spec_is_refused(nothing_starts, capsys, custom, tmp_path):
    # the file's peer.topology was replaced by the spec's in silence
    config = tmp_path / "peer.toml"
    config.write_text('[peer]\ntopology = "grid"\n')
    line = refused(capsys, ["peer", "--spec", str(custom), "--rank", "0", "--coordinator", "tcp://127.0.0.1:9",
                            "--run-dir", str(tmp_path / "run"), "--config", str(config)])
    assert "peer.topology = 'grid'" in line and str(config) in line and "gossip.topology" in line, line


# ------------------------------------------------------------ 5. peer ids

@pytest.mark.parametrize("bad", ["ab\udcff", "two\nlines", "tab\there", "esc\x1b[2J"])
def test_a_peer_id_that_cannot_be_sent_or_shown_is_refused(bad):
    # an id from a non-UTF-8 argv byte failed only at the join ("body cannot go on the wire",
    # naming neither --id nor peer.id); one with a line break broke the output's lines
    with pytest.raises(ConfigError, match=r"^peer\.id = .*printable"):
        load_config(None, [f"peer.id={bad}"])


def test_the_id_flag_is_checked_the_same_way(nothing_starts, capsys):
    # --id with a non-UTF-8 byte started the peer, which failed at the join naming neither
    line = refused(capsys, ["peer", "--coordinator", "tcp://127.0.0.1:9", "--id", "ab\udcff"])
    assert line.startswith("swarm: error: peer.id = 'ab\\udcff'"), line


def test_a_printable_id_of_any_script_is_taken():
    # what the fix leaves as it was: printable is not ASCII
    assert load_config(None, ["peer.id=héllo wörld-1"]).peer.id == "héllo wörld-1"


# ------------------------------------------------------------ 6. paths a strict stdout cannot print

def _strict(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SWARM, *args], capture_output=True, timeout=120, cwd=cwd,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8:strict"))


def test_keys_in_a_folder_whose_name_is_not_utf8_are_listed_escaped(tmp_path):
    # the keys were written, then printing their paths raised UnicodeEncodeError: a traceback, exit 1
    folder = os.fsdecode(b"kk\xff")
    p = _strict("keys", "generate", folder, cwd=tmp_path)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode(errors="replace")
    assert b"kk\\udcff" in p.stdout and (tmp_path / folder / "peer.key").is_file()


def test_eval_of_a_policy_whose_path_is_not_utf8_prints_it_escaped(tmp_path):
    import torch
    from experiment.test_eval_cli import _entries

    run = tmp_path / os.fsdecode(b"run\xff")
    (run / "peer0").mkdir(parents=True)
    torch.save(_entries(), run / "peer0" / "best.pt")
    p = _strict("eval", run.name, "--episodes", "1", cwd=tmp_path)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr.decode(errors="replace")
    header, row = p.stdout.decode().splitlines()
    assert row.split()[0] == "run\\udcff/peer0/best.pt" and len(header) == len(row), p.stdout


# ------------------------------------------------------------ 7. the coordinator a peer names

def test_a_peer_names_the_coordinator_it_joined_through(procs):
    # with --coordinator DEAD,LIVE it joined through LIVE and named DEAD on its first line
    coord = procs.coordinator(None, "--set", "coordinator.http_bind=")
    dead = f"tcp://127.0.0.1:{free_port()}"   # nothing listens there
    peer = procs.start("peer", "--id", "p0", "--coordinator", f"{dead},{coord.addr}", name="p0")
    first = wait_for(lambda: procs.log(peer).splitlines()[:1], timeout=30, what="the peer's first line")[0]
    assert first.startswith("swarm peer p0 on ") and f"coordinator {coord.addr} " in first, procs.log(peer)


# ------------------------------------------------------------ OSError of no file at `swarm run`'s first start

def test_an_oserror_of_no_file_at_the_first_start_is_one_line(nothing_starts, monkeypatch, capsys):
    # EMFILE from Popen's pipes names no file: it was re-raised, and the user saw a traceback
    import swarm.experiment.launch

    def no_pipes(*args, **kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(swarm.experiment.launch, "run_experiment", no_pipes)
    line = refused(capsys, ["run"])
    assert line == f"swarm: error: {os.strerror(errno.EMFILE)}", line


def test_swarm_status_pads_each_cell_as_it_is_shown():
    """An address holding a control character was padded, then escaped: ``\\x1b`` took
    four columns of the padding's one, and the neighbours column of that row moved."""
    from swarm.cli import format_status

    def member(i, addr):
        return {"id": f"p{i}", "rank": i, "state": "alive", "heartbeat_age_s": 0.1, "linked_epoch": 1,
                "addr": addr, "neighbours": [f"p{1 - i}"]}
    st = {"coordinator": "tcp://127.0.0.1:1", "epoch": 1, "uptime_s": 1.0, "view": {"members": [0, 1]},
          "members": [member(0, "tcp://127.0.0.1:5\x1b"), member(1, "tcp://127.0.0.1:5")]}
    rows = format_status(st).splitlines()[-2:]
    assert "\x1b" not in "".join(rows) and "\\x1b" in rows[0]
    assert rows[0].index(" p1") == rows[1].index(" p0"), rows
