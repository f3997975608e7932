"""Use the dispatcher inside agent frameworks: one module per framework, each behind its own extra.

- `dispatcher.integrations.langgraph` (extra ``langgraph``): `DispatcherToolNode`, a LangGraph
  ``ToolNode`` (for ``create_react_agent`` or your own graph) that runs an ``AIMessage``'s tool calls
  as one batch.
- `dispatcher.integrations.langchain` (extra ``langchain``): `DispatcherMiddleware`, an agent middleware
  for langchain's ``create_agent`` that keeps each call of a message at its place.
- `dispatcher.integrations.openai_agents` (extra ``openai-agents``): the catalogue as OpenAI Agents SDK
  ``FunctionTool``s whose calls keep the model's order although the SDK starts them all at once.
- `dispatcher.integrations.pydantic_ai` (extra ``pydantic-ai``): `DispatcherToolset`, a pydantic-ai
  toolset over the dispatcher.
- `dispatcher.integrations.google_adk` (extra ``adk``): `DispatcherToolset`, an ADK toolset whose calls
  of one model response run as one batch, and `DispatcherPlugin` for apps with a ``before_tool_callback``.
- `dispatcher.integrations.claude_agent_sdk` (extra ``claude-agent-sdk``): the catalogue as the Claude
  Agent SDK's in-process MCP server, and a permission callback from the approval policy.

Importing this package imports no framework; each module imports its own.
"""
