"""What the API asks of other apps, so that it imports none of them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent for the API's effect detail with `effect`; each receiver returns a dict of extra
# fields (trajectories returns the effect's run, tool call and model spans).
effect_detail = Signal()
