"""The HTTP reconciler: GET a URL built from the effect and read the answer from the JSON."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from django.conf import settings
from pydantic import AfterValidator, Field, StringConstraints, model_validator

from durability import inbound
from durability.reconcilers import destinations
from durability.reconcilers.base import (
    Answer,
    Found,
    NotFound,
    ProbeConfig,
    Reconciler,
    Unknown,
    template_check,
    template_fill,
)

if TYPE_CHECKING:
    from durability.models import Effect

Path = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Template = Annotated[
    str, StringConstraints(min_length=1, max_length=2000), AfterValidator(template_check)
]
MAX_BODY = 1024 * 1024


def _url(template: str) -> str:
    if not template.startswith(("http://", "https://")):
        raise ValueError("the URL must start with http:// or https://")
    return destinations.authority_check(template_check(template))


# The environment variables a configuration may read: the server's own (SECRET_KEY,
# DATABASE_URL, ...) are not a project admin's to send to a URL of their choosing.
SECRET_ENV_PREFIX = "TALLYBOOK_SECRET_"


def _auth_env(name: str | None) -> str | None:
    allowed = settings.TALLYBOOK_RECONCILER_SECRET_ENV
    if name is None or name.startswith(SECRET_ENV_PREFIX) or name in allowed:
        return name
    listed = f" or one of {', '.join(allowed)}" if allowed else ""
    raise ValueError(
        f"{name} is not a reconciler's secret: name a variable starting {SECRET_ENV_PREFIX}"
        f"{listed} (TALLYBOOK_RECONCILER_SECRET_ENV lists others)"
    )


class HttpConfig(ProbeConfig):
    url: Annotated[Template, AfterValidator(_url)] = Field(
        description="URL template, e.g. https://api.example.com/refunds?key={key} or "
        "…/orders/{request[order_id]}; every value is percent-encoded."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    auth_header: str = "Authorization"
    auth_env: Annotated[str | None, AfterValidator(_auth_env)] = Field(
        default=None,
        description="Name of the environment variable holding the auth header's whole value "
        f"(e.g. 'Bearer sk_…'): {SECRET_ENV_PREFIX}… or one listed in "
        "TALLYBOOK_RECONCILER_SECRET_ENV; the secret itself is never stored.",
    )
    external_id_path: Path = Field(
        description="Where the external id is in the JSON reply, dotted: data.0.id"
    )
    status_path: Path | None = Field(
        default=None, description="Where the status is in the JSON reply; none: not checked."
    )
    found: list[str] = Field(
        default_factory=list, description="Status values that mean the effect happened."
    )
    not_found: list[str] = Field(
        default_factory=list, description="Status values that mean it did not."
    )
    not_found_http: list[int] = Field(
        default_factory=lambda: [404], description="HTTP statuses that mean it did not."
    )
    absent_means_not_found: bool = Field(
        default=False,
        description="A 2xx reply without the external id (an empty search) means not found; "
        "otherwise such a reply is unknown.",
    )
    observed_at_path: Path | None = Field(
        default=None, description="The external timestamp: ISO 8601 or Unix seconds."
    )
    system: str | None = Field(default=None, description="Receipt system; default: the target.")
    timeout_s: Annotated[float, Field(gt=0, le=120)] = 10.0

    @model_validator(mode="after")
    def _statuses(self) -> HttpConfig:
        if self.status_path and not self.found:
            raise ValueError("status_path needs the status values that mean found")
        return self


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the auth header to wherever it points: answer unknown instead.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Pinned(http.client.HTTPConnection):
    """A connection to the address that was checked (`pinned`), whatever its host resolves
    to now; the host stays the request's Host header."""

    pinned = ""

    def connect(self) -> None:
        host, self.host = self.host, self.pinned or self.host
        try:
            super().connect()
        finally:
            self.host = host


class _PinnedTls(http.client.HTTPSConnection, _Pinned):
    """HTTPS to the checked address: HTTPSConnection.connect() wraps the socket _Pinned
    opened for the host's name (its SNI, and the name its certificate must hold)."""


class _PinnedHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """Replaces urllib's HTTP and HTTPS handlers: each connection goes to `pinned`."""

    def __init__(self, pinned: str) -> None:
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self)
        self.pinned = pinned
        self.tls = ssl.create_default_context()

    def _connection[T: _Pinned](self, cls: type[T]) -> Callable[..., T]:
        def connection(host: str, **kwargs: Any) -> T:
            made = cls(host, **kwargs)
            made.pinned = self.pinned
            return made

        return connection

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection(_Pinned), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._connection(_PinnedTls), req, context=self.tls)


def _opener(url: str, timeout: float) -> urllib.request.OpenerDirector:
    """An opener that reaches the URL's host at its one checked address, through no proxy
    and following no redirect; raises destinations.Refused."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise destinations.Refused("the URL has no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    pinned = destinations.resolve(parts.hostname, port, timeout)
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _NoRedirects, _PinnedHandler(pinned)
    )


class HttpReconciler(Reconciler[HttpConfig]):
    kind = "http"
    Config = HttpConfig

    def probe(self, effect: Effect) -> Answer:
        c = self.config
        try:
            url = template_fill(c.url, effect, escape=True)
        except (KeyError, IndexError, TypeError) as exc:
            return Unknown(f"the URL template names {exc} which this effect's request lacks")
        headers = {"Accept": "application/json", **c.headers}
        if c.auth_env:
            secret = os.environ.get(c.auth_env)
            if not secret:
                return Unknown(f"environment variable {c.auth_env} is not set")
            headers[c.auth_header] = secret
        request = urllib.request.Request(url, headers=headers, method="GET")
        try:
            opener = _opener(url, c.timeout_s)
        except (destinations.Refused, ValueError) as exc:
            return Unknown(f"GET {url} refused: {exc}")
        try:
            with opener.open(request, timeout=c.timeout_s) as response:
                status, body = response.status, response.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            status, body = exc.code, b""
            exc.close()
        except (OSError, ValueError) as exc:  # refused, DNS, TLS, timeout, a bad URL
            return Unknown(f"GET {url} failed: {exc}")
        if status in c.not_found_http:
            return NotFound(f"GET {url} answered HTTP {status}")
        if not 200 <= status < 300:
            return Unknown(f"GET {url} answered HTTP {status}")
        if len(body) > MAX_BODY:
            return Unknown(f"GET {url} answered more than {MAX_BODY} bytes")
        try:
            document = inbound.json_loads(body)
        except ValueError as exc:
            return Unknown(f"GET {url} answered HTTP {status} with a body that is not JSON: {exc}")
        return self._read(effect, url, status, document)

    def _read(self, effect: Effect, url: str, status: int, document: Any) -> Answer:
        c = self.config
        external_id = inbound.json_path(document, c.external_id_path)
        if external_id == "":
            external_id = None
        value = inbound.json_path(document, c.status_path) if c.status_path else None
        if external_id is None and value is None:
            # Nothing matched: an empty search, or a reply of another shape.
            why = f"GET {url} answered HTTP {status} without {c.external_id_path}"
            return NotFound(why) if c.absent_means_not_found else Unknown(why)
        evidence: dict[str, Any] = {"url": url, "http_status": status}
        if c.status_path:
            shown = "missing" if value is None else json.dumps(value)
            if value is not None and str(value) in c.not_found:
                return NotFound(f"GET {url}: {c.status_path} is {shown}")
            if value is None or str(value) not in c.found:
                return Unknown(f"GET {url}: {c.status_path} is {shown}, not a configured status")
            evidence["status"] = value
        if external_id is None:
            return Unknown(f"GET {url}: {c.status_path} says found, without {c.external_id_path}")
        observed = inbound.json_path(document, c.observed_at_path) if c.observed_at_path else None
        try:
            observed_at = inbound.provider_time(observed)
        except ValueError as exc:
            return Unknown(f"GET {url}: {c.observed_at_path} is {json.dumps(observed)[:60]}: {exc}")
        return Found(
            system=c.system or effect.target,
            external_id=str(external_id)[:255],
            observed_at=observed_at,
            data=evidence,
        )
