"""In Chromium: the case page shows the model request as messages, a long one clipped to a
few lines that "more" opens and "less" closes again, without a script."""

from __future__ import annotations

import json

from durability.models import Case, Reason
from tests.browser import BROWSER, browser, log_in, page
from tests.trajectories.support import TRACE, chat, post_traces, request, tool
from trajectories.links import effect_link_record

__all__ = ["browser", "page"]  # the browser fixtures, used by name

pytestmark = BROWSER

MODEL, TOOL = "1" * 16, "2" * 16


def test_a_long_message_opens_on_more_and_closes_on_less(page, api, alice):
    prompt = "\n".join(f"Policy rule {n}." for n in range(30))
    asked = [
        {"role": "system", "parts": [{"type": "text", "content": prompt}]},
        {"role": "user", "parts": [{"type": "text", "content": "Refund order A-17."}]},
    ]
    spans = [
        chat(MODEL, attributes={"gen_ai.input.messages": json.dumps(asked)}),
        tool(TOOL, at_ms=100, attributes={"gen_ai.tool.call.arguments": '{"order": "A-17"}'}),
    ]
    assert post_traces(api.client, api.key, request(*spans)).status_code == 200
    effect_id = api.intent("refund:1", trace_id=TRACE, span_id=TOOL).json()["effect"]["id"]
    api.intent("refund:1", trace_id=TRACE, span_id=TOOL, request={"order": "A-18"})
    effect_link_record(effect_id=effect_id)
    case = Case.objects.get(reason=Reason.KEY_REUSE_CONFLICT)

    log_in(page, case.get_absolute_url())
    messages = page.locator("[data-messages]")
    assert messages.locator(".role").all_inner_texts() == ["SYSTEM", "USER", "ASSISTANT"]
    clip = messages.locator("details.clip").first
    assert clip.locator(".preview").is_visible()
    assert "Policy rule 3." in clip.locator(".preview").inner_text()
    assert not page.get_by_text("Policy rule 29.").is_visible()
    clip.locator("summary").click()
    assert page.get_by_text("Policy rule 29.").is_visible()
    assert not clip.locator(".preview").is_visible()
    clip.locator("summary").click()
    assert not page.get_by_text("Policy rule 29.").is_visible()
    assert page.locator("[data-tool-call] [data-arguments]").inner_text().startswith("{")
