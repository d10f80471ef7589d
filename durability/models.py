"""The effect ledger: projects and their keys, effects, attempts, receipts, cases, audit."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import uuid
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.core.validators import MinValueValidator
from django.db import IntegrityError, connection, models
from django.db.models import Q, Subquery
from django.db.models.base import ModelState
from django.urls import reverse
from django.utils import timezone
from pydantic import ValidationError as PydanticValidationError

from durability.reconcilers.base import Reconciler, UnknownKind, reconciler_for

API_KEY_PREFIX = "tb_"
# Refresh ApiKey.last_used_at at most this often: it tells people which keys are still in
# use (minutes are enough for that), and a write per request would turn every read of the
# API into a write and queue an agent fleet's requests on their shared key's row lock.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# At most this many keys are cached per process (ApiKey.authenticate); past it, all are
# forgotten at once and read again as they are used.
AUTHENTICATED_MAX = 10_000


class AuthorityPolicy(models.TextChoices):
    """What an intent that names no grant gets (durability.ledger.grant_check).

    Under either audit policy the effect proceeds with no grant, which the authority report
    and the effect page show; only `audit_cases` also opens a case for each such effect.
    """

    AUDIT = "audit", "audit (proceed; the authority report lists each one)"
    AUDIT_CASES = "audit_cases", "audit with cases (proceed, and open a low-severity case for each)"
    ENFORCE = "enforce", "enforce (deny)"


# An hour: longer than any tool call should take, short enough that a crash is in the
# desk the same day. A project sets its own (accounts.members.project_policy_set).
DEFAULT_EFFECT_TIMEOUT_S = 3600
MAX_EFFECT_TIMEOUT_S = 7 * 24 * 3600


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(default=timezone.now)
    # Head of the hash chain of the project's audit entries that name no effect.
    audit_seq = models.PositiveBigIntegerField(default=0, editable=False)
    audit_head = models.CharField(max_length=64, default="0" * 64, editable=False)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    # What an intent that names no grant gets (durability.ledger.grant_check).
    authority_policy = models.CharField(
        max_length=16, choices=AuthorityPolicy.choices, default=AuthorityPolicy.AUDIT
    )
    # The timeout of an effect whose intent declares none: no attempt stays pending without
    # a deadline (the sweep times it out, durability.ledger.evidence.deadlines_sweep).
    effect_timeout_s = models.PositiveIntegerField(default=DEFAULT_EFFECT_TIMEOUT_S)
    # The project's own secrets, redacted on top of the built-in ones (durability.redaction):
    # regular expressions, checked when saved, and field or attribute names.
    redaction_patterns = models.JSONField(default=list, blank=True)
    redaction_keys = models.JSONField(default=list, blank=True)
    # When an operator asked for the project to be deleted (durability.retention.projects):
    # its keys are revoked and its members gone at that moment, and a job deletes its rows.
    deleting = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        permissions = [("manage_project", "Can manage the project's keys, settings and members")]

    def __str__(self) -> str:
        return self.name


# What a write meets when its project's rows are deleted under it (after its key, webhook
# source or membership let it in): a foreign key refused at its commit, or a row it locks
# (a project's or an effect's audit chain head) not found.
GONE_UNDER_A_WRITE = (IntegrityError, ObjectDoesNotExist)


def project_gone(project_id: int) -> bool:
    """Whether the project is deleted or being deleted (durability.retention.projects).
    Asked once a write failed with one of GONE_UNDER_A_WRITE, never before it: the requests
    of a live project pay nothing for it. Not in a transaction that failed without a
    savepoint, which can run no query: there, False."""
    if connection.needs_rollback:
        return False
    return not Project.objects.filter(pk=project_id, deleting=None).exists()


class Role(models.TextChoices):
    """A member's role in one project; each is the Django group holding its permissions."""

    VIEWER = "viewer", "viewer (read)"
    OPERATOR = "operator", "operator (resolve, assign, comment)"
    ADMIN = "admin", "admin (keys, settings, members)"


class MembershipQuerySet(models.QuerySet["Membership"]):
    def live(self) -> MembershipQuerySet:
        """The memberships of projects not being deleted: a project being deleted is no
        one's (durability.retention.projects), whoever was made a member after its mark."""
        return self.filter(project__deleting=None)


class Membership(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        db_index=False,  # membership_uniq leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created = models.DateTimeField(default=timezone.now)
    # Which emails about this project's cases the member receives (durability.notices).
    notify_assigned = models.BooleanField("a case is assigned to me", default=True)
    notify_mentioned = models.BooleanField("a comment mentions me (@name)", default=True)
    notify_overdue = models.BooleanField("a case of mine goes overdue", default=True)

    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_uniq"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Invitation(models.Model):
    """An existing user asked to join a project: they become a member when they accept it,
    through the link emailed to them (durability.accounts.members); until then the project
    holds nothing of theirs and its admins learn nothing about them."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        db_index=False,  # invitation_uniq leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    # Who invited ("user:ada"), for the email and the audit entry of its acceptance.
    actor = models.CharField(max_length=150)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="invitation_uniq"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="invitation_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.project} ({self.role})"


class Preference(models.Model):
    """A user's own settings, the same in every project of theirs."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True, related_name="preference"
    )
    # The zone pages show moments in: a name of the zoneinfo database; blank for the
    # browser's (durability.accounts.timezones).
    time_zone = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.user}'s preferences"

    @staticmethod
    def zone_name_of(user: Any) -> str:
        """The zone name of the user's Preference; blank when they chose none. One query."""
        chosen = Preference.objects.filter(user=user).values_list("time_zone", flat=True)
        return chosen.first() or ""


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone the zoneinfo database knows (read from disk once per process)."""
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str | None) -> zoneinfo.ZoneInfo | None:
    """The zone of that name; None for a blank name or one zoneinfo does not know."""
    return zoneinfo.ZoneInfo(name) if name and name in zone_names() else None


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


class State(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval"
    DENIED = "denied"
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    NOT_HAPPENED = "not_happened"
    COMPENSATED = "compensated"
    ABANDONED = "abandoned"


class Replay(models.TextChoices):
    NEVER = "never", "never (irreversible; only a person may release it)"
    SAFE = "safe", "safe (read-only; repeat freely)"
    IDEMPOTENT = "idempotent", "idempotent (the provider dedupes on our key)"
    RECONCILE = "reconcile", "reconcile (ask the provider before a retry)"


class Decision(models.TextChoices):
    PROCEED = "proceed"
    COMPLETED = "completed"
    WAIT = "wait"
    DENIED = "denied"
    CONFLICT = "conflict"


# An effect that names a run, a trace or a tool call: its trajectory link is due.
EFFECT_NAMES_TRAJECTORY = ~Q(trace_id="") | ~Q(tool_call_id="") | ~Q(run_id="")


# The states an effect may rest in: retention may prune the payloads of effects in them
# (never of one pending, awaiting approval or timed out, whose outcome is still open).
SETTLED_STATES = [
    State.SUCCEEDED,
    State.FAILED,
    State.NOT_HAPPENED,
    State.COMPENSATED,
    State.ABANDONED,
    State.DENIED,
]


# The effect's columns its cases copy: the queue filters on them.
CASE_NAMES = ("kind", "target", "agent", "workflow", "run_id")


class Effect(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="effects",
        db_index=False,  # effect_project_key_uniq leads with it
    )
    key = models.CharField(max_length=255)
    kind = models.CharField(max_length=100)
    target = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=128)
    # SHA-256 of the authority claimed beside the request (kind, target, authority, amount),
    # as sent: a later intent for the key that claims otherwise is a conflict.
    claim = models.CharField(max_length=64, blank=True)
    request = models.JSONField(null=True, blank=True)
    replay = models.CharField(max_length=16, choices=Replay.choices, default=Replay.NEVER)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    # A receipt arrived after the effect had been given up on (timed out or failed).
    late = models.BooleanField(default=False)
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    authority = models.JSONField(null=True, blank=True)
    # The grant version the intent was checked against, whatever the verdict.
    grant = models.ForeignKey(
        "Grant",
        models.PROTECT,
        null=True,
        blank=True,
        related_name="effects",
        db_index=False,  # effect_grant_created_idx has it after the project
        db_constraint=False,  # effect_grant_same_project_fk (migration 0031)
    )
    # The amount the intent asked for, checked against the grant's limits.
    amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    run_id = models.CharField(max_length=255, blank=True)
    tool_call_id = models.CharField(max_length=255, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    # Who made the latest intent, from its context: the agent it names, else its workflow;
    # and the workflow. Copied here so the pages filter and count without reading attempts.
    agent = models.CharField(max_length=255, blank=True)
    workflow = models.CharField(max_length=255, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(default=timezone.now)
    # Head of the effect's audit hash chain, moved under the effect's row lock.
    audit_seq = models.PositiveIntegerField(default=0, editable=False)
    audit_head = models.CharField(max_length=64, default="0" * 64, editable=False)
    # When retention removed the request and the receipts' data (durability.retention), and
    # the archive that held them then, if one did.
    payload_pruned = models.DateTimeField(null=True, blank=True, editable=False)
    payload_archive = models.ForeignKey(
        "Archive",
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
        db_index=False,  # read from the effect; an archive goes only with its project
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "key"], name="effect_project_key_uniq"),
            # What its children's foreign keys name: the project beside the effect, so that
            # the check of a deleted effect reads their project-led indexes (migration 0031).
            # Also the effects page's index: one project's effects, newest first (read
            # backwards), keyset on id.
            models.UniqueConstraint(fields=["project", "id"], name="effect_project_pk_uniq"),
            models.CheckConstraint(condition=Q(state__in=State.values), name="effect_state_valid"),
            models.CheckConstraint(
                condition=Q(replay__in=Replay.values), name="effect_replay_valid"
            ),
        ]
        indexes = [
            # The deadline sweep: pending effects whose deadline has passed.
            models.Index(
                fields=["deadline"],
                name="effect_sweep_pending_idx",
                condition=Q(state="pending", deadline__isnull=False),
            ),
            # The effects page filtered by state.
            models.Index(fields=["project", "state", "-id"], name="effect_project_state_idx"),
            # A new intent of a run: the run's pending effects, for an earlier attempt of the
            # same tool call under another key (durability.ledger.intents).
            models.Index(
                fields=["project", "run_id"],
                name="effect_run_pending_idx",
                condition=Q(state="pending", attempt_count__gt=0),
            ),
            # The authority audit: one project's effects created in a time range.
            models.Index(fields=["project", "created"], name="effect_project_created_idx"),
            # Grant limits: effects under a grant in the last day or count period, summed
            # from the index alone.
            models.Index(
                fields=["project", "grant", "created"],
                include=["state", "amount"],
                name="effect_grant_created_idx",
            ),
            # The link repair pass (trajectories.links.links_repair): recent effects that
            # name a trajectory, newest first.
            models.Index(
                fields=["created"],
                name="effect_link_repair_idx",
                condition=EFFECT_NAMES_TRAJECTORY,
            ),
            # Payload retention (durability.retention): a project's settled effects whose
            # payloads are still kept, by when they last changed, keyset on (updated, id).
            # An effect leaves it once pruned; a pending one is never in it.
            models.Index(
                fields=["project", "updated", "id"],
                name="effect_payload_due_idx",
                condition=Q(state__in=SETTLED_STATES, payload_pruned__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return self.key

    def get_absolute_url(self) -> str:
        return reverse("effect", args=[self.pk])

    def case_names(self) -> dict[str, str]:
        """What a case of this effect copies from it (see Case.kind)."""
        return {name: getattr(self, name) for name in CASE_NAMES}


class Attempt(models.Model):
    # The effect's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # attempt_of_effect_uniq leads with it
    )
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        related_name="attempts",
        db_index=False,  # attempt_of_effect_uniq has it after the project
        db_constraint=False,  # attempt_effect_same_project_fk (migration 0031)
    )
    number = models.PositiveIntegerField()
    started = models.DateTimeField(default=timezone.now)
    deadline = models.DateTimeField(null=True, blank=True)
    # Workflow version, model, code version, tools, memory digest, policy version, extras.
    context = models.JSONField(default=dict, blank=True)
    run_id = models.CharField(max_length=255, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["number"]
        constraints = [
            # One attempt per number; also the index of an effect's attempts, the latest
            # first for an intent (ledger.intents) and the queue's latest attempt.
            models.UniqueConstraint(
                fields=["project", "effect", "number"], name="attempt_of_effect_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect} #{self.number}"


# The system of a receipt that names the model's tool call because its tool declared no
# provider id (the SDK's integrations): it is shown as "no provider id", never as an id.
TOOL_CALL_SYSTEM = "tool-call"


class Strength(models.TextChoices):
    AGENT_REPORTED = "agent_reported"
    PROVIDER_CONFIRMED = "provider_confirmed"
    OPERATOR_ATTESTED = "operator_attested"


class Receipt(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="receipts",
        db_index=False,  # receipt_identity_uniq leads with it
    )
    # Null for an orphan receipt: evidence for a key no intent has named (yet).
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        null=True,
        blank=True,
        related_name="receipts",
        db_index=False,  # receipt_of_effect_idx has it after the project
        db_constraint=False,  # receipt_effect_same_project_fk (migration 0031)
    )
    key = models.CharField(max_length=255)
    system = models.CharField(max_length=100)
    external_id = models.CharField(max_length=255)
    observed_at = models.DateTimeField(null=True, blank=True)
    data = models.JSONField(null=True, blank=True)
    # What the evidence says was moved and where, compared with the effect's grant.
    amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    target = models.CharField(max_length=255, blank=True)
    strength = models.CharField(
        max_length=20, choices=Strength.choices, default=Strength.AGENT_REPORTED
    )
    attempt = models.PositiveIntegerField(null=True, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    late = models.BooleanField(default=False)
    received = models.DateTimeField(default=timezone.now)
    # When retention removed `data` with its effect's payload (Effect.payload_pruned).
    data_pruned = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["received", "id"]
        constraints = [
            # The same receipt sent twice is one receipt.
            models.UniqueConstraint(
                fields=["project", "key", "system", "external_id"], name="receipt_identity_uniq"
            ),
            # What its cases' foreign key names (see effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="receipt_project_pk_uniq"),
            models.CheckConstraint(
                condition=Q(strength__in=Strength.values), name="receipt_strength_valid"
            ),
        ]
        indexes = [
            # An effect's receipts in order: an intent's first receipt, the evidence step's
            # second-receipt check, the authority report's strongest evidence of each row
            # of its page, the effect page.
            models.Index(
                fields=["project", "effect", "received", "id"], name="receipt_of_effect_idx"
            ),
            # Every intent for a new key: the receipts that came before it (orphans, rare),
            # oldest first, found without walking the effect_id index's NULLs.
            models.Index(
                fields=["project", "key", "received", "id"],
                name="receipt_orphans_of_key_idx",
                condition=Q(effect__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        if self.system == TOOL_CALL_SYSTEM:
            return f"no provider id (tool call {self.external_id})"
        return f"{self.system}:{self.external_id}"


class EffectHour(models.Model):
    """The effects created in one hour of a project, counted per state, kind, target, agent
    and grant: what the overview and the authority report count, so that their cost is the
    number of hours shown, not of effects. Written only by `tallies.hours_tally` (a job),
    which replaces an hour's rows whole; the pages count hours it has not reached live."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # effect_hour_uniq leads with it
    )
    hour = models.DateTimeField()
    state = models.CharField(max_length=20, choices=State.choices)
    kind = models.CharField(max_length=100)
    target = models.CharField(max_length=255)
    agent = models.CharField(max_length=255, blank=True)
    grant = models.ForeignKey(
        "Grant", models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    n = models.PositiveIntegerField()
    # Of those, the effects with any receipt, and with a receipt of each strength.
    evidenced = models.PositiveIntegerField()
    agent_reported = models.PositiveIntegerField()
    provider_confirmed = models.PositiveIntegerField()
    operator_attested = models.PositiveIntegerField()
    # Of those, the effects with a case of these reasons: the overview's "problems only"
    # shows them beside the failed states.
    late_success = models.PositiveIntegerField(default=0)
    duplicate_effect = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # One row per hour and group; also the pages' index: a project's hours in a range.
            models.UniqueConstraint(
                fields=["project", "hour", "state", "kind", "target", "agent", "grant"],
                name="effect_hour_uniq",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.state} {self.n}"


class EffectHourMark(models.Model):
    """How far a project's hours are tallied: every hour before `until`, as of the audit
    entries up to `audit_id` (the job looks again from `audit_from`, its previous mark, for
    effects of tallied hours that changed since)."""

    project = models.OneToOneField(Project, models.CASCADE, primary_key=True, related_name="+")
    until = models.DateTimeField()
    audit_id = models.BigIntegerField(default=0)
    audit_from = models.BigIntegerField(default=0)
    tallied = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.project_id} until {self.until:%Y-%m-%d %H}h"


class Reason(models.TextChoices):
    UNCERTAIN = "uncertain"
    LATE_SUCCESS = "late_success"
    DUPLICATE_EFFECT = "duplicate_effect"
    KEY_REUSE_CONFLICT = "key_reuse_conflict"
    ORPHAN_RECEIPT = "orphan_receipt"
    VERSION_DRIFT = "version_drift"
    APPROVAL_REQUIRED = "approval_required"
    AUTHORITY_DENIED = "authority_denied"
    UNAUTHORIZED_EFFECT = "unauthorized_effect"
    AUTHORITY_EXCEEDED = "authority_exceeded"


class Severity(models.IntegerChoices):
    LOW = 1, "low"
    MEDIUM = 2, "medium"
    HIGH = 3, "high"
    CRITICAL = 4, "critical"


class Case(models.Model):
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="cases",
        db_index=False,  # case_reason_opened_idx leads with it
    )
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        null=True,
        blank=True,
        related_name="cases",
        db_index=False,  # case_of_effect_idx has it after the project
        db_constraint=False,  # case_effect_same_project_fk (migration 0031)
    )
    receipt = models.ForeignKey(
        Receipt,
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="cases",
        db_index=False,  # case_of_receipt_idx has it after the project
        db_constraint=False,  # case_receipt_same_project_fk (migration 0031)
    )
    reason = models.CharField(max_length=32, choices=Reason.choices)
    severity = models.PositiveSmallIntegerField(choices=Severity.choices)
    # The effect's kind and target and who made its latest intent (Effect.case_names), kept
    # here so that the queue filters and counts its open cases without reading effects.
    kind = models.CharField(max_length=100, blank=True)
    target = models.CharField(max_length=255, blank=True)
    agent = models.CharField(max_length=255, blank=True)
    workflow = models.CharField(max_length=255, blank=True)
    run_id = models.CharField(max_length=255, blank=True)
    # Its group of similar cases: a digest of what they share (ledger.cases.group_key_of),
    # taken when the case is opened; the grouped queue shows one row per key.
    group_key = models.CharField(max_length=32, blank=True)
    # One sentence a person can read: why the case was opened.
    summary = models.TextField()
    detail = models.JSONField(default=dict, blank=True)
    opened = models.DateTimeField(default=timezone.now)
    closed = models.DateTimeField(null=True, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="cases"
    )
    # Bumped by every change, for compare-and-swap between operators.
    version = models.PositiveIntegerField(default=1)
    # Snoozed (desk.case_actions.case_snooze): out of the default queue from `snoozed_at`
    # until `snoozed_until`, or, with no end, until a newer open case joins its group. Coming
    # back is read from these at query time (desk.queue.snoozed): no job wakes a case.
    snoozed_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "effect", "reason"],
                condition=Q(closed__isnull=True),
                name="case_one_open_per_effect_reason",
            ),
            # What its comments' and notices' foreign keys name (see effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="case_project_pk_uniq"),
        ]
        indexes = [
            # The queue: a project's open cases, oldest first.
            models.Index(
                fields=["project", "opened", "id"],
                name="case_queue_open_idx",
                condition=Q(closed__isnull=True),
            ),
            # The queue sorted by severity (keyset on severity, opened, id).
            models.Index(
                fields=["project", "-severity", "opened", "id"],
                name="case_queue_severity_idx",
                condition=Q(closed__isnull=True),
            ),
            # The queue filtered by reason, and its counts per reason.
            models.Index(
                fields=["project", "reason", "opened", "id"],
                name="case_queue_reason_idx",
                condition=Q(closed__isnull=True),
            ),
            # The grouped queue: a project's open cases per group (counted, first and last
            # seen, the trend), and the cases of one group.
            models.Index(
                fields=["project", "group_key", "opened", "id"],
                name="case_queue_group_idx",
                condition=Q(closed__isnull=True),
                include=["severity"],
            ),
            # The queue's Snoozed view and its count: a project's open cases ever snoozed (the
            # default queue walks case_queue_open_idx and leaves out those still snoozed).
            models.Index(
                fields=["project", "opened", "id"],
                name="case_snoozed_idx",
                condition=Q(closed__isnull=True, snoozed_at__isnull=False),
            ),
            # The overview's last day: cases of a reason opened since, open or closed.
            models.Index(fields=["project", "reason", "opened"], name="case_reason_opened_idx"),
            # The backlog's hours not tallied yet (tallies.case_hours): cases opened since,
            # and cases settled since.
            models.Index(fields=["project", "opened"], name="case_project_opened_idx"),
            models.Index(
                fields=["project", "closed"],
                name="case_project_closed_idx",
                condition=Q(closed__isnull=False),
            ),
            # An effect's cases, open or closed: the effect page, the ledger's open case of
            # a reason, retention's "no open case" test.
            models.Index(fields=["project", "effect", "opened"], name="case_of_effect_idx"),
            # The orphan-receipt case of a receipt, given its effect once an intent names
            # its key (ledger.evidence).
            models.Index(
                fields=["project", "receipt"],
                name="case_of_receipt_idx",
                condition=Q(receipt__isnull=False),
            ),
        ]
        # Granted to the roles' groups (durability.accounts.roles); checked per project membership.
        permissions = [
            ("resolve_case", "Can settle and acknowledge cases"),
            ("assign_case", "Can assign cases"),
            ("comment_case", "Can comment on cases"),
        ]

    def __str__(self) -> str:
        return f"{self.reason} #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("case", args=[self.pk])

    @property
    def is_open(self) -> bool:
        return self.closed is None


class CaseHour(models.Model):
    """The cases of one hour of a project, per reason: how many opened in it, how many were
    settled (closed) in it and how long those took, counted in the buckets of
    `tallies.SETTLE_BOUNDS`. The overview's backlog reads these, so that its cost is the
    hours it shows, not the cases. Written only by `tallies.hours_tally`, an hour whole."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # case_hour_uniq leads with it
    )
    hour = models.DateTimeField()
    reason = models.CharField(max_length=32, choices=Reason.choices)
    opened = models.PositiveIntegerField()
    settled = models.PositiveIntegerField()
    # Of the settled: how many took at most each of tallies.SETTLE_BOUNDS, and more (last).
    took = models.JSONField(default=list)

    class Meta:
        constraints = [
            # One row per hour and reason; also the overview's index: a project's hours.
            models.UniqueConstraint(fields=["project", "hour", "reason"], name="case_hour_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.reason} +{self.opened} -{self.settled}"


ACKNOWLEDGED = "acknowledged"
# Each way a case is closed (`Resolution.action`: a settling event, or what else closed
# it), in words a person says.
CLOSED_AS = {
    "attest_happened": "it happened",
    "probe_found": "it happened (the reconciler found it)",
    "attest_not_happened": "it did not happen",
    "probe_not_found": "it did not happen (the reconciler did not find it)",
    "compensate": "compensated",
    "abandon": "abandoned",
    "approved": "approved",
    "denied": "denied",
    "retried": "retried under its replay policy",
    "auto_resolved": "settled by the evidence that arrived",
}


def closed_status(action: str) -> str:
    """A case's status once closed by `action` (a `Resolution.action`), in words."""
    if action == ACKNOWLEDGED:
        return "Acknowledged"
    return f"Closed: {CLOSED_AS.get(action, action.replace('_', ' '))}"


def actor_named(actor: str) -> str:
    """Who an actor (`user:alice`, `reconciler:http`, `api:tb_1a2b`) is, for a person."""
    kind, _, name = actor.partition(":")
    if kind == "user":
        return name
    if kind == "reconciler":
        return f"the {name} reconciler"
    if kind == "api":
        return f"an agent (key {name})"
    if kind == "webhook":
        return f"the webhook {name}"
    if kind == "system":
        return f"Tallybook ({name})"
    return actor


class Resolution(models.Model):
    """How a case was closed. Immutable."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # read by case only
    )
    case = models.OneToOneField(Case, models.CASCADE, related_name="resolution")
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32)
    note = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.status} by {actor_named(self.actor)}"

    @property
    def status(self) -> str:
        """How the case was closed, in words ("Acknowledged", "Closed: it did not happen")."""
        return closed_status(self.action)


class Comment(models.Model):
    """An operator's note on a case. Immutable, like the rest of the story."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # comment_of_case_idx leads with it
    )
    case = models.ForeignKey(
        Case,
        models.CASCADE,
        related_name="comments",
        db_index=False,  # comment_of_case_idx has it after the project
        db_constraint=False,  # comment_case_same_project_fk (migration 0031)
    )
    actor = models.CharField(max_length=150)
    body = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "id"]
        indexes = [
            # A case's comments, in order.
            models.Index(fields=["project", "case", "created", "id"], name="comment_of_case_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} on {self.case}"


class BulkVerb(models.TextChoices):
    ASSIGN = "assign", "assign"
    NOT_HAPPENED = "not_happened", "resolve as did not happen"
    ACKNOWLEDGE = "acknowledge", "acknowledge"


class BulkAction(models.Model):
    """One action over many cases; its counters are the progress a person watches."""

    project = models.ForeignKey(Project, models.CASCADE, related_name="bulk_actions")
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=16, choices=BulkVerb.choices)
    note = models.TextField(blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The cases the preview counted, fixed when the action was confirmed.
    case_ids = models.JSONField(default=list)
    total = models.PositiveIntegerField()
    done = models.PositiveIntegerField(default=0)
    # Cases already closed, changed or not eligible when their turn came.
    skipped = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.verb} × {self.total} by {self.actor}"


class SavedView(models.Model):
    """A named filter of the queue: its owner's own, or shared with the project's members."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="saved_views",
        db_index=False,  # savedview_one_name_per_owner leads with it
    )
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    name = models.CharField(max_length=80)
    # The queue's filter as QueueQuery.query_string() writes it: only the filter's own fields,
    # validated, so that the view's link leads to the queue and nowhere else.
    query = models.CharField(max_length=1000)
    shared = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "owner", "name"], name="savedview_one_name_per_owner"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return f"{reverse('queue')}?{self.query}"


class AuditAction(models.TextChoices):
    """What an audit entry records: a state machine event, or an audited change of anything else.

    The label is how a case's story names the moment.
    """

    # The state machine's events (durability.ledger.machine.Event), one entry per transition.
    INTENT = "intent", "Intent recorded"
    REQUIRE_APPROVAL = "require_approval", "Require approval"
    REFUSE = "refuse", "Refuse"
    APPROVE = "approve", "Approve"
    DENY = "deny", "Deny"
    RETRY = "retry", "New attempt"
    RECEIPT = "receipt", "Receipt"
    FAILURE = "failure", "Failed: nothing happened"
    TIMEOUT = "timeout", "Timed out"
    DEADLINE = "deadline", "Deadline passed"
    INTERRUPTION = "interruption", "Interrupted"
    PROBE_FOUND = "probe_found", "Reconciler found it"
    PROBE_NOT_FOUND = "probe_not_found", "Reconciler: not found, trusted"
    ATTEST_HAPPENED = "attest_happened", "Operator: it happened"
    ATTEST_NOT_HAPPENED = "attest_not_happened", "Operator: it did not happen"
    COMPENSATE = "compensate", "Compensated"
    ABANDON = "abandon", "Abandoned"
    # The ledger, without a transition.
    ATTEMPT = "attempt", "Attempt"
    RECEIPT_CONFIRMED = "receipt_confirmed", "Receipt confirmed"
    CASE_OPENED = "case_opened", "Case opened"
    CASE_REPEATED = "case_repeated", "Case seen again"
    CASE_CLOSED = "case_closed", "Case closed"
    # The desk.
    CASE_ASSIGNED = "case_assigned", "Assigned"
    CASE_COMMENTED = "case_commented", "Comment"
    CASE_SNOOZED = "case_snoozed", "Snoozed"
    CASE_UNSNOOZED = "case_unsnoozed", "Snooze ended"
    BULK_STARTED = "bulk_started", "Bulk started"
    PROBE = "probe", "Probe"
    # Authority.
    GRANT_CREATED = "grant_created", "Grant created"
    GRANT_SUPERSEDED = "grant_superseded", "Grant superseded"
    GRANT_REVOKED = "grant_revoked", "Grant revoked"
    APPROVAL_SIGNED = "approval_signed", "Approval signed"
    WEBHOOK_SOURCE_CREATED = "webhook_source_created", "Webhook source created"
    WEBHOOK_SOURCE_ENABLED = "webhook_source_enabled", "Webhook source enabled"
    WEBHOOK_SOURCE_DISABLED = "webhook_source_disabled", "Webhook source disabled"
    # Accounts.
    MEMBER_ADDED = "member_added", "Member added"
    MEMBER_ROLE_CHANGED = "member_role_changed", "Member role changed"
    MEMBER_REMOVED = "member_removed", "Member removed"
    MEMBER_INVITED = "member_invited", "Member invited"
    NOTIFICATIONS_SET = "notifications_set", "Notifications set"
    APIKEY_CREATED = "apikey_created", "Apikey created"
    APIKEY_REVOKED = "apikey_revoked", "Apikey revoked"
    AUTHORITY_POLICY_SET = "authority_policy_set", "Authority policy set"
    EFFECT_TIMEOUT_SET = "effect_timeout_set", "Effect timeout set"
    REDACTION_SET = "redaction_set", "Redaction set"
    # Retention (durability.retention).
    RETENTION_SET = "retention_set", "Retention set"
    PAYLOADS_PRUNED = "payloads_pruned", "Payloads pruned"
    ARCHIVE_WRITTEN = "archive_written", "Archive written"
    # Logins (durability.accounts.lockouts): in every project the user is a member of.
    LOGIN_LOCKED_OUT = "login_locked_out", "Login locked out"
    LOGIN_UNLOCKED = "login_unlocked", "Login unlocked"


def action_label(action: str) -> str:
    """An audit action in words; one no longer among the choices still reads as words."""
    if action in AuditAction.values:
        return str(AuditAction(action).label)
    return action.replace("_", " ").capitalize()


class AuditEntry(models.Model):
    """Append-only and hash-chained: each entry hashes the one before it in its chain.

    Entries about an effect chain per effect (appended under the effect's row lock, which
    every state change holds anyway, so projects do not serialise on one chain head);
    entries about no effect chain per project.
    """

    project = models.ForeignKey(
        Project,
        models.PROTECT,
        related_name="audit_entries",
        db_index=False,  # audit_project_recent_idx leads with it
    )
    seq = models.PositiveBigIntegerField()
    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=AuditAction.choices)
    effect = models.ForeignKey(
        Effect,
        models.DO_NOTHING,
        null=True,
        blank=True,
        db_constraint=False,
        related_name="+",
        db_index=False,  # audit_of_effect_uniq has it after the project
    )
    case = models.ForeignKey(
        Case,
        models.DO_NOTHING,
        null=True,
        blank=True,
        db_constraint=False,
        related_name="+",
        db_index=False,  # audit_of_case_recent_idx has it after the project
    )
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20, blank=True)
    data = models.JSONField(default=dict, blank=True)
    # SHA-256 of `data`'s canonical JSON, which the hash covers in place of `data` itself, so
    # that retention may empty `data` and the chain still verifies (durability.audit).
    # Empty for an entry hashed over its whole data, before digests: it cannot be pruned.
    data_digest = models.CharField(max_length=64, blank=True, default="", editable=False)
    # When retention emptied `data` through the one path the database lets through
    # (durability_audit_prune, migration 0023); its digest still stands for it.
    pruned = models.DateTimeField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["id"]
        constraints = [
            # An effect's chain: one entry per seq; also the index of its entries in order
            # (the effect page's story, verifyaudit, retention's chain head).
            models.UniqueConstraint(
                fields=["project", "effect", "seq"],
                condition=Q(effect__isnull=False),
                name="audit_of_effect_uniq",
            ),
            models.UniqueConstraint(
                fields=["project", "seq"],
                condition=Q(effect__isnull=True),
                name="audit_project_seq_uniq",
            ),
        ]
        indexes = [
            # The audit log page: newest first, keyset on id (seq counts within one chain).
            models.Index(fields=["project", "-id"], name="audit_project_recent_idx"),
            # The audit log page filtered by user, newest first.
            models.Index(fields=["project", "actor", "-id"], name="audit_project_actor_idx"),
            # The audit log page filtered by action, newest first.
            models.Index(fields=["project", "action", "-id"], name="audit_project_action_idx"),
            # A case's latest entry (the case page's "closed by").
            models.Index(
                fields=["project", "case", "-id"],
                name="audit_of_case_recent_idx",
                condition=Q(case__isnull=False),
            ),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.project} #{self.pk} {self.action}"


class ReconcilerConfig(models.Model):
    """How to ask one target system whether an effect happened (docs/reconcilers.md)."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="reconcilers",
        db_index=False,  # reconciler_project_target_uniq leads with it
    )
    target = models.CharField(
        max_length=255, help_text="The target system of the effects this reconciler answers for."
    )
    kind = models.CharField(max_length=50, help_text="A registered reconciler: http or git.")
    config = models.JSONField(
        default=dict, blank=True, help_text="The reconciler's settings (docs/reconcilers.md)."
    )
    grace_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Trust not_found once this many seconds have passed since the attempt's "
        "deadline or timeout; empty: never, absence is only evidence for an operator.",
    )
    interval_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(10)],
        help_text="Least time between two scheduled probes of one effect.",
    )
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # One reconciler per target; its index serves the look-up of a target's reconciler.
            models.UniqueConstraint(
                fields=["project", "target"], name="reconciler_project_target_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} reconciler for {self.target}"

    def clean(self) -> None:
        try:
            self.reconciler()
        except UnknownKind as exc:
            raise ValidationError({"kind": str(exc)}) from exc
        except PydanticValidationError as exc:
            messages = [
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            ]
            raise ValidationError({"config": messages}) from exc

    def reconciler(self) -> Reconciler[Any]:
        """The configured reconciler; raises UnknownKind or pydantic's ValidationError."""
        return reconciler_for(self.kind, self.config)


class ProbeAnswer(models.TextChoices):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"


class Probe(models.Model):
    """One question put to an external system about one attempt at an effect, and its answer."""

    # The effect's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # probe_of_effect_recent_idx leads with it
    )
    effect = models.ForeignKey(
        Effect,
        models.CASCADE,
        related_name="probes",
        db_index=False,  # probe_of_effect_recent_idx has it after the project
        db_constraint=False,  # probe_effect_same_project_fk (migration 0031)
    )
    config = models.ForeignKey(
        ReconcilerConfig, models.SET_NULL, null=True, blank=True, related_name="probes"
    )
    kind = models.CharField(max_length=50)
    # The effect's attempt the probe asked about; a later attempt is a new question.
    attempt = models.PositiveIntegerField()
    # "system:scan" for the schedule, "user:<username>" for an operator's "probe now".
    requested_by = models.CharField(max_length=150)
    started = models.DateTimeField()
    finished = models.DateTimeField()
    answer = models.CharField(max_length=16, choices=ProbeAnswer.choices)
    # One sentence: what was asked and what came back.
    detail = models.TextField(blank=True)
    # For `found`: the system, external id, observed_at and data it was shown.
    evidence = models.JSONField(null=True, blank=True)
    # The event the answer applied to the effect, or blank when it only informs.
    settled = models.CharField(max_length=32, blank=True)
    receipt = models.ForeignKey(
        Receipt,
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="probes",
        db_index=False,  # read from the probe; a receipt goes only with its project
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(answer__in=ProbeAnswer.values), name="probe_answer_valid"
            ),
        ]
        indexes = [
            # The case page's probe history, and the scan's "probed lately?" check.
            models.Index(
                fields=["project", "effect", "-started"], name="probe_of_effect_recent_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} probe of {self.effect_id}: {self.answer}"

    @property
    def took_s(self) -> float:
        return (self.finished - self.started).total_seconds()

    @property
    def observed_at(self) -> datetime | None:
        """When the system says the effect happened: the evidence's ISO 8601 text as an aware
        moment; None when absent or unreadable, so that no stored value fails a page."""
        evidence = self.evidence if isinstance(self.evidence, dict) else {}
        value = evidence.get("observed_at")
        if not isinstance(value, str):
            return None
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


class CaseAlert(models.Model):
    """A case that reached its reason's alert threshold; `sent` once the webhook took it."""

    # The case's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # read by case only
    )
    case = models.OneToOneField(Case, models.CASCADE, related_name="alert")
    created = models.DateTimeField(default=timezone.now)
    sent = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"alert for case {self.case_id}"


class NoticeKind(models.TextChoices):
    ASSIGNED = "assigned", "assigned to you"
    ASSIGNED_MANY = "assigned_many", "assigned cases to you"
    MENTIONED = "mentioned", "mentioned you"
    OVERDUE = "overdue", "overdue"
    INVITED = "invited", "invited you"
    # An existing user asked to join a project: the email carries the link to accept.
    JOIN = "join", "invited you to join"


class Notice(models.Model):
    """An email to one person, written in the transaction of what caused it and sent by a
    job after the commit (durability.notices); `sent` once the mail server took it."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="notices",
        db_index=False,  # notice_of_case_idx leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="notices")
    kind = models.CharField(max_length=16, choices=NoticeKind.choices)
    case = models.ForeignKey(
        Case,
        models.CASCADE,
        null=True,
        blank=True,
        related_name="notices",
        db_index=False,  # notice_of_case_idx has it after the project
        db_constraint=False,  # notice_case_same_project_fk (migration 0031)
    )
    # Cases, comments and bulk actions go only with their project: nothing reads notices by
    # these.
    comment = models.ForeignKey(
        Comment, models.CASCADE, null=True, blank=True, related_name="notices", db_index=False
    )
    # The bulk assignment an `assigned_many` notice sums up, in one email for all its cases.
    bulk = models.ForeignKey(
        BulkAction, models.CASCADE, null=True, blank=True, related_name="notices", db_index=False
    )
    # Who caused it ("user:ada"); empty for the scheduler (overdue).
    actor = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(default=timezone.now)
    sent = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            # The overdue scan's marker: a case is announced overdue once, however often
            # (and however many schedulers at once) the scan runs.
            models.UniqueConstraint(
                fields=["project", "case"], condition=Q(kind="overdue"), name="notice_overdue_once"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["invited", "join"])
                | Q(kind="assigned_many", bulk__isnull=False)
                | Q(case__isnull=False),
                name="notice_case_named",
            ),
        ]
        indexes = [
            # The scheduled pass: emails not sent yet, oldest first.
            models.Index(fields=["created"], name="notice_unsent_idx", condition=Q(sent=None)),
            # A case's notices.
            models.Index(
                fields=["project", "case"],
                name="notice_of_case_idx",
                condition=Q(case__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.user_id}"


class Grant(models.Model):
    """Authority: which agents or workflows may perform which effects where, within which
    limits, until when, and whether a person must approve each one first.

    Never edited in place: a change is a new version that supersedes this one. Every
    version of a grant shares its `lineage`, and the limits count effects across versions.
    """

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="grants",
        db_index=False,  # grant_project_pk_uniq leads with it
    )
    lineage = models.UUIDField(default=uuid.uuid4, editable=False)
    version = models.PositiveIntegerField(default=1)
    supersedes = models.OneToOneField(
        "self", models.PROTECT, null=True, blank=True, related_name="superseded_by"
    )
    name = models.CharField(max_length=100)
    # fnmatch patterns, matched case-sensitively.
    principal = models.CharField(
        max_length=255,
        default="*",
        help_text="The agent or workflow allowed (context.agent or context.workflow), a pattern.",
    )
    kinds = models.JSONField(default=list, help_text="Effect kinds allowed, as patterns.")
    targets = models.JSONField(default=list, help_text="Target systems allowed, as patterns.")
    currency = models.CharField(max_length=3, blank=True)
    max_amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    # Over the last 24 hours, a rolling window: no reset at midnight to race.
    max_daily_amount = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    max_count = models.PositiveIntegerField(null=True, blank=True)
    count_period_s = models.PositiveIntegerField(null=True, blank=True)
    requires_approval = models.BooleanField(default=False)
    # Amounts above this need a second approver, a different person from the first.
    second_approval_above = models.DecimalField(
        max_digits=20, decimal_places=6, null=True, blank=True
    )
    expires = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    granted_by = models.CharField(max_length=150)
    created = models.DateTimeField(default=timezone.now)
    superseded_at = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            # What its effects' foreign key names (see Effect's effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="grant_project_pk_uniq"),
            # Also the look-up of a lineage's versions.
            models.UniqueConstraint(
                fields=["lineage", "version"], name="grant_lineage_version_uniq"
            ),
            # An intent naming any version is checked against the one current version.
            models.UniqueConstraint(
                fields=["lineage"],
                condition=Q(superseded_at__isnull=True),
                name="grant_one_current_per_lineage",
            ),
            models.CheckConstraint(
                condition=Q(
                    max_amount__isnull=True,
                    max_daily_amount__isnull=True,
                    second_approval_above__isnull=True,
                )
                | ~Q(currency=""),
                name="grant_amounts_have_currency",
            ),
            models.CheckConstraint(
                condition=Q(max_count__isnull=True, count_period_s__isnull=True)
                | Q(max_count__isnull=False, count_period_s__isnull=False),
                name="grant_count_has_period",
            ),
            models.CheckConstraint(
                condition=Q(second_approval_above__isnull=True) | Q(requires_approval=True),
                name="grant_second_approval_needs_approval",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (grant {self.pk} v{self.version})"

    def get_absolute_url(self) -> str:
        return reverse("grant", args=[self.pk])

    def status(self, now: datetime | None = None) -> str:
        if self.revoked:
            return "revoked"
        if self.superseded_at:
            return "superseded"
        if self.expires and self.expires <= (now or timezone.now()):
            return "expired"
        return "live"


class ApprovalStatus(models.TextChoices):
    OPEN = "open"
    APPROVED = "approved"
    DENIED = "denied"
    # The effect stopped awaiting it without a signature (decided through the state machine
    # directly): nothing left to sign.
    CLOSED = "closed"


class Approval(models.Model):
    """The go-ahead an effect waits for: one person's, or two people's above the grant's
    threshold."""

    project = models.ForeignKey(Project, models.CASCADE, related_name="approvals")
    effect = models.OneToOneField(Effect, models.CASCADE, related_name="approval")
    grant = models.ForeignKey(Grant, models.PROTECT, related_name="approvals")
    needed = models.PositiveSmallIntegerField(default=1)
    # The asking intent's context: no attempt exists until the effect is approved.
    context = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=8, choices=ApprovalStatus.choices, default=ApprovalStatus.OPEN
    )
    created = models.DateTimeField(default=timezone.now)
    decided = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(needed__in=[1, 2]), name="approval_needed_1_or_2"),
            models.CheckConstraint(
                condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"
            ),
        ]
        indexes = [
            # The approvals inbox: a project's open approvals, oldest first.
            models.Index(
                fields=["project", "created", "id"],
                name="approval_inbox_idx",
                condition=Q(status="open"),
            ),
            # The inbox's "recently decided" list.
            models.Index(
                fields=["project", "-decided"],
                name="approval_decided_idx",
                condition=~Q(status="open"),
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} of {self.effect_id} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("approval", args=[self.pk])

    @property
    def closed_why(self) -> str:
        """Why a closed approval takes no signature, in the words its pages and 409 use."""
        return f"the effect was settled without it (it is now {self.effect.state})"


class SignoffVerdict(models.TextChoices):
    APPROVE = "approve"
    DENY = "deny"


class Signoff(models.Model):
    """One person's verdict on an approval. Immutable; one per person per approval."""

    approval = models.ForeignKey(
        Approval,
        models.CASCADE,
        related_name="signoffs",
        db_index=False,  # signoff_one_per_person leads with it
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=8, choices=SignoffVerdict.choices)
    reason = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "id"]
        constraints = [
            # Two approvals must come from two people.
            models.UniqueConstraint(fields=["approval", "user"], name="signoff_one_per_person"),
            models.CheckConstraint(
                condition=Q(verdict__in=SignoffVerdict.values), name="signoff_verdict_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.user_id}"


class WebhookKind(models.TextChoices):
    GENERIC = "generic", "generic JSON"
    GITHUB = "github", "GitHub push"


class WebhookSource(models.Model):
    """A provider that posts signed evidence to /hooks/<name>/ (docs/webhooks.md)."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="webhook_sources",
        db_index=False,  # webhooksource_project_pk_uniq leads with it
    )
    # Unique over all projects: the URL names the source, and the source its project.
    name = models.SlugField(max_length=50, unique=True)
    kind = models.CharField(max_length=8, choices=WebhookKind.choices)
    system = models.CharField(max_length=100, help_text="The system its receipts come from.")
    # Kept as given: verifying an HMAC needs the key itself, not a digest of it.
    secret = models.CharField(max_length=200)
    mapping = models.JSONField(
        default=dict, blank=True, help_text="Where the payload holds each field."
    )
    tolerance_s = models.PositiveIntegerField(
        default=300, help_text="How far the signed timestamp may be from now, in seconds."
    )
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # What its deliveries' foreign key names (see Effect's effect_project_pk_uniq).
            models.UniqueConstraint(fields=["project", "id"], name="webhooksource_project_pk_uniq"),
            models.CheckConstraint(
                condition=Q(kind__in=WebhookKind.values), name="webhook_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class WebhookDelivery(models.Model):
    """A verified delivery, recorded once: the same delivery id, or the same signed bytes
    under another id, again changes nothing."""

    # The source's project, copied so that the table is distributed by project with it.
    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="+",
        db_index=False,  # webhook_delivery_once_uniq leads with it
    )
    source = models.ForeignKey(
        WebhookSource,
        models.CASCADE,
        related_name="deliveries",
        db_index=False,  # webhook_delivery_once_uniq has it after the project
        db_constraint=False,  # webhookdelivery_source_same_project_fk (migration 0031)
    )
    delivery_id = models.CharField(max_length=255)
    # SHA-256 of the bytes the signature covers. The delivery id is not signed: a captured
    # delivery sent again under a new id is known by this. Deliveries received before it
    # was kept have "".
    signed_digest = models.CharField(max_length=64, default="", editable=False)
    received = models.DateTimeField(default=timezone.now)
    receipts = models.PositiveIntegerField(default=0)
    # Items of the payload that named no effect key (e.g. commits without the trailer).
    ignored = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "source", "delivery_id"], name="webhook_delivery_once_uniq"
            ),
            models.UniqueConstraint(
                fields=["project", "source", "signed_digest"],
                condition=~Q(signed_digest=""),
                name="webhook_delivery_signed_once_uniq",
            ),
        ]
        indexes = [
            # The source page: its latest deliveries.
            models.Index(
                fields=["project", "source", "-received"], name="webhook_delivery_recent_idx"
            ),
        ]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.source_id}:{self.delivery_id}"


class RetentionPolicy(models.Model):
    """How long a project keeps what retention may remove (durability.retention); a project
    without a row keeps the environment's defaults (`RetentionPolicy.of`).

    Never removed whatever the policy: effects with their fingerprints and keys (so an
    effect's key deduplicates for as long as the effect row exists), receipts with their
    external ids, cases, and the audit chain.
    """

    project = models.OneToOneField(
        Project, models.CASCADE, primary_key=True, related_name="retention"
    )
    # Runs and their spans, after this many days (trajectories' retention).
    span_days = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    # The request and receipt data of settled effects, this many days after they last
    # changed; None: kept for ever.
    payload_days = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    # Prune no payload that no archive (`Archive`) holds.
    require_archive = models.BooleanField(default=False)
    updated = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "retention policies"
        constraints = [
            models.CheckConstraint(condition=Q(span_days__gte=1), name="retention_span_days_min"),
            models.CheckConstraint(
                condition=Q(payload_days__isnull=True) | Q(payload_days__gte=1),
                name="retention_payload_days_min",
            ),
        ]

    def __str__(self) -> str:
        return f"retention of {self.project_id}"

    @classmethod
    def of(cls, project: Project) -> RetentionPolicy:
        """The project's policy: its row, or an unsaved one with the environment's defaults."""
        found = cls.objects.filter(project=project).first()
        if found is not None:
            return found
        return cls(
            project=project,
            span_days=settings.TALLYBOOK_SPAN_RETENTION_DAYS,
            payload_days=settings.TALLYBOOK_PAYLOAD_RETENTION_DAYS,
            require_archive=settings.TALLYBOOK_RETENTION_REQUIRE_ARCHIVE,
        )


ARCHIVE_MARGIN = timedelta(minutes=1)


class Archive(models.Model):
    """An archive `manage.py archive` wrote: what it holds, by the SHA-256 of its content,
    which its `archive_written` audit entry records too (durability.retention.archive)."""

    project = models.ForeignKey(
        Project,
        models.CASCADE,
        related_name="archives",
        db_index=False,  # archive_project_recent_idx and archive_sha256_uniq lead with it
    )
    # Every effect of the project last changed before this, with its story, and the runs
    # started before it with their spans.
    before = models.DateTimeField()
    created = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    # Where it was written, for people; the file may have moved since.
    path = models.CharField(max_length=1000)
    sha256 = models.CharField(max_length=64)
    effects = models.PositiveIntegerField(default=0)
    entries = models.PositiveIntegerField(default=0)
    runs = models.PositiveIntegerField(default=0)
    spans = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "sha256"], name="archive_sha256_uniq"),
        ]
        indexes = [
            # Retention's "which archive covers this?": the project's latest.
            models.Index(fields=["project", "-created"], name="archive_project_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"archive of {self.project_id} before {self.before:%Y-%m-%d}"

    @property
    def covers_until(self) -> datetime:
        """An effect whose story (its latest audit entry) ended before this is in the archive
        whole. An entry's time is taken just before its transaction commits, so an archive
        vouches only for stories that ended a minute before it began."""
        return min(self.before, self.created - ARCHIVE_MARGIN)
