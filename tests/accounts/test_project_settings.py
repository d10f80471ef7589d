"""The project settings page: admins manage members, API keys and the policy; nobody else."""

from __future__ import annotations

import re
from functools import partial

import pytest
from django.contrib.auth.models import User
from django.db import connection

from durability.audit import first_broken_entry
from durability.models import (
    ApiKey,
    AuditEntry,
    AuthorityPolicy,
    Invitation,
    Membership,
    Project,
    RetentionPolicy,
    Role,
)
from tests.conftest import Api
from tests.desk.support import logged_in, member, search
from tests.desk.test_case_race import _at_once

PERSONAS = ["admin", "alice", "viewer", "outsider", "mallory"]  # alice is an operator
RAW_KEY = r"tb_[A-Za-z0-9_-]{43}"


@pytest.fixture
def newbie(db):
    return User.objects.create_user("newbie", email="newbie@example.com", password="pw")


def _actions(project, alice, api_key):
    """Each state-changing request of the settings page: name -> (path, data)."""
    alice_id = Membership.objects.get(project=project, user=alice).pk
    key_id = ApiKey.objects.get(project=project).pk
    base = f"/settings/{project.pk}"
    return {
        "add": (f"{base}/members/", {"username": "newbie", "role": "operator"}),
        "invite": (
            f"{base}/members/",
            {"username": "nina", "email": "nina@example.com", "role": "operator"},
        ),
        "role": (f"{base}/members/{alice_id}/role/", {"role": "viewer"}),
        "remove": (f"{base}/members/{alice_id}/remove/", {}),
        "key": (f"{base}/keys/", {"name": "ci"}),
        "revoke": (f"{base}/keys/{key_id}/revoke/", {}),
        "policy": (f"{base}/policy/", {"authority_policy": "enforce"}),
        "redaction": (f"{base}/redaction/", {"patterns": r"cust-[0-9]{6}", "keys": "iban"}),
        "retention": (
            f"{base}/retention/",
            {"span_days": "7", "payload_days": "90", "require_archive": "on"},
        ),
    }


def _state(project):
    """Everything an action could change, to show that a refused one changed nothing."""
    project.refresh_from_db()
    return (
        sorted(Membership.objects.filter(project=project).values_list("user__username", "role")),
        sorted(ApiKey.objects.filter(project=project).values_list("pk", "revoked_at")),
        project.authority_policy,
        (project.redaction_patterns, project.redaction_keys),
        AuditEntry.objects.filter(project=project).count(),
        sorted(User.objects.values_list("username", flat=True)),
        list(RetentionPolicy.objects.filter(project=project).values()),
    )


# Admins act (the new key's page is a 200 showing it); other members are refused; a
# stranger, with a project of their own or none, is not told the project exists.
ACTIONS = ["add", "invite", "role", "remove", "key", "revoke", "policy", "redaction", "retention"]
EXPECTED = {
    "admin": {
        "add": 302,
        "invite": 302,
        "role": 302,
        "remove": 302,
        "key": 200,
        "revoke": 302,
        "policy": 302,
        "redaction": 302,
        "retention": 302,
    },
    **{
        persona: dict.fromkeys(ACTIONS, status)
        for persona, status in [
            ("alice", 403),
            ("viewer", 403),
            ("outsider", 404),
            ("mallory", 404),
        ]
    },
}


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_is_for_the_projects_admins_only(
    request, project, alice, api_key, newbie, persona, action
):
    user = request.getfixturevalue(persona)
    path, data = _actions(project, alice, api_key)[action]
    before = _state(project)
    r = logged_in(user).post(path, data)
    assert r.status_code == EXPECTED[persona][action]
    if persona == "admin":
        assert _state(project) != before
        entry = AuditEntry.objects.filter(project=project).latest("id")
        assert entry.actor == "user:ada" and entry.effect_id is None
    else:
        assert _state(project) == before


@pytest.mark.parametrize(
    ("persona", "status"),
    # mallory, in no project, gets the landing page that says so.
    [("admin", 200), ("alice", 403), ("viewer", 403), ("mallory", 200)],
)
def test_the_page_is_for_admins_and_only_they_see_its_link(
    request, project, alice, persona, status
):
    client = logged_in(request.getfixturevalue(persona))
    r = client.get("/settings/")
    assert r.status_code == status
    assert ("not a member of any project" in r.content.decode()) == (persona == "mallory")
    if persona != "mallory":
        has_link = 'href="/settings/"' in client.get("/queue/").content.decode()
        assert has_link == (persona == "admin")


def test_the_page_lists_members_with_roles_and_keys_with_their_history(
    project, admin, alice, api, api_key
):
    api.intent("k1")
    revoked, _ = ApiKey.issue(project, name="old-ci")
    revoked.revoke()
    page = logged_in(admin).get("/settings/").content.decode()
    assert re.search(r"alice</td>\s*<td>.*?value=\"operator\" selected", page, re.S)
    assert re.search(r"ada <span class=\"muted\">\(you\)</span>", page)
    live = ApiKey.objects.get(pk=ApiKey.objects.get(prefix=api_key[:11]).pk)
    assert live.prefix in page and revoked.prefix in page and "old-ci" in page
    assert page.count("Revoke</button>") == 1  # only the live key
    assert api_key not in page


def test_a_stranger_with_a_project_of_their_own_sees_only_its_settings(project, admin, outsider):
    page = logged_in(outsider).get("/settings/").content.decode()
    assert "gamma" in page and "alpha" not in page and "ada" not in page


def test_an_admin_invites_an_existing_user_with_a_role(project, admin, newbie):
    r = logged_in(admin).post(
        f"/settings/{project.pk}/members/", {"username": "newbie", "role": "operator"}
    )
    assert r.status_code == 302
    assert Invitation.objects.get(project=project, user=newbie).role == Role.OPERATOR
    assert not Membership.objects.filter(project=project, user=newbie).exists()
    entry = AuditEntry.objects.get(project=project, action="member_invited")
    assert entry.data == {"username": "newbie", "role": "operator"}


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"username": "alice", "role": "viewer"}, "username", "already a member"),
        ({"username": "newbie", "role": "owner"}, "role", "Select a valid choice"),
        ({"username": "", "role": "viewer"}, "username", "This field is required"),
    ],
)
def test_adding_a_member_says_what_is_wrong_with_which_field(
    project, admin, alice, newbie, data, field, message
):
    before = _state(project)
    r = logged_in(admin).post(f"/settings/{project.pk}/members/", data)
    assert r.status_code == 400
    assert message in " ".join(r.context["add_form"].errors[field])
    assert message in r.content.decode()
    assert _state(project) == before


def test_an_admin_changes_a_role_and_the_audit_says_from_what(project, admin, alice):
    membership = Membership.objects.get(user=alice)
    client = logged_in(admin)
    r = client.post(f"/settings/{project.pk}/members/{membership.pk}/role/", {"role": "admin"})
    assert r.status_code == 302
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN
    entry = AuditEntry.objects.get(project=project, action="member_role_changed")
    assert entry.data == {"username": "alice", "was": "operator", "role": "admin"}
    # The same role again changes nothing and records nothing.
    client.post(f"/settings/{project.pk}/members/{membership.pk}/role/", {"role": "admin"})
    assert AuditEntry.objects.filter(project=project, action="member_role_changed").count() == 1
    bad = client.post(f"/settings/{project.pk}/members/{membership.pk}/role/", {"role": "root"})
    assert bad.status_code == 400 and "role: Select a valid choice" in bad.content.decode()


def test_the_last_admin_can_be_neither_removed_nor_demoted(project, admin, alice):
    own = Membership.objects.get(user=admin)
    client = logged_in(admin)
    before = _state(project)
    for path, data in [("remove/", {}), ("role/", {"role": "operator"})]:
        r = client.post(f"/settings/{project.pk}/members/{own.pk}/{path}", data)
        assert r.status_code == 409
        assert "last admin" in r.content.decode()
    assert _state(project) == before
    # With a second admin, the first may step down.
    member(project, "bea", Role.ADMIN)
    r = client.post(f"/settings/{project.pk}/members/{own.pk}/remove/")
    assert r.status_code == 302 and r["Location"] == "/"
    assert not Membership.objects.filter(user=admin).exists()
    # In no project now: the landing page says so, and the project's actions are not found.
    landing = client.get("/settings/")
    assert landing.status_code == 200 and "not a member of any project" in landing.content.decode()
    assert client.post(f"/settings/{project.pk}/keys/", {"name": "x"}).status_code == 404


def test_an_admin_removes_a_member_who_then_loses_access(project, admin, alice):
    membership = Membership.objects.get(user=alice)
    r = logged_in(admin).post(f"/settings/{project.pk}/members/{membership.pk}/remove/")
    assert r.status_code == 302
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert logged_in(alice).get("/queue/").content.decode().count("not a member") == 1
    entry = AuditEntry.objects.get(project=project, action="member_removed")
    assert entry.data == {"username": "alice", "role": "operator"}


def test_a_created_key_is_shown_once_stored_nowhere_and_authenticates(client, project, admin):
    admin_client = logged_in(admin)
    r = admin_client.post(f"/settings/{project.pk}/keys/", {"name": "deploy-bot"})
    assert r.status_code == 200
    assert "no-store" in r["Cache-Control"]
    raw = search(RAW_KEY, r.content.decode()).group(0)
    key = ApiKey.objects.get(project=project, name="deploy-bot")
    assert raw.startswith(key.prefix)
    assert raw not in admin_client.get("/settings/").content.decode()
    secret = raw.removeprefix("tb_")
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT t::text FROM {connection.ops.quote_name(table)} t")
            for (row,) in cursor.fetchall():
                assert secret not in row, table
    assert Api(client, raw).intent("k1").status_code == 201
    entry = AuditEntry.objects.get(project=project, action="apikey_created")
    assert entry.data == {"key": key.pk, "prefix": key.prefix, "name": "deploy-bot"}


def test_a_key_needs_a_name(project, admin):
    r = logged_in(admin).post(f"/settings/{project.pk}/keys/", {"name": "  "})
    assert r.status_code == 400
    assert "This field is required" in " ".join(r.context["key_form"].errors["name"])
    assert not ApiKey.objects.filter(project=project).exists()


def test_a_revoked_key_gets_401_at_the_api_at_once(project, admin, api, api_key):
    assert api.intent("k1").status_code == 201
    key = ApiKey.objects.get(project=project)
    client = logged_in(admin)
    assert client.post(f"/settings/{project.pk}/keys/{key.pk}/revoke/").status_code == 302
    assert api.intent("k2").status_code == 401
    assert AuditEntry.objects.get(project=project, action="apikey_revoked").data["key"] == key.pk
    # Revoking again changes nothing and records nothing.
    client.post(f"/settings/{project.pk}/keys/{key.pk}/revoke/")
    assert AuditEntry.objects.filter(project=project, action="apikey_revoked").count() == 1


def test_another_projects_key_or_member_is_not_found_from_this_one(
    project, admin, other_api, outsider
):
    beta_key = ApiKey.objects.get(project__name="beta")
    olga = Membership.objects.get(user=outsider)
    client = logged_in(admin)
    base = f"/settings/{project.pk}"
    assert client.post(f"{base}/keys/{beta_key.pk}/revoke/").status_code == 404
    assert client.post(f"{base}/members/{olga.pk}/remove/").status_code == 404
    assert client.post(f"{base}/members/{olga.pk}/role/", {"role": "viewer"}).status_code == 404
    assert other_api.get("effects", key="k0").status_code != 401
    olga.refresh_from_db()
    assert olga.role == Role.ADMIN


def test_an_admin_sets_the_policy_for_intents_without_authority(project, admin):
    client = logged_in(admin)
    r = client.post(f"/settings/{project.pk}/policy/", {"authority_policy": "enforce"})
    assert r.status_code == 302
    project.refresh_from_db()
    assert project.authority_policy == AuthorityPolicy.ENFORCE
    entry = AuditEntry.objects.get(project=project, action="authority_policy_set")
    assert entry.actor == "user:ada" and entry.data["policy"] == "enforce"
    bad = client.post(f"/settings/{project.pk}/policy/", {"authority_policy": "ignore"})
    assert bad.status_code == 400 and "Select a valid choice" in bad.content.decode()


def test_an_admin_asks_for_a_case_per_ungranted_effect_and_back(project, admin):
    client = logged_in(admin)
    page = client.get("/settings/").content.decode()
    assert "audit with cases" in page and "the authority report lists each one" in page
    client.post(f"/settings/{project.pk}/policy/", {"authority_policy": "audit_cases"})
    client.post(f"/settings/{project.pk}/policy/", {"authority_policy": "audit"})
    changes = AuditEntry.objects.filter(project=project, action="authority_policy_set")
    assert [(e.data["was"], e.data["policy"]) for e in changes.order_by("id")] == [
        ("audit", "audit_cases"),
        ("audit_cases", "audit"),
    ]


def test_an_admin_adds_secret_patterns_and_key_names_and_the_audit_names_them(project, admin):
    client = logged_in(admin)
    r = client.post(
        f"/settings/{project.pk}/redaction/",
        {"patterns": "cust-[0-9]{6}\n\n  acct_[a-z]{8}  \n", "keys": "iban\nSSN"},
    )
    assert r.status_code == 302
    project.refresh_from_db()
    assert project.redaction_patterns == ["cust-[0-9]{6}", "acct_[a-z]{8}"]
    assert project.redaction_keys == ["iban", "SSN"]
    entry = AuditEntry.objects.get(project=project, action="redaction_set")
    assert entry.actor == "user:ada"
    assert entry.data["patterns"] == ["cust-[0-9]{6}", "acct_[a-z]{8}"]
    assert entry.data["was_patterns"] == [] and entry.data["keys"] == ["iban", "SSN"]
    page = client.get("/settings/").content.decode()
    assert "acct_[a-z]{8}" in page and "SSN" in page
    # Saving the same again changes nothing and audits nothing.
    client.post(
        f"/settings/{project.pk}/redaction/",
        {"patterns": "cust-[0-9]{6}\nacct_[a-z]{8}", "keys": "iban\nSSN"},
    )
    assert AuditEntry.objects.filter(project=project, action="redaction_set").count() == 1


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("cust-[0-9", "not a regular expression"),
        ("(?<!x)y", "a negative lookbehind (?&lt;!…) is not supported"),
        ("(ab)\\1", "a backreference is not supported"),
        ("a*", "matches the empty text"),
        ("x" * 201, "over 200 characters"),
    ],
)
def test_a_pattern_that_cannot_be_used_is_refused_by_field_and_nothing_is_saved(
    project, admin, pattern, message
):
    before = _state(project)
    r = logged_in(admin).post(
        f"/settings/{project.pk}/redaction/", {"patterns": f"ok-[0-9]{{4}}\n{pattern}", "keys": "x"}
    )
    assert r.status_code == 400
    assert "Pattern 2" in r.content.decode() and message in r.content.decode()
    assert _state(project) == before


def test_too_many_patterns_or_overlong_key_names_are_refused(project, admin):
    client = logged_in(admin)
    many = "\n".join(f"p{i}-[0-9]+" for i in range(21))
    r = client.post(f"/settings/{project.pk}/redaction/", {"patterns": many, "keys": ""})
    assert r.status_code == 400 and "At most 20 patterns" in r.content.decode()
    r = client.post(f"/settings/{project.pk}/redaction/", {"patterns": "", "keys": "k" * 101})
    assert r.status_code == 400 and "at most 100 characters" in r.content.decode()
    project.refresh_from_db()
    assert project.redaction_patterns == [] and project.redaction_keys == []


def test_every_change_needs_the_csrf_token(project, admin, alice, api_key, newbie):
    client = logged_in(admin, enforce_csrf_checks=True)
    before = _state(project)
    for path, data in _actions(project, alice, api_key).values():
        assert client.post(path, data).status_code == 403
    assert _state(project) == before
    assert client.get(f"/settings/{project.pk}/keys/").status_code == 405


def test_settings_changes_extend_the_projects_audit_chain(project, admin, alice, api_key, newbie):
    client = logged_in(admin)
    for action, (path, data) in _actions(project, alice, api_key).items():
        if action != "remove":
            client.post(path, data)
    actions = list(
        AuditEntry.objects.filter(project=project).order_by("seq").values_list("action", flat=True)
    )
    assert actions == [
        "member_invited",
        "member_invited",
        "member_role_changed",
        "apikey_created",
        "apikey_revoked",
        "authority_policy_set",
        "redaction_set",
        "retention_set",
    ]
    assert first_broken_entry(Project.objects.get(pk=project.pk)) is None


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin(project, admin):
    bea = member(project, "bea", Role.ADMIN)
    ada_id, bea_id = (Membership.objects.get(user=u).pk for u in (admin, bea))
    for _ in range(3):
        Membership.objects.filter(project=project).update(role=Role.ADMIN)
        responses = _at_once(
            [
                partial(
                    logged_in(admin).post,
                    f"/settings/{project.pk}/members/{bea_id}/role/",
                    {"role": "viewer"},
                ),
                partial(
                    logged_in(bea).post,
                    f"/settings/{project.pk}/members/{ada_id}/role/",
                    {"role": "viewer"},
                ),
            ]
        )
        # The loser is refused either way: as the last admin (409) when both requests passed
        # the permission check first, or as no admin any more (403) when the winner had
        # already committed.
        assert sorted(r.status_code for r in responses) in ([302, 403], [302, 409])
        assert Membership.objects.filter(project=project, role=Role.ADMIN).count() == 1
        winner = admin if responses[0].status_code == 302 else bea
        assert Membership.objects.get(project=project, role=Role.ADMIN).user == winner


def test_the_page_takes_the_same_few_queries_however_many_members_and_keys(
    project, admin, django_assert_max_num_queries
):
    for n in range(30):
        member(project, f"user{n}", Role.VIEWER)
        ApiKey.issue(project, name=f"key{n}")
    client = logged_in(admin)
    with django_assert_max_num_queries(9):
        page = client.get("/settings/").content.decode()
    assert "user29" in page and "key29" in page


def test_the_keys_table_says_active_or_revoked_and_when(project, admin, api_key):
    revoked, _ = ApiKey.issue(project, name="old-ci")
    revoked.revoke()
    page = logged_in(admin).get("/settings/").content.decode()
    table = page[page.index('class="list keys"') :]
    table = table[: table.index("</table>")]
    assert "<th>Status</th>" in table and "<th>Revoked</th>" not in table and "live" not in table
    assert re.search(r"<td>Active</td>", table)
    assert re.search(
        r"<td>Revoked <time datetime=\"[^\"]+Z\" title=\"[^\"]+\">"
        r"\d{4}-\d\d-\d\d \d\d:\d\d</time></td>",
        table,
    )


def test_an_admin_sets_the_deadline_of_attempts_that_declare_no_timeout(project, admin):
    client = logged_in(admin)
    assert "declares no timeout" in client.get("/settings/").content.decode()
    r = client.post(
        f"/settings/{project.pk}/policy/",
        {"authority_policy": project.authority_policy, "effect_timeout_s": "600"},
    )
    assert r.status_code == 302
    project.refresh_from_db()
    assert project.effect_timeout_s == 600
    entry = AuditEntry.objects.get(project=project, action="effect_timeout_set")
    assert entry.data["timeout_s"] == 600
    bad = client.post(
        f"/settings/{project.pk}/policy/",
        {"authority_policy": project.authority_policy, "effect_timeout_s": "0"},
    )
    assert bad.status_code == 400
