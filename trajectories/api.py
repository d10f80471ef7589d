"""Span ingest: POST /api/v1/events (native run and span events) and POST /v1/traces (OTLP)."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from durability.api.decorators import ApiRequest, PayloadRequest, authorize, error
from trajectories import ingest, links, otlp
from trajectories.schemas import EventBatchIn

EVENTS_MAX_BODY = 3_500_000
# The outer bound of Django's DATA_UPLOAD_MAX_MEMORY_SIZE; gzip bodies inflate past it.
OTLP_MAX_BODY = 4 * 1024 * 1024


# No large-batch gate here (ingest.large_batch): the body is never inflated, so it costs what
# the client sent, and the largest (3.3 MB, 1,000 span events) is stored in about 0.2 s of
# CPU, against a second and more for a maximum OTLP request; the project's slots bound it.
@require_POST
@authorize(schema=EventBatchIn, max_body=EVENTS_MAX_BODY)
def events(request: PayloadRequest[EventBatchIn]) -> JsonResponse:
    try:
        with ingest.slot(request.project):
            outcome = ingest.events_ingest(project=request.project, events=request.payload.events)
    except ingest.Overloaded as exc:
        return error(str(exc), exc.status, retry_after=exc.retry_after)
    links.links_refresh(project_id=request.project.pk, touched=outcome.touched)
    return JsonResponse(outcome.to_dict(), status=207)


@require_POST
@otlp.in_request_encoding
@authorize(max_body=OTLP_MAX_BODY)
def traces(request: ApiRequest) -> HttpResponse:
    content_type = request.content_type
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        return otlp.status_response(
            otlp.JSON, 415, f"Content-Type must be {otlp.PROTOBUF} or {otlp.JSON}"
        )
    encoding = request.headers.get("Content-Encoding", "")
    try:
        # The gate and the slot first: a flood is turned away before its bodies cost anything.
        with (
            ingest.large_batch(otlp.is_large(request.body, encoding)),
            ingest.slot(request.project) as held,
        ):
            try:
                body = otlp.inflate(request.body, encoding)
                decoded = otlp.decode(body, content_type)
            except otlp.Undecodable as exc:
                return otlp.status_response(content_type, 400, str(exc))
            except otlp.TooLarge as exc:
                return otlp.status_response(content_type, 413, str(exc))
            touched = ingest.spans_ingest(project=request.project, spans=decoded.spans, slot=held)
    except ingest.Overloaded as exc:
        return otlp.status_response(content_type, exc.status, str(exc), exc.retry_after)
    links.links_refresh(project_id=request.project.pk, touched=touched)
    return otlp.export_response(content_type, decoded)
