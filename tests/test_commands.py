"""Management commands: createapikey and demo (sweep has its own file)."""

from __future__ import annotations

import io
import re

from django.core.management import call_command

from durability.models import ApiKey, Project, State


def run(*args: str) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().splitlines()


def test_createapikey_creates_the_project_and_prints_the_key_alone_on_the_last_line(db, client):
    lines = run("createapikey", "acme")
    raw = lines[-1]
    assert re.fullmatch(r"tb_[A-Za-z0-9_-]{22,}", raw)
    assert "Created project 'acme'." in lines
    key = ApiKey.authenticate(raw)
    assert key is not None and key.project.name == "acme"
    r = client.get("/api/v1/effects", {"key": "x"}, headers={"Authorization": f"Bearer {raw}"})
    assert r.status_code == 404, "the key is accepted; the effect is simply unknown"


def test_createapikey_for_an_existing_project_adds_a_key_and_keeps_the_project(db):
    first = run("createapikey", "acme")[-1]
    lines = run("createapikey", "acme", "--name", "ci")
    assert not any(line.startswith("Created project") for line in lines)
    assert Project.objects.filter(name="acme").count() == 1
    assert lines[-1] != first
    second = ApiKey.authenticate(lines[-1])
    assert second is not None and second.name == "ci"
    assert ApiKey.authenticate(first) is not None


def test_demo_seeds_every_state_and_its_login_and_key_work(db, client, tmp_path):
    # Its files in the test's folder, not the checkout's .demo/ that a running bin/demo uses.
    printed = "\n".join(run("demo", "--dir", str(tmp_path)))
    project = Project.objects.get(name="demo")
    states = set(project.effects.values_list("state", flat=True))
    assert states == set(State)
    login = re.search(r"^Operator login: (\S+) / (\S+)$", printed, re.M)
    key = re.search(r"^API key: (tb_\S+)$", printed, re.M)
    assert login and key
    # Through the login page: django-axes refuses an authentication that names no request.
    r = client.post("/login/", {"username": login[1], "password": login[2]})
    assert r.status_code == 302 and r.wsgi_request.user.is_authenticated
    assert client.get("/effects/").status_code == 200
    done = project.effects.filter(state=State.SUCCEEDED).first()
    assert done is not None
    r = client.get(
        "/api/v1/effects", {"key": done.key}, headers={"Authorization": f"Bearer {key[1]}"}
    )
    assert r.status_code == 200 and r.json()["decision"] == "completed"
