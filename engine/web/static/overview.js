// The datacenter (#/): its hosts (status, VMs, capacity, actions), every
// VM (vmlist.js), boot and balance, and the leases.

import { el, natural, usage, badge, hostHref, when, table } from "./dom.js";
import { state, vmRows, subscribe, hostStatus, isOperator } from "./store.js";
import { buttons, hostActionsFor, boot, balance, leaseAction, createLease } from "./actions.js";
import { vmList } from "./vmlist.js";

const used = (total, free) => (typeof total === "number" && typeof free === "number" ? Math.max(total - free, 0) : null);

export function hostsTable() {
  const tbody = el("tbody", {});
  const count = el("span", { className: "count", id: "hosts-count" });
  const node = el("section", { className: "card", id: "hosts-section" },
    el("h2", {}, "Hosts ", count,
       isOperator() ? el("button", { type: "button", className: "operator-only right", textContent: "Balance",
                                     on: { click: () => balance() } }) : null),
    el("div", { className: "scroll-x" }, el("table", { id: "hosts" },
      el("thead", {}, el("tr", {}, el("th", {}, "Host"), el("th", {}, "Status"), el("th", { className: "num" }, "VMs"),
        el("th", { className: "num hide-narrow" }, "vCPUs"), el("th", {}, "Memory"), el("th", { className: "hide-narrow" }, "Disk"),
        el("th", { className: "operator-only" }, "Actions"))),
      tbody)));
  let drawn = null;                 // what the table shows: redrawn only when that changes
  const draw = () => {
    const counts = new Map();
    for (const vm of vmRows()) counts.set(vm.host, (counts.get(vm.host) || 0) + 1);
    const hosts = [...state.hosts.values()].sort((a, b) => natural(a.host, b.host));
    const shows = JSON.stringify([hosts, [...counts]]);
    if (shows === drawn) return;
    drawn = shows;
    count.textContent = `${hosts.filter((h) => h.alive).length} of ${hosts.length} up`;
    tbody.replaceChildren(...(hosts.length ? hosts.map((host) => el("tr", { dataset: { host: host.host } },
      el("td", {}, el("a", { href: hostHref(host.host) }, host.host)),
      el("td", {}, badge(hostStatus(host))),
      el("td", { className: "num vms" }, counts.get(host.host) || 0),
      el("td", { className: "num hide-narrow" }, host.vcpus ?? "-"),
      el("td", {}, usage(used(host.memory_mb, host.free_memory_mb), host.memory_mb, "MiB")),
      el("td", { className: "hide-narrow" }, usage(used(host.disk_gb, host.free_disk_gb), host.disk_gb, "GB")),
      el("td", { className: "actions operator-only" }, buttons(hostActionsFor(host).filter((a) => a.label !== "Remove")))))
      : [el("tr", { className: "empty" }, el("td", { colSpan: 7 }, "No hosts yet."))]));
  };
  draw();
  return { node, stop: subscribe(["hosts", "vms"], draw) };
}

function bootForm() {
  const names = el("input", { id: "boot-names", name: "names", required: true, placeholder: "names" });
  const resources = el("input", { id: "boot-resources", name: "resources", required: true,
                                  value: "VCPU:1,MEMORY_MB:256,DISK_GB:1", attrs: { "aria-label": "Resources" } });
  const on = el("input", { id: "boot-on", name: "on", placeholder: "on host glob (optional)", attrs: { "aria-label": "On hosts" } });
  const ha = el("select", { id: "boot-ha", attrs: { "aria-label": "HA" } }, el("option", { value: "" }, "HA: none"),
                el("option", { value: "restart" }, "HA: restart"));
  const group = el("input", { id: "boot-group", placeholder: "group (optional)", attrs: { "aria-label": "Group" } });
  const rule = el("select", { id: "boot-rule", attrs: { "aria-label": "Group rule" } }, el("option", { value: "" }, "rule: the group's"),
                  el("option", { value: "spread" }, "spread"), el("option", { value: "together" }, "together"));
  const form = el("form", { id: "boot-form", className: "operator-only inline-form" },
    el("label", { htmlFor: "boot-names" }, "Boot"), names, resources, on, ha, group, rule,
    el("button", { type: "submit" }, "Boot"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const list = names.value.split(/[\s,]+/).filter(Boolean);
    if (!list.length || !resources.value.trim()) return;
    const done = await boot({ names: list, resources: resources.value.trim(), on: on.value.trim(),
                              ha: ha.value, group: group.value.trim(), rule: rule.value });
    if (done) names.value = "";
  });
  return form;
}

function leaseForm() {
  const field = (name, placeholder, props = {}) => el("input", { name, placeholder, attrs: { "aria-label": placeholder }, ...props });
  const inputs = {
    name: field("name", "name", { required: true }), start: field("start", "start (now, +1h, ISO)", { required: true }),
    end: field("end", "end (+1d, ISO)", { required: true }), hosts: field("hosts", "hosts (how many)"),
    resources: field("resources", "or resources VCPU:2,..."), amount: field("amount", "amount"),
  };
  const form = el("form", { id: "lease-form", className: "operator-only inline-form" },
    el("label", {}, "New lease"), Object.values(inputs), el("button", { type: "submit" }, "Create"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { name: inputs.name.value.trim(), start: inputs.start.value.trim(), end: inputs.end.value.trim() };
    if (inputs.hosts.value.trim()) body.hosts = Number(inputs.hosts.value);
    if (inputs.resources.value.trim()) {
      body.resources = inputs.resources.value.trim();
      body.amount = Number(inputs.amount.value || 1);
    }
    if (await createLease(body)) inputs.name.value = "";
  });
  return form;
}

export function leasesSection() {
  const count = el("span", { className: "count", id: "leases-count" });
  const holder = el("div", {});
  const node = el("section", { className: "card", id: "leases-section" }, el("h2", {}, "Leases ", count),
                  isOperator() ? leaseForm() : null, holder);
  const draw = () => {
    count.textContent = `${state.leases.length}`;
    const rows = state.leases.map((lease) => el("tr", { dataset: { lease: lease.lease } },
      el("td", {}, lease.lease),
      el("td", {}, badge(lease.state)),
      el("td", { className: "time" }, when(lease.start)),
      el("td", { className: "time" }, when(lease.end)),
      el("td", {}, lease.kind === "hosts"
        ? [`${lease.amount} host${lease.amount === 1 ? "" : "s"}`,
           ...(lease.hosts || []).map((h, i) => [i ? ", " : ": ", el("a", { href: hostHref(h) }, h)])]
        : `${lease.amount} × ${lease.resources}`),
      el("td", { className: "num" }, lease.used),
      el("td", { className: "actions operator-only" }, buttons([
        { label: "Extend", run: () => leaseAction("extend", lease) },
        { label: "Delete", danger: true, run: () => leaseAction("delete", lease) }]))));
    holder.replaceChildren(table(["Lease", "State", "Start (UTC)", "End (UTC)", "Holds", el("th", { className: "num" }, "VMs"),
                                  el("th", { className: "operator-only" }, "")], rows, "No leases.", { id: "leases" }));
  };
  draw();
  return { node, stop: subscribe(["leases"], draw) };
}

export function overview(root) {
  const hosts = hostsTable();
  const vms = vmList();
  const leases = leasesSection();
  vms.node.insertBefore(bootForm(), vms.node.querySelector(".filters"));
  root.replaceChildren(hosts.node, vms.node, leases.node);
  return () => [hosts, vms, leases].forEach((part) => part.stop());
}
