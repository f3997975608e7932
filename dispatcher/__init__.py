"""dispatcher: run the tool calls a model asks for, safely and fast.

Read-only calls run together; calls that may mutate run alone, in the order the model asked; what a tool
may do is read from its MCP annotations, and only from servers the user trusts.
"""

from ._core._calls import CallStatus as CallStatus
from ._core._calls import Effect as Effect
from ._core._calls import ToolCall as ToolCall
from ._core._calls import ToolResult as ToolResult
from ._core._catalog import ToolEntry as ToolEntry
from ._core._errors import BatchError as BatchError
from ._core._errors import ConfigurationError as ConfigurationError
from ._core._errors import DispatcherClosedError as DispatcherClosedError
from ._core._errors import DispatcherError as DispatcherError
from ._core._errors import NotFinishedError as NotFinishedError
from ._core._errors import ServerConnectionError as ServerConnectionError
from ._core._idempotency import IdempotencyKeys as IdempotencyKeys
from ._core._keys import KeyFunction as KeyFunction
from ._core._limit_setting import AdaptiveLimit as AdaptiveLimit
from ._dispatcher import Dispatcher as Dispatcher
from ._driver._approval import ApprovalPolicy as ApprovalPolicy
from ._driver._approval import ApprovalRequest as ApprovalRequest
from ._driver._approval import Approver as Approver
from ._driver._approval import SessionGuard as SessionGuard
from ._driver._approval import ToolSelector as ToolSelector
from ._driver._batch import Batch as Batch
from ._driver._batch import PendingCall as PendingCall
from ._driver._observe import CallEvent as CallEvent
from ._driver._retry import RetryPolicy as RetryPolicy
from ._exports import rehome as _rehome
from ._mcp._pins import DefinitionChange as DefinitionChange
from ._mcp._questions import Answer as Answer
from ._mcp._questions import Question as Question
from ._mcp._questions import QuestionHandler as QuestionHandler
from ._mcp._questions import QuestionPolicy as QuestionPolicy
from ._mcp._reconnect import ReconnectPolicy as ReconnectPolicy
from ._version import __version__ as __version__

__all__ = [
    "AdaptiveLimit",
    "Answer",
    "ApprovalPolicy",
    "ApprovalRequest",
    "Approver",
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
    "KeyFunction",
    "NotFinishedError",
    "PendingCall",
    "Question",
    "QuestionHandler",
    "QuestionPolicy",
    "ReconnectPolicy",
    "RetryPolicy",
    "ServerConnectionError",
    "SessionGuard",
    "ToolCall",
    "ToolEntry",
    "ToolResult",
    "ToolSelector",
]


# The classes exported here report this module as their home (`dispatcher.ToolResult`, not its private one).
_rehome(globals())
