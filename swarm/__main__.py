"""The entry point of the `swarm` command (pyproject.toml) and of ``python -m swarm``.

It imports :mod:`swarm.cli` inside a ``try``: a Ctrl-C that comes while Python is
still importing it (the first tenth of a second or so, more from a cold disk)
ends `swarm` as one that comes later does, with exit status 130 and no
traceback. (The package ``swarm`` is imported before this module runs, out of
reach of this ``try``: its ``__init__`` imports nothing for that reason. Nor does this
module before the ``try``, but ``sys``, which is built in: ``from __future__ import
annotations`` here was a real import on Python 3.12 and later, and a Ctrl-C in it
printed a traceback.)
"""

import sys


def main() -> int:
    """Run the `swarm` command line (:func:`swarm.cli.main`); returns its exit status."""
    try:
        from .cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:   # before cli.main's own handler was there to catch it
        return 130


if __name__ == "__main__":
    sys.exit(main())
