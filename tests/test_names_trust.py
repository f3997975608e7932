"""Names follow trust: an untrusted server never holds a bare name a trusted one offers; qualified names on request.

The hostile server from `dispatcher.testing` runs in process and as a stdio subprocess, on asyncio and
trio; the victim is the trusted in-process bank of `test_security_names`.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations

from dispatcher import CallStatus, ConfigurationError, Dispatcher, ToolCall
from dispatcher._core._annotations import SPEC_DEFAULTS
from dispatcher._core._catalog import NAME_PATTERN, Catalog, ToolEntry
from dispatcher.testing import HostileServer

from .test_security_names import TRANSPORTS, Bank, Transport, hostile_target

pytestmark = pytest.mark.anyio


def catalogue(d: Dispatcher) -> dict[str, tuple[str | None, str, bool]]:
    """The catalogue: name -> (server, tool, trusted)."""
    return {entry.name: (entry.server, entry.tool, entry.trusted) for entry in d.tools()}


def untrusted_bare_names(d: Dispatcher) -> set[str]:
    """The oracle: bare names an untrusted tool holds although a trusted tool offers that own name."""
    trusted_tools = {entry.tool for entry in d.tools() if entry.trusted}
    return {entry.name for entry in d.tools() if not entry.trusted and entry.name in trusted_tools}


async def connect_both(d: Dispatcher, bank: Bank, hostile: HostileServer, transport: Transport, order: str) -> None:
    """Connect the bank and the hostile server one after the other, or concurrently with a head start."""
    target = hostile_target(hostile, transport)
    if order == "hostile-first":
        await d.connect("hostile", target)
        await d.connect("bank", bank.server, trusted=True)
    elif order == "bank-first":
        await d.connect("bank", bank.server, trusted=True)
        await d.connect("hostile", target)
    else:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: d.connect("hostile", target))
            if order == "concurrent-bank-late":
                await anyio.sleep(0.05)
            tg.start_soon(lambda: d.connect("bank", bank.server, trusted=True))


ORDERS = pytest.mark.parametrize("order", ["hostile-first", "bank-first", "concurrent", "concurrent-bank-late"])


@TRANSPORTS
@ORDERS
@pytest.mark.subprocess
async def test_an_untrusted_server_never_holds_a_bare_name_the_bank_offers(transport: Transport, order: str) -> None:
    """Whatever the order or timing of connect, `transfer` never reaches the untrusted server's tool."""
    bank = Bank()
    hostile = HostileServer(victim="bank", tools=("transfer", "balance"))
    async with Dispatcher() as d:
        await connect_both(d, bank, hostile, transport, order)
        names = catalogue(d)
        results = await d.dispatch(
            [ToolCall("1", "transfer", {"to": "alice"}), ToolCall("2", "hostile__transfer", {"to": "carol"})]
        )
    assert untrusted_bare_names(d) == set()
    assert names["hostile__transfer"] == ("hostile", "transfer", False)
    bare, qualified = results
    assert qualified.server == "hostile"
    assert bare.server != "hostile"
    if "transfer" in names:
        assert names["transfer"] == ("bank", "transfer", True)
        assert bare.ok and bank.transfers == ["alice"]
    else:
        # The hostile server had the name first: withdrawn from it, not moved to the bank.
        assert names["bank__transfer"] == ("bank", "transfer", True)
        assert bare.status is CallStatus.FAILED and bank.transfers == []
        assert "no longer in use" in str(bare.error)
        assert "'hostile__transfer'" in str(bare.error) and "'bank__transfer'" in str(bare.error)
    if transport == "in-process":
        assert hostile.ran("transfer") == 1  # only the call that named it


@TRANSPORTS
@pytest.mark.subprocess
async def test_a_trusted_tool_listed_later_withdraws_the_bare_name(transport: Transport) -> None:
    """A trusted server that adds `transfer` after the untrusted one took the name makes it unusable, not the bank's."""
    bank = Bank()
    bank.server.remove_tool("transfer")
    hostile = HostileServer(victim="bank", tools=("transfer",))
    async with Dispatcher() as d:
        await d.connect("bank", bank.server, trusted=True)
        await d.connect("hostile", hostile_target(hostile, transport))
        [before] = await d.dispatch([ToolCall("1", "transfer", {"to": "mallory"})])

        def transfer(to: str, amount: float = 0.0) -> str:
            bank.transfers.append(to)
            return f"bank sent {amount} to {to}"

        bank.server.add_tool(transfer, annotations=ToolAnnotations(read_only_hint=False))
        await d.refresh("bank")
        names = catalogue(d)
        after = await d.dispatch(
            [
                ToolCall("2", "transfer", {"to": "mallory"}),
                ToolCall("3", "bank__transfer", {"to": "alice"}),
                ToolCall("4", "hostile__transfer", {"to": "carol"}),
            ]
        )
    assert before.server == "hostile"  # the name meant the hostile tool while it held it
    assert "transfer" not in names
    assert names["bank__transfer"][0] == "bank" and names["hostile__transfer"][0] == "hostile"
    withdrawn, banked, hostile_call = after
    assert withdrawn.status is CallStatus.FAILED and "no longer in use" in str(withdrawn.error)
    assert banked.ok and bank.transfers == ["alice"]
    assert hostile_call.server == "hostile"
    assert untrusted_bare_names(d) == set()


async def test_a_local_function_withdraws_a_bare_name_from_an_untrusted_server() -> None:
    """A local function is trusted: an untrusted server's tool of the same name loses the bare name."""
    hostile = HostileServer(victim="bank", tools=("transfer",))
    async with Dispatcher() as d:
        await d.connect("hostile", hostile.server)

        def transfer(to: str) -> str:
            return f"local sent to {to}"

        d.add_function(transfer)
        names = catalogue(d)
        [result] = await d.dispatch([ToolCall("1", "transfer", {"to": "alice"})])
    assert names["local__transfer"] == (None, "transfer", True)
    assert names["hostile__transfer"] == ("hostile", "transfer", False)
    assert result.status is CallStatus.FAILED and hostile.ran("transfer") == 0


async def test_two_untrusted_servers_keep_the_first_come_rule() -> None:
    """Between untrusted servers the first keeps its bare name: nothing moves without a trusted claimant."""
    first, second = HostileServer(victim="x", tools=("transfer",)), HostileServer(victim="y", tools=("transfer",))
    async with Dispatcher() as d:
        await d.connect("one", first.server)
        await d.connect("two", second.server)
        names = catalogue(d)
    assert names["transfer"][0] == "one" and names["two__transfer"][0] == "two"


async def test_the_oracle_catches_an_untrusted_bare_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the rule switched off, the hostile server keeps `transfer` and the oracle says so."""
    original = Catalog._issue

    def first_come(self: Catalog, server: str | None, tool: str, *, trusted: bool, offered_by_trusted: bool) -> str:
        return original(self, server, tool, trusted=trusted, offered_by_trusted=False)

    monkeypatch.setattr(Catalog, "_issue", first_come)
    monkeypatch.setattr(Catalog, "_withdraw", lambda self, offered: None)
    bank = Bank()
    hostile = HostileServer(victim="bank", tools=("transfer",))
    async with Dispatcher() as d:
        await connect_both(d, bank, hostile, "in-process", "hostile-first")
        [result] = await d.dispatch([ToolCall("1", "transfer", {"to": "alice"})])
    assert untrusted_bare_names(d) == {"transfer"}
    assert result.server == "hostile"


# Always-qualified names ------------------------------------------------------------------------------


@TRANSPORTS
@ORDERS
@pytest.mark.subprocess
async def test_qualified_names_do_not_depend_on_order(transport: Transport, order: str) -> None:
    """With qualified_names=True every MCP tool is server__tool, whatever the order; local functions keep theirs."""
    bank = Bank()
    hostile = HostileServer(victim="bank", tools=("transfer",))
    async with Dispatcher(qualified_names=True) as d:

        def word_count(text: str) -> int:
            return len(text.split())

        d.add_function(word_count, annotations=ToolAnnotations(read_only_hint=True))
        await connect_both(d, bank, hostile, transport, order)
        names = catalogue(d)
        results = await d.dispatch(
            [
                ToolCall("1", "bank__transfer", {"to": "alice"}),
                ToolCall("2", "transfer", {"to": "bob"}),
                ToolCall("3", "balance", {}),
                ToolCall("4", "transfer", {"to": "carol"}, server="bank"),
                ToolCall("5", "word_count", {"text": "a b"}),
            ]
        )
    mcp_names = {name for name, (server, _, _) in names.items() if server is not None}
    assert all(name == f"{server}__{tool}" for name, (server, tool, _) in names.items() if server is not None), names
    assert {"bank__transfer", "bank__balance", "hostile__transfer", "hostile__lookup"} <= mcp_names
    assert names["word_count"] == (None, "word_count", True)
    qualified, bare, bare_single, by_server, local = results
    assert qualified.ok and qualified.server == "bank"
    assert bare.status is CallStatus.FAILED and "ambiguous" in str(bare.error)
    assert bare_single.status is CallStatus.FAILED and "call 'bank__balance'" in str(bare_single.error)
    assert by_server.ok and bank.transfers == ["alice", "carol"]
    assert local.ok


async def test_qualified_names_is_validated() -> None:
    """qualified_names must be a bool."""
    with pytest.raises(ConfigurationError, match="qualified_names must be True or False"):
        Dispatcher(qualified_names="yes")  # type: ignore[arg-type]


async def test_qualified_names_shorten_long_server_and_tool_names() -> None:
    """A qualified name stays a valid model-API name when the server and tool names are long."""
    server: MCPServer[Any] = MCPServer("long")

    def a_tool_with_a_rather_long_name_that_goes_on_and_on() -> str:
        return "ok"

    server.add_tool(a_tool_with_a_rather_long_name_that_goes_on_and_on)
    async with Dispatcher(qualified_names=True) as d:
        await d.connect("a-server-registered-under-a-long-name", server)
        [entry] = d.tools()
        [result] = await d.dispatch([ToolCall("1", entry.name, {})])
    assert len(entry.name) <= 64 and entry.name.startswith("a-server-registered-under-a-long-name__")
    assert result.server == "a-server-registered-under-a-long-name"


# The rule as a property of the catalogue --------------------------------------------------------

TRUST = {"bank": True, "vault": True, "evil": False, "spam": False}
NAMES = ["transfer", "balance", "bank__transfer", "lookup"]

name_operation: st.SearchStrategy[tuple[Any, ...]] = st.one_of(
    st.tuples(st.just("list"), st.sampled_from(sorted(TRUST)), st.sets(st.sampled_from(NAMES))),
    st.tuples(st.just("remove"), st.sampled_from(sorted(TRUST)), st.just(frozenset())),
    st.tuples(st.just("function"), st.just(None), st.sets(st.sampled_from(NAMES), max_size=1)),
)


class _Unused:
    def prepare(self, arguments: Any) -> Any:
        return arguments

    async def invoke(self, prepared: Any, lease: object = None) -> CallToolResult:
        raise AssertionError("not called")


@settings(max_examples=300, deadline=None)
@given(operations=st.lists(name_operation, max_size=25), qualified=st.booleans())
def test_names_follow_trust_in_any_order(operations: list[tuple[Any, ...]], qualified: bool) -> None:
    """Servers of either trust listing, changing and leaving in any order, local functions added meanwhile:
    no untrusted tool holds a bare name a trusted tool has as its own, and a name never moves to another tool."""
    catalog = Catalog(qualified=qualified)
    seen: dict[str, tuple[str | None, str]] = {}
    for kind, server, tools in operations:
        if kind == "remove":
            catalog.remove_server(server)
            seen = {name: key for name, key in seen.items() if key[0] != server}
        elif kind == "function":
            for tool in tools:
                if not catalog.has(None, tool):
                    catalog.put([(ToolEntry(tool, None, tool, SPEC_DEFAULTS, trusted=True), _Unused())])
        else:
            catalog.add_server(server)
            trusted = TRUST[server]
            rows = [
                (ToolEntry(tool, server, tool, SPEC_DEFAULTS, trusted=trusted), _Unused(), None)
                for tool in sorted(tools)
            ]
            catalog.set_server_tools(server, rows)
        trusted_own = {tool for (owner, tool) in catalog._names if owner is None or TRUST[owner]}
        for key, name in catalog._names.items():
            owner, tool = key
            assert NAME_PATTERN.match(name)
            if owner is not None and not TRUST[owner]:
                assert not (name == tool and tool in trusted_own), f"untrusted {key} holds {name!r}"
            if qualified and owner is not None:
                assert "__" in name
        assert len(set(catalog._names.values())) == len(catalog._names)
        for name in list(catalog._issued) + list(seen):
            resolution = catalog.resolve(name)
            target = (resolution.entry.server, resolution.entry.tool) if resolution.entry is not None else None
            if target is not None:
                assert seen.setdefault(name, target) == target, f"{name!r} moved from {seen[name]} to {target}"
