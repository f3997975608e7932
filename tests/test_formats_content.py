"""`dispatcher.formats` keeps content: images and PDFs reach the model in each API's shape for them.

Besides the unit checks, one test goes end to end: a real in-process MCP server returns a PNG, the
dispatcher runs the call, and the three result converters carry the very bytes the tool sent.
"""

from __future__ import annotations

import base64

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    ToolAnnotations,
)

from dispatcher import CallStatus, Dispatcher, ToolCall, ToolResult
from dispatcher.formats import anthropic_results, openai_chat_results, openai_responses_results, result_text

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PDF = base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()
WAV = "UklGRiQAAABXQVZF"


def _result(content: list[ContentBlock], call_id: str = "call_1", *, ok: bool = True) -> ToolResult:
    return ToolResult(
        ToolCall(call_id, "chart", {}),
        CallStatus.OK if ok else CallStatus.TOOL_ERROR,
        result=CallToolResult(content=content, is_error=not ok),
        error=None if ok else "it broke",
        tool="chart",
    )


MIXED: list[ContentBlock] = [
    TextContent(text="Here is the chart:"),
    ImageContent(data=PNG, mime_type="image/png"),
    AudioContent(data=WAV, mime_type="audio/wav"),
    EmbeddedResource(resource=BlobResourceContents(uri="file:///r/q3.pdf", blob=PDF, mime_type="application/pdf")),
    EmbeddedResource(resource=BlobResourceContents(uri="file:///b.bin", blob="AAEC", mime_type="x/bin")),
]


def test_anthropic_gets_image_and_document_blocks_after_the_text() -> None:
    """Anthropic: a text block, then base64 image and document blocks; audio and unknown blobs stay text."""
    result = _result(MIXED)
    [block] = anthropic_results([result])
    assert block["content"] == [
        {"type": "text", "text": result_text(result)},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
    ]


def test_openai_responses_gets_input_image_and_input_file_items() -> None:
    """Responses: the output is a list of input_text, input_image and input_file items (data URLs)."""
    result = _result(MIXED)
    [item] = openai_responses_results([result])
    assert item["output"] == [
        {"type": "input_text", "text": result_text(result)},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        {"type": "input_file", "filename": "q3.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
    ]


def test_openai_chat_attaches_media_in_one_user_message_after_the_tool_messages() -> None:
    """Chat Completions: tool messages stay text; one user message then carries images, audio and files."""
    results = [_result(MIXED, "call_1"), _result([TextContent(text="plain")], "call_2")]
    messages = openai_chat_results(results)
    assert [m["role"] for m in messages] == ["tool", "tool", "user"]
    assert messages[0]["content"] == result_text(results[0])
    note, *parts = messages[2]["content"]
    assert note["type"] == "text" and "call_1" in note["text"] and "call_2" not in note["text"]
    assert parts == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
        {"type": "file", "file": {"filename": "q3.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}},
    ]


def test_text_only_results_keep_the_plain_string_shapes() -> None:
    """Without media nothing changes: strings, no extra message; an error keeps its flag with media too."""
    plain = _result([TextContent(text="hi")])
    assert anthropic_results([plain])[0]["content"] == "hi"
    assert openai_responses_results([plain])[0]["output"] == "hi"
    assert openai_chat_results([plain]) == [{"role": "tool", "tool_call_id": "call_1", "content": "hi"}]
    failed = _result([TextContent(text="bad"), ImageContent(data=PNG, mime_type="image/png")], ok=False)
    [block] = anthropic_results([failed])
    assert block["is_error"] is True and block["content"][1]["type"] == "image"
    assert openai_responses_results([failed])[0]["output"][0]["text"].startswith("Error (tool_error):")


def test_unsupported_image_types_stay_described() -> None:
    """An image type the APIs do not take (SVG) stays a description in the text, with no media block."""
    svg = _result([ImageContent(data="PHN2Zy8+", mime_type="image/svg+xml")])
    assert anthropic_results([svg])[0]["content"] == "[image: image/svg+xml, 6 bytes]"
    assert len(openai_chat_results([svg])) == 1


@pytest.mark.anyio
async def test_an_image_from_a_real_server_reaches_every_api_intact() -> None:
    """A PNG returned by an MCP tool is carried byte for byte into the three APIs' shapes."""
    server = MCPServer("charts")
    raw = base64.b64decode(PNG)

    # Closed-world: its output is not untrusted content, so Chat Completions may attach it in a user message.
    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    def chart() -> Image:
        """Draw a chart."""
        return Image(data=raw, format="png")

    async with Client(server) as client, Dispatcher() as dispatcher:
        await dispatcher.add_mcp_server("charts", client, trusted=True)
        [result] = await dispatcher.dispatch([ToolCall("c1", "chart", {})])
    assert result.ok
    anthropic_image = anthropic_results([result])[0]["content"][1]
    assert base64.b64decode(anthropic_image["source"]["data"]) == raw
    responses_image = openai_responses_results([result])[0]["output"][1]
    assert base64.b64decode(responses_image["image_url"].split(",", 1)[1]) == raw
    chat_image = openai_chat_results([result])[1]["content"][1]
    assert base64.b64decode(chat_image["image_url"]["url"].split(",", 1)[1]) == raw
