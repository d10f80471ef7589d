"""A new instance built by `durability.rows.new` is the one `Model(**values)` builds: each
field the value given or its default, a relation given by its object cached and keyed, `pk`
by its name; an unknown keyword refused. A time written by `durability.rows.Writes` is
stored as `save()` stores it: an aware one as it is, a naive one made aware (with Django's
warning)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import models, transaction
from django.utils import timezone

from durability import rows
from durability.models import Attempt, AuditEntry, Effect, Project, Receipt, State, Strength
from tests.ledger import support as ledger

pytestmark = pytest.mark.django_db

# Set to now() by a default: they differ by the moment each instance was built.
STAMPED = {"created", "updated", "received", "started", "at"}


def _alike[M: models.Model](model: type[M], **values: Any) -> M:
    built, expected = rows.new(model, **values), model(**values)
    assert type(built) is model
    assert vars(built._state) == vars(expected._state)
    fields = {k: v for k, v in vars(built).items() if k != "_state" and k not in STAMPED}
    wanted = {k: v for k, v in vars(expected).items() if k != "_state" and k not in STAMPED}
    assert fields == wanted
    assert set(vars(built)) == set(vars(expected))
    return built


def test_new_rows_are_built_as_their_models_build_them(project: Project) -> None:
    effect = _alike(
        Effect,
        pk=41,
        project=project,
        key="pay-1",
        kind="payment",
        target="stripe",
        fingerprint="f" * 64,
        claim="c" * 64,
        request={"amount": 1250},
        timeout_s=300,
        authority={"grant": None},
        grant=None,
        amount=Decimal("12.50"),
        currency="EUR",
    )
    assert effect.pk == 41 and effect.project is project and effect._state.adding
    _alike(
        Attempt,
        project_id=project.pk,
        effect=effect,
        number=1,
        started=timezone.now(),
        deadline=None,
        context={"workflow": "w"},
    )
    _alike(
        Receipt,
        project=project,
        effect=None,
        key="pay-1",
        system="stripe",
        external_id="re_1",
        data={"ok": True},
        strength=Strength.PROVIDER_CONFIRMED,
        attempt=None,
    )
    _alike(
        AuditEntry,
        project_id=project.pk,
        actor="api:test",
        action="intent",
        effect=effect,
        case=None,
        to_state="pending",
        data={"attempt": 1},
    )


def test_a_new_row_refuses_a_field_its_model_does_not_have(project: Project) -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        rows.new(Effect, project=project, key="k", colour="blue")


def test_times_written_are_stored_as_save_stores_them(project: Project) -> None:
    effect = ledger.effect_in(project, State.PENDING)
    aware = datetime(2026, 12, 7, 18, 0, 0, 123456, tzinfo=UTC) + timedelta(days=1)
    effect.deadline = aware
    with transaction.atomic():
        writes = rows.Writes()
        writes.stage(effect, "deadline")
        writes.send()
    assert Effect.objects.get(pk=effect.pk).deadline == aware

    effect.deadline = aware.replace(tzinfo=None)  # naive: read in the default zone (UTC)
    with pytest.warns(RuntimeWarning, match="naive datetime"), transaction.atomic():
        writes = rows.Writes()
        writes.stage(effect, "deadline")
        writes.send()
    assert Effect.objects.get(pk=effect.pk).deadline == aware
