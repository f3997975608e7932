"""Google's Agent Development Kit (ADK): the dispatcher's catalogue as an ADK toolset.

ADK's LLM flow starts one asyncio task per function call of a model response, all at once, and when one
of them raises it cancels the others. `DispatcherToolset` gives an agent one tool per catalogue entry;
every call of one response that ADK hands to these tools joins one dispatcher batch at its position in
the response (`Batch.submit_at`), so reads run together, writes run alone in the model's order, only
trusted servers' hints count, retries follow the `RetryPolicy`, approvals are asked by the dispatcher's
approver while the call keeps its place, and a failing call is a result the model reads (its siblings
go on). Results are dicts of plain strings: ``{"result": text}``, or ``{"error": text}`` for a call
that did not succeed (``"<status>: text"``), with open-world content marked untrusted.

The positions come from the response itself: ADK stores the model's function-call event in the session
before any tool runs, so the first call to arrive numbers the calls of that event that ADK routes to
these tools (the agent's tools of this step, where the last tool of a name wins, as in ADK). Calls the
session already answered (a resumed run replaying the rest of a turn) hold no place.

A call that ADK never hands to its tool must give up its place, or the calls after it would wait for
it forever. ADK skips a tool when a ``before_tool_callback`` (a plugin's or the agent's) answers the
call. Where any such callback is set, add `DispatcherPlugin` to the app's plugins: its
``after_tool_callback``, which ADK runs for every call whether or not the tool ran, frees the place of
a call that a callback answered. Without it, or with a plugin before it that may replace tool results
(an ``after_tool_callback`` of its own), a call refuses to run with a `ConfigurationError` that says
so, instead of hanging.

A call that finds no place (no function-call event in the session, a call replayed after ADK's own
confirmation flow) runs as a batch of its own: the dispatcher still keeps writes alone, in arrival
order.

Requires the ``adk`` extra (``google-adk``). ADK runs on asyncio only.

Example:
    ```python
    tools = DispatcherToolset(dispatcher)
    agent = LlmAgent(name="assistant", model=model, tools=[tools])
    app = App(name="app", root_agent=agent, plugins=[DispatcherPlugin()])  # the plugin: see above
    runner = InMemoryRunner(app=app)
    ```
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

import anyio
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.base_toolset import BaseToolset
from google.genai import types

from dispatcher import ConfigurationError, ToolCall
from dispatcher.formats import tool_description, tool_schema

from ._common import model_text

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.agents.readonly_context import ReadonlyContext
    from google.adk.events import Event
    from google.adk.tools.base_toolset import ToolPredicate
    from google.adk.tools.tool_context import ToolContext

    from dispatcher import (
        ApprovalPolicy,
        ApprovalRequest,
        Batch,
        Dispatcher,
        PendingCall,
        SessionGuard,
        ToolEntry,
        ToolResult,
    )

__all__ = ["DispatcherPlugin", "DispatcherToolset"]

# The notes kept per call or response (calls that came, calls that gave up their place before their
# response was numbered, responses whose turn was cancelled) are forgotten past this many. Each note is
# read within the turn that wrote it, so only that many turns at once, in one toolset, could lose one.
_KEPT = 4096
# A call whose id the model used twice in one response: it cannot be told apart from its twin.
_REPEATED = object()


class DispatcherToolset(BaseToolset):
    """The catalogue of a `Dispatcher` as an ADK toolset: ``LlmAgent(tools=[toolset])``.

    The tools follow the catalogue: ADK lists a toolset once per invocation, so tools that a server adds
    (``tools/list_changed``) or that you register show from the next invocation on.

    Args:
        dispatcher: An open dispatcher holding the tools.
        approve: The approver for these calls, instead of the dispatcher's (see `Dispatcher.dispatch`).
        approval: The approval policy, instead of the dispatcher's.
        guard: The session guard of this agent's session, instead of the dispatcher's.
        tool_filter: The names of the tools to show, or a function ``(tool, readonly_context) -> bool``.
        tool_name_prefix: A prefix for the names the model sees (``prefix_name``), as ADK toolsets take.

    Raises:
        ConfigurationError: ``tool_filter`` is neither a list of names nor a function.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        approve: Callable[[ApprovalRequest], Awaitable[bool]] | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        tool_filter: ToolPredicate | list[str] | None = None,
        tool_name_prefix: str | None = None,
    ) -> None:
        if tool_filter is not None and not isinstance(tool_filter, list) and not callable(tool_filter):
            raise ConfigurationError(
                f"tool_filter must be a list of tool names or a function (tool, context) -> bool, got {tool_filter!r}"
            )
        super().__init__(tool_filter=tool_filter, tool_name_prefix=tool_name_prefix)
        self.dispatcher = dispatcher
        self._approve = approve
        self._approval = approval
        self._guard = guard
        self._tools: dict[str, _DispatcherTool] = {}
        # (event id, call id) -> (its round, its position there), until the call comes or gives up its place.
        self._placed: dict[tuple[str, str], tuple[_Round, int]] = {}
        # Responses whose turn ADK cancelled: a call of one that still arrives runs in a batch of its own.
        self._abandoned: OrderedDict[str, None] = OrderedDict()
        # Calls that gave up their place before any call of their response numbered it.
        self._gone: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Calls that reached their tool, until the plugin's after_tool_callback sees them.
        self._came: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def get_tools(self, readonly_context: ReadonlyContext | None = None) -> list[BaseTool]:
        """One tool per catalogue entry (those `tool_filter` selects)."""
        entries = {entry.name: entry for entry in self.dispatcher.tools()}
        for name, entry in entries.items():
            tool = self._tools.get(name)
            if tool is None:
                self._tools[name] = _DispatcherTool(self, entry)
            else:
                tool.update(entry)
        for name in [name for name in self._tools if name not in entries]:
            del self._tools[name]
        return [tool for tool in self._tools.values() if self._selected(tool, readonly_context)]

    def _selected(self, tool: BaseTool, readonly_context: ReadonlyContext | None) -> bool:
        selector = self.tool_filter
        if selector is None:
            return True
        if isinstance(selector, list):
            return tool.name in selector
        return bool(selector(tool, readonly_context))

    def _batch(self) -> Batch:
        return self.dispatcher.batch(approve=self._approve, approval=self._approval, guard=self._guard)

    async def _run(self, tool: _DispatcherTool, args: dict[str, Any], tool_context: ToolContext) -> dict[str, str]:
        """Run one call that ADK handed to `tool`, at its place in its model response."""
        call_id = tool_context.function_call_id or ""
        call = ToolCall(call_id or f"{tool.name}-call", tool.entry.name, args)
        context = tool_context.get_invocation_context()
        event = _call_event(context, call_id) if call_id else None
        placed: tuple[_Round, int] | None = None
        if event is not None and event.id not in self._abandoned:
            placed = self._placed.pop((event.id, call_id), None)
            if placed is None:
                numbered = self._number(context, event, call_id)
                if numbered is _REPEATED:
                    return {"error": f"failed: the call id {call_id[:100]!r} was used twice in one response; not run"}
                placed = numbered if isinstance(numbered, tuple) else None
        if event is not None:
            _note(self._came, (event.id, call_id))
        if placed is None:
            # Not part of a response these tools can number: a batch of its own, in arrival order.
            return _answer(await _wait(self._batch().submit(call)))
        turn, position = placed
        turn.hand_over(position)
        try:
            pending = await turn.batch.submit_at(position, call)
            return _answer(await _wait(pending))
        except anyio.get_cancelled_exc_class():
            # ADK cancels every unfinished call of a turn at once (a sibling raised, the run was
            # cancelled): no other call of this response will come, so nothing waits for their places.
            assert event is not None
            self._abandon(event.id, turn)
            raise

    def give_up(self, tool_context: ToolContext) -> None:
        """Say that this call will not reach its tool: the calls after it go on without it."""
        call_id = tool_context.function_call_id
        event = _call_event(tool_context.get_invocation_context(), call_id) if call_id else None
        if event is None or call_id is None:
            return
        key = (event.id, call_id)
        if key in self._came:  # it reached its tool: nothing to give up
            del self._came[key]
            return
        placed = self._placed.pop(key, None)
        if placed is None:
            # Its response is not numbered yet (or the call ran): the call that numbers it leaves it out.
            _note(self._gone, key)
            return
        turn, position = placed
        if turn.hand_over(position):
            turn.batch.skip(position)

    def _abandon(self, event_id: str, turn: _Round) -> None:
        _note(self._abandoned, event_id)
        for key in [key for key, (other, _) in self._placed.items() if other is turn]:
            del self._placed[key]

    def _number(self, context: InvocationContext, event: Event, call_id: str) -> tuple[_Round, int] | object | None:
        """Number the calls of `event` that ADK routes to these tools; return this call's place.

        Returns `_REPEATED` for a call whose id the response uses twice, None where the call holds no
        place (the session already answered it, or ADK does not route it here).
        """
        _check_callbacks(context)
        calls = event.get_function_calls()
        counts = Counter(function_call.id for function_call in calls)
        if counts[call_id] > 1:
            return _REPEATED
        routes = _routes(context)
        answered = _answered(context, event)
        ids: list[str] = []
        for function_call in calls:
            fid = function_call.id
            if not fid or counts[fid] > 1 or fid in answered:
                continue
            routed = routes.get(function_call.name or "")
            if not (isinstance(routed, _DispatcherTool) and routed.toolset is self):
                continue
            if (event.id, fid) in self._gone:
                del self._gone[(event.id, fid)]
                continue
            ids.append(fid)
        if call_id not in ids:
            return None
        turn = _Round(self._batch())
        for position, fid in enumerate(ids):
            if fid != call_id:
                self._placed[(event.id, fid)] = (turn, position)
        return turn, ids.index(call_id)


class _Round:
    """The batch of one model response's calls to these tools, and the positions handed over so far."""

    __slots__ = ("batch", "handed")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.handed: set[int] = set()

    def hand_over(self, position: int) -> bool:
        """Mark `position` as handed over (its call came, or never will); False if it already was."""
        if position in self.handed:
            return False
        self.handed.add(position)
        return True


class _DispatcherTool(BaseTool):
    """One catalogue entry as an ADK tool; its calls go through the toolset's batches."""

    def __init__(self, toolset: DispatcherToolset, entry: ToolEntry) -> None:
        super().__init__(name=entry.name, description=tool_description(entry) or entry.name)
        self.toolset = toolset
        self.entry = entry

    def update(self, entry: ToolEntry) -> None:
        if entry != self.entry:
            self.entry = entry
            self.description = tool_description(entry) or entry.name

    def _get_declaration(self) -> types.FunctionDeclaration:
        return types.FunctionDeclaration(
            name=self.name, description=self.description, parameters_json_schema=tool_schema(self.entry)
        )

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        return await self.toolset._run(self, args, tool_context)


class DispatcherPlugin(BasePlugin):
    """The ADK plugin that frees the place of a call a ``before_tool_callback`` answered.

    Needed where a plugin or the agent has a ``before_tool_callback`` (see the module docstring); one
    plugin serves every `DispatcherToolset`. Put it before any plugin with an ``after_tool_callback``.

    Args:
        name: The plugin's name among the app's plugins.
    """

    def __init__(self, name: str = "dispatcher") -> None:
        super().__init__(name=name)

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Give up the call's place if its tool did not run (a no-op for a call that ran)."""
        if isinstance(tool, _DispatcherTool):
            tool.toolset.give_up(tool_context)
        return None


async def _wait(pending: PendingCall) -> ToolResult:
    try:
        return await pending.wait()
    except BaseException:
        pending.cancel()  # ADK gave up on this call (a sibling raised, the run was cancelled)
        raise


def _note(notes: OrderedDict[Any, None], key: object) -> None:
    notes[key] = None
    while len(notes) > _KEPT:
        notes.popitem(last=False)


def _call_event(context: InvocationContext, call_id: str) -> Event | None:
    for event in reversed(context.session.events):
        if any(function_call.id == call_id for function_call in event.get_function_calls()):
            return event
    return None


def _answered(context: InvocationContext, event: Event) -> set[str]:
    """The ids of the calls the session already holds a response for, after `event`."""
    events = context.session.events
    answered: set[str] = set()
    seen = False
    for other in events:
        if other is event or other.id == event.id:
            seen = True
            continue
        if seen:
            answered.update(response.id for response in other.get_function_responses() if response.id)
    return answered


def _routes(context: InvocationContext) -> dict[str, BaseTool]:
    """Which tool ADK calls for each name in this step: the last one of that name, as ADK builds its table."""
    tools = context.canonical_tools_cache or []
    return {tool.name: tool for tool in tools}


def _check_callbacks(context: InvocationContext) -> None:
    """Refuse to wait for calls that a ``before_tool_callback`` may answer unless the plugin will say so."""
    plugins = list(context.plugin_manager.plugins)
    answering = [
        plugin.name
        for plugin in plugins
        if not isinstance(plugin, DispatcherPlugin) and _overrides(plugin, "before_tool_callback")
    ]
    agent = context.agent
    if getattr(agent, "canonical_before_tool_callbacks", None):
        answering.append(f"agent {getattr(agent, 'name', '')!r}")
    if not answering:
        return
    ours = next((index for index, plugin in enumerate(plugins) if isinstance(plugin, DispatcherPlugin)), None)
    if ours is None:
        raise ConfigurationError(
            f"a before_tool_callback ({', '.join(answering)}) may answer calls of the dispatcher's tools, and the "
            "calls after such a call would wait for it: add DispatcherPlugin() to the app's plugins "
            "(App(plugins=[DispatcherPlugin(), ...]))"
        )
    before = [plugin.name for plugin in plugins[:ours] if _overrides(plugin, "after_tool_callback")]
    if before:
        raise ConfigurationError(
            f"the plugins {before} run their after_tool_callback before DispatcherPlugin and may stop it from "
            "freeing the place of a call that a before_tool_callback answered: put DispatcherPlugin() first"
        )


def _overrides(plugin: BasePlugin, name: str) -> bool:
    return getattr(type(plugin), name, None) is not getattr(BasePlugin, name)


def _answer(result: ToolResult) -> dict[str, str]:
    text = model_text(result)
    return {"result": text} if result.ok else {"error": f"{result.status.value}: {text}"}
