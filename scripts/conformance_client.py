"""A client on `Dispatcher.connect` for the client scenarios of the official MCP conformance suite.

The suite (`@modelcontextprotocol/conformance`, npm; it needs Node 22 or newer, which the npm package
``node@22`` ships) starts a scripted server per scenario and runs this with the server's URL last::

    node node_modules/@modelcontextprotocol/conformance/dist/index.js client \\
        --command "python -m scripts.conformance_client" --scenario elicitation-sep1034-client-defaults

It connects, lists the tools, calls each with arguments made from its schema, and accepts every question
with an empty form, so that the form's defaults are what the server gets.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from dispatcher import Answer, Dispatcher, Question, ToolCall

_SAMPLE = {"number": 1, "integer": 1, "string": "x", "boolean": True}


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    return {name: _SAMPLE.get(spec.get("type"), "x") for name, spec in properties.items()}


async def _ask(question: Question) -> Answer:
    print(question.text(), flush=True)
    return Answer.accept({})


async def main(url: str) -> None:
    async with Dispatcher(ask_user=_ask, call_timeout=20) as dispatcher:
        entries = await dispatcher.connect("conformance", url, trusted=True, connect_timeout=20)
        calls = [ToolCall(str(n), entry.name, _arguments(dict(entry.input_schema))) for n, entry in enumerate(entries)]
        for result in await dispatcher.dispatch(calls):
            print(result.call.name, result.status.value, result.error, flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[-1])
