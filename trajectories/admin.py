"""Read-only admin: runs and spans change only through ingest."""

from __future__ import annotations

from django.contrib import admin

from durability.admin import ReadOnly
from trajectories.models import EffectLink, RequestedToolCall, Run, RunTrace, SeenEvent, Span


@admin.register(Run)
class RunAdmin(ReadOnly):
    list_display = ["run_id", "project", "agent", "workflow", "status", "started", "span_count"]
    list_filter = ["status", "inferred"]
    search_fields = ["run_id", "agent", "workflow"]


@admin.register(Span)
class SpanAdmin(ReadOnly):
    list_display = ["name", "kind", "trace_id", "span_id", "start", "status"]
    list_filter = ["kind", "status"]
    search_fields = ["trace_id", "span_id", "tool_call_id"]
    raw_id_fields = ["run"]


@admin.register(EffectLink)
class EffectLinkAdmin(ReadOnly):
    list_display = ["effect", "run", "tool_span_id", "model_span_id", "resolved"]
    raw_id_fields = ["effect", "run"]


admin.site.register(RunTrace, ReadOnly)
admin.site.register(RequestedToolCall, ReadOnly)
admin.site.register(SeenEvent, ReadOnly)
