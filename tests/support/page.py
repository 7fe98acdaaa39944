"""What the browser's tests of the page share: the ``chromium`` fixture (a
headless Debian chromium through Playwright for a module, skipped saying
why without either), Playwright's ``expect`` (None without Playwright),
the timeouts they give it, in milliseconds, a page logged in
(``opened``), and the dialog confirmed (``confirm``) and the automation it
started followed to its end (``ended_card``)."""
from __future__ import annotations

import contextlib

import pytest

from tests.support.api_server import browser, browser_skip_reason

try:
    from playwright.sync_api import expect
except ImportError:         # the browser's tests skip, saying why (the chromium fixture)
    expect = None

__all__ = ["chromium", "expect", "SECOND", "SOON", "WIDE", "opened", "confirm", "ended_card"]

SECOND = 1000                       # Playwright's timeouts are in milliseconds
SOON = 20 * SECOND                  # an automation on the test driver, with margin
WIDE = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def chromium():
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    with browser() as launched:
        yield launched


@contextlib.contextmanager
def opened(chromium, url: str, secret: str, viewport=WIDE, at: str = "/"):
    """A page of a fresh browser context at ``url``, logged in with the
    token ``secret`` through the page's form, its event stream live, then
    at hash ``at``; ``page.problems``: the browser console's errors."""
    context = chromium.new_context(viewport=viewport)
    try:
        page = context.new_page()
        page.problems = []
        page.on("pageerror", lambda error: page.problems.append(str(error)))
        page.goto(url)
        page.locator("#token").fill(secret)
        page.get_by_role("button", name="Log in").click()
        page.locator("#live.on").wait_for(timeout=5 * SECOND)
        if at != "/":
            page.goto(url.rstrip("/") + "/" + at)
        yield page
    finally:
        context.close()


def confirm(page, ok: str, **fields) -> str:
    """Confirm the open dialog with its ``ok`` button, ``fields`` filled
    (True: checked); what it listed, one line per target."""
    dialog = page.locator("#confirm")
    expect(dialog).to_be_visible()
    for name, value in fields.items():
        field = page.locator(f"#confirm-field-{name}")
        field.check() if value is True else field.fill(value)
    listed = dialog.locator("#confirm-targets").inner_text()
    dialog.get_by_role("button", name=ok).click()
    expect(dialog).to_be_hidden()
    return listed


def ended_card(page, title: str):
    card = page.locator("#automations article", has_text=title)
    expect(card.locator("header .state")).to_have_text("done", timeout=SOON)
    return card
