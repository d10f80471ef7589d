"""Guessed passwords: a username is locked at an address after too many failed logins from
there, and everywhere only after many more spread over any addresses; the lockout is
audited, ends after its cool-off, and an admin can lift it."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from durability.audit import first_broken_entry
from durability.models import AuditEntry, Membership, Project, Role
from tests.desk.support import logged_in, member

LIMIT = settings.AXES_FAILURE_LIMIT
# The limit over all addresses, for the tests of it: twice the limit at one address, where the
# default is 100 (LOGIN_USER_FAILURE_LIMIT, read at each login): the same rule, reached in a
# fifth of the logins (each a request through the login form, which these tests are about).
USER_LIMIT = 2 * LIMIT
WRONG = "not-the-password-123"


def _log_in(client: Client, username: str, password: str, address: str = "10.0.0.1", **extra):
    return client.post(
        "/login/", {"username": username, "password": password}, REMOTE_ADDR=address, **extra
    )


def _fail(username: str, times: int, address: str = "10.0.0.1") -> None:
    client = Client()
    for _ in range(times):
        _log_in(client, username, WRONG, address)


def _logged_in(response) -> bool:
    return response.status_code == 302 and response.wsgi_request.user.is_authenticated


@pytest.fixture
def beta(alice) -> Project:
    """A second project alice is a member of."""
    project = Project.objects.create(name="beta")
    Membership.objects.create(project=project, user=alice, role=Role.VIEWER)
    return project


def test_a_wrong_password_is_answered_by_the_login_page_until_the_limit(alice):
    client = Client()
    answers = [_log_in(client, "alice", WRONG).status_code for _ in range(LIMIT)]
    assert answers == [200] * (LIMIT - 1) + [429]


def test_130_wrong_passwords_then_the_right_one_is_refused(alice):
    client = Client()
    answers = [_log_in(client, "alice", WRONG) for _ in range(130)]
    assert {r.status_code for r in answers[LIMIT - 1 :]} == {429}
    right = _log_in(client, "alice", "password")
    assert right.status_code == 429
    assert not right.wsgi_request.user.is_authenticated
    assert "_auth_user_id" not in client.session
    page = right.content.decode()
    assert "Login locked" in page and "alice" in page and "unlock" in page
    assert 'href="/login/"' in page  # the site's own page, not a bare 403 text


def test_attempts_refused_during_a_lockout_are_not_counted(alice):
    _fail("alice", 130)
    failures = AccessAttempt.objects.filter(username="alice").values_list(
        "failures_since_start", flat=True
    )
    assert list(failures) == [LIMIT]


def test_guesses_from_one_address_lock_the_user_out_there_only(alice):
    _fail("alice", LIMIT, address="203.0.113.9")
    assert _log_in(Client(), "alice", "password", address="203.0.113.9").status_code == 429
    assert _logged_in(_log_in(Client(), "alice", "password", address="198.51.100.7"))


@pytest.fixture
def user_limit(settings) -> int:
    settings.LOGIN_USER_FAILURE_LIMIT = USER_LIMIT
    return USER_LIMIT


def test_guesses_spread_over_many_addresses_lock_the_user_everywhere_at_the_user_limit(
    alice, user_limit
):
    assert USER_LIMIT > LIMIT
    answers = [
        _log_in(Client(), "alice", WRONG, address=f"192.0.2.{n % 200 + 1}").status_code
        for n in range(USER_LIMIT)
    ]
    assert answers == [200] * (USER_LIMIT - 1) + [429]
    assert _log_in(Client(), "alice", "password", address="198.51.100.7").status_code == 429


def test_another_user_at_the_same_address_still_logs_in(alice, project):
    member(project, "bob", Role.OPERATOR)
    _fail("alice", LIMIT, address="10.0.0.1")
    assert _logged_in(_log_in(Client(), "bob", "password", address="10.0.0.1"))


def test_the_right_password_before_the_limit_logs_in_and_clears_the_count(alice):
    _fail("alice", LIMIT - 1)
    assert _logged_in(_log_in(Client(), "alice", "password"))
    _fail("alice", LIMIT - 1)
    assert _logged_in(_log_in(Client(), "alice", "password"))


def test_a_lockout_ends_after_its_cool_off(alice):
    _fail("alice", LIMIT)
    assert _log_in(Client(), "alice", "password").status_code == 429
    # As if the cool-off had passed since the last failure.
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert _logged_in(_log_in(Client(), "alice", "password"))


def test_the_admin_login_is_guarded_too(alice):
    alice.is_staff = True
    alice.save()
    client = Client()
    data = {"username": "alice", "password": WRONG, "next": "/admin/"}
    answers = [client.post("/admin/login/", data).status_code for _ in range(LIMIT)]
    assert answers[-1] == 429
    data["password"] = "password"
    assert client.post("/admin/login/", data).status_code == 429


def test_the_api_keys_are_not_affected_by_a_locked_user(alice, api):
    _fail("alice", LIMIT, address="127.0.0.1")
    assert api.intent("k1").status_code == 201


def test_a_lockout_is_audited_once_in_each_of_the_users_projects(alice, project, beta):
    _fail("alice", 130, address="203.0.113.9")
    for each in (project, beta):
        entries = AuditEntry.objects.filter(project=each, action="login_locked_out")
        assert [(e.actor, e.data) for e in entries] == [
            ("system:login", {"username": "alice", "address": "203.0.113.9", "failures": LIMIT})
        ]
        assert first_broken_entry(each) is None
    assert not AuditEntry.objects.filter(data__icontains=WRONG).exists()
    assert WRONG not in str(list(AccessAttempt.objects.values()))


def test_a_lockout_is_not_audited_in_a_project_being_deleted(alice, project, beta):
    # Marked with alice still a member, as one added just after the mark would be.
    Project.objects.filter(pk=beta.pk).update(deleting=timezone.now())
    _fail("alice", LIMIT)
    locked = AuditEntry.objects.filter(action="login_locked_out")
    assert list(locked.values_list("project_id", flat=True)) == [project.pk]


def test_a_locked_username_of_nobody_is_audited_nowhere(project):
    _fail("nobody", LIMIT)
    assert _log_in(Client(), "nobody", WRONG).status_code == 429
    assert not AuditEntry.objects.filter(action="login_locked_out").exists()


def test_behind_a_proxy_the_address_is_the_one_it_appended(alice, settings):
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    forged = {"HTTP_X_FORWARDED_FOR": "1.2.3.4, 203.0.113.5"}
    client = Client()
    for _ in range(LIMIT):
        _log_in(client, "alice", WRONG, address="10.9.9.9", **forged)
    entry = AuditEntry.objects.get(action="login_locked_out")
    assert entry.data["address"] == "203.0.113.5"


def test_a_client_that_reaches_django_directly_cannot_choose_its_address(alice, settings):
    # The attack: twelve guesses from twelve forged addresses were never locked out.
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    settings.TRUSTED_PROXIES = ["10.0.0.0/24"]
    client = Client()
    for n in range(LIMIT + 2):
        forged = {"HTTP_X_FORWARDED_FOR": f"198.51.100.{n}"}
        _log_in(client, "alice", WRONG, address="203.0.113.9", **forged)
    entry = AuditEntry.objects.get(action="login_locked_out")
    assert entry.data["address"] == "203.0.113.9"
    assert not _logged_in(_log_in(client, "alice", "password", address="203.0.113.9"))


def test_through_trusted_proxies_the_address_is_the_last_they_did_not_add(alice, settings):
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    settings.TRUSTED_PROXIES = ["10.0.0.0/24"]
    # The client forged 1.2.3.4; the edge proxy appended the client's address, the inner
    # proxy the edge's, and the connection is the inner proxy's.
    forged = {"HTTP_X_FORWARDED_FOR": "1.2.3.4, 203.0.113.5, 10.0.0.7"}
    client = Client()
    for _ in range(LIMIT):
        _log_in(client, "alice", WRONG, address="10.0.0.8", **forged)
    entry = AuditEntry.objects.get(action="login_locked_out")
    assert entry.data["address"] == "203.0.113.5"


def test_a_count_of_proxies_reads_that_many_addresses_from_the_end(alice, settings):
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    settings.TRUSTED_PROXY_HOPS = 2
    forged = {"HTTP_X_FORWARDED_FOR": "1.2.3.4, 203.0.113.5, 10.0.0.7"}
    client = Client()
    for _ in range(LIMIT):
        _log_in(client, "alice", WRONG, address="10.0.0.8", **forged)
    entry = AuditEntry.objects.get(action="login_locked_out")
    assert entry.data["address"] == "203.0.113.5"


@pytest.mark.parametrize(
    ("fields", "meta"),
    [
        ({"username": "a" * 5000}, {}),
        ({"username": "ali\x00ce"}, {}),
        ({"username": "alice", "next": "\x00" * 10}, {"HTTP_USER_AGENT": "x" * 5000}),
        ({"username": "alice"}, {"HTTP_X_FORWARDED_FOR": "not-an-address"}),
        ({"username": "alice"}, {"REMOTE_ADDR": ""}),
    ],
    ids=["long-username", "nul", "long-agent", "forged-address", "no-address"],
)
def test_odd_logins_are_refused_as_logins_never_a_server_error(alice, settings, fields, meta):
    settings.LOGIN_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    client = Client()
    data = {"password": WRONG, **fields}
    answers = {client.post("/login/", data, **meta).status_code for _ in range(LIMIT + 1)}
    assert answers <= {200, 429}


def test_the_audit_log_shows_the_lockout(alice, admin):
    _fail("alice", LIMIT)
    page = logged_in(admin).get("/audit/").content.decode()
    assert "login_locked_out" in page and "system:login" in page


def test_the_settings_page_shows_who_is_locked_and_an_admin_unlocks_them(
    alice, admin, project, beta
):
    _fail("alice", LIMIT)
    page = logged_in(admin).get("/settings/").content.decode()
    assert page.count("login locked") == 1 and page.count(">Unlock</button>") == 1
    alice_id = Membership.objects.get(project=project, user=alice).pk
    r = logged_in(admin).post(f"/settings/{project.pk}/members/{alice_id}/unlock/")
    assert r.status_code == 302
    assert _logged_in(_log_in(Client(), "alice", "password"))
    entry = AuditEntry.objects.get(project=project, action="login_unlocked")
    assert (entry.actor, entry.data) == ("user:ada", {"username": "alice"})
    assert first_broken_entry(project) is None
    assert "login locked" not in logged_in(admin).get("/settings/").content.decode()


def test_the_settings_page_shows_a_user_locked_by_a_guess_spread_over_addresses(
    alice, admin, user_limit
):
    for n in range(USER_LIMIT):
        _fail("alice", 1, address=f"192.0.2.{n % 200 + 1}")
    page = logged_in(admin).get("/settings/").content.decode()
    assert page.count("login locked") == 1


@pytest.mark.parametrize(("persona", "status"), [("alice", 403), ("outsider", 404)])
def test_only_the_projects_admins_unlock(request, alice, project, persona, status):
    bob = member(project, "bob", Role.OPERATOR)
    _fail("bob", LIMIT)
    bob_id = Membership.objects.get(project=project, user=bob).pk
    client = logged_in(request.getfixturevalue(persona))
    r = client.post(f"/settings/{project.pk}/members/{bob_id}/unlock/")
    assert r.status_code == status
    assert _log_in(Client(), "bob", "password").status_code == 429
    assert not AuditEntry.objects.filter(action="login_unlocked").exists()


def test_an_admin_cannot_unlock_a_member_of_another_project(alice, project, outsider):
    _fail("alice", LIMIT)
    alice_id = Membership.objects.get(project=project, user=alice).pk
    theirs = Membership.objects.get(user=outsider).project_id
    r = logged_in(outsider).post(f"/settings/{theirs}/members/{alice_id}/unlock/")
    assert r.status_code == 404
    assert _log_in(Client(), "alice", "password").status_code == 429


def test_the_axes_reset_username_command_unlocks(alice):
    _fail("alice", LIMIT)
    out = io.StringIO()
    call_command("axes_reset_username", "alice", stdout=out)
    assert "1 attempts removed" in out.getvalue()
    assert _logged_in(_log_in(Client(), "alice", "password"))
