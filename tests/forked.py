"""`subprocess.run` for a Python command line, its process forked from tests/forkserver.py's zygote.

A command-line test (`python -m dispatcher ...`, `python -c README_EXAMPLE`) then costs about 0.2 s of CPU
instead of a fresh interpreter's 1.5 to 2.5 s (it imports the SDK). The child is still a process of its
own, run as ``python`` runs the script, module or code (tests/forkserver.py): its exit code, its stdout,
its environment and working directory are its own.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from tests import forkserver


def run(
    args: list[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``[sys.executable, ...args]`` to its end; return its exit code and its stdout (text).

    Its stdin is empty. Its stderr is this process's (under pytest, the test's captured stderr, shown when
    the test fails), so the result's `stderr` is None. Past `timeout` seconds the child is killed and
    `subprocess.TimeoutExpired` raised, as `subprocess.run` does.
    """
    if not args or args[0] != sys.executable:
        raise ValueError(f"run starts this interpreter, not {args!r}")
    process = forkserver.spawn(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        cwd=None if cwd is None else os.fspath(cwd),
        env=env,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    try:
        fd = process.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(args, timeout, b"".join(chunks))
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        code = process.wait(max(deadline - time.monotonic(), 0.1))
    except BaseException:
        process.kill()
        process.wait(30)
        raise
    finally:
        process.stdout.close()
    return subprocess.CompletedProcess(args, code, b"".join(chunks).decode(), None)
