"""The README's pictures, taken from a real refund: the form, the live status page mid-run,
the admin run page with its timeline, and the run list with its dashboard.

A browser test like the others (real Chromium, workers, sandbox, Postgres, Redis). By default
the pictures go to a temporary folder; `make screenshots` sets $README_SHOTS_DIR to
static/readme/ so the committed ones are regenerated after the pages change.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import User

from refunds.models import RefundRequest
from tests.refunds.acceptance.test_browser import DONE, RUN_SECONDS, fill_form, refund_of
from tests.support.browser import db
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

#: Each picture stays small enough to keep in the repository.
MAX_PNG_BYTES = 250_000
WIDTH = 1200
PASSWORD = "readme-pictures"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("README_SHOTS_DIR") or tmp_path / "readme")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def snap(page: Any, path: Path, *, bottom_of: str | None = None) -> None:
    """The page at the README's width; with `bottom_of`, cut just below that element."""
    clip = None
    if bottom_of is not None:
        page.evaluate("window.scrollTo(0, 0)")  # page and viewport coordinates now agree
        box = page.locator(bottom_of).bounding_box()
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": box["y"] + box["height"] + 12}
    page.screenshot(path=str(path), full_page=True, clip=clip, animations="disabled")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size <= MAX_PNG_BYTES, f"{path.name}: {path.stat().st_size} bytes"


def test_readme_pictures__a_real_refund_from_form_to_admin_timeline(
    running: SandboxProcess, page: Any, shots: Path, settings: Any
) -> None:
    settings.STRIPE_API_BASE = running.url  # the web process links where the workers pay
    # A CRM hiccup (one 503) gives the timeline a retry and its back-off; a slow boarding-pass
    # issue keeps the run going long enough to be seen mid-way.
    running.set_fault(endpoint="crm.update", error_rate=1.0, error_status=503, count=1)
    running.set_fault(endpoint="airline.boarding_pass", latency_ms=2500, count=1)
    page.set_viewport_size({"width": WIDTH, "height": 860})

    page.goto("/refunds/new/")
    fill_form(page)
    page.evaluate("document.activeElement.blur()")  # no focus ring in the picture
    snap(page, shots / "refund-form.png")
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    page.locator(".step--active").filter(has_text="boarding pass").wait_for(
        timeout=RUN_SECONDS * 1000
    )
    snap(page, shots / "refund-status.png")
    page.get_by_text(DONE).wait_for(timeout=RUN_SECONDS * 1000)
    run_id = refund_of(page.url).workflow_id

    db(lambda: User.objects.create_superuser("ops", "ops@example.com", PASSWORD))
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/admin/")
    page.goto(f"/admin/agentflow/workflowrun/{quote(run_id)}/change/")
    page.locator("#toggle-nav-sidebar").click()  # the pictures are of the page, not the menu
    crm = page.locator("svg.af-timeline-svg g.af-tl-lane[data-step=update_crm] g.af-tl-attempt")
    assert crm.count() >= 1
    snap(page, shots / "admin-run.png", bottom_of=".af-timeline")

    # The payment step's link leads to the partner's record of that very payment.
    link = page.locator(".af-partner a").first
    payment_id = link.inner_text()
    with urllib.request.urlopen(link.get_attribute("href"), timeout=10) as answer:
        ledger = json.loads(answer.read())
    assert payment_id.startswith("pi_")
    assert payment_id in json.dumps(ledger["payments"])
    refund = db(lambda: RefundRequest.objects.get(workflow_id=run_id).public_id)
    assert page.get_by_role("link", name=f"Refund {refund}").is_visible()

    page.goto("/admin/agentflow/workflowrun/")
    snap(page, shots / "admin-runs.png", bottom_of="#result_list")
