"""Receipts and failures in batches: each item recorded in its own transaction and answered
as its single route would answer it; a bad item is refused alone."""

from __future__ import annotations

from durability.models import Effect, Receipt


def _receipt(key: str, external_id: str, **fields: object) -> dict[str, object]:
    return {"key": key, "system": "stripe", "external_id": external_id, **fields}


def test_a_batch_with_one_bad_receipt_stores_the_others_and_refuses_that_one(api):
    for n in range(3):
        assert api.intent(f"k{n}").status_code == 201
    response = api.post(
        "receipts/batch",
        {
            "receipts": [
                _receipt("k0", "ch_0"),
                _receipt("k1", "ch_1", observed_at="yesterday"),  # not ISO 8601
                "not a receipt",
                _receipt("k2", "ch_2"),
                _receipt("k0", "ch_0"),  # the first one again: nothing changes
            ]
        },
    )
    assert response.status_code == 207
    results = response.json()["results"]
    assert [(r["index"], r["status"]) for r in results] == [
        (0, 201),
        (1, 400),
        (2, 400),
        (3, 201),
        (4, 200),
    ]
    assert results[1]["body"]["fields"] == {
        "observed_at": results[1]["body"]["fields"]["observed_at"]
    }
    assert results[2]["body"]["fields"] == {"body": "Expected an object"}
    assert results[0]["body"]["effect"]["state"] == "succeeded"
    assert results[4]["body"]["created"] is False
    assert sorted(Receipt.objects.values_list("external_id", flat=True)) == ["ch_0", "ch_2"]
    assert Effect.objects.get(key="k1").state == "pending"


def test_a_batch_of_failures_answers_each_as_its_route_would(api):
    assert api.intent("k0").status_code == 201
    assert api.intent("k1").status_code == 201
    response = api.post(
        "failures/batch",
        {
            "failures": [
                {"key": "k0", "error": "card declined", "definitive": True},
                {"key": "nope", "error": "?"},
                {"key": "k1"},
            ]
        },
    )
    assert response.status_code == 207
    results = response.json()["results"]
    assert [r["status"] for r in results] == [200, 404, 400]
    assert results[0]["body"]["effect"]["state"] == "failed"
    assert results[2]["body"]["fields"] == {"error": "This field is required"}
    assert Effect.objects.get(key="k1").state == "pending"


def test_a_batch_is_refused_whole_when_it_is_no_batch(api):
    assert api.post("receipts/batch", {"receipts": []}).status_code == 400
    too_many = [_receipt(f"k{n}", f"ch_{n}") for n in range(101)]
    assert api.post("receipts/batch", {"receipts": too_many}).status_code == 400
    assert api.post("receipts/batch", [_receipt("k0", "ch_0")]).status_code == 400
    assert not Receipt.objects.exists()
