"""POST /api/v1/events: batches of run and span events, answered event by event (207)."""

from __future__ import annotations

import pytest

from trajectories.models import RequestedToolCall, Run, SeenEvent, Span

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def span_event(event_id: str, span_id: str = "00f067aa0ba902b7", **fields):
    return {
        "id": event_id,
        "type": "span",
        "run_id": "run-1",
        "trace_id": TRACE,
        "span_id": span_id,
        "name": "chat",
        "kind": "model",
        "start": "2026-11-29T10:00:00Z",
        "end": "2026-11-29T10:00:01.5Z",
        **fields,
    }


def test_it_stores_a_run_and_its_spans_and_answers_207_per_event(api):
    r = api.post(
        "events",
        {
            "events": [
                {
                    "id": "e-run",
                    "type": "run",
                    "run_id": "run-1",
                    "agent": "refunds",
                    "workflow": "refund",
                    "workflow_version": "3",
                    "status": "ok",
                    "started": "2026-11-29T10:00:00Z",
                    "ended": "2026-11-29T10:00:05Z",
                },
                span_event(
                    "e-model",
                    request_model="gpt-4o",
                    input_tokens=10,
                    output_tokens=2,
                    output=[
                        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_9"}]}
                    ],
                ),
                span_event(
                    "e-tool",
                    "00f067aa0ba902b8",
                    kind="tool",
                    name="refund",
                    parent_span_id="00f067aa0ba902b7",
                    tool_name="refund",
                    tool_call_id="call_9",
                    input={"order": 1},
                ),
            ]
        },
    )
    assert r.status_code == 207
    body = r.json()
    assert (body["stored"], body["duplicates"], body["rejected"]) == (3, 0, 0)
    assert [(x["index"], x["id"], x["status"], x["result"]) for x in body["results"]] == [
        (0, "e-run", 201, "stored"),
        (1, "e-model", 201, "stored"),
        (2, "e-tool", 201, "stored"),
    ]
    run = Run.objects.get()
    assert (run.run_id, run.agent, run.workflow, run.workflow_version, run.status) == (
        "run-1",
        "refunds",
        "refund",
        "3",
        "ok",
    )
    assert (run.span_count, run.input_tokens, run.inferred) == (2, 10, False)
    assert Span.objects.get(kind="tool").tool_call_id == "call_9"
    assert RequestedToolCall.objects.get().tool_call_id == "call_9"
    assert SeenEvent.objects.count() == 3


def test_a_bad_event_is_rejected_with_its_reason_and_the_others_are_stored(api):
    r = api.post(
        "events",
        {
            "events": [
                span_event("good"),
                span_event("bad-hex", span_id="xyz"),
                {"id": "no-type"},
                "not an object",
                span_event("bad-time", "00f067aa0ba902b9", start="yesterday", unknown=1),
            ]
        },
    )
    assert r.status_code == 207
    results = r.json()["results"]
    assert [x["result"] for x in results] == [
        "stored",
        "rejected",
        "rejected",
        "rejected",
        "rejected",
    ]
    assert results[1]["status"] == 400 and "span_id" in results[1]["fields"]
    assert results[2]["fields"] == {"type": "Expected 'run' or 'span'"}
    assert results[3]["id"] is None
    assert set(results[4]["fields"]) == {"start", "unknown"}
    assert list(Span.objects.values_list("span_id", flat=True)) == ["00f067aa0ba902b7"]
    # Rejected ids are not recorded: the client may fix the event and send it again.
    assert list(SeenEvent.objects.values_list("event_id", flat=True)) == ["good"]


def test_an_event_id_seen_before_is_acknowledged_without_change(api):
    api.post("events", {"events": [span_event("e1", name="first")]})
    r = api.post("events", {"events": [span_event("e1", name="changed"), span_event("e1")]})
    assert [(x["status"], x["result"]) for x in r.json()["results"]] == [
        (200, "duplicate"),
        (200, "duplicate"),
    ]
    assert Span.objects.get().name == "first"


def test_an_id_repeated_within_one_batch_is_stored_once(api):
    r = api.post(
        "events",
        {"events": [span_event("e1", name="first"), span_event("e1", name="second")]},
    )
    assert [x["result"] for x in r.json()["results"]] == ["stored", "duplicate"]
    assert Span.objects.get().name == "first"


def test_event_ids_differing_only_in_a_short_secret_are_two_events_answered_as_stored(api):
    one = span_event("e:token=abc123", name="first")
    other = span_event("e:token=xyz789", "00f067aa0ba902b8", name="second")
    r = api.post("events", {"events": [one, other]})
    results = r.json()["results"]
    assert [x["result"] for x in results] == ["stored", "stored"]
    assert Span.objects.count() == 2
    answered = [x["id"] for x in results]
    assert sorted(answered) == sorted(SeenEvent.objects.values_list("event_id", flat=True))
    assert answered[0] != answered[1]
    assert "abc123" not in r.content.decode() and "xyz789" not in r.content.decode()
    # Sent again, each is a duplicate of its own, answered by the same stored id.
    again = api.post("events", {"events": [one, other]}).json()["results"]
    assert [(x["id"], x["result"]) for x in again] == [(i, "duplicate") for i in answered]


def test_replaying_a_whole_batch_changes_nothing(api):
    batch = {"events": [{"id": "r", "type": "run", "run_id": "run-1"}, span_event("s")]}
    api.post("events", batch)
    before = list(Span.objects.values()), list(Run.objects.values("span_count", "updated"))
    r = api.post("events", batch)
    assert r.json()["duplicates"] == 2
    assert (
        list(Span.objects.values()),
        list(Run.objects.values("span_count", "updated")),
    ) == before


@pytest.mark.parametrize(
    "body, field",
    [
        ("{not json", "body"),
        ("[]", "body"),
        ({"events": []}, "events"),
        ({"events": [{}] * 1001}, "events"),
        ({"events": [], "extra": 1}, "extra"),
    ],
)
def test_a_batch_that_is_not_a_batch_is_a_400_and_stores_nothing(api, body, field):
    r = api.post("events", body)
    assert r.status_code == 400
    assert field in r.json()["fields"]
    assert not SeenEvent.objects.exists()


def test_a_body_over_3_5_mb_is_a_413(api):
    event = span_event("big", input="x" * 3_600_000)
    r = api.post("events", {"events": [event]})
    assert r.status_code == 413
    assert not Span.objects.exists()


def test_other_projects_see_the_same_event_id_as_new(api, other_api):
    api.post("events", {"events": [span_event("shared")]})
    r = other_api.post("events", {"events": [span_event("shared")]})
    assert r.json()["results"][0]["result"] == "stored"


def test_an_event_holding_nul_characters_fails_alone(api):
    nul = span_event("nul", name="na\u0000me")
    r = api.post("events", {"events": [nul, span_event("ok", "1" * 16)]})
    assert r.status_code == 207
    rejected, stored = r.json()["results"]
    assert (rejected["result"], list(rejected["fields"])) == ("rejected", ["name"])
    assert stored["result"] == "stored"
    assert list(Span.objects.values_list("span_id", flat=True)) == ["1" * 16]


@pytest.mark.parametrize("event_type", [{"run": 1}, ["span"], 1, None], ids=str)
def test_an_event_whose_type_is_not_a_string_fails_alone(api, event_type):
    odd = {"id": "odd", "type": event_type, "run_id": "run-1"}
    r = api.post("events", {"events": [odd, span_event("ok")]})
    assert r.status_code == 207
    rejected, stored = r.json()["results"]
    assert (rejected["result"], rejected["fields"]) == (
        "rejected",
        {"type": "Expected 'run' or 'span'"},
    )
    assert stored["result"] == "stored"
    assert list(SeenEvent.objects.values_list("event_id", flat=True)) == ["ok"]


def test_a_time_with_an_offset_is_stored_as_the_same_instant_in_utc(api):
    # +22:00 is a valid ISO 8601 offset that PostgreSQL's timestamptz input refuses.
    event = span_event("far-east", start="2026-11-30T08:00:00+22:00", end=None)
    run = {"id": "r", "type": "run", "run_id": "run-1", "started": "2026-11-28T20:00:00-13:30"}
    r = api.post("events", {"events": [run, event]})
    assert [x["result"] for x in r.json()["results"]] == ["stored", "stored"]
    start = Span.objects.get().start
    assert start.isoformat() == "2026-11-29T10:00:00+00:00"
    assert Run.objects.get().started.isoformat() == "2026-11-29T09:30:00+00:00"


OUT_OF_RANGE = [
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-14:00",
    "1999-12-31T23:59:59Z",
    "2999-01-01T00:00:00Z",
]


@pytest.mark.parametrize("when", OUT_OF_RANGE)
@pytest.mark.parametrize("field", ["start", "end"])
def test_a_span_time_out_of_range_fails_alone(api, field, when):
    r = api.post(
        "events", {"events": [span_event("odd", **{field: when}), span_event("ok", "1" * 16)]}
    )
    rejected, stored = r.json()["results"]
    assert rejected["result"] == "rejected" and field in rejected["fields"], rejected
    assert stored["result"] == "stored"
    assert list(Span.objects.values_list("span_id", flat=True)) == ["1" * 16]


@pytest.mark.parametrize("when", OUT_OF_RANGE)
@pytest.mark.parametrize("field", ["started", "ended"])
def test_a_run_time_out_of_range_fails_alone_and_stores_no_run(api, field, when):
    odd = {"id": "odd", "type": "run", "run_id": "run-odd", field: when}
    r = api.post("events", {"events": [odd]})
    (rejected,) = r.json()["results"]
    assert rejected["result"] == "rejected" and field in rejected["fields"], rejected
    assert not Run.objects.exists() and not SeenEvent.objects.exists()


@pytest.mark.parametrize("when", [1764410400, 1.5e9, True, ["2026-11-29T10:00:00Z"]], ids=str)
def test_a_time_that_is_not_an_iso_8601_string_fails_alone(api, when):
    r = api.post("events", {"events": [span_event("odd", start=when)]})
    (rejected,) = r.json()["results"]
    assert rejected["result"] == "rejected" and "start" in rejected["fields"], rejected
    assert not Span.objects.exists()


def test_a_date_without_a_time_is_refused_by_events_as_by_the_api(api):
    r = api.post("events", {"events": [span_event("dated", start="2026-11-29")]})
    (rejected,) = r.json()["results"]
    assert rejected["result"] == "rejected" and "start" in rejected["fields"], rejected
    assert not Span.objects.exists()
    receipt = {"key": "k", "system": "stripe", "external_id": "re_1", "observed_at": "2026-11-29"}
    refused = api.post("receipts", receipt)
    assert refused.status_code == 400 and "observed_at" in refused.json()["fields"]
