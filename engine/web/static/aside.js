// A host's disks kept aside (the "Disks kept aside" card of #/host/NAME):
// the disks an HA restart left on a host when it started their VM elsewhere,
// each with when, why, its volumes and size, and, for an operator, Delete
// (planned first, followed in the dock).  The card reads the list again
// once an automation of the page's deleting them ends.

import { api, enc, ApiError } from "./api.js";
import { el, age, bytes, table } from "./dom.js";
import { readOnce, subscribe } from "./store.js";
import { act, buttons } from "./actions.js";

export function removeAside(row) {
  return act({ title: `delete disks of ${row.name} kept aside on ${row.host}`, kind: "aside delete",
               path: "/v1/aside/delete", body: { patterns: [`${row.host}/${row.uuid}`] }, dryRun: true,
               okLabel: "Delete", danger: true,
               question: `Delete the disks of ${row.name} kept aside on ${row.host}: the VM runs from others.` });
}

async function asideOn(host) {
  try {
    return (await api("GET", `/v1/aside?pattern=${enc(host)}`)).doc.filter((row) => row.host === host);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return [];      // none here
    throw error;
  }
}

function row(aside) {
  return el("tr", { dataset: { aside: aside.id } },
    el("td", {}, aside.name), el("td", { className: "time", title: aside.time || "" }, `${age(aside.time)} ago`),
    el("td", {}, aside.reason || "-"),
    el("td", { className: "hide-narrow" }, (aside.volumes || []).join(", ") || "-"),
    el("td", {}, bytes(aside.bytes)),
    el("td", { className: "actions operator-only" }, buttons([
      { label: "Delete", danger: true, run: () => removeAside(aside) }])));
}

// The card of host `host`: {node, stop}.
export function asideCard(host) {
  const node = el("section", { className: "card", id: "host-aside" }, el("h2", {}, "Disks kept aside"));

  function read() {
    readOnce(`aside on ${host}`, async () => {
      const rows = await asideOn(host);
      node.replaceChildren(el("h2", {}, "Disks kept aside ", el("span", { className: "count" }, `${rows.length}`)),
        el("p", { className: "hint" }, "Disks an HA restart left here when it started their VM on another host."),
        table(["VM", "Kept", "Why", el("th", { className: "hide-narrow" }, "Volumes"), "Size",
               el("th", { className: "operator-only" }, "")], rows.map(row), "No disks kept aside."));
    });
  }

  read();
  return { node, stop: subscribe(["aside"], read) };
}
