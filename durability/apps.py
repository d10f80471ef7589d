from __future__ import annotations

from django.apps import AppConfig


class DurabilityConfig(AppConfig):
    name = "durability"
    verbose_name = "Effect ledger"
