"""Claude Agent SDK: the catalogue as its in-process MCP server, and the approval policy as its permission callback.

The Claude Agent SDK runs the model and the tool loop inside the Claude Code CLI, a separate process.
The CLI decides how the calls of a turn are run and sends them to tools one at a time, so the dispatcher
cannot group a turn's calls or hold a write until the calls before it have finished. What it can do:

- `sdk_server` serves the catalogue as an in-process MCP server (``create_sdk_mcp_server``) whose tools
  carry the **effective** annotations: an untrusted server's tools appear as the spec's worst case
  (not read-only, destructive, open-world), so the CLI, which runs read-only tools concurrently, does
  not run them together on a server's word; each call goes through the dispatcher (retries for
  idempotent tools of trusted servers, timeouts, limits, open-world content marked untrusted);
- `permission_callback` is a ``can_use_tool`` callback from the dispatcher's own approval policy and
  approver (its ``always``, ``never``, rules and ``timeout``; unless you pass others): a call the policy
  selects is put to the approver, the server's other calls are allowed, and calls of any other tool (the
  CLI's own included) go to a callback of yours or are denied; a denial reaches the model as the CLI's
  permission denial. An approver that fails, answers anything but True, or takes longer than the
  policy's timeout denies, as in the dispatcher;
- `claude_options` gives both as keyword arguments for ``ClaudeAgentOptions``.

What it cannot do: keep the model's order between a turn's calls (the CLI orders them), group a turn's
reads into one batch, or see a turn's calls before they run. ``allowed_tools`` entries and permission
modes such as ``bypassPermissions`` skip ``can_use_tool``: do not list these tools there.

Requires the ``claude-agent-sdk`` extra; a real run needs the Claude Code CLI it bundles and an API key.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Final

from claude_agent_sdk import (
    PermissionResultAllow,
    PermissionResultDeny,
    SdkMcpTool,
    ToolPermissionContext,
    create_sdk_mcp_server,
)

from dispatcher import ApprovalPolicy, ApprovalRequest, ToolCall
from dispatcher.formats import tool_description, tool_schema

from ._common import model_text

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from claude_agent_sdk import CanUseTool, McpSdkServerConfig

    from dispatcher import Dispatcher, SessionGuard, ToolEntry, ToolResult

    Approver = Callable[[ApprovalRequest], Awaitable[bool]]

__all__ = ["claude_options", "permission_callback", "sdk_server"]

# The permission callback has already asked; the dispatcher does not ask again when the call runs.
_ASKED = ApprovalPolicy(destructive=False)


class _Default:
    """The dispatcher's own approver (the default of ``approve``): distinct from None, which asks nobody."""

    def __repr__(self) -> str:
        return "<the dispatcher's approver>"


_DISPATCHERS: Final = _Default()


def sdk_server(
    dispatcher: Dispatcher,
    *,
    name: str = "dispatcher",
    guard: SessionGuard | None = None,
    approve: Approver | None = None,
) -> McpSdkServerConfig:
    """The catalogue as a Claude Agent SDK in-process MCP server, for ``ClaudeAgentOptions.mcp_servers``.

    Each tool carries its effective annotations; each call runs through the dispatcher as a batch of
    one, without asking the approval policy again (the permission callback asks). The session guard
    still applies: a call it requires approval for is put to `approve`.

    Args:
        dispatcher: An open dispatcher holding the tools (the server lists the catalogue as it is now).
        name: The server's name; the CLI calls its tools ``mcp__<name>__<tool>``.
        guard: The session guard of this agent's session, instead of the dispatcher's.
        approve: The approver the guard's approvals go to; None: the dispatcher's.
    """
    ids = itertools.count(1)
    tools = [_sdk_tool(dispatcher, entry, ids, guard, approve) for entry in dispatcher.tools()]
    return create_sdk_mcp_server(name, tools=tools)


def permission_callback(
    dispatcher: Dispatcher,
    *,
    name: str = "dispatcher",
    approve: Approver | _Default | None = _DISPATCHERS,
    approval: ApprovalPolicy | None = None,
    other_tools: CanUseTool | None = None,
) -> CanUseTool:
    """A ``can_use_tool`` callback that applies the dispatcher's approval policy to its server's tools.

    A call of one of the tools of the server called `name` that the policy selects (from the tool's
    effective annotations and its ``always``/``never`` sets) is put to the approver, as an
    `ApprovalRequest`, within the policy's ``timeout``; every other call is allowed. With
    ``approve=None``, selected calls are denied. The CLI asks this callback about every tool its own
    rules leave open (its built-in tools too): those that are not the server's go to `other_tools`, and
    are denied when it is None.

    Args:
        dispatcher: The dispatcher behind the server.
        name: The server's name, as given to `sdk_server`.
        approve: The approver (the same kind of callable as `Dispatcher`'s ``approve``), or None to deny
            every call the policy selects. Default: the dispatcher's own approver.
        approval: The policy. Default: the dispatcher's own (`Dispatcher(approval=...)`, else
            `ApprovalPolicy()`), read when each call is asked about.
        other_tools: The ``can_use_tool`` callback for every other tool, or None to deny them.
    """
    prefix = f"mcp__{name}__"

    async def can_use_tool(tool_name: str, arguments: dict[str, Any], context: ToolPermissionContext) -> Any:
        if not tool_name.startswith(prefix):
            if other_tools is not None:
                return await other_tools(tool_name, arguments, context)
            return PermissionResultDeny(message=f"{tool_name[:100]} is not allowed: no permission callback for it")
        entry = next((e for e in dispatcher.tools() if e.name == tool_name[len(prefix) :]), None)
        if entry is None:
            return PermissionResultDeny(message=f"{tool_name} is not in the dispatcher's catalogue")
        policy = approval if approval is not None else dispatcher.approval
        reason = policy.reason(entry)
        if reason is None:
            return PermissionResultAllow()
        approver = dispatcher.approver if isinstance(approve, _Default) else approve
        call = ToolCall(context.tool_use_id or tool_name, entry.name, arguments)
        # The dispatcher's own asking: in turn with its other prompts (one person, one prompt at a time),
        # its timeout, and its answers for a failing or odd approver.
        denial = await dispatcher.ask_approval(approver, ApprovalRequest(call, entry, reason), policy)
        if denial is None:
            return PermissionResultAllow()
        return PermissionResultDeny(message=denial)

    return can_use_tool


def claude_options(
    dispatcher: Dispatcher,
    *,
    name: str = "dispatcher",
    approve: Approver | _Default | None = _DISPATCHERS,
    approval: ApprovalPolicy | None = None,
    guard: SessionGuard | None = None,
    other_tools: CanUseTool | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``ClaudeAgentOptions``: ``mcp_servers`` and ``can_use_tool``.

    The dispatcher's approver, approval policy and session guard apply unless others are given (see
    `permission_callback` and `sdk_server`).

    Example:
        ```python
        options = ClaudeAgentOptions(**claude_options(dispatcher, approve=ask), model="claude-sonnet-4-5")
        ```
    """
    return {
        "mcp_servers": {
            name: sdk_server(
                dispatcher, name=name, guard=guard, approve=None if isinstance(approve, _Default) else approve
            )
        },
        "can_use_tool": permission_callback(
            dispatcher, name=name, approve=approve, approval=approval, other_tools=other_tools
        ),
    }


def _sdk_tool(
    dispatcher: Dispatcher,
    entry: ToolEntry,
    ids: itertools.count[int],
    guard: SessionGuard | None,
    approve: Approver | None,
) -> SdkMcpTool[Any]:
    async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
        call = ToolCall(f"claude-{next(ids)}", entry.name, arguments)
        [result] = await dispatcher.dispatch([call], approve=approve, approval=_ASKED, guard=guard)
        return _content(result)

    annotations = entry.annotations
    if not entry.trusted and annotations.title is not None:
        # The title is the server's text, shown by the CLI as is: an untrusted one stays in the marked
        # description (which has it when there is no description), never beside it unmarked.
        annotations = annotations.model_copy(update={"title": None})
    schema = tool_schema(entry)
    # The SDK takes a dict without a string "type" and "properties" for its short form ({name: python
    # type}), making each top-level key a required argument ({"type": "object"} would ask for an argument
    # "type"): the schema is given both, which changes nothing it accepts.
    if not isinstance(schema.get("type"), str):
        schema["type"] = "object"
    schema.setdefault("properties", {})
    return SdkMcpTool(
        name=entry.name,
        description=tool_description(entry) or entry.name,
        input_schema=schema,
        handler=handler,
        annotations=annotations,
    )


def _content(result: ToolResult) -> dict[str, Any]:
    text = model_text(result)
    if not result.ok:
        text = f"Error ({result.status.value}): {text}"
    return {"content": [{"type": "text", "text": text}], "is_error": not result.ok}
