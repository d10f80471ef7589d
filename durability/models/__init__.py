"""Every model of the app, under its one label `durability` (so moving a model between these
modules needs no migration), one module per domain; import them from here.

- `projects`: projects, memberships and roles, invitations, preferences
- `keys`: API keys and the keys version that validates their cache
- `effects`: effects, attempts, receipts, and their states
- `cases`: cases, resolutions, comments, bulk actions, saved views
- `audit`: audit actions and the hash-chained entries
- `authority`: grants, approvals and sign-offs, webhook sources and deliveries
- `reconcilers`: reconciler configurations, probes, the plug-in look-up by kind
- `notices`: case alerts and emails to people
- `tallies`: the tallied hours of effects and cases
- `retention`: retention policies and archives

The models import Django and each other only, never a room of durability/: the one place
they reach a plug-in, `reconciler_class`, imports it when first asked, by the dotted path
settings.TALLYBOOK_RECONCILERS gives its kind.
"""

from __future__ import annotations

from durability.models.audit import (
    AuditAction,
    AuditEntry,
    action_label,
)
from durability.models.authority import (
    Approval,
    ApprovalStatus,
    Grant,
    Signoff,
    SignoffVerdict,
    WebhookDelivery,
    WebhookKind,
    WebhookSource,
)
from durability.models.cases import (
    ACKNOWLEDGED,
    CLOSED_AS,
    BulkAction,
    BulkVerb,
    Case,
    Comment,
    Reason,
    Resolution,
    SavedView,
    Severity,
    actor_named,
    closed_status,
)
from durability.models.effects import (
    CASE_NAMES,
    EFFECT_NAMES_TRAJECTORY,
    SETTLED_STATES,
    TOOL_CALL_SYSTEM,
    Attempt,
    Decision,
    Effect,
    Receipt,
    Replay,
    State,
    Strength,
)
from durability.models.keys import (
    API_KEY_PREFIX,
    AUTHENTICATED_MAX,
    KEYS_VERSION_SQLITE_TRIGGERS,
    LAST_USED_RESOLUTION,
    ApiKey,
    KeysVersion,
)
from durability.models.notices import (
    CaseAlert,
    Notice,
    NoticeKind,
)
from durability.models.projects import (
    DEFAULT_EFFECT_TIMEOUT_S,
    GONE_UNDER_A_WRITE,
    MAX_EFFECT_TIMEOUT_S,
    AuthorityPolicy,
    Invitation,
    Membership,
    MembershipQuerySet,
    Preference,
    Project,
    Role,
    project_gone,
    zone_named,
    zone_names,
)
from durability.models.reconcilers import (
    Probe,
    ProbeAnswer,
    ReconcilerConfig,
    UnknownKind,
    reconciler_class,
)
from durability.models.retention import (
    ARCHIVE_MARGIN,
    Archive,
    RetentionPolicy,
)
from durability.models.tallies import (
    CaseHour,
    EffectHour,
    EffectHourMark,
)

__all__ = [
    "ACKNOWLEDGED",
    "API_KEY_PREFIX",
    "ARCHIVE_MARGIN",
    "AUTHENTICATED_MAX",
    "ApiKey",
    "Approval",
    "ApprovalStatus",
    "Archive",
    "Attempt",
    "AuditAction",
    "AuditEntry",
    "AuthorityPolicy",
    "BulkAction",
    "BulkVerb",
    "CASE_NAMES",
    "CLOSED_AS",
    "Case",
    "CaseAlert",
    "CaseHour",
    "Comment",
    "DEFAULT_EFFECT_TIMEOUT_S",
    "Decision",
    "EFFECT_NAMES_TRAJECTORY",
    "Effect",
    "EffectHour",
    "EffectHourMark",
    "GONE_UNDER_A_WRITE",
    "Grant",
    "Invitation",
    "KEYS_VERSION_SQLITE_TRIGGERS",
    "KeysVersion",
    "LAST_USED_RESOLUTION",
    "MAX_EFFECT_TIMEOUT_S",
    "Membership",
    "MembershipQuerySet",
    "Notice",
    "NoticeKind",
    "Preference",
    "Probe",
    "ProbeAnswer",
    "Project",
    "Reason",
    "Receipt",
    "ReconcilerConfig",
    "Replay",
    "Resolution",
    "RetentionPolicy",
    "Role",
    "SETTLED_STATES",
    "SavedView",
    "Severity",
    "Signoff",
    "SignoffVerdict",
    "State",
    "Strength",
    "UnknownKind",
    "TOOL_CALL_SYSTEM",
    "WebhookDelivery",
    "WebhookKind",
    "WebhookSource",
    "action_label",
    "actor_named",
    "closed_status",
    "project_gone",
    "reconciler_class",
    "zone_named",
    "zone_names",
]
