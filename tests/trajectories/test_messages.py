"""A model span's messages and a tool span's call read as messages on the case, effect and
span pages: roles, text and tool calls, from the GenAI conventions and from OpenInference's
and Traceloop's flattened attributes; long parts clipped with "more"; nothing malformed
fails a page."""

from __future__ import annotations

import json
import re
from html import unescape

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durability.models import Case, Reason
from tests.desk.support import logged_in
from tests.trajectories.support import TRACE, chat, post_traces, request, tool
from trajectories import messages
from trajectories.links import effect_link_record
from trajectories.models import Span, SpanKind

MODEL, TOOL = "1" * 16, "2" * 16
ASKED = [
    {"role": "system", "parts": [{"type": "text", "content": "You issue refunds."}]},
    {"role": "user", "parts": [{"type": "text", "content": "Refund order A-17, 40 EUR."}]},
]
ANSWERED = [
    {
        "role": "assistant",
        "parts": [
            {"type": "text", "content": "Refunding it."},
            {"type": "tool_call", "id": "call_1", "name": "refund", "arguments": {"order": "A-17"}},
        ],
        "finish_reason": "tool_call",
    }
]


def _model(**attributes) -> Span:
    return Span(kind=SpanKind.MODEL, name="chat", attributes=attributes)


def _said(conversation: list[messages.Message]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    return [(m.role, [(p.kind, p.name, p.text) for p in m.parts]) for m in conversation]


def test_genai_messages_read_as_roles_text_and_tool_calls():
    span = _model()
    span.input, span.output = ASKED, ANSWERED
    convo = messages.conversation_of(span)
    assert _said(convo.asked) == [
        ("system", [("text", "", "You issues refunds.".replace("issues", "issue"))]),
        ("user", [("text", "", "Refund order A-17, 40 EUR.")]),
    ]
    assert _said(convo.answered) == [
        (
            "assistant",
            [("text", "", "Refunding it."), ("tool_call", "refund", '{\n  "order": "A-17"\n}')],
        )
    ]
    assert convo.answered[0].finish_reason == "tool_call"


def test_openinference_flattened_messages_are_nested_again():
    span = _model(
        **{
            "llm.input_messages.0.message.role": "system",
            "llm.input_messages.0.message.content": "You issue refunds.",
            "llm.input_messages.1.message.role": "user",
            "llm.input_messages.1.message.contents.0.message_content.type": "text",
            "llm.input_messages.1.message.contents.0.message_content.text": "Refund A-17.",
            "llm.input_messages.2.message.role": "tool",
            "llm.input_messages.2.message.tool_call_id": "call_0",
            "llm.input_messages.2.message.content": '{"ok": true}',
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_1",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "refund",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": (
                '{"order": "A-17"}'
            ),
        }
    )
    convo = messages.conversation_of(span)
    assert _said(convo.asked) == [
        ("system", [("text", "", "You issue refunds.")]),
        ("user", [("text", "", "Refund A-17.")]),
        ("tool", [("tool_result", "", '{"ok": true}')]),
    ]
    assert convo.asked[2].parts[0].call_id == "call_0"
    assert _said(convo.answered) == [
        ("assistant", [("tool_call", "refund", '{\n  "order": "A-17"\n}')])
    ]


def test_traceloop_flattened_prompts_and_completions_are_read_too():
    span = _model(
        **{
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Refund A-17.",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.tool_calls.0.name": "refund",
            "gen_ai.completion.0.tool_calls.0.id": "call_1",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"order": "A-17"}',
        }
    )
    convo = messages.conversation_of(span)
    assert _said(convo.asked) == [("user", [("text", "", "Refund A-17.")])]
    assert _said(convo.answered)[0][1][0][:2] == ("tool_call", "refund")


def test_openai_style_messages_read_the_same():
    span = _model()
    span.input = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Refund A-17."}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "function": {"name": "refund", "arguments": '{"order": 1}'}}
                ],
            },
        ]
    }
    assert _said(messages.conversation_of(span).asked) == [
        ("user", [("text", "", "Refund A-17.")]),
        ("assistant", [("tool_call", "refund", '{\n  "order": 1\n}')]),
    ]


def test_a_long_part_shows_a_few_lines_and_the_rest_on_more():
    part = messages.Part("text", "\n".join(f"line {n}" for n in range(40)))
    assert part.clipped and part.preview == "line 0\nline 1\nline 2\nline 3"
    assert not messages.Part("text", "short").clipped


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "role",
                        "parts",
                        "content",
                        "type",
                        "tool_calls",
                        "function",
                        "message",
                        "contents",
                        "message_content",
                        "text",
                        "name",
                        "arguments",
                        "id",
                        "0",
                        "1",
                        "messages",
                        "tool_call",
                        "response",
                        "tool_call_id",
                        "finish_reason",
                    ]
                ),
                inner,
                max_size=5,
            )
        ),
        max_leaves=20,
    ),
    st.dictionaries(
        st.from_regex(
            r"(llm\.(in|out)put_messages|gen_ai\.(prompt|completion))(\.[0-9a-z_]{1,8}){0,6}",
            fullmatch=True,
        ),
        st.none() | st.integers() | st.text(max_size=10) | st.lists(st.integers(), max_size=3),
        max_size=6,
    ),
)
def test_nothing_an_agent_sends_fails_the_reading(value, flat):
    for kind in (SpanKind.MODEL, SpanKind.TOOL):
        span = Span(kind=kind, name="x", attributes=flat, input=value, output=value)
        messages.conversation_of(span)
        messages.tool_call_of(span)
        for part in messages._messages(value):
            assert isinstance(part.role, str)


def _linked_case(api, spans) -> Case:
    post_traces(api.client, api.key, request(*spans))
    effect_id = api.intent("refund:1", trace_id=TRACE, span_id=TOOL).json()["effect"]["id"]
    api.intent("refund:1", trace_id=TRACE, span_id=TOOL, request={"order": "A-18"})
    effect_link_record(effect_id=effect_id)
    return Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)


def test_the_case_page_shows_the_model_request_and_the_tool_call_inline(api, alice):
    long_prompt = "\n".join(f"Policy rule {n}." for n in range(30))
    spans = [
        chat(
            MODEL,
            attributes={
                "gen_ai.input.messages": json.dumps(
                    [{"role": "system", "parts": [{"type": "text", "content": long_prompt}]}]
                    + ASKED[1:]
                ),
                "gen_ai.output.messages": json.dumps(ANSWERED),
            },
        ),
        tool(
            TOOL,
            at_ms=100,
            attributes={
                "gen_ai.tool.call.arguments": '{"order": "A-17", "amount": 40}',
                "gen_ai.tool.call.result": '{"refund": "re_77", "status": "succeeded"}',
            },
        ),
    ]
    case = _linked_case(api, spans)
    page = logged_in(alice).get(case.get_absolute_url()).content.decode()
    trajectory = page[page.index('aria-label="Trajectory"') :]
    roles = re.findall(r'data-role="(\w*)"', trajectory)
    assert roles == ["system", "user", "assistant"]
    assert "Refund order A-17, 40 EUR." in trajectory
    # The long system prompt: its first lines, the rest behind "more".
    clip = re.search(
        r'<details class="clip"><summary><span class="preview">(.*?)…</span>', trajectory, re.S
    )
    assert (
        clip is not None
        and clip[1] == "Policy rule 0.\nPolicy rule 1.\nPolicy rule 2.\nPolicy rule 3."
    )
    assert "Policy rule 29." in trajectory
    assert "→ <strong>refund</strong>" in trajectory
    arguments = re.search(r"<dd data-arguments>(.*?)</dd>", trajectory, re.S)
    assert arguments is not None and json.loads(unescape(re.sub(r"<[^>]+>", "", arguments[1]))) == {
        "order": "A-17",
        "amount": 40,
    }
    assert "re_77" in re.search(r"<dd data-result>(.*?)</dd>", trajectory, re.S)[1]
    assert '"parts"' not in unescape(trajectory)
    assert f'<code class="id" title="span {TOOL}">{TOOL}</code>' in trajectory


def test_the_span_page_shows_the_messages_and_malformed_ones_never_fail_it(api, alice):
    spans = [
        chat(
            MODEL,
            attributes={
                "gen_ai.input.messages": (
                    '[{"role": "user", "parts": [{"type": "text"}, 7, null]}, "hi", {"parts": "x"}]'
                ),
                "gen_ai.output.messages": '{"role": ["assistant"], "parts": {"0": 1}}',
            },
        ),
        tool(TOOL, at_ms=100, attributes={"gen_ai.tool.call.arguments": "[[[[["}),
    ]
    post_traces(api.client, api.key, request(*spans))
    client = logged_in(alice)
    for span in Span.objects.all():
        answer = client.get(f"/runs/{span.run_id}/spans/{span.pk}/")
        assert answer.status_code == 200
    model = Span.objects.get(span_id=MODEL)
    page = client.get(f"/runs/{model.run_id}/spans/{model.pk}/").content.decode()
    assert re.findall(r'data-role="(\w*)"', page)[:2] == ["user", ""]
