"""OpenAI Agents SDK: the dispatcher's catalogue as an agent's function tools, scheduled by the dispatcher.

The SDK starts one task per function call of a model response, all at once, in no particular order.
`DispatcherTools` gives the agent one ``FunctionTool`` per catalogue entry and a hook that reads each
model response; every call the SDK then starts is handed to one dispatcher batch per response at its
position in the response (`Batch.submit_at`), so reads run together, writes run alone in the model's
order, only trusted servers' hints count, retries follow the `RetryPolicy`, and approvals are asked by
the dispatcher's approver while the call keeps its place.

A call the SDK never hands to its tool gives up its place, so that the calls after it are not left
waiting for it. The hook numbers only the calls the SDK will route to these tools (a tool missing from
``agent.tools`` or whose ``is_enabled`` is false is the SDK's "tool not found"), and the tools keep
hold of the two SDK settings that stop a call before it reaches the tool:

- ``tool_input_guardrails`` set on one of these tools run inside a guardrail of the adapter's own,
  which gives the call's place up when one of them rejects it (``reject_content`` or
  ``raise_exception``); the SDK's guardrail results name that guardrail (``dispatcher_order``), and
  its output is the rejecting guardrail's;
- ``needs_approval`` set on one of these tools (True, or a function of the call) is honoured like
  ``approvals="sdk"``: from the first call that needs approval on, every call of that response waits
  for the SDK's approval too, so that nothing after it runs first; a call the person approved there is
  not put to the dispatcher's approver again.

Approvals, two ways. By default (``approvals="dispatcher"``) the dispatcher's approver is asked while
the call keeps its place, and a denial is a result the model reads. With ``approvals="sdk"`` the SDK's
own human-in-the-loop flow asks (``needs_approval``, ``result.interruptions``, ``RunState.approve`` /
``reject``) for the calls the approval policy selects: the SDK runs the other calls of a response at
once while the selected ones wait for a later run, so from the first selected call on, every call of
that response is held for approval too (reads included); the calls before it run at once. On the run
that resumes, rejected calls give up their place and the approved ones run in the model's order; a call
behind one that is still undecided is refused with a message saying so. Resuming from a serialized
``RunState`` in another process is not supported (the positions live in this object).

A name that is no tool of the agent is the SDK's business, before any tool runs: by default
(``RunConfig(tool_not_found_behavior="raise_error")``) the run fails with ``ModelBehaviorError``; with
``tool_not_found_behavior="return_error_to_model"`` the model reads an error for that call and the
other calls run.

Requires the ``openai-agents`` extra. The SDK runs on asyncio only.

Example:
    ```python
    tools = DispatcherTools(dispatcher)
    agent = Agent(name="assistant", tools=tools.tools, hooks=tools.hooks)
    result = await Runner.run(agent, "...")
    ```
"""

from __future__ import annotations

import functools
import inspect
import json
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from agents import (
    AgentHooks,
    FunctionTool,
    Tool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
)
from openai.types.responses import ResponseFunctionToolCall

from dispatcher import ApprovalPolicy, ConfigurationError, ToolCall
from dispatcher.formats import tool_description, tool_schema

from ._common import model_text

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from agents import Agent, ModelResponse, RunContextWrapper
    from agents.tool_context import ToolContext

    from dispatcher import ApprovalRequest, Approver, Batch, Dispatcher, SessionGuard, ToolEntry, ToolResult

__all__ = ["DispatcherTools"]

# The name of the adapter's own input guardrail, which runs the tool's guardrails (see the module docstring).
GUARDRAIL_NAME = "dispatcher_order"


class DispatcherTools:
    """The catalogue of a `Dispatcher` as OpenAI Agents SDK tools, and the hook that keeps their order.

    Give the agent both: ``Agent(tools=tools.tools, hooks=tools.hooks)`` (or call the hooks'
    ``on_llm_end`` from hooks of your own). `tools` follows the catalogue: the hooks call `refresh` when
    an agent starts, after each model response and after each call, so tools that a server adds (``tools/list_changed``)
    or that you register are shown to the model from its next turn on. `refresh` updates the list in
    place: give the agent this very list (``tools=tools.tools``), or call `refresh` and copy it again.

    Args:
        dispatcher: An open dispatcher holding the tools.
        approvals: ``"dispatcher"`` to ask the dispatcher's approver in place, or ``"sdk"`` for the SDK's
            ``needs_approval`` flow (see the module docstring).
        approve: The approver for these calls, instead of the dispatcher's (see `Dispatcher.dispatch`);
            only with ``approvals="dispatcher"``.
        approval: The approval policy, instead of the dispatcher's.
        guard: The session guard of this agent's session, instead of the dispatcher's.

    Raises:
        ConfigurationError: ``approvals`` is neither ``"dispatcher"`` nor ``"sdk"``, or an approver is
            given with ``approvals="sdk"`` (the SDK asks, so it would never be called).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        approvals: Literal["dispatcher", "sdk"] = "dispatcher",
        approve: Callable[[ApprovalRequest], Awaitable[bool]] | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> None:
        if approvals not in ("dispatcher", "sdk"):
            raise ConfigurationError(f"approvals must be 'dispatcher' or 'sdk', got {approvals!r}")
        if approvals == "sdk" and approve is not None:
            raise ConfigurationError(
                "with approvals='sdk' the SDK asks the person (RunState.approve / reject), so approve= would "
                "never be called: drop approve=, or use approvals='dispatcher' to have it asked in place"
            )
        self.dispatcher = dispatcher
        self._sdk_approvals = approvals == "sdk"
        self._approve = approve
        self._approval = approval
        self._guard = guard
        self._entries: dict[str, ToolEntry] = {}
        self._functions: dict[str, FunctionTool] = {}
        # The SDK settings lifted off the tools (see `_lift`): the user's input guardrails and
        # needs_approval, by tool name. The tools themselves hold the adapter's stand-ins.
        self._guardrails: dict[str, list[ToolInputGuardrail[Any]]] = {}
        self._guardrail_of: dict[str, ToolInputGuardrail[Any]] = {}
        self._user_approval: dict[str, Any] = {}
        self._ask = self._needs_approval  # one bound method, so that `is` finds it on the tools
        # call id -> (the turn of its model response, its position among that response's calls)
        self._placed: dict[str, tuple[_Turn, int]] = {}
        # The calls put to the SDK's approval (needs_approval), by call id.
        self._held: set[str] = set()
        # Call ids a model response used more than once: their extra calls are refused, not an error of setup.
        self._repeated: set[str] = set()
        self.tools: list[Tool] = []
        """One ``FunctionTool`` per catalogue entry (and whatever else you add to this list)."""
        self.refresh()
        self.hooks: AgentHooks[Any] = _Hooks(self)
        """Agent hooks: number each model response's calls; `refresh` on start, after responses and calls."""

    def refresh(self) -> None:
        """Make `tools` match the catalogue, in place: new entries appended, removed ones dropped.

        A tool that stays keeps its ``FunctionTool`` object (and the settings you gave it); a changed
        description or schema is updated on it. Tools of your own in the list are kept.
        """
        entries = {entry.name: entry for entry in self.dispatcher.tools()}
        ours = {id(tool) for tool in self._functions.values()}
        others = [tool for tool in self.tools if id(tool) not in ours]
        for name, entry in entries.items():
            tool = self._functions.get(name)
            if tool is None:
                self._functions[name] = self._tool(entry)
            elif self._entries.get(name) != entry:
                tool.description = tool_description(entry) or entry.name
                tool.params_json_schema = tool_schema(entry)
        for name in [name for name in self._functions if name not in entries]:
            del self._functions[name]
        self._entries = entries
        self.tools[:] = [*self._functions.values(), *others]

    def response_received(self, response: ModelResponse) -> None:
        """Start a batch for the function calls of a model response, numbering them in response order.

        For hooks of your own that cannot await: it reads ``is_enabled`` and ``needs_approval`` only when
        they are booleans. Prefer awaiting ``tools.hooks.on_llm_end(context, agent, response)``.

        Raises:
            ConfigurationError: One of the tools has an ``is_enabled`` or ``needs_approval`` function,
                which needs the run's context: use the hooks instead.
        """
        for tool in self._functions.values():
            if callable(tool.is_enabled) or (tool.needs_approval is not self._ask and callable(tool.needs_approval)):
                raise ConfigurationError(
                    f"the tool {tool.name!r} has an is_enabled or needs_approval function, which needs the run's "
                    "context: give the agent hooks=tools.hooks, or await tools.hooks.on_llm_end(context, agent, "
                    "response) from your hooks"
                )
        self._lift_all()
        enabled = {name for name, tool in self._functions.items() if tool.is_enabled}
        self._number(response, enabled, lambda call_id, name, arguments: self._user_approval.get(name) is True)

    async def _received(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        self._lift_all()
        given = {id(tool) for tool in agent.tools}
        enabled = set()
        for name, tool in self._functions.items():
            # The SDK routes a call to a tool only if the agent has it and it is enabled; any other call
            # is "tool not found" and never reaches a tool, so it must not hold a place.
            if id(tool) in given and await _maybe(
                tool.is_enabled(context, agent) if callable(tool.is_enabled) else tool.is_enabled
            ):
                enabled.add(name)
        selected: dict[str, bool] = {}
        for item in response.output:
            if isinstance(item, ResponseFunctionToolCall) and item.name in enabled:
                user = self._user_approval.get(item.name, False)
                if callable(user):
                    user = await _maybe(user(context, _parameters(item.arguments), item.call_id))
                selected[item.call_id] = bool(user)
        self._number(response, enabled, lambda call_id, name, arguments: selected.get(call_id, False))

    def _number(
        self, response: ModelResponse, enabled: set[str], user_selects: Callable[[str, str, str], bool]
    ) -> None:
        items = [
            item for item in response.output if isinstance(item, ResponseFunctionToolCall) and item.name in enabled
        ]
        # A call id the model repeats is numbered once: its second call finds no place and is refused
        # (see `_invoke`), instead of leaving a position that no call fills.
        counts = Counter(item.call_id for item in items)
        self._repeated.update(call_id for call_id, count in counts.items() if count > 1)
        first_of: dict[str, ResponseFunctionToolCall] = {}
        for item in items:
            first_of.setdefault(item.call_id, item)
        unique = list(first_of.values())
        if not unique:
            return
        policy = self._approval if self._approval is not None else ApprovalPolicy()
        selected = [
            (self._sdk_approvals and policy.reason(self._entries[item.name]) is not None)
            or user_selects(item.call_id, item.name, item.arguments)
            for item in unique
        ]
        # The SDK asks for approval and meanwhile runs the other calls of the response: so from the
        # first call selected for it on, every call is held for approval, to keep the order.
        first = selected.index(True) if True in selected else len(unique)
        if self._sdk_approvals:
            # A call approved through the SDK is not put to the dispatcher's approver again.
            batch = self.dispatcher.batch(approval=_ASKED, guard=self._guard)
        else:
            # The calls held for the SDK's approval reach their tool only once the person approved them
            # there: the dispatcher's approver is not asked about them a second time.
            approve = self._approve if self._approve is not None else self.dispatcher.approver
            held = frozenset(item.call_id for item in unique[first:])
            if held and approve is not None:
                approve = functools.partial(_unless_approved, held, approve)
            batch = self.dispatcher.batch(approve=approve, approval=self._approval, guard=self._guard)
        turn = _Turn(
            batch,
            [(position, unique[position].call_id, unique[position].name) for position in range(first, len(unique))],
        )
        self._held.update(item.call_id for item in unique[first:])
        for position, item in enumerate(unique):
            self._placed[item.call_id] = (turn, position)

    def _lift_all(self) -> None:
        for tool in self._functions.values():
            self._lift(tool)

    def _lift(self, tool: FunctionTool) -> None:
        """Take the SDK settings that stop a call before its tool off the tool, leaving stand-ins that
        give the call's place up (see the module docstring)."""
        name = tool.name
        if tool.needs_approval is not self._ask:
            if tool.needs_approval is False:
                self._user_approval.pop(name, None)
            else:
                self._user_approval[name] = tool.needs_approval
            tool.needs_approval = self._ask
        mine = self._guardrail_of.get(name)
        current = list(tool.tool_input_guardrails or [])
        if current == ([mine] if mine is not None else []) and all(g is mine for g in current):
            return
        users: list[ToolInputGuardrail[Any]] = []
        for guardrail in current:
            users.extend(self._guardrails.get(name, []) if guardrail is mine else [guardrail])
        self._guardrails[name] = users
        if users:
            if mine is None:
                mine = ToolInputGuardrail(_GuardInput(self, name), name=GUARDRAIL_NAME)
                self._guardrail_of[name] = mine
            tool.tool_input_guardrails = [mine]
        else:
            tool.tool_input_guardrails = None

    async def _needs_approval(self, context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
        return call_id in self._held

    def give_up(self, call_id: str) -> None:
        """Say that the call with this id will not reach its tool: the calls after it go on without it."""
        placed = self._placed.pop(call_id, None)
        self._held.discard(call_id)
        if placed is not None:
            turn, position = placed
            turn.give_up(position)

    def _tool(self, entry: ToolEntry) -> FunctionTool:
        name = entry.name

        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            return await self._invoke(name, context, arguments)

        return FunctionTool(
            name=entry.name,
            description=tool_description(entry) or entry.name,
            params_json_schema=tool_schema(entry),
            on_invoke_tool=invoke,
            # MCP input schemas are rarely valid strict schemas (optional fields, open objects).
            strict_json_schema=False,
            needs_approval=self._ask,
        )

    async def _invoke(self, name: str, context: ToolContext[Any], arguments: str) -> str:
        call_id = context.tool_call_id
        placed = self._placed.pop(call_id, None)
        if placed is None and call_id in self._repeated:
            return f"Error (failed): the call id {call_id[:100]!r} was used twice in one response; not run"
        if placed is None:
            raise ConfigurationError(
                f"call {call_id!r} of {name} came from no model response these tools saw: give the agent "
                "hooks=tools.hooks (or call them from your hooks), and resume an interrupted run with the same "
                "DispatcherTools object"
            )
        turn, position = placed
        self._held.discard(call_id)
        if turn.held:
            for rejected in turn.rejected(context, position):
                self.give_up(rejected)
            if turn.waits_behind(position):
                turn.give_up(position)
                return (
                    "Error (denied): not run: a call before it in the same response still waits for approval; "
                    "decide that one, then ask for this call again"
                )
        turn.hand_over(position)
        pending = await turn.batch.submit_at(position, ToolCall(call_id, name, _parameters(arguments)))
        try:
            result = await pending.wait()
        except BaseException:
            pending.cancel()  # the SDK gave up on this call (a timeout, a cancelled run)
            raise
        return _answer(result)


# A call approved through the SDK is not put to the dispatcher's approver again.
_ASKED = ApprovalPolicy(destructive=False)


async def _unless_approved(held: frozenset[str], approve: Approver, request: ApprovalRequest) -> bool:
    """Approve a call the person approved through the SDK; ask `approve` about the others."""
    return True if request.call.id in held else await approve(request)


class _GuardInput:
    """The adapter's input guardrail of one tool: runs the tool's own guardrails in order, and gives the
    call's place up when one of them does not allow it."""

    __slots__ = ("__name__", "_name", "_tools")

    def __init__(self, tools: DispatcherTools, name: str) -> None:
        self._tools = tools
        self._name = name
        self.__name__ = GUARDRAIL_NAME

    async def __call__(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        for guardrail in list(self._tools._guardrails.get(self._name, [])):
            try:
                output = await guardrail.run(data)
            except BaseException:
                self._tools.give_up(data.context.tool_call_id)  # the SDK fails the call, or the run
                raise
            if output.behavior["type"] != "allow":
                self._tools.give_up(data.context.tool_call_id)
                return output
        return ToolGuardrailFunctionOutput.allow()


class _Turn:
    """The batch of one model response and, with SDK approvals, its calls held for approval."""

    __slots__ = ("batch", "handed", "held")

    def __init__(self, batch: Batch, held: list[tuple[int, str, str]]) -> None:
        self.batch = batch
        self.held = held  # (position, call id, tool name), in position order, while undecided
        self.handed: set[int] = set()

    def hand_over(self, position: int) -> None:
        self.handed.add(position)
        self.held = [entry for entry in self.held if entry[0] != position]

    def give_up(self, position: int) -> None:
        """The call at `position` will not come: the calls after it may go on."""
        if position not in self.handed:
            self.hand_over(position)
            self.batch.skip(position)

    def rejected(self, context: ToolContext[Any], position: int) -> list[str]:
        """The held calls (other than the one at `position`) the person rejected: the SDK never runs them."""
        return [
            call_id
            for held_position, call_id, tool in self.held
            if held_position != position and context.is_tool_approved(tool, call_id) is False
        ]

    def waits_behind(self, position: int) -> bool:
        """Whether a held call before `position` is still undecided (it will not run in this pass)."""
        return any(held_position < position for held_position, _, _ in self.held)


def _parameters(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments  # dispatching it gives a FAILED result that explains the syntax error


async def _maybe(value: Any) -> bool:
    if inspect.isawaitable(value):
        value = await value
    return bool(value)


def _answer(result: ToolResult) -> str:
    text = model_text(result)
    return text if result.ok else f"Error ({result.status.value}): {text}"


class _Hooks(AgentHooks[Any]):
    def __init__(self, tools: DispatcherTools) -> None:
        self._tools = tools

    async def on_start(self, context: Any, agent: Agent[Any]) -> None:
        self._tools.refresh()

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        await self._tools._received(context, agent, response)
        # The SDK has taken this turn's tools already: what changed shows from the next turn on.
        self._tools.refresh()

    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Tool, result: object) -> None:
        # A call may have changed the catalogue (a server's tools/list_changed, a tool registering one).
        self._tools.refresh()
