"""Where a reconciler may connect: a project admin's configuration and an agent's data
must not make the server reach inside its own network.

Two lines: a URL template's scheme and host are literal (`authority_check`, when it is
saved), so an agent's request fields fill only the path and query; and the host's
addresses, once resolved, are public unless TALLYBOOK_RECONCILER_ALLOWED_NETWORKS names
their network (`resolve`, at probe time). The probe then connects to the address that was
checked, never resolving the name again (a name that answers a public address to the check
and 127.0.0.1 to the connection gets nowhere).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import string
import threading
from functools import lru_cache

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# A URL's scheme and authority, then where its path, query or fragment starts.
_AUTHORITY = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#{}]*[/?#]", re.IGNORECASE)


class Refused(ValueError):
    """A destination a reconciler may not reach, with the reason."""


def literal_prefix(template: str) -> tuple[str, bool]:
    """The template's text before its first field, and whether it has a field."""
    prefix = ""
    for literal, name, _, _ in string.Formatter().parse(template):
        prefix += literal
        if name is not None:
            return prefix, True
    return prefix, False


def authority_check(template: str) -> str:
    """A URL template whose scheme and host (with port and user) are all literal: every
    field comes after the path's first `/` (or a `?`, `#`); returns it unchanged."""
    prefix, fields = literal_prefix(template)
    if fields and not _AUTHORITY.match(prefix):
        raise ValueError(
            "the scheme and host must be written out: a field may only follow the host's "
            "first /, ? or # (https://api.example.com/orders/{request[id]})"
        )
    return template


@lru_cache(maxsize=16)
def _allowed(
    networks: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _inside(address: Address) -> str:
    """What makes an address no public destination ("" when it is one)."""
    for kind, inside in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("private", address.is_private),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved or not address.is_global),
    ):
        if inside:
            return kind
    return ""


# NAT64's well-known prefix: a gateway translates 64:ff9b::7f00:1 to 127.0.0.1.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded(address: Address) -> Address:
    """The IPv4 address an IPv6 address tunnels to (the address itself if none): a host
    reached through it is that IPv4 host."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.sixtofour:
        return address.sixtofour  # 6to4: 2002:7f00:1:: is 127.0.0.1's network
    if address.teredo:
        return address.teredo[1]  # Teredo: (server, client); the packets go to the client
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def address_check(address: Address) -> None:
    """Refused unless the address is public or in an allowed network; an IPv6 address that
    carries an IPv4 one (6to4, Teredo, NAT64) must pass with both."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    embedded = _embedded(address)
    for checked in dict.fromkeys((embedded, address)):
        kind = _inside(checked)
        if not kind:
            continue
        allowed = _allowed(tuple(settings.TALLYBOOK_RECONCILER_ALLOWED_NETWORKS))
        if any(checked.version == net.version and checked in net for net in allowed):
            continue
        carried = f" (carried by {address})" if checked is not address else ""
        raise Refused(
            f"{checked}{carried} is a {kind} address; reconcilers reach only public ones "
            "unless TALLYBOOK_RECONCILER_ALLOWED_NETWORKS names its network"
        )


def _getaddrinfo(host: str, port: int, timeout: float) -> list[tuple[object, ...]]:
    """socket.getaddrinfo, which has no timeout of its own, given `timeout` seconds in a
    thread of its own; raises Refused after that (the thread finishes on its own: a
    daemon, it holds up no exit)."""
    done: list[list[tuple[object, ...]] | BaseException] = []

    def lookup() -> None:
        try:
            done.append(list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
        except BaseException as exc:  # handed to the caller
            done.append(exc)

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not done:
        raise Refused(f"{host} did not resolve within {timeout:g}s")
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def resolve(host: str, port: int, timeout: float) -> str:
    """The one address to connect to for `host`: resolved once, within `timeout` seconds,
    every address it has checked (a name with one inside address is refused whole)."""
    try:
        found = _getaddrinfo(host, port, timeout)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"{host} does not resolve: {exc}") from None
    addresses = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # type: ignore[index]
        address_check(address)
        addresses.append(str(address))
    if not addresses:
        raise Refused(f"{host} has no address")
    return addresses[0]
