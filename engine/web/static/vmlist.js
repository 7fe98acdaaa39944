// The VM list: search, filters (host, state, HA, group), sort by any
// column, a selection for the actions that take patterns, and each row's
// own actions.  Only the rows in view are in the document (a list of 1,000
// VMs is a scroll of fixed-height rows, the window drawn per frame).

import { el, natural, age, mib, gb, vmHref, hostHref, badge, place, setText, setAttr } from "./dom.js";
import { state, vmRows, subscribe, isOperator } from "./store.js";
import { vmActionsFor, buttons } from "./actions.js";
import { openConsole } from "./console.js";

const ROW = 34;                     // px, a row's fixed height (page.css: tr.vm)
const ALL_UNDER = 150;              // fewer rows than this: all drawn
const MARGIN = 15;                  // rows drawn above and below the window
const CHUNK = 10;                   // the window moves by this many rows (at most MARGIN)

// Kept across views: a person's filters stay while they look at a VM.
const filters = { text: "", host: "", state: "", ha: "", group: "", sort: "host", desc: false };
const selected = new Set();         // uuids

const COLUMNS = [
  ["name", "Name"], ["host", "Host"], ["state", "State"], ["vcpus", "vCPUs", "num"],
  ["memory_mb", "Memory", "num"], ["disk_gb", "Disk", "num hide-narrow"], ["ip", "IP", "hide-narrow"],
  ["ha", "HA", "hide-narrow"], ["group", "Group", "hide-narrow"], ["backup", "Backup", "hide-narrow"],
];

export function matching(vms, fixedHost) {
  const text = filters.text.toLowerCase();
  const host = fixedHost || filters.host;
  const rows = vms.filter((vm) => (!host || vm.host === host)
    && (!filters.state || vm.state === filters.state)
    && (!filters.ha || vm.ha === filters.ha)
    && (!filters.group || (filters.group === "(none)" ? !vm.group : vm.group === filters.group))
    && (!text || vm.name.toLowerCase().includes(text) || (vm.ip || "").includes(text)
        || vm.host.toLowerCase().includes(text) || (vm.group || "").toLowerCase().includes(text)));
  const key = filters.sort;
  const value = (vm) => (key === "backup" ? (vm.backup ? vm.backup.time : "") : vm[key]);
  rows.sort((a, b) => {
    const x = value(a);
    const y = value(b);
    const order = typeof x === "number" && typeof y === "number" ? x - y : natural(x, y);
    return (filters.desc ? -order : order) || natural(a.name, b.name);
  });
  return rows;
}

function rowActions(vm) {
  const wanted = vm.state === "running" ? ["Stop", "Migrate", "Backup"]
    : vm.state === "paused" ? ["Resume", "Stop", "Migrate", "Backup"]
      : ["Start", "Migrate", "Backup"];
  const actions = vmActionsFor([vm], false).filter((a) => wanted.includes(a.label))
    .sort((a, b) => wanted.indexOf(a.label) - wanted.indexOf(b.label));
  if (vm.state === "running") actions.push({ label: "Console", title: `The serial console of ${vm.host}/${vm.name}`, run: () => openConsole(vm) });
  return buttons(actions);
}

function vmTr(vm) {
  const check = el("input", { type: "checkbox", checked: selected.has(vm.uuid), attrs: { "aria-label": `select ${vm.name}` } });
  check.addEventListener("change", () => {
    if (check.checked) selected.add(vm.uuid);
    else selected.delete(vm.uuid);
    check.dispatchEvent(new CustomEvent("selection", { bubbles: true }));
  });
  return el("tr", { className: "vm", dataset: { vm: vm.name, host: vm.host, uuid: vm.uuid } },
    el("td", { className: "pick operator-only" }, isOperator() ? check : null),
    el("td", { className: "name" }, el("a", { href: vmHref(vm.name) }, vm.name)),
    el("td", { className: "host" }, el("a", { href: hostHref(vm.host) }, vm.host)),
    el("td", { className: "vmstate" }, badge(vm.state), vm.crashed ? " (crashed)" : null),
    el("td", { className: "num vcpus" }, vm.vcpus ?? "-"),
    el("td", { className: "num memory" }, mib(vm.memory_mb)),
    el("td", { className: "num disk hide-narrow" }, gb(vm.disk_gb)),
    el("td", { className: "mono ip hide-narrow" }, vm.ip || "-"),
    el("td", { className: "ha hide-narrow" }, vm.ha || "none"),
    el("td", { className: "group hide-narrow" }, vm.group || "-"),
    el("td", { className: "backup hide-narrow", title: vm.backup ? `backup ${vm.backup.id} at ${vm.backup.time}` : "no backup" },
      vm.backup ? `${age(vm.backup.time)} ago` : "-"),
    el("td", { className: "actions operator-only" }, isOperator() ? rowActions(vm) : null));
}

function options(id, label, values, current) {
  return el("select", { id, attrs: { "aria-label": label } },
    el("option", { value: "" }, `${label}: all`),
    values.map((v) => el("option", { value: v, selected: v === current }, v)));
}

// The list, all VMs or `fixedHost`'s; {node, stop}.
export function vmList({ fixedHost = null, id = "vms" } = {}) {
  const count = el("span", { className: "count", id: `${id}-count` });
  const search = el("input", { id: `${id}-search`, type: "search", placeholder: "search name, IP, host, group",
                               value: filters.text, attrs: { "aria-label": "Search VMs" } });
  const controls = el("div", { className: "filters" }, search);
  const bulk = el("div", { className: "bulk operator-only", id: `${id}-bulk` });
  const tbody = el("tbody", {});
  const all = el("input", { type: "checkbox", attrs: { "aria-label": "select all shown" } });
  const head = el("tr", {}, el("th", { className: "pick operator-only" }, isOperator() ? all : null),
    COLUMNS.map(([key, label, cls]) => el("th", { className: `${cls || ""} sortable`, dataset: { sort: key } },
      el("button", { type: "button", className: "sort", textContent: label, on: { click: () => sortBy(key) } }))),
    el("th", { className: "operator-only actions" }, "Actions"));
  const tableNode = el("table", { id, className: "vm-table" }, el("thead", {}, head), tbody);
  const scroller = el("div", { className: "vm-scroll" }, tableNode);
  const node = el("section", { className: "card", id: `${id}-section` },
    el("h2", {}, fixedHost ? `VMs on ${fixedHost} ` : "VMs ", count), controls, bulk, scroller);
  let rows = [];

  function sortBy(key) {
    filters.desc = filters.sort === key ? !filters.desc : false;
    filters.sort = key;
    recompute();
  }

  let offered = null;               // the filters' choices drawn: redrawn only when they change

  function drawControls() {
    const vms = vmRows();
    const hosts = [...new Set([...state.hosts.keys(), ...vms.map((v) => v.host)])].sort(natural);
    const states = [...new Set(vms.map((v) => v.state))].sort(natural);
    const groups = ["(none)", ...[...state.groupRules.keys()].sort(natural)];
    const choices = JSON.stringify([hosts, states, groups]);
    if (choices === offered) return;
    offered = choices;
    const selects = [
      fixedHost ? null : options(`${id}-host`, "Host", hosts, filters.host),
      options(`${id}-state`, "State", states, filters.state),
      options(`${id}-ha`, "HA", ["restart", "none"], filters.ha),
      options(`${id}-group`, "Group", groups, filters.group),
    ].filter(Boolean);
    for (const select of selects) {
      const key = select.id.slice(id.length + 1);
      select.addEventListener("change", () => {
        filters[key] = select.value;
        recompute();
      });
    }
    controls.replaceChildren(search, ...selects);
  }

  function drawBulk() {
    const chosen = vmRows().filter((vm) => selected.has(vm.uuid));
    if (!isOperator() || !chosen.length) {
      if (!bulk.hidden) {
        bulk.replaceChildren();
        bulk.hidden = true;
      }
      return;
    }
    bulk.hidden = false;
    bulk.replaceChildren(el("span", { className: "chosen" }, `${chosen.length} selected`),
      buttons(vmActionsFor(chosen, false)),
      el("button", { type: "button", className: "link-button", textContent: "Clear", on: { click: () => {
        selected.clear();
        recompute();
      } } }));
  }

  // What is drawn: the window's VMs, in order, each row with its signature,
  // so that a change redraws only the rows it changed (no layout of the rest).
  let drawn = { first: -1, last: -1, total: -1, uuids: [], rows: new Map() };
  let view = { top: 0, height: 600 };   // the scroller's, read on scroll (not on every change)
  const spacerRow = () => el("tr", { className: "spacer" }, el("td", { colSpan: COLUMNS.length + 2 }));
  const above = spacerRow();            // the rows out of view, above and below: one tall row each
  const below = spacerRow();

  const signature = (vm) => JSON.stringify([vm.name, vm.host, vm.state, vm.crashed, vm.vcpus, vm.memory_mb, vm.disk_gb,
    vm.ip, vm.ha, vm.group, vm.backup && vm.backup.time, vm.hostDown, selected.has(vm.uuid)]);

  function drawWindow(force = false) {
    const total = rows.length;
    let first = 0;
    let last = total;
    if (total > ALL_UNDER) {
      // whole chunks: a scroll changes the rows drawn once every CHUNK rows, not every row
      first = Math.max(0, Math.floor(view.top / ROW / CHUNK) * CHUNK - MARGIN);
      last = Math.min(total, Math.ceil((view.top + view.height) / ROW / CHUNK) * CHUNK + MARGIN);
    }
    const shown = rows.slice(first, last);
    const same = !force && first === drawn.first && last === drawn.last && total === drawn.total
      && shown.every((vm, i) => vm.uuid === drawn.uuids[i]);
    if (same) {                                   // the same rows: redraw those that changed
      for (const vm of shown) {
        const was = drawn.rows.get(vm.uuid);
        const sig = signature(vm);
        if (was.sig !== sig) {
          const tr = vmTr(vm);
          was.tr.replaceWith(tr);
          drawn.rows.set(vm.uuid, { tr, sig });
        }
      }
    } else {
      const spacer = (tr, n) => {
        if (tr.firstChild.height !== String(n * ROW)) tr.firstChild.height = String(n * ROW);
        return tr;
      };
      const made = new Map(shown.map((vm) => {
        const was = drawn.rows.get(vm.uuid);
        const sig = signature(vm);
        return [vm.uuid, was && was.sig === sig && !force ? was : { tr: vmTr(vm), sig }];
      }));
      const parts = [];
      if (first > 0) parts.push(spacer(above, first));
      parts.push(...shown.map((vm) => made.get(vm.uuid).tr));
      if (last < total) parts.push(spacer(below, total - last));
      if (!total) {
        parts.push(el("tr", { className: "empty" }, el("td", { colSpan: COLUMNS.length + 2 },
          vmRows().length ? "No VM matches." : "No VMs.")));
      }
      place(tbody, parts);                        // rows still in the window stay put
      drawn = { first, last, total, uuids: shown.map((vm) => vm.uuid), rows: made };
    }
    all.checked = total > 0 && rows.every((vm) => selected.has(vm.uuid));
  }

  function recompute() {
    const vms = vmRows();
    const known = new Set(vms.map((vm) => vm.uuid));
    for (const uuid of [...selected]) if (!known.has(uuid)) selected.delete(uuid);
    rows = matching(vms, fixedHost);
    setText(count, rows.length === vms.length || (fixedHost && !filters.text && !filters.state && !filters.ha && !filters.group)
      ? `${rows.length}` : `${rows.length} of ${fixedHost ? vms.filter((v) => v.host === fixedHost).length : vms.length}`);
    for (const th of head.querySelectorAll("th[data-sort]")) {
      setAttr(th, "aria-sort", th.dataset.sort === filters.sort ? (filters.desc ? "descending" : "ascending") : "none");
    }
    drawWindow();
    drawBulk();
  }

  search.addEventListener("input", () => {
    filters.text = search.value.trim();
    recompute();
  });
  all.addEventListener("change", () => {
    for (const vm of rows) {
      if (all.checked) selected.add(vm.uuid);
      else selected.delete(vm.uuid);
    }
    recompute();
  });
  node.addEventListener("selection", () => {
    drawBulk();
    all.checked = rows.length > 0 && rows.every((vm) => selected.has(vm.uuid));
  });
  let scrollQueued = false;
  scroller.addEventListener("scroll", () => {
    if (rows.length <= ALL_UNDER || scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      view = { top: scroller.scrollTop, height: scroller.clientHeight || 600 };
      drawWindow();
    });
  });
  drawControls();
  recompute();
  const stop = subscribe(["vms", "hosts", "groups", "backups"], (parts) => {
    if (parts.includes("hosts") || parts.includes("groups") || parts.includes("vms")) drawControls();
    recompute();
  });
  return { node, stop };
}
