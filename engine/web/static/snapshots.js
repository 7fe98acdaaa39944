// A VM's snapshots (the Snapshots card of #/vm/NAME): each with when it was
// taken, whether it holds the memory, the VM's state then, and, for an
// operator, Revert and Delete, each planned first (the dialog lists what the
// cluster would act on) and followed in the dock.  The card reads the list
// again once an automation of the page's on snapshots ends.

import { api, enc, ApiError } from "./api.js";
import { el, age, table } from "./dom.js";
import { readOnce, subscribe } from "./store.js";
import { act, buttons } from "./actions.js";

export function revert(entry, snapshot) {
  return act({ title: `revert ${entry.vm} to ${snapshot.name}`, kind: "snapshot revert",
               path: `/v1/vms/${enc(entry.vm)}/snapshots/${enc(snapshot.name)}/revert`, dryRun: true,
               okLabel: "Revert", danger: true,
               question: `Bring ${entry.vm} back to snapshot ${snapshot.name}: what it wrote since is lost.` });
}

export function remove(entry, snapshot) {
  return act({ title: `delete snapshot ${snapshot.name} of ${entry.vm}`, kind: "snapshot delete", method: "DELETE",
               path: `/v1/vms/${enc(entry.vm)}/snapshots?snapshot=${enc(snapshot.name)}`, query: true,
               dryRun: true, okLabel: "Delete", danger: true,
               question: `Delete snapshot ${snapshot.name} of ${entry.vm} on its host.` });
}

async function snapshotsOf(name) {
  try {
    const { doc } = await api("GET", `/v1/snapshots?pattern=${enc(name)}`);
    return doc.filter((entry) => entry.vm === name);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return [];      // no such VM (any more)
    throw error;
  }
}

function row(entry, snapshot) {
  return el("tr", { dataset: { snapshot: snapshot.name } },
    el("td", {}, snapshot.name), el("td", { className: "time", title: snapshot.time }, `${age(snapshot.time)} ago`),
    el("td", {}, snapshot.memory ? "with memory" : "disks only"),
    el("td", { className: "hide-narrow" }, snapshot.state || "-"),
    el("td", { className: "hide-narrow" }, entry.host),
    el("td", { className: "actions operator-only" }, buttons([
      { label: "Revert", danger: true, run: () => revert(entry, snapshot) },
      { label: "Delete", danger: true, run: () => remove(entry, snapshot) }])));
}

// The card of VM `name`: {node, stop}.
export function snapshotCard(name) {
  const node = el("section", { className: "card", id: "vm-snapshots" }, el("h2", {}, "Snapshots"),
                  el("p", { className: "empty" }, "reading..."));

  function read() {
    readOnce(`snapshots of ${name}`, async () => {
      const entries = await snapshotsOf(name);
      const rows = entries.flatMap((entry) => entry.snapshots.map((snapshot) => row(entry, snapshot)));
      node.replaceChildren(el("h2", {}, "Snapshots ", el("span", { className: "count" }, `${rows.length}`)),
        table(["Snapshot", "Taken", "Memory", el("th", { className: "hide-narrow" }, "VM was"),
               el("th", { className: "hide-narrow" }, "On"), el("th", { className: "operator-only" }, "")],
              rows, "No snapshots."));
    });
  }

  read();
  return { node, stop: subscribe(["snapshots"], read) };
}
