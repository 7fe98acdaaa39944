// The tree beside every view: the datacenter, its hosts (status, how many
// VMs; a host opens to its VMs, drawn only once opened), and the task log.
// A redraw touches only the hosts whose line changed.

import { $, el, natural, hostHref, vmHref, keyed, setText, setAttr } from "./dom.js";
import { state, vmRows, subscribe, hostStatus, ended } from "./store.js";

const opened = new Set();           // hosts whose VMs the tree shows

function hostItem(name, status, vms, here, redraw) {
  const open = opened.has(name);
  const toggle = el("button", { type: "button", className: "twisty", textContent: open ? "▾" : "▸",
                                attrs: { "aria-label": `${open ? "close" : "open"} ${name}`,
                                         "aria-expanded": String(open) },
                                on: { click: () => {
                                  if (opened.has(name)) opened.delete(name);
                                  else opened.add(name);
                                  redraw();
                                } } });
  const href = hostHref(name);
  return el("li", { dataset: { host: name }, className: `host ${status}` },
    toggle,
    el("a", { href, className: here === href ? "here" : "" }, el("span", { className: `dot ${status}`, title: status }), name),
    el("span", { className: "count" }, `${vms.length}`),
    open ? el("ul", {}, vms.map((vm) => el("li", { dataset: { vm: vm.name } },
      el("a", { href: vmHref(vm.name), className: here === vmHref(vm.name) ? "here" : "" },
         el("span", { className: `dot ${vm.state}`, title: vm.state }), vm.name)))) : null);
}

export function startTree() {
  const datacenter = el("a", { href: "#/" }, "Datacenter");
  const vmCount = el("span", { className: "count" });
  const hosts = el("ul", { id: "tree-hosts" });
  const taskLog = el("a", { href: "#/tasks" }, "Task log");
  const runningCount = el("span", { className: "count" });
  $("tree").replaceChildren(el("ul", { className: "tree" },
    el("li", { className: "root" }, datacenter, vmCount, hosts),
    el("li", { className: "root" }, taskLog, runningCount)));

  const draw = () => {
    const byHost = new Map();
    const vms = vmRows();
    for (const vm of vms) {
      if (!byHost.has(vm.host)) byHost.set(vm.host, []);
      byHost.get(vm.host).push(vm);
    }
    const names = [...new Set([...state.hosts.keys(), ...byHost.keys()])].sort(natural);
    const here = location.hash;
    const running = [...state.tasks.values()].filter((t) => !ended(t)).length;
    setAttr(datacenter, "class", here === "#/" || here === "" ? "here" : "");
    setAttr(taskLog, "class", here.startsWith("#/tasks") ? "here" : "");
    setText(vmCount, `${vms.length} VMs`);
    setText(runningCount, running ? `${running} running` : "");
    keyed(hosts, names, {
      key: (name) => name,
      signature: (name) => {
        const mine = byHost.get(name) || [];
        return [hostStatus(state.hosts.get(name)), mine.length, here === hostHref(name),
                opened.has(name) ? JSON.stringify([here, mine.map((vm) => [vm.name, vm.state])]) : false];
      },
      make: (name) => hostItem(name, hostStatus(state.hosts.get(name)), byHost.get(name) || [], here, draw),
    });
  };
  draw();
  subscribe(["hosts", "vms", "automations", "route"], draw);
}
