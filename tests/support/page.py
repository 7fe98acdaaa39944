"""What the browser's tests of the page share: the ``chromium`` fixture (a
headless Debian chromium through Playwright for a module, skipped saying
why without either), Playwright's ``expect`` (None without Playwright),
and the timeouts they give it, in milliseconds."""
from __future__ import annotations

import pytest

from tests.support.api_server import browser, browser_skip_reason

try:
    from playwright.sync_api import expect
except ImportError:         # the browser's tests skip, saying why (the chromium fixture)
    expect = None

__all__ = ["chromium", "expect", "SECOND", "SOON"]

SECOND = 1000                       # Playwright's timeouts are in milliseconds
SOON = 20 * SECOND                  # an automation on the test driver, with margin


@pytest.fixture(scope="module")
def chromium():
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    with browser() as launched:
        yield launched
