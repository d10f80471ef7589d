"""Read-only pages from a PostgreSQL read replica (`DATABASE_REPLICA_URL`).

Without the setting there is no `replica` database and nothing here runs. With it:

- `ReplicaReads` (middleware) lets a request read from the replica when it is a GET or HEAD
  for a page (the API, OTLP and the intake never pass here), not the admin, and not within
  `TALLYBOOK_REPLICA_PIN_SECONDS` of the same browser's last write (a verdict, a comment, a
  login), so that an operator always sees what they just did.
- `PrimaryOrReplica` (the database router) sends those requests' reads to the replica, except
  the reads that decide who may see what (users, sessions, memberships, API keys, lockouts)
  and any read inside a transaction on the primary. Every write, every ledger decision, every
  job and every command stays on the primary: nothing else ever sets the flag.

The replica may lag: a page read from it shows the ledger as it was a moment ago, never a
state the primary did not pass through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.db import connections
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

REPLICA = "replica"
PIN_COOKIE = "tb_primary_until"
# Paths whose GETs answer from the primary: the admin, whose pages edit what they show. (The
# API's, OTLP's and the intake's requests never reach this middleware: MachinesBypass sends
# them past the pages' middleware, and so to the primary.)
PRIMARY_PATHS = ("/admin/",)
# Who may see what is read where it is written.
PRIMARY_MODELS = frozenset(
    {
        "auth.user",
        "auth.group",
        "auth.permission",
        "contenttypes.contenttype",
        "sessions.session",
        "durability.membership",
        "durability.apikey",
        "durability.keysversion",
        "durability.project",
        "axes.accessattempt",
        "axes.accessfailurelog",
        "axes.accesslog",
    }
)

_replica_reads: ContextVar[bool] = ContextVar("replica_reads", default=False)


def configured() -> bool:
    return REPLICA in settings.DATABASES


@contextmanager
def reads_from_replica() -> Iterator[None]:
    """Within the block, reads the router allows go to the replica (if there is one)."""
    token = _replica_reads.set(True)
    try:
        yield
    finally:
        _replica_reads.reset(token)


class PrimaryOrReplica:
    """The database router: the replica for reads a page request allows, else the primary."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        if not _replica_reads.get():
            return None
        if model._meta.label_lower in PRIMARY_MODELS:
            return None
        if connections["default"].in_atomic_block:
            return None
        return REPLICA

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        # One database, two copies of it.
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db != REPLICA


class ReplicaReads:
    """Marks the requests whose reads may come from the replica, and pins a browser to the
    primary for a few seconds after each of its writes."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        if not configured():
            raise MiddlewareNotUsed
        self.get_response = get_response
        self.pin_seconds = settings.TALLYBOOK_REPLICA_PIN_SECONDS

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = self.get_response(request)
            until = int(time.time()) + self.pin_seconds
            response.set_cookie(
                PIN_COOKIE,
                str(until),
                max_age=self.pin_seconds,
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
            return response
        if request.path_info.startswith(PRIMARY_PATHS) or self._pinned(request):
            return self.get_response(request)
        with reads_from_replica():
            return self.get_response(request)

    @staticmethod
    def _pinned(request: HttpRequest) -> bool:
        try:
            return int(request.COOKIES.get(PIN_COOKIE, "0")) > time.time()
        except ValueError:
            return False
