"""Local Python callables as tools.

The input schema and argument validation come from the function's signature, through the same machinery
the MCP SDK's `MCPServer` uses for its tools, so a function behaves like the same function served over
MCP: arguments are validated before the call is queued, the return value becomes a `CallToolResult`, and
an exception raised by the function becomes an error result the model can read.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, _convert_to_content, func_metadata
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from ._catalog import ArgumentError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["FunctionTool", "describe_validation_error"]


def describe_validation_error(exc: ValidationError) -> str:
    """A one-line summary of what is wrong with the arguments."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{where}: {error['msg']}")
    return "invalid arguments: " + "; ".join(problems)


class FunctionTool:
    """A sync or async callable run as a tool; sync callables run in a worker thread."""

    __slots__ = ("fn", "input_schema", "is_async", "metadata", "output_schema")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an instance with an async __call__ is async too
        )
        self.metadata: FuncMetadata = func_metadata(fn)
        self.input_schema: dict[str, Any] = self.metadata.arg_model.model_json_schema(by_alias=True)
        self.output_schema: dict[str, Any] | None = self.metadata.output_schema

    def prepare(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.metadata.validate_arguments(dict(arguments))
        except ValidationError as exc:
            raise ArgumentError(describe_validation_error(exc)) from exc

    async def invoke(self, prepared: dict[str, Any]) -> CallToolResult:
        try:
            if self.is_async:
                value = await self.fn(**prepared)
            else:
                value = await anyio.to_thread.run_sync(functools.partial(self.fn, **prepared))
            if isinstance(value, CallToolResult):
                converted: object = value if self.output_schema is None else self.metadata.convert_result(value)
            elif self.output_schema is None:
                converted = CallToolResult(content=_convert_to_content(value))
            else:
                converted = self.metadata.convert_result(value)
        except MCPError:
            # A protocol-level error is the tool saying "this request failed", as on an MCP server.
            raise
        except Exception as exc:
            # The tool ran and failed: the model sees the error, as MCPServer would report it.
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        if not isinstance(converted, CallToolResult):
            raise TypeError(f"the function returned {type(value).__name__}, which is not a tool result")
        return converted
