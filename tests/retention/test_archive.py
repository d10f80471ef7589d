"""Archives: what retention would remove, written before it is removed, and verified
against the audit chains it came from; "require an archive first" prunes only what one
holds."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from durability.audit import data_digest, entry_hash, first_broken_entry
from durability.models import Archive, AuditAction, AuditEntry, Effect
from durability.retention import services
from durability.retention.archive import archive_verify, archive_write, entry_of
from tests.retention.support import later, policy, succeeded
from trajectories.models import Run, Span


def _archive(project, tmp_path, name="a.jsonl.gz"):
    """An archive of everything so far, written a few minutes from now (so that it covers
    the stories that just ended)."""
    return archive_write(
        project=project,
        before=later(days=1),
        out=tmp_path / name,
        actor="test:archivist",
        now=timezone.now() + timedelta(minutes=5),
    )


def _records(path):
    with gzip.open(path, "rt") as file:
        return [json.loads(line) for line in file]


def _rewrite(path, records):
    with gzip.open(path, "wt") as file:
        for record in records:
            file.write(json.dumps(record, separators=(",", ":")) + "\n")


def _run_with_spans(project):
    run = Run.objects.create(project=project, run_id="ticket-1", agent="refund-bot")
    for n in range(3):
        Span.objects.create(
            project=project,
            run=run,
            trace_id="a" * 32,
            span_id=f"{n:016x}",
            name=f"step {n}",
            start=timezone.now(),
        )


def test_an_archive_holds_effects_with_their_story_and_runs_with_their_spans(project, tmp_path):
    effect = succeeded(project, "refund:1", "re_1")
    _run_with_spans(project)
    archive = _archive(project, tmp_path)
    records = _records(tmp_path / "a.jsonl.gz")
    kinds = [r["type"] for r in records]
    assert kinds[0] == "archive" and kinds[-1] == "end"
    (archived,) = [r for r in records if r["type"] == "effect"]
    assert archived["key"] == "refund:1" and archived["request"] == {
        "order": "refund:1",
        "card": "4242",
    }
    assert [a["number"] for a in archived["attempts"]] == [1, 2]
    assert [r["external_id"] for r in archived["receipts"]] == ["re_1"]
    assert [e["seq"] for e in archived["audit"]] == list(range(1, effect.audit_seq + 1))
    (run,) = [r for r in records if r["type"] == "run"]
    assert run["run_id"] == "ticket-1" and len(run["spans"]) == 3
    assert (archive.effects, archive.runs, archive.spans) == (1, 1, 3)
    written = AuditEntry.objects.get(project=project, action=AuditAction.ARCHIVE_WRITTEN)
    assert written.data["sha256"] == archive.sha256 and written.actor == "test:archivist"


def test_the_archive_round_trip_archive_prune_verify(project, tmp_path, capsys):
    policy(project, payload_days=1, require_archive=True)
    effect = succeeded(project, "refund:1")
    _archive(project, tmp_path)
    done = services.payloads_prune(project=project, now=later())
    assert done.effects == 1 and done.entries == 1
    pruned = Effect.objects.get(pk=effect.pk)
    assert pruned.request is None and pruned.payload_archive is not None
    assert first_broken_entry(project) is None
    # The archive still proves what the pruned chain held.
    assert archive_verify(tmp_path / "a.jsonl.gz").problems == []
    call_command("verifyarchive", str(tmp_path / "a.jsonl.gz"))
    assert "it verifies against the chains" in capsys.readouterr().out


def test_an_archive_written_after_pruning_verifies_too(project, tmp_path):
    policy(project, payload_days=1)
    succeeded(project, "k1")
    services.payloads_prune(project=project, now=later())
    _archive(project, tmp_path)
    assert archive_verify(tmp_path / "a.jsonl.gz").problems == []


def _tampered(path, change):
    records = _records(path)
    change(next(r for r in records if r["type"] == "effect"))
    _rewrite(path, records)


@pytest.mark.parametrize(
    "change",
    [
        lambda effect: effect["request"].update(card="0000"),  # a payload changed
        lambda effect: effect["audit"][1]["data"].update(error="none"),  # an entry's data
        lambda effect: effect["audit"].pop(),  # the chain's tail dropped
    ],
    ids=["payload", "entry", "tail"],
)
def test_a_tampered_archive_fails_verification(project, tmp_path, change):
    succeeded(project, "k1")
    _archive(project, tmp_path)
    path = tmp_path / "a.jsonl.gz"
    _tampered(path, change)
    problems = archive_verify(path).problems
    assert any("No archive of this content" in p for p in problems)
    with pytest.raises(CommandError, match="does not verify"):
        call_command("verifyarchive", str(path))


def test_an_archived_chain_must_end_where_the_databases_chain_holds_it(project, tmp_path):
    """Rewritten with fresh hashes the chain verifies on its own, but not against the
    database."""
    succeeded(project, "k1")
    _archive(project, tmp_path)
    path = tmp_path / "a.jsonl.gz"
    records = _records(path)
    effect = next(r for r in records if r["type"] == "effect")
    effect["audit"][1]["data"] = {"error": "rewritten"}
    prev = "0" * 64
    for row in effect["audit"]:
        row["prev_hash"] = prev
        entry = entry_of(row)
        entry.data_digest = row["data_digest"] = data_digest(row["data"])
        row["hash"] = prev = entry_hash(entry)
    _rewrite(path, records)
    problems = archive_verify(path).problems
    assert any("the database's chain does not hold there" in p for p in problems)


def test_retention_that_requires_an_archive_refuses_without_one(project):
    policy(project, payload_days=1, require_archive=True)
    effect = succeeded(project, "k1")
    with pytest.raises(services.Refused, match="no archive: write one first"):
        services.payloads_prune(project=project, now=later())
    assert Effect.objects.get(pk=effect.pk).payload_pruned is None


def test_retention_that_requires_an_archive_prunes_only_what_one_covers(project, tmp_path):
    policy(project, payload_days=1, require_archive=True)
    covered = succeeded(project, "archived")
    _archive(project, tmp_path)
    # Written after the archive's time: its story is in no archive.
    Archive.objects.update(created=timezone.now() - timedelta(minutes=30))
    assert services.payloads_prune(project=project, now=later()).effects == 0
    Archive.objects.update(created=timezone.now() + timedelta(minutes=5))
    assert services.payloads_prune(project=project, now=later()).effects == 1
    assert Effect.objects.get(pk=covered.pk).payload_archive is not None


def test_an_archive_never_overwrites_a_file(project, tmp_path):
    out = tmp_path / "a.jsonl.gz"
    out.write_bytes(b"")
    with pytest.raises(CommandError, match="exists already"):
        call_command("archive", project="alpha", before="2030-01-01", out=str(out))


def test_the_archive_command_names_a_bad_date(project, tmp_path):
    with pytest.raises(CommandError, match="is not a date"):
        call_command("archive", project="alpha", before="yesterday", out=str(tmp_path / "x"))
