"""What a project keeps and for how long (`RetentionPolicy`), and the archives written before
its payloads are pruned (durability.retention)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from durability.models.projects import Project


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
