"""The exceptions `dispatcher` raises, for mistakes of the caller.

A tool call that fails is not an exception: it is a `ToolResult` with a status. Exceptions are
kept for misuse of the API, and they all derive from one base class::

    DispatcherError
    ├── BatchError (also ValueError)       a batch that cannot run: duplicate ids, non-ToolCall items
    ├── ConfigurationError (also ValueError)  a tool or server that cannot be registered
    ├── DispatcherClosedError (also RuntimeError)  the dispatcher is not open
    ├── NotFinishedError (also RuntimeError)  a result was read before its call ended
    └── ServerConnectionError (also ConnectionError)  `Dispatcher.connect` could not reach a server

Errors that come from the MCP SDK or anyio while a call runs are translated into results at the
boundary; cancellation is never caught or converted.
"""

from __future__ import annotations


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
