"""dispatcher: run the tool calls a model asks for, safely and fast.

Read-only calls run together; calls that may mutate run alone, in the order the model asked; what a tool
may do is read from its MCP annotations, and only from servers the user trusts.
"""

from ._approval import ApprovalPolicy as ApprovalPolicy
from ._approval import ApprovalRequest as ApprovalRequest
from ._approval import SessionGuard as SessionGuard
from ._batch import Batch as Batch
from ._batch import PendingCall as PendingCall
from ._calls import CallStatus as CallStatus
from ._calls import Effect as Effect
from ._calls import ToolCall as ToolCall
from ._calls import ToolResult as ToolResult
from ._catalog import ToolEntry as ToolEntry
from ._dispatcher import Dispatcher as Dispatcher
from ._errors import BatchError as BatchError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import DispatcherClosedError as DispatcherClosedError
from ._errors import DispatcherError as DispatcherError
from ._errors import NotFinishedError as NotFinishedError
from ._errors import ServerConnectionError as ServerConnectionError
from ._idempotency import IdempotencyKeys as IdempotencyKeys
from ._observe import CallEvent as CallEvent
from ._pins import DefinitionChange as DefinitionChange
from ._reconnect import ReconnectPolicy as ReconnectPolicy
from ._retry import RetryPolicy as RetryPolicy
from ._version import __version__ as __version__

__all__ = [
    "ApprovalPolicy",
    "ApprovalRequest",
    "Batch",
    "BatchError",
    "CallEvent",
    "CallStatus",
    "ConfigurationError",
    "DefinitionChange",
    "Dispatcher",
    "DispatcherClosedError",
    "DispatcherError",
    "Effect",
    "IdempotencyKeys",
    "NotFinishedError",
    "PendingCall",
    "ReconnectPolicy",
    "RetryPolicy",
    "ServerConnectionError",
    "SessionGuard",
    "ToolCall",
    "ToolEntry",
    "ToolResult",
]
