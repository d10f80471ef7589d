"""Secrets are redacted and long values cut before a span is stored; the cut is recorded."""

from __future__ import annotations

import json

import pytest

from durability.redaction import (
    ATTRIBUTE_CAP,
    IO_CAP,
    PATTERN_WINDOW,
    REDACTED,
    BadPattern,
    distinct,
    extras_from,
    is_secret_key,
    pattern_check,
    scrub_text,
)
from tests.trajectories.support import post_traces, request, span, tool
from trajectories.models import Run, Span

OPENAI = "sk-proj-" + "a1B2" * 8
GITHUB = "ghp_" + "x" * 36
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"


def stored(api, *spans, **kw):
    assert post_traces(api.client, api.key, request(*spans, **kw)).status_code == 200
    return {s.span_id: s for s in Span.objects.all()}


def test_known_token_patterns_are_redacted_wherever_they_appear():
    text = f"key {OPENAI}, token {GITHUB}, id {AWS}, header Authorization: Bearer abc.def-123456"
    clean = scrub_text(text)
    for secret in (OPENAI, GITHUB, AWS, "abc.def-123456"):
        assert secret not in clean
    assert "Bearer [REDACTED]" in clean


def test_secret_field_names_are_recognised_but_token_counts_are_not():
    for key in (
        "password",
        "db.password",
        "api_key",
        "x-api-key",
        "Authorization",
        "accessToken",
        "client_secret",
        "session_cookie",
        "aws_secret_access_key",
        "credentials",
    ):
        assert is_secret_key(key), key
    for key in (
        "gen_ai.usage.input_tokens",
        "llm.token_count.prompt",
        "max_tokens",
        "keyboard",
        "tokenizer",
        "author",
    ):
        assert not is_secret_key(key), key


def test_otlp_attributes_inputs_outputs_and_resources_are_redacted(api):
    arguments = json.dumps({"order": 42, "password": "hunter2", "note": f"use {OPENAI}"})
    spans = stored(
        api,
        tool(
            "1" * 16,
            attributes={
                "gen_ai.tool.call.arguments": arguments,
                "gen_ai.tool.call.result": f"done with {GITHUB}",
                "http.request.header.authorization": "Bearer abcdefghijklmnop",
                "db.password": "s3cret",
                "gen_ai.usage.input_tokens": 5,
                "url.full": "https://api.example.com/?api_key=abc123&q=1",
            },
        ),
        resource={"service.name": "agent", "deploy.token": "tok-123"},
    )
    executed = spans["1" * 16]
    assert executed.input == {"order": 42, "password": REDACTED, "note": f"use {REDACTED}"}
    assert executed.output == f"done with {REDACTED}"
    assert executed.attributes["http.request.header.authorization"] == REDACTED
    assert executed.attributes["db.password"] == REDACTED
    assert executed.attributes["url.full"] == f"https://api.example.com/?api_key={REDACTED}&q=1"
    assert executed.input_tokens == 5
    assert executed.resource == {"service.name": "agent", "deploy.token": REDACTED}
    raw = json.dumps([executed.input, executed.output, executed.attributes, executed.resource])
    for secret in ("hunter2", OPENAI, GITHUB, "abcdefghijklmnop", "s3cret", "abc123", "tok-123"):
        assert secret not in raw


def test_span_names_and_status_messages_are_redacted(api):
    failing = span("1" * 16, f"call with {AWS}", status=2)
    failing.status.message = f"401 for key {OPENAI}"
    spans = stored(api, failing)
    assert AWS not in spans["1" * 16].name and OPENAI not in spans["1" * 16].status_message


def test_native_span_events_are_redacted(api):
    event = {
        "id": "e1",
        "type": "span",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "name": "refund",
        "kind": "tool",
        "start": "2026-11-29T10:00:00Z",
        "input": {"card": {"number": "4242", "secret": "cvc-123"}},
        "attributes": {"api_key": OPENAI},
    }
    api.post("events", {"events": [event]})
    saved = Span.objects.get()
    assert saved.input == {"card": {"number": "4242", "secret": REDACTED}}
    assert saved.attributes == {"api_key": REDACTED}


def test_long_values_are_cut_to_their_cap_and_the_cut_is_recorded(api):
    long_output = json.dumps(
        [{"role": "assistant", "parts": [{"type": "text", "content": "x" * 100_000}]}]
    )
    spans = stored(
        api,
        span(
            "1" * 16,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.output.messages": long_output,
                "big.attribute": "y" * 20_000,
                "small.attribute": "z",
            },
        ),
    )
    model = spans["1" * 16]
    assert isinstance(model.output, str) and len(model.output) == IO_CAP
    assert model.output.startswith('[{"role": "assistant"')
    assert model.capped["output"] == {"size": len(long_output), "cap": IO_CAP}
    assert len(model.attributes["big.attribute"]) == ATTRIBUTE_CAP
    assert model.capped["attributes.big.attribute"] == {"size": 20_002, "cap": ATTRIBUTE_CAP}
    assert model.attributes["small.attribute"] == "z"
    assert "input" not in model.capped


def test_numbers_postgresql_cannot_store_are_stored_as_text(api):
    spans = stored(api, span("1" * 16, attributes={"ratio": float("nan"), "huge": float("inf")}))
    assert spans["1" * 16].attributes == {"ratio": "nan", "huge": "inf"}


def test_the_projects_own_patterns_and_key_names_apply_to_spans_and_events(api, project):
    project.redaction_patterns = [r"cust-[0-9]{6}"]
    project.redaction_keys = ["iban"]
    project.save()
    spans = stored(
        api,
        tool(
            "1" * 16,
            attributes={
                "gen_ai.tool.call.arguments": json.dumps({"iban": "DE89370400440532013000"}),
                "crm.note": "customer cust-123456 called",
            },
        ),
    )
    executed = spans["1" * 16]
    assert executed.input == {"iban": REDACTED}
    assert executed.attributes["crm.note"] == f"customer {REDACTED} called"
    event = {
        "id": "e1",
        "type": "run",
        "run_id": "run-cust-654321",
        "attributes": {"iban": "DE00", "who": "cust-111111"},
    }
    assert api.post("events", {"events": [event]}).status_code == 207
    run = Run.objects.get(run_id__startswith="run-")
    assert run.attributes == {"iban": REDACTED, "who": REDACTED}
    assert "654321" not in run.run_id and run.run_id.startswith("run-[REDACTED:")


def test_a_secret_in_a_run_id_leaves_one_run_under_its_digest(api):
    stored(api, span("1" * 16, attributes={"tallybook.run.id": f"run-{OPENAI}"}))
    stored(api, span("2" * 16, attributes={"tallybook.run.id": f"run-{OPENAI}"}))
    (run,) = Run.objects.all()
    assert OPENAI not in run.run_id and run.spans.count() == 2


def test_a_pattern_check_refuses_what_could_hang_or_redact_everything():
    assert pattern_check(r"cust-[0-9]{6}").pattern == r"cust-[0-9]{6}"
    # Repeats in repeats run on RE2 in linear time: no longer a reason to refuse.
    for linear in ("(a+)+c", "x(c+)*", "(?:[a-z]+\\s?)+!$", "(a|a)+b", "(a|aa)*b"):
        assert pattern_check(linear).search("a" * 10_000 + "!?") is None
    for bad in ("(?=a)b", "(a)\\1", "", ".*", "["):
        with pytest.raises(BadPattern):
            pattern_check(bad)


def test_a_projects_pattern_finds_a_secret_across_the_edge_of_a_scanned_window():
    extras = extras_from((r"cust-[0-9]{6}",), ())
    for at in (0, PATTERN_WINDOW - 5, 2 * PATTERN_WINDOW - 4096 - 3, 3 * PATTERN_WINDOW):
        text = "x" * at + "cust-123456" + "y" * PATTERN_WINDOW
        assert scrub_text(text, extras) == "x" * at + REDACTED + "y" * PATTERN_WINDOW


def test_identities_keep_a_stable_digest():
    one, other = f"pay:{OPENAI}", f"pay:{GITHUB}"
    assert distinct(one) == distinct(one) != distinct(other)
    assert OPENAI not in distinct(one)
    assert distinct("pay:42") == "pay:42"
    assert distinct(distinct(one)) == distinct(one)
