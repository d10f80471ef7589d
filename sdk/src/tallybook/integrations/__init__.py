"""Tallybook in the frameworks agents are written in: one module per framework, each
importable only when its framework is installed (`pip install "tallybook-sdk[<framework>]"`).

- `tallybook.integrations.pydantic_ai`: a pydantic-ai capability (`pydantic-ai-slim`).
- `tallybook.integrations.openai_agents`: the OpenAI Agents SDK (`openai-agents`).
- `tallybook.integrations.langgraph`: LangGraph's `ToolNode`.
- `tallybook.integrations.temporal`: a Temporal worker plugin for activities (`temporalio`).
"""
