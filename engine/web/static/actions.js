// What an operator does: every action asks first in the page's dialog,
// naming what it acts on, then shows the automation it started (the dock,
// tasks.js) with its per-VM progress.  A viewer is offered none.
//
// - A route that plans (dry_run) is asked for its plan first, so that the
//   dialog lists the targets the cluster would act on, not the page's guess;
//   once confirmed it is sent with "yes": true.
// - A route that still answers 409 with `targets` (confirmation needed)
//   has them shown in the dialog again, and is resent with "yes": true.
// - An error is the API's one line, in the banner, until it is dismissed
//   or a later action is accepted.

import { api, ApiError, enc } from "./api.js";
import { $, el, clearNotice, notice, duration } from "./dom.js";
import { changed, ended, isOperator, readAutomation, readBackups, readHosts, state, onFinished } from "./store.js";

// -- the dialog ----------------------------------------------------------------------------

function targetLabel(target) {
  if (typeof target === "string") return target;
  if (target.from && (target.to || target.host)) return `${target.name || target.vm}: ${target.from} → ${target.to || target.host}`;
  if (target.snapshot && target.name) return `${target.name} on ${target.host}: snapshot ${target.snapshot}`;
  if (target.replica_host !== undefined && target.name) return `${target.name} on ${target.host}: ${target.state}`;
  if (target.host && target.name) return `${target.name} on ${target.host}`;
  return target.name || target.vm || target.host || target.id || target.lease || JSON.stringify(target);
}

// Asks `question` with the `targets` listed and `fields` to fill
// ([{name, label, type: text|checkbox|select, options, placeholder, value}]);
// resolves to the fields' values, or null when cancelled.
export function ask(title, question, { okLabel = "OK", targets = [], fields = [], danger = false } = {}) {
  const dialog = $("confirm");
  if (dialog.open) return Promise.resolve(null);
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = question;
  const shown = targets.slice(0, 50).map((t) => el("li", {}, targetLabel(t)));
  if (targets.length > 50) shown.push(el("li", { className: "more" }, `and ${targets.length - 50} more`));
  $("confirm-targets").replaceChildren(...shown);
  $("confirm-targets").hidden = !targets.length;
  const inputs = fields.map((field) => {
    const id = `confirm-field-${field.name}`;
    let input;
    if (field.type === "checkbox") {
      input = el("input", { id, type: "checkbox", checked: Boolean(field.value) });
    } else if (field.type === "select") {
      input = el("select", { id }, field.options.map((o) => el("option", { value: o, selected: o === field.value }, o)));
    } else {
      input = el("input", { id, placeholder: field.placeholder || "", value: field.value || "" });
    }
    return { field, input, row: el("p", { className: "field" }, el("label", { htmlFor: id }, field.label), input) };
  });
  $("confirm-fields").replaceChildren(...inputs.map((i) => i.row));
  $("confirm-ok").textContent = okLabel;
  $("confirm-ok").classList.toggle("danger", danger);
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "ok") return resolve(null);
      const values = {};
      for (const { field, input } of inputs) {
        values[field.name] = field.type === "checkbox" ? input.checked : input.value.trim();
      }
      return resolve(values);
    }, { once: true });
    dialog.showModal();
    $("confirm-ok").focus();
  });
}

// -- sending -----------------------------------------------------------------------------------

function started(title, kind, doc) {
  if (doc && doc.automation) {
    state.mine.set(doc.automation, { title, kind });
    readAutomation(doc.automation);
    changed("automations");
    const task = state.tasks.get(doc.automation);
    if (task && ended(task)) finished(doc.automation, task);
  } else if (doc && doc.automation === null && doc.state !== "dry-run") {
    notice(`${title}: nothing to do`, "info");
  }
}

// `path` with `more` (a query's "name=value") added.
const withQuery = (path, more) => `${path}${path.includes("?") ? "&" : "?"}${more}`;

async function send(title, method, path, body, plan = false) {
  try {
    const { doc } = await api(method, path, body);
    if (!plan) clearNotice();       // accepted: an earlier error is history
    return { doc };
  } catch (error) {
    if (error instanceof ApiError && error.status === 409 && Array.isArray(error.doc.targets)) {
      return { unconfirmed: error };
    }
    notice(`${title}: ${error.message}`);
    return null;
  }
}

// What a dry run's document says would be acted on: its moves, VMs, hosts
// or disks (balance: moves; drain: hosts; the VM actions: vms).
function planned(doc) {
  if (!doc) return [];
  for (const key of ["moves", "vms", "hosts", "disks", "replies"]) if (Array.isArray(doc[key])) return doc[key];
  return [];
}

// One action: asked, sent, followed.  `dryRun`: the route plans (ask it
// first); `yes`: the route takes "yes" (sent once confirmed); `fields`:
// asked in the dialog, their values added to the body (empty ones left out);
// `body: null`: the route takes none; `query`: it takes yes and dry_run in its query;
// `shape(body)`: the body as the route wants it (numbers from the fields' text);
// `listed(rows)`: the plan's rows as the dialog lists them.
export async function act({ title, kind, method = "POST", path, body = {}, question, okLabel, targets = [],
                            fields = [], dryRun = false, yes = dryRun, danger = false, query = false,
                            shape = (full) => full, listed = (rows) => rows }) {
  let shown = targets;
  if (dryRun) {
    const plan = await send(title, method, query ? withQuery(path, "dry_run=true") : path,
                            query ? undefined : { ...body, dry_run: true }, true);
    if (!plan) return null;
    shown = listed(plan.doc ? planned(plan.doc) : plan.unconfirmed.doc.targets);
    if (!shown.length) shown = targets;         // nothing listed (a lease with no VMs): what was asked
  }
  const values = await ask(title, question, { okLabel, targets: shown, fields, danger });
  if (!values) return null;
  const bodyless = query || body === null;
  let full = { ...body };
  for (const [name, value] of Object.entries(values)) if (value !== "" && value !== false) full[name] = value;
  full = shape(full);
  if (yes && !query) full.yes = true;
  let url = yes && query ? withQuery(path, "yes=true") : path;
  let answer = await send(title, method, url, bodyless ? undefined : full);
  if (answer && answer.unconfirmed) {          // the cluster asks: show what, then confirm
    const again = await ask(title, answer.unconfirmed.message, { okLabel, targets: answer.unconfirmed.doc.targets, danger });
    if (!again) return null;
    url = query ? withQuery(path, "yes=true") : path;
    answer = await send(title, method, url, bodyless ? undefined : { ...full, yes: true });
  }
  if (!answer || !answer.doc) return null;
  started(title, kind, answer.doc);
  return answer.doc;
}

// What an automation's end changes on the page; the one the page asked
// for may have ended before its 202 came back: then `started` calls it.
function finished(id, task) {
  if (task.kind === "replicate") readBackups();     // a replication stopped: its record is gone
  const asked = state.mine.get(id);
  if (!asked) return;
  if (["backup", "restore", "backup delete"].includes(asked.kind)) readBackups();
  if (asked.kind.startsWith("snapshot")) changed("snapshots");
  if (asked.kind === "aside delete") changed("aside");
  if (task.state !== "done") notice(`${asked.title}: ${task.state}${task.error ? `: ${task.error}` : ""}`);
}

onFinished(finished);

// -- VMs -----------------------------------------------------------------------------------------

const pattern = (vm) => `${vm.host}/${vm.name}`;
const named = (vms) => (vms.length === 1 ? vms[0].name : `${vms.length} VMs`);

// A replication set or stopped: no automation of its own to follow (the
// record is written), so say what each VM's replication is now.
function replicated(doc) {
  if (!doc || !Array.isArray(doc.vms)) return doc;
  readBackups();
  notice(doc.vms.map((vm) => `${vm.name}: replication ${vm.state}`).join("; "), "info");
  return doc;
}

// The VM actions, for one VM (`single`) or a selection: [{label, run, refused, title}]
// `refused` (a sentence) disables it and says why; `some`: offered for a
// selection only when `when` holds for one of its VMs at least.
export const VM_ACTIONS = [
  { action: "start", label: "Start", when: (vm) => ["shutoff", "crashed", "missing"].includes(vm.state) || vm.state === "unknown" },
  { action: "stop", label: "Stop", when: (vm) => ["running", "paused"].includes(vm.state) },
  { action: "reboot", label: "Reboot", when: (vm) => vm.state === "running" },
  { action: "suspend", label: "Suspend", when: (vm) => vm.state === "running" },
  { action: "resume", label: "Resume", when: (vm) => vm.state === "paused" },
  { action: "migrate", label: "Migrate", when: () => true },
  { action: "backup", label: "Backup", when: () => true },
  { action: "ha", label: "HA", when: () => true, anyHost: true },
  { action: "snapshot", label: "Snapshot", when: () => true },
  { action: "replicate", label: "Replicate", when: () => true },
  { action: "unreplicate", label: "Stop replicating", when: (vm) => Boolean(vm.replica), some: true },
  { action: "unmanage", label: "Unmanage", when: () => true },
  { action: "destroy", label: "Destroy", when: () => true, anyHost: true, danger: true },
];

export function vmActionsFor(vms, single) {
  const down = vms.filter((vm) => vm.hostDown);
  return VM_ACTIONS.filter((a) => (single ? a.when(vms[0]) : !a.some || vms.some(a.when))).map((a) => {
    let refused = null;
    if (down.length && !a.anyHost) {
      refused = down.length === 1 ? `host ${down[0].host} is down` : `${down.length} of these VMs' hosts are down`;
    }
    return { ...a, refused, run: () => vmAction(a.action, vms) };
  });
}

export function vmAction(action, vms) {
  const patterns = vms.map(pattern);
  const what = named(vms);
  const title = `${action} ${vms.length === 1 ? pattern(vms[0]) : what}`;
  const verb = action[0].toUpperCase() + action.slice(1);
  switch (action) {
    case "migrate":
      return act({ title, kind: action, path: "/v1/migrate", body: { patterns }, dryRun: true, okLabel: "Migrate",
                   question: `Move ${what} to other hosts, live if running.`,
                   fields: [{ name: "to", label: "To hosts", placeholder: "host glob (optional: placement picks)" },
                            { name: "offline", label: "Offline (stop, copy, start)", type: "checkbox" }] });
    case "backup":
      return act({ title, kind: action, path: "/v1/backups", body: { patterns }, dryRun: true, okLabel: "Back up",
                   question: `Back up the disks of ${what} to another host.`,
                   fields: [{ name: "to", label: "To host", placeholder: "host glob (optional)" },
                            { name: "full", label: "Full (not incremental)", type: "checkbox" },
                            { name: "protect", label: "Protect from prunes", type: "checkbox" }] });
    case "ha":
      return act({ title, kind: action, path: "/v1/ha", body: { patterns }, okLabel: "Set HA", targets: vms,
                   question: `Set the HA policy of ${what}: restart brings a VM back when its host dies.`,
                   fields: [{ name: "policy", label: "Policy", type: "select", options: ["restart", "none"],
                              value: vms[0].ha === "restart" ? "none" : "restart" }] });
    case "unmanage":
      return act({ title, kind: action, path: "/v1/unmanage", body: { patterns }, dryRun: true, okLabel: "Unmanage",
                   danger: true, question: `Let ${what} go: they keep running, peerctl forgets them.` });
    case "snapshot":
      return act({ title, kind: "snapshot create", path: "/v1/snapshots", body: { patterns }, dryRun: true,
                   listed: (rows) => rows.map(({ snapshot, ...vm }) => vm),    // its name: the field's, not the plan's default
                   okLabel: "Snapshot", question: `Snapshot ${what} on ${vms.length === 1 ? "its host" : "their hosts"}.`,
                   fields: [{ name: "name", label: "Name", placeholder: "snap-<UTC time> (optional)" },
                            { name: "memory", label: "With memory (running VMs)", type: "checkbox" }] });
    case "replicate":           // the plan is asked with a default interval: the targets do not depend on it
      return act({ title, kind: action, path: "/v1/replicas", body: { patterns, every: "10m" }, dryRun: true,
                   okLabel: "Replicate", question: `Keep a replica of the disks of ${what} on another host, updated at every interval.`,
                   fields: [{ name: "every", label: "Every", placeholder: "30s, 10m, 1h", value: "10m" },
                            { name: "to", label: "To hosts", placeholder: "host glob (optional)" }] }).then(replicated);
    case "unreplicate":
      return act({ title: `stop replicating ${vms.length === 1 ? pattern(vms[0]) : what}`, kind: action,
                   path: "/v1/replicas/stop", body: { patterns }, dryRun: true, okLabel: "Stop replicating",
                   danger: true, question: `Stop replicating ${what}: ${vms.length === 1 ? "its replica is" : "their replicas are"} deleted.` })
        .then(replicated);
    default:
      return act({ title, kind: action, path: `/v1/vms/${action}`, body: { patterns }, dryRun: true, okLabel: verb,
                   danger: action === "destroy",
                   question: action === "destroy"
                     ? `Destroy ${what}: ${vms.length === 1 ? "its disks are" : "their disks are"} deleted (backups stay).`
                     : `${verb} ${what}.` });
  }
}

export function boot({ names, resources, on, ha, group, rule }) {
  const body = { names, resources };
  if (on) body.on = on;
  if (ha) body.ha = ha;
  if (group) {
    body.group = group;
    if (rule) body.rule = rule;
  }
  return act({ title: `boot ${names.join(" ")}`, kind: "boot", path: "/v1/vms", body, okLabel: "Boot",
               targets: names, question: `Create and start ${names.length === 1 ? "VM" : "VMs"} with ${resources}${on ? ` on ${on}` : ""}.` });
}

// -- hosts ------------------------------------------------------------------------------------------

export function hostActionsFor(host) {
  const down = !host.alive;
  return [
    host.drained
      ? { label: "Undrain", run: () => hostAction("undrain", host.host) }
      : { label: "Drain", run: () => hostAction("drain", host.host) },
    { label: "Evacuate", run: () => hostAction("evacuate", host.host) },
    { label: "Ping", run: () => hostAction("ping", host.host), refused: down ? `host ${host.host} is down` : null },
    { label: "Remove", run: () => hostAction("remove", host.host), danger: true },
  ];
}

export async function hostAction(action, host) {
  const path = `/v1/hosts/${enc(host)}/${action}`;
  const title = `${action} ${host}`;
  let done;
  switch (action) {
    case "drain":
      done = await act({ title, kind: action, path, dryRun: true, okLabel: "Drain",
                         question: `Drain ${host}: place no new VM on it; its VMs stay.` });
      break;
    case "undrain":
      done = await act({ title, kind: action, path, okLabel: "Undrain", targets: [host],
                         question: `Undrain ${host}: new VMs may land on it again; nothing moves back.` });
      break;
    case "evacuate":
      done = await act({ title, kind: action, path, dryRun: true, okLabel: "Evacuate",
                         question: `Drain ${host}, then move every VM off it.`,
                         fields: [{ name: "to", label: "To hosts", placeholder: "host glob (optional: placement picks)" }] });
      break;
    case "ping":
      done = await act({ title, kind: action, path: "/v1/ping", body: { hosts: host }, okLabel: "Ping",
                        targets: [host], question: `Time round trips to ${host}.` });
      break;
    case "remove":
      done = await act({ title, kind: action, path, dryRun: true, okLabel: "Remove", danger: true,
                         question: `Take ${host} out of the cluster for good (evacuate it first).` });
      break;
    default:
      return null;
  }
  readHosts();                      // a drain comes back through the stream too (kind `drain`)
  return done;
}

export function balance(hosts) {
  const body = hosts ? { hosts } : {};
  return act({ title: "balance", kind: "balance", path: "/v1/balance", body, dryRun: true, okLabel: "Balance",
               question: "Even out the hosts with live migrations: these moves." });
}

// -- backups, leases, automations ----------------------------------------------------------------

export function backupAction(action, backup) {
  const id = backup.id;
  switch (action) {
    case "restore":
      return act({ title: `restore ${id}`, kind: "restore", path: "/v1/restores", body: { backup: id },
                   okLabel: "Restore", targets: [`backup ${id} of ${backup.vm}`],
                   question: `Rebuild ${backup.vm} from this backup (its disks are replaced), or a new VM with "as".`,
                   fields: [{ name: "as", label: "As a new VM", placeholder: "name (optional)" },
                            { name: "on", label: "On hosts", placeholder: "host glob (optional)" }] });
    case "delete":
      return act({ title: `delete backup ${id}`, kind: "backup delete", method: "DELETE", path: `/v1/backups/${enc(id)}`, body: null,
                   okLabel: "Delete", danger: true, targets: [`backup ${id} of ${backup.vm}`],
                   question: "Delete this backup from its target host." });
    case "protect":
    case "unprotect":
      return act({ title: `${action} backup ${id}`, kind: action, path: `/v1/backups/${enc(id)}/${action}`, body: null,
                   okLabel: action === "protect" ? "Protect" : "Unprotect", targets: [`backup ${id} of ${backup.vm}`],
                   question: action === "protect" ? "Keep this backup from every prune and delete."
                     : "Let prunes and delete remove this backup again." }).then((doc) => {
        readBackups();
        return doc;
      });
    default:
      return null;
  }
}

export function scheduleAction(action, { vm, schedule }) {
  if (action === "create") {
    return act({ title: `schedule backups of ${vm.name}`, kind: "schedule", path: "/v1/backups/schedules",
                 body: { pattern: vm.name }, okLabel: "Schedule", targets: [vm.name],
                 question: "Back up this VM at every interval; older backups are pruned as kept.",
                 fields: [{ name: "every", label: "Every", placeholder: "1d, 6h, 1w", value: "1d" },
                          { name: "keep_last", label: "Keep the last", placeholder: "how many (optional)" },
                          { name: "to", label: "To host", placeholder: "host glob (optional)" }],
                 shape: (body) => (body.keep_last ? { ...body, keep_last: Number(body.keep_last) } : body) });
  }
  return act({ title: `delete schedule ${schedule.schedule}`, kind: "schedule", method: "DELETE", body: null,
               path: `/v1/backups/schedules/${enc(schedule.schedule)}`, okLabel: "Delete", danger: true,
               targets: [`${schedule.pattern} every ${duration(schedule.every)}`],
               question: "Delete this backup schedule (its backups stay)." });
}

export function leaseAction(action, lease) {
  const name = lease.lease;
  if (action === "extend") {
    return act({ title: `extend lease ${name}`, kind: "lease", path: `/v1/leases/${enc(name)}/extend`,
                 okLabel: "Extend", targets: [name], question: "Move the lease's end.",
                 fields: [{ name: "end", label: "New end", placeholder: "+2h, or 2026-12-01T10:00Z" }] });
  }
  return act({ title: `delete lease ${name}`, kind: "lease", method: "DELETE", path: `/v1/leases/${enc(name)}`,
               query: true, dryRun: true, okLabel: "Delete", danger: true, targets: [`lease ${name}`],
               question: `End lease ${name} now and forget it; its VMs get what its on_end says.` });
}

export function createLease(body) {
  return act({ title: `create lease ${body.name}`, kind: "lease", path: "/v1/leases", body, okLabel: "Create",
               targets: [body.name], question: `Reserve ${body.hosts ? `${body.hosts} host(s)` : `${body.amount} x ${body.resources}`} from ${body.start} to ${body.end}.` });
}

export function abortAutomation(id) {
  return act({ title: `abort ${id}`, kind: "abort", method: "DELETE", path: `/v1/automations/${enc(id)}`, body: null,
               okLabel: "Abort", danger: true, targets: [id], question: "Ask this automation to stop." });
}

export function adopt(domains) {
  return act({ title: `adopt ${domains.map((d) => d.name).join(" ")}`, kind: "adopt", path: "/v1/adopt",
               body: { patterns: domains.map(pattern) }, dryRun: true, okLabel: "Adopt",
               question: "Adopt these foreign domains in place: peerctl manages them from now on." });
}

// A row of buttons (none for a viewer).
export function buttons(actions) {
  if (!isOperator()) return el("span", { className: "actions" });
  return el("span", { className: "actions operator-only" }, actions.map((a) => el("button", {
    type: "button", textContent: a.label, title: a.refused || a.title || a.label, disabled: Boolean(a.refused),
    className: a.danger ? "danger" : "", on: { click: a.run } })));
}
