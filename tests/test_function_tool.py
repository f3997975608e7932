"""`FunctionTool`'s shortcuts give exactly what the SDK's `FuncMetadata` gives."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from dispatcher._core._errors import ArgumentError
from dispatcher._functions import FunctionTool


class Point(BaseModel):
    x: int
    y: int = 0


class Pair(TypedDict):
    left: str
    right: int


async def text(key: str) -> str:
    return key


async def numbers(values: list[int], scale: float = 1.0) -> list[float]:
    return [v * scale for v in values]


async def model(point: Point, label: str = "p") -> Point:
    return Point(x=point.x + 1, y=point.y)


async def aliased(label: Annotated[str, Field(alias="name")], count: Annotated[int, Field(alias="n")] = 1) -> str:
    return label * count


async def pair(left: str, right: int) -> Pair:
    return {"left": left, "right": right}


async def loose(value: Any) -> dict[str, Any]:
    return {"value": value}


async def plain(n: int) -> Any:
    return {"n": n}


async def content(n: int) -> TextContent:
    return TextContent(type="text", text=str(n))


async def raw(n: int) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=str(n))])


pytestmark = pytest.mark.anyio

CASES: list[tuple[Any, dict[str, Any]]] = [
    (text, {"key": "a"}),
    (numbers, {"values": [1, 2, 3]}),
    (numbers, {"values": "[1, 2, 3]", "scale": "2"}),  # JSON inside strings, as some clients send
    (model, {"point": {"x": 1}, "label": "origin"}),
    (model, {"point": '{"x": 1, "y": 2}'}),
    (pair, {"left": "l", "right": 2}),
    (loose, {"value": "1"}),
    (loose, {"value": [1, {"a": None}]}),
    (plain, {"n": 3}),
    (content, {"n": 4}),
    (raw, {"n": 5}),
]


@pytest.mark.parametrize(("fn", "arguments"), CASES, ids=[f"{fn.__name__}-{i}" for i, (fn, _) in enumerate(CASES)])
async def test_same_arguments_and_result_as_the_sdk(fn: Any, arguments: dict[str, Any]) -> None:
    """Prepared arguments and converted results equal what FuncMetadata's own methods produce."""
    tool = FunctionTool(fn)
    prepared = tool.prepare(arguments)
    assert prepared == tool.metadata.validate_arguments(dict(arguments))
    result = await tool.invoke(prepared)
    expected = tool.metadata.convert_result(await fn(**prepared))
    assert result == expected
    assert result.model_dump(mode="json", by_alias=True) == expected.model_dump(mode="json", by_alias=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("arguments", [{"name": "a"}, {"name": "a", "n": "3"}, {"name": "a", "n": 2}])
def test_aliased_parameters_are_prepared_as_before(anyio_backend: str, arguments: dict[str, Any]) -> None:
    """Aliased parameters come out under their aliases, as FuncMetadata.validate_arguments gives them."""
    tool = FunctionTool(aliased)
    assert tool.prepare(arguments) == tool.metadata.validate_arguments(dict(arguments))


@pytest.mark.parametrize(
    ("fn", "arguments"),
    [(text, {}), (numbers, {"values": "not json"}), (model, {"point": {"y": 1}}), (pair, {"left": 1, "right": 2})],
)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_invalid_arguments_are_rejected_as_before(anyio_backend: str, fn: Any, arguments: dict[str, Any]) -> None:
    """Arguments the SDK rejects raise ArgumentError."""
    tool = FunctionTool(fn)
    with pytest.raises(ArgumentError, match="invalid arguments"):
        tool.prepare(arguments)


async def test_a_return_value_that_breaks_the_output_schema_is_a_tool_error() -> None:
    """A result that fails output validation becomes an error result, as on an MCPServer."""

    async def wrong() -> int:
        return "not a number"  # type: ignore[return-value]

    result = await FunctionTool(wrong).invoke({})
    assert result.is_error
