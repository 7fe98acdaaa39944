// The tree beside every view: the datacenter, its hosts (status, how many
// VMs; a host opens to its VMs, drawn only once opened), and the task log.

import { $, el, natural, hostHref, vmHref } from "./dom.js";
import { state, vmRows, subscribe, hostStatus, ended } from "./store.js";

const opened = new Set();           // hosts whose VMs the tree shows

export function startTree() {
  let drawn = null;                 // what the tree shows: redrawn only when that changes
  const draw = () => {
    const byHost = new Map();
    for (const vm of vmRows()) {
      if (!byHost.has(vm.host)) byHost.set(vm.host, []);
      byHost.get(vm.host).push(vm);
    }
    const names = [...new Set([...state.hosts.keys(), ...byHost.keys()])].sort(natural);
    const here = location.hash;
    const running = [...state.tasks.values()].filter((t) => !ended(t)).length;
    const shows = JSON.stringify([here, running, names.map((name) => [name, hostStatus(state.hosts.get(name)),
      (byHost.get(name) || []).length, opened.has(name) ? (byHost.get(name) || []).map((vm) => [vm.name, vm.state]) : 0])]);
    if (shows === drawn) return;
    drawn = shows;
    const hostItems = names.map((name) => {
      const status = hostStatus(state.hosts.get(name));
      const vms = byHost.get(name) || [];
      const toggle = el("button", { type: "button", className: "twisty", textContent: opened.has(name) ? "▾" : "▸",
                                    attrs: { "aria-label": `${opened.has(name) ? "close" : "open"} ${name}`,
                                             "aria-expanded": String(opened.has(name)) },
                                    on: { click: () => {
                                      if (opened.has(name)) opened.delete(name);
                                      else opened.add(name);
                                      draw();
                                    } } });
      const href = hostHref(name);
      return el("li", { dataset: { host: name }, className: `host ${status}` },
        toggle,
        el("a", { href, className: here === href ? "here" : "" }, el("span", { className: `dot ${status}`, title: status }), name),
        el("span", { className: "count" }, `${vms.length}`),
        opened.has(name) ? el("ul", {}, vms.map((vm) => el("li", { dataset: { vm: vm.name } },
          el("a", { href: vmHref(vm.name), className: location.hash === vmHref(vm.name) ? "here" : "" },
             el("span", { className: `dot ${vm.state}`, title: vm.state }), vm.name)))) : null);
    });
    $("tree").replaceChildren(el("ul", { className: "tree" },
      el("li", { className: "root" }, el("a", { href: "#/", className: here === "#/" || here === "" ? "here" : "" }, "Datacenter"),
         el("span", { className: "count" }, `${vmRows().length} VMs`),
         el("ul", { id: "tree-hosts" }, hostItems)),
      el("li", { className: "root" }, el("a", { href: "#/tasks", className: here.startsWith("#/tasks") ? "here" : "" }, "Task log"),
         el("span", { className: "count" }, running ? `${running} running` : ""))));
  };
  draw();
  subscribe(["hosts", "vms", "automations", "route"], draw);
}
