"""Integer parameters of the desk's pages from outside: `²` and 5,000 digits are ignored or
refused, never a server error (`inbound.number_param`)."""

from __future__ import annotations

import pytest

from durability.models import Effect

ODD = ["²", "9" * 5000, "99999999999999999999", "-1"]


@pytest.fixture
def recorded(api, alice):
    api.intent("refund:1")
    api.timeout("refund:1")
    return Effect.objects.get(key="refund:1")


@pytest.mark.parametrize("value", ODD)
@pytest.mark.parametrize(
    "url",
    [
        "/effects/?before={}",
        "/queue/pulse/?since={}",
        "/queue/pulse/?new={}",
        "/authority/audit/?before={}",
        "/authority/audit.csv?before={}&page=1",
    ],
)
def test_an_odd_integer_parameter_is_ignored_and_the_page_answers(
    client, alice, recorded, url, value
):
    client.force_login(alice)
    response = client.get(url.format(value))
    assert response.status_code == 200
    if url.startswith("/effects/"):
        assert recorded.key in response.content.decode()


@pytest.mark.parametrize("value", ODD)
def test_switching_to_an_odd_project_id_is_not_found(client, alice, recorded, value):
    client.force_login(alice)
    assert client.post("/projects/switch/", {"project": value}).status_code == 404


def test_switching_to_a_project_of_ones_own_still_works(client, alice, project):
    client.force_login(alice)
    response = client.post("/projects/switch/", {"project": str(project.pk), "next": "/effects/"})
    assert response.status_code == 302 and response["Location"] == "/effects/"


@pytest.mark.parametrize(
    "cursor",
    ["99999999999999999999.1", "-99999999999999999.1", "1.2.3.4", "3", "1.-2"],
)
@pytest.mark.parametrize("grouped", ["", "&grouped=1"])
def test_a_queue_cursor_no_page_could_have_made_is_refused_on_the_page(
    client, alice, recorded, cursor, grouped
):
    client.force_login(alice)
    response = client.get(f"/queue/?after={cursor}{grouped}")
    assert response.status_code == 200
    assert "Not a page of this queue." in response.content.decode()


def test_a_queue_cursor_past_every_case_id_is_a_page_after_its_moment(client, alice, recorded):
    """An id no bigint holds is after every case of its moment: the cases opened since
    (refund:1's, long after 1970) are the page, and nothing overflows."""
    client.force_login(alice)
    response = client.get("/queue/?after=1.99999999999999999999")
    assert response.status_code == 200 and recorded.key in response.content.decode()
