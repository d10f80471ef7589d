"""A wrong declaration of a tool's effect fails when it is made, in every integration, before
any effect: never as "'str' object is not callable" after the refund."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tallybook.integrations._tool_calls import ToolEffect, default_key, key_of, receipt_of
from tallybook.records import Receipt
from tallybook.testing import FakeTallybook

from tests.sdk.agents_support import Provider

MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"receipt": 42}, "receipt=42"),
    ({"receipt": ""}, "field path"),
    ({"receipt": "refund..id"}, "field path"),
    ({"key": 7}, "key=7"),
    ({"key": "refund:{}"}, "must name its fields"),
    ({"replay": "sometimes"}, "replay='sometimes'"),
    ({"amount": 250}, "amount=250"),
    ({"definitive_on": ValueError}, "definitive_on"),
]
# Mistakes only the tool's parameters reveal: checked where the integration sees the tool.
AGAINST_THE_TOOL: list[tuple[dict[str, Any], str]] = [
    ({"key": "refund:{order_id}"}, "names order_id"),
    ({"key": lambda order_id: f"refund:{order_id}"}, "names order_id"),
    ({"amount": lambda cents: {"value": str(cents), "currency": "EUR"}}, "names cents"),
]


@pytest.fixture
def provider(tmp_path: Path) -> Provider:
    return Provider(tmp_path / "fakepay-ledger.txt")


@pytest.mark.parametrize(("fields", "says"), MISTAKES)
def test_a_tool_effect_with_a_wrong_field_is_refused_when_made(fields, says):
    with pytest.raises(TypeError, match=_escaped(says)):
        ToolEffect(kind="payment", **fields)


@pytest.mark.parametrize(("fields", "says"), MISTAKES)
def test_pydantic_ai_refuses_a_wrong_declaration_when_the_capability_is_made(fields, says):
    from tallybook.integrations.pydantic_ai import Effects

    with pytest.raises(TypeError, match=_escaped(says)):
        Effects(tools={"refund": {"kind": "payment", "target": "fakepay", **fields}})


@pytest.mark.parametrize(("fields", "says"), AGAINST_THE_TOOL)
def test_openai_agents_refuses_a_declaration_naming_what_the_tool_does_not_take(
    fields, says, provider
):
    from agents import Agent, function_tool
    from tallybook.integrations.openai_agents import durable

    @function_tool
    def refund(order: int) -> dict[str, str]:
        """Refund an order in full."""
        return {"id": provider.refund(order)}

    agent = Agent(name="support", tools=[refund])
    with pytest.raises(TypeError, match=_escaped(says)):
        durable(agent, FakeTallybook(), tools={"refund": ToolEffect(kind="payment", **fields)})
    with pytest.raises(TypeError, match="replay policy"):
        durable(agent, FakeTallybook(), tools={"refund": "sometimes"})
    assert provider.refunds() == []


@pytest.mark.parametrize(("fields", "says"), AGAINST_THE_TOOL)
def test_langgraph_refuses_a_declaration_naming_what_the_tool_does_not_take(fields, says, provider):
    from langchain_core.tools import tool
    from tallybook.integrations.langgraph import DurableToolNode

    @tool
    def refund(order: int) -> dict[str, str]:
        """Refund an order in full."""
        return {"id": provider.refund(order)}

    with pytest.raises(TypeError, match=_escaped(says)):
        DurableToolNode([refund], FakeTallybook(), effects={"refund": ToolEffect(**fields)})
    with pytest.raises(TypeError, match="replay policy"):
        DurableToolNode([refund], FakeTallybook(), effects={"refund": "sometimes"})


def test_langgraph_refuses_a_graph_without_a_checkpointer_before_any_effect(provider):
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from tallybook.integrations.langgraph import DurableToolNode, invoke

    @tool
    def refund(order: int) -> dict[str, str]:
        """Refund an order in full."""
        return {"id": provider.refund(order)}

    asks = AIMessage("", tool_calls=[{"name": "refund", "args": {"order": 7}, "id": "c1"}])
    model = FakeMessagesListChatModel(responses=[asks, AIMessage("Done.")])
    tb = FakeTallybook()
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", DurableToolNode([refund], tb))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile()  # no checkpointer
    config = {"configurable": {"thread_id": "ticket-7"}}

    with pytest.raises(TypeError, match="needs a checkpointer"):
        invoke(graph, {"messages": [HumanMessage("Refund order 7.")]}, config, tb)
    # Invoked directly, the tool node refuses the call before its intent.
    with pytest.raises(TypeError, match="needs a checkpointer"):
        graph.invoke({"messages": [HumanMessage("Refund order 7.")]}, config)
    assert provider.refunds() == []
    assert tb.fake.effects == {}


def test_the_default_key_is_the_same_for_a_retried_call_and_apart_for_other_arguments():
    key = default_key("refund", "ticket-7", {"order": 7, "reason": "late"})

    assert key == default_key("refund", "ticket-7", {"reason": "late", "order": 7})
    assert key != default_key("refund", "ticket-7", {"order": 8, "reason": "late"})
    assert key != default_key("refund", "ticket-8", {"order": 7, "reason": "late"})
    assert key != default_key("lookup", "ticket-7", {"order": 7, "reason": "late"})
    # The declared template may still name the call id, on purpose.
    declared = key_of("{run_id}:{tool_call_id}", "refund", "ticket-7", "c9", {"order": 7})
    assert declared == "ticket-7:c9"


def test_a_receipt_path_reads_the_result_and_none_says_there_is_no_provider_id():
    class Refund:
        id = "re_9"

    assert receipt_of({"refund": {"id": "re_1"}}, "refund.id", "stripe", "c1").external_id == (
        "re_1"
    )
    assert receipt_of(Refund(), "id", "stripe", "c1") == Receipt("stripe", "re_9")
    assert receipt_of('{"id": "re_2"}', "id", "stripe", "c1").external_id == "re_2"
    assert receipt_of({"id": "re_3"}, None, "stripe", "c1") == Receipt("tool-call", "c1")


def _escaped(text: str) -> str:
    import re

    return re.escape(text)
