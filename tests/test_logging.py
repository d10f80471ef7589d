"""The log: each record is one line on stderr (granian's log in the demo, .demo/server.log)."""

from __future__ import annotations

import io
import logging
import sys

from django.conf import settings
from django.test import override_settings
from django.utils.log import configure_logging


def _stderr_of(emit) -> str:
    """What the project's logging configuration writes to stderr while `emit` runs."""
    captured, real = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
        emit()
    finally:
        sys.stderr = real
        configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    return captured.getvalue()


@override_settings(DEBUG=True)
def test_a_django_record_is_one_line_in_the_log_with_debug_on():
    text = _stderr_of(lambda: logging.getLogger("django.request").warning("Not Found: /nowhere/"))
    assert text.splitlines() == ["Not Found: /nowhere/"]


def test_a_tallybook_record_is_one_line_in_the_log():
    text = _stderr_of(lambda: logging.getLogger("durability.jobs").warning("a job failed"))
    assert text.splitlines() == ["a job failed"]
