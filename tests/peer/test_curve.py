"""CurveZMQ: with keys, only listed keys get in; without a key or with a wrong
one a client gets nothing and changes nothing."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from swarm import wire
from swarm.cli import query_status
from swarm.coordinator import Coordinator
from swarm.errors import ConfigError, MembershipError, SwarmError
from swarm.peer import Peer
from swarm.transport import Curve, generate_keys


@pytest.fixture
def keys(tmp_path):
    generate_keys(str(tmp_path / "keys"), ["coordinator", "peer", "other"])
    # "intruder" has a well-formed key pair that is not on the allow-list
    generate_keys(str(tmp_path / "evil"), ["coordinator", "intruder"])
    (tmp_path / "keys" / "other.key").unlink()            # "other" exists but is not authorized
    (tmp_path / "keys" / "authorized" / "other.key").unlink()
    return tmp_path


def test_curve_swarm_works_and_refuses_strangers(keys):
    kd = str(keys / "keys")

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=kd) as coord:
            a = Peer(id="a", coordinators=[coord.address], keys_dir=kd, key_name="peer")
            b = Peer(id="b", coordinators=[coord.address], keys_dir=kd, key_name="peer")
            got: list[str] = []
            b.on("secret", lambda m: got.append(m.body["x"]))
            async with a, b:
                await a.wait_view(lambda v: len(v.members) == 2)
                await a.wait_linked()
                assert all(m.key for m in a.view.members)     # keys travel in the view
                assert await a.send("b", "secret", {"x": "hi"}, timeout=1)
                for _ in range(100):
                    if got:
                        break
                    await asyncio.sleep(0.02)
                assert got == ["hi"]
                epoch = coord.table.epoch

                # a peer with no key: the coordinator never hears it
                with pytest.raises(MembershipError, match="no coordinator answered"):
                    async with Peer(id="nokey", coordinators=[coord.address], join_timeout_s=1.0):
                        pass
                # a peer whose key is not on the allow-list: same
                with pytest.raises(MembershipError, match="no coordinator answered"):
                    async with Peer(id="evil", coordinators=[coord.address], join_timeout_s=1.0,
                                    keys_dir=str(keys / "evil"), key_name="intruder"):
                        pass
                # raw plaintext and raw CURVE-with-wrong-key clients aimed at a peer's ROUTER
                ctx = zmq.asyncio.Context()
                plain = ctx.socket(zmq.DEALER)
                plain.linger = 0
                plain.connect(b.address)
                await plain.send_multipart(wire.encode("secret", "evil", body={"x": "plain"}))
                wrong = ctx.socket(zmq.DEALER)
                wrong.linger = 0
                Curve(str(keys / "evil"), "intruder").client(wrong, b.view.member("b").key)
                wrong.connect(b.address)
                await wrong.send_multipart(wire.encode("secret", "evil", body={"x": "wrong key"}))
                await asyncio.sleep(0.5)
                plain.close(0)
                wrong.close(0)
                ctx.term()
                assert got == ["hi"]                               # nothing got through
                assert coord.table.epoch == epoch                  # and nothing changed
                assert set(coord.table.members) == {"a", "b"}
                # status needs a listed key too
                st = await query_status(coord.address, 2.0, kd, "peer")
                assert st["epoch"] == epoch
                with pytest.raises(SwarmError, match="no coordinator answered"):
                    await query_status(coord.address, 0.5)

    asyncio.run(main())


def test_missing_keys_are_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="swarm keys generate"):
        Curve(str(tmp_path / "nothing"), "peer")
    generate_keys(str(tmp_path / "k"), ["coordinator"])
    with pytest.raises(ConfigError, match=r"create keys with `swarm keys generate .*k --names peer`"):
        Curve(str(tmp_path / "k"), "peer")   # the folder is there: the command that adds the pair
    with pytest.raises(ConfigError, match="is not a folder"):
        Curve(str(tmp_path / "k" / "coordinator.key"), "peer")
    with pytest.raises(SwarmError, match="refusing to overwrite"):
        generate_keys(str(tmp_path / "k"), ["coordinator"])
