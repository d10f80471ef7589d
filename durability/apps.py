from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DurabilityConfig(AppConfig):
    name = "durability"
    verbose_name = "Effect ledger"

    def ready(self) -> None:
        from durability.roles import groups_sync

        post_migrate.connect(groups_sync, sender=self, dispatch_uid="durability_groups_sync")
