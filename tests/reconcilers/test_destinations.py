"""Reconcilers reach only where their configuration says, never inside the server's network:
the agent's data fills no scheme or host, and a host that resolves to a loopback, private
or link-local address is refused unless TALLYBOOK_RECONCILER_ALLOWED_NETWORKS names it."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest
from pydantic import ValidationError

from durability.models import Effect
from durability.reconcilers.base import reconciler_for
from durability.reconcilers.destinations import Refused, address_check
from tests.local_http import LocalHttp, Reply

REFUND = {"id": "re_1", "status": "succeeded"}


@pytest.fixture
def server():
    with LocalHttp() as s:
        yield s


@pytest.fixture
def inside_refused(settings):
    settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = []


def effect(**request) -> Effect:
    return Effect(key="refund:1", kind="refund", target="stripe", request=request, attempt_count=1)


def http(url: str, **config):
    return reconciler_for("http", {"url": url, "external_id_path": "id", **config})


@pytest.mark.parametrize(
    "url",
    [
        "http://{request[host]}/refunds/{key}",  # the agent's request.host = "127.0.0.1:8799"
        "http://127.0.0.1:{request[port]}/refunds",
        "https://api.example.com{request[path]}",  # ".evil.example" or "@10.0.0.1"
        "https://{key}.example.com/refunds",
        "{request[url]}",
    ],
)
def test_the_agents_data_chooses_no_scheme_or_host(url):
    with pytest.raises(ValidationError) as refused:
        http(url)
    assert "must start with http" in str(refused.value) or (
        "the scheme and host must be written out" in str(refused.value)
    )


def test_the_agents_data_fills_the_path_and_query():
    for url in ("https://api.example.com/refunds/{key}", "https://api.example.com?k={key}"):
        assert http(url).config.url == url


def test_a_loopback_provider_is_not_asked_unless_allowed(inside_refused, server, monkeypatch):
    monkeypatch.setenv("TALLYBOOK_SECRET_TEST_AUTH", "Bearer sk_test_inside")
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    answer = http(server.url + "/refunds/{key}", auth_env="TALLYBOOK_SECRET_TEST_AUTH").probe(
        effect()
    )
    assert answer.answer == "unknown"
    assert "127.0.0.1 is a loopback address" in answer.detail
    assert "TALLYBOOK_RECONCILER_ALLOWED_NETWORKS" in answer.detail
    assert server.seen == []


def test_a_name_is_checked_by_the_addresses_it_resolves_to(inside_refused, server):
    port = server.url.rsplit(":", 1)[1]
    answer = http(f"http://localhost:{port}/refunds/{{key}}").probe(effect())
    assert answer.answer == "unknown" and "loopback address" in answer.detail
    assert server.seen == []


def test_an_allowed_network_is_reached(settings, server):
    settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    assert http(server.url + "/refunds/{key}").probe(effect()).answer == "found"


def test_the_probe_connects_to_the_address_it_checked(settings, server, monkeypatch):
    # A name that answers the check with one address and the connection with another (DNS
    # rebinding) gets nowhere: it is resolved once, and the connection goes to that address,
    # with the name in the Host header.
    settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    port = int(server.url.rsplit(":", 1)[1])
    real = socket.getaddrinfo
    answers = []

    def rebinding(host, *args, **kwargs):
        if host != "provider.example":
            return real(host, *args, **kwargs)
        answers.append(host)
        if len(answers) > 1:
            raise socket.gaierror("a second lookup would answer 10.0.0.1")
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    server.reply("/refunds/refund%3A1", Reply(200, REFUND))
    answer = http(f"http://provider.example:{port}/refunds/{{key}}").probe(effect())
    assert answer.answer == "found" and answers == ["provider.example"]
    assert server.seen[-1].headers["Host"] == f"provider.example:{port}"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a01:203::1", "private"),  # 6to4 of 10.1.2.3
        ("2002:a9fe:a9fe::", "link-local"),  # 6to4 of 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:f5fe:fdfc", "private"),  # Teredo, client 10.1.2.3
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
    ],
)
def test_inside_addresses_are_refused(inside_refused, address, kind):
    with pytest.raises(Refused, match=f"is a {kind} address"):
        address_check(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("address", "carried"),
    [
        ("2002:a01:203::1", "10.1.2.3"),
        ("2001:0:4136:e378:8000:63bf:f5fe:fdfc", "10.1.2.3"),
        ("64:ff9b::a01:203", "10.1.2.3"),
    ],
)
def test_an_ipv6_address_is_checked_by_the_ipv4_address_it_carries(
    inside_refused, address, carried
):
    with pytest.raises(Refused, match=f"^{carried} \\(carried by {address}\\)"):
        address_check(ipaddress.ip_address(address))


def test_a_public_6to4_address_is_public(inside_refused):
    address_check(ipaddress.ip_address("2002:808:808::1"))  # 8.8.8.8


def test_a_name_that_does_not_resolve_in_the_probes_time_is_refused(inside_refused, monkeypatch):
    """getaddrinfo has no timeout: a resolver that never answers holds no probe past its own."""
    release = threading.Event()

    def hanging(*args, **kwargs):
        release.wait(30)
        raise socket.gaierror("gave up")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    try:
        answer = http("https://slow.example/refunds/{key}", timeout_s=0.2).probe(effect())
    finally:
        release.set()
    assert answer.answer == "unknown" and "did not resolve within 0.2s" in answer.detail


@pytest.mark.parametrize(
    "repository",
    [
        "{request[repo]}",
        "git{request[at]}:org/repo.git",  # "git@10.0.0.1:org/repo.git"
        "https://{request[host]}/org/repo.git",
        "ssh://git@example.com{request[port]}/repo.git",
    ],
)
def test_the_agents_data_chooses_no_repository_host(repository):
    with pytest.raises(ValidationError):
        reconciler_for("git", {"repository": repository, "tag": "v1"})


def test_a_repository_template_may_fill_a_path():
    for repository in (
        "/srv/repos/{request[repo]}.git",
        "https://git.example.com/{request[repo]}.git",
        "git@git.example.com:org/{request[repo]}.git",
    ):
        assert reconciler_for("git", {"repository": repository, "tag": "v1"})


def test_a_git_remote_inside_is_not_reached_unless_allowed(inside_refused, silent_git_server):
    answer = reconciler_for("git", {"repository": silent_git_server, "tag": "v1"}).probe(effect())
    assert answer.answer == "unknown" and "127.0.0.1 is a loopback address" in answer.detail
