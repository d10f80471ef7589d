"""The ledger's records: an effect (one key of a project) with its state, replay policy and
authority, its attempts, and the receipts that evidence it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from durability.models.links import row_path
from durability.models.projects import Project


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
        return row_path("effect", self.pk)

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
