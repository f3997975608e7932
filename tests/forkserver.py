"""Test processes forked from one interpreter that has imported the SDK once: a fresh process each, cheaply.

Each stdio server, HTTP server or fleet process a test starts is a new Python that imports ``mcp`` (1.4 to
2.3 s of CPU) before it serves. Here one process per pytest worker, the zygote, imports the modules they
need once, and forks a child per process a test asks for. The child is a fresh process with its own
state, as a new interpreter would be: ``sys.argv``, the environment and the working directory are the
test's, and it runs the script or module as ``__main__``. The zygote reaps it and reports how it ended
(its exit code, or minus the signal that killed it, as ``subprocess.Popen.returncode`` does).

Two ways to ask for one:

- ``params(["tests/limits_server.py", "--many"], env)``, ``params(["-m", "dispatcher.testing", ...])`` or
  ``params(["-c", code])`` gives StdioServerParameters (`command` gives the same as a command line). The
  command is a small launcher (``python -S -I``, stdlib only, ~20 ms) that hands its stdin, stdout and
  stderr to the zygote over a Unix socket; the zygote forks the server on them. It answers on the pipes
  the client opened, exits when its stdin closes, and the launcher exits as it did (with its exit code,
  or killed by the same signal). The launcher forwards SIGTERM, SIGINT and
  SIGHUP to the child. The client's SIGKILL of its process group reaches the launcher alone; by then the
  client has closed the child's stdin, so the child ends. The pid the client knows is the launcher's: a
  test that kills a server by it starts it the ordinary way. The pid the server reports of itself
  (``os.getpid()``, as in a ledger) is the child's own, and a signal sent to it reaches the server (a
  SIGKILL ends it, and its launcher dies of the same signal; SIGSTOP and SIGCONT stall and resume it).
- ``spawn([sys.executable, "-m", "tests.fleet.agent", config], stdout=subprocess.PIPE, cwd=root)`` gives a
  `Forked`: the part of ``subprocess.Popen`` the tests use (``pid``, ``stdout``, ``poll``, ``wait``,
  ``send_signal``, ``terminate``, ``kill``, ``returncode``), for a child forked from the zygote. Its
  ``pid`` is the server's own, and signals go to it through a pidfd the zygote opened before the child
  could be reaped, so SIGKILL, SIGSTOP and SIGCONT reach the process itself and never a reused pid.
  In an event loop, ``await forked.exited()`` waits for it without blocking the loop.

Every forked child is a child of the zygote, not of the test's process: `zygote_pid()` says whose children
to look at for leftovers (tests/chaos/harness.py's `live_children`).

`start()` starts the zygote without waiting for it, `ready()` waits until it serves: tests/conftest.py
starts it once collection found a test marked ``subprocess``, and waits for it in such a test's setup, so
its start never falls inside a test's own timeout. Otherwise the first request starts it and waits. The
zygote exits when the pytest process that started it does (its stdin is a pipe from that process).
"""

from __future__ import annotations

import array
import atexit
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Iterator

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
    # The example workspace over HTTP (tests/fleet, tests/chaos) and the fleet's processes.
    "uvicorn",
    "uvicorn.config",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.h11_impl",
    "starlette.applications",
    "dispatcher.examples._http",
    "dispatcher.examples._workspace",
    "dispatcher.examples._models",
    "dispatcher.examples._ledger",
    "dispatcher.fleet",
    "redis.asyncio",
)
"""What the zygote imports before it forks: the SDK and what the processes of tests/ import."""


def _send(sock: socket.socket, payload: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(payload).encode()
    sock.sendmsg([struct.pack("!I", len(data)) + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, cmsg in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cmsg[: len(cmsg) - len(cmsg) % fds.itemsize])
    return list(fds)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fds = _fds_of(ancdata)
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            raise EOFError("the launcher went away mid-request")
        body += more
    return json.loads(body), fds


def _started_child(sock: socket.socket) -> tuple[int, int | None, bytes]:
    """The zygote's first answer: the child's pid and a pidfd of it (None where the kernel has none)."""
    data, ancdata, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(array.array("i").itemsize))
    fds = _fds_of(ancdata)
    while b"\n" not in data:
        more = sock.recv(64)
        if not more:
            raise EOFError("the fork server went away before the child started")
        data += more
    line, rest = data.split(b"\n", 1)
    return int(line), (fds[0] if fds else None), rest


def _read_line(sock: socket.socket, buffer: bytes) -> int | None:
    """The zygote's last answer, the child's return code (None if the zygote went away without one)."""
    while b"\n" not in buffer:
        try:
            more = sock.recv(64)
        except InterruptedError:  # pragma: no cover - PEP 475 retries recv
            continue
        if not more:
            return int(buffer) if buffer.strip() else None
        buffer += more
    return int(buffer.split(b"\n", 1)[0])


def _signal(pidfd: int | None, pid: int, signum: int) -> None:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:  # pragma: no cover - kernels before 5.3
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


# The launcher: stdlib only, started as `python -S -I forkserver.py launch <socket> <args...>`. -----------


def _launch(path: str, args: list[str]) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    _send(sock, {"args": args, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
    # The child holds the pipes now: the client sees EOF on stdout when the child exits, not when we do.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    try:
        child, pidfd, rest = _started_child(sock)
    except (EOFError, ValueError):
        return 1
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        _signal(pidfd, child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    code = _read_line(sock, rest)
    if code is None:
        return 1
    if code < 0:
        # Killed: die of the same signal, as the server would have.
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # pragma: no cover - a signal that does not end a process
    return code


# The zygote: imports the SDK once, forks a child per request. -----------------------------------------


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the process the request stands for."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args: list[str] = request["args"]
    code = 0
    try:
        import runpy

        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = request["cwd"]  # as `python -m` puts it first
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""  # as `python -c` puts it first
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
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
    os._exit(code)


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each ended child's requester how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:  # the requester is gone
            pass
        conn.close()


def _zygote(path: str) -> None:
    import importlib

    sys.path.insert(0, os.getcwd())
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an extra this venv lacks (redis in make adk's): a child imports what it needs
            pass
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # the wakeup socket says it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, sys.stdin, wake_read], [], [])
        if sys.stdin in readable:
            return  # the pytest process that started us is gone
        if wake_read in readable:
            try:
                while wake_read.recv(4096):
                    pass
            except BlockingIOError:
                pass
            _reap(children)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            for sock in (listener, wake_read, wake_write, conn, *children.values()):
                sock.close()
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        # Not reaped before this pidfd exists: it names this child, never a later process with its pid.
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        try:
            sent = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))] if pidfd is not None else []
            conn.sendmsg([f"{pid}\n".encode()], sent)
        except OSError:
            pass
        finally:
            if pidfd is not None:
                os.close(pidfd)
        children[pid] = conn
        _reap(children)


# The client side, in the pytest process. ------------------------------------------------------------

_started: tuple[subprocess.Popen[str], str] | None = None
_ready = False


def start() -> None:
    """Start this process's zygote if it is not running, without waiting for it to be ready."""
    global _started, _ready
    if _started is not None and _started[0].poll() is None:
        return
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
    atexit.register(_stop, process, directory)
    _started, _ready = (process, path), False


def ready() -> None:
    """Start this process's zygote if it is not running, and wait until it is ready."""
    _socket_path()


def _socket_path() -> str:
    """The zygote's socket, once it is ready (one zygote per pytest process, so one per xdist worker)."""
    global _ready
    start()
    assert _started is not None
    process, path = _started
    if not _ready:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the fork server did not start")
        _ready = True
    return path


def zygote_pid() -> int | None:
    """The pid of this process's zygote while it runs: the parent of every child it forked (for leak checks)."""
    if _started is None or _started[0].poll() is not None:
        return None
    return _started[0].pid


def _stop(process: subprocess.Popen[str], directory: str) -> None:
    """End the zygote (its stdin closes: it exits) and remove the directory of its socket."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()
    shutil.rmtree(directory, ignore_errors=True)


def params(args: list[str], env: dict[str, str] | None = None) -> StdioServerParameters:
    """StdioServerParameters for `python <args...>`, run by a child forked from the zygote."""
    from mcp import StdioServerParameters

    launch = [os.path.abspath(__file__), _LAUNCH, _socket_path(), *args]
    return StdioServerParameters(command=sys.executable, args=["-S", "-I", *launch], env=env)


def command(args: list[str]) -> str:
    """`params`' server as one shell-quoted command line (what ``dispatcher tune --stdio`` takes)."""
    import shlex

    launch = [sys.executable, "-S", "-I", os.path.abspath(__file__), _LAUNCH, _socket_path(), *args]
    return shlex.join(launch)


class Forked(subprocess.Popen[bytes]):
    """A child forked from the zygote, used as a `subprocess.Popen` of it (`spawn`).

    A Popen to the tests that take one (tests/fleet's), with what they use of it: ``pid``, ``stdout``,
    ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill`` and ``with``, and `exited` for an event
    loop. Popen's own ``__init__`` never runs (the zygote forked the child), and ``communicate`` is refused.
    """

    def __init__(self, args: list[str], conn: socket.socket, stdout: IO[bytes] | None) -> None:
        self.args = args
        self.stdin = None
        self.stdout = stdout
        self.stderr = None
        self.returncode = None
        self.text_mode = False
        self._conn = conn
        self.pid, self._pidfd, self._buffer = _started_child(conn)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        raise NotImplementedError("a forked child has a stdout pipe at most: read it, then wait()")

    def poll(self) -> int | None:
        """The return code if the child has ended, else None."""
        if self.returncode is None:
            readable, _, _ = select.select([self._conn], [], [], 0)
            if readable:
                self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end (at most `timeout` seconds) and return its return code."""
        if self.returncode is None:
            readable, _, _ = select.select([self._conn], [], [], timeout)
            if not readable:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    async def exited(self) -> int:
        """`wait`, in an anyio event loop (asyncio or trio) without blocking it: the child's return code."""
        import anyio

        if self.returncode is None:
            await anyio.wait_readable(self._conn)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def _finish(self) -> None:
        code = _read_line(self._conn, self._buffer)
        if code is None:
            raise RuntimeError(f"the fork server went away before child {self.pid} ended")
        self.returncode = code
        self._conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def send_signal(self, signum: int) -> None:
        """Signal the child itself (nothing, once it has ended)."""
        if self.returncode is None:
            _signal(self._pidfd, self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    args: list[str],
    *,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> Forked:
    """`subprocess.Popen(args, ...)` for ``args = [sys.executable, script_or_-m, ...]``, forked from the zygote.

    `stdin`, `stdout` and `stderr` are None (this process's own), ``subprocess.PIPE`` (stdout only) or
    ``subprocess.DEVNULL``.
    """
    if not args or args[0] != sys.executable or len(args) < 2:
        raise ValueError(f"spawn runs this interpreter on a script or a module, not {args!r}")
    sys.audit("subprocess.Popen", args[0], args, cwd, env)  # tests/markers.py sees it as a process start
    if stdin == subprocess.PIPE or stderr == subprocess.PIPE:
        raise ValueError("spawn gives a pipe for stdout alone")
    opened: list[int] = []

    def fd_for(choice: int | None, own: int, write: bool) -> int:
        if choice is None:
            return own
        if choice == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_WRONLY if write else os.O_RDONLY)
            opened.append(fd)
            return fd
        raise ValueError(f"unsupported stream choice {choice!r}")

    reader: IO[bytes] | None = None
    if stdout == subprocess.PIPE:
        read_end, write_end = os.pipe()
        opened.append(write_end)
        reader = open(read_end, "rb")
        out = write_end
    else:
        out = fd_for(stdout, 1, True)
    fds = [fd_for(stdin, 0, False), out, fd_for(stderr, 2, True)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_socket_path())
        request = {"args": args[1:], "env": dict(os.environ if env is None else env), "cwd": cwd or os.getcwd()}
        _send(sock, request, fds)
        return Forked(args, sock, reader)
    except BaseException:
        sock.close()
        if reader is not None:
            reader.close()
        raise
    finally:
        for fd in opened:
            os.close(fd)


def http_workspace(
    tmp_path: pathlib.Path, *options: str, latency: str | None = "0.03"
) -> Iterator[tuple[str, pathlib.Path]]:
    """The example workspace over HTTP with a ledger, forked: yields its URL and the ledger's path.

    tests/fleet/conftest.py's `workspace` fixtures, for about a tenth of their CPU (the zygote imported the
    SDK and uvicorn once); the fleet tests' modules override those fixtures with this.
    """
    ledger = tmp_path / "ledger.jsonl"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    process = spawn(
        [sys.executable, "-m", "dispatcher.examples.workspace", "--http", "--port", "0",
         *(["--latency", latency] if latency is not None else []), "--ledger", str(ledger), *options],
        stdout=subprocess.PIPE,
        cwd=root,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("MCP_URL="), f"the workspace did not start: {line!r}"
        yield line.strip().split("=", 1)[1], ledger
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


if __name__ == "__main__":
    if sys.argv[1] == _LAUNCH:
        sys.exit(_launch(sys.argv[2], sys.argv[3:]))
    _zygote(sys.argv[2])
