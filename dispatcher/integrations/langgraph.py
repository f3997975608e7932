"""LangGraph: a drop-in for ``ToolNode`` that runs an ``AIMessage``'s tool calls as one dispatcher batch.

LangGraph's own ``ToolNode`` starts every tool call of a message at once. `DispatcherToolNode` hands
them to the dispatcher instead, so reads run together, writes run alone in the model's order, only
trusted servers' hints count, retries and approvals follow the dispatcher's policies, and every call
gets one ``ToolMessage`` in call order (a result that is not OK has ``status="error"``).

Requires the ``langgraph`` extra (``langchain-core`` for the messages).

Example:
    ```python
    node = DispatcherToolNode(dispatcher)
    graph.add_node("tools", node)
    model = chat_model.bind_tools(node.tool_schemas())
    ```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, ToolMessage

from dispatcher._calls import ToolCall
from dispatcher.formats import openai_chat_tools

from ._common import model_text

if TYPE_CHECKING:
    from dispatcher import Dispatcher
    from dispatcher._approval import ApprovalPolicy, Approver, SessionGuard

__all__ = ["DispatcherToolNode"]


class DispatcherToolNode:
    """A LangGraph node that runs the tool calls of the last ``AIMessage`` through a `Dispatcher`.

    Add it to a graph like ``ToolNode`` (``graph.add_node("tools", node)``, routed to with
    ``tools_condition``). It accepts a state dict (or object) with a list of messages under
    ``messages_key``, or a list of messages, and returns ``{messages_key: [ToolMessage, ...]}`` (a list
    for a list input), one message per tool call, in call order.

    Args:
        dispatcher: An open dispatcher holding the tools.
        messages_key: Where the state keeps its messages.
        approve: This node's approver, instead of the dispatcher's (see `Dispatcher.dispatch`).
        approval: This node's approval policy, instead of the dispatcher's.
        guard: The session guard of the conversation this node serves, instead of the dispatcher's.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        messages_key: str = "messages",
        approve: Approver | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.messages_key = messages_key
        self._approve = approve
        self._approval = approval
        self._guard = guard

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The catalogue as OpenAI-style function tools, for ``chat_model.bind_tools(...)``."""
        return openai_chat_tools(self.dispatcher.tools())

    async def __call__(self, state: Any) -> Any:
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
        requested: list[tuple[Any, str, Any]] = [
            (tool_call["id"], tool_call["name"], tool_call["args"]) for tool_call in message.tool_calls
        ]
        requested += [(bad["id"], bad["name"] or "", bad["args"] or "") for bad in message.invalid_tool_calls]
        # The batch uses ids of its own: the model's may be None or repeated, and every call still gets
        # its one answer, under the id the model gave it.
        calls = [
            ToolCall(f"call-{position}", name, arguments) for position, (_, name, arguments) in enumerate(requested)
        ]
        results = await self.dispatcher.dispatch(
            calls, approve=self._approve, approval=self._approval, guard=self._guard
        )
        answers = [
            ToolMessage(
                content=model_text(result),
                tool_call_id=call_id or "",
                name=result.call.name,
                status="success" if result.ok else "error",
                artifact=result,
            )
            for (call_id, _, _), result in zip(requested, results, strict=True)
        ]
        return answers if isinstance(state, list) else {self.messages_key: answers}

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
