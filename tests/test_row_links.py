"""The links to a row (`durability.models.links.row_path`): what `reverse` would build, under any
script prefix, though the route is resolved once."""

from __future__ import annotations

from django.test import SimpleTestCase
from django.urls import reverse, set_script_prefix

from durability.models.links import row_path


class RowPathTests(SimpleTestCase):
    def test_it_builds_what_reverse_builds_for_each_row(self) -> None:
        for route in ("effect", "case", "grant"):
            for pk in (1, 42, 918273645, 2**62):
                self.assertEqual(row_path(route, pk), reverse(route, args=[pk]))

    def test_it_follows_the_script_prefix(self) -> None:
        self.assertEqual(row_path("effect", 7), "/effects/7/")
        set_script_prefix("/tally/")
        try:
            self.assertEqual(row_path("effect", 7), "/tally/effects/7/")
            self.assertEqual(row_path("effect", 7), reverse("effect", args=[7]))
        finally:
            set_script_prefix("/")
        self.assertEqual(row_path("effect", 7), "/effects/7/")
