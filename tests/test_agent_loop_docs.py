"""The agent loops of docs/agent-loop.md run as written: with the real SDKs over HTTP, and against fakes.

With the real `anthropic` or `openai` package (where installed), each loop runs unchanged against
`tests.model_api.ModelAPI`, a stand-in of the model API on 127.0.0.1 reached through the SDK's base-URL
variable, with the key in the variable the doc names.

Each fake stands in for the `anthropic` or `openai` package itself: it answers the first request with a turn
of three tool calls (a write, then two reads that must see it) as the SDK's response objects, checks
that the next request answers every call, and then ends the conversation with a text that quotes a
tool result, so the test sees that the results reached the model. The person at the terminal is a
stand-in for `input` that approves.
"""

from __future__ import annotations

import builtins
import functools
import json
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace as Obj
from typing import Any

import anyio
import pytest

from tests.model_api import ModelAPI

DOC = Path(__file__).resolve().parent.parent / "docs" / "agent-loop.md"
PROMPT = "Note that the launch moved to Tuesday, then tell me what my notes say."
TURN = [
    ("call_1", "set_note", {"name": "launch", "text": "Launch on Tuesday."}),
    ("call_2", "read_note", {"name": "launch"}),
    ("call_3", "search_notes", {"query": "Tuesday"}),
]
ANSWER = "Your notes say: Launch on Tuesday."


# Each API's loop must use that API's functions from dispatcher.formats, so a loop shown under the wrong
# heading (as the Chat Completions loop once was under "Anthropic Messages") fails.
FORMATS = {
    "Anthropic Messages": "anthropic",
    "OpenAI Chat Completions": "openai_chat",
    "OpenAI Responses": "openai_responses",
}


def _section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next heading of that level (never into the next section)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match is not None, f"docs/agent-loop.md lost its {heading!r} section"
    return match.group(1)


def _loop(heading: str) -> str:
    match = re.search(r"^```python\n(.*?)^```", _section(DOC.read_text(), heading), re.S | re.M)
    assert match is not None, f"docs/agent-loop.md lost its {heading!r} loop"
    code = match.group(1)
    prefix = FORMATS[heading]
    used = set(re.findall(r"\b(anthropic|openai_chat|openai_responses)_(?:tools|calls|results)\b", code))
    assert used == {prefix}, f"the loop under {heading!r} uses the formats of {sorted(used)}"
    return code


def _final_answer(outputs: dict[str, str]) -> str:
    assert list(outputs) == [call_id for call_id, _, _ in TURN], "every call answered, in order"
    assert outputs["call_1"] == "set note 'launch'"
    assert outputs["call_3"] == "launch"
    return f"Your notes say: {outputs['call_2']}"


class _Anthropic:
    def __init__(self) -> None:
        self.messages = self
        self.requests = 0

    async def create(self, *, model: str, max_tokens: int, tools: list[Any], messages: list[Any]) -> Obj:
        self.requests += 1
        assert {tool["name"] for tool in tools} >= {"set_note", "read_note", "search_notes"}
        json.dumps(tools)
        if self.requests == 1:
            assert messages == [{"role": "user", "content": PROMPT}]
            blocks = [Obj(type="text", text="Updating the note, then reading it back.")]
            blocks += [Obj(type="tool_use", id=i, name=name, input=args) for i, name, args in TURN]
            return Obj(id="msg_1", role="assistant", content=blocks, stop_reason="tool_use")
        results = messages[-1]["content"]
        assert all(block["type"] == "tool_result" and "is_error" not in block for block in results)
        text = _final_answer({block["tool_use_id"]: block["content"] for block in results})
        return Obj(id="msg_2", role="assistant", content=[Obj(type="text", text=text)], stop_reason="end_turn")


class _OpenAIChat:
    def __init__(self) -> None:
        self.completions = self
        self.requests = 0

    async def create(self, *, model: str, tools: list[Any], messages: list[Any]) -> Obj:
        self.requests += 1
        assert all(tool["type"] == "function" for tool in tools)
        json.dumps(tools)
        if self.requests == 1:
            calls = [
                Obj(id=i, type="function", function=Obj(name=name, arguments=json.dumps(args)))
                for i, name, args in TURN
            ]
            message = Obj(role="assistant", content=None, tool_calls=calls)
        else:
            outputs = {m["tool_call_id"]: m["content"] for m in messages if isinstance(m, dict) and m["role"] == "tool"}
            message = Obj(role="assistant", content=_final_answer(outputs), tool_calls=None)
        return Obj(id=f"chatcmpl-{self.requests}", choices=[Obj(index=0, message=message, finish_reason="stop")])


class _OpenAIResponses:
    def __init__(self) -> None:
        self.requests = 0

    async def create(self, *, model: str, tools: list[Any], input: list[Any]) -> Obj:
        self.requests += 1
        assert all(tool["type"] == "function" and "name" in tool for tool in tools)
        if self.requests == 1:
            output = [Obj(type="reasoning", id="rs_1", summary=[])]
            output += [
                Obj(type="function_call", id=f"fc_{i}", call_id=i, name=name, arguments=json.dumps(args))
                for i, name, args in TURN
            ]
            return Obj(id="resp_1", output=output, output_text="")
        outputs = {
            item["call_id"]: item["output"]
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        text = _final_answer(outputs)
        message = Obj(type="message", role="assistant", content=[Obj(type="output_text", text=text)])
        return Obj(id="resp_2", output=[message], output_text=text)


def _fake_sdks() -> tuple[types.ModuleType, types.ModuleType]:
    anthropic = types.ModuleType("anthropic")
    anthropic.AsyncAnthropic = _Anthropic  # type: ignore[attr-defined]
    openai = types.ModuleType("openai")

    def async_openai() -> Obj:
        return Obj(chat=_OpenAIChat(), responses=_OpenAIResponses())

    openai.AsyncOpenAI = async_openai  # type: ignore[attr-defined]
    return anthropic, openai


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("heading", ["Anthropic Messages", "OpenAI Chat Completions", "OpenAI Responses"])
def test_agent_loop_runs_as_written(
    heading: str, backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loop runs its turns through the dispatcher and prints the model's final answer."""
    code = _loop(heading)
    anthropic, openai = _fake_sdks()
    monkeypatch.setitem(sys.modules, "anthropic", anthropic)
    monkeypatch.setitem(sys.modules, "openai", openai)
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    questions: list[str] = []

    def person(question: str) -> str:
        questions.append(question)
        return "y"

    monkeypatch.setattr(builtins, "input", person)
    exec(compile(code, f"docs/agent-loop.md ({heading})", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == f"{ANSWER}\n"
    # set_note may overwrite a note, so the person was asked about it, and only about it.
    assert questions == [
        "set_note may make destructive changes. Run set_note {'name': 'launch', 'text': 'Launch on Tuesday.'} "
        "(server 'workspace', trusted)? [y/N] "
    ]


@pytest.mark.parametrize("heading", ["Anthropic Messages", "OpenAI Chat Completions", "OpenAI Responses"])
def test_agent_loop_is_short(heading: str) -> None:
    """Each loop is complete in under 40 lines."""
    assert len(_loop(heading).strip().splitlines()) < 40


def test_loop_sections_are_read_within_their_heading() -> None:
    """A section ends at the next heading: the Anthropic loop is the Anthropic code, not the next section's."""
    assert "anthropic.AsyncAnthropic()" in _loop("Anthropic Messages")
    assert "chat.completions.create" in _loop("OpenAI Chat Completions")
    assert "responses.create" in _loop("OpenAI Responses")


README_LOOPS = {
    "Anthropic Messages API": "Anthropic Messages",
    "OpenAI Chat Completions API": "OpenAI Chat Completions",
}


def test_readme_shows_the_tested_loops_under_their_own_labels() -> None:
    """Each README loop is, under its own label, exactly the docs/agent-loop.md loop for that API."""
    readme = (DOC.parent.parent / "README.md").read_text()
    shown = re.findall(r"^With the (.+?) \((\d+) lines\):\n\n```python\n(.*?)^```", readme, re.S | re.M)
    assert [label for label, _, _ in shown] == list(README_LOOPS), "the README's complete loops changed"
    for label, lines, code in shown:
        heading = README_LOOPS[label]
        assert code == _loop(heading), f"the README's {label} loop is not docs/agent-loop.md's {heading} loop"
        assert int(lines) == len(code.strip().splitlines()), f"the README says {lines} lines for {label}"


# The real SDKs against a stand-in of the model API on 127.0.0.1 -----------------------------------

# heading -> (the SDK's module, the pip package, the key variable, the base-URL variable, the URL's suffix)
SDKS = {
    "Anthropic Messages": ("anthropic", "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", ""),
    "OpenAI Chat Completions": ("openai", "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "/v1"),
    "OpenAI Responses": ("openai", "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "/v1"),
}
KEY = "sk-stand-in-0123456789"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("heading", list(SDKS))
def test_agent_loop_runs_with_the_real_sdk_against_a_local_model_api(
    heading: str, backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loop, unchanged, drives the real SDK over HTTP to a stand-in API on 127.0.0.1: two requests, the answer."""
    module, _, key_variable, url_variable, suffix = SDKS[heading]
    pytest.importorskip(module, reason=f"the {module} package is not installed")
    code = _loop(heading)
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    monkeypatch.setattr(builtins, "input", lambda question: "y")
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with ModelAPI(TURN, _final_answer, KEY) as api:
        monkeypatch.setenv(url_variable, api.url + suffix)
        monkeypatch.setenv(key_variable, KEY)
        exec(compile(code, f"docs/agent-loop.md ({heading})", "exec"), {"__name__": "__main__"})
    assert api.errors == []
    assert capsys.readouterr().out == f"{ANSWER}\n"
    assert len(api.requests) == 2 and all(body["model"] for _, body in api.requests)


def test_the_stand_in_refuses_a_request_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in checks the key the SDK sends, so a loop run without the documented variable fails."""
    openai = pytest.importorskip("openai")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    async def ask(url: str) -> None:
        model = openai.AsyncOpenAI(api_key="sk-wrong", base_url=url + "/v1", max_retries=0)
        await model.chat.completions.create(model="m", tools=[], messages=[{"role": "user", "content": "hi"}])

    with ModelAPI(TURN, _final_answer, KEY) as api, pytest.raises(openai.BadRequestError):
        anyio.run(ask, api.url)
    assert api.errors == ["/v1/chat/completions: PermissionError: the API key header was 'Bearer sk-wrong'"]


@pytest.mark.parametrize("heading", list(SDKS))
def test_each_loop_names_the_package_and_the_key_it_needs(heading: str) -> None:
    """The text before each loop says which package to install and which variable holds the API key."""
    _, package, key_variable, _, _ = SDKS[heading]
    section = _section(DOC.read_text(), heading)
    before = section[: section.index("```python")]
    hint = f'pip install "mcp-dispatcher[{package}]"'
    assert hint in before, f"{heading}: say `{hint}`"
    assert key_variable in before, f"{heading}: say the key goes in {key_variable}"
