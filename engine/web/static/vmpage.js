// A VM's page (#/vm/NAME): its record, actions and console, graphs, its
// backups (restore, protect, delete), snapshots, replica, group, lease, and
// the automations that touched it.

import { api, enc, ApiError } from "./api.js";
import { el, badge, facts, mib, gb, hostHref, when, age, table, section } from "./dom.js";
import { state, vmNamed, subscribe, readOnce } from "./store.js";
import { buttons, vmActionsFor, backupAction } from "./actions.js";
import { openConsole } from "./console.js";
import { graphPanel } from "./graphs.js";
import { automationsOf, taskTable } from "./tasks.js";

function leaseOf(name) {
  return state.leases.find((lease) => (lease.vms || []).some((vm) => (vm.name || vm) === name)) || null;
}

function replicaText(replica) {
  if (!replica) return "not replicated";
  if (typeof replica !== "object") return String(replica);
  return Object.entries(replica).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

export function vmPage(root, name) {
  const head = el("section", { className: "card page-head", id: "vm-head" });
  const record = el("section", { className: "card", id: "vm-record" });
  const backups = el("section", { className: "card", id: "vm-backups" }, el("h2", {}, "Backups"), el("p", { className: "empty" }, "reading..."));
  const snapshots = section("Snapshots", el("p", { className: "hint", id: "vm-snapshots" },
    "Snapshots are not served by this API yet (the snapshot routes are being added); they will be listed here."));
  const history = el("section", { className: "card", id: "vm-automations" });
  let graphs = null;
  let graphsHost = null;
  const graphSlot = el("div", {});
  root.replaceChildren(head, record, graphSlot, backups, snapshots, history);

  function drawRecord() {
    const vm = vmNamed(name);
    if (!vm) {
      head.replaceChildren(el("h2", {}, name), el("p", { className: "empty" },
        state.records.size ? `No VM ${name} (destroyed, or never booted).` : "listing..."));
      record.replaceChildren();
      return;
    }
    const actions = vmActionsFor([vm], true);
    if (vm.state === "running") actions.push({ label: "Console", run: () => openConsole(vm) });
    head.replaceChildren(
      el("h2", {}, el("span", { className: "kind" }, "VM "), vm.name, " ", badge(vm.state), vm.crashed ? " (crashed)" : null,
         el("span", { className: "on" }, " on ", el("a", { href: hostHref(vm.host) }, vm.host))),
      buttons(actions));
    const lease = leaseOf(name);
    record.replaceChildren(el("h2", {}, "Record"), facts([
      ["Host", el("a", { href: hostHref(vm.host) }, vm.host)],
      ["State", vm.hostDown ? `unknown: host ${vm.host} is down` : vm.state],
      vm.state_reason ? ["Why", vm.state_reason] : null,
      ["UUID", el("code", {}, vm.uuid)],
      ["vCPUs", vm.vcpus ?? "-"], ["Memory", mib(vm.memory_mb)], ["Disk", gb(vm.disk_gb)],
      ["Addresses", (vm.addresses || []).length ? vm.addresses.map((a) => `${a.addr}/${a.prefix} (${a.interface})`).join(", ") : vm.ip || "-"],
      ["HA", vm.ha || "none"],
      ["Restarts", vm.restarts ?? "-"],
      ["Group", vm.group ? `${vm.group} (${state.groupRules.get(vm.group) || "?"})` : "none"],
      ["Lease", lease ? `${lease.lease} (${lease.state}, until ${when(lease.end)})` : "none"],
      ["Replica", replicaText(vm.replica)],
      ["Newest backup", vm.backup ? `${vm.backup.id}, ${age(vm.backup.time)} ago` : "none"],
    ]));
    if (graphsHost !== vm.host || !graphs) {        // moved: its graphs are kept by the new host's peer
      if (graphs) graphs.stop();
      graphs = graphPanel("vms", name);
      graphsHost = vm.host;
      graphSlot.replaceChildren(graphs);
    }
  }

  function readBackupList() {
    readOnce(`backups of ${name}`, async () => {
      let rows = [];
      try {
        rows = (await api("GET", `/v1/backups?pattern=${enc(name)}`)).doc;
      } catch (error) {
        if (!(error instanceof ApiError && error.status === 404)) throw error;
      }
      const trs = rows.map((b) => el("tr", { dataset: { backup: b.id } },
        el("td", {}, el("code", {}, b.id)), el("td", { className: "time", title: b.time }, `${age(b.time)} ago`),
        el("td", {}, b.kind), el("td", { className: "hide-narrow" }, b.target),
        el("td", { className: "hide-narrow" }, b.consistency || "-"),
        el("td", {}, b.protected ? "protected" : b.lost ? badge("lost") : b.newest ? "newest" : ""),
        el("td", { className: "actions operator-only" }, buttons([
          { label: "Restore", run: () => backupAction("restore", b) },
          b.protected ? { label: "Unprotect", run: () => backupAction("unprotect", b) }
            : { label: "Protect", run: () => backupAction("protect", b) },
          { label: "Delete", danger: true, run: () => backupAction("delete", b),
            refused: b.protected ? "protected: unprotect it first" : null }]))));
      backups.replaceChildren(el("h2", {}, "Backups ", el("span", { className: "count" }, `${rows.length}`)),
        table(["Backup", "Taken", "Kind", el("th", { className: "hide-narrow" }, "On"),
               el("th", { className: "hide-narrow" }, "Consistency"), "", el("th", { className: "operator-only" }, "")],
              trs, "No backups."));
    });
  }

  function drawHistory() {
    history.replaceChildren(el("h2", {}, "Automations"),
      el("p", { className: "hint" }, "The cluster's recent automations that touched this VM."),
      taskTable(automationsOf(name)));
  }

  drawRecord();
  readBackupList();
  drawHistory();
  const stops = [
    subscribe(["vms", "hosts", "leases", "groups"], drawRecord),
    subscribe(["backups"], readBackupList),
    subscribe(["automations"], drawHistory),
  ];
  return () => {
    stops.forEach((stop) => stop());
    if (graphs) graphs.stop();
  };
}
