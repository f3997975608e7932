"""A raw stdio MCP server that answers tool calls with malformed, schema-violating or enormous messages.

It speaks just enough JSON-RPC by hand (the legacy ``initialize`` handshake; ``server/discover`` is
refused, so a client in ``mode="auto"`` falls back to it) to be listed and called, then breaks the
protocol in the way each tool's name says. Every tool is declared read-only, so that a test can run
well-behaved and malformed calls side by side. Run it with ``python tests/chaos/badserver.py``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

_READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
_KEY = {"type": "object", "properties": {"key": {"type": "string"}, "size": {"type": "integer"}}}

BEHAVIOURS: dict[str, str] = {
    "echo": "answers normally with its key",
    "garbage_then_echo": "writes a line that is not JSON, then answers normally",
    "garbage": "writes a line that is not JSON instead of its answer",
    "not_jsonrpc": "writes a JSON line that is not a JSON-RPC message instead of its answer",
    "bad_content": "answers with a result whose content is not a list",
    "bad_block": "answers with a text block whose text is a number",
    "unknown_block": "answers with a content block of an unknown type",
    "null_result": "answers with a null result",
    "empty_response": "answers with neither a result nor an error",
    "bad_error": "answers with an error object of the wrong shape",
    "wrong_id": "answers under another request id",
    "twice": "answers twice",
    "huge": "answers with a text of `size` bytes",
    "structured": "declares an output schema and returns structured content that violates it",
    "error_flag_text": "answers with isError set to a string",
    "bad_utf8": "writes a line that is not valid UTF-8 instead of its answer",
    "exit": "exits without answering",
}

_OUTPUT_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _tools() -> list[dict[str, Any]]:
    tools = []
    for name, description in BEHAVIOURS.items():
        tool: dict[str, Any] = {
            "name": name,
            "description": description,
            "inputSchema": _KEY,
            "annotations": _READ_ONLY,
        }
        if name == "structured":
            tool["outputSchema"] = _OUTPUT_SCHEMA
        tools.append(tool)
    return tools


def _send(message: object) -> None:
    _write((json.dumps(message) + "\n").encode())


def _write(data: bytes) -> None:
    out = sys.stdout.buffer
    out.write(data)
    out.flush()


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _call(request_id: Any, name: str, arguments: dict[str, Any]) -> None:
    key = str(arguments.get("key", ""))

    def answer(result: object) -> None:
        _send({"jsonrpc": "2.0", "id": request_id, "result": result})

    if name == "echo":
        answer(_text(key))
    elif name == "garbage_then_echo":
        _write(b"}{ this is not JSON\n")
        answer(_text(key))
    elif name == "garbage":
        _write(b"}{ this is not JSON either\n")
    elif name == "not_jsonrpc":
        _send({"hello": "world", "id": request_id})
    elif name == "bad_content":
        answer({"content": "not a list"})
    elif name == "bad_block":
        answer({"content": [{"type": "text", "text": 42}]})
    elif name == "unknown_block":
        answer({"content": [{"type": "hologram", "data": 1}]})
    elif name == "null_result":
        answer(None)
    elif name == "empty_response":
        _send({"jsonrpc": "2.0", "id": request_id})
    elif name == "bad_error":
        _send({"jsonrpc": "2.0", "id": request_id, "error": {"code": "boom", "message": 5}})
    elif name == "wrong_id":
        _send({"jsonrpc": "2.0", "id": 10_000_000, "result": _text(key)})
    elif name == "twice":
        answer(_text(key))
        answer(_text(key + " again"))
    elif name == "huge":
        answer(_text("x" * int(arguments.get("size", 1_000_000))))
    elif name == "structured":
        answer({**_text(key), "structuredContent": {"n": "not a number"}})
    elif name == "error_flag_text":
        answer({**_text(key), "isError": "yes"})
    elif name == "bad_utf8":
        _write(b'{"jsonrpc": "2.0", "id": 1, "result": "\xff\xfe"}\n')
    elif name == "exit":
        os._exit(1)
    else:
        _send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"Unknown tool: {name}"}})


def main() -> None:
    """Serve requests from stdin until it closes."""
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue  # a notification or a response: nothing to answer
        request_id, method = message["id"], message["method"]
        params = message.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "badserver", "version": "0"},
            }
            _send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "ping":
            _send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method == "tools/list":
            _send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": _tools()}})
        elif method == "tools/call":
            _call(request_id, str(params.get("name")), params.get("arguments") or {})
        else:
            _send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
