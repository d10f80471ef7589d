from __future__ import annotations

from django.apps import AppConfig


class TrajectoriesConfig(AppConfig):
    name = "trajectories"
    verbose_name = "Trajectories"

    def ready(self) -> None:
        # The ledger and the API announce; trajectories listens, so neither imports it.
        from durability.api.signals import effect_detail
        from durability.ledger.signals import effect_recorded
        from trajectories import jobs, links

        effect_recorded.connect(jobs.effect_recorded, dispatch_uid="trajectories_link")
        effect_detail.connect(links.effect_trajectory, dispatch_uid="trajectories_detail")
