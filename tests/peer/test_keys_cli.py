"""`swarm keys generate`: every name and path is checked before anything is
written, so a refusal leaves the disk as it was; existing keys are never
overwritten, and new names can be added to an existing key folder."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
import zmq.auth
from swarmtest import free_port, wait_for

from swarm.cli import main, query_status
from swarm.errors import ConfigError
from swarm.transport import Curve, generate_keys


def files(folder):
    """Every path under folder, relative to it, as sorted strings."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def refused(capsys, *argv):
    """Run `swarm keys generate ...`; assert it fails with rc 2 and return its error line."""
    assert main(["keys", "generate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swarm: error: ") and err.count("\n") == 1
    return err


def test_new_folder_gets_coordinator_and_peer(tmp_path, capsys):
    kd = tmp_path / "keys"
    assert main(["keys", "generate", str(kd)]) == 0
    assert files(kd) == ["authorized", "authorized/coordinator.key", "authorized/peer.key",
                         "coordinator.key", "coordinator.key_secret", "peer.key", "peer.key_secret"]
    for name in ("coordinator", "peer"):
        assert stat.S_IMODE((kd / f"{name}.key_secret").stat().st_mode) == 0o600
    Curve(str(kd), "peer")                       # a usable key folder


def test_the_printed_paths_are_clean_for_a_folder_with_a_slash(tmp_path, capsys, monkeypatch):
    # the README's command, `swarm keys generate keys/`, printed `keys//authorized/`
    monkeypatch.chdir(tmp_path)
    assert main(["keys", "generate", "keys/"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["keys/coordinator.key  (secret: keys/coordinator.key_secret)",
                   "keys/peer.key  (secret: keys/peer.key_secret)",
                   "authorized public keys: keys/authorized/ - copy a host's NAME.key there to admit it"]


@pytest.mark.parametrize("target", ["afile", "afile/sub"])
def test_a_file_as_target_is_refused(tmp_path, capsys, target):
    (tmp_path / "afile").write_text("not a folder")
    err = refused(capsys, str(tmp_path / target))
    assert f"{tmp_path / 'afile'} is not a folder" in err
    assert files(tmp_path) == ["afile"]
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_a_file_named_authorized_is_refused(tmp_path, capsys):
    kd = tmp_path / "keys"
    kd.mkdir()
    (kd / "authorized").write_text("")
    assert "authorized is not a folder" in refused(capsys, str(kd))
    assert files(kd) == ["authorized"]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_an_unwritable_target_is_a_clear_error(capsys):
    assert "cannot write keys in /proc/nope" in refused(capsys, "/proc/nope")


@pytest.mark.parametrize("bad", ["../evil", "a/b", ".hidden", "-rf", "a b", "..", "x" * 101])
def test_bad_names_are_refused(tmp_path, capsys, bad):
    kd = tmp_path / "keys"
    err = refused(capsys, str(kd), f"--names={bad}")
    assert f"bad key name {bad!r}" in err
    assert files(tmp_path) == []                 # nothing inside the folder, nothing beside it


def test_a_bad_name_in_the_middle_leaves_nothing_written(tmp_path, capsys):
    kd = tmp_path / "keys"
    assert "bad key name 'c/d'" in refused(capsys, str(kd), "--names", "host1,c/d,host2")
    assert "bad key name 'a b'" in refused(capsys, str(kd), "--names", "a b,c/d")
    assert files(tmp_path) == []


def test_an_existing_secret_refuses_before_writing(tmp_path, capsys):
    kd = tmp_path / "keys"
    kd.mkdir()
    (kd / "peer.key_secret").write_text("mine")
    err = refused(capsys, str(kd))
    assert f"{kd / 'peer.key_secret'} exists; refusing to overwrite" in err
    assert "give only new names" in err
    assert files(kd) == ["peer.key_secret"]      # no coordinator.key*, no authorized/
    assert (kd / "peer.key_secret").read_text() == "mine"


def test_an_authorized_key_of_the_same_name_is_not_overwritten(tmp_path):
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator"])
    (kd / "authorized" / "host2.key").write_text("another host's key")
    with pytest.raises(ConfigError, match="authorized/host2.key exists"):
        generate_keys(str(kd), ["host2"])
    assert not (kd / "host2.key").exists()
    assert (kd / "authorized" / "host2.key").read_text() == "another host's key"


def test_duplicate_names_are_refused(tmp_path, capsys):
    kd = tmp_path / "keys"
    assert "key name 'peer' given more than once" in refused(capsys, str(kd), "--names", "peer,peer")
    assert files(tmp_path) == []


def test_new_names_are_added_to_an_existing_folder(tmp_path, capsys):
    kd = tmp_path / "keys"
    assert main(["keys", "generate", str(kd)]) == 0
    before = {p: (kd / p).read_bytes() for p in files(kd) if (kd / p).is_file()}

    assert main(["keys", "generate", str(kd), "--names", "host2"]) == 0
    assert "host2.key" in capsys.readouterr().out
    assert set(files(kd)) == set(before) | {"authorized", "host2.key", "host2.key_secret",
                                            "authorized/host2.key"}
    assert all((kd / p).read_bytes() == data for p, data in before.items())    # nothing rewritten
    assert stat.S_IMODE((kd / "host2.key_secret").stat().st_mode) == 0o600
    assert Curve(str(kd), "host2").public == zmq.auth.load_certificate(str(kd / "authorized" / "host2.key"))[0]

    # the default names (coordinator,peer) exist now: refused, and the folder is unchanged
    assert "coordinator.key exists; refusing to overwrite" in refused(capsys, str(kd))
    assert "peer.key exists" in refused(capsys, str(kd), "--names", "host3,peer")
    assert not (kd / "host3.key").exists()


def test_a_failure_while_writing_removes_what_was_written(tmp_path, monkeypatch):
    real = zmq.auth.create_certificates

    def full_disk(key_dir, name):
        if name == "second":
            open(f"{key_dir}/{name}.key", "w").close()          # half a pair, then the disk fills
            raise OSError(28, "No space left on device")
        return real(key_dir, name)

    monkeypatch.setattr(zmq.auth, "create_certificates", full_disk)
    with pytest.raises(ConfigError, match="No space left on device"):
        generate_keys(str(tmp_path / "new" / "keys"), ["first", "second"])
    assert files(tmp_path) == []                 # the key files and the folders it made are gone


def test_the_secret_is_private_while_it_is_written(tmp_path, monkeypatch):
    # pyzmq writes the key files with the process umask's mode; the secret must
    # not be readable by others even for the moment before it is chmod-ed
    real = zmq.auth.create_certificates
    modes = []

    def watched(key_dir, name):
        out = real(key_dir, name)
        modes.append(stat.S_IMODE(os.stat(f"{key_dir}/{name}.key_secret").st_mode))
        return out

    monkeypatch.setattr(zmq.auth, "create_certificates", watched)
    old = os.umask(0o022)
    try:
        generate_keys(str(tmp_path / "keys"), ["peer"])
    finally:
        os.umask(old)
    assert modes == [0o600]


def test_a_client_without_keys_is_told_the_coordinator_may_want_them(procs, tmp_path):
    # a coordinator with keys drops a client without them in silence: the error
    # asked only whether a coordinator was running there (it was); the peer's now
    # names the mismatch its handshake found
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs.start("coordinator", "--keys", str(kd), "--bind", addr, name="coordinator")
    wait_for(lambda: asyncio.run(query_status(addr, 0.5, str(kd))), 15, what="coordinator")
    p = procs.start("peer", "--coordinator", addr, "--set", "peer.join_timeout_s=1.0", name="nokeys")
    s = procs.start("status", "--coordinator", addr, "--timeout", "0.5", name="status")
    assert p.wait(20) == 2 and s.wait(20) == 2
    assert f"the handshake fails with {addr}: it runs with --keys and this peer without them" in procs.log(p)
    assert "a coordinator started with --keys answers only a client with --keys" in procs.log(s)


def test_a_secret_others_can_read_is_warned_about(tmp_path, caplog):
    # a key folder copied with a loose umask (scp, a shared drive) was used in silence
    kd = tmp_path / "keys"
    assert main(["keys", "generate", str(kd)]) == 0
    caplog.set_level("WARNING", logger="swarm.transport")
    Curve(str(kd), "peer")
    assert "chmod 600" not in caplog.text
    (kd / "peer.key_secret").chmod(0o644)
    Curve(str(kd), "peer")
    assert "peer.key_secret is readable or writable by others (mode 644)" in caplog.text
