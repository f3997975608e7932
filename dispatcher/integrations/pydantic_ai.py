"""pydantic-ai: a toolset over the dispatcher.

`DispatcherToolset` lists the catalogue as pydantic-ai tools and runs each call through the dispatcher.
pydantic-ai runs the calls of a model response with barriers of its own: a tool whose definition says
``sequential`` runs alone, after the calls before it and before the calls after it, which is the
dispatcher's rule for a call that may mutate the whole state (the root conflict key). The toolset marks
``sequential`` exactly the tools whose calls the dispatcher runs alone: those that may mutate (decided
from the effective annotations: an untrusted server's claims do not count) and have no conflict domain.
A tool with a domain (and perhaps a key function, see docs/conflicts.md) is not a barrier: pydantic-ai
starts its calls together with their neighbours, and the dispatcher, which receives them in the model's
order (pydantic-ai starts the calls between two barriers as tasks in that order), holds back only the
calls that conflict, so writes to different keys overlap. The dispatcher schedules every call again
underneath, across runs and agents sharing it.

The run's context reaches a call through ``arguments=``: a function of the ``RunContext``, the tool's
name and the model's arguments that returns the arguments to dispatch, so that a value from ``deps``
(a tenant, a workspace) is read by the tool and by its key function. It is yours, so it is trusted; it
runs on the event loop before each call.

The dispatcher's notions map to pydantic-ai's:

- retries: the dispatcher retries a call that failed in a way that may be transient (idempotent tools
  of trusted servers only); a tool that reports an error (``isError``) or arguments the tool rejects
  raise ``ModelRetry``, so the model may correct itself up to the tool's ``max_retries``;
- a call that timed out or was cancelled is not handed back for a retry (it may have run): its text
  says what happened;
- approvals: with ``approvals="dispatcher"`` (the default) the dispatcher's approver is asked and a
  call keeps its place while it waits; a denial is a result the model reads. With
  ``approvals="deferred"`` a call the approval policy selects raises ``ApprovalRequired``, so it
  appears in the run's ``DeferredToolRequests``; once approved (``DeferredToolResults``) it runs
  without asking again. pydantic-ai would run the calls after a deferred one at once, before it, so
  those are deferred too (their reason says why): the person decides them together, and the resumed
  run carries them out in the model's order.

Requires the ``pydantic-ai`` extra (``pydantic-ai-slim``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import pydantic_core
from pydantic_ai.exceptions import ApprovalRequired, ModelRetry
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool

from dispatcher import ApprovalPolicy, CallStatus, ConfigurationError, ToolCall
from dispatcher.formats import tool_description, tool_schema

from ._common import model_text

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from pydantic_ai import RunContext

    from dispatcher import ApprovalRequest, Dispatcher, SessionGuard, ToolEntry

__all__ = ["DispatcherToolset"]

_ARGUMENTS = pydantic_core.SchemaValidator(
    pydantic_core.core_schema.dict_schema(
        pydantic_core.core_schema.str_schema(), pydantic_core.core_schema.any_schema()
    )
)

# Outcomes the model may correct by calling again: the tool ran and reported an error, or the call was
# rejected before it ran (bad arguments, an unknown tool).
_RETRYABLE_BY_MODEL = frozenset({CallStatus.TOOL_ERROR, CallStatus.FAILED})

# Passed for a call approved through pydantic-ai, so the dispatcher does not ask again.
_NO_APPROVAL = ApprovalPolicy(destructive=False)


class DispatcherToolset(AbstractToolset[Any]):
    """The catalogue of a `Dispatcher` as a pydantic-ai toolset: ``Agent(model, toolsets=[toolset])``.

    The tools are read from the catalogue on every run step, so servers added later show up.

    Args:
        dispatcher: An open dispatcher holding the tools.
        id: The toolset's id among the agent's toolsets.
        max_retries: How many times the model may call a tool again after it reported an error.
        approvals: ``"dispatcher"`` to ask the dispatcher's approver in place, or ``"deferred"`` for
            pydantic-ai's deferred approvals (see the module docstring).
        approve: The approver, instead of the dispatcher's (``approvals="dispatcher"``).
        approval: The approval policy, instead of the dispatcher's; with ``approvals="deferred"`` it
            selects the calls to defer (default: `ApprovalPolicy()`).
        guard: The session guard of this agent's session, instead of the dispatcher's.
        arguments: A function ``(ctx, tool_name, arguments) -> arguments`` giving the arguments to
            dispatch for each call, for values from the run's ``deps`` (see the module docstring).

    Raises:
        ConfigurationError: ``approvals`` is neither ``"dispatcher"`` nor ``"deferred"``, or
            ``arguments`` is not callable.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        id: str | None = None,
        max_retries: int = 1,
        approvals: Literal["dispatcher", "deferred"] = "dispatcher",
        approve: Callable[[ApprovalRequest], Awaitable[bool]] | None = None,
        approval: ApprovalPolicy | None = None,
        guard: SessionGuard | None = None,
        arguments: Callable[[RunContext[Any], str, dict[str, Any]], Mapping[str, Any]] | None = None,
    ) -> None:
        if approvals not in ("dispatcher", "deferred"):
            raise ConfigurationError(f"approvals must be 'dispatcher' or 'deferred', got {approvals!r}")
        if arguments is not None and not callable(arguments):
            raise ConfigurationError(
                f"arguments must be a function (ctx, tool_name, arguments) -> arguments, got {arguments!r}"
            )
        self._arguments = arguments
        self.dispatcher = dispatcher
        self._id = id
        self._max_retries = max_retries
        self._approvals = approvals
        self._approve = approve
        self._approval = approval
        self._guard = guard
        # approvals="deferred": the ids of the calls deferred for approval.
        self._deferred: set[str] = set()

    @property
    def id(self) -> str | None:
        """The toolset's id, if one was given."""
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """One tool per catalogue entry; ``sequential`` where the dispatcher runs every call alone."""
        return {
            entry.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=entry.name,
                    description=tool_description(entry),
                    parameters_json_schema=tool_schema(entry),
                    # A write with a conflict domain waits only for the calls it conflicts with.
                    sequential=entry.exclusive and entry.domain is None,
                    metadata={
                        "server": entry.server,
                        "tool": entry.tool,
                        "trusted": entry.trusted,
                        "domain": entry.domain,
                    },
                ),
                max_retries=self._max_retries,
                args_validator=_ARGUMENTS,
            )
            for entry in self.dispatcher.tools()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run one call through the dispatcher; the text the model reads, or `ModelRetry` for an error.

        Raises:
            ModelRetry: The tool reported an error or rejected the call (the model may try again).
            ApprovalRequired: ``approvals="deferred"`` and the policy selects this call.
        """
        if self._arguments is not None:
            tool_args = dict(self._arguments(ctx, name, tool_args))
        call = ToolCall(ctx.tool_call_id or f"{name}-{ctx.run_step}", name, tool_args)
        if self._approvals == "deferred":
            approval = self._deferred_approval(name, ctx)
            results = await self.dispatcher.dispatch([call], approval=approval, guard=self._guard)
        else:
            results = await self.dispatcher.dispatch(
                [call], approve=self._approve, approval=self._approval, guard=self._guard
            )
        result = results[0]
        text = model_text(result)
        if result.ok:
            return text
        if result.status in _RETRYABLE_BY_MODEL:
            raise ModelRetry(text)
        return f"Error ({result.status.value}): {text}"

    def _deferred_approval(self, name: str, ctx: RunContext[Any]) -> ApprovalPolicy:
        if ctx.tool_call_approved:
            return _NO_APPROVAL
        entry = self._entry(name)
        policy = self._approval if self._approval is not None else ApprovalPolicy()
        reason = policy.reason(entry) if entry is not None else None
        if reason is None and self._after_deferred(ctx):
            # pydantic-ai would run it now, before the deferred call before it: it waits for approval too.
            reason = "an earlier call of the same response waits for approval"
        if reason is not None:
            if ctx.tool_call_id is not None:
                self._deferred.add(ctx.tool_call_id)
            raise ApprovalRequired(metadata={"reason": reason})
        return _NO_APPROVAL

    def _after_deferred(self, ctx: RunContext[Any]) -> bool:
        """Whether a call before this one in its model response was deferred for approval."""
        for message in reversed(ctx.messages):
            if isinstance(message, ModelResponse):
                ids = [part.tool_call_id for part in message.parts if isinstance(part, ToolCallPart)]
                if ctx.tool_call_id in ids:
                    return any(earlier in self._deferred for earlier in ids[: ids.index(ctx.tool_call_id)])
        return False

    def _entry(self, name: str) -> ToolEntry | None:
        return next((entry for entry in self.dispatcher.tools() if entry.name == name), None)
