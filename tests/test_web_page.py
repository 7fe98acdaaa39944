"""The web page (``/``) in a real browser: Debian's chromium driven by
Playwright, on the API served from this process for a cluster of real
peers on libvirt's test driver.

What it proves: the page lists the cluster, follows it through the event
stream (a VM booted from the command line shows within a second of its
running record), shows the cluster's automations whoever started them,
lets an operator stop a VM once the dialog is confirmed, clears an error
banner once a later action is accepted, offers no Start, Migrate or Backup
of a VM while its host is down, shows a viewer no action at all, refuses a
write without the CSRF token, logs out for good (its session deleted, its
cookie refused), and says why a console cannot open.  The console's websocket refuses,
before any upgrade, whoever may not hold a console.

Skipped, saying why, without chromium or Playwright.
"""
from __future__ import annotations

import contextlib
import threading

import aiohttp
import pytest
import requests

from engine.core import keys
from tests.support import wait_until
from tests.support.api_server import in_own_loop, served_api, session_cookie, token
from tests.support.cluster import SMALL_VM, boot_vms
from tests.support.page import SECOND, SOON, chromium, expect  # noqa: F401 (a fixture)


@pytest.fixture
def api(cluster, two_hosts):
    """The API of a two-host cluster, served from this process."""
    with served_api(cluster.etcd_url, cluster.name) as server:
        yield server


@contextlib.contextmanager
def logged_in(chromium, server, role: str):
    """A page of a fresh browser context, logged in with a token of ``role``
    through the page's own form, its event stream live; ``page.problems``
    collects what the browser's console said was wrong (the CSP's refusals
    among them).  The context closes with the block, its event stream too."""
    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    try:
        page = context.new_page()
        page.problems = []
        page.on("console", lambda message: message.type == "error"
                and page.problems.append(message.text))
        page.on("pageerror", lambda error: page.problems.append(str(error)))
        page.goto(server.url)
        page.locator("#token").fill(token(server, role))
        page.get_by_role("button", name="Log in").click()
        page.locator("#live.on").wait_for(timeout=5 * SECOND)
        yield page
    finally:
        context.close()


def vm_row(page, name):
    return page.locator(f"#vms tr[data-vm='{name}']")


def listed(cluster) -> dict:
    return {vm["name"]: vm for vm in cluster.cli_json("vmlist")}


def test_the_page_lists_hosts_vms_and_leases(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    cluster.cli_json("lease", "create", "maint", "--start", "+1h", "--end", "+1d",
                     "--hosts", "1")
    with logged_in(chromium, api, "viewer") as page:
        for host in ("host1", "host2"):
            expect(page.locator(f"#hosts tr[data-host='{host}'] .state")).to_have_text("up")
        expect(page.locator("#hosts tr[data-host='host1'] td").nth(2)).to_have_text("1")
        expect(page.locator("#hosts tr[data-host='host1'] meter")).to_have_count(2)
        row = vm_row(page, "web1")
        expect(row.locator(".host")).to_have_text("host1")
        expect(row.locator(".state")).to_have_text("running")
        expect(row.locator(".ip")).to_have_text(listed(cluster)["web1"]["ip"])
        expect(page.locator("#leases tr[data-lease='maint'] .state")).to_have_text("pending")
        csp = [text for text in page.problems if "Content Security Policy" in text]
        assert csp == []


def test_a_vm_booted_from_the_command_line_shows_within_a_second_of_running(
        chromium, api, cluster, store):
    with logged_in(chromium, api, "viewer") as page:
        expect(page.locator("#vms tr.empty")).to_be_visible()        # listed: no VM yet
        booting = threading.Thread(target=cluster.cli, args=(
            "boot", "web2", "--resources", SMALL_VM, "--on", "host2"))
        booting.start()
        try:
            wait_until(lambda: [kv.value for kv in store.range(keys.vm())[0]],
                       lambda vms: any(vm["name"] == "web2" and vm["state"] == "running"
                                       for vm in vms),
                       timeout=30, interval=0.02, what="web2's running record in etcd")
            expect(vm_row(page, "web2").locator(".state")).to_have_text("running",
                                                                        timeout=SECOND)
        finally:
            booting.join(60)


def test_a_drain_from_the_command_line_shows_on_the_page(chromium, api, cluster):
    with logged_in(chromium, api, "viewer") as page:
        status = page.locator("#hosts tr[data-host='host2'] .state")
        expect(status).to_have_text("up")
        cluster.cli_json("drain", "host2")
        expect(status).to_have_text("drained", timeout=5 * SECOND)
        cluster.cli_json("undrain", "host2")
        expect(status).to_have_text("up", timeout=5 * SECOND)


def test_an_operator_stops_a_vm_from_the_page_once_confirmed(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    with logged_in(chromium, api, "operator") as page:
        row = vm_row(page, "web1")
        dialog = page.locator("#confirm")
        row.get_by_role("button", name="Stop").click()
        expect(dialog.locator("#confirm-targets")).to_have_text("web1 on host1")
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_be_hidden()
        assert listed(cluster)["web1"]["state"] == "running"          # nothing was asked

        row.get_by_role("button", name="Stop").click()
        dialog.get_by_role("button", name="Stop").click()
        card = page.locator("#automations article", has_text="stop host1/web1")
        expect(card.locator("header .state")).to_have_text("done", timeout=SOON)
        expect(card.locator("li[data-label='web1']")).to_contain_text("stopped")
        expect(row.locator(".state")).to_have_text("shutoff")
        assert listed(cluster)["web1"]["state"] == "shutoff"


def test_a_viewer_sees_no_action(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    with logged_in(chromium, api, "viewer") as page:
        expect(vm_row(page, "web1").locator(".state")).to_have_text("running")
        expect(page.locator("#who")).to_contain_text("(viewer)")
        expect(page.locator("#cluster .actions button:visible")).to_have_count(0)
        expect(page.locator("#boot-form")).to_be_hidden()


def test_a_write_from_the_page_without_its_csrf_header_is_refused(chromium, api):
    with logged_in(chromium, api, "operator") as page:
        post = """async (csrf) => {
            const headers = {"Content-Type": "application/json"};
            if (csrf) headers["X-CSRF-Token"] = csrf;
            const response = await fetch("/v1/hosts/host1/undrain",
                                         {method: "POST", headers, body: "{}"});
            return [response.status, await response.json()];
        }"""
        status, doc = page.evaluate(post, None)
        assert status == 403 and "CSRF" in doc["error"], doc
        csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "peerctl_csrf")
        status, doc = page.evaluate(post, csrf)           # the same write, as the page sends it
        assert status == 200, doc


def test_log_out_ends_the_session_so_its_cookie_opens_nothing(chromium, api, store):
    with logged_in(chromium, api, "operator") as page:
        cookie = next(c["value"] for c in page.context.cookies()
                      if c["name"] == "peerctl_session")
        (held,) = store.range(keys.session())[0]             # the login, kept in etcd
        page.get_by_role("button", name="Log out").click()
        expect(page.locator("#login")).to_be_visible()
        assert store.get(held.key) is None
        status = page.evaluate("""async () => (await fetch("/v1/session")).status""")
        assert status == 401
    replayed = requests.get(api.url.rstrip("/") + "/v1/vms",      # the cookie, kept
                            cookies={"peerctl_session": cookie}, timeout=10)
    assert replayed.status_code == 401


# -- the cluster's automations, errors, down hosts -------------------------------------------------

def automation_card(page, automation):
    return page.locator(f"#automations article[data-automation='{automation}']")


def test_automations_started_from_the_command_line_show_on_the_page(chromium, api, cluster):
    before = cluster.cli_json("ping")                  # ended before the page opened
    with logged_in(chromium, api, "viewer") as page:
        card = automation_card(page, before["automation"])
        expect(card.locator("header strong")).to_have_text("ping")
        expect(card.locator("header .state")).to_have_text("done")

        booted = cluster.cli_json("boot", "web3", "--resources", SMALL_VM, "--on", "host2")
        card = automation_card(page, booted["automation"])
        expect(card.locator("header .state")).to_have_text("done", timeout=5 * SECOND)
        expect(card.locator("li[data-label='web3']")).to_contain_text("built")
        expect(page.locator("#automations-count")).to_have_text("0 running")


def test_an_error_banner_goes_once_a_later_action_is_accepted(chromium, api, cluster):
    with logged_in(chromium, api, "operator") as page:
        banner = page.locator("#notice")
        page.locator("#boot-names").fill("web4")
        page.locator("#boot-resources").fill("VCPU:lots")
        page.locator("#boot-form").get_by_role("button", name="Boot").click()
        page.locator("#confirm").get_by_role("button", name="Boot").click()
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("boot web4: ")           # the API's refusal of it
        expect(banner).to_contain_text("lots")

        page.locator("#hosts tr[data-host='host2']").get_by_role("button", name="Drain").click()
        page.locator("#confirm").get_by_role("button", name="Drain").click()
        expect(page.locator("#hosts tr[data-host='host2'] .state")).to_have_text("drained")
        expect(banner).to_be_hidden()


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_vm_whose_host_is_down_offers_no_start_migrate_or_backup(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    cluster.cli_json("stop", "web1", "--yes")
    with logged_in(chromium, api, "operator") as page:
        row = vm_row(page, "web1")
        actions = [row.get_by_role("button", name=name) for name in ("Start", "Migrate", "Backup")]
        for button in actions:
            expect(button).to_be_enabled()

        cluster.kill("host1")                          # SIGKILL, by its PID: its lease runs out
        expect(page.locator("#hosts tr[data-host='host1'] .state")).to_have_text(
            "down", timeout=10 * SECOND)
        expect(row.locator(".state")).to_have_text("unknown")
        for button in actions:
            expect(button).to_be_disabled()
            expect(button).to_have_attribute("title", "host host1 is down")

        cluster.start_peer("host1")                    # back, on the same state directory
        expect(page.locator("#hosts tr[data-host='host1'] .state")).to_have_text(
            "up", timeout=20 * SECOND)
        for button in actions:
            expect(button).to_be_enabled()


# -- the console --------------------------------------------------------------------------------

DOMAIN = ("<domain type='test'><name>{}</name><uuid>{}</uuid><memory>65536</memory>"
          "<vcpu>1</vcpu><os><type>hvm</type></os></domain>")
RUN1 = "11111111-2222-3333-4444-000000000001"


@pytest.fixture
def test_driver_api(tmp_path, store, etcd, cluster_name):
    """The API of a cluster whose one host ``hfile`` is a test-driver file
    this process reads too, running VM ``run1``: attachable, but the test
    driver offers no console."""
    path = tmp_path / "host.xml"
    path.write_text("<node>" + DOMAIN.format("run1", RUN1) + "</node>")
    uri = f"test://{path}"
    store.put(keys.host("hfile"), {"host": "hfile", "libvirt_uri": uri}, store.grant(600))
    store.put(keys.vm("hfile", RUN1), {"host": "hfile", "name": "run1", "uuid": RUN1,
                                      "state": "running"})
    with served_api(etcd.url, cluster_name) as server:
        server.libvirt_uri = uri
        yield server


def test_the_console_says_in_the_page_why_it_cannot_open(chromium, test_driver_api):
    with logged_in(chromium, test_driver_api, "operator") as page:
        vm_row(page, "run1").get_by_role("button", name="Console").click()
        expect(page.locator("#console")).to_be_visible()
        expect(page.locator("#console-status")).to_have_text(
            f"the hypervisor of hfile ({test_driver_api.libvirt_uri}) does not offer a console")
        page.locator("#console-close").click()
        expect(page.locator("#console")).to_be_hidden()


def console_handshake(server, headers=None, cookies=None, query="") -> tuple[int, str]:
    """The status a websocket handshake to run1's console gets (101 when it
    is upgraded), and the error line of a refusal."""
    async def connect():
        async with aiohttp.ClientSession(cookies=cookies) as session:
            try:
                async with session.ws_connect(f"{server.url}/v1/vms/run1/console{query}",
                                              headers=headers):
                    return 101, ""
            except aiohttp.WSServerHandshakeError as exc:
                async with session.get(f"{server.url}/v1/vms/run1/console{query}",
                                       headers=headers) as plain:
                    return exc.status, (await plain.json())["error"]
    return in_own_loop(connect())


def test_the_console_websocket_is_an_operators_only(test_driver_api):
    server = test_driver_api
    viewer = {"Authorization": f"Bearer {token(server, 'viewer')}"}
    status, error = console_handshake(server, viewer)
    assert (status, error) == (403, "permission denied for role viewer: a viewer may read, "
                                    "not open a console")
    assert console_handshake(server)[0] == 401
    operator = {"Authorization": f"Bearer {token(server, 'operator')}"}
    assert console_handshake(server, operator)[0] == 101


def test_a_session_cookie_opens_a_console_only_with_the_csrf_token(test_driver_api):
    server = test_driver_api
    cookies = {"peerctl_session": session_cookie(server, "operator"), "peerctl_csrf": "c" * 32}
    status, error = console_handshake(server, cookies=cookies)
    assert status == 403 and "csrf query parameter" in error, error
    assert console_handshake(server, cookies=cookies, query="?csrf=" + "x" * 32)[0] == 403
    assert console_handshake(server, cookies=cookies, query="?csrf=" + "c" * 32)[0] == 101


def test_a_console_that_cannot_attach_says_why_then_closes(test_driver_api):
    operator = {"Authorization": f"Bearer {token(test_driver_api, 'operator')}"}

    async def session(name):
        async with aiohttp.ClientSession() as client:
            async with client.ws_connect(f"{test_driver_api.url}/v1/vms/{name}/console",
                                         headers=operator) as socket:
                said = await socket.receive_json()
                closing = await socket.receive()
                return said, closing.type, closing.data, closing.extra
    said, kind, code, reason = in_own_loop(session("run1"))
    why = f"the hypervisor of hfile ({test_driver_api.libvirt_uri}) does not offer a console"
    assert said == {"ended": why}
    assert (kind, code) == (aiohttp.WSMsgType.CLOSE, 4409)
    assert len(reason.encode()) <= 123 and reason.endswith("...")     # a long path: cut
    assert why.startswith(reason[:-3])
    assert in_own_loop(session("nosuch"))[:3] == (
        {"ended": "no VM matches 'nosuch'"}, aiohttp.WSMsgType.CLOSE, 4409)
