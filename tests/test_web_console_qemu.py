"""The serial console in the page, on a real guest: a real peer on this
machine's libvirtd (``qemu:///system``) boots the busybox guest of
:mod:`tests.support.qemu_guest` through the command line; an operator
opens its console from the page (xterm.js over the API's websocket), sees
the guest's shell, types a command and reads its answer; stopping the VM
ends the session and the page says so.

Skipped, saying why, where no libvirtd runs QEMU
(:func:`qemu_guest.skip_reason`) or without chromium and Playwright.
"""
from __future__ import annotations

import pytest

from tests.support.api_server import browser, browser_skip_reason, served_api, token
from tests.support.console_guest import booted_guest
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

try:
    from playwright.sync_api import expect
except ImportError:         # skipped, saying why (browser_skip_reason)
    expect = None

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

ANSWER_MS = 30_000


@pytest.fixture
def guest(guest_dir, etcd, tmp_path):
    """A running guest booted by `boot` on peer ``qw<pid>``, its shell up;
    ``(cluster, name, host)``."""
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    with booted_guest(guest_dir, etcd.url, tmp_path, "webconsole") as booted:
        yield booted[:3]


def test_an_operator_types_into_the_guest_from_the_page_until_it_stops(guest):
    cluster, name, host = guest
    with served_api(cluster.etcd_url, cluster.name) as server, browser() as chromium:
        context = chromium.new_context(viewport={"width": 1200, "height": 900})
        try:
            page = context.new_page()
            page.goto(server.url)
            page.locator("#token").fill(token(server, "operator"))
            page.get_by_role("button", name="Log in").click()
            page.locator(f"#vms tr[data-vm='{name}']").get_by_role(
                "button", name="Console").click()
            status, screen = page.locator("#console-status"), page.locator("#terminal")
            expect(status).to_contain_text(f"attached to {name} on {host}", timeout=ANSWER_MS)

            page.locator("#terminal .xterm-helper-textarea").focus()
            page.keyboard.type("echo page-$((6*7))")
            page.keyboard.press("Enter")
            expect(screen).to_contain_text("page-42", timeout=ANSWER_MS)   # the shell's answer
            expect(screen).to_contain_text("echo page-$((6*7))")         # echoed by the guest

            page.locator("#console-close").click()                      # leave, come back
            expect(page.locator("#console")).to_be_hidden()
            page.locator(f"#vms tr[data-vm='{name}']").get_by_role(
                "button", name="Console").click()
            expect(status).to_contain_text(f"attached to {name} on {host}", timeout=ANSWER_MS)
            expect(screen).not_to_contain_text("page-42")               # a new terminal
            page.locator("#terminal .xterm-helper-textarea").focus()
            page.keyboard.type("echo again-$((6*7))")
            page.keyboard.press("Enter")
            expect(screen).to_contain_text("again-42", timeout=ANSWER_MS)

            stopped = cluster.cli_json("stop", name, timeout=120)      # ACPI: a real shutdown
            assert stopped["state"] == "done", stopped
            expect(status).to_have_text("console closed: the VM stopped", timeout=ANSWER_MS)
        finally:
            context.close()
