"""Shared fixtures. Helpers live in swarmtest.py (importable from tests)."""

import asyncio
import io
import signal
from pathlib import Path

import pytest
from swarmtest import Procs


def pytest_configure(config):
    _default_signals()
    _asyncio_tasks_on_timeout()


def _default_signals() -> None:
    """Run under nohup, or as a background job of a shell, this process and every child it
    starts would ignore SIGHUP or SIGINT, and the tests of how swarm ends on them (a closed
    terminal, Ctrl-C) would wait out their timeouts: give both their defaults back."""
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, handler)


def _asyncio_tasks_on_timeout() -> None:
    """A test that times out inside ``asyncio.run`` shows, in pytest-timeout's dump, only
    its loop waiting in ``select``: print the loop's tasks too, each with the line it
    awaits on, so that the await that never returned is named."""
    try:
        import pytest_timeout
    except ImportError:
        return
    threads = pytest_timeout.dump_stacks

    def dump_stacks(terminal) -> None:
        threads(terminal)
        loop = asyncio._get_running_loop()   # the hung test's, on the thread the timeout interrupted
        if loop is None:
            return
        for task in asyncio.all_tasks(loop):
            out = io.StringIO()
            task.print_stack(file=out)
            terminal.sep("~", title=f"asyncio task {task.get_name()}")
            terminal.write(out.getvalue())

    pytest_timeout.dump_stacks = dump_stacks


@pytest.fixture
def procs(tmp_path: Path):
    """Start `swarm` subprocesses; every one is ended by its pid at teardown."""
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


@pytest.fixture
def syns_dropped_when_full():
    """Skip where the kernel answers a connection to a full accept queue (a reset, or a
    SYN cookie) instead of dropping it: there a full queue does not play a vanished host
    (swarmtest.vanish)."""
    from swarmtest import answered, free_port, vanish

    addr = ("127.0.0.1", free_port())
    sockets = vanish(addr)
    try:
        if answered(addr, 0.5):
            pytest.skip("this kernel answers connections to a listener whose accept queue is full")
    finally:
        for s in sockets:
            s.close()
