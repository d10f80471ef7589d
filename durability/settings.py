"""Tallybook settings, read from the environment through small typed helpers."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import dj_database_url
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def redis_url_bounded(url: str) -> str:
    """`url` with bounded connect and command waits, unless it sets its own.

    A web process enqueues after its commit: a Redis host that has gone away (packets
    dropped, not refused) must not hold the request for the kernel's connect timeout. The
    worker raises the command timeout above its blocking dequeue by itself.
    """
    # Split by hand: urlunsplit would write unix:///path (a Unix socket) as unix:/path,
    # which redis-py refuses.
    address, _, given = url.partition("?")
    query = dict(parse_qsl(given))
    query.setdefault("socket_connect_timeout", "2")
    query.setdefault("socket_timeout", "5")
    return f"{address}?{urlencode(query)}"


DEBUG = env_bool("DEBUG", False)
# Django's "insecure" prefix makes `check --deploy` refuse the default in production.
SECRET_KEY = env_str(
    "SECRET_KEY", "django-insecure-tallybook-development-key-change-me-in-production"
)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
# Where people reach the desk. Unset, links in API answers use the address each request
# came to (durability/site.py), and background work (alerts) this default.
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000").rstrip("/")
SITE_URL_CONFIGURED = bool(os.environ.get("SITE_URL"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_rq",
    "axes",
    "durability",
    "trajectories",
]

MIDDLEWARE = [
    # Outermost: it turns the HTML errors of every layer below into JSON for the API's paths.
    "durability.api.middleware.JsonErrors",
    # Before anything reads the scheme: a proxy's header only from a trusted proxy.
    "durability.site.ProxyHeaders",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "durability.site.RequestOrigin",
    # The API's, OTLP's and the webhooks' paths go from here to their view: what lies
    # between is the pages' own middleware, which has nothing to do for a machine.
    "durability.api.middleware.MachinesBypass",
    # Page reads from the read replica, when there is one (durability/replica.py).
    "durability.replica.ReplicaReads",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "durability.accounts.timezones.OperatorTimeZone",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "durability.accounts.access.NoProjectMiddleware",
    # Last of the pages', as django-axes asks: it turns a refused login into the locked-out page.
    "axes.middleware.AxesMiddleware",
    "durability.api.middleware.MachinesRejoin",
]

ROOT_URLCONF = "durability.urls"
WSGI_APPLICATION = "durability.wsgi.application"

TEMPLATES: list[dict[str, Any]] = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
            ],
        },
    },
]

# SQLite in the project folder by default, so the demo starts on a bare machine;
# PostgreSQL (psycopg 3) in production and in the tests.
# No health check (a `SELECT 1` before the first query of every request on a reused
# connection): a connection that died with a PostgreSQL restart fails its one request, which
# the API answers 503 with Retry-After, and Django drops it at the request's end.
DATABASES = {
    "default": dj_database_url.parse(
        # Unset or empty (`DATABASE_URL= bin/demo`): the demo's SQLite file.
        env_str("DATABASE_URL").strip() or f"sqlite:///{BASE_DIR / 'tallybook.sqlite3'}",
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
    )
}
# The ledger's statements (durability.pipeline) are prepared on their connection once they
# ran this many times: its few shapes of statement skip PostgreSQL's parse and plan. `off`
# (behind a transaction-pooling PgBouncer older than 1.21): never prepared (the ledger's
# statements go unnamed, which such a PgBouncer passes), and Django's client-side binding.
# psycopg prepares nothing of its own: after a rollback it would deallocate every statement
# of the connection, the ledger's too.
_prepare_after = env_str("DB_PREPARE_THRESHOLD", "2").strip().lower()
DB_PREPARE_AFTER = None if _prepare_after == "off" else int(_prepare_after)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    if DB_PREPARE_AFTER is not None:
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True, prepare_threshold=None
        )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Wait for the writer lock instead of failing at once, and take it up front.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    # Covering indexes (the grant limits' INCLUDE columns) speed up PostgreSQL; SQLite builds
    # them without the included columns, which is all the demo needs. The hourly tallies'
    # unique key counts NULL grants as equal on PostgreSQL (NULLS NOT DISTINCT); SQLite has no
    # such key, and needs none: its one writer replaces an hour's rows whole.
    SILENCED_SYSTEM_CHECKS = ["models.W040", "models.W047"]

# A PostgreSQL streaming replica for the read-only pages (durability/replica.py): writes,
# the API's answers, jobs and commands use the primary. After a browser's write its reads stay
# on the primary for TALLYBOOK_REPLICA_PIN_SECONDS, longer than the replica's usual lag.
if env_str("DATABASE_REPLICA_URL"):
    DATABASES["replica"] = {
        **dj_database_url.parse(
            env_str("DATABASE_REPLICA_URL"), conn_max_age=env_int("DB_CONN_MAX_AGE", 60)
        ),
        "OPTIONS": dict(DATABASES["default"].get("OPTIONS", {})),
        # Tests that set the variable get no database of its own: it mirrors the primary's.
        "TEST": {"MIRROR": "default"},
    }
    DATABASE_ROUTERS = ["durability.replica.PrimaryOrReplica"]
TALLYBOOK_REPLICA_PIN_SECONDS = env_int("TALLYBOOK_REPLICA_PIN_SECONDS", 10)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Without REDIS_URL background work runs inline, after the transaction commits.
REDIS_URL = env_str("REDIS_URL")
RQ_QUEUES = {
    "default": {
        "URL": redis_url_bounded(REDIS_URL or "redis://127.0.0.1:6379/0"),
        "DEFAULT_TIMEOUT": 300,
    }
}

# Reconciler plug-ins by kind: the dotted path of each class, imported when first used.
TALLYBOOK_RECONCILERS = {
    "http": "durability.reconcilers.http_probe.HttpReconciler",
    "git": "durability.reconcilers.git_probe.GitReconciler",
}
# Project admins configure reconcilers, and agents' data fills their templates: neither may
# make the server read its own secrets or reach inside its network (docs/security.md).
# An http reconciler's auth_env names TALLYBOOK_SECRET_… variables, or one listed here.
TALLYBOOK_RECONCILER_SECRET_ENV = env_list("TALLYBOOK_RECONCILER_SECRET_ENV", [])
# Networks (CIDR) a reconciler may reach although they are loopback, private, link-local or
# otherwise not public; none by default. The demo's fake provider needs 127.0.0.0/8.
TALLYBOOK_RECONCILER_ALLOWED_NETWORKS = env_list("TALLYBOOK_RECONCILER_ALLOWED_NETWORKS", [])
# Directories under which a git reconciler may read a local repository (a path or a file:
# URL, symlinks resolved, no .. segment); none by default, so no local repository is read.
# The demo lists its own folder.
TALLYBOOK_RECONCILER_GIT_ROOTS = env_list("TALLYBOOK_RECONCILER_GIT_ROOTS", [])
# Reconciler probes that answer `unknown` are retried after these many seconds, in turn.
TALLYBOOK_PROBE_RETRY_DELAYS = [
    int(seconds) for seconds in env_list("TALLYBOOK_PROBE_RETRY_DELAYS", ["30", "120", "600"])
]

# Open cases older than their reason's threshold (seconds) post once to this webhook
# (Slack-compatible JSON); no URL, no alerts. TALLYBOOK_ALERT_AFTER_<REASON> overrides one.
# Low-severity cases (version drift, ungranted effects under the audit policy) never alert.
TALLYBOOK_ALERT_WEBHOOK_URL = env_str("TALLYBOOK_ALERT_WEBHOOK_URL")
TALLYBOOK_ALERT_AFTER = {
    reason: env_int(f"TALLYBOOK_ALERT_AFTER_{reason.upper()}", default)
    for reason, default in {
        "duplicate_effect": 5 * 60,
        "unauthorized_effect": 5 * 60,
        "authority_exceeded": 5 * 60,
        "uncertain": 60 * 60,
        "key_reuse_conflict": 60 * 60,
        "orphan_receipt": 60 * 60,
        "approval_required": 30 * 60,
        "late_success": 4 * 60 * 60,
        "authority_denied": 4 * 60 * 60,
        "version_drift": 24 * 60 * 60,  # applies when a drift case is raised above low
    }.items()
}

# Email to people about their cases (durability/notices.py): through SMTP when EMAIL_HOST
# is set, otherwise printed on the console (the demo needs no mail server); EMAIL_BACKEND
# names another backend. Sent by jobs after the commit: a mail server that is down or slow
# never holds or fails an operator's action.
_email_host = env_str("EMAIL_HOST")
_email_port = env_int("EMAIL_PORT", 587)
MAILERS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": env_str(
            "EMAIL_BACKEND",
            "django.core.mail.backends.smtp.EmailBackend"
            if _email_host
            else "django.core.mail.backends.console.EmailBackend",
        ),
        "OPTIONS": {
            "host": _email_host,
            "port": _email_port,
            "username": env_str("EMAIL_HOST_USER"),
            "password": env_str("EMAIL_HOST_PASSWORD"),
            "use_tls": env_bool("EMAIL_USE_TLS", _email_port == 587),
            "use_ssl": env_bool("EMAIL_USE_SSL", _email_port == 465),
            "timeout": env_int("EMAIL_TIMEOUT", 10),
        }
        if _email_host
        else {},
    }
}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Tallybook <tallybook@localhost>")
# An email that failed is tried again by the scheduled pass, at most this many times in all.
TALLYBOOK_NOTICE_TRIES = env_int("TALLYBOOK_NOTICE_TRIES", 5)
# A one-time set-password link (an invitation) works this long: Django's reset tokens.
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT", 3 * 24 * 60 * 60)

# Large OTLP batches (trajectories.otlp.LARGE_BODY) one web process works on at once; one more
# is answered 429 with Retry-After. 0: no such limit.
TALLYBOOK_INGEST_LARGE_PER_PROCESS = env_int("TALLYBOOK_INGEST_LARGE_PER_PROCESS", 1)

# Span partitions, a UTC day each, are created this many days ahead and dropped whole once
# wholly older than every project's span retention (trajectories.retention; the default
# retention is TALLYBOOK_SPAN_RETENTION_DAYS below).
TALLYBOOK_SPAN_PARTITIONS_AHEAD = env_int("TALLYBOOK_SPAN_PARTITIONS_AHEAD", 7)

# Bulk actions on more cases than this run as a background job with a progress bar.
TALLYBOOK_BULK_INLINE = env_int("TALLYBOOK_BULK_INLINE", 200)

# Retention (durability.retention): the defaults of a project that set no policy of its own
# on its settings page. Runs and spans after N days; the request and receipt data of settled
# effects M days after they last changed (unset: never); whether to prune only what an
# archive (`manage.py archive`) holds. Effects, receipts' external ids, cases and the audit
# chain are never removed.
TALLYBOOK_SPAN_RETENTION_DAYS = env_int("TALLYBOOK_SPAN_RETENTION_DAYS", 30)
TALLYBOOK_PAYLOAD_RETENTION_DAYS: int | None = (
    env_int("TALLYBOOK_PAYLOAD_RETENTION_DAYS", 0) or None
)
TALLYBOOK_RETENTION_REQUIRE_ARCHIVE = env_bool("TALLYBOOK_RETENTION_REQUIRE_ARCHIVE")
# Archives write the runs and spans through these (dotted paths, imported when used), so
# the retention room needs no import of trajectories.
TALLYBOOK_ARCHIVE_SECTIONS = ["trajectories.archive.runs_archived"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# django-axes first: a locked-out login is refused before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Failed logins are counted in PostgreSQL: every web process sees the same counts, and Redis
# stays off the login path. A username is locked at one address after LOGIN_FAILURE_LIMIT
# failures from there within the cool-off; everywhere only after LOGIN_USER_FAILURE_LIMIT
# failures spread over any addresses, so a distributed guess is stopped too, but one
# attacker cannot keep an operator locked out from everywhere. Never by address alone, so
# colleagues behind one office address do not lock one another out. Axes has one limit, so
# the handler (accounts/lockouts.py) counts the username alone only once it reached its own.
# A lockout ends LOGIN_COOLOFF_MINUTES after the last counted failure, or when an admin
# unlocks the user (settings page, admin, `manage.py axes_reset_username`).
AXES_HANDLER = "durability.accounts.lockouts.LoginFailures"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username"]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10)
LOGIN_USER_FAILURE_LIMIT = max(env_int("LOGIN_USER_FAILURE_LIMIT", 100), AXES_FAILURE_LIMIT)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_COOLOFF_MINUTES", 30))
AXES_RESET_ON_SUCCESS = True
# Attempts refused during a lockout are not counted: the lockout ends on time however hard
# it is hammered, and the attempt rows do not grow.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_TEMPLATE = "durability/accounts/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "durability.accounts.lockouts.client_address"
AXES_USERNAME_CALLABLE = "durability.accounts.lockouts.attempt_username"
# Behind a proxy, the header in which it appends the address it saw (e.g. X-Forwarded-For);
# unset, the address of the connection. Read only as far as TRUSTED_PROXIES say.
LOGIN_CLIENT_ADDRESS_HEADER = env_str("LOGIN_CLIENT_ADDRESS_HEADER")
# Failed attempts are kept (with the cool-off) but no per-login access log grows forever.
AXES_DISABLE_ACCESS_LOG = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "index"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
WHITENOISE_USE_FINDERS = True

# Ingest bodies are capped per endpoint by the API; this is the outer bound.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
# With DEBUG off, HTTPS only, as served behind a TLS-terminating proxy that sets
# X-Forwarded-Proto (SECURE_PROXY_SSL_HEADER names another header, or none when Django
# terminates TLS itself). Each can be turned off by its variable for a plain-HTTP start on
# 127.0.0.1 (the tests do; `bin/demo` runs with DEBUG on).
_proxy_ssl_header = env_str("SECURE_PROXY_SSL_HEADER", "" if DEBUG else "X-Forwarded-Proto")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
# The proxies in front of Tallybook (docs/security.md): the addresses or networks (CIDR)
# a proxy connects from, or, when those are not known in advance, how many proxies every
# request passes (the app then must not be reachable but through them). The scheme
# (SECURE_PROXY_SSL_HEADER) is believed only from a connection of TRUSTED_PROXIES, and the
# client's address (LOGIN_CLIENT_ADDRESS_HEADER) is the last one those proxies did not add.
# With neither set, both headers are believed from anyone, and `check --deploy` warns.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
TRUSTED_PROXY_HOPS = env_int("TRUSTED_PROXY_HOPS", 0)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# A year, as the HSTS preload list asks; the preload directive is only consent to be listed.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 60 * 60)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

# Every record goes to stderr once, through the root logger's handler: Django's own
# "django" logger (a console handler of its own under DEBUG) only passes records up, or
# the web server's log (.demo/server.log) would show each line twice.
LOG_LEVEL = env_str("LOG_LEVEL", "WARNING")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": [], "level": LOG_LEVEL, "propagate": True}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}

# Static files are served from the finders until `collectstatic` has filled STATIC_ROOT.
warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
