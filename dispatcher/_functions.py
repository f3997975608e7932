"""Local Python callables as tools.

The input schema and argument validation come from the function's signature, through the same machinery
the MCP SDK's `MCPServer` uses for its tools, so a function behaves like the same function served over
MCP: arguments are validated before the call is queued, the return value becomes a `CallToolResult`, and
an exception raised by the function becomes an error result the model can read.

A sync function runs in a worker thread, and a thread cannot be interrupted: when its call times out or
is cancelled, the call ends at once (TIMEOUT or CANCELLED) and the thread is abandoned, left to finish
by itself in the background. `ThreadWatch` counts the abandoned threads still running, which
`Dispatcher.abandoned_threads` reports.
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pydantic_core
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata, func_metadata
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from ._core._annotations import check_annotations, effective_annotations
from ._core._catalog import ToolEntry
from ._core._errors import ArgumentError, ConfigurationError
from ._core._keys import check_domain, check_key_functions
from ._core._lifecycle import mark_sent

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mcp.types import ToolAnnotations

    from ._core._catalog import Catalog
    from ._core._keys import KeyFunction
    from ._driver._coordination import Lease

__all__ = ["FunctionTool", "Functions", "ThreadWatch", "describe_validation_error"]


class ThreadWatch:
    """Counts the worker threads of sync functions that were abandoned and have not returned yet."""

    __slots__ = ("_abandoned", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = 0

    @property
    def abandoned(self) -> int:
        """How many abandoned threads are still running."""
        return self._abandoned

    async def run(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """Run `fn(**kwargs)` in a worker thread; if the caller is cancelled, abandon the thread and count it.

        Cancellation (a timeout, the caller giving up, the dispatcher closing) ends the wait at once:
        the thread cannot be stopped, so it is left to finish by itself, counted until it does.
        """
        lock = self._lock
        # [finished, abandoned], guarded by the lock: the thread and the event loop race to set them.
        state = [False, False]

        def call() -> Any:
            try:
                return fn(**kwargs)
            finally:
                with lock:
                    state[0] = True
                    if state[1]:
                        self._abandoned -= 1

        try:
            return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with lock:
                if not state[0]:
                    state[1] = True
                    self._abandoned += 1
            raise


def describe_validation_error(exc: ValidationError) -> str:
    """A one-line summary of what is wrong with the arguments."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{where}: {error['msg']}")
    return "invalid arguments: " + "; ".join(problems)


class FunctionTool:
    """A sync or async callable run as a tool; sync callables run in a worker thread, abandoned on cancellation.

    Arguments and results go through the SDK's `FuncMetadata`, as on an `MCPServer`. The common cases
    take a shortcut with the same outcome: reading a pydantic model's fields and private attributes on
    every call (as `validate_arguments` and `convert_result` do) costs more than the validation itself,
    so what they read is read once here. Anything unusual (an argument that may hold JSON in a string,
    a `CallToolResult` or `InputRequiredResult` return value) goes through the SDK's own methods.
    """

    __slots__ = (
        "_arg_model",
        "_exact_primitive",
        "_fields",
        "_json_keys",
        "_threads",
        "fn",
        "input_schema",
        "is_async",
        "metadata",
        "output_schema",
    )

    def __init__(self, fn: Callable[..., Any], *, threads: ThreadWatch | None = None) -> None:
        self.fn = fn
        self._threads = threads if threads is not None else ThreadWatch()
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an instance with an async __call__ is async too
        )
        self.metadata: FuncMetadata = func_metadata(fn)
        metadata = self.metadata
        self.input_schema: dict[str, Any] = metadata.arg_model.model_json_schema(by_alias=True)
        self.output_schema: dict[str, Any] | None = metadata.output_schema
        self._arg_model = metadata.arg_model
        fields = metadata.arg_model.model_fields
        # (field name, key in the kwargs), as `ArgModelBase.model_dump_one_level` builds them.
        self._fields = tuple((name, info.alias or name) for name, info in fields.items())
        # Keys whose string values `FuncMetadata.pre_parse_json` may parse as JSON.
        self._json_keys = frozenset(
            key for name, info in fields.items() if info.annotation is not str for key in (name, info.alias) if key
        )
        output_model = metadata.output_model if metadata.output_schema is not None else None
        # A wrapped `-> str`, `-> int` or `-> bool` return type needs no validation when the value
        # has exactly that type: the structured result is {"result": value} as the adapter would build it.
        self._exact_primitive: type | None = None
        if metadata.wrap_output and output_model is not None:
            field = getattr(output_model, "model_fields", {}).get("result")
            if field is not None and field.annotation in (str, int, bool):
                self._exact_primitive = field.annotation

    def prepare(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        data = dict(arguments)
        json_keys = self._json_keys
        try:
            if json_keys and any(isinstance(value, str) and key in json_keys for key, value in data.items()):
                return self.metadata.validate_arguments(data)
            model = self._arg_model.model_validate(data)
        except ValidationError as exc:
            raise ArgumentError(describe_validation_error(exc)) from exc
        # A model's field values are its __dict__ (what getattr reads, after looking through the class).
        values = model.__dict__
        return {key: values[name] for name, key in self._fields}

    async def invoke(self, prepared: dict[str, Any], lease: Lease | None = None) -> CallToolResult:
        mark_sent()  # the function may do its work from the moment it is called
        try:
            if self.is_async:
                value = await self.fn(**prepared)
            else:
                value = await self._threads.run(self.fn, prepared)
            if isinstance(value, CallToolResult):
                converted: object = value if self.output_schema is None else self.metadata.convert_result(value)
            elif type(value) is self._exact_primitive:
                converted = _primitive(value)
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


def _primitive(value: Any) -> CallToolResult:
    """`FuncMetadata.convert_result` for a `str`, `int` or `bool` returned by a function declared to return one."""
    text = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"result": value})


class Functions:
    """A dispatcher's local functions: checks what `Dispatcher.add_function` is given and registers the tool."""

    __slots__ = ("_catalog", "threads")

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.threads = ThreadWatch()

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None,
        annotations: ToolAnnotations | None,
        description: str | None,
        domain: str | None,
        keys: KeyFunction | None,
    ) -> ToolEntry:
        """Check the arguments of `Dispatcher.add_function`, register the function, and return its entry."""
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name or tool_name == "<lambda>":
            raise ConfigurationError("a tool needs a name: pass name=... for lambdas and callable objects")
        if self._catalog.has(None, tool_name):
            raise ConfigurationError(f"a local function named {tool_name!r} is already registered")
        check_annotations(annotations, tool_name)
        owner = f"function {tool_name!r}"
        domain = check_domain(domain, owner)
        if keys is not None and not callable(keys):
            raise ConfigurationError(f"keys for {owner} must be a function of the arguments, got {keys!r}")
        key_function = check_key_functions({tool_name: keys} if keys is not None else None, domain, owner)
        impl = FunctionTool(fn, threads=self.threads)
        entry = ToolEntry(
            tool_name,
            None,
            tool_name,
            effective_annotations(annotations, trusted=True),
            declared_annotations=annotations,
            trusted=True,
            description=description if description is not None else (fn.__doc__ or "").strip() or None,
            input_schema=impl.input_schema,
            output_schema=impl.output_schema,
            title=annotations.title if annotations is not None else None,
            domain=domain,
            key_function=key_function.get(tool_name),
        )
        self._catalog.put([(entry, impl)])
        found = self._catalog.get(None, tool_name)
        assert found is not None
        return found
