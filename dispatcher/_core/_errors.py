"""Every exception of the package, in one tree.

A tool call that fails is not an exception: it is a `ToolResult` with a status. Exceptions the caller
sees are kept for misuse of the API, and they all derive from one base class::

    DispatcherError
    ├── BatchError (also ValueError)       a batch that cannot run: duplicate ids, non-ToolCall items
    ├── ConfigurationError (also ValueError)  a tool or server that cannot be registered
    ├── DispatcherClosedError (also RuntimeError)  the dispatcher is not open
    ├── NotFinishedError (also RuntimeError)  a result was read before its call ended
    ├── ServerConnectionError (also ConnectionError)  `Dispatcher.connect` could not reach a server
    ├── CoordinationError                  a fleet hold was not granted (`dispatcher.fleet`; the call's text)
    └── FleetTuneError                     `tune --fleet`: a process of the fleet failed

The others are signals inside the package: each is raised where a failure is found and turned into a
call's result (or the command line's exit status) at one place, and none reaches the caller::

    Exception
    ├── ArgumentError                      arguments the tool would reject: FAILED, never sent
    ├── KeyRuleError                       a call's conflict keys could not be computed: FAILED, never sent
    ├── ToolUnavailableError               not sent: the tool is blocked or removed, its server unreachable
    │   └── AuthenticationRequired         an HTTP server answered 401 or 403
    ├── ConnectionLost                     the connection was lost while the call ran: its effect is unknown
    ├── TaskFailed                         a task-augmented call ended without a result
    └── UsageError                         a mistake on the command line: exit status 2
    RuntimeError
    └── LifecycleError                     a transition the call lifecycle does not allow: a bug, never an outcome

Errors that come from the MCP SDK or anyio while a call runs are translated into results at the
boundary (`dispatcher._mcp._failures`); cancellation is never caught or converted.
"""

from __future__ import annotations

from ._calls import CallStatus

__all__ = [
    "ArgumentError",
    "AuthenticationRequired",
    "BatchError",
    "ConfigurationError",
    "ConnectionLost",
    "CoordinationError",
    "DispatcherClosedError",
    "DispatcherError",
    "FleetTuneError",
    "KeyRuleError",
    "LifecycleError",
    "NotFinishedError",
    "ServerConnectionError",
    "TaskFailed",
    "ToolUnavailableError",
    "UsageError",
]


class DispatcherError(Exception):
    """Base class of every exception `dispatcher` raises."""


class BatchError(DispatcherError, ValueError):
    """A batch was rejected before anything in it ran."""


class ConfigurationError(DispatcherError, ValueError):
    """A tool, server or setting cannot be registered as given."""


class DispatcherClosedError(DispatcherError, RuntimeError):
    """The dispatcher was used outside its `async with` block."""


class NotFinishedError(DispatcherError, RuntimeError):
    """A result was read before its call ended: await `PendingCall.wait()` or `Batch.wait()` first."""


class ServerConnectionError(DispatcherError, ConnectionError):
    """A server could not be connected to (or listed) when it was registered.

    Later connection losses are not exceptions: the calls they affect get results, and the dispatcher
    reconnects for the calls after them.
    """


class CoordinationError(DispatcherError):
    """A fleet-wide hold could not be granted; the call it was for settles FAILED with this text."""


class FleetTuneError(DispatcherError):
    """A process of the fleet failed; the sweep stops."""


class ArgumentError(Exception):
    """Arguments that the tool would reject: the call is FAILED without running."""


class KeyRuleError(Exception):
    """A call's keys could not be computed: the call fails without running."""


class ToolUnavailableError(Exception):
    """A call that was not sent: its tool is blocked or removed, or its server cannot be reached."""


class AuthenticationRequired(ToolUnavailableError):
    """An HTTP server refused the connection as unauthenticated (401) or forbidden (403); it says what it asked for."""


class ConnectionLost(Exception):
    """A call's connection was lost while it ran (confirmed by the connection layer); its outcome is unknown."""


class TaskFailed(Exception):
    """A task-augmented call that ended without a result: the server cancelled or lost the task, or its bound passed.

    `status` is the call's status: TIMEOUT for a task cut off at its bound and cancelled on the server,
    FAILED otherwise (a task whose cancellation the server did not confirm says that its outcome is unknown).
    """

    def __init__(self, message: str, status: CallStatus = CallStatus.FAILED) -> None:
        super().__init__(message)
        self.status = status


class UsageError(Exception):
    """A mistake on the command line: the command exits 2 with this message on one line."""


class LifecycleError(RuntimeError):
    """A transition the lifecycle does not allow: a bug of the driver, never a call's outcome."""
