"""How a script in scripts/ ends: the same exit statuses as `swarm` itself.

- 130 and one line on stderr (``NAME: interrupted``) for Ctrl-C, once the script's
  finally blocks have ended what it started;
- 1 and no traceback when stdout cannot be written: the reader of a pipe left
  (``python scripts/learning_bound.py | head -1``) or the disk is full. From then on
  stdout goes to /dev/null, so that the finally blocks that print still run to their end
  and nothing fails again at exit. A full disk is named on stderr; the reader leaving is
  not, since it chose to;
- 143 for SIGTERM (a ``timeout``, a job runner), taken as SystemExit: the finally blocks
  that end the processes the script started still run (killed outright, they were left
  behind); a ``swarm run`` inside takes SIGTERM over while it lasts and ends its own;
- otherwise what ``main`` returns (``None``: 0), or what it raises.

Each script ends with::

    if __name__ == "__main__":
        run_script(main, "bench_compress")
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import Any, Callable, NoReturn

from .cli import _output_failed, _Stream, _to_devnull

__all__ = ["run_script", "check_seeds"]


class _Stdout(_Stream):
    """`swarm`'s stdout (a failed write is marked as stdout's: a BrokenPipeError can also
    come from a socket or a child's pipe, an error of the script's own), which also points
    fd 1 at /dev/null at its first failure: the finally blocks that print then run to
    their end (they end the processes the script started)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream, "stdout")

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except OSError:
            _to_devnull(1)
            raise

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            _to_devnull(1)
            raise


def run_script(main: Callable[[], int | None], name: str) -> NoReturn:
    """Run a script's ``main`` and exit with its status (see the module's docstring);
    ``name`` is the script's, for the lines on stderr."""
    if sys.stdout is None:   # fd 1 closed (`>&-`): the prints go nowhere, as Python has them do
        sys.stdout = open(os.devnull, "w")
    stdout = sys.stdout = _Stdout(sys.stdout)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        code = main()
        stdout.flush()   # what is still buffered fails here, not at exit
    except KeyboardInterrupt:   # Ctrl-C: the finally blocks have ended what main started
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)   # 128 + SIGINT, as a shell reports it
    except OSError as e:
        if getattr(e, "swarm_stream", None) != "stdout":
            raise
        sys.exit(_output_failed(e, name))
    finally:
        # main's own SystemExit (argparse's 2, SIGTERM's 143) keeps its status: what stdout
        # cannot take then goes to /dev/null here, instead of failing at exit
        with contextlib.suppress(OSError):
            stdout.flush()
    sys.exit(code)


def check_seeds(ap: argparse.ArgumentParser, seeds: list[int]) -> None:
    """Refuse (argparse's exit 2) ``--seeds`` with a negative or a repeated seed: a repeated
    one would run again and count as another seed in every mean."""
    if min(seeds) < 0:
        ap.error("--seeds must be >= 0")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        ap.error(f"--seeds repeats seed {', '.join(map(str, repeated))}: each seed is one run, counted once")
