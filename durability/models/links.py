"""The path of a row's page, for the links each ledger answer and each page carries."""

from __future__ import annotations

from functools import lru_cache

from django.urls import URLResolver, get_resolver, get_script_prefix, get_urlconf, reverse

# An id no row has, found again in the path `reverse` builds around it.
_ID_MARK = 918273645


def row_path(route: str, pk: int) -> str:
    """`reverse(route, args=[pk])` for a route whose one argument is a row's id: the route's
    text around the id is resolved once per script prefix and URLconf, not on every link
    (each ledger answer carries one or more links; reverse resolves the route anew each
    time)."""
    # The resolver `reverse` would use: a request's own URLconf (request.urlconf) too.
    head, tail = _route_around_id(route, get_script_prefix(), get_resolver(get_urlconf()))
    return f"{head}{pk}{tail}"


@lru_cache(maxsize=32)
def _route_around_id(route: str, prefix: str, resolver: URLResolver) -> tuple[str, str]:
    # Called with `resolver` the current one (row_path): reverse reads the same URLconf.
    head, mark, tail = reverse(route, args=[_ID_MARK]).rpartition(str(_ID_MARK))
    assert mark, (route, head, tail)
    return head, tail
