// A VM's page (#/vm/NAME): its record, actions and console, graphs, its
// backups (restore, protect, delete), snapshots, replica, group, lease, and
// the automations that touched it.

import { api, enc, ApiError } from "./api.js";
import { el, badge, facts, mib, gb, hostHref, when, age, table, duration, throttled } from "./dom.js";
import { state, vmNamed, subscribe, readOnce } from "./store.js";
import { buttons, vmActionsFor, backupAction, scheduleAction } from "./actions.js";
import { openConsole } from "./console.js";
import { graphPanel } from "./graphs.js";
import { automationsOf, taskTable } from "./tasks.js";
import { snapshotCard } from "./snapshots.js";

function leaseOf(name) {
  return state.leases.find((lease) => (lease.vms || []).some((vm) => (vm.name || vm) === name)) || null;
}

// Whether a schedule's pattern (NAME or HOST/NAME, with * ? [...]) matches the VM.
function globbed(pattern, vm) {
  const regex = (glob) => new RegExp(`^${glob.replace(/[.+^${}()|\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
  return pattern.includes("/") ? regex(pattern).test(`${vm.host}/${vm.name}`) : regex(pattern).test(vm.name);
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
  const schedules = el("section", { className: "card", id: "vm-schedules" }, el("h2", {}, "Backup schedules"));
  const snapshots = snapshotCard(name);
  const history = el("section", { className: "card", id: "vm-automations" });
  let graphs = null;
  let graphsHost = null;
  const graphSlot = el("div", {});
  root.replaceChildren(head, record, graphSlot, backups, schedules, snapshots.node, history);

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

  function readSchedules() {
    readOnce(`schedules of ${name}`, async () => {
      const vm = vmNamed(name) || { name, host: "" };
      const { doc } = await api("GET", "/v1/backups/schedules");
      const mine = doc.filter((schedule) => globbed(schedule.pattern, vm));
      schedules.replaceChildren(el("h2", {}, "Backup schedules ", el("span", { className: "count" }, `${mine.length}`),
          buttons([{ label: "Schedule", title: "Back up this VM at every interval",
                     run: () => scheduleAction("create", { vm }).then(readSchedules) }])),
        table(["Pattern", "Every", "Keep", "Next", "Runs", el("th", { className: "operator-only" }, "")],
          mine.map((schedule) => el("tr", { dataset: { schedule: schedule.schedule } },
            el("td", {}, schedule.pattern), el("td", {}, duration(schedule.every)),
            el("td", {}, Object.entries(schedule.keep || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "all"),
            el("td", { className: "time" }, when(schedule.next)), el("td", {}, schedule.runs),
            el("td", { className: "actions operator-only" }, buttons([{ label: "Delete", danger: true,
              run: () => scheduleAction("delete", { schedule }).then(readSchedules) }])))),
          "No schedule backs this VM up."));
    });
  }

  function drawHistory() {
    history.replaceChildren(el("h2", {}, "Automations"),
      el("p", { className: "hint" }, "The cluster's recent automations that touched this VM."),
      taskTable(automationsOf(name)));
  }

  drawRecord();
  readBackupList();
  readSchedules();
  drawHistory();
  const stops = [
    subscribe(["vms", "hosts", "leases", "groups"], drawRecord),
    subscribe(["backups"], readBackupList),
    subscribe(["automations"], throttled(drawHistory, 250)),
  ];
  return () => {
    stops.forEach((stop) => stop());
    snapshots.stop();
    if (graphs) graphs.stop();
  };
}
