"""The webhook sources the API's specifications post to."""

from __future__ import annotations

import pytest

from durability.models import Project, WebhookSource
from tests.api.support import github_source, stripe_source


@pytest.fixture
def stripe(project: Project) -> WebhookSource:
    return stripe_source(project)


@pytest.fixture
def github(project: Project) -> WebhookSource:
    return github_source(project)
