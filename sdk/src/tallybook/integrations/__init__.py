"""Integrations with agent frameworks, each importable only when its framework is installed.

- `tallybook.integrations.openai_agents`: the OpenAI Agents SDK (`openai-agents`).
- `tallybook.integrations.langgraph`: LangGraph's `ToolNode`.
"""
