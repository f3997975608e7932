"""OpenAI Agents SDK: the dispatcher's catalogue as an agent's function tools, scheduled by the dispatcher.

The SDK starts one task per function call of a model response, all at once, in no particular order.
`DispatcherTools` gives the agent one ``FunctionTool`` per catalogue entry and a hook that reads each
model response; every call the SDK then starts is handed to one dispatcher batch per response at its
position in the response (`Batch.submit_at`), so reads run together, writes run alone in the model's
order, only trusted servers' hints count, retries follow the `RetryPolicy`, and approvals are asked by
the dispatcher's approver while the call keeps its place.

Approvals, two ways. By default (``approvals="dispatcher"``) the dispatcher's approver is asked while
the call keeps its place, and a denial is a result the model reads. With ``approvals="sdk"`` the SDK's
own human-in-the-loop flow asks (``needs_approval``, ``result.interruptions``, ``RunState.approve`` /
``reject``): the SDK runs the other calls of a response at once while the selected ones wait for a later
run, so from the first call the approval policy selects on, every call of that response is held for
approval too (reads included); the calls before it run at once. On the run that resumes, rejected calls
are skipped and the approved ones run in the model's order; a call behind one that is still undecided is
refused with a message saying so. Resuming from a serialized ``RunState`` in another process is not
supported (the positions live in this object).

Every call of a response that names one of these tools must reach it: an ``is_enabled`` of False or a
tool input guardrail that rejects a call would leave the calls after it waiting, so neither is set here.

Requires the ``openai-agents`` extra. The SDK runs on asyncio only.

Example:
    ```python
    tools = DispatcherTools(dispatcher)
    agent = Agent(name="assistant", tools=tools.tools, hooks=tools.hooks)
    result = await Runner.run(agent, "...")
    ```
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from agents import AgentHooks, FunctionTool, Tool
from openai.types.responses import ResponseFunctionToolCall

from dispatcher._approval import ApprovalPolicy
from dispatcher._calls import ToolCall
from dispatcher._errors import ConfigurationError

from ._common import model_text

if TYPE_CHECKING:
    from agents import Agent, ModelResponse, RunContextWrapper
    from agents.tool_context import ToolContext

    from dispatcher import Batch, Dispatcher
    from dispatcher._approval import Approver, SessionGuard
    from dispatcher._calls import ToolResult
    from dispatcher._catalog import ToolEntry

__all__ = ["DispatcherTools"]


class DispatcherTools:
    """The catalogue of a `Dispatcher` as OpenAI Agents SDK tools, and the hook that keeps their order.

    Give the agent both: ``Agent(tools=tools.tools, hooks=tools.hooks)`` (or call `response_received`
    from hooks of your own). `tools` is built from the catalogue when this object is made; make a new
    one after the catalogue changes.

    Args:
        dispatcher: An open dispatcher holding the tools.
        approvals: ``"dispatcher"`` to ask the dispatcher's approver in place, or ``"sdk"`` for the SDK's
            ``needs_approval`` flow (see the module docstring).
        approve: The approver for these calls, instead of the dispatcher's (see `Dispatcher.dispatch`).
        approval: The approval policy, instead of the dispatcher's.
        guard: The session guard of this agent's session, instead of the dispatcher's.

    Raises:
        ConfigurationError: ``approvals`` is neither ``"dispatcher"`` nor ``"sdk"``.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        approvals: Literal["dispatcher", "sdk"] = "dispatcher",
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> None:
        if approvals not in ("dispatcher", "sdk"):
            raise ConfigurationError(f"approvals must be 'dispatcher' or 'sdk', got {approvals!r}")
        self.dispatcher = dispatcher
        self._sdk_approvals = approvals == "sdk"
        self._approve = approve
        self._approval = approval
        self._guard = guard
        self._entries = {entry.name: entry for entry in dispatcher.tools()}
        # call id -> (the turn of its model response, its position among that response's calls)
        self._placed: dict[str, tuple[_Turn, int]] = {}
        # approvals="sdk": the calls put to the SDK's approval (needs_approval), by call id.
        self._held: set[str] = set()
        # Call ids a model response used more than once: their extra calls are refused, not an error of setup.
        self._repeated: set[str] = set()
        self.tools: list[Tool] = [self._tool(entry) for entry in self._entries.values()]
        """One ``FunctionTool`` per catalogue entry."""
        self.hooks: AgentHooks[Any] = _Hooks(self)
        """Agent hooks that call `response_received` for each model response."""

    def response_received(self, response: ModelResponse) -> None:
        """Start a batch for the function calls of a model response, numbering them in response order."""
        calls = [
            item.call_id
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall) and item.name in self._entries
        ]
        # A call id the model repeats is numbered once: its second call finds no place and is refused
        # (see `_invoke`), instead of leaving a position that no call fills.
        counts = Counter(calls)
        unique = list(counts)
        self._repeated.update(call_id for call_id, count in counts.items() if count > 1)
        if not unique:
            return
        names = {item.call_id: item.name for item in response.output if isinstance(item, ResponseFunctionToolCall)}
        if self._sdk_approvals:
            # The SDK asks for approval and meanwhile runs the other calls of the response: so from the
            # first call the policy selects on, every call is held for approval, to keep the order.
            policy = self._approval if self._approval is not None else ApprovalPolicy()
            selected = [policy.reason(self._entries[names[call_id]]) is not None for call_id in unique]
            first = selected.index(True) if True in selected else len(unique)
            batch = self.dispatcher.batch(approve=self._approve, approval=_ASKED, guard=self._guard)
            turn = _Turn(
                batch, [(position, unique[position], names[unique[position]]) for position in range(first, len(unique))]
            )
            self._held.update(unique[first:])
        else:
            batch = self.dispatcher.batch(approve=self._approve, approval=self._approval, guard=self._guard)
            turn = _Turn(batch, [])
        for position, call_id in enumerate(unique):
            self._placed[call_id] = (turn, position)

    async def _needs_approval(self, context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
        return call_id in self._held

    def _tool(self, entry: ToolEntry) -> FunctionTool:
        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            return await self._invoke(entry, context, arguments)

        return FunctionTool(
            name=entry.name,
            description=entry.description or entry.name,
            params_json_schema=dict(entry.input_schema),
            on_invoke_tool=invoke,
            # MCP input schemas are rarely valid strict schemas (optional fields, open objects).
            strict_json_schema=False,
            needs_approval=self._needs_approval if self._sdk_approvals else False,
        )

    async def _invoke(self, entry: ToolEntry, context: ToolContext[Any], arguments: str) -> str:
        placed = self._placed.pop(context.tool_call_id, None)
        if placed is None and context.tool_call_id in self._repeated:
            return f"Error (failed): the call id {context.tool_call_id[:100]!r} was used twice in one response; not run"
        if placed is None:
            raise ConfigurationError(
                f"call {context.tool_call_id!r} of {entry.name} came from no model response these tools saw: "
                "give the agent hooks=tools.hooks (or call tools.response_received from your hooks)"
            )
        turn, position = placed
        batch = turn.batch
        self._held.discard(context.tool_call_id)
        if turn.held and not turn.settle_held(context, position):
            batch.skip(position)
            return (
                "Error (denied): not run: a call before it in the same response still waits for approval; "
                "decide that one, then ask for this call again"
            )
        try:
            parsed: Any = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            parsed = arguments  # dispatching it gives a FAILED result that explains the syntax error
        pending = await batch.submit_at(position, ToolCall(context.tool_call_id, entry.name, parsed))
        try:
            result = await pending.wait()
        except BaseException:
            pending.cancel()  # the SDK gave up on this call (a timeout, a cancelled run)
            raise
        return _answer(result)


# A call approved through the SDK is not put to the dispatcher's approver again.
_ASKED = ApprovalPolicy(destructive=False)


class _Turn:
    """The batch of one model response and, with SDK approvals, its calls held for approval."""

    __slots__ = ("batch", "held")

    def __init__(self, batch: Batch, held: list[tuple[int, str, str]]) -> None:
        self.batch = batch
        self.held = held  # (position, call id, tool name), in position order

    def settle_held(self, context: ToolContext[Any], position: int) -> bool:
        """Skip the held calls the person rejected (the SDK never runs them); False if one before
        `position` is still undecided (it will not run in this pass, so this call cannot wait for it)."""
        undecided = []
        for held_position, call_id, tool in self.held:
            if held_position == position:
                continue
            decision = context.is_tool_approved(tool, call_id)
            if decision is False:
                self.batch.skip(held_position)
            elif decision is None:
                undecided.append((held_position, call_id, tool))
        self.held = [entry for entry in self.held if entry[0] != position and entry in undecided]
        return not any(held_position < position for held_position, _, _ in undecided)


def _answer(result: ToolResult) -> str:
    text = model_text(result)
    return text if result.ok else f"Error ({result.status.value}): {text}"


class _Hooks(AgentHooks[Any]):
    def __init__(self, tools: DispatcherTools) -> None:
        self._tools = tools

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        self._tools.response_received(response)
