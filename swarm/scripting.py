"""How a script in scripts/ ends: the same exit statuses as `swarm` itself.

- 130 and one line on stderr (``NAME: interrupted``) for Ctrl-C, once the script's
  finally blocks have ended what it started;
- 1 and no traceback when stdout cannot be written: the reader of a pipe left
  (``python scripts/learning_bound.py | head -1``) or the disk is full. From then on
  stdout goes to /dev/null, so that the finally blocks that print still run to their end
  and nothing fails again at exit. A full disk is named on stderr; the reader leaving is
  not, since it chose to;
- otherwise what ``main`` returns (``None``: 0), or what it raises.

Each script ends with::

    if __name__ == "__main__":
        run_script(main, "bench_compress")
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Any, Callable, NoReturn

__all__ = ["run_script"]


class _Stdout:
    """``sys.stdout``, whose failed writes are marked as stdout's: a BrokenPipeError can
    also come from a socket or a child's pipe, which is an error of the script's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise self._failed(e)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise self._failed(e)

    def _failed(self, e: OSError) -> OSError:
        # what is still buffered then goes nowhere, instead of failing again at exit
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        e.swarm_stream = "stdout"  # type: ignore[attr-defined]
        return e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_script(main: Callable[[], int | None], name: str) -> NoReturn:
    """Run a script's ``main`` and exit with its status (see the module's docstring);
    ``name`` is the script's, for the lines on stderr."""
    if sys.stdout is None:   # fd 1 closed (`>&-`): the prints go nowhere, as Python has them do
        sys.stdout = open(os.devnull, "w")
    stdout = sys.stdout = _Stdout(sys.stdout)
    try:
        code = main()
        stdout.flush()   # what is still buffered fails here, not at exit
    except KeyboardInterrupt:   # Ctrl-C: the finally blocks have ended what main started
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)   # 128 + SIGINT, as a shell reports it
    except OSError as e:
        if getattr(e, "swarm_stream", None) != "stdout":
            raise
        if e.errno != errno.EPIPE:
            print(f"{name}: cannot write to stdout ({e.strerror or e}); output lost", file=sys.stderr)
        sys.exit(1)
    finally:
        # main's own SystemExit (argparse's 2, SIGTERM's 143) keeps its status: what stdout
        # cannot take then goes to /dev/null here, instead of failing at exit
        with contextlib.suppress(OSError):
            stdout.flush()
    sys.exit(code)
