"""The `swarm` command's entry point (pyproject.toml's [project.scripts], swarm/__main__.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import tomllib

from swarmtest import ROOT


def test_ctrl_c_while_the_command_line_is_imported_exits_130_quietly():
    """A Ctrl-C in the first tenth of a second of any `swarm` command, while Python imported
    swarm.cli, ended in a KeyboardInterrupt traceback; so did one in the first 16-49 ms,
    while it imported the package `swarm` (swarm/__init__.py imported swarm.config), which
    the installed `swarm` script imports before the entry point's own code runs. The child
    does what that script does with the entry point pyproject.toml names, with the first
    import made on the way slow, so that the SIGINT lands in it every time."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["swarm"]
    module, func = entry.split(":")
    code = textwrap.dedent(f"""
        import sys, time

        class SlowImport:
            # a meta path finder that sees each import first: a slow disk, say. The first
            # one past `swarm` and the entry point's own module is held.
            def find_spec(self, name, path=None, target=None):
                if "swarm" in sys.modules and name not in ("swarm", "{module}"):
                    print("importing", name, flush=True)
                    time.sleep(60)
                return None

        sys.meta_path.insert(0, SlowImport())
        from {module} import {func}
        sys.exit({func}())
    """)
    p = subprocess.Popen([sys.executable, "-c", code, "status"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert p.stdout.readline().startswith("importing ")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, err
    assert "Traceback" not in err and len(err.splitlines()) <= 1, err


def test_python_dash_m_swarm_runs_the_command_line():
    p = subprocess.run([sys.executable, "-m", "swarm", "--help"], capture_output=True, text=True, timeout=30,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: swarm ")


def test_the_package_imports_nothing_until_a_name_or_submodule_is_used():
    # `import swarm` imported swarm.config and swarm.errors itself; now nothing (a Ctrl-C
    # while the script imports it ended in a traceback), and `swarm.errors.X` and
    # `swarm.config.X` still work without importing those submodules by name.
    code = ("import sys, swarm\n"
            "assert sorted(m for m in sys.modules if m.startswith('swarm')) == ['swarm']\n"
            "lazy = swarm.errors.WireError\n"
            "from swarm.errors import WireError\n"
            "assert lazy is WireError and swarm.WireError is WireError\n"
            "assert swarm.config.SwarmConfig is swarm.SwarmConfig\n"
            "assert swarm.wire.decode and swarm.gossip.Gossip\n"
            "try:\n"
            "    swarm.nothing\n"
            "except AttributeError as e:\n"
            "    assert \"no attribute 'nothing'\" in str(e)\n"
            "else:\n"
            "    raise SystemExit('swarm.nothing did not raise')\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
