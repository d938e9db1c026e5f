"""Adapters that put stockade under the agent frameworks' own shell and file tools.

One module per framework, each importing its framework only when used (an optional
extra: ``pip install 'stockade[openai-agents]'``, ``[pydantic-ai]``, ``[langchain]``,
``[deepagents]``, ``[inspect]``). The policy always comes from the host program, never
from the model; what the sandbox refused goes back to the model as text (the hints of
the MCP server) and, where the framework has a slot, as data. See docs/integrations.md.
"""
