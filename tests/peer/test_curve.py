"""CurveZMQ: with keys, only listed keys get in; without a key or with a wrong
one a client gets nothing and changes nothing."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio
from swarmtest import until

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


def test_a_listed_key_cannot_speak_for_another_member(tmp_path):
    # hostA is on the allow-list, yet B's id belongs to the key B joined with. B's
    # incarnation is no secret (status shows it): a join with it once re-pointed B's
    # address and key at A's, and a leave with it took B out of the view.
    kd = str(tmp_path / "keys")
    generate_keys(kd, ["coordinator", "hostA", "hostB", "hostC"])

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=kd, http_bind="") as coord:
            b = Peer(id="B", coordinators=[coord.address], keys_dir=kd, key_name="hostB")
            c = Peer(id="C", coordinators=[coord.address], keys_dir=kd, key_name="hostC")
            got: list[str] = []
            c.on("note", lambda m: got.append(m.body["x"]))
            async with b, c:
                await c.wait_view(lambda v: len(v.members) == 2)
                await b.wait_linked()
                rec = coord.table.get("B")
                key, addr, epoch, bad = rec.key, rec.addr, coord.table.epoch, coord.malformed
                st = await query_status(coord.address, 2.0, kd, "hostA")
                inc = next(r["incarnation"] for r in st["members"] if r["id"] == "B")

                ctx = zmq.asyncio.Context()
                a, d = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
                a.linger = d.linger = 0
                try:
                    me = Curve(kd, "hostA")
                    me.client(a, me.coordinator_public)
                    a.connect(coord.address)
                    await a.send_multipart(wire.encode("join", "B", body={
                        "addr": "tcp://127.0.0.1:1", "rank": -1, "inc": inc, "last_epoch": 0}))
                    answer = wire.decode(await asyncio.wait_for(a.recv_multipart(), 5))
                    assert answer.t == "refuse" and "another CURVE key" in answer.body["reason"]
                    for t, body in (("heartbeat", {"inc": inc, "linked": 0}), ("leave", {"inc": inc}),
                                    ("linked", {"e": epoch + 5}), ("probe_ack", {"nonce": 1, "inc": inc})):
                        await a.send_multipart(wire.encode(t, "B", epoch=epoch, body=body))
                    await until(lambda: coord.malformed == bad + 4, what="the four spoofed messages dropped")

                    # a message to C whose src says B, sent with A's (listed) key
                    me.client(d, c.view.member("C").key)
                    d.connect(c.address)
                    await d.send_multipart(wire.encode("note", "B", body={"x": "forged"}))
                    assert await b.send("C", "note", {"x": "real"}, timeout=1)
                    await until(lambda: "real" in got, what="B's own message")
                    await asyncio.sleep(0.3)
                finally:
                    a.close(0)
                    d.close(0)
                    ctx.term()

                assert got == ["real"]
                assert (rec.key, rec.addr, rec.state, rec.linked_epoch) == (key, addr, "alive", epoch)
                assert coord.table.epoch == epoch and c.view.member("B").key == key
                assert b.state.value == "running"

    asyncio.run(main())


def test_a_key_added_or_removed_while_the_swarm_runs_counts_at_once(tmp_path):
    # `swarm keys generate DIR --names host2` on a running swarm: the allow-list was
    # read once at start, so host2 stayed out until every process was restarted
    kd = tmp_path / "keys"
    generate_keys(str(kd), ["coordinator", "peer"])

    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*", keys_dir=str(kd), http_bind="") as coord:
            async with Peer(id="a", coordinators=[coord.address], keys_dir=str(kd)) as a:
                generate_keys(str(kd), ["host2"])
                async with Peer(id="b", coordinators=[coord.address], keys_dir=str(kd), key_name="host2",
                                join_timeout_s=5.0) as b:
                    await a.wait_view(lambda v: len(v.members) == 2)
                    await b.wait_linked()          # a's ROUTER admitted host2 too
                    await a.wait_linked()
                (kd / "authorized" / "host2.key").unlink()
                with pytest.raises(SwarmError, match="no coordinator answered"):
                    await query_status(coord.address, 1.0, str(kd), "host2")
                assert (await query_status(coord.address, 2.0, str(kd), "peer"))["epoch"] >= 2

    asyncio.run(main())
