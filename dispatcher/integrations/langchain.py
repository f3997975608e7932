"""LangChain 1.x ``create_agent``: the dispatcher as an agent middleware.

``create_agent(model, tools=..., middleware=[...])`` builds its own ``ToolNode`` and sends it each tool
call of a model message on its own (one LangGraph task per call, all at once). Its extension point for
tools is the middleware: `DispatcherMiddleware` registers one LangChain tool per catalogue entry (so the
model is bound to them and the ``ToolNode`` holds them) and wraps every tool call of the agent
(``awrap_tool_call``). The calls of one message keep the model's order whatever order their tasks run
in: each call holds its position in the message, the dispatcher's calls join one dispatcher batch at
their positions (`Batch.submit_at`), so reads run together, writes run alone in the model's order, only
trusted servers' hints count, retries and approvals follow the dispatcher's policies, and every call
gets one ``ToolMessage`` (``status="error"`` for a result that is not OK, open-world content marked
untrusted, ``artifact`` a dict of plain data, so a checkpointer stores no dispatcher class).

The agent's other tools (``create_agent(tools=[...])``) keep working in the same message: the
dispatcher knows nothing of what they do, so each call of one runs alone, after the calls before it and
before the calls after it (the dispatcher's rule for a tool without annotations). Other middleware's
``wrap_tool_call`` still runs around every call, the dispatcher's included, inside this one.

Put `DispatcherMiddleware` first in ``middleware=[...]``. A call holds its place from the moment
LangGraph starts its task: a middleware before this one (outside it) that answers a call without
running it would leave the calls after it waiting for it; inside this one, it gives the place up.
First also makes its ``after_model`` run last, after the other middleware have changed the message
(``HumanInTheLoopMiddleware`` removing the calls a person rejected).

Approvals, two ways. With ``approvals="dispatcher"`` (the default) the dispatcher's approver is asked
while the call keeps its place, and a denial is a result the model reads. With
``approvals="interrupt"`` the approver is called in the middleware's ``after_model`` step, before any
call of the message runs, for each call the approval policy selects, in call order, so it may call
LangGraph's ``interrupt()``: the agent pauses (it needs a checkpointer), and when it is resumed with
``Command(resume=answer)`` the approver gets the person's answer back from ``interrupt()`` and returns
it. A refused call is answered there (``status="error"``) and never runs; nothing of the message has
run before the pause, so resuming runs nothing twice.

Positions live in this object, for the run that numbered them. A call whose task LangGraph runs again
on a later run (a task another middleware or a tool paused with ``interrupt()``, resumed; a run that
failed, retried) finds no position and runs in a batch of its own: the dispatcher still keeps writes
alone, in arrival order, but not the model's order against calls that ran before the pause. So do the
calls of a message whose ids are missing or repeated (a position cannot be told by them).

The tools follow the catalogue: tools that a server adds (``tools/list_changed``) or that you register
after the agent was built are bound to the model from its next call on, and answered by the middleware.

Requires the ``langchain`` extra. The agent runs on asyncio only (``ainvoke``, ``astream``).

Example:
    ```python
    agent = create_agent(model, tools=[my_tool], middleware=[DispatcherMiddleware(dispatcher)])
    state = await agent.ainvoke({"messages": [("user", "...")]})
    ```
"""

from __future__ import annotations

import contextvars
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

import anyio
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import OmitFromSchema
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool

from dispatcher import ApprovalPolicy, ApprovalRequest, CallStatus, ConfigurationError, Effect, ToolCall, ToolResult
from dispatcher.formats import tool_description, tool_schema

from ._common import model_text, plain_result
from .langgraph import no_interrupt

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from langchain.agents.middleware import ModelRequest, ModelResponse
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime
    from langgraph.types import Command

    from dispatcher import Batch, Dispatcher, PendingCall, SessionGuard, ToolEntry

__all__ = ["DispatcherMiddleware"]

# A call the middleware has already put to the person (approvals="interrupt") is not asked about again.
_ASKED = ApprovalPolicy(destructive=False)
_REFUSED = "not run: the user denied it"
_UNASKED = "not run: it needs the person's approval and was not put to them (its call id is missing or repeated)"
# Where after_model keeps the ids of the calls the person approved (approvals="interrupt"), for the tools
# step: in the state, so that it holds when the agent resumes in another process.
_APPROVED = "dispatcher_approved"
# Rounds and the notes of messages about to run are forgotten past this many (a run that never reached
# its tools leaves one behind); each is read within the run that wrote it.
_KEPT = 4096


if TYPE_CHECKING:
    # The type checker cannot follow a TypedDict built on a class it may not know (langchain missing).
    _ApprovalState: Any
else:

    class _ApprovalState(AgentState):
        """The middleware's part of the agent state: which calls of the last message the person approved."""

        dispatcher_approved: NotRequired[Annotated[list[str], OmitFromSchema(input=True, output=True)]]


class DispatcherMiddleware(AgentMiddleware[Any, Any, Any]):
    """The dispatcher inside langchain's ``create_agent``: ``middleware=[DispatcherMiddleware(dispatcher)]``.

    Its ``tools`` hold one LangChain tool per catalogue entry; ``create_agent`` binds them to the model
    and adds them to its ``ToolNode``. Give it first in ``middleware=[...]`` (see the module docstring).

    Args:
        dispatcher: An open dispatcher holding the tools.
        approvals: ``"dispatcher"`` to ask the approver while the call keeps its place, or
            ``"interrupt"`` to ask it before the message's calls run, where it may call ``interrupt()``
            (see the module docstring).
        approve: The approver for these calls, instead of the dispatcher's (see `Dispatcher.dispatch`);
            required with ``approvals="interrupt"``.
        approval: The approval policy, instead of the dispatcher's (with ``approvals="interrupt"``: the
            calls to ask about; default `ApprovalPolicy()`).
        guard: The session guard of the conversation this agent serves, instead of the dispatcher's.
        name: The middleware's name among the agent's middleware (its graph nodes are named after it).

    Raises:
        ConfigurationError: ``approvals`` is neither value, or ``approvals="interrupt"`` has no approver.
    """

    state_schema = _ApprovalState

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        approvals: Literal["dispatcher", "interrupt"] = "dispatcher",
        approve: Callable[[ApprovalRequest], Awaitable[bool]] | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        name: str = "dispatcher",
    ) -> None:
        if approvals not in ("dispatcher", "interrupt"):
            raise ConfigurationError(f"approvals must be 'dispatcher' or 'interrupt', got {approvals!r}")
        if approvals == "interrupt" and approve is None:
            raise ConfigurationError(
                "approvals='interrupt' calls the approver before the message's calls run: pass approve=, an async "
                "function that may call langgraph's interrupt() and returns the person's answer"
            )
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
        self.dispatcher = dispatcher
        self._name = name
        self._interrupt = approvals == "interrupt"
        self._approve = approve if self._interrupt or approve is None else no_interrupt(approve, "DispatcherMiddleware")
        self._approval = approval
        self._guard = guard
        self._by_name: dict[str, _DispatcherTool] = {}
        # Messages whose calls are about to run for the first time (noted by after_model): only those
        # are numbered, so a task LangGraph runs again later never waits for calls that ran before.
        self._fresh: OrderedDict[tuple[str | None, str], None] = OrderedDict()
        self._rounds: OrderedDict[tuple[str | None, str], _Round] = OrderedDict()
        self.tools: list[BaseTool] = list(self._refresh())

    @property
    def name(self) -> str:
        """The middleware's name (``"dispatcher"`` unless given)."""
        return self._name

    def _refresh(self) -> list[_DispatcherTool]:
        """One tool per catalogue entry: new entries get a tool, removed ones lose theirs."""
        entries = {entry.name: entry for entry in self.dispatcher.tools()}
        for name, entry in entries.items():
            tool = self._by_name.get(name)
            if tool is None:
                self._by_name[name] = _DispatcherTool.of(self, entry)
            else:
                tool.update(entry)
        for name in [name for name in self._by_name if name not in entries]:
            del self._by_name[name]
        return list(self._by_name.values())

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> ModelResponse[Any]:
        """Bind the catalogue as it is now: tools added since the agent was built included."""
        others = [tool for tool in request.tools if not isinstance(tool, _DispatcherTool) or tool.owner is not self]
        # A tool of the agent's own wins over a catalogue entry of the same name, as in the agent's ToolNode:
        # a server cannot take a name away from the user's tool, or change how its calls are scheduled.
        taken = {tool.name for tool in others if isinstance(tool, BaseTool)}
        current = [tool for tool in self._refresh() if tool.name not in taken]
        return await handler(request.override(tools=[*current, *others]))

    async def aafter_model(self, state: Any, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Note the message whose calls are about to run; with ``approvals="interrupt"``, ask about them."""
        message, answered = _last_message(state)
        if message is None or not message.tool_calls:
            return None
        update: dict[str, Any] = {}
        if self._interrupt:
            refusals, approved = await self._ask(message, answered)
            update[_APPROVED] = approved
            if refusals:
                update["messages"] = refusals
        if message.id:
            _note(self._fresh, (_thread(runtime), message.id))
        return update or None

    async def _ask(self, message: AIMessage, answered: set[str]) -> tuple[list[ToolMessage], list[str]]:
        """approvals="interrupt": a refusal per call the person refused, and the ids they approved, in call order.

        Only calls with an id of their own are asked about: an answer is found by the call's id, and
        the tools step refuses a call that needs approval and is not among those approved.
        """
        assert self._approve is not None
        policy = self._policy()
        entries = {entry.name: entry for entry in self.dispatcher.tools()}
        counts = Counter(call["id"] for call in message.tool_calls)
        refusals: list[ToolMessage] = []
        approved: list[str] = []
        for call in message.tool_calls:
            call_id, entry = call["id"], entries.get(call["name"])
            if entry is None or not call_id or counts[call_id] > 1 or call_id in answered:
                continue
            reason = policy.reason(entry)
            if reason is None or not isinstance(call.get("args"), Mapping):
                continue
            request = ApprovalRequest(call=ToolCall(call_id, entry.name, call["args"]), tool=entry, reason=reason)
            # The approver may call interrupt(): LangGraph then raises here, before anything ran.
            if await self._approve(request):
                approved.append(call_id)
            else:
                refusals.append(
                    ToolMessage(
                        content=_REFUSED,
                        tool_call_id=call_id,
                        name=call["name"],
                        status="error",
                        artifact={"status": "denied"},
                    )
                )
        return refusals, approved

    def _policy(self) -> ApprovalPolicy:
        return self._approval if self._approval is not None else ApprovalPolicy()

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        """Run the call at its place in its message: after the calls it must wait for, before those after it."""
        name = request.tool_call["name"]
        ours = self._by_name.get(name)
        if request.tool is None and ours is not None:
            # A tool the catalogue gained after the agent was built: the ToolNode does not hold it.
            request = request.override(tool=ours)
        place = self._place(request)
        if self._interrupt and place.call_id:
            approved = request.state.get(_APPROVED) if isinstance(request.state, Mapping) else None
            place.approved = place.call_id in (approved or ())
        token = _PLACE.set(place)
        try:
            if place.round is not None:
                await place.round.wait_before(place.position)
            return await handler(request)
        finally:
            _PLACE.reset(token)
            place.leave()

    def _place(self, request: ToolCallRequest) -> _Place:
        """The call's place in its message's round, or a place of its own (see the module docstring)."""
        call_id = request.tool_call.get("id")
        message, answered = _last_message(request.state)
        execution = getattr(request.runtime, "execution_info", None)
        thread = getattr(execution, "thread_id", None)
        if message is None or not message.id or not call_id:
            return _Place(self, call_id)
        key = (thread, message.id)
        turn = self._rounds.get(key)
        if turn is None:
            if key not in self._fresh:
                return _Place(self, call_id)
            del self._fresh[key]
            turn = self._number(message, answered, request)
            _note(self._rounds, key, turn)
        position = turn.positions.get(call_id)
        if position is None or not turn.arrive(position):
            return _Place(self, call_id)
        return _Place(self, call_id, turn, position, lambda: self._forget(key, turn))

    def _number(self, message: AIMessage, answered: set[str], request: ToolCallRequest) -> _Round:
        """Number the calls LangGraph sends to the tool node for this message, in the message's order.

        A call is the dispatcher's when the tool node runs one of these tools for it (or holds no tool of
        its name, and the catalogue does); any other tool's call runs alone.
        """
        node = {tool.name: tool for tool in getattr(request.runtime, "tools", None) or ()}
        calls = [call for call in message.tool_calls if call["id"] not in answered]
        calls = [call for call in calls if call["name"] in node or call["name"] in self._by_name]
        counts = Counter(call["id"] for call in calls)
        placed = [(call_id, call["name"]) for call in calls if (call_id := call["id"]) and counts[call_id] == 1]
        ours = [self._runs(node.get(name), name) for _, name in placed]
        return _Round([call_id for call_id, _ in placed], ours, self._batch)

    def _runs(self, tool: object, name: str) -> bool:
        """Whether a call of `name` reaches one of these tools, given the tool node's tool of that name."""
        if tool is None:
            return name in self._by_name
        return isinstance(tool, _DispatcherTool) and tool.owner is self

    def _forget(self, key: tuple[str | None, str], turn: _Round) -> None:
        if self._rounds.get(key) is turn:
            del self._rounds[key]

    def _batch(self) -> Batch:
        if self._interrupt:
            # The person has answered already (after_model): the calls are not put to an approver again.
            return self.dispatcher.batch(approval=_ASKED, guard=self._guard)
        return self.dispatcher.batch(approve=self._approve, approval=self._approval, guard=self._guard)

    async def _run(self, call: ToolCall) -> tuple[ToolResult, str | None]:
        """Run a call of one of the tools at the place its task holds; the call id to answer under."""
        place = _PLACE.get()
        mine = place is not None and place.owner is self
        if self._interrupt and not (mine and place is not None and place.approved):
            entry = next((entry for entry in self.dispatcher.tools() if entry.name == call.name), None)
            if entry is not None and self._policy().reason(entry) is not None:
                # The person was not asked about this call (or its tool changed since): it does not run.
                return _refusal(call, entry), (place.call_id or "") if mine and place is not None else None
        if not mine or place is None:
            # Called outside this middleware's wrapper (the tool used on its own): a batch of its own.
            return await _wait(self._batch().submit(call)), None
        call = ToolCall(place.call_id or call.id, call.name, call.arguments)
        # A ToolMessage even for a call without an id: the ToolNode takes nothing else from a tool.
        return await place.run(call), place.call_id or ""


class _DispatcherTool(StructuredTool):
    """One catalogue entry as a LangChain tool; its calls go through the middleware's rounds."""

    owner: Any = None
    entry: Any = None

    @classmethod
    def of(cls, owner: DispatcherMiddleware, entry: ToolEntry) -> _DispatcherTool:
        async def run(**arguments: Any) -> Any:
            result, call_id = await owner._run(ToolCall("call-0", entry.name, arguments))
            text = model_text(result)
            if call_id is None:
                return text
            return ToolMessage(
                content=text,
                tool_call_id=call_id,
                name=entry.name,
                status="success" if result.ok else "error",
                artifact=plain_result(result),
            )

        return cls(
            name=entry.name,
            description=tool_description(entry) or entry.name,
            args_schema=tool_schema(entry),
            coroutine=run,
            owner=owner,
            entry=entry,
        )

    def update(self, entry: ToolEntry) -> None:
        if entry != self.entry:
            self.entry = entry
            self.description = tool_description(entry) or entry.name
            self.args_schema = tool_schema(entry)


class _Round:
    """The calls of one message sent to the tool node, by position, cut into segments.

    A segment is a run of the dispatcher's calls (one dispatcher batch, whose positions it keeps), or
    one call of another tool (run alone). A segment's calls wait until the segment before it has
    finished: every call of it left its wrapper, and the segment before it finished too.
    """

    __slots__ = ("_arrived", "_segment_of", "_segments", "positions")

    def __init__(self, ids: list[str], ours: list[bool], batch: Callable[[], Batch]) -> None:
        self.positions = {call_id: position for position, call_id in enumerate(ids)}
        self._arrived: set[int] = set()
        self._segments: list[_Segment] = []
        self._segment_of: list[tuple[_Segment, int]] = []
        for mine in ours:
            last = self._segments[-1] if self._segments else None
            if last is None or not (mine and last.batch is not None):
                last = _Segment(batch() if mine else None, len(self._segments))
                self._segments.append(last)
            self._segment_of.append((last, last.size))
            last.size += 1

    def arrive(self, position: int) -> bool:
        """Whether the call at `position` is the first to come for it (a call run again holds no place)."""
        if position in self._arrived:
            return False
        self._arrived.add(position)
        return True

    async def wait_before(self, position: int) -> None:
        segment, _ = self._segment_of[position]
        if segment.index:
            await self._segments[segment.index - 1].finished.wait()

    def take(self, position: int) -> tuple[Batch, int] | None:
        """The batch and local position a dispatcher call submits at, once; None for another tool's place."""
        segment, local = self._segment_of[position]
        if segment.batch is None or local in segment.handed:
            return None
        segment.handed.add(local)
        return segment.batch, local

    def leave(self, position: int) -> bool:
        """The call at `position` left its wrapper; True once every call of the round has."""
        segment, local = self._segment_of[position]
        if segment.batch is not None and local not in segment.handed:
            # Its tool never ran (another middleware answered it, or the task was cancelled).
            segment.handed.add(local)
            segment.batch.skip(local)
        segment.left += 1
        self._finish_from(segment.index)
        return all(segment.finished.is_set() for segment in self._segments)

    def _finish_from(self, index: int) -> None:
        for segment in self._segments[index:]:
            before = self._segments[segment.index - 1] if segment.index else None
            if segment.left < segment.size or (before is not None and not before.finished.is_set()):
                return
            segment.finished.set()


class _Segment:
    __slots__ = ("batch", "finished", "handed", "index", "left", "size")

    def __init__(self, batch: Batch | None, index: int) -> None:
        self.batch = batch
        self.index = index
        self.size = 0
        self.left = 0
        self.handed: set[int] = set()
        self.finished = anyio.Event()


class _Place:
    """Where one call's task stands: its round and position, or a place of its own."""

    __slots__ = ("_forget", "approved", "call_id", "owner", "position", "round")

    def __init__(
        self,
        owner: DispatcherMiddleware,
        call_id: str | None,
        turn: _Round | None = None,
        position: int = 0,
        forget: Callable[[], None] | None = None,
    ) -> None:
        self.owner = owner
        self.call_id = call_id
        self.round = turn
        self.position = position
        self._forget = forget
        # approvals="interrupt": whether the person approved this call in after_model.
        self.approved = False

    async def run(self, call: ToolCall) -> ToolResult:
        taken = self.round.take(self.position) if self.round is not None else None
        if taken is None:
            # No place, another tool's place, or the call's second run (a middleware calling the tool again).
            return await _wait(self.owner._batch().submit(call))
        batch, local = taken
        return await _wait(await batch.submit_at(local, call))

    def leave(self) -> None:
        if self.round is not None and self.round.leave(self.position) and self._forget is not None:
            self._forget()


_PLACE: contextvars.ContextVar[_Place | None] = contextvars.ContextVar("dispatcher_langchain_place", default=None)


async def _wait(pending: PendingCall) -> ToolResult:
    try:
        return await pending.wait()
    except BaseException:
        pending.cancel()  # LangGraph gave up on this call (a sibling task raised, the run was cancelled)
        raise


def _last_message(state: Any) -> tuple[AIMessage | None, set[str]]:
    """The last ``AIMessage`` of the state and the ids of the calls answered after it."""
    messages: Sequence[Any] = (
        state.get("messages", []) if isinstance(state, Mapping) else getattr(state, "messages", [])
    )
    answered: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message, answered
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
    return None, answered


def _refusal(call: ToolCall, entry: ToolEntry) -> ToolResult:
    return ToolResult(
        call,
        CallStatus.DENIED,
        error=_UNASKED,
        tool=entry.name,
        server=entry.server,
        effect=Effect.NEVER_RAN,
        mutating=not entry.annotations.read_only_hint,
    )


def _thread(runtime: Any) -> str | None:
    return getattr(getattr(runtime, "execution_info", None), "thread_id", None)


def _note(notes: OrderedDict[Any, Any], key: object, value: Any = None) -> None:
    notes[key] = value
    notes.move_to_end(key)
    while len(notes) > _KEPT:
        notes.popitem(last=False)
