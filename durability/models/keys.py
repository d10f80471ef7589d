"""API keys: issued, authenticated (cached per process, checked against `KeysVersion`, the one
row PostgreSQL's triggers bump on any change to a key or a project) and revoked."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection, models
from django.db.models import Q, Subquery
from django.db.models.base import ModelState
from django.utils import timezone

from durability.models.projects import Project

API_KEY_PREFIX = "tb_"
# Refresh ApiKey.last_used_at at most this often: it tells people which keys are still in
# use (minutes are enough for that), and a write per request would turn every read of the
# API into a write and queue an agent fleet's requests on their shared key's row lock.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# At most this many keys are cached per process (ApiKey.authenticate); past it, all are
# forgotten at once and read again as they are used.
AUTHENTICATED_MAX = 10_000


def _digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def _digest_of(raw: str) -> str | None:
    """The digest a presented key is looked up by; None for what cannot be a key."""
    if not raw.startswith(API_KEY_PREFIX) or len(raw) > 200:
        return None
    return _digest(raw)


class ApiKey(models.Model):
    project = models.ForeignKey(Project, models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    # The first characters of the key, shown to people so they can tell keys apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64)
    created = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Every API request: the key by its digest. A constraint, not `unique=True`, which
            # adds a varchar_pattern_ops twin that the planner took for this lookup.
            models.UniqueConstraint(fields=["digest"], name="apikey_digest_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project})"

    @classmethod
    def names(cls, project_id: int, actors: Iterable[str]) -> dict[str, str]:
        """The names of the project's keys among `actors` (`api:<prefix>`), by prefix: one
        query, none when no actor is a key; a key without a name is left out."""
        prefixes = {a.partition(":")[2] for a in actors if a.startswith("api:")}
        if not prefixes:
            return {}
        return dict(
            cls.objects.filter(project_id=project_id, prefix__in=prefixes)
            .exclude(name="")
            .values_list("prefix", "name")
        )

    @classmethod
    def issue(cls, project: Project, name: str = "") -> tuple[ApiKey, str]:
        """Create a key; the raw key is returned once and never stored."""
        raw = API_KEY_PREFIX + secrets.token_urlsafe(32)  # 256 bits
        key = cls.objects.create(project=project, name=name, prefix=raw[:11], digest=_digest(raw))
        return key, raw

    @classmethod
    def authenticate(cls, raw: str, *, now: datetime | None = None) -> ApiKey | None:
        """The live key matching `raw`, with its project, or None; a copy the caller owns.

        Keys are cached per process and used while the keys version is the one they were
        read under: one primary-key read per request (`KeysVersion.current`); a key not
        cached, or cached under an older version, is read with its project and the version
        in one statement. Refreshes `last_used_at` at most once a minute.
        """
        digest = _digest_of(raw)
        if digest is None:
            return None
        cached = _authenticated.get(digest)
        if cached is not None and cached[0] == KeysVersion.current():
            key: ApiKey | None = cached[1]
        else:
            key = cls._read(digest)
        if key is None or not key._live_for(digest):
            return None
        key.touch(now or timezone.now())
        return key._copy()

    @classmethod
    def cached(cls, raw: str, *, now: datetime | None = None) -> tuple[ApiKey, int | None] | None:
        """The live key matching `raw` as this process cached it, with the keys version it
        was read under, for a caller that checks the version itself before it relies on it
        (`KeysVersion.CURRENT`, sent ahead of its first reads); None if the key is not
        cached, not live, or due for a `touch` (then `authenticate`)."""
        digest = _digest_of(raw)
        cached = _authenticated.get(digest) if digest is not None else None
        if cached is None or digest is None:
            return None
        version, key = cached
        now = now or timezone.now()
        if not key._live_for(digest):
            return None
        if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
            return None
        return key._copy(), version

    def _live_for(self, digest: str) -> bool:
        return (
            self.revoked_at is None
            and self.project.deleting is None
            and hmac.compare_digest(self.digest, digest)
        )

    def _copy(self) -> ApiKey:
        """The cached instances are shared by every request of the process: each gets its own."""
        mine = _shallow_copy(self)
        mine.project = _shallow_copy(self.project)
        return mine

    @classmethod
    def _read(cls, digest: str) -> ApiKey | None:
        """The key with `digest` and its project, cached under the keys version read in the
        same statement (so a revocation committed after it bumps past it); None if none."""
        version = KeysVersion.objects.filter(pk=KeysVersion.ONE).values("version")
        found = list(
            cls.objects.select_related("project")
            .annotate(keys_version=Subquery(version))
            .filter(digest=digest)
        )
        if not found:
            return None
        key = found[0]
        if len(_authenticated) >= AUTHENTICATED_MAX:
            _authenticated.clear()
        _authenticated[digest] = (key.keys_version, key)  # type: ignore[attr-defined]
        return key

    def touch(self, now: datetime) -> None:
        """Record the use at most once a minute: this process's last write is the first
        test, the row's time the second, so several processes write a key once a minute."""
        if self.last_used_at is None or now - self.last_used_at >= LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=self.pk).exclude(
                last_used_at__gt=now - LAST_USED_RESOLUTION
            ).update(last_used_at=now)
            self.last_used_at = now

    def revoke(self) -> None:
        ApiKey.objects.filter(pk=self.pk, revoked_at=None).update(revoked_at=timezone.now())


def _shallow_copy[M: models.Model](obj: M) -> M:
    """What `copy.copy` gives (`Model.__getstate__`'s copy: its own state and fields cache),
    without the pickling protocol's cost, on every request."""
    mine = object.__new__(type(obj))
    mine.__dict__.update(obj.__dict__)
    state = object.__new__(ModelState)
    state.__dict__.update(obj._state.__dict__)
    state.fields_cache = dict(obj._state.fields_cache)
    mine._state = state
    return mine


# The keys this process has authenticated, by digest: the keys version each was read under,
# and the key with its project.
_authenticated: dict[str, tuple[int | None, ApiKey]] = {}


class KeysVersion(models.Model):
    """One row, whose version PostgreSQL's triggers bump in the same transaction as any
    change to a key or a project but the use times and the audit heads (revocation,
    deletion, a key moved, a project's policy or redaction set): a process uses its cached
    keys only while the version is the one it read them under.

    The triggers are migration 0015's (SQLite's: `KEYS_VERSION_SQLITE_TRIGGERS`).
    """

    ONE = 1

    id = models.PositiveSmallIntegerField(primary_key=True, default=ONE)
    version = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="keysversion_one_row")]

    def __str__(self) -> str:
        return f"keys version {self.version}"

    # The version now: raw SQL, since compiling the ORM's query would cost more than the read.
    CURRENT = 'SELECT version FROM "durability_keysversion" WHERE id = 1'

    @classmethod
    def current(cls) -> int | None:
        """The version now (None if the row is missing, as after a test's flush)."""
        with connection.cursor() as cursor:
            cursor.execute(cls.CURRENT)
            row = cursor.fetchone()
        return None if row is None else int(row[0])


# SQLite rebuilds a table to alter it, dropping its triggers: these are (re)created after
# every migrate (durability.audit.sqlite_triggers_ensure). Columns are listed, where
# PostgreSQL's compare whole rows.
_BUMP = """BEGIN
    INSERT OR IGNORE INTO durability_keysversion (id, version) VALUES (1, 0);
    UPDATE durability_keysversion SET version = version + 1 WHERE id = 1;
END"""
KEYS_VERSION_SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS durability_apikey_keys_version_update
    AFTER UPDATE OF project_id, name, prefix, digest, created, revoked_at ON durability_apikey
    {_BUMP}""",
    f"""CREATE TRIGGER IF NOT EXISTS durability_apikey_keys_version_delete
    AFTER DELETE ON durability_apikey {_BUMP}""",
    f"""CREATE TRIGGER IF NOT EXISTS durability_project_keys_version_update
    AFTER UPDATE OF name, created, authority_policy, effect_timeout_s, redaction_patterns,
    redaction_keys ON durability_project {_BUMP}""",
    f"""CREATE TRIGGER IF NOT EXISTS durability_project_keys_version_delete
    AFTER DELETE ON durability_project {_BUMP}""",
]
