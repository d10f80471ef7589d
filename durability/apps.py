from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class DurabilityConfig(AppConfig):
    name = "durability"
    verbose_name = "Effect ledger"

    def ready(self) -> None:
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_logged_in
        from django.core import checks

        from durability.accounts.lockouts import on_user_locked_out
        from durability.accounts.roles import groups_sync
        from durability.accounts.timezones import on_user_logged_in
        from durability.audit import sqlite_triggers_ensure
        from durability.site import deploy_checks

        checks.register(deploy_checks, checks.Tags.security, deploy=True)
        post_migrate.connect(groups_sync, sender=self, dispatch_uid="durability_groups_sync")
        post_migrate.connect(
            sqlite_triggers_ensure, sender=self, dispatch_uid="durability_sqlite_triggers"
        )
        user_locked_out.connect(on_user_locked_out, dispatch_uid="durability_login_locked_out")
        user_logged_in.connect(on_user_logged_in, dispatch_uid="durability_time_zone_remember")
