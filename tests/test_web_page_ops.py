"""The page as an operator's daily tool, in a real browser (Debian's
chromium driven by Playwright) on real peers over libvirt's test driver.

What it proves: the tree groups the VMs by host and the list searches,
filters and sorts them, with vCPUs, memory and disk per VM; views are
linkable (``#/vm/NAME``) and Back returns; a VM's page shows its record,
backups and history and schedules its backups, a host's page its capacity,
version, VMs and foreign domains, and both draw their graphs (the SVG has
points); the task log shows an automation started from the command line
with its steps, and aborts a running one; a Stop of two selected VMs lists
both in its confirmation (the route's own plan) and shows their progress;
every kind of action runs from the page, each confirmed; a viewer gets no
action on any view; a host that dies shows as down; at 420 px wide nothing
overflows the body.  Screenshots at 1,400 and 420 px go to
``$PEERCTL_PAGE_SHOTS`` when it is set (docs/page-*.png are made that way),
else to the test's temporary directory.

Skipped, saying why, without chromium or Playwright.
"""
from __future__ import annotations

import os
import pathlib

import pytest

from tests.support.api_client import serving_api
from tests.support.api_server import served_api, token
from tests.support.cluster import boot_vms, held_requests
from tests.support.page import (SECOND, SOON, chromium, confirm, ended_card,  # noqa: F401 (a fixture)
                                expect, opened)

NARROW = {"width": 420, "height": 860}


@pytest.fixture
def api(cluster, two_hosts):
    """The API of a two-host cluster, served from this process."""
    with served_api(cluster.etcd_url, cluster.name) as server:
        yield server


def shot(page, name: str, tmp_path) -> None:
    """A screenshot of the whole page, docs/page-NAME.png when asked for."""
    where = pathlib.Path(os.environ.get("PEERCTL_PAGE_SHOTS") or tmp_path)
    page.screenshot(path=str(where / f"page-{name}.png"), full_page=False)


def vm_row(page, name, table="vms"):
    return page.locator(f"#{table} tr[data-vm='{name}']")


def shown_vms(page, table="vms") -> list[str]:
    return page.locator(f"#{table} tr.vm").evaluate_all("rows => rows.map(r => r.dataset.vm)")


def test_the_tree_groups_vms_by_host_and_the_list_searches_filters_and_sorts(
        chromium, api, cluster, tmp_path):
    boot_vms(cluster, "web1", "web2", on="host1")
    boot_vms(cluster, "db1", on="host2", resources="VCPU:2,MEMORY_MB:128,DISK_GB:3")
    with opened(chromium, api.url, token(api, "viewer")) as page:
        tree = page.locator("#tree-hosts")
        expect(tree.locator("li[data-host='host1'] > .count")).to_have_text("2")
        expect(tree.locator("li[data-host='host2'] > .count")).to_have_text("1")
        tree.get_by_role("button", name="open host2").click()
        expect(tree.locator("li[data-host='host2'] li[data-vm='db1']")).to_be_visible()

        db1 = vm_row(page, "db1")
        expect(db1.locator(".vcpus")).to_have_text("2")
        expect(db1.locator(".memory")).to_have_text("128 MiB")
        expect(db1.locator(".disk")).to_have_text("3 GB")
        assert shown_vms(page) == ["web1", "web2", "db1"]          # by host, then name

        page.locator("#vms-search").fill("web")
        expect(page.locator("#vms tr.vm")).to_have_count(2)
        expect(page.locator("#vms-count")).to_have_text("2 of 3")
        page.locator("#vms-search").fill("")
        page.locator("#vms-host").select_option("host2")
        expect(page.locator("#vms tr.vm")).to_have_count(1)
        page.locator("#vms-host").select_option("")
        page.locator("#vms th[data-sort='name'] button").click()
        expect(page.locator("#vms tr.vm").first).to_have_attribute("data-vm", "db1")
        page.locator("#vms th[data-sort='name'] button").click()        # again: descending
        expect(page.locator("#vms tr.vm").first).to_have_attribute("data-vm", "web2")
        page.locator("#vms th[data-sort='vcpus'] button").click()
        expect(page.locator("#vms tr.vm").last).to_have_attribute("data-vm", "db1")
        shot(page, "datacenter", tmp_path)

        db1.get_by_role("link", name="db1").click()                   # linkable, and Back works
        expect(page).to_have_url(api.url.rstrip("/") + "/#/vm/db1")
        expect(page.locator("#vm-head h2")).to_contain_text("db1")
        page.go_back()
        expect(vm_row(page, "web1")).to_be_visible()
        assert page.problems == []


def test_a_vm_page_shows_its_record_backups_and_history(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    backup = cluster.cli_json("backup", "web1", "--yes")["vms"][0]["backup"]
    with opened(chromium, api.url, token(api, "operator"), at="#/vm/web1") as page:
        record = page.locator("#vm-record")
        expect(record).to_contain_text("64 MiB")
        expect(record.locator("dd").first).to_have_text("host1")
        row = page.locator(f"#vm-backups tr[data-backup='{backup}']")
        expect(row).to_contain_text("full")
        expect(row.get_by_role("button", name="Restore")).to_be_enabled()
        history = page.locator("#vm-automations tr[data-automation] td:nth-child(2)")
        expect(history).to_have_count(2)                    # its boot and its backup
        assert sorted(history.all_inner_texts()) == ["backup", "boot"]
        expect(page.locator("#vm-head").get_by_role("button", name="Snapshot")).to_be_enabled()

        page.locator("#vm-schedules").get_by_role("button", name="Schedule").click()
        confirm(page, "Schedule", every="6h", keep_last="3")
        schedule = page.locator("#vm-schedules tr[data-schedule]")
        expect(schedule).to_contain_text("6h")
        expect(schedule).to_contain_text("last 3")
        (made,) = cluster.cli_json("backup", "schedule", "list")
        assert (made["pattern"], made["every"], made["keep"]) == ("web1", 21600, {"last": 3})
        schedule.get_by_role("button", name="Delete").click()
        confirm(page, "Delete")
        expect(schedule).to_have_count(0)
        assert cluster.cli_json("backup", "schedule", "list") == []
        # the graphs are kept by host1's peer, which serves no API here: said in one line
        expect(page.locator(".graphs-error")).to_contain_text("serves no API")
        assert page.problems == []


def test_a_host_page_shows_its_capacity_version_vms_and_foreign_domains(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    with opened(chromium, api.url, token(api, "operator"), at="#/host/host1") as page:
        expect(page.locator("#host-head .state")).to_have_text("up")
        details = page.locator("#host-details")
        expect(details).to_contain_text("peerctl 0.1.0")
        expect(details).to_contain_text("1 of 16 given to VMs")
        expect(details.locator("meter")).to_have_count(2)
        expect(vm_row(page, "web1", "host-vms")).to_be_visible()
        foreign = page.locator("#host-foreign tr[data-domain='test']")  # the test driver's own
        expect(foreign).to_contain_text("no libvirt storage pool")
        expect(foreign.get_by_role("button", name="Adopt")).to_be_disabled()
        assert page.problems == []


@pytest.mark.slow           # a peer serving the API, and its first samples: ~15 s
def test_graphs_of_a_host_and_a_vm_are_drawn(chromium, cluster, store, tmp_path):
    client = serving_api(cluster, store, "host1", role="operator")
    boot_vms(cluster, "web1", on="host1")
    secret = client.session.headers["Authorization"][len("Bearer "):]
    with opened(chromium, client.url, secret, at="#/host/host1") as page:
        cpu = page.locator("figure[data-chart='cpu'] polyline[data-series='cpu_pct']")
        expect(cpu.first).to_be_attached(timeout=15 * SECOND)
        if os.environ.get("PEERCTL_PAGE_SHOTS"):        # for docs/: a minute of points
            page.wait_for_function("""() => [...document.querySelectorAll(
                "figure[data-chart='cpu'] polyline")].some((line) =>
                line.getAttribute("points").split(" ").length >= 6)""", timeout=90 * SECOND)
        shot(page, "host", tmp_path)

        page.goto(client.url + "/#/vm/web1")
        # the VM is measured at the first 10 s sample after its boot
        memory = page.locator("figure[data-chart='memory'] polyline[data-series='mem_bytes']")
        expect(memory.first).to_be_attached(timeout=25 * SECOND)
        assert memory.first.get_attribute("points").split()
        expect(page.locator("figure[data-chart='memory'] .legend")).to_contain_text("64 MiB")
        page.get_by_role("button", name="last day").click()
        expect(page.locator("section[data-graphs='vms/web1']")).to_have_attribute("data-span", "day")
        page.get_by_role("button", name="last hour").click()
        expect(page.locator("section[data-graphs='vms/web1']")).to_have_attribute("data-span", "hour")
        shot(page, "vm", tmp_path)
        assert page.problems == []


def test_the_task_log_shows_an_automation_started_from_the_command_line(
        chromium, api, cluster, tmp_path):
    with opened(chromium, api.url, token(api, "viewer"), at="#/tasks") as page:
        expect(page.locator("#task-log")).to_contain_text("No automation runs.")
        booted = cluster.cli_json("boot", "web3", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1",
                                  "--on", "host2")
        row = page.locator(f"#task-log tr[data-automation='{booted['automation']}']")
        expect(row.locator(".state")).to_have_text("done", timeout=5 * SECOND)
        expect(row).to_contain_text("boot")
        expect(row).to_contain_text("1/1")
        row.get_by_role("link").click()
        expect(page).to_have_url(f"{api.url.rstrip('/')}/#/tasks/{booted['automation']}")
        detail = page.locator("#task-log tr.detail")
        expect(detail.locator("li[data-label='web3']")).to_contain_text("built")
        expect(detail.get_by_role("link", name="web3")).to_be_visible()
        shot(page, "tasks", tmp_path)


def test_a_stop_of_two_selected_vms_is_confirmed_with_both_and_shows_their_progress(
        chromium, api, cluster, tmp_path):
    boot_vms(cluster, "web1", "web2", on="host1")
    boot_vms(cluster, "db1", on="host2")
    with opened(chromium, api.url, token(api, "operator")) as page:
        for name in ("web1", "db1"):
            vm_row(page, name).get_by_role("checkbox").check()
        bulk = page.locator("#vms-bulk")
        expect(bulk.locator(".chosen")).to_have_text("2 selected")
        bulk.get_by_role("button", name="Stop", exact=True).click()
        dialog = page.locator("#confirm")
        targets = dialog.locator("#confirm-targets li")
        expect(targets).to_have_text(["web1 on host1", "db1 on host2"])   # the route's plan
        shot(page, "confirm", tmp_path)
        dialog.get_by_role("button", name="Stop").click()
        card = page.locator("#automations article", has_text="stop 2 VMs")
        expect(card.locator("header .state")).to_have_text("done", timeout=SOON)
        for name in ("web1", "db1"):
            expect(card.locator(f"li[data-label='{name}']")).to_contain_text("stopped")
            expect(vm_row(page, name).locator(".vmstate")).to_have_text("shutoff")
        expect(vm_row(page, "web2").locator(".vmstate")).to_have_text("running")
        states = {vm["name"]: vm["state"] for vm in cluster.cli_json("vmlist")}
        assert states == {"web1": "shutoff", "web2": "running", "db1": "shutoff"}


def test_a_viewer_gets_no_action_on_any_view(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host1")
    cluster.cli_json("lease", "create", "maint", "--start", "+1h", "--end", "+1d", "--hosts", "1")
    with opened(chromium, api.url, token(api, "viewer")) as page:
        for at, ready in (("#/", "#vms tr[data-vm='web1']"), ("#/vm/web1", "#vm-record dd"),
                          ("#/host/host1", "#host-details dd"), ("#/tasks", "#task-log tr")):
            page.goto(api.url.rstrip("/") + "/" + at)
            expect(page.locator(ready).first).to_be_visible()
            expect(page.locator(".actions button:visible")).to_have_count(0)
            expect(page.locator("#view input[type=checkbox]:visible")).to_have_count(0)
            expect(page.locator("#view form:visible")).to_have_count(0)


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_host_that_dies_shows_as_down(chromium, api, cluster):
    boot_vms(cluster, "web1", on="host2")
    with opened(chromium, api.url, token(api, "viewer"), at="#/host/host2") as page:
        expect(page.locator("#host-head .state")).to_have_text("up")
        cluster.kill("host2")                          # SIGKILL, by its PID: its lease runs out
        expect(page.locator("#host-head .state")).to_have_text("down", timeout=10 * SECOND)
        expect(page.locator("#host-details")).to_contain_text("down: its record is gone")
        expect(page.locator("#tree-hosts li[data-host='host2'] .dot").first).to_have_class("dot down")
        expect(vm_row(page, "web1", "host-vms").locator(".vmstate")).to_have_text("unknown")
        page.goto(api.url.rstrip("/") + "/#/vm/web1")
        expect(page.locator("#vm-record")).to_contain_text("unknown: host host2 is down")


def test_at_420_px_nothing_overflows_the_body(chromium, api, cluster, tmp_path):
    boot_vms(cluster, "web1", "web2", on="host1")
    with opened(chromium, api.url, token(api, "operator"), viewport=NARROW) as page:
        overflow = "() => document.documentElement.scrollWidth - window.innerWidth"
        for at, ready in (("#/", "#vms tr[data-vm='web1']"), ("#/vm/web1", "#vm-record dd"),
                          ("#/host/host1", "#host-details dd"), ("#/tasks", "#task-log tr")):
            page.goto(api.url.rstrip("/") + "/" + at)
            expect(page.locator(ready).first).to_be_visible()
            assert page.evaluate(overflow) <= 0, at
            if at == "#/":
                shot(page, "narrow", tmp_path)
        expect(page.locator("#nav")).to_be_hidden()        # the tree, behind ☰
        page.get_by_role("button", name="Show the tree").click()
        expect(page.locator("#tree-hosts li[data-host='host1']")).to_be_visible()
        page.locator("#tree-hosts li[data-host='host1'] > a").click()
        expect(page.locator("#host-head h2")).to_contain_text("host1")
        expect(page.locator("#nav")).to_be_hidden()


# -- every kind of action, each confirmed in the dialog ------------------------------------------

@pytest.mark.slow           # a dozen automations one after another: ~12 s
def test_every_kind_of_action_from_the_page_is_confirmed_and_followed(
        chromium, api, cluster):
    boot_vms(cluster, "web1", "web2", on="host1")
    vms = lambda: {vm["name"]: vm for vm in cluster.cli_json("vmlist")}      # noqa: E731
    with opened(chromium, api.url, token(api, "operator")) as page:
        vm_row(page, "web1").get_by_role("button", name="Backup").click()
        assert confirm(page, "Back up") == "web1 on host1"
        ended_card(page, "backup host1/web1")

        vm_row(page, "web1").get_by_role("button", name="Migrate").click()
        assert confirm(page, "Migrate", to="host2") == "web1: host1 → host2"
        ended_card(page, "migrate host1/web1")
        assert vms()["web1"]["host"] == "host2"

        page.goto(api.url.rstrip("/") + "/#/vm/web1")
        page.locator("#vm-head").get_by_role("button", name="HA").click()
        confirm(page, "Set HA")
        ended_card(page, "ha host2/web1")
        expect(page.locator("#vm-record")).to_contain_text("restart")

        backups = page.locator("#vm-backups")
        backups.get_by_role("button", name="Protect").click()
        confirm(page, "Protect")
        expect(backups.get_by_role("button", name="Delete")).to_be_disabled()
        assert [b["protected"] for b in cluster.cli_json("backup", "list")] == [True]
        backups.get_by_role("button", name="Restore").click()
        confirm(page, "Restore", **{"as": "web9"})
        ended_card(page, "restore")
        assert "web9" in vms()

        page.goto(api.url.rstrip("/") + "/#/host/host1")
        page.locator("#host-head").get_by_role("button", name="Evacuate").click()
        moves = confirm(page, "Evacuate", to="host2").splitlines()
        assert "web2: host1 → host2" in moves
        ended_card(page, "evacuate host1")
        expect(page.locator("#host-head .state")).to_have_text("drained")
        assert {vm["host"] for vm in vms().values()} == {"host2"}

        page.goto(api.url.rstrip("/") + "/#/")
        form = page.locator("#lease-form")
        for name, value in (("name", "maint"), ("start", "+1h"), ("end", "+1d"), ("hosts", "1")):
            form.locator(f"input[name={name}]").fill(value)
        form.get_by_role("button", name="Create").click()
        confirm(page, "Create")
        lease = page.locator("#leases tr[data-lease='maint']")
        expect(lease.locator(".state")).to_have_text("pending")
        lease.get_by_role("button", name="Delete").click()
        assert confirm(page, "Delete") == "lease maint"
        expect(lease).to_have_count(0)

        vm_row(page, "web2").get_by_role("checkbox").check()
        vm_row(page, "web9").get_by_role("checkbox").check()
        page.locator("#vms-bulk").get_by_role("button", name="Destroy").click()
        assert confirm(page, "Destroy").splitlines() == ["web2 on host2", "web9 on host2"]
        expect(vm_row(page, "web2")).to_have_count(0, timeout=SOON)
        expect(vm_row(page, "web9")).to_have_count(0)
        assert set(vms()) == {"web1"}

        page.goto(api.url.rstrip("/") + "/#/host/host2")
        page.locator("#host-head").get_by_role("button", name="Ping").click()
        confirm(page, "Ping")
        ended_card(page, "ping host2")
        vm_row(page, "web1", "host-vms").get_by_role("checkbox").check()
        page.locator("#host-vms-bulk").get_by_role("button", name="Unmanage").click()
        confirm(page, "Unmanage")
        ended_card(page, "unmanage host2/web1")
        foreign = page.locator("#host-foreign tr[data-domain='web1']")
        expect(foreign.get_by_role("button", name="Adopt")).to_be_enabled()
        foreign.get_by_role("button", name="Adopt").click()
        assert confirm(page, "Adopt") == "web1 on host2"
        ended_card(page, "adopt web1")
        expect(vm_row(page, "web1", "host-vms")).to_be_visible()
        expect(foreign).to_have_count(0)
        assert vms()["web1"]["host"] == "host2"
        assert page.locator("#notice").is_hidden()
        assert page.problems == []


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_running_automation_is_aborted_from_the_task_log(chromium, cluster, tmp_path):
    with held_requests(cluster, str(tmp_path / "hooks"), "ping") as gate, \
            served_api(cluster.etcd_url, cluster.name) as server:
        pinging = cluster.cli_json("ping", "--detach")["automation"]
        with opened(chromium, server.url, token(server, "operator"), at="#/tasks") as page:
            row = page.locator(f"#task-log tr[data-automation='{pinging}']")
            expect(row.locator(".state")).to_have_text("running")
            expect(page.locator("#tree")).to_contain_text("1 running")
            row.get_by_role("button", name="Abort").click()
            with page.expect_response(lambda answer: answer.request.method == "DELETE"
                                      and answer.url.endswith(pinging)):
                assert confirm(page, "Abort") == pinging    # the abort asked before the pings answer
            gate.open()                                 # its held pings answer, then it stops
            expect(row.locator(".state")).to_have_text("aborted", timeout=SOON)
            expect(row.get_by_role("button", name="Abort")).to_have_count(0)
            assert cluster.cli_json("task", pinging)["state"] == "aborted"
