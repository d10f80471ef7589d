"""No secret survives any entrance: each known pattern (and a project's own) is sent in
every field of the ledger's four POSTs, the events API, OTLP/JSON, a signed generic webhook
and a GitHub push (their delivery ids too); afterwards a `pg_dump` of the database holds
none of them, and neither does any API answer, desk, settings or authority page, or Django
admin page of effects, receipts and deliveries."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from durability.api.webhooks import signature_of
from durability.authority.webhook_sources import webhook_source_create
from durability.models import (
    ApiKey,
    Case,
    Effect,
    Project,
    Receipt,
    WebhookDelivery,
    WebhookKind,
)
from tests.api.support import github_source
from tests.conftest import Api
from tests.desk.support import logged_in
from tests.ledger import support as ledger
from tests.trajectories.support import NOW, TRACE
from trajectories.models import Run

# (the text sent, the part of it that must not be stored): a label such as "Bearer " or
# "password=" stays, the secret after it goes.
SECRETS = {
    "openai": ("sk-proj-" + "Zq7Xw2" * 6, None),
    "github": ("ghp_" + "Hh3Jk9" * 6, None),
    "github_pat": ("github_pat_" + "11AbCdEfGh" * 3, None),
    "aws": ("AKIA" + "QWERTYUIOPASDFGH", None),
    "slack": ("xoxb-" + "8675309-" + "SlAcKtOkEn" * 2, None),
    "google": ("AIza" + "SyD-" + "GoOgLeKeY0" * 3 + "x", None),
    "tallybook": ("tb_" + "TaLlYbOoK_" * 3, None),
    "bearer": ("Bearer " + "BeArErVaLuE" * 3, "BeArErVaLuE" * 3),
    "password": ("password=" + "PaSsWoRdVaLuE" * 2, "PaSsWoRdVaLuE" * 2),
    "project": ("cust-" + "862451", None),
}
PROJECT_PATTERN = r"cust-[0-9]{6}"
SPAN, CHILD = "5" * 16, "6" * 16


def _otlp(secret: str) -> dict[str, Any]:
    """An OTLP/JSON request with the secret in the resource, the names, every attribute the
    semantic conventions map, free attributes, the status message and a span event."""

    def attributes(pairs: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": k, "value": {"stringValue": v}} for k, v in pairs.items()]

    mapped = {
        "tallybook.run.id": f"run:{secret}",
        "gen_ai.operation.name": f"execute_tool {secret}",
        "gen_ai.provider.name": f"openai {secret}",
        "gen_ai.request.model": f"gpt {secret}",
        "gen_ai.response.model": f"gpt {secret}",
        "gen_ai.tool.name": f"refund {secret}",
        "gen_ai.tool.call.id": f"call:{secret}",
        "gen_ai.tool.call.arguments": json.dumps({"note": secret, f"k:{secret}": secret}),
        "gen_ai.tool.call.result": f"done {secret}",
        f"custom.{secret}": secret,
        "http.request.header.authorization": secret,
    }
    model = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": secret}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "tool_calls": [{"id": f"call:{secret}", "name": secret}]}]
        ),
    }
    start = NOW
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": attributes({"service.name": f"agent {secret}"})},
                "scopeSpans": [
                    {
                        "scope": {"name": f"scope {secret}"},
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": SPAN,
                                "name": f"chat {secret}",
                                "startTimeUnixNano": str(start),
                                "endTimeUnixNano": str(start + 10**6),
                                "attributes": attributes(model),
                            },
                            {
                                "traceId": TRACE,
                                "spanId": CHILD,
                                "parentSpanId": SPAN,
                                "name": f"tool {secret}",
                                "startTimeUnixNano": str(start + 2 * 10**6),
                                "endTimeUnixNano": str(start + 3 * 10**6),
                                "attributes": attributes(mapped),
                                "status": {"code": 2, "message": f"failed: {secret}"},
                                "events": [
                                    {
                                        "name": f"retry {secret}",
                                        "timeUnixNano": str(start + 2 * 10**6),
                                        "attributes": attributes({"why": secret}),
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        ]
    }


def _events(secret: str) -> dict[str, Any]:
    other_trace = "7" * 32
    return {
        "events": [
            {
                "id": f"run-event:{secret}",
                "type": "run",
                "run_id": f"run2:{secret}",
                "agent": f"agent {secret}",
                "workflow": f"refunds {secret}",
                "workflow_version": f"v1 {secret}",
                "conversation_id": f"conv:{secret}",
                "trace_ids": [other_trace],
                "attributes": {"note": secret, f"k:{secret}": 1},
            },
            {
                "id": f"span-event:{secret}",
                "type": "span",
                "run_id": f"run2:{secret}",
                "trace_id": other_trace,
                "span_id": "8" * 16,
                "kind": "tool",
                "name": f"charge {secret}",
                "start": "2026-11-30T10:00:00Z",
                "status": "error",
                "status_message": f"declined {secret}",
                "provider": f"stripe {secret}",
                "request_model": f"m {secret}",
                "response_model": f"m {secret}",
                "tool_call_id": f"call2:{secret}",
                "tool_name": f"charge {secret}",
                "attributes": {"note": secret, f"k:{secret}": secret},
                "input": {"card": secret, f"k:{secret}": [secret]},
                "output": f"result {secret}",
            },
        ]
    }


def _ledger(api: Api, project: Project, secret: str) -> list[Any]:
    """Every field of the ledger's four POSTs, through each path: a new effect and its
    receipt, a conflict, a client fingerprint, a timeout, a failure, an orphan receipt."""
    grant = ledger.everything(project).pk
    texts = {"note": secret, f"k:{secret}": secret, "nested": [{"auth": secret}]}
    intent = {
        "kind": f"charge {secret}"[:100],
        "target": f"stripe:{secret}",
        "request": texts,
        "run_id": f"run:{secret}",
        "tool_call_id": f"call:{secret}",
        "worker": f"worker:{secret}",
        "context": {
            "workflow": f"refunds {secret}",
            "workflow_version": f"v {secret}",
            "model": f"gpt {secret}",
            "code_version": f"c {secret}",
            "tools": {"refund": secret},
            "memory_digest": f"m {secret}",
            "policy_version": f"p {secret}",
            f"extra:{secret}": secret,
        },
        "authority": {"grant": grant, "approved_by": secret, f"k:{secret}": secret},
        "timeout_s": 60,
    }
    receipt = {
        "system": f"stripe {secret}"[:100],
        "external_id": f"re:{secret}",
        "data": texts,
        "target": f"stripe:{secret}",
    }
    return [
        api.post("intents", {"key": f"pay:{secret}", **intent}),
        api.post("receipts", {"key": f"pay:{secret}", **receipt}),
        api.post("intents", {"key": f"pay:{secret}", **intent, "request": {"other": secret}}),
        api.post("intents", {"key": f"fp:{secret}", **intent, "fingerprint": f"fp:{secret}"}),
        api.post("intents", {"key": f"late:{secret}", **intent}),
        api.post("timeouts", {"key": f"late:{secret}", "reason": f"no answer: {secret}"}),
        api.post("intents", {"key": f"fail:{secret}", **intent}),
        api.post("failures", {"key": f"fail:{secret}", "error": f"HTTP 502 {secret}"}),
        api.post("receipts", {"key": f"orphan:{secret}", **receipt}),
    ]


def _hooks(client: Client, project: Project, secret: str) -> list[Any]:
    """A signed generic delivery and a GitHub push, the secret in every field they map."""
    generic = webhook_source_create(
        project=project,
        actor="user:ada",
        name="alpha-pay",
        kind=WebhookKind.GENERIC,
        system="payments",
        mapping={"key": "key", "external_id": "id", "target": "target"},
        tolerance_s=300,
    )
    github = github_source(project)
    body = json.dumps(
        {"key": f"hook:{secret}", "id": f"evt:{secret}", "target": f"t:{secret}", "x": secret}
    ).encode()
    stamp = str(int(time.time()))
    sent = [
        client.post(
            f"/hooks/{generic.name}/",
            data=body,
            content_type="application/json",
            headers={
                "X-Tallybook-Signature": signature_of(generic.secret, body, stamp),
                "X-Tallybook-Timestamp": stamp,
                "X-Tallybook-Delivery": f"delivery:{secret}",
            },
        )
    ]
    push = json.dumps(
        {
            "ref": f"refs/heads/{secret}",
            "repository": {"full_name": f"acme/{secret}"},
            "commits": [
                {
                    "id": f"sha:{secret}",
                    "message": f"Fix {secret}\n\nTallybook-Key: push:{secret}\n",
                    "timestamp": "2026-11-30T10:00:00+02:00",
                    "url": f"https://github.com/acme/shop/commit/{secret}",
                }
            ],
        }
    ).encode()
    sent.append(
        client.post(
            f"/hooks/{github.name}/",
            data=push,
            content_type="application/json",
            headers={
                "X-GitHub-Event": "push",
                "X-GitHub-Delivery": f"gh-delivery:{secret}",
                "X-Hub-Signature-256": signature_of(github.secret, push),
            },
        )
    )
    return sent


def _pg_dump() -> str:
    settings = connection.settings_dict
    command = ["pg_dump", "--data-only", "--no-owner", settings["NAME"]]
    for option, name in (("--host", "HOST"), ("--port", "PORT"), ("--username", "USER")):
        if settings.get(name):
            command[1:1] = [option, str(settings[name])]
    env = {**os.environ, "PGPASSWORD": settings.get("PASSWORD") or ""}
    return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout


@pytest.mark.parametrize("name", SECRETS)
@pytest.mark.django_db(transaction=True)
def test_no_entrance_stores_or_shows_a_secret(name, client, project, api_key, alice, admin):
    sent, kept_out = SECRETS[name]
    kept_out = kept_out or sent
    project.redaction_patterns = [PROJECT_PATTERN]
    project.save()
    api = Api(client, api_key)
    answers = _ledger(api, project, sent)
    answers.append(api.post("events", _events(sent)))
    answers.append(
        client.post(
            "/v1/traces",
            data=json.dumps(_otlp(sent)),
            content_type="application/json",
            headers={"Authorization": f"Bearer {api_key}"},
        )
    )
    answers += _hooks(client, project, sent)
    assert [r.status_code for r in answers] == [201, 201, 409, 201, 201, 200, 201, 200] + [
        201,
        207,
        200,
        201,
        201,
    ]
    assert Receipt.objects.filter(project=project, strength="provider_confirmed").count() == 2
    assert WebhookDelivery.objects.filter(source__project=project).count() == 2
    assert Run.objects.filter(project=project).count() == 2
    for response in answers:
        assert kept_out not in response.content.decode(), response.content.decode()

    dump = _pg_dump()
    assert ApiKey.objects.get(project=project).prefix in dump  # the dump holds the data
    assert kept_out not in dump

    operator = logged_in(alice)
    pages = ["/", "/queue/", "/effects/", "/audit/", "/runs/"]
    pages += [f"/effects/{pk}/" for pk in Effect.objects.values_list("pk", flat=True)]
    pages += [f"/cases/{pk}/" for pk in Case.objects.values_list("pk", flat=True)]
    pages += [f"/runs/{pk}/" for pk in Run.objects.values_list("pk", flat=True)]
    for path in pages:
        page = operator.get(path)
        assert page.status_code == 200, path
        assert kept_out not in page.content.decode(), path
    # The project's admin: settings and the authority room (grants, webhook sources).
    project_admin = logged_in(admin)
    for path in ["/settings/", "/authority/", "/authority/webhooks/", "/authority/audit/"]:
        page = project_admin.get(path)
        assert page.status_code == 200, path
        assert kept_out not in page.content.decode(), path
    # The Django admin's lists and pages of effects, receipts and webhook deliveries.
    staff = logged_in(User.objects.create_superuser("root-of-admin", password="x"))
    for model in (Effect, Receipt, WebhookDelivery):
        where = f"/admin/durability/{model._meta.model_name}/"
        paths = [where] + [
            f"{where}{pk}/change/" for pk in model.objects.values_list("pk", flat=True)
        ]
        for path in paths:
            page = staff.get(path)
            assert page.status_code == 200, path
            assert kept_out not in page.content.decode(), path
    for pk in Effect.objects.values_list("pk", flat=True):
        detail = api.get(f"effects/{pk}")
        assert detail.status_code == 200 and kept_out not in detail.content.decode()
    found = api.get("effects", key=f"pay:{sent}")
    assert found.status_code == 200 and kept_out not in found.content.decode()
