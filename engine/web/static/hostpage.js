// A host's page (#/host/NAME): status, version, verify status, capacity
// and what holds it (leases, drain, reservations), its graphs, its VMs, and
// the foreign domains on it (libvirt's, not peerctl's: adopt them), and the
// disks an HA restart kept aside on it.

import { api } from "./api.js";
import { el, badge, facts, usage, when, table } from "./dom.js";
import { state, subscribe, hostStatus, vmRows, readOnce } from "./store.js";
import { buttons, hostActionsFor, adopt } from "./actions.js";
import { graphPanel } from "./graphs.js";
import { vmList } from "./vmlist.js";
import { asideCard } from "./aside.js";

const used = (total, free) => (typeof total === "number" && typeof free === "number" ? Math.max(total - free, 0) : null);

function verifyText(verify) {
  if (!verify) return "not verified";
  if (typeof verify !== "object") return String(verify);
  return Object.entries(verify).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

export function hostPage(root, name) {
  const head = el("section", { className: "card page-head", id: "host-head" });
  const details = el("section", { className: "card", id: "host-details" });
  const foreign = el("section", { className: "card", id: "host-foreign" }, el("h2", {}, "Foreign domains"));
  const graphs = graphPanel("hosts", name);
  const vms = vmList({ fixedHost: name, id: "host-vms" });
  const aside = asideCard(name);
  root.replaceChildren(head, details, graphs, vms.node, foreign, aside.node);

  function draw() {
    const host = state.hosts.get(name);
    if (!host) {
      head.replaceChildren(el("h2", {}, name), el("p", { className: "empty" },
        state.hosts.size ? `No host ${name}.` : "listing..."));
      details.replaceChildren();
      return;
    }
    const status = hostStatus(host);
    head.replaceChildren(el("h2", {}, el("span", { className: "kind" }, "Host "), name, " ", badge(status)),
                         buttons(hostActionsFor(host)));
    const mine = vmRows().filter((vm) => vm.host === name);
    const leases = state.leases.filter((lease) => (lease.hosts || []).includes(name));
    details.replaceChildren(el("h2", {}, "Capacity and state"), facts([
      ["Status", status === "down" ? "down: its record is gone (its peer stopped, or lost etcd)" : status],
      ["VMs", `${mine.length} (${mine.filter((vm) => vm.state === "running").length} running)`],
      ["vCPUs", `${mine.reduce((n, vm) => n + (vm.vcpus || 0), 0)} of ${host.vcpus ?? "-"} given to VMs`],
      ["Memory", usage(used(host.memory_mb, host.free_memory_mb), host.memory_mb, "MiB")],
      ["Disk", usage(used(host.disk_gb, host.free_disk_gb), host.disk_gb, "GB")],
      ["Foreign", host.foreign_vms ? `${host.foreign_vms} domains: ${host.foreign_vcpus} vCPUs, ${host.foreign_memory_mb} MiB` : "none"],
      ["Drained", host.drained ? "yes: no new VM lands here" : "no"],
      ["Reserved by", host.reserved_by || "none"],
      ["Leases", leases.length ? leases.map((l) => `${l.lease} (${l.state}, ${when(l.start)} to ${when(l.end)})`).join("; ") : "none"],
      ["Version", host.version ? `peerctl ${host.version}, feature level ${host.feature_level ?? "-"}` : "-"],
      ["Hypervisor", host.hypervisor || "-"], ["Kernel", host.kernel || "-"], ["CPU", host.cpu_model || "-"],
      ["Networks", (host.networks || []).join(", ") || "-"],
      ["Verify", verifyText(host.verify)],
    ]));
  }

  function readForeign() {
    readOnce(`foreign of ${name}`, async () => {
      const { doc } = await api("GET", "/v1/vms?all=true");
      const domains = doc.filter((vm) => vm.host === name && vm.managed === false);
      foreign.replaceChildren(el("h2", {}, "Foreign domains ", el("span", { className: "count" }, `${domains.length}`)),
        el("p", { className: "hint" }, "Domains libvirt runs here that peerctl does not manage."),
        table(["Domain", "State", "vCPUs", "Memory", "Manager", "Problems", el("th", { className: "operator-only" }, "")],
          domains.map((d) => el("tr", { dataset: { domain: d.name } },
            el("td", {}, d.name), el("td", {}, badge(d.state)), el("td", {}, d.vcpus ?? "-"),
            el("td", {}, d.memory_mb ? `${d.memory_mb} MiB` : "-"), el("td", {}, d.manager || "-"),
            el("td", { className: "problems" }, (d.problems || []).join("; ") || "none"),
            el("td", { className: "actions operator-only" }, buttons([{ label: "Adopt", run: () => adopt([d]),
              refused: (d.problems || []).length ? "it has problems: see them" : null }])))),
          "No foreign domains."));
    });
  }

  draw();
  readForeign();
  const stops = [subscribe(["hosts", "vms", "leases"], draw), subscribe(["foreign"], readForeign)];
  return () => {
    stops.forEach((stop) => stop());
    vms.stop();
    aside.stop();
    graphs.stop();
  };
}

