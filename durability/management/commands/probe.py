from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durability.models import Probe
from durability.reconcilers import reconciling

ACTOR = "system:probe-command"


class Command(BaseCommand):
    help = (
        "Probe timed-out effects with their targets' reconcilers, here and now: every effect "
        "the schedule would probe (once, or every N seconds), or one effect."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--effect", type=int, help="Probe this effect (by id) only")
        parser.add_argument(
            "--every", type=float, default=0, help="Repeat every N seconds until interrupted"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["effect"] is not None:
            probe = reconciling.effect_probe(effect_id=options["effect"], requested_by=ACTOR)
            if probe is None:
                raise CommandError(
                    f"Effect {options['effect']} is not timed out or its target has no "
                    "enabled reconciler: nothing to probe."
                )
            self._report(probe)
            return
        while True:
            probes = []
            for effect_id in reconciling.probes_due():
                probe = reconciling.effect_probe(effect_id=effect_id, requested_by=ACTOR)
                if probe is not None:
                    self._report(probe)
                    probes.append(probe)
            if not options["every"]:
                settled = sum(1 for p in probes if p.settled)
                self.stdout.write(f"Probed {len(probes)} effect(s); {settled} settled.")
                return
            time.sleep(options["every"])

    def _report(self, probe: Probe) -> None:
        effect = probe.effect
        settled = f" -> {probe.settled}" if probe.settled else ""
        self.stdout.write(
            f"{effect.key} (effect {effect.pk}, attempt {probe.attempt}): {probe.kind} "
            f"{probe.answer}{settled}: {probe.detail}"
        )
