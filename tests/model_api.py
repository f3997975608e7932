"""A local stand-in for the Anthropic Messages and OpenAI (Chat Completions, Responses) HTTP APIs.

`ModelAPI` serves on 127.0.0.1 in a thread and answers the way the real APIs do for one scripted
conversation: the first request of each API gets a turn of tool calls, every later one must answer each
call of the turn before it (as the real APIs require) and gets a final text that quotes the results, so a
test sees they reached the model. It checks the API key header each SDK sends, so a loop that forgets
the key, or a doc that names the wrong variable, fails. The SDKs reach it through their base-URL
variables (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``); the loops run unchanged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ModelAPI"]

Answer = Callable[[dict[str, str]], str]


class ModelAPI:
    """The stand-in server. Use as a context manager; `url` is its root, `requests` what it received.

    Args:
        turn: The calls of the first turn: (call id, tool name, arguments).
        answer: The final text from the calls' outputs, by call id (it may assert on them).
        key: The API key it accepts.
    """

    def __init__(self, turn: list[tuple[str, str, dict[str, Any]]], answer: Answer, key: str) -> None:
        self.turn = turn
        self.answer = answer
        self.key = key
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.errors: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ModelAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the tests read what they need from `requests`

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append((self.path, body))
                try:
                    if self.path == "/v1/chat/completions":
                        api._check_key(self.headers.get("Authorization"), f"Bearer {api.key}")
                        reply = api._chat(body)
                    elif self.path == "/v1/responses":
                        api._check_key(self.headers.get("Authorization"), f"Bearer {api.key}")
                        reply = api._responses(body)
                    elif self.path == "/v1/messages":
                        # Older anthropic clients send the key as x-api-key, newer ones as a bearer token.
                        bearer = self.headers.get("Authorization")
                        sent = self.headers.get("x-api-key") or (bearer.removeprefix("Bearer ") if bearer else None)
                        api._check_key(sent, api.key)
                        reply = api._messages(body)
                    else:
                        raise LookupError(f"no such endpoint: {self.path}")
                    status = 200
                except Exception as exc:  # the test reads `errors`; the SDK gets a 400 it will not retry
                    api.errors.append(f"{self.path}: {type(exc).__name__}: {exc}")
                    reply, status = {"error": {"type": "invalid_request_error", "message": str(exc)}}, 400
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def _check_key(self, sent: str | None, expected: str) -> None:
        if sent != expected:
            raise PermissionError(f"the API key header was {sent!r}")

    def _asked(self) -> list[str]:
        return [call_id for call_id, _, _ in self.turn]

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        tools, messages = body["tools"], body["messages"]
        assert all(tool["type"] == "function" and "name" in tool["function"] for tool in tools)
        outputs = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
        if not outputs:
            calls = [
                {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for i, name, args in self.turn
            ]
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
            reason = "tool_calls"
        else:
            assistant = next(m for m in messages if m["role"] == "assistant")
            assert [call["id"] for call in assistant["tool_calls"]] == self._asked()
            message, reason = {"role": "assistant", "content": self.answer(outputs)}, "stop"
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _responses(self, body: dict[str, Any]) -> dict[str, Any]:
        tools, items = body["tools"], body["input"]
        assert all(tool["type"] == "function" and "name" in tool for tool in tools)
        outputs = {item["call_id"]: item["output"] for item in items if item.get("type") == "function_call_output"}
        if not outputs:
            output: list[dict[str, Any]] = [{"type": "reasoning", "id": "rs_1", "summary": []}]
            output += [
                {
                    "type": "function_call",
                    "id": f"fc_{i}",
                    "call_id": i,
                    "name": name,
                    "arguments": json.dumps(args),
                    "status": "completed",
                }
                for i, name, args in self.turn
            ]
        else:
            # The previous output came back as input, reasoning item included, as the API requires.
            assert [item["call_id"] for item in items if item.get("type") == "function_call"] == self._asked()
            assert any(item.get("type") == "reasoning" for item in items)
            text = self.answer(outputs)
            content = [{"type": "output_text", "text": text, "annotations": []}]
            message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
            output = [{**message, "content": content}]
        return {
            "id": f"resp_{len(self.requests)}",
            "object": "response",
            "created_at": 0,
            "model": body["model"],
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": tools,
        }

    def _messages(self, body: dict[str, Any]) -> dict[str, Any]:
        assert all("name" in tool and "input_schema" in tool for tool in body["tools"])
        messages = body["messages"]
        if len(messages) == 1:
            content: list[dict[str, Any]] = [{"type": "text", "text": "Updating the note, then reading it back."}]
            content += [{"type": "tool_use", "id": i, "name": name, "input": args} for i, name, args in self.turn]
            reason = "tool_use"
        else:
            asked = [block["id"] for block in messages[-2]["content"] if block["type"] == "tool_use"]
            results = [block for block in messages[-1]["content"] if block["type"] == "tool_result"]
            assert asked == self._asked() == [block["tool_use_id"] for block in results]
            assert all("is_error" not in block for block in results)
            text = self.answer({block["tool_use_id"]: block["content"] for block in results})
            content, reason = [{"type": "text", "text": text}], "end_turn"
        return {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
