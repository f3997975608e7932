"""Smoke test of an installed wheel: import the package from outside the source tree and run a batch.

Run by `make package-check` with the Python of a fresh venv that has only the wheel installed.
"""

from importlib.metadata import version

import anyio
from mcp.types import ToolAnnotations

import dispatcher
from dispatcher import CallStatus, Dispatcher, ToolCall


async def main() -> None:
    order: list[str] = []

    async def read(key: str) -> str:
        order.append(f"read {key}")
        return key

    def write(key: str) -> str:
        order.append(f"write {key}")
        return key

    async with Dispatcher() as d:
        d.add_function(read, annotations=ToolAnnotations(read_only_hint=True))
        d.add_function(write)
        results = await d.dispatch(
            [ToolCall("1", "write", {"key": "a"}), ToolCall("2", "read", {"key": "a"}), ToolCall("3", "nope")]
        )
    assert [r.status for r in results] == [CallStatus.OK, CallStatus.OK, CallStatus.FAILED], results
    assert order == ["write a", "read a"], order
    assert "site-packages" in dispatcher.__file__, f"imported from {dispatcher.__file__}, not the installed wheel"
    assert version("mcp-dispatcher") == dispatcher.__version__
    print(f"mcp-dispatcher {dispatcher.__version__} from {dispatcher.__file__}: a batch of 3 ran")


anyio.run(main)
