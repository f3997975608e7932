"""Stdio servers forked from one interpreter that has imported the SDK once: a fresh process each, cheaply.

Each stdio server a test starts is a new Python that imports ``mcp`` (1.4 to 2.3 s of CPU) before it
serves. Here one process per pytest worker, the zygote, imports the server modules once; a stdio server
is then a small launcher (``python -S -I``, stdlib only, ~20 ms) that hands its stdin, stdout and stderr
to the zygote over a Unix socket, and the zygote forks a child that runs the server on them. The child
is a fresh process with the server's own state, as a new interpreter would be: it answers on the pipes
the client opened, exits when its stdin closes, and the launcher exits with it (with its exit code).
The launcher forwards SIGTERM, SIGINT and SIGHUP to the child. The client's SIGKILL of its process
group reaches the launcher alone; by then the client has closed the child's stdin, so the child ends.
Tests that kill a server themselves keep a server started the ordinary way.

``params(["tests/limits_server.py", "--many"], env)`` or ``params(["-m", "dispatcher.testing", ...])``
gives the StdioServerParameters. The zygote exits when the pytest process that started it does (its
stdin is a pipe from that process).
"""

from __future__ import annotations

import array
import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp import StdioServerParameters

_LAUNCH = "launch"
_ZYGOTE = "zygote"
_PRELOAD = (
    "anyio",
    "trio",
    "mcp",
    "mcp.types",
    "mcp.server.mcpserver",
    "mcp.client",
    "mcp_types.version",
    "dispatcher",
    "dispatcher.testing",
)
"""What the zygote imports before it forks: the SDK and what the servers in tests/ import."""


def _send(sock: socket.socket, payload: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(payload).encode()
    sock.sendmsg([struct.pack("!I", len(data)) + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, cmsg in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cmsg[: len(cmsg) - len(cmsg) % fds.itemsize])
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            raise EOFError("the launcher went away mid-request")
        body += more
    return json.loads(body), list(fds)


# The launcher: stdlib only, started as `python -S -I forkserver.py launch <socket> <args...>`. -----------


def _launch(path: str, args: list[str]) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    _send(sock, {"args": args, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
    # The child holds the pipes now: the client sees EOF on stdout when the child exits, not when we do.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    pid_line = b""
    while not pid_line.endswith(b"\n"):
        more = sock.recv(64)
        if not more:
            return 1
        pid_line += more
    child = int(pid_line)
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = b""
    while True:
        try:
            more = sock.recv(64)
        except InterruptedError:  # pragma: no cover - PEP 475 retries recv
            continue
        if not more:
            break
        status += more
    if status.strip():
        return int(status)
    # The child died without saying how: killed. Die of the signal we forwarded, as the server would have.
    if forwarded:
        signal.signal(forwarded[-1], signal.SIG_DFL)
        os.kill(os.getpid(), forwarded[-1])
    return 1


# The zygote: imports the SDK once, forks a server per launcher. --------------------------------------


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the server process the launcher stands for."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    conn.sendall(f"{os.getpid()}\n".encode())
    args: list[str] = request["args"]
    code = 0
    try:
        import runpy

        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the client may have closed the pipe
            pass
    try:
        conn.sendall(f"{code}\n".encode())
    finally:
        os._exit(code)


def _zygote(path: str) -> None:
    import importlib

    sys.path.insert(0, os.getcwd())
    for name in _PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable:
            return  # the pytest process that started us is gone
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            _child(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


# The client side, in the pytest process. ------------------------------------------------------------

_started: tuple[subprocess.Popen[str], str] | None = None


def _socket_path() -> str:
    """The zygote's socket, started on first use (one per pytest process, so one per xdist worker)."""
    global _started
    if _started is not None and _started[0].poll() is None:
        return _started[1]
    directory = tempfile.mkdtemp(prefix="dispatcher-fork-")
    path = os.path.join(directory, "zygote.sock")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), _ZYGOTE, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise RuntimeError("the stdio fork server did not start")
    atexit.register(_stop, process)
    _started = (process, path)
    return path


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def params(args: list[str], env: dict[str, str] | None = None) -> StdioServerParameters:
    """StdioServerParameters for `python <args...>`, run by a child forked from the zygote."""
    from mcp import StdioServerParameters

    launch = [os.path.abspath(__file__), _LAUNCH, _socket_path(), *args]
    return StdioServerParameters(command=sys.executable, args=["-S", "-I", *launch], env=env)


if __name__ == "__main__":
    if sys.argv[1] == _LAUNCH:
        sys.exit(_launch(sys.argv[2], sys.argv[3:]))
    _zygote(sys.argv[2])
