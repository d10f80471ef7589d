"""Every moment on a page is shown one way ({% when %}, durability/templatetags/times.py), in
the operator's time zone: the one they chose, else their browser's (the tallybook_tz cookie),
else UTC; the exact moment on hover, the instant in UTC for machines."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.template import Context, Template
from django.utils import timezone

from durability.accounts.timezones import COOKIE, distance
from durability.models import Preference
from durability.templatetags.times import when_html

MOMENT = datetime(2026, 12, 1, 6, 49, 6, 123456, tzinfo=UTC)
NBSP = "\u00a0"


@pytest.fixture
def berlin():
    with timezone.override(ZoneInfo("Europe/Berlin")):
        yield


def test_a_moment_is_shown_to_the_minute_in_the_current_zone(berlin):
    html = when_html(MOMENT, now=MOMENT)
    assert re.fullmatch(r'<time datetime="[^"]+" title="[^"]+">2026-12-01 07:49</time>', html)


def test_seconds_are_shown_where_they_matter(berlin):
    assert ">2026-12-01 07:49:06</time>" in when_html(MOMENT, now=MOMENT, seconds=True)


def test_the_datetime_attribute_is_the_instant_in_utc(berlin):
    assert 'datetime="2026-12-01T06:49:06.123456Z"' in when_html(MOMENT, now=MOMENT)


def test_the_hover_gives_the_exact_local_time_with_its_zone_and_offset(berlin):
    assert 'title="2026-12-01 07:49:06.123 CET (UTC+01:00)"' in when_html(MOMENT, now=MOMENT)
    summer = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    assert 'title="2026-07-01 14:00:00.000 CEST (UTC+02:00)"' in when_html(summer, now=summer)


def test_without_a_zone_chosen_moments_are_in_utc_and_say_so():
    with timezone.override(UTC):
        html = when_html(MOMENT, now=MOMENT)
    assert 'title="2026-12-01 06:49:06.123 UTC"' in html and ">2026-12-01 06:49</time>" in html


def test_a_zone_west_of_utc_can_move_the_date_back():
    with timezone.override(ZoneInfo("America/Los_Angeles")):
        html = when_html(MOMENT, now=MOMENT, seconds=True)
    assert ">2026-11-30 22:49:06</time>" in html and "PST (UTC-08:00)" in html


@pytest.mark.parametrize(
    ("ago", "words"),
    [
        (timedelta(0), "just now"),
        (timedelta(seconds=9), "just now"),
        (timedelta(seconds=12), f"12{NBSP}s ago"),
        (timedelta(minutes=1, seconds=59), f"1{NBSP}min ago"),
        (timedelta(minutes=59), f"59{NBSP}min ago"),
        (timedelta(hours=3), f"3{NBSP}h ago"),
        (timedelta(hours=3, minutes=20), f"3{NBSP}h 20{NBSP}min ago"),
        (timedelta(hours=30, minutes=20), f"30{NBSP}h ago"),
        (timedelta(days=3, hours=5), f"3{NBSP}d ago"),
        (-timedelta(minutes=5), f"in 5{NBSP}min"),
    ],
)
def test_a_distance_is_said_in_words_never_zero_minutes_ago(ago, words):
    assert distance(MOMENT - ago, now=MOMENT) == words


def test_a_relative_moment_keeps_the_exact_time_on_hover(berlin):
    html = when_html(MOMENT - timedelta(seconds=12), now=MOMENT, relative=True)
    assert html.endswith(f">12{NBSP}s ago</time>") and 'title="2026-12-01 07:48:54.123 CET' in html


def test_a_missing_moment_shows_its_default_and_plain_gives_the_text_alone(berlin):
    assert when_html(None, now=MOMENT) == "—"
    assert when_html(None, now=MOMENT, default="never") == "never"
    assert when_html(MOMENT, now=MOMENT, plain=True) == "2026-12-01 07:49"


def test_the_tag_escapes_its_default_and_renders_in_a_template(berlin):
    template = Template("{% load times %}{% when a %} | {% when b default=d %}")
    html = template.render(Context({"a": MOMENT, "b": None, "d": "<none>"}))
    assert html.startswith('<time datetime="2026-12-01T06:49:06.123456Z"')
    assert html.endswith(" | &lt;none&gt;")


# -- the operator's time zone ----------------------------------------------------------------


def _shown_zone(client) -> str:
    page = client.get("/effects/").content.decode()
    found = re.search(r'<a class="zone"[^>]*>([^<]+)</a>', page)
    assert found is not None
    return found[1]


def test_pages_are_in_utc_until_a_zone_is_known(client, alice):
    client.force_login(alice)
    assert _shown_zone(client) == "UTC"


def test_the_browsers_zone_from_its_cookie_is_used(client, alice):
    client.force_login(alice)
    client.cookies[COOKIE] = "Asia/Tokyo"
    assert _shown_zone(client) == "Asia/Tokyo"


@pytest.mark.parametrize("bad", ["Mars/Olympus_Mons", "../../etc/passwd", "", "UTC; x=1"])
def test_a_cookie_naming_no_zone_is_ignored(client, alice, bad):
    client.force_login(alice)
    client.cookies[COOKIE] = bad
    assert _shown_zone(client) == "UTC"


def test_the_operators_choice_wins_over_the_browsers(client, alice):
    client.force_login(alice)
    client.cookies[COOKIE] = "Asia/Tokyo"
    r = client.post("/settings/time-zone/", {"time_zone": "America/New_York"})
    assert r.status_code == 302 and r["Location"] == "/settings/notifications/"
    assert Preference.objects.get(user=alice).time_zone == "America/New_York"
    assert _shown_zone(client) == "America/New_York"


def test_the_choice_follows_the_operator_to_their_next_login(client, alice):
    Preference.objects.create(user=alice, time_zone="Australia/Sydney")
    client.force_login(alice)
    assert _shown_zone(client) == "Australia/Sydney"


def test_choosing_the_browsers_zone_again_drops_the_choice(client, alice):
    client.force_login(alice)
    client.post("/settings/time-zone/", {"time_zone": "America/New_York"})
    client.cookies[COOKIE] = "Asia/Tokyo"
    assert client.post("/settings/time-zone/", {"time_zone": ""}).status_code == 302
    assert Preference.objects.get(user=alice).time_zone == ""
    assert _shown_zone(client) == "Asia/Tokyo"


def test_a_zone_that_does_not_exist_is_refused_on_its_field(client, alice):
    client.force_login(alice)
    r = client.post("/settings/time-zone/", {"time_zone": "Mars/Olympus_Mons"})
    assert r.status_code == 400
    assert r.context["zone_form"].errors == {
        "time_zone": ["Mars/Olympus_Mons is not a time zone of the zoneinfo database."]
    }
    assert not Preference.objects.filter(user=alice).exists()


def test_the_time_zone_form_is_on_the_notifications_page(client, alice):
    client.force_login(alice)
    client.cookies[COOKIE] = "Asia/Tokyo"
    page = client.get("/settings/notifications/").content.decode()
    assert 'action="/settings/time-zone/"' in page and "<strong>Asia/Tokyo</strong>" in page
    assert '<option value="Europe/Berlin">' in page


def test_a_page_shows_its_moments_in_the_operators_zone(client, alice, project):
    from tests.ledger.support import intent

    effect = intent(project, "refund:1").effect
    client.force_login(alice)
    client.post("/settings/time-zone/", {"time_zone": "Asia/Kolkata"})
    page = client.get(f"/effects/{effect.pk}/").content.decode()
    local = timezone.localtime(effect.created, ZoneInfo("Asia/Kolkata"))
    assert f">{local:%Y-%m-%d %H:%M:%S}</time>" in page
    assert "IST (UTC+05:30)" in page


def test_csv_exports_keep_iso_8601_utc(client, alice, project):
    from tests.ledger.support import intent

    effect = intent(project, "refund:1").effect
    client.force_login(alice)
    client.post("/settings/time-zone/", {"time_zone": "Asia/Kolkata"})
    r = client.get("/authority/audit.csv")
    body = b"".join(r.streaming_content).decode()
    assert effect.created.astimezone(UTC).isoformat() in body
