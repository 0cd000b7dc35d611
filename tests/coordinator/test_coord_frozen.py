"""A standby whose other coordinator is frozen (SIGSTOP: its kernel still accepts
connections, the process never answers) takes it as down: the handshake that
times out is reported as "did not answer", not as other keys, and does not hold
the standby back; once the other answers again it says so."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from swarmtest import free_port, freeze, until, wait_for

from swarm import Coordinator
from swarm.cli import query_status
from swarm.coordinator import server
from swarm.transport import generate_keys


@pytest.mark.parametrize("keyed", [True, False], ids=["keys", "no keys"])
def test_a_frozen_other_coordinator_did_not_answer_it_has_no_other_keys(procs, tmp_path, caplog, monkeypatch,
                                                                        keyed):
    # the handshake that timed out 30 s later was reported as "most likely it runs with
    # another coordinator key pair" (or "with --keys")
    monkeypatch.setattr(server, "HANDSHAKE_TIMEOUT_S", 2.0)
    caplog.set_level("DEBUG", logger="swarm.coordinator")   # the watch's connection events too, should it fail
    kd = str(tmp_path / "keys") if keyed else ""
    if keyed:
        generate_keys(kd, ["coordinator", "peer"])
    primary, standby = sorted(f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    cp = procs.start("coordinator", "--bind", primary, "--others", standby, *(["--keys", kd] if keyed else []),
                     name="primary")
    wait_for(lambda: asyncio.run(query_status(primary, 1.0, kd))["mode"] == "active", 15,
             what="the primary active")
    freeze(cp.pid)
    try:
        async def main() -> None:
            c = Coordinator(bind=standby, others=[primary], keys_dir=kd, http_bind="")
            await c.start()
            try:
                await until(lambda: c.mode == "active", 10, what="the standby taking over")
                await until(lambda: "did not answer the handshake" in caplog.text, 15, what="the timed-out handshake")
                (other,) = c.status()["others"]
                assert other["state"] == "no answer", other
                assert other["error"].startswith("it accepts connections but did not answer the handshake within 2 s")
                assert "key pair" not in caplog.text and "runs with --keys" not in caplog.text
                assert "cannot talk to coordinator" not in caplog.text and c.mode == "active"

                os.kill(cp.pid, signal.SIGCONT)    # it answers again: the standby says so
                await until(lambda: c.status()["others"][0]["error"] == "", 15, what="its answer")
                assert f"{primary}: the handshake succeeds, after a handshake that timed out" in caplog.text
            finally:
                await c.close()

        asyncio.run(main())
    finally:
        os.kill(cp.pid, signal.SIGCONT)
        cp.kill()
        cp.wait()
