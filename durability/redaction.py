"""Redaction of secrets and size caps: the one step every entrance's data passes before
anything is stored or hashed (ledger fields, events, spans, webhooks).

A project may add its own patterns and key names (`Extras`, from `Project.redaction_*`).
Free text and JSON values get `[REDACTED]`; identities (keys, external ids, run ids) get
`[REDACTED:<digest>]` instead, a keyed digest of the secret, so that two identities that
differ only in a secret stay two and the same one is found again.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, cast, get_args

import re2
from django.utils.crypto import salted_hmac
from pydantic import BaseModel
from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from durability.models import Project

# A compiled project pattern (google-re2's class is generic only in its stubs).
type Pattern = re2._Regexp[str]

logger = logging.getLogger(__name__)

REDACTED = "[REDACTED]"
# A project's own configuration stays small: it runs over every text of every ingest.
MAX_PATTERNS = 20
MAX_PATTERN_LENGTH = 200
MAX_KEY_NAMES = 50
MAX_KEY_NAME_LENGTH = 100
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

# A token starts after anything but a letter or digit: "re_ghp_…" and "key_sk-…" hold one,
# "task-…" does not (\b would miss the first two, "_" being a word character).
_START = r"(?<![A-Za-z0-9])"
# The built-in patterns stay on Python's re (they need lookbehinds) because each runs in
# linear time: a literal prefix, then one repeat of one character class, with no repeat
# nested in or alternated with another, so a failed match backtracks over one run at most
# (_START and \b look at one character). _BEARER is the same; _ASSIGNMENT_VALUE is only
# matched at a keyword's end (one optional quote, two runs of spaces, one run of value).
# (marker, pattern): a text is searched for a pattern only when it holds the marker;
# running every regex over every text would dominate ingest time.
_TOKENS: list[tuple[str, re.Pattern[str]]] = [
    ("sk-", re.compile(_START + r"sk-[A-Za-z0-9_-]{16,}")),  # OpenAI, Anthropic
    ("gh", re.compile(_START + r"gh[pousr]_[A-Za-z0-9]{30,}")),  # GitHub tokens
    ("github_pat_", re.compile(_START + r"github_pat_\w{20,}")),  # GitHub fine-grained tokens
    ("AKIA", re.compile(_START + r"AKIA[0-9A-Z]{16}\b")),  # AWS access key ids
    ("ASIA", re.compile(_START + r"ASIA[0-9A-Z]{16}\b")),  # AWS temporary key ids
    ("xox", re.compile(_START + r"xox[abposr]-[A-Za-z0-9-]{10,}")),  # Slack
    ("AIza", re.compile(_START + r"AIza[0-9A-Za-z_-]{35}")),  # Google
    ("tb_", re.compile(_START + r"tb_[A-Za-z0-9_-]{20,}")),  # our own API keys
]
# "Bearer <token>": the label stays, so a reader sees what was removed.
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})")
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
    r"[\"']?\s*[:=]\s*[\"']?(?!\[REDACTED[\]:])(?!(?i:bearer)\b)"
    r"((?:(?i:basic|digest|token|negotiate)\s+)?[^\s\"'&,;]+)"
)


@dataclass(frozen=True)
class Extras:
    """A project's own secrets: patterns (compiled) and key names (lowercased)."""

    patterns: tuple[Pattern, ...] = ()
    keys: frozenset[str] = field(default_factory=frozenset)


NONE = Extras()


class BadPattern(ValueError):
    """A project's pattern that cannot be used, with the reason."""


# Project patterns run on RE2, whose time is linear in the text whatever the pattern, with
# this much memory for its automata (past it, RE2 falls back to its slower NFA, still
# linear). Python's re backtracks: (a|a)+b takes exponential time on "aaa…", holding the GIL.
PATTERN_MAX_MEM = 8 << 20
# The text one project pattern scans at once. RE2's time is linear, so every text a request
# can carry is scanned whole, in one pass: the API takes bodies up to 1 MiB and Django's
# forms 4 MiB (DATA_UPLOAD_MAX_MEMORY_SIZE), so one text of up to 4 Mi characters. Only a
# longer text (none arrives in one request) is scanned in windows of this many characters
# that overlap by PATTERN_OVERLAP: there a match longer than PATTERN_OVERLAP across a
# window's edge is found only if it also matches within one window, so such a text is
# redacted only for secrets shorter than PATTERN_OVERLAP (docs/security.md).
PATTERN_WINDOW = 4 * 1024 * 1024
PATTERN_OVERLAP = 64 * 1024
# RE2's errors name the construct it cannot run; these say what it is.
_UNSUPPORTED = (
    ("(?=", "a lookahead (?=…)"),
    ("(?!", "a negative lookahead (?!…)"),
    ("(?<=", "a lookbehind (?<=…)"),
    ("(?<!", "a negative lookbehind (?<!…)"),
    ("(?>", "an atomic group (?>…)"),
)
_BACKREFERENCE = re.compile(r"invalid escape sequence: \\[1-9]")


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = PATTERN_MAX_MEM
    options.log_errors = False  # a refusal is the admin's answer, not the server's log
    return options


def pattern_check(pattern: str) -> Pattern:
    """The pattern compiled by RE2, or BadPattern: too long, empty-matching, or not a
    regular expression RE2 can run (lookarounds and backreferences, which only a
    backtracking engine has), with the construct named."""
    if not pattern:
        raise BadPattern("empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise BadPattern(f"over {MAX_PATTERN_LENGTH} characters")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as exc:
        raise BadPattern(_refusal(exc)) from exc
    if compiled.search("") is not None:
        raise BadPattern("matches the empty text, so it would redact everything")
    return compiled


def _refusal(exc: re2.error) -> str:
    detail = exc.args[0] if exc.args else ""
    if isinstance(detail, bytes):
        detail = detail.decode(errors="replace")
    named = "a backreference" if _BACKREFERENCE.search(detail) else ""
    for construct, what in _UNSUPPORTED:
        if detail.endswith(construct):
            named = what
    if named:
        return f"{named} is not supported (patterns run on RE2, in linear time): {detail}"
    return f"not a regular expression RE2 can run: {detail}"


def _spans(pattern: Pattern, text: str) -> Iterator[tuple[int, int]]:
    """Where a project pattern matches, window by window (PATTERN_WINDOW)."""
    if len(text) <= PATTERN_WINDOW:
        for match in pattern.finditer(text):
            yield match.span()
        return
    start = 0
    while start < len(text):
        window = text[start : start + PATTERN_WINDOW]
        for match in pattern.finditer(window):
            begin, end = match.span()
            yield start + begin, start + end
        if start + PATTERN_WINDOW >= len(text):
            return
        start += PATTERN_WINDOW - PATTERN_OVERLAP


def _found(pattern: Pattern, text: str) -> bool:
    return next(_spans(pattern, text), None) is not None


def _replace(pattern: Pattern, text: str, mark: Callable[[str], str]) -> str:
    """Each match of a project pattern replaced by its mark (matches that overlap, from two
    windows, as one)."""
    merged: list[list[int]] = []
    for begin, end in sorted(_spans(pattern, text)):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    if not merged:
        return text
    parts, last = [], 0
    for begin, end in merged:
        parts += [text[last:begin], mark(text[begin:end])]
        last = end
    parts.append(text[last:])
    return "".join(parts)


@lru_cache(maxsize=256)
def extras_from(patterns: tuple[str, ...], keys: tuple[str, ...]) -> Extras:
    """Extras from stored configuration (checked when saved on the settings page).

    A stored pattern that fails the check anyway (written around the page) is left out
    and logged: ingest must not fail on what the database holds.
    """
    if not patterns and not keys:
        return NONE
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(pattern_check(pattern))
        except BadPattern as exc:
            logger.error("redaction pattern %r left out: %s", pattern, exc)
    return Extras(tuple(compiled), frozenset(k.lower() for k in keys))


def extras_of(project: Project | None) -> Extras:
    """The project's own patterns and key names; compiled once per configuration."""
    if project is None:
        return NONE

    def texts(stored: Any) -> tuple[str, ...]:
        return tuple(t for t in stored if isinstance(t, str)) if isinstance(stored, list) else ()

    return extras_from(texts(project.redaction_patterns), texts(project.redaction_keys))


def _mark_plain(secret: str) -> str:
    return REDACTED


# The digest of a secret in an identity: 16 hex digits (64 bits), never cut, so that
# identities that differ only in a short secret stay apart.
DIGEST_SIZE = 16
# An identity whose marks would not fit its column becomes one mark for the whole text.
WHOLE_DIGEST_SIZE = 32
# The longest identity column (keys, external ids, run ids, event and delivery ids).
IDENTITY_MAX = 255
# A mark as written, whether of one secret or of a whole identity: never searched again.
_MARK = re.compile(r"\[REDACTED(?::[0-9a-f]+)?\]")


def _digest(salt: str, text: str, size: int) -> str:
    # Keyed by SECRET_KEY, so that the digest of a short or guessable secret cannot be
    # looked up, and every process of one deployment writes the same mark.
    return salted_hmac(salt, text, algorithm="sha256").hexdigest()[:size]


def _mark_distinct(secret: str) -> str:
    return f"[REDACTED:{_digest('tallybook.redaction', secret, DIGEST_SIZE)}]"


def _assignments(text: str, mark: Callable[[str], str]) -> str:
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
            parts += [text[last:begin], mark(text[begin:end])]
            last = end
    parts.append(text[last:])
    return "".join(parts)


@lru_cache(maxsize=4096)
def _is_secret_name(key: str) -> bool:
    words = [w.lower() for w in _WORD.findall(key)]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words) or words[-1] in _SECRET_LAST_WORDS:
        return True
    return len(words) > 1 and (words[-2], words[-1]) in _SECRET_PAIRS


def is_secret_key(key: str, extras: Extras = NONE) -> bool:
    """Whether a field or attribute named `key` holds a secret (password, api_key, or one
    of the project's own key names)."""
    return _is_secret_name(key) or (bool(extras.keys) and key.lower() in extras.keys)


def _scrub(text: str, extras: Extras, mark: Callable[[str], str]) -> str:
    if "\x00" in text:
        text = text.replace("\x00", "")
    for marker, pattern in _TOKENS:
        if marker in text:
            text = pattern.sub(lambda m: mark(m.group()), text)
    if "bearer" in text.lower():
        text = _BEARER.sub(lambda m: m.group(1) + mark(m.group(2)), text)
    for own in extras.patterns:
        text = _replace(own, text, mark)
    return _assignments(text, mark)


def scrub_text(text: str, extras: Extras = NONE) -> str:
    """Known secret patterns replaced, NUL characters (which PostgreSQL refuses) removed."""
    if not suspect(text, extras):  # what `_scrub` finds, `suspect` finds first, cheaper
        return text
    return _scrub(text, extras, _mark_plain)


def distinct(text: str, extras: Extras = NONE, limit: int | None = IDENTITY_MAX) -> str:
    """An identity (key, external id, run id…) with each secret in it replaced by its keyed
    digest: the same identity always gives the same text, different ones stay different,
    and the text it gives is its own result (marks already in it are left as they are).

    When the marks make it longer than `limit` (its column's size; None for no limit), the
    whole identity is replaced by one mark, the keyed digest of the whole text.
    """
    if not suspect(text, extras):
        return text
    parts = _MARK.split(text)
    marks = _MARK.findall(text)
    scrubbed = "".join(
        _scrub(part, extras, _mark_distinct) + (marks[i] if i < len(marks) else "")
        for i, part in enumerate(parts)
    )
    if scrubbed == text or limit is None or len(scrubbed) <= limit:
        return scrubbed
    return f"[REDACTED:{_digest('tallybook.redaction.whole', text, WHOLE_DIGEST_SIZE)}]"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def redact(value: Any, extras: Extras = NONE) -> Any:
    """A copy of a JSON value with secrets redacted, by key name and by pattern in text.

    Also makes it storable: NUL characters dropped, non-finite numbers written as text.
    """
    if isinstance(value, str):
        return scrub_text(value, extras)
    if isinstance(value, dict):
        return {
            scrub_text(str(k), extras): (
                REDACTED if _is_scalar(v) and is_secret_key(str(k), extras) else redact(v, extras)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v, extras) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _redacted(name: str, value: Any, extras: Extras, limit: int | None) -> Any:
    """One field of an input, named `name`, redacted (`redact_input`); `limit`: its texts'
    declared length."""
    if isinstance(value, str):
        if is_secret_key(name, extras):
            return REDACTED
        return distinct(value, extras, limit)
    if type(value) in (dict, list):
        # A JSON value's field name is the schema's or one scrubbed below: only its
        # content is redacted.
        return value if _nothing_to_redact(value, extras) else redact(value, extras)
    if _is_scalar(value) and is_secret_key(name, extras):
        return REDACTED
    return redact(value, extras)


def redact_input[M: BaseModel | DataclassInstance](model: M, extras: Extras = NONE) -> M:
    """A copy of a validated input (a pydantic model, or a command: a dataclass) with no
    secret left in any field.

    Its own text fields are identities or short reports (a key, an external id, an error)
    and get `distinct`, within the field's declared length (its column's: a model's
    constraints, a command field's `max_length` metadata); JSON values (a request, a
    receipt's data) get `redact`; nested inputs the same, recursively, and the names of
    their free extra fields too (a command's mapping field with `keys` metadata, the named
    keys' lengths, has only free extra fields beside those). Not validated again: redaction
    keeps texts within their declared length, or replaces values with text where any JSON
    was allowed.
    """
    if not isinstance(model, BaseModel):
        return cast(M, _command_redacted(model, extras))
    schema = type(model)

    def redacted(name: str, value: Any) -> Any:
        if isinstance(value, BaseModel):
            return redact_input(value, extras)
        return _redacted(name, value, extras, _max_length(schema, name))

    values = {name: redacted(name, value) for name, value in model.__dict__.items()}
    for name, value in (model.model_extra or {}).items():
        values[scrub_text(name, extras)] = redacted(name, value)
    return cast(M, model.model_construct(_fields_set=model.model_fields_set, **values))


def _command_redacted(command: DataclassInstance, extras: Extras) -> DataclassInstance:
    values: dict[str, Any] = {}
    for name, keys, limit in _command_fields(type(command)):
        value = getattr(command, name)
        # A nested command: an instance of a dataclass (`is_dataclass`, but not a class).
        if hasattr(type(value), "__dataclass_fields__"):
            values[name] = _command_redacted(value, extras)
        elif keys is not None and isinstance(value, Mapping):
            values[name] = {
                (key if key in keys else scrub_text(key, extras)): _redacted(
                    key, item, extras, keys.get(key)
                )
                for key, item in value.items()
            }
        else:
            values[name] = _redacted(name=name, value=value, extras=extras, limit=limit)
    return replace(command, **values)


@cache
def _command_fields(
    command: type[DataclassInstance],
) -> tuple[tuple[str, Mapping[str, int] | None, int | None], ...]:
    """A command's fields as `_command_redacted` reads them: each one's name, its `keys`
    metadata and its `max_length`; read once per command class, not on every input (the
    commands are a handful of classes)."""
    return tuple(
        (each.name, each.metadata.get("keys"), each.metadata.get("max_length"))
        for each in fields(command)
    )


def _nothing_to_redact(value: dict[str, Any] | list[Any], extras: Extras) -> bool:
    """Whether `redact` would leave a JSON object or array as it is: its text holds none of
    the markers that every secret pattern and key name needs (`suspect`), checked in one
    search of its JSON instead of a walk over every text in it. Not with the project's own
    patterns, which may anchor on a whole value."""
    if extras.patterns:
        return False
    try:
        # Escapes are no hiding place: a NUL is written \u0000, a marker of its own.
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not plain JSON: walk it
        return False
    return not suspect(text, extras)


# Bounded: the names of an input's free extra fields are the client's to choose.
@lru_cache(maxsize=1024)
def _max_length(schema: type[BaseModel], name: str) -> int | None:
    """The longest text a field of `schema` allows (`max_length` of its constraints), if any;
    read once per field, not on every input."""
    field = schema.model_fields.get(name)
    if field is None:
        return None
    found: list[int] = []

    def walk(items: Iterable[Any]) -> None:
        for item in items:
            length = getattr(item, "max_length", None)  # StringConstraints, MaxLen
            if isinstance(length, int):
                found.append(length)
            if isinstance(item, FieldInfo):
                walk(item.metadata)
            walk(get_args(item))

    walk([*field.metadata, field.annotation])
    return min(found, default=None)


def suspect(text: str, extras: Extras = NONE) -> bool:
    """Whether a text may hold a secret or a NUL; only such texts are redacted field by field.

    A few substring searches in C are far cheaper than walking every value with regexes.
    """
    # Plain loops: a generator's frame per call would cost more than most of these searches.
    for marker in _CASED_MARKERS:
        if marker in text:
            return True
    lowered = text.lower()
    for marker in _LOWER_MARKERS:
        if marker in lowered:
            return True
    if extras.keys and any(key in lowered for key in extras.keys):
        return True
    return any(_found(pattern, text) for pattern in extras.patterns)


def json_text(
    value: Any,
    limit: int,
    text: str | None = None,
    *,
    checked: bool = False,
    extras: Extras = NONE,
) -> tuple[str, int | None]:
    """The JSON text to store for `value`: secrets redacted, at most `limit` bytes kept.

    `text` is the value's JSON text when the client sent it as such (stored as sent unless
    it holds a secret), or when the caller has encoded it already; `checked` says that the
    caller found it not `suspect`. Also returns the full size when the value was cut; a
    value cut to size is stored as a string.
    """
    if text is None:
        text = json.dumps(value)
    if not checked and suspect(text, extras):
        value = redact(value, extras)
        text = json.dumps(value)
    size = len(text) if text.isascii() else len(text.encode())
    if size <= limit:
        return text, None
    kept = value if isinstance(value, str) else text
    return json.dumps(kept[:limit]), size


def attributes_text(
    attributes: dict[str, Any],
    limit: int,
    text: str | None = None,
    *,
    checked: bool = False,
    extras: Extras = NONE,
) -> tuple[str, dict[str, int]]:
    """The JSON text of attributes, redacted, each value cut to `limit`; the cut sizes.

    `text` and `checked` as for `json_text`.
    """
    if text is None:
        text = json.dumps(attributes)
    if not checked and suspect(text, extras):
        attributes = redact(attributes, extras)
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
