from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from durability.ledger import evidence


class Command(BaseCommand):
    help = "Time out pending effects past their deadline (one sweep, or every N seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=float, default=0, help="Repeat every N seconds until interrupted"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            moved = evidence.deadlines_sweep()
            for effect in moved:
                self.stdout.write(f"timed out: {effect.key} (effect {effect.pk})")
            if not options["every"]:
                self.stdout.write(f"Swept: {len(moved)} effect(s) timed out.")
                return
            time.sleep(options["every"])
