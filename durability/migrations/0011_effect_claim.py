"""Effect.claim: the digest of the authority an intent claimed, filled in for recorded effects.

Effects recorded before it were never redacted, so their columns are the claim as it was
sent, and the digest computed from them is the one a repeat of that intent computes.
"""

import hashlib
import json
from decimal import Decimal

from django.db import migrations, models


def _digest(value):
    # Frozen copy of ledger.intents.fingerprint_of over ledger.authority.claim_recorded: a
    # migration must give the same rows whatever the ledger's code becomes.
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _money(value: Decimal, currency: str) -> str:
    return f"{value.normalize():f} {currency}"


def claims_fill(apps, schema_editor):
    Effect = apps.get_model("durability", "Effect")
    batch = []
    rows = Effect.objects.filter(claim="").only("kind", "target", "authority", "amount", "currency")
    for effect in rows.iterator(chunk_size=2000):
        effect.claim = _digest(
            {
                "kind": effect.kind,
                "target": effect.target,
                "authority": effect.authority,
                "amount": None if effect.amount is None else _money(effect.amount, effect.currency),
            }
        )
        batch.append(effect)
        if len(batch) == 2000:
            Effect.objects.bulk_update(batch, ["claim"])
            batch = []
    Effect.objects.bulk_update(batch, ["claim"])


class Migration(migrations.Migration):
    dependencies = [
        ("durability", "0010_audit_actions"),
    ]

    operations = [
        migrations.AddField(
            model_name="effect",
            name="claim",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.RunPython(claims_fill, migrations.RunPython.noop),
    ]
