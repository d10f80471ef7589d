"""WSGI entry point: `granian --interface wsgi durability.wsgi:application`
(deploy/systemd/tallybook-web.service)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durability.settings")

application = get_wsgi_application()
