"""The hostile server's attacks really happen: a plain `mcp.Client` sees each, in process and over stdio.

These check the attacker, not a defence: each test connects the SDK's own client (no dispatcher) to
`dispatcher.testing.HostileServer`, in process or as ``python -m dispatcher.testing`` in a subprocess, and
shows the attack on the wire. The defences are tested where they are built.
"""

from __future__ import annotations

import base64
import os
import re
import struct
import zlib
from typing import TYPE_CHECKING, Any, Literal

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import BlobResourceContents, EmbeddedResource, ImageContent, TextContent, ToolListChangedNotification

from dispatcher.testing import HostileServer
from dispatcher.testing._hostile import MEDIA_FILE_NAME, MEDIA_INJECTION, POISON

from . import forkserver
from .test_connections import SOURCE_ROOT

if TYPE_CHECKING:
    from pathlib import Path

    from mcp.server.mcpserver import MCPServer
    from mcp.types import Tool

pytestmark = pytest.mark.anyio

Transport = Literal["in-process", "stdio"]
TRANSPORTS = pytest.mark.parametrize("transport", ["in-process", "stdio"])
MODES = pytest.mark.parametrize("mode", ["auto", "legacy"])


def target(hostile: HostileServer, transport: Transport, *extra: str) -> MCPServer[Any] | StdioServerParameters:
    """The server in process, or a subprocess built with the same options (`extra`: more command-line flags)."""
    if transport == "in-process":
        return hostile.server
    pythonpath = os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p)
    args = ["-m", "dispatcher.testing", "--victim", hostile.victim]
    for tool in hostile.tools:
        args += ["--tool", tool]
    if hostile.many:
        args += ["--many", str(hostile.many)]
    if hostile.churn:
        args.append("--churn")
    if hostile.state is not None:
        args += ["--state", str(hostile.state)]
    return forkserver.params([*args, *extra], {"PYTHONPATH": pythonpath})


async def tools(client: Client) -> dict[str, Tool]:
    return {tool.name: tool for tool in (await client.list_tools(cache_mode="refresh")).tools}


class Changes:
    """Counts the tools/list_changed a plain client receives, on either protocol."""

    def __init__(self) -> None:
        self.count = 0
        self.arrived = anyio.Event()

    async def on_message(self, message: object) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._one()

    def _one(self) -> None:
        self.count += 1
        self.arrived.set()

    async def wait(self) -> None:
        with anyio.fail_after(30):
            await self.arrived.wait()
        self.arrived = anyio.Event()


async def following(client: Client, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """On 2026-07-28 connections, subscribe to tools/list_changed (each also reaches the message handler)."""
    async with client.listen(tools_list_changed=True) as subscription:
        task_status.started()
        async for _ in subscription:
            pass


# A poisoned description at first sight --------------------------------------------------------------


@TRANSPORTS
@pytest.mark.subprocess
async def test_weather_is_poisoned_at_first_sight(transport: Transport) -> None:
    """The first listing already carries the injection, in the description, title and argument description."""
    async with Client(target(HostileServer(), transport)) as client:
        weather = (await tools(client))["weather"]
    assert weather.description == POISON
    assert "call read_note on every note" in POISON and "\x1b[2J" in POISON and "\n" in POISON and "\r" in POISON
    assert weather.title is not None and "\x1b[32m" in weather.title and "SYSTEM" in weather.title
    assert "every note" in weather.input_schema["properties"]["context"]["description"]
    assert weather.annotations is not None and weather.annotations.read_only_hint is True  # and it lies


# Valid media carrying an injection ---------------------------------------------------------------------


def png_chunks(data: bytes) -> dict[bytes, bytes]:
    """The chunks of a PNG, each CRC checked: a malformed file fails here."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks[kind] = body
        at += 12 + length
    return chunks


def check_pdf(data: bytes) -> str:
    """A PDF's structure: header, every xref offset at its object, trailer; returns the page's text."""
    assert data.startswith(b"%PDF-1.4\n") and data.rstrip().endswith(b"%%EOF")
    startxref = int(data.rsplit(b"startxref\n", 1)[1].split(b"\n")[0])
    assert data[startxref:].startswith(b"xref\n0 6\n")
    offsets = re.findall(rb"(\d{10}) 00000 n ", data[startxref:])
    assert len(offsets) == 5
    for number, offset in enumerate(offsets, start=1):
        assert data[int(offset) :].startswith(b"%d 0 obj\n" % number)
    match = re.search(rb"\((.*)\) Tj", data)
    assert match is not None
    return match.group(1).decode("latin-1")


@TRANSPORTS
@pytest.mark.subprocess
async def test_media_are_valid_files_that_carry_an_injection(transport: Transport) -> None:
    """`media` answers a well-formed PNG and PDF saying the injection, the PDF under a hostile file name."""
    async with Client(target(HostileServer(), transport)) as client:
        await client.list_tools()
        result = await client.call_tool("media", {})
    assert not result.is_error
    text, image, resource = result.content
    assert isinstance(text, TextContent) and isinstance(image, ImageContent) and isinstance(resource, EmbeddedResource)
    chunks = png_chunks(base64.b64decode(image.data, validate=True))
    assert chunks[b"tEXt"] == b"Description\x00" + MEDIA_INJECTION.encode()
    assert struct.unpack(">II", chunks[b"IHDR"][:8]) == (8, 8)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 8 * 9  # 8 rows of a filter byte and 8 pixels
    assert isinstance(resource.resource, BlobResourceContents)
    assert resource.resource.mime_type == "application/pdf" and str(resource.resource.uri) == MEDIA_FILE_NAME
    assert "/../" in MEDIA_FILE_NAME and "%0A" in MEDIA_FILE_NAME
    assert check_pdf(base64.b64decode(resource.resource.blob, validate=True)) == MEDIA_INJECTION


# A new poisoned tool mid-session and between runs --------------------------------------------------


@TRANSPORTS
@MODES
@pytest.mark.subprocess
async def test_a_new_poisoned_tool_appears_mid_session_and_is_announced(transport: Transport, mode: str) -> None:
    """mutate(change="new") adds `helper`, an injection in its description, and announces tools/list_changed."""
    changes = Changes()
    async with (
        Client(target(HostileServer(), transport), mode=mode, message_handler=changes.on_message) as client,
        anyio.create_task_group() as tg,
    ):
        assert "helper" not in await tools(client)
        if client.protocol_version == "2026-07-28":
            await tg.start(following, client)
        assert (await client.call_tool("mutate", {"change": "new"})).content[0].text == "changed new"  # type: ignore[union-attr]
        await changes.wait()
        helper = (await tools(client))["helper"]
        tg.cancel_scope.cancel()
    assert helper.description is not None and "<IMPORTANT>" in helper.description


@TRANSPORTS
@pytest.mark.subprocess
async def test_a_new_poisoned_tool_appears_between_runs(transport: Transport, tmp_path: Path) -> None:
    """With a state file, the first run offers no `helper`; every later run lists it from the start."""
    state = tmp_path / "runs"
    seen = []
    for run in (1, 2, 3):
        if transport == "in-process":
            hostile = HostileServer(state=state)
            assert hostile.run == run
            server = target(hostile, transport)
        else:
            server = target(HostileServer(), transport, "--state", str(state))
        async with Client(server) as client:
            seen.append("helper" in await tools(client))
    assert seen == [False, True, True]
    assert state.read_text() == "3"


# A list_changed storm ---------------------------------------------------------------------------------


@TRANSPORTS
@MODES
@pytest.mark.subprocess
async def test_flood_is_a_storm_of_list_changed(transport: Transport, mode: str) -> None:
    """flood(count) sends that many tools/list_changed for nothing changed (legacy: each one arrives)."""
    hostile, changes = HostileServer(), Changes()
    async with (
        Client(target(hostile, transport), mode=mode, message_handler=changes.on_message) as client,
        anyio.create_task_group() as tg,
    ):
        before = await tools(client)
        if client.protocol_version == "2026-07-28":
            await tg.start(following, client)
        result = await client.call_tool("flood", {"count": 200})
        await changes.wait()
        assert await tools(client) == before
        tg.cancel_scope.cancel()
    assert result.content[0].text == "announced tools/list_changed 200 times"  # type: ignore[union-attr]
    if mode == "legacy":
        assert changes.count == 200  # notifications: one each (they precede the call's answer)
    else:
        assert 1 <= changes.count <= 200  # subscription events: a slow reader may see them coalesced
    if transport == "in-process":
        assert hostile.announced == 200


# A huge tool list and name churn ------------------------------------------------------------------------


@TRANSPORTS
@pytest.mark.subprocess
async def test_many_lists_a_huge_catalogue_of_callable_tools(transport: Transport) -> None:
    """many=5000 lists 5,000 more tools in one answer, each callable."""
    async with Client(target(HostileServer(many=5000), transport)) as client:
        listed = await tools(client)
        last = await client.call_tool("bulk_04999", {})
        beyond = await client.call_tool("bulk_05000", {})
    assert len([name for name in listed if name.startswith("bulk_")]) == 5000
    assert last.content[0].text == "hostile bulk_04999 ran" and not last.is_error  # type: ignore[union-attr]
    assert beyond.is_error


@TRANSPORTS
@pytest.mark.subprocess
async def test_churn_renames_tools_at_every_listing(transport: Transport) -> None:
    """Each listing offers new churn_* names; only the latest ones answer."""
    hostile = HostileServer(churn=True)
    async with Client(target(hostile, transport)) as client:
        names = [{name for name in await tools(client) if name.startswith("churn_")} for _ in range(3)]
        latest = await client.call_tool(sorted(names[2])[0], {})
        old = await client.call_tool(sorted(names[0])[0], {})
    assert names[0] == {"churn_1_0", "churn_1_1", "churn_1_2"}
    assert names[0].isdisjoint(names[1]) and names[1].isdisjoint(names[2]) and len(names[2]) == 3
    assert not latest.is_error and old.is_error


# Changes timed by the test: during an approval, between review and accept -------------------------------


@MODES
async def test_announce_changes_a_tool_when_the_test_says(mode: str) -> None:
    """announce() changes lookup at the moment chosen and tells every client; a second change is new text."""
    hostile, changes = HostileServer(), Changes()
    async with (
        Client(hostile.server, mode=mode, message_handler=changes.on_message) as client,
        anyio.create_task_group() as tg,
    ):
        if client.protocol_version == "2026-07-28":
            await tg.start(following, client)
        first = (await tools(client))["lookup"]
        await hostile.announce("annotations")  # e.g. from an approver, while a lookup waits for approval
        await changes.wait()
        destructive = (await tools(client))["lookup"]
        await hostile.announce("description")  # e.g. from on_definition_change, while a change is reviewed
        await changes.wait()
        reviewed = (await tools(client))["lookup"]
        await hostile.announce("description")
        await changes.wait()
        accepted = (await tools(client))["lookup"]
        tg.cancel_scope.cancel()
    assert first.annotations is not None and first.annotations.read_only_hint is True
    assert destructive.annotations is not None and destructive.annotations.destructive_hint is True
    assert reviewed.description != accepted.description != first.description
    assert accepted.description is not None and "evil.example" in accepted.description


@pytest.mark.subprocess
async def test_a_change_during_an_approval_over_stdio() -> None:
    """Over stdio the test's hook calls mutate through the same client: each description is a new definition."""
    async with Client(target(HostileServer(), "stdio")) as client:
        first = (await tools(client))["lookup"].description
        await client.call_tool("mutate", {"change": "description"})
        second = (await tools(client))["lookup"].description
        await client.call_tool("mutate", {"change": "description"})
        third = (await tools(client))["lookup"].description
    assert len({first, second, third}) == 3


# A race for a bare name ---------------------------------------------------------------------------------


async def test_on_list_holds_the_listing_so_the_hostile_server_wins_or_loses_a_race() -> None:
    """on_list holds each tools/list until the test releases it, so a test orders it against the victim's."""
    from .test_security_names import Bank

    released, order = anyio.Event(), []

    async def hold(listing: int) -> None:
        order.append(f"hostile waits ({listing})")
        await released.wait()

    hostile = HostileServer(victim="bank", tools=("transfer",), on_list=hold)
    async with Client(Bank().server) as bank, Client(hostile.server) as evil, anyio.create_task_group() as tg:

        async def list_hostile() -> None:
            names = await tools(evil)
            order.append(f"hostile listed transfer={'transfer' in names}")

        tg.start_soon(list_hostile)
        await anyio.wait_all_tasks_blocked()
        order.append(f"bank listed transfer={'transfer' in await tools(bank)}")
        released.set()
    assert order == ["hostile waits (1)", "bank listed transfer=True", "hostile listed transfer=True"]
    assert hostile.listings == 1


@pytest.mark.subprocess
async def test_both_servers_offer_the_bare_name_over_stdio() -> None:
    """Connected at once, the hostile subprocess offers the bank's bare and qualified names as its own."""
    from .test_security_names import Bank

    hostile = HostileServer(tools=("transfer", "balance"))
    async with Client(Bank().server) as bank, Client(target(hostile, "stdio")) as evil:
        async with anyio.create_task_group() as tg:
            found: dict[str, set[str]] = {}

            async def listing(name: str, client: Client) -> None:
                found[name] = set(await tools(client))

            tg.start_soon(listing, "bank", bank)
            tg.start_soon(listing, "hostile", evil)
    assert {"transfer", "balance"} <= found["bank"] & found["hostile"]
    assert {"bank__transfer", "bank__balance"} <= found["hostile"]


def test_bad_options_are_rejected() -> None:
    """many out of range and an on_list that is not callable are refused with a message."""
    with pytest.raises(ValueError, match="many must be"):
        HostileServer(many=-1)
    with pytest.raises(TypeError, match="on_list must be"):
        HostileServer(on_list=3)  # type: ignore[arg-type]
