"""Redaction of secrets and size caps, applied to span data before anything is stored."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"
# Inputs and outputs (messages, tool arguments and results) keep this many bytes of JSON.
IO_CAP = 64 * 1024
# Each attribute value keeps this many bytes of JSON.
ATTRIBUTE_CAP = 8 * 1024

# Texts holding none of these (case-sensitive, then lowercased) hold no secret we redact:
# they cover every pattern and every secret key name below.
_CASED_MARKERS = (
    "sk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "AKIA",
    "ASIA",
    "xox",
    "AIza",
    "tb_",
    "\\u0000",
    "\x00",
    "NaN",  # json.dumps writes non-finite floats as NaN and Infinity, which jsonb refuses
    "Infinity",
)
_LOWER_MARKERS = ("pass", "pwd", "secret", "token", "auth", "key", "bearer", "cookie", "credential")

# A key names a secret when one of its words is one of these…
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "authorization",
        "apikey",
        "credential",
        "credentials",
        "cookie",
    }
)
# …or its last word is "token" (not "tokens": token counts are not secrets)…
_SECRET_LAST_WORDS = frozenset({"token"})
# …or its last two words are one of these.
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("secret", "key"), ("private", "key"), ("access", "key"), ("auth", "key")}
)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")

# (marker, pattern): a text is searched for a pattern only when it holds the marker;
# running every regex over every text would dominate ingest time.
_TOKENS: list[tuple[str, re.Pattern[str]]] = [
    ("sk-", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),  # OpenAI, Anthropic
    ("gh", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}")),  # GitHub tokens
    ("github_pat_", re.compile(r"\bgithub_pat_\w{20,}")),  # GitHub fine-grained tokens
    ("AKIA", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),  # AWS access key ids
    ("ASIA", re.compile(r"\bASIA[0-9A-Z]{16}\b")),  # AWS temporary key ids
    ("xox", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),  # Slack
    ("AIza", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),  # Google
    ("tb_", re.compile(r"\btb_[A-Za-z0-9_-]{20,}")),  # our own API keys
]
# "Bearer <token>": the label stays, so a reader sees what was removed.
_BEARER = re.compile(r"(?i)(\bbearer\s+)(?!\[REDACTED\])[A-Za-z0-9._~+/=-]{8,}")
# password=…, "api_key": "…", token: … in free text: found by keyword, then matched.
_ASSIGNMENT_KEYWORDS = (
    "password",
    "passwd",
    "secret",
    "api_key",
    "api-key",
    "apikey",
    "token",
    "authorization",
)
_ASSIGNMENT_VALUE = re.compile(
    r"[\"']?\s*[:=]\s*[\"']?(?!\[REDACTED\])(?!(?i:bearer)\b)"
    r"((?:(?i:basic|digest|token|negotiate)\s+)?[^\s\"'&,;]+)"
)


def _assignments(text: str) -> str:
    lowered = text.lower()
    cuts: set[tuple[int, int]] = set()
    for keyword in _ASSIGNMENT_KEYWORDS:
        at = lowered.find(keyword)
        while at != -1:
            if at == 0 or not lowered[at - 1].isalnum():
                match = _ASSIGNMENT_VALUE.match(text, at + len(keyword))
                if match:
                    cuts.add(match.span(1))
            at = lowered.find(keyword, at + 1)
    if not cuts:
        return text
    parts, last = [], 0
    for begin, end in sorted(cuts):
        if begin >= last:
            parts += [text[last:begin], REDACTED]
            last = end
    parts.append(text[last:])
    return "".join(parts)


@lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether a field or attribute named `key` holds a secret (password, api_key, …)."""
    words = [w.lower() for w in _WORD.findall(key)]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words) or words[-1] in _SECRET_LAST_WORDS:
        return True
    return len(words) > 1 and (words[-2], words[-1]) in _SECRET_PAIRS


def scrub_text(text: str) -> str:
    """Known secret patterns replaced, NUL characters (which PostgreSQL refuses) removed."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    for marker, pattern in _TOKENS:
        if marker in text:
            text = pattern.sub(REDACTED, text)
    if "bearer" in text.lower():
        text = _BEARER.sub(rf"\g<1>{REDACTED}", text)
    return _assignments(text)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def redact(value: Any) -> Any:
    """A copy of a JSON value with secrets redacted, by key name and by pattern in text.

    Also makes it storable: NUL characters dropped, non-finite numbers written as text.
    """
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {
            scrub_text(str(k)): (REDACTED if _is_scalar(v) and is_secret_key(str(k)) else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def suspect(text: str) -> bool:
    """Whether a text may hold a secret or a NUL; only such texts are redacted field by field.

    A few substring searches in C are far cheaper than walking every value with regexes.
    """
    for marker in _CASED_MARKERS:
        if marker in text:
            return True
    lowered = text.lower()
    return any(marker in lowered for marker in _LOWER_MARKERS)


def json_text(
    value: Any, limit: int, text: str | None = None, *, checked: bool = False
) -> tuple[str, int | None]:
    """The JSON text to store for `value`: secrets redacted, at most `limit` bytes kept.

    `text` is the value's JSON text when the client sent it as such (stored as sent unless
    it holds a secret), or when the caller has encoded it already; `checked` says that the
    caller found it not `suspect`. Also returns the full size when the value was cut; a
    value cut to size is stored as a string.
    """
    if text is None:
        text = json.dumps(value)
    if not checked and suspect(text):
        value = redact(value)
        text = json.dumps(value)
    size = len(text) if text.isascii() else len(text.encode())
    if size <= limit:
        return text, None
    kept = value if isinstance(value, str) else text
    return json.dumps(kept[:limit]), size


def attributes_text(
    attributes: dict[str, Any], limit: int, text: str | None = None, *, checked: bool = False
) -> tuple[str, dict[str, int]]:
    """The JSON text of attributes, redacted, each value cut to `limit`; the cut sizes.

    `text` and `checked` as for `json_text`.
    """
    if text is None:
        text = json.dumps(attributes)
    if not checked and suspect(text):
        attributes = redact(attributes)
        text = json.dumps(attributes)
    if len(text) <= limit:
        return text, {}  # no single value can be over the limit
    kept, cut = {}, {}
    for key, value in attributes.items():
        value_text = json.dumps(value)
        if len(value_text) > limit:
            kept[key] = (value if isinstance(value, str) else value_text)[:limit]
            cut[key] = len(value_text)
        else:
            kept[key] = value
    return json.dumps(kept), cut
