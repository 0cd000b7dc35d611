"""A script whose stdout stops taking its output (the reader of a pipe left, as `| head -1`
does; a full disk) ends as `swarm` does: exit status 1 and no traceback. Every script in
scripts/ printed a BrokenPipeError traceback and exited 1, or, one that prints only at its
end, Python's "Exception ignored ... BrokenPipeError" at exit, status 120."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
#: learning_bound prints a line at its start, then one per seed: the reader leaves between
LEARNING_BOUND = ["learning_bound", "--actors", "1", "--seeds", "0", "1", "--max-steps", "1000",
                  "--eval-every", "1000", "--eval-episodes", "1", "--set", "learning_starts=100"]
#: bench_compress prints all its lines at its end
BENCH_COMPRESS = ["bench_compress", "--sizes", "1000", "--reps", "1"]


def start(script: list[str], tmp: Path, stdout: object, buffered: bool = True) -> subprocess.Popen:
    """scripts/<name>.py in a session of its own (so that anything it started is ended with
    it), run as a user runs it: ``python scripts/<name>.py`` from the repository root, stdout
    block-buffered unless ``buffered`` is false (the tests' environment sets PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    name, *args = script
    with open(tmp / "stderr", "wb") as err:   # the child has its own copy
        return subprocess.Popen([sys.executable, f"scripts/{name}.py", *args], cwd=ROOT, env=env,
                                stdout=stdout, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)


def end(p: subprocess.Popen, timeout: float = 180) -> int:
    """The script's exit status; whatever of its session is still running is killed, by
    its group id (the script's pid), also when the wait fails."""
    try:
        return p.wait(timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def quiet(tmp: Path) -> str:
    """The script's stderr, checked to hold no traceback and no "Exception ignored"."""
    text = (tmp / "stderr").read_text(errors="replace")
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    return text


def test_a_script_whose_reader_leaves_after_its_first_line_exits_1_without_a_traceback(tmp_path):
    p = start(LEARNING_BOUND, tmp_path, subprocess.PIPE)
    try:
        assert p.stdout.readline().startswith(b"CartPole-v1: solved at"), quiet(tmp_path)
    finally:
        p.stdout.close()   # the reader leaves; the next line the script prints meets a closed pipe
        code = end(p)
    assert quiet(tmp_path) == ""   # the reader chose to leave: nothing to say about it
    assert code == 1


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_script_that_prints_at_its_end_to_a_pipe_whose_reader_left_exits_1_without_a_traceback(buffered, tmp_path):
    """Buffered, the script's lines failed only at exit: "Exception ignored", status 120."""
    read, write = os.pipe()
    os.close(read)   # the reader left before the first line
    try:
        p = start(BENCH_COMPRESS, tmp_path, write, buffered)
    finally:
        os.close(write)
    code = end(p)
    assert quiet(tmp_path) == ""
    assert code == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_script_whose_stdout_is_a_full_disk_says_so_in_one_line_and_exits_1(tmp_path):
    with open("/dev/full", "wb") as full:
        p = start(BENCH_COMPRESS, tmp_path, full)
    code = end(p)
    assert quiet(tmp_path) == "bench_compress: cannot write to stdout (No space left on device); output lost\n"
    assert code == 1


def run_main(tmp: Path, body: str, **popen: object) -> subprocess.CompletedProcess:
    """A script of its own whose ``main`` is ``body``, ended through run_script."""
    script = tmp / "script.py"
    script.write_text("import socket\nfrom swarm.scripting import run_script\n\ndef main():\n"
                      + "".join(f"    {line}\n" for line in body.splitlines())
                      + "\nrun_script(main, 'script')\n")
    return subprocess.run([sys.executable, str(script)], cwd=tmp, stderr=subprocess.PIPE, text=True,
                          timeout=60, **popen)


def test_a_broken_pipe_of_the_scripts_own_still_ends_it_with_its_traceback(tmp_path):
    """Only stdout's failure is the reader leaving; a BrokenPipeError from a socket or a
    child's pipe is the script's own error and is not hidden."""
    p = run_main(tmp_path, "print('started')\na, b = socket.socketpair()\nb.close()\na.send(b'x')",
                 stdout=subprocess.PIPE)
    assert p.returncode == 1 and p.stdout == "started\n", p
    assert "Traceback" in p.stderr and p.stderr.rstrip().endswith("BrokenPipeError: [Errno 32] Broken pipe"), p.stderr


def test_a_script_run_with_stdout_closed_prints_nowhere_and_ends_as_main_does(tmp_path):
    """``>&-``: Python has no sys.stdout; print() then goes nowhere, as it does without run_script."""
    p = run_main(tmp_path, "print('nowhere')\nreturn 3", preexec_fn=lambda: os.close(1))
    assert (p.returncode, p.stderr) == (3, "")


def _main_block(path: Path) -> ast.If:
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            return node
    raise AssertionError(f"{path.name} has no `if __name__ == '__main__':` block")


@pytest.mark.parametrize("path", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.stem)
def test_every_script_ends_through_run_script(path):
    """One shared ending for every script, so that a script added later does not miss it:
    the last statement of its ``__main__`` block is ``run_script(<its main>, "<its name>")``."""
    call = _main_block(path).body[-1]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call), ast.unparse(call)
    assert ast.unparse(call.value.func) == "run_script", ast.unparse(call)
    assert [ast.literal_eval(a) for a in call.value.args[1:]] == [path.stem], ast.unparse(call)
