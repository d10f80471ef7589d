"""The HTTP reconciler against a real local HTTP server, and what its answers do."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from durability.ledger import evidence
from durability.ledger.commands import ReceiptEvidence
from durability.models import Attempt, AuditEntry, Case, Effect, Probe, Receipt, ReconcilerConfig
from durability.reconcilers.base import Found, NotFound, ProbeConfig, Reconciler, Unknown
from durability.reconcilers.reconciling import effect_probe
from tests.local_http import LocalHttp, Reply
from tests.ports import refusing_port

REFUND = {"id": "re_1", "status": "succeeded", "created": 1700000000}


@pytest.fixture
def server():
    with LocalHttp() as s:
        yield s


def timed_out(api, key="refund:1", **intent) -> Effect:
    api.intent(key, **intent)
    api.timeout(key)
    return Effect.objects.get(key=key)


def ask(effect: Effect, requested_by: str = "system:scan") -> Probe:
    """Probe an effect that is expected to be probed."""
    probe = effect_probe(effect_id=effect.pk, requested_by=requested_by)
    assert probe is not None
    return probe


def reconciler(project, server, grace_s=None, **config) -> ReconcilerConfig:
    settings = {
        "url": server.url + "/refunds/{key}",
        "external_id_path": "id",
        "status_path": "status",
        "found": ["succeeded", "pending"],
        "not_found": ["canceled"],
        "observed_at_path": "created",
        **config,
    }
    row = ReconcilerConfig(
        project=project, target="stripe", kind="http", config=settings, grace_s=grace_s
    )
    row.full_clean()
    row.save()
    return row


def test_found_settles_the_effect_with_a_provider_confirmed_receipt(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))

    probe = ask(effect)

    assert probe.answer == "found" and probe.settled == "probe_found"
    assert (probe.evidence or {})["external_id"] == "re_1"
    effect.refresh_from_db()
    assert effect.state == "succeeded" and not effect.late
    receipt = Receipt.objects.get(effect=effect)
    assert probe.receipt == receipt
    assert (receipt.system, receipt.external_id) == ("stripe", "re_1")
    assert receipt.strength == "provider_confirmed"
    assert receipt.observed_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    case = Case.objects.get(effect=effect, reason="uncertain")
    assert case.closed is not None
    assert case.resolution.action == "probe_found"
    assert case.resolution.actor == "reconciler:http"
    body = api.intent("refund:1").json()
    assert body["decision"] == "completed"
    assert body["receipt"]["external_id"] == "re_1"
    assert body["receipt"]["strength"] == "provider_confirmed"


def test_every_probe_is_in_the_audit_trail(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    probe = ask(effect, "user:alice")
    entry = AuditEntry.objects.get(effect=effect, action="probe")
    assert entry.actor == "user:alice"
    assert entry.data == {
        "probe": probe.pk,
        "kind": "http",
        "answer": "found",
        "settled": "probe_found",
    }
    settled = AuditEntry.objects.get(effect=effect, action="probe_found")
    assert (settled.actor, settled.to_state) == ("reconciler:http", "succeeded")


def test_the_url_template_encodes_the_key_and_reads_request_fields(api, project, server):
    effect = timed_out(api, "refund:1/a b", request={"order": {"id": "o/7"}})
    reconciler(project, server, url=server.url + "/orders/{request[order][id]}/refunds/{key}")
    ask(effect)
    assert server.seen[-1].path == "/orders/o%2F7/refunds/refund%3A1%2Fa%20b"


def test_a_request_field_the_effect_lacks_answers_unknown(api, project, server):
    effect = timed_out(api, request={"amount": 1})
    reconciler(project, server, url=server.url + "/orders/{request[order]}")
    probe = ask(effect)
    assert probe.answer == "unknown" and "order" in probe.detail
    assert server.seen == []


def test_the_auth_header_comes_from_the_named_environment_variable(
    api, project, server, monkeypatch
):
    monkeypatch.setenv("TALLYBOOK_SECRET_TEST_STRIPE_AUTH", "Bearer sk_test_secret")
    effect = timed_out(api)
    reconciler(
        project,
        server,
        auth_env="TALLYBOOK_SECRET_TEST_STRIPE_AUTH",
        headers={"Stripe-Version": "1"},
    )
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    probe = ask(effect)
    assert server.seen[-1].headers["Authorization"] == "Bearer sk_test_secret"
    assert server.seen[-1].headers["Stripe-Version"] == "1"
    assert "sk_test" not in str(probe.evidence) + probe.detail
    assert "sk_test" not in str(ReconcilerConfig.objects.get().config)


def test_an_unset_auth_variable_answers_unknown_without_asking(api, project, server):
    effect = timed_out(api)
    reconciler(project, server, auth_env="TALLYBOOK_SECRET_TEST_UNSET")
    probe = ask(effect)
    assert probe.answer == "unknown" and "TALLYBOOK_SECRET_TEST_UNSET" in probe.detail
    assert server.seen == []


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "EMAIL_HOST_PASSWORD"])
def test_the_servers_own_environment_is_no_auth_variable(api, project, server, name):
    # A project admin naming the server's secret would have it sent to their URL.
    with pytest.raises(ValidationError) as refused:
        reconciler(project, server, auth_env=name)
    assert f"{name} is not a reconciler's secret" in str(refused.value)
    assert "TALLYBOOK_SECRET_" in str(refused.value)
    assert not ReconcilerConfig.objects.exists()


def test_an_operator_lists_the_other_variables_reconcilers_may_read(
    api, project, server, monkeypatch, settings
):
    settings.TALLYBOOK_RECONCILER_SECRET_ENV = ["PAYMENTS_API_AUTH"]
    monkeypatch.setenv("PAYMENTS_API_AUTH", "Bearer sk_test_listed")
    effect = timed_out(api)
    reconciler(project, server, auth_env="PAYMENTS_API_AUTH")
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    assert ask(effect).answer == "found"
    assert server.seen[-1].headers["Authorization"] == "Bearer sk_test_listed"


def test_a_configuration_stored_before_the_rule_reads_no_secret(api, project, server, monkeypatch):
    monkeypatch.setenv("TB_TEST_SERVER_SECRET", "the server's own")
    effect = timed_out(api)
    row = reconciler(project, server)
    ReconcilerConfig.objects.filter(pk=row.pk).update(
        config={**row.config, "auth_env": "TB_TEST_SERVER_SECRET"}
    )
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    effect_probe(effect_id=effect.pk, requested_by="system:scan")
    assert all("Authorization" not in seen.headers for seen in server.seen)


def test_not_found_without_a_grace_period_settles_nothing(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    probe = ask(effect)  # the server answers 404
    assert probe.answer == "not_found" and probe.settled == ""
    assert "HTTP 404" in probe.detail and "an operator decides" in probe.detail
    effect.refresh_from_db()
    assert effect.state == "timed_out"
    assert Case.objects.get(effect=effect, reason="uncertain").closed is None
    assert api.intent("refund:1").json()["decision"] == "wait"


def test_a_status_that_means_not_found_is_not_found(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", Reply(200, {**REFUND, "status": "canceled"}))
    probe = ask(effect)
    assert probe.answer == "not_found" and '"canceled"' in probe.detail


def _age(effect: Effect, seconds: int) -> None:
    """Move the effect's timeout and its attempt's deadline `seconds` into the past."""
    then = timezone.now() - timedelta(seconds=seconds)
    Effect.objects.filter(pk=effect.pk).update(updated=then, deadline=then)
    Attempt.objects.filter(effect=effect).update(deadline=then)


def test_not_found_within_the_grace_period_settles_nothing(api, project, server):
    effect = timed_out(api, timeout_s=30)
    reconciler(project, server, grace_s=3600)
    _age(effect, 60)
    probe = ask(effect)
    assert probe.answer == "not_found" and probe.settled == ""
    assert "absence will be trusted from" in probe.detail
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"


def test_not_found_after_the_grace_period_settles_not_happened(api, project, server):
    effect = timed_out(api, timeout_s=30)
    reconciler(project, server, grace_s=600)
    _age(effect, 601)

    probe = ask(effect)

    assert probe.answer == "not_found" and probe.settled == "probe_not_found"
    effect.refresh_from_db()
    assert effect.state == "not_happened"
    case = Case.objects.get(effect=effect, reason="uncertain")
    assert case.closed is not None
    assert (case.resolution.action, case.resolution.actor) == ("probe_not_found", "reconciler:http")
    assert not Receipt.objects.exists()
    body = api.intent("refund:1").json()
    assert body["decision"] == "proceed"
    assert body["effect"]["attempt"] == 2


def test_the_grace_period_runs_from_a_deadline_later_than_the_timeout(api, project, server):
    # The agent gave up early: its request may still be in flight until the deadline.
    effect = timed_out(api, timeout_s=3600)
    reconciler(project, server, grace_s=60)
    Effect.objects.filter(pk=effect.pk).update(updated=timezone.now() - timedelta(hours=1))
    probe = ask(effect)
    assert probe.settled == ""
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply(503, {"error": "down"}), "HTTP 503"),
        (Reply(500, b"oops"), "HTTP 500"),
        (Reply(429, {}), "HTTP 429"),
        (Reply(200, b"<html>"), "not JSON"),
        (Reply(200, {**REFUND, "status": "weird"}), "not a configured status"),
        (Reply(200, {"status": "succeeded"}), "without id"),
        (Reply(302, {}, headers={"Location": "http://example.invalid/"}), "HTTP 302"),
    ],
)
def test_an_untrustworthy_reply_answers_unknown_and_changes_nothing(
    api, project, server, reply, why
):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", reply)
    probe = ask(effect)
    assert probe.answer == "unknown" and why in probe.detail
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"
    assert len(server.seen) == 1  # a redirect is not followed


def test_a_slow_server_answers_unknown_after_the_timeout(api, project, server):
    effect = timed_out(api)
    reconciler(project, server, timeout_s=0.2)
    may_answer = threading.Event()
    server.reply("/refunds/refund%3A1", Reply(200, REFUND, hold=may_answer))
    try:
        probe = ask(effect)
    finally:
        may_answer.set()
    # The server held its answer until the probe had returned: the probe gave up, not waited.
    assert probe.answer == "unknown" and "timed out" in probe.detail


def test_an_unreachable_server_answers_unknown(api, project):
    effect = timed_out(api)
    with refusing_port() as port:
        ReconcilerConfig.objects.create(
            project=project,
            target="stripe",
            kind="http",
            config={"url": f"http://127.0.0.1:{port}/{{key}}", "external_id_path": "id"},
        )
        probe = ask(effect)
    assert probe.answer == "unknown" and "refused" in probe.detail.lower()


def test_an_empty_search_is_not_found_only_when_so_configured(api, project, server):
    effect = timed_out(api)
    config = reconciler(
        project, server, url=server.url + "/search?q={key}", external_id_path="data.0.id",
        status_path=None, found=[], not_found=[],
    )  # fmt: skip
    server.reply("/search?q=refund%3A1", Reply(200, {"data": []}))
    assert ask(effect).answer == "unknown"
    config.config = {**config.config, "absent_means_not_found": True}
    config.save()
    assert ask(effect).answer == "not_found"
    server.reply("/search?q=refund%3A1", Reply(200, {"data": [{"id": "re_9"}]}))
    probe = ask(effect)
    assert probe.answer == "found" and (probe.evidence or {})["external_id"] == "re_9"


def test_an_empty_search_with_a_status_path_is_not_found_when_so_configured(api, project, server):
    effect = timed_out(api)
    reconciler(
        project, server, url=server.url + "/search?q={key}", external_id_path="data.0.id",
        status_path="data.0.status", absent_means_not_found=True,
    )  # fmt: skip
    server.reply("/search?q=refund%3A1", Reply(200, {"data": []}))
    assert ask(effect).answer == "not_found"
    server.reply("/search?q=refund%3A1", Reply(200, {"data": [{"status": "canceled"}]}))
    assert ask(effect).answer == "not_found"
    server.reply("/search?q=refund%3A1", Reply(200, {"data": [{"status": "succeeded"}]}))
    assert ask(effect).answer == "unknown"
    server.reply("/search?q=refund%3A1", Reply(200, {"data": [{"id": "re_2"}]}))
    assert ask(effect).answer == "unknown"  # a status is configured: it must say found


def test_an_effect_that_is_no_longer_timed_out_is_not_probed(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    api.receipt("refund:1", "re_late")
    assert effect_probe(effect_id=effect.pk) is None
    assert server.seen == [] and not Probe.objects.exists()


def test_a_target_without_an_enabled_reconciler_is_not_probed(api, project, server):
    effect = timed_out(api)
    config = reconciler(project, server)
    config.target = "paypal"
    config.save()
    assert effect_probe(effect_id=effect.pk) is None
    ReconcilerConfig.objects.update(target="stripe", enabled=False)
    assert effect_probe(effect_id=effect.pk) is None
    assert server.seen == []


def test_probing_a_settled_effect_again_changes_nothing(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    ask(effect)
    assert effect_probe(effect_id=effect.pk) is None
    assert Receipt.objects.count() == 1 and Probe.objects.count() == 1


class Scripted(Reconciler[ProbeConfig]):
    """A plug-in whose answer the test chooses; it may act on the world while asked."""

    kind = "test-scripted"
    Config = ProbeConfig
    answer: Found | NotFound | Unknown = Unknown("unset")
    meanwhile = staticmethod(lambda effect: None)

    def probe(self, effect):
        Scripted.meanwhile(effect)
        return Scripted.answer


@pytest.fixture
def scripted(project, settings):
    settings.TALLYBOOK_RECONCILERS = {
        **settings.TALLYBOOK_RECONCILERS,
        Scripted.kind: f"{__name__}.Scripted",
    }
    ReconcilerConfig.objects.create(project=project, target="stripe", kind=Scripted.kind)
    return Scripted


def test_a_plugin_registered_by_kind_answers_for_its_target(api, scripted, monkeypatch):
    effect = timed_out(api)
    monkeypatch.setattr(scripted, "answer", Found("ledger", "L-1", data={"page": 3}))
    probe = ask(effect)
    assert probe.kind == "test-scripted" and probe.settled == "probe_found"
    receipt = Receipt.objects.get()
    assert (receipt.system, receipt.external_id, receipt.data) == ("ledger", "L-1", {"page": 3})


def test_an_answer_that_comes_after_the_effect_was_settled_changes_nothing(
    api, project, scripted, monkeypatch
):
    effect = timed_out(api)

    def receipt_arrives(effect):
        evidence.receipt_record(
            project=project,
            actor="agent",
            receipt=ReceiptEvidence(key=effect.key, system="stripe", external_id="re_agent"),
        )

    monkeypatch.setattr(scripted, "meanwhile", staticmethod(receipt_arrives))
    monkeypatch.setattr(scripted, "answer", Found("stripe", "re_probe"))
    probe = ask(effect)
    assert probe.answer == "found" and probe.settled == ""
    assert "not applied: the effect is now succeeded" in probe.detail
    assert list(Receipt.objects.values_list("external_id", flat=True)) == ["re_agent"]


def test_a_plugin_that_raises_answers_unknown(api, scripted, monkeypatch):
    effect = timed_out(api)

    def boom(effect):
        raise RuntimeError("plug-in bug")

    monkeypatch.setattr(scripted, "meanwhile", staticmethod(boom))
    probe = ask(effect)
    assert probe.answer == "unknown" and "plug-in bug" in probe.detail


@pytest.mark.parametrize(
    ("kind", "config", "field", "message"),
    [
        ("ftp", {}, "kind", "no reconciler of kind 'ftp'"),
        ("http", {"url": "ftp://x/{key}", "external_id_path": "id"}, "config", "http://"),
        ("http", {"url": "http://x/{secret}", "external_id_path": "id"}, "config", "{secret}"),
        ("http", {"url": "http://x/{key.upper}", "external_id_path": "id"}, "config", "key.upper"),
        ("http", {"url": "http://x/"}, "config", "external_id_path"),
        ("http", {"url": "http://x/", "external_id_path": "id", "extra": 1}, "config", "extra"),
        (
            "http",
            {"url": "http://x/", "external_id_path": "id", "status_path": "s"},
            "config",
            "status values",
        ),
        ("git", {"repository": "/r", "commit": "{key}", "tag": "v1"}, "config", "exactly one"),
        ("git", {"repository": "/r"}, "config", "exactly one"),
    ],
)
def test_a_configuration_is_validated_against_its_kind(project, kind, config, field, message):
    row = ReconcilerConfig(project=project, target="stripe", kind=kind, config=config)
    with pytest.raises(ValidationError) as raised:
        row.full_clean()
    assert message in " ".join(raised.value.message_dict[field])


def test_an_intent_to_reconcile_without_a_reconciler_is_accepted_and_told(api, project, server):
    body = api.intent("refund:1", replay="reconcile").json()
    assert body["decision"] == "proceed"
    assert "No reconciler is configured for target 'stripe'" in body["reason"]
    reconciler(project, server)
    body = api.intent("refund:2", replay="reconcile").json()
    assert body["decision"] == "proceed" and "reconciler" not in body["reason"]
    assert "reconciler" not in api.intent("refund:3").json()["reason"]


@pytest.mark.parametrize(
    ("created", "why"),
    [
        ("9999-12-31T23:59:59-05:00", "out of range once converted to UTC"),
        ("1999-12-31T23:59:59+00:00", "must lie between"),
        (1e10, "must lie between"),
        ("yesterday", "expected ISO 8601 or Unix seconds"),
        (True, "expected Unix seconds as a number"),
    ],
)
def test_a_provider_time_out_of_range_or_unreadable_is_an_unknown_answer_with_its_reason(
    api, project, server, created, why
):
    effect = timed_out(api)
    reconciler(project, server)
    server.reply("/refunds/refund%3A1", Reply(200, {**REFUND, "created": created}))
    probe = ask(effect)
    assert probe.answer == "unknown" and probe.settled == ""
    assert "created" in probe.detail and why in probe.detail
    assert Probe.objects.filter(effect=effect, answer="unknown").count() == 1
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"
    assert not Receipt.objects.filter(effect=effect).exists()


def test_a_provider_reply_with_a_duplicate_key_is_not_json_to_the_probe(api, project, server):
    effect = timed_out(api)
    reconciler(project, server)
    body = b'{"id": "re_1", "status": "canceled", "status": "succeeded", "created": 1700000000}'
    server.reply("/refunds/refund%3A1", Reply(200, body))
    probe = ask(effect)
    assert probe.answer == "unknown" and "duplicate key 'status'" in probe.detail
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"


def test_a_plugin_answering_a_time_out_of_range_is_an_unknown_answer(api, scripted, monkeypatch):
    effect = timed_out(api)
    far = datetime(9999, 12, 31, tzinfo=UTC)
    monkeypatch.setattr(scripted, "answer", Found("ledger", "L-1", observed_at=far))
    probe = ask(effect)
    assert probe.answer == "unknown" and "observed_at" in probe.detail
    assert Effect.objects.get(pk=effect.pk).state == "timed_out"
    assert not Receipt.objects.exists()
