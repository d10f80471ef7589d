"""The desk's background jobs: alerts and emails for overdue cases, bulk actions on cases."""

from __future__ import annotations

from durability.desk import alerts, case_actions, notifications


def alert() -> int:
    """Post the overdue cases to the alert webhook, each once; returns how many were sent."""
    return len(alerts.alerts_send())


def overdue_notify() -> int:
    """Email each overdue case's assignee, once per case (scheduled); returns how many."""
    return notifications.overdue_announce()


def cases_bulk(bulk_id: int) -> int:
    """Carry out a bulk action on cases; a second run resumes where the first stopped."""
    return case_actions.bulk_run(bulk_id=bulk_id).done


def bulks_resume() -> int:
    """Carry on the bulk actions whose job was lost (scheduled); returns how many."""
    stalled = case_actions.bulks_stalled()
    for bulk_id in stalled:
        case_actions.bulk_run(bulk_id=bulk_id)
    return len(stalled)
