"""CurveZMQ authentication as it runs: a neighbour whose authorized/ lacks a peer's key
is dialled again once it lists it (links and the relay's outbox), authorized/ is read
file by file, key files are checked when loaded, and the key folder's modes, the
--keys flag, the key name and a shared zmq context are checked up front."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import threading

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from swarmtest import free_port, until

from swarm import transport as tp
from swarm import wire
from swarm.cli import main, query_status
from swarm.coordinator import Coordinator
from swarm.errors import ConfigError, SwarmError
from swarm.peer import Peer
from swarm.peer import peer as peer_mod
from swarm.transport import Curve, generate_keys


def _messages(caplog, *texts: str) -> list[str]:
    """The messages logged that hold every one of ``texts``."""
    return [m for m in (r.getMessage() for r in caplog.records) if all(t in m for t in texts)]


def _per_host(tmp_path):
    """One key folder per host (docs/multihost.md): host1's authorized/ lacks host2's key."""
    k, ka, kb = tmp_path / "k", tmp_path / "kA", tmp_path / "kB"
    generate_keys(str(k), ["coordinator", "host1", "host2"])
    shutil.copytree(k, ka)
    shutil.copytree(k, kb)
    (ka / "authorized" / "host2.key").unlink()
    return k, ka, kb


# ------------------------------------------------- a neighbour that refuses our key


def _hosts(c: Coordinator, ka, kb) -> tuple[Peer, Peer]:
    """Peers a (host1's keys) and b (host2's) of ``c``'s swarm, each with its host's folder."""
    return (Peer(id="a", coordinators=[c.address], keys_dir=str(ka), key_name="host1", topology="full"),
            Peer(id="b", coordinators=[c.address], keys_dir=str(kb), key_name="host2", topology="full"))


def test_a_link_refused_for_its_key_is_logged_once_and_dialled_again_once_listed(tmp_path, caplog):
    # libzmq never dials an address again after its ZAP handler refused the key: b stayed
    # cut off from a, in silence, although the docs say a key copied in admits the host
    caplog.set_level("WARNING", logger="swarm.peer")
    k, ka, kb = _per_host(tmp_path)

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(k), http_bind="") as c:
            a, b = _hosts(c, ka, kb)
            got: list[int] = []
            a.on("x", lambda m: got.append(m.body["i"]))
            async with a, b:
                await b.wait_view(lambda v: len(v.members) == 2)
                refused = ("the handshake with neighbour a at", " fails: ")
                await until(lambda: _messages(caplog, *refused), 15, what="the refusal logged")
                # refused again at least twice (the backoff doubled), logged once
                await until(lambda: b._links["a"].dial.backoff >= 8 * peer_mod.REDIAL_MIN_S, 15,
                            what="three refusals")
                [line] = _messages(caplog, *refused)
                assert "it refused this peer's key" in line
                assert f"copy {kb / 'host2.key'} there" in line and "authorized/" in line
                await b.send("a", "x", {"i": 1}, timeout=0.3)   # queued for a connection a refuses
                await asyncio.sleep(0.3)
                assert got == [] and b.counters.suspicions == 0   # a is alive: not reported

                shutil.copy(k / "authorized" / "host2.key", ka / "authorized")
                for _ in range(400):
                    if got:
                        break
                    await b.send("a", "x", {"i": 2}, timeout=0.05)
                    await asyncio.sleep(0.05)
                assert 2 in got
                await b.wait_linked(timeout=5)
                assert len(_messages(caplog, *refused)) == 1
                assert len(_messages(caplog, "the handshake with neighbour a at", "succeeds again")) == 1

    asyncio.run(run())


def test_an_outbox_refused_for_its_key_is_dialled_again_once_listed(tmp_path, caplog):
    caplog.set_level("WARNING", logger="swarm.peer")
    k, ka, kb = _per_host(tmp_path)

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(k), http_bind="") as c:
            a, b = _hosts(c, ka, kb)
            async with a, b:
                await b.wait_view(lambda v: len(v.members) == 2)
                inbox, ep = a.open_inbox()
                out = b.open_outbox("a", ep)
                refused = ("the handshake with a's inbox at", " fails: ")
                got = 0

                async def push(tries: int, stop) -> None:
                    nonlocal got
                    for i in range(tries):
                        tp.try_send(out, wire.encode("g", "b", body={"i": i}))
                        await asyncio.sleep(0.05)
                        while inbox.poll(0):
                            inbox.recv_multipart()
                            got += 1
                        if stop():
                            return

                try:
                    await push(300, lambda: len(_messages(caplog, *refused)) and
                               out._watch.dial.backoff >= 8 * peer_mod.REDIAL_MIN_S)
                    [line] = _messages(caplog, *refused)
                    assert "it refused this peer's key" in line and f"copy {kb / 'host2.key'} there" in line
                    assert got == 0
                    shutil.copy(k / "authorized" / "host2.key", ka / "authorized")
                    await push(400, lambda: got > 0)
                    assert got > 0
                    await push(10, lambda: False)     # the next look at the monitor sees the success
                    assert len(_messages(caplog, *refused)) == 1
                    assert len(_messages(caplog, "the handshake with a's inbox at", "succeeds again")) == 1
                finally:
                    b.close_side(out)
                    a.close_side(inbox)

    asyncio.run(run())


# ----------------------------------------------------------------- authorized/


def _keyed(tmp_path, junk: bool):
    """A key folder for coordinator, peer and host2, with an empty junk.key in authorized/."""
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer", "host2"])
    if junk:
        (kd / "authorized" / "junk.key").write_text("")
    return kd


def test_a_bad_file_in_authorized_at_start_skips_only_itself(tmp_path, caplog):
    # one empty .key file made the whole read fail: no key was admitted
    caplog.set_level("WARNING", logger="swarm.transport")
    kd = _keyed(tmp_path, junk=True)

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(kd), http_bind="") as c:
            assert _messages(caplog, str(kd / "authorized" / "junk.key"), "skipping it")
            assert (await query_status(c.address, 5.0, str(kd), "peer"))["epoch"] >= 0

    asyncio.run(run())


def test_a_key_removed_while_a_bad_file_is_in_authorized_admits_no_more(tmp_path):
    # the re-read failed on the bad file and kept the keys read before, the removed one too
    kd = _keyed(tmp_path, junk=False)

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(kd), http_bind="") as c:
            assert (await query_status(c.address, 5.0, str(kd), "host2"))["epoch"] >= 0
            (kd / "authorized" / "notes.key").write_text("my notes\n")
            (kd / "authorized" / "host2.key").unlink()
            with pytest.raises(SwarmError, match="no coordinator answered"):
                await query_status(c.address, 1.0, str(kd), "host2")
            assert (await query_status(c.address, 5.0, str(kd), "peer"))["epoch"] >= 0

            # a key copied in is an empty file for a moment: its content counts once written
            (kd / "authorized" / "host2.key").write_text("")
            with pytest.raises(SwarmError, match="no coordinator answered"):
                await query_status(c.address, 0.5, str(kd), "host2")
            shutil.copy(kd / "host2.key", kd / "authorized" / "host2.key")
            assert (await query_status(c.address, 5.0, str(kd), "host2"))["epoch"] >= 0

    asyncio.run(run())


def test_strangers_handshakes_do_not_repeat_the_warning_about_a_bad_file(tmp_path, caplog):
    # each handshake read the folder again, failed on the bad file, and logged a warning
    caplog.set_level("WARNING", logger="swarm.transport")
    kd = _keyed(tmp_path, junk=False)
    server = zmq.auth.load_certificate(str(kd / "coordinator.key"))[0]

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(kd), http_bind="") as c:
            (kd / "authorized" / "junk.key").write_text("")
            ctx = zmq.Context()
            socks, monitors = [], []
            try:
                for _ in range(20):
                    pub, sec = zmq.curve_keypair()
                    s = ctx.socket(zmq.DEALER)
                    s.linger = 0
                    s.curve_secretkey, s.curve_publickey, s.curve_serverkey = sec, pub, server
                    monitors.append(s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH))
                    s.connect(c.address)
                    socks.append(s)
                refused = 0
                for _ in range(300):     # every stranger refused (the coordinator's ZAP ran 20 times)
                    refused += sum(m.poll(0) and bool(m.recv_multipart()) for m in monitors)
                    if refused >= 20:
                        break
                    await asyncio.sleep(0.05)
                assert refused >= 20
            finally:
                for s, m in zip(socks, monitors):
                    s.disable_monitor()
                    m.close(0)
                    s.close(0)
                ctx.term()
            assert len(_messages(caplog, "junk.key")) == 1

    asyncio.run(run())


def test_a_file_named_authorized_is_refused(tmp_path):
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])
    shutil.rmtree(kd / "authorized")
    (kd / "authorized").write_text("")
    with pytest.raises(ConfigError, match="authorized is not a folder"):
        Curve(str(kd), "peer")


# ----------------------------------------------------------------- key values


@pytest.mark.parametrize("cut", ["secret-key", "public-key", "coordinator.key", "not z85"])
def test_a_key_cut_short_is_a_config_error_naming_its_file(tmp_path, cut):
    # libzmq refused it only when set on a socket: a bare ZMQError "Invalid argument"
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])
    f = kd / ("coordinator.key" if cut == "coordinator.key" else "peer.key_secret")
    text = f.read_text()
    line = "secret-key" if cut == "secret-key" else "public-key"
    at = text.index(line) + len(line) + len(' = "') + 20
    f.write_text(text[:at] + ("~" * 20 + text[at + 20:] if cut == "not z85" else "\n"))
    with pytest.raises(ConfigError, match=f"{f}: its {line} is not 40 Z85 characters"):
        Curve(str(kd), "peer")

    async def run() -> None:
        with pytest.raises(ConfigError, match=str(f)):
            async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(kd), key_name="peer", http_bind=""):
                pass

    asyncio.run(run())


# ----------------------------------------------------------------- modes


def test_keys_made_under_a_loose_umask_are_not_writable_by_others(tmp_path):
    # under umask 000 the folders and public keys came out writable by everyone
    kd = tmp_path / "new" / "keys"
    old = os.umask(0)
    try:
        generate_keys(str(kd), ["coordinator", "peer"])
    finally:
        os.umask(old)
    mode = {p: stat.S_IMODE((kd / p).stat().st_mode) for p in
            (".", "..", "authorized", "peer.key", "coordinator.key", "authorized/peer.key", "peer.key_secret")}
    assert mode == {".": 0o755, "..": 0o755, "authorized": 0o755, "peer.key": 0o644, "coordinator.key": 0o644,
                    "authorized/peer.key": 0o644, "peer.key_secret": 0o600}


def test_an_authorized_folder_others_can_write_is_warned_about(tmp_path, caplog):
    # authorized/ is read again while the swarm runs: a local user could add a key
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])
    caplog.set_level("WARNING", logger="swarm.transport")
    Curve(str(kd), "peer")
    assert not _messages(caplog, "writable by others")
    (kd / "authorized").chmod(0o777)
    (kd / "coordinator.key").chmod(0o664)
    Curve(str(kd), "peer")
    [line] = _messages(caplog, "writable by others")
    assert f"{kd / 'authorized'} (mode 777)" in line and f"{kd / 'coordinator.key'} (mode 664)" in line


# ----------------------------------------------------------------- flags, names, contexts


def test_an_empty_keys_flag_is_refused_not_plaintext(tmp_path, procs, capsys):
    # `--keys "$KEYS"` with KEYS unset ran a plaintext swarm, in silence
    addr = f"tcp://127.0.0.1:{free_port()}"
    co = procs.start("coordinator", "--keys", "", "--bind", addr, "--set", "coordinator.http_bind=",
                     name="coordinator")
    pe = procs.start("peer", "--keys", "", "--coordinator", addr, "--set", "peer.join_timeout_s=0.5", name="peer")
    assert co.wait(20) == 2 and pe.wait(20) == 2
    for p in (co, pe):
        assert "--keys '' is empty" in procs.log(p)
    assert main(["status", "--keys", " ", "--coordinator", addr, "--timeout", "0.2"]) == 2
    assert "--keys ' ' is empty" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../outside", "", "host1 ", "/abs/peer"])
def test_a_bad_key_name_is_refused(tmp_path, name):
    # "../outside" loaded a secret from outside the key folder
    kd = tmp_path / "inner"
    generate_keys(str(kd), ["coordinator", "peer"])
    shutil.copy(kd / "peer.key_secret", tmp_path / "outside.key_secret")
    with pytest.raises(ConfigError, match=f"bad key name {name!r}"):
        Curve(str(kd), name)


def test_two_keyed_objects_on_one_context_are_a_config_error(tmp_path):
    # the second ZAP handler found inproc://zeromq.zap.01 taken: a raw ZMQError
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "peer"])
    ctx = zmq.asyncio.Context()

    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=kd, http_bind="", context=ctx) as c:
            p = Peer(id="a", coordinators=[c.address], keys_dir=kd, context=ctx, join_timeout_s=2)
            with pytest.raises(ConfigError, match="its own context"):
                await p.start()
            assert p.state.value == "closed"
            assert (await query_status(c.address, 5.0, kd, "peer"))["epoch"] >= 0   # the first still checks keys

    asyncio.run(run())
    ended = threading.Thread(target=ctx.term, daemon=True)   # nothing of the refused one left open
    ended.start()
    ended.join(20)
    assert not ended.is_alive()


def test_an_outbox_without_keys_has_no_handshake_monitor():
    """Without keys no inbox refuses a handshake: an outbox watched it anyway, with a
    monitor of two more sockets (and fds) each."""
    async def run() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as c:
            a = Peer(id="a", coordinators=[c.address], topology="full")
            b = Peer(id="b", coordinators=[c.address], topology="full")
            async with a, b:
                await b.wait_view(lambda v: len(v.members) == 2)
                _, ep = a.open_inbox()
                out = b.open_outbox("a", ep)
                assert out is not None and out._watch is None

    asyncio.run(run())
