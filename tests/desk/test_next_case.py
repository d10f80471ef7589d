"""Settle-and-next and skip: from a case, the next open case of the filtered queue it was
opened from, in that queue's order; after the last, the queue itself."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

import pytest
from django.utils import timezone

from durability.models import Case, Severity
from tests.desk.support import logged_in, uncertain_case

STRIPE = quote("target=stripe", safe="")


@pytest.fixture
def cases(project, alice):
    """Three stripe cases and one on another target, opened an hour apart, oldest first."""
    found = [uncertain_case(project, f"refund:{n}") for n in (1, 2)]
    found.append(uncertain_case(project, "deploy:1", target="k8s"))
    found.append(uncertain_case(project, "refund:3"))
    for n, case in enumerate(found):
        Case.objects.filter(pk=case.pk).update(opened=timezone.now() - timedelta(hours=9 - n))
    return found


def test_skip_goes_to_the_next_case_of_the_filtered_queue_in_its_order(alice, cases):
    first, second, deploy, third = cases
    desk = logged_in(alice)
    r = desk.get(f"/cases/{first.pk}/next/?from={STRIPE}")
    assert r.status_code == 302 and r["Location"] == f"/cases/{second.pk}/?from={STRIPE}"
    # The deploy case is not in this queue.
    assert desk.get(f"/cases/{second.pk}/next/?from={STRIPE}")["Location"] == (
        f"/cases/{third.pk}/?from={STRIPE}"
    )
    # Without a filter: the whole queue.
    assert desk.get(f"/cases/{second.pk}/next/")["Location"] == f"/cases/{deploy.pk}/"


def test_after_the_last_case_skip_leads_back_to_the_queue_and_says_so(alice, cases):
    desk = logged_in(alice)
    r = desk.get(f"/cases/{cases[-1].pk}/next/?from={STRIPE}", follow=True)
    assert r.redirect_chain == [("/queue/?target=stripe", 302)]
    assert "That was the last open case of this queue." in r.content.decode()


def test_the_next_case_follows_the_queues_sort(alice, cases):
    first, second, deploy, third = cases
    Case.objects.filter(pk=third.pk).update(severity=Severity.CRITICAL)
    by_severity = quote("sort=severity", safe="")
    desk = logged_in(alice)
    r = desk.get(f"/cases/{third.pk}/next/?from={by_severity}")
    assert r["Location"] == f"/cases/{first.pk}/?from={by_severity}"


def test_a_verdict_then_next_settles_the_case_and_goes_on(alice, cases):
    first, second, _, _ = cases
    r = logged_in(alice).post(
        f"/cases/{first.pk}/resolve/?from={STRIPE}",
        {"verdict": "not_happened", "version": first.version, "note": "not there", "then": "next"},
    )
    assert r.status_code == 302 and r["Location"] == f"/cases/{second.pk}/?from={STRIPE}"
    assert Case.objects.get(pk=first.pk).closed is not None


def test_a_refused_verdict_stays_on_its_case_even_with_then_next(alice, cases):
    first = cases[0]
    r = logged_in(alice).post(
        f"/cases/{first.pk}/resolve/?from={STRIPE}",
        {"verdict": "not_happened", "version": first.version + 5, "note": "x", "then": "next"},
    )
    assert r.status_code == 303 and r["Location"] == f"/cases/{first.pk}/?from={STRIPE}"


def test_then_is_validated(alice, cases):
    first = cases[0]
    r = logged_in(alice).post(
        f"/cases/{first.pk}/resolve/",
        {"verdict": "not_happened", "version": first.version, "note": "x", "then": "elsewhere"},
    )
    assert r.status_code == 400
    assert "Select a valid choice. elsewhere is not one of the available choices." in (
        r.content.decode()
    )
    assert Case.objects.get(pk=first.pk).closed is None


def test_skip_finds_only_cases_of_the_users_projects(outsider, cases):
    assert logged_in(outsider).get(f"/cases/{cases[0].pk}/next/").status_code == 404
