"""The desk's address in the links Tallybook hands out, and what the proxies in front of it
may say about a request (its client's address and scheme).

`SITE_URL` when it is set; otherwise, while a request is answered, the address that
request came to (so an agent talking to http://10.0.0.5:8000 is given case links it can
open), and the default `SITE_URL` in background work.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning
from django.http import HttpRequest, HttpResponse

_origin: ContextVar[str | None] = ContextVar("tallybook_request_origin", default=None)


def site_url() -> str:
    if settings.SITE_URL_CONFIGURED:
        return str(settings.SITE_URL)
    return _origin.get() or str(settings.SITE_URL)


class RequestOrigin:
    """Middleware: remember the scheme and host (checked against ALLOWED_HOSTS) of each request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _origin.set(f"{request.scheme}://{request.get_host()}")
        try:
            return self.get_response(request)
        finally:
            _origin.reset(token)


# -- proxies ---------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _networks(listed: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in listed)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def is_trusted_proxy(text: str) -> bool:
    """Whether an address is one of TRUSTED_PROXIES."""
    address = _address(text)
    networks = _networks(tuple(settings.TRUSTED_PROXIES))
    return address is not None and any(
        address.version == net.version and address in net for net in networks
    )


def proxies_named() -> bool:
    """Whether the operator said which proxies stand in front (TRUSTED_PROXIES or _HOPS)."""
    return bool(settings.TRUSTED_PROXIES) or settings.TRUSTED_PROXY_HOPS > 0


def client_address(request: HttpRequest) -> str | None:
    """The client's address: the connection's, or behind proxies, the one the trusted proxies
    say they were reached from (LOGIN_CLIENT_ADDRESS_HEADER, to which each appends the
    address it saw; what comes before is the client's to forge). None when that is no IP
    address (a Unix socket, a misconfigured proxy).

    With TRUSTED_PROXIES, the header counts only when the connection is from one of them,
    and is read from its end back past every trusted address; with TRUSTED_PROXY_HOPS = n,
    the n-th address from its end; with neither, its last address (check --deploy warns).
    """
    peer = str(request.META.get("REMOTE_ADDR", ""))
    header = settings.LOGIN_CLIENT_ADDRESS_HEADER
    listed = request.headers.get(header, "") if header else ""
    forwarded = [entry.strip() for entry in listed.split(",") if entry.strip()]
    candidate = peer
    if forwarded and settings.TRUSTED_PROXIES:
        chain = [*forwarded, peer]
        candidate = next((a for a in reversed(chain) if not is_trusted_proxy(a)), chain[0])
    elif forwarded and settings.TRUSTED_PROXY_HOPS > 0:
        hops = settings.TRUSTED_PROXY_HOPS
        candidate = forwarded[-hops] if len(forwarded) >= hops else forwarded[0]
    elif forwarded:
        candidate = forwarded[-1]
    address = _address(candidate)
    return str(address) if address is not None else None


class ProxyHeaders:
    """Middleware: SECURE_PROXY_SSL_HEADER is dropped from a request that did not come from
    one of TRUSTED_PROXIES, so a client reaching Django directly cannot say it used HTTPS."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        scheme_header = settings.SECURE_PROXY_SSL_HEADER
        peer = str(request.META.get("REMOTE_ADDR", ""))
        if scheme_header and settings.TRUSTED_PROXIES and not is_trusted_proxy(peer):
            request.META.pop(scheme_header[0], None)
        return self.get_response(request)


def deploy_checks(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """`check --deploy`: forwarded headers believed from anyone, links without SITE_URL."""
    found: list[CheckMessage] = []
    believed = [
        name
        for name, value in (
            ("SECURE_PROXY_SSL_HEADER", settings.SECURE_PROXY_SSL_HEADER),
            ("LOGIN_CLIENT_ADDRESS_HEADER", settings.LOGIN_CLIENT_ADDRESS_HEADER),
        )
        if value
    ]
    if believed and not proxies_named():
        found.append(
            Warning(
                f"{' and '.join(believed)} name a proxy's header, but no proxy is trusted: "
                "a client that reaches Django directly chooses its own scheme and address "
                "(and escapes or causes login lockouts).",
                hint="Set TRUSTED_PROXIES to your proxies' addresses or networks, or "
                "TRUSTED_PROXY_HOPS to how many proxies every request passes.",
                id="tallybook.W001",
            )
        )
    if not settings.SITE_URL_CONFIGURED:
        found.append(
            Warning(
                "SITE_URL is not set: links in invitations and emails follow the Host each "
                "request came with.",
                hint="Set SITE_URL to the address people reach the desk at.",
                id="tallybook.W002",
            )
        )
    return found
