"""LangGraph: a ``ToolNode`` that runs an ``AIMessage``'s tool calls as one dispatcher batch.

LangGraph's own ``ToolNode`` starts every tool call of a message at once. `DispatcherToolNode` is a
``ToolNode`` (so ``create_react_agent(model, tools=node)`` takes it, and binds its tools to the model)
that hands them to the dispatcher instead: reads run together, writes run alone in the model's order,
only trusted servers' hints count, retries and approvals follow the dispatcher's policies, and every
call gets one ``ToolMessage`` in call order (a result that is not OK has ``status="error"``).

Every input a ``ToolNode`` takes is taken, and each gives the whole message as one batch:

- a state (dict or object) with messages, or a list of messages (``tools_condition`` graphs and
  ``create_react_agent(version="v1")``): the last ``AIMessage``'s calls;
- ``create_react_agent``'s default ``version="v2"`` sends each call to the node on its own
  (``Send`` with a ``ToolCallWithContext``): the send of the message's first unanswered call runs
  them all and answers each, and the sends of the other calls answer nothing; so the calls are
  still one batch and nothing waits across tasks (a message whose call ids are missing or repeated
  cannot say which send is first: each send then runs its own call);
- a list of tool calls: those calls.

LangChain tools given with ``tools=`` join the same node: the dispatcher knows nothing of what they
do, so each call of one runs alone, after the calls before it and before the calls after it (the
dispatcher's rule for a tool with no annotations), through ``ToolNode``'s own machinery.

Approvals: with ``approvals="dispatcher"`` (the default) the dispatcher's approver is asked while the
call keeps its place. With ``approvals="interrupt"`` the approver is called in the node itself, before
any call of the message runs, for each call the approval policy selects, in call order, so it may call
LangGraph's ``interrupt()``: the graph pauses (it needs a checkpointer), and when it is resumed with
``Command(resume=answer)`` the approver gets the person's answer back from ``interrupt()`` and returns
it. Nothing of the message has run before the pause, so resuming runs nothing twice. An approver given
with ``approvals="dispatcher"`` that calls ``interrupt()`` cannot pause the graph (it is asked inside
the dispatcher's batch, not in the node): its call is denied with a reason that says to use
``approvals="interrupt"``, instead of the bare ``GraphInterrupt`` the model would read.

The ``ToolMessage``s hold plain data only (``artifact`` is a dict of the result's status, tool,
server, attempts and untrusted flag), so a checkpointer stores them without the dispatcher's classes.

Requires the ``langgraph`` extra (``langchain-core`` for the messages and tools).

Example:
    ```python
    node = DispatcherToolNode(dispatcher)
    agent = create_react_agent(model, tools=node)
    ```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolRuntime

from dispatcher import ApprovalPolicy, ApprovalRequest, ConfigurationError, ToolCall, ToolEntry
from dispatcher.formats import openai_chat_tools, tool_description, tool_schema

from ._common import model_text, plain_result

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    Approve = Callable[[ApprovalRequest], Awaitable[bool]]

    from langchain_core.runnables import RunnableConfig
    from langgraph.runtime import Runtime

    from dispatcher import Dispatcher, SessionGuard, ToolResult

__all__ = ["DispatcherToolNode"]

# A call the node has already put to the person (approvals="interrupt") is not asked about again.
_ASKED = ApprovalPolicy(destructive=False)
_REFUSED = "not run: the user denied it"


class DispatcherToolNode(ToolNode):
    """A LangGraph ``ToolNode`` that runs the tool calls of the last ``AIMessage`` through a `Dispatcher`.

    Add it to a graph like ``ToolNode`` (``graph.add_node("tools", node)``, routed to with
    ``tools_condition``), or give it to ``create_react_agent(model, tools=node)``. Its ``tools_by_name``
    holds one LangChain tool per catalogue entry (plus the ``tools`` you give), which is what the
    prebuilt agent binds to the model; `tool_schemas` gives the same as OpenAI-style dicts.

    Args:
        dispatcher: An open dispatcher holding the tools.
        tools: LangChain tools (or functions) to serve in the same node; each call of one runs alone.
        name: The node's name.
        messages_key: Where the state keeps its messages.
        approvals: ``"dispatcher"`` to ask the approver while the call keeps its place, or
            ``"interrupt"`` to ask it in the node before the message's calls run, where it may call
            ``interrupt()`` (see the module docstring).
        approve: This node's approver, instead of the dispatcher's (see `Dispatcher.dispatch`);
            required with ``approvals="interrupt"``.
        approval: This node's approval policy, instead of the dispatcher's (with
            ``approvals="interrupt"``: the calls to ask about; default `ApprovalPolicy()`).
        guard: The session guard of the conversation this node serves, instead of the dispatcher's.

    Raises:
        ConfigurationError: ``approvals`` is neither value, ``approvals="interrupt"`` has no approver,
            or a LangChain tool has the name of a catalogue entry.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        tools: Sequence[BaseTool | Callable[..., Any]] = (),
        name: str = "tools",
        messages_key: str = "messages",
        approvals: Literal["dispatcher", "interrupt"] = "dispatcher",
        approve: Callable[[ApprovalRequest], Awaitable[bool]] | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> None:
        if approvals not in ("dispatcher", "interrupt"):
            raise ConfigurationError(f"approvals must be 'dispatcher' or 'interrupt', got {approvals!r}")
        if approvals == "interrupt" and approve is None:
            raise ConfigurationError(
                "approvals='interrupt' calls the approver in the node: pass approve=, an async function that may "
                "call langgraph's interrupt() and returns the person's answer"
            )
        entries = dispatcher.tools()
        catalogue = {entry.name for entry in entries}
        super().__init__(
            [*(self._tool_of(dispatcher, entry) for entry in entries), *tools], name=name, messages_key=messages_key
        )
        self._others = {tool_name for tool_name in self.tools_by_name if tool_name not in catalogue}
        clash = len(self.tools_by_name) != len(entries) + len(tools)
        if clash:
            raise ConfigurationError(
                "a LangChain tool given with tools= has the name of a catalogue entry (or of another tool): "
                "rename it, so that every call resolves to one tool"
            )
        self.dispatcher = dispatcher
        self.messages_key = messages_key
        self._interrupt = approvals == "interrupt"
        self._approve = approve if self._interrupt or approve is None else no_interrupt(approve, "DispatcherToolNode")
        self._approval = approval
        self._guard = guard

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The catalogue as OpenAI-style function tools, for ``chat_model.bind_tools(...)``."""
        return openai_chat_tools(self.dispatcher.tools())

    @staticmethod
    def _tool_of(dispatcher: Dispatcher, entry: ToolEntry) -> BaseTool:
        """A LangChain tool for the model's binding; called on its own, it dispatches one call."""

        async def run(**arguments: Any) -> str:
            [result] = await dispatcher.dispatch([ToolCall("call-0", entry.name, arguments)])
            return model_text(result)

        return StructuredTool(
            name=entry.name,
            description=tool_description(entry) or entry.name,
            args_schema=tool_schema(entry),
            coroutine=run,
        )

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        raise NotImplementedError("DispatcherToolNode runs on asyncio only: use ainvoke / astream on the graph")

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime) -> Any:
        if isinstance(input, dict) and input.get("__type") == "tool_call_with_context":
            # One send per call: the send of the first unanswered call answers them all.
            mine = input["tool_call"]
            pending = _unanswered(self._messages(input["state"]))
            ids = [call["id"] for call in pending]
            if None in ids or len(set(ids)) != len(ids):
                # The sends cannot tell which of them is first: each runs its own call (the dispatcher
                # still orders the writes by arrival), rather than two of them running the whole message.
                calls = [mine]
            else:
                calls = pending if pending and pending[0] == mine else [] if mine in pending else [mine]
            state = input["state"]
            messages = await self._run(calls, state, config, runtime)
            return {self.messages_key: messages}
        if isinstance(input, list) and input and isinstance(input[-1], dict) and input[-1].get("type") == "tool_call":
            return {
                self.messages_key: await self._run(list(input), self._extract_state(input, config), config, runtime)
            }
        return await self(input, config=config, runtime=runtime)

    async def __call__(self, state: Any, config: RunnableConfig | None = None, runtime: Runtime | None = None) -> Any:
        """Run the last ``AIMessage``'s tool calls as one batch; one ``ToolMessage`` per call, in order.

        Raises:
            ValueError: The state holds no messages, or the last message is not an ``AIMessage``.
        """
        messages = self._messages(state)
        message = messages[-1] if messages else None
        if not isinstance(message, AIMessage):
            raise ValueError(f"the last message is a {type(message).__name__}, not an AIMessage with tool calls")
        # LangChain keeps the calls whose arguments it could not parse apart, in `invalid_tool_calls`; they
        # are dispatched too (with their raw text, which fails with a readable error) so that every call
        # the model made is answered.
        calls: list[dict[str, Any]] = [dict(call) for call in message.tool_calls]
        calls += [
            {"id": bad["id"], "name": bad["name"] or "", "args": bad["args"] or "", "type": "tool_call"}
            for bad in message.invalid_tool_calls
        ]
        answers = await self._run(calls, state, config, runtime)
        return answers if isinstance(state, list) else {self.messages_key: answers}

    async def _run(
        self, calls: list[Any], state: Any, config: RunnableConfig | None, runtime: Runtime | None
    ) -> list[Any]:
        """One answer per call, in order: dispatcher calls in batches, a LangChain tool's call alone."""
        refused = await self._ask(calls) if self._interrupt else set()
        answers: list[Any] = []
        segment: list[tuple[int, Any]] = []
        for index, call in [*enumerate(calls), (len(calls), None)]:
            if call is not None and call.get("name") not in self._others:
                segment.append((index, call))
                continue
            if segment:
                local = {position for position, (index, _) in enumerate(segment) if index in refused}
                answers += await self._dispatch([call for _, call in segment], local)
                segment = []
            if call is not None:
                answers.append(await self._other(call, state, config, runtime))
        return answers

    async def _ask(self, calls: list[Any]) -> set[int]:
        """approvals="interrupt": the indexes of the calls the person refused, asked in call order."""
        assert self._approve is not None
        policy = self._approval if self._approval is not None else ApprovalPolicy()
        entries = {entry.name: entry for entry in self.dispatcher.tools()}
        refused: set[int] = set()
        for index, call in enumerate(calls):
            entry = entries.get(call.get("name"))
            reason = policy.reason(entry) if entry is not None else None
            if entry is not None and reason is not None and isinstance(call.get("args"), Mapping):
                request = ApprovalRequest(
                    call=ToolCall(call.get("id") or f"call-{index}", entry.name, call["args"]),
                    tool=entry,
                    reason=reason,
                )
                # The approver may call interrupt(): LangGraph then raises here, before anything ran.
                if not await self._approve(request):
                    refused.add(index)
        return refused

    async def _dispatch(self, calls: list[Any], refused: set[int]) -> list[ToolMessage]:
        # The batch uses ids of its own: the model's may be None or repeated, and every call still gets
        # its one answer, under the id the model gave it.
        batch = [
            ToolCall(f"call-{position}", call.get("name") or "", call.get("args"))
            for position, call in enumerate(calls)
        ]
        if self._interrupt:
            # The person has answered already: a refused call is not dispatched at all, the others are
            # not put to an approver again.
            ran = await self.dispatcher.dispatch(
                [call for position, call in enumerate(batch) if position not in refused],
                approval=_ASKED,
                guard=self._guard,
            )
            by_id = {result.call.id: result for result in ran}
            results: list[ToolResult | None] = [by_id.get(call.id) for call in batch]
        else:
            results = list(
                await self.dispatcher.dispatch(batch, approve=self._approve, approval=self._approval, guard=self._guard)
            )
        return [
            ToolMessage(
                content=_REFUSED if result is None else model_text(result),
                tool_call_id=call.get("id") or "",
                name=call.get("name") or "",
                status="success" if result is not None and result.ok else "error",
                artifact={"status": "denied"} if result is None else plain_result(result),
            )
            for call, result in zip(calls, results, strict=True)
        ]

    async def _other(self, call: Any, state: Any, config: RunnableConfig | None, runtime: Runtime | None) -> Any:
        """A LangChain tool's call, through ToolNode's own machinery (injected state, error handling)."""
        tool_runtime = ToolRuntime(
            state=state,
            tool_call_id=call.get("id"),
            config=config or {},
            context=getattr(runtime, "context", None),
            store=getattr(runtime, "store", None),
            stream_writer=getattr(runtime, "stream_writer", lambda _: None),
            tools=list(self.tools_by_name.values()),
        )
        return await self._arun_one(call, "tool_calls", tool_runtime)

    def _messages(self, state: Any) -> Sequence[Any]:
        if isinstance(state, list):
            return state
        if isinstance(state, Mapping):
            found = state.get(self.messages_key)
        else:
            found = getattr(state, self.messages_key, None)
        if not isinstance(found, list):
            raise ValueError(f"no list of messages under {self.messages_key!r} in the state")
        return found


def _unanswered(messages: Sequence[Any]) -> list[Any]:
    """The calls of the last ``AIMessage`` that no ``ToolMessage`` answers yet, in call order."""
    answered = {message.tool_call_id for message in messages if isinstance(message, ToolMessage)}
    last = next((message for message in reversed(messages) if isinstance(message, AIMessage)), None)
    return [call for call in last.tool_calls if call["id"] not in answered] if last is not None else []


def no_interrupt(approve: Approve, adapter: str) -> Approve:
    """`approve` for ``approvals="dispatcher"``: an ``interrupt()`` in it denies the call, saying what to use.

    The approver is asked inside the dispatcher's batch, where ``GraphInterrupt`` cannot reach the graph.
    """

    async def asked(request: ApprovalRequest) -> bool:
        try:
            return await approve(request)
        except GraphInterrupt:
            raise ConfigurationError(
                f"the approver called interrupt(), which pauses the graph only with {adapter}(approvals='interrupt', "
                "approve=...); with approvals='dispatcher' the call is denied"
            ) from None

    return asked
