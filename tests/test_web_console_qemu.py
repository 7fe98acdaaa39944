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

import os
import shutil

import libvirt
import pytest

from engine.core import api
from engine.core.store import Store
from engine.placement import open_placement
from tests.support import qemu_guest, wait_for
from tests.support.api_server import browser, browser_skip_reason, served_api, token
from tests.support.cluster import Cluster
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

try:
    from playwright.sync_api import expect
except ImportError:         # skipped, saying why (browser_skip_reason)
    expect = None

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

BOOT_TIMEOUT = 120.0
ANSWER_MS = 30_000


def _cleanup(conn, host, name):
    """Whatever a failed run left in the shared libvirtd: the domain, the pool."""
    for dom in conn.listAllDomains(0):
        if dom.name() == name:
            try:
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            except libvirt.libvirtError:
                pass
    try:
        pool = conn.storagePoolLookupByName(f"peerctl-{host}")
        for vol in pool.listAllVolumes(0):
            vol.delete(0)
        if pool.isActive():
            pool.destroy()
        pool.undefine()
    except libvirt.libvirtError:
        pass


@pytest.fixture
def guest(guest_dir, etcd, tmp_path):
    """A running guest booted by `boot` on peer ``qw<pid>``, its shell up;
    ``(cluster, name, host)``."""
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = qemu_guest.world_readable_tmpdir("peerctl-webconsole-")
    tag = os.getpid()
    host, name = f"qw{tag}", f"webconsole{tag}"     # unique: the libvirtd is shared
    cluster = Cluster(etcd.url, f"webconsole{tag}", tmp_path)
    conn = libvirt.open(qemu_guest.QEMU_URI)
    state_dir = os.path.join(workdir, f"state-{host}")
    try:
        image = qemu_guest.build_disk_image(os.path.join(workdir, "guest.img"), guest_dir,
                                            workdir)
        cluster.start_peer(host, libvirt=qemu_guest.QEMU_URI,
                           env={"PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL},
                           extra_args=["--state-dir", state_dir])
        store = Store(etcd.url, cluster.name)
        try:
            wait_for(lambda: host in api.live_hosts(store), timeout=60, interval=0.2,
                     what=f"{host} alive")
            placement = open_placement("etcd", store)
            wait_for(lambda: host in {p["name"] for p in placement.providers()},
                     timeout=30, interval=0.2, what=f"{host} registered as a provider")
        finally:
            store.close()
        booted = cluster.cli_json("boot", name, "--resources", "VCPU:1,MEMORY_MB:128,DISK_GB:1",
                                  "--image", f"file://{image}", "--network", "none",
                                  timeout=BOOT_TIMEOUT)
        assert booted["state"] == "done", booted
        (vm,) = booted["vms"]
        log = os.path.join(state_dir, "console", f"{vm['uuid']}.log")
        assert qemu_guest.wait_for_console(log, qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
            "guest did not come up; console:\n" + (
                open(log, errors="replace").read() if os.path.exists(log) else "")
        yield cluster, name, host
    finally:
        cluster.cli("destroy", name, "--yes", timeout=60)
        cluster.close()
        _cleanup(conn, host, name)
        conn.close()
        shutil.rmtree(workdir, ignore_errors=True)


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
