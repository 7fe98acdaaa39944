// peerctl's page: the cluster as the API lists it, kept current by the event
// stream (/v1/events), never by polling.
//
// - It lists once (hosts, VMs, automations, leases) after the stream's
//   `hello`, then applies each `change`; changes that arrive while it lists
//   are applied after the listing (a put carries the whole record, so the
//   result is the state at the newest revision).  A stream the server ends
//   for good (410: history compacted; a restart) is opened anew and the
//   page lists again.
// - A `step` or `lease` change makes it read that automation or the leases
//   again (the records in etcd are not the API's rows); reads are batched.
// - Automations: the cluster's, whoever started them (the command line, the
//   API, another browser): every running one and the newest ended ones.
// - An operator gets the actions; each asks first in a dialog, then shows the
//   automation it started with its per-VM progress.  A viewer sees none.
//   A VM whose host is down offers no action that needs that host.
// - An error shows in the banner until it is dismissed or a later action
//   is accepted.
// - Every write carries X-CSRF-Token, the peerctl_csrf cookie's value.
// - Text from the cluster only ever goes in through textContent.

const TERMINAL = new Set(["done", "failed", "aborted", "stuck"]);
const KEPT_ENDED = 10;              // ended automations shown, the newest
const RETRY_MS = 2000;
const $ = (id) => document.getElementById(id);

const state = {
  session: null,                    // {user, role, how}
  hosts: new Map(),                 // name -> hostlist row, its figures from host records
  records: new Map(),               // "vms/HOST/UUID" -> {row, revision}
  tasks: new Map(),                 // automation id -> tasks row: running, or among the newest ended
  views: new Map(),                 // automation id -> GET /v1/automations/ID
  mine: new Map(),                  // automation id -> what this page asked for
  leases: [],
};

// -- the API -----------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...value] = part.trim().split("=");
    if (key === name) return decodeURIComponent(value.join("="));
  }
  return "";
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = cookie("peerctl_csrf");
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let doc = null;
  try {
    doc = await response.json();
  } catch (_) { /* not JSON: the status says it */ }
  if (!response.ok) {
    throw new ApiError(response.status, (doc && doc.error) || `${response.status} ${response.statusText}`);
  }
  return { status: response.status, doc };
}

// -- small helpers -------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const natural = (a, b) => String(a).localeCompare(String(b), undefined, { numeric: true });

function seconds(time) {
  if (typeof time === "number") return time;
  const parsed = Date.parse(time);
  return Number.isNaN(parsed) ? null : parsed / 1000;
}

function age(time) {
  const then = seconds(time);
  if (then === null) return "-";
  const s = Math.max(0, Date.now() / 1000 - then);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

function when(time) {
  const then = seconds(time);
  return then === null ? "-" : new Date(then * 1000).toISOString().slice(0, 16).replace("T", " ");
}

function notice(text, kind = "error") {
  $("notice-text").textContent = text;
  $("notice").className = kind;
  $("notice").hidden = false;
}

function clearNotice() {
  $("notice").hidden = true;
}

const isOperator = () => state.session && state.session.role === "operator";

// -- rendering, batched: one pass per burst of changes ------------------------------

const dirty = new Set();
let renderQueued = false;

function changed(...parts) {
  parts.forEach((part) => dirty.add(part));
  if (!renderQueued) {
    renderQueued = true;
    Promise.resolve().then(() => {
      renderQueued = false;
      const parts = [...dirty];
      dirty.clear();
      for (const part of parts) RENDER[part]();
    });
  }
}

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows
    : [el("tr", { className: "empty" }, el("td", { colSpan: columns }, empty))]));
}

function usage(used, total, unit) {
  if (typeof total !== "number" || typeof used !== "number") return "-";
  const meter = el("meter", { min: 0, max: total, value: used, low: total * 0.7, high: total * 0.9,
                              optimum: 0 });
  return el("span", { className: "usage" }, meter,
            el("span", {}, `${Math.round(used)} / ${Math.round(total)} ${unit}`));
}

function hostStatus(host) {
  if (!host.alive) return "down";
  if (host.drained) return "drained";
  if (host.reserved_by) return "reserved";
  return host.enabled === false ? "disabled" : "up";
}

function vmRows() {
  const byUuid = new Map();
  for (const { row, revision } of state.records.values()) {
    const seen = byUuid.get(row.uuid);
    if (!seen || revision > seen.revision) byUuid.set(row.uuid, { row, revision });
  }
  return [...byUuid.values()].map(({ row }) => {
    const host = state.hosts.get(row.host);
    return host && !host.alive ? { ...row, state: "unknown", hostDown: true } : row;
  }).sort((a, b) => natural(a.host, b.host) || natural(a.name, b.name));
}

// An action; `refused` (a sentence) disables it and says why in its title.
function actionButton(label, onclick, title, refused) {
  return el("button", { type: "button", textContent: label, title: refused || title || label,
                        disabled: Boolean(refused), on: { click: onclick } });
}

function renderHosts() {
  const counts = new Map();
  for (const vm of vmRows()) counts.set(vm.host, (counts.get(vm.host) || 0) + 1);
  const hosts = [...state.hosts.values()].sort((a, b) => natural(a.host, b.host));
  const rows = hosts.map((host) => {
    const status = hostStatus(host);
    const used = (total, free) => (typeof total === "number" && typeof free === "number"
      ? Math.max(total - free, 0) : null);
    const actions = isOperator() ? el("td", { className: "actions operator-only" },
      host.drained
        ? actionButton("Undrain", () => hostAction("undrain", host.host))
        : actionButton("Drain", () => hostAction("drain", host.host)),
      actionButton("Evacuate", () => hostAction("evacuate", host.host))) : null;
    return el("tr", { dataset: { host: host.host } },
      el("td", {}, host.host),
      el("td", {}, el("span", { className: `state ${status}` }, status)),
      el("td", { className: "num" }, counts.get(host.host) || 0),
      el("td", {}, usage(used(host.memory_mb, host.free_memory_mb), host.memory_mb, "MiB")),
      el("td", {}, usage(used(host.disk_gb, host.free_disk_gb), host.disk_gb, "GB")),
      actions);
  });
  $("hosts-count").textContent = `${hosts.filter((h) => h.alive).length} of ${hosts.length} up`;
  fill($("hosts").tBodies[0], rows, "No hosts yet.", 6);
}

function renderVms() {
  const vms = vmRows();
  const rows = vms.map((vm) => {
    const pattern = `${vm.host}/${vm.name}`;
    let actions = null;
    if (isOperator()) {
      const running = vm.state === "running";
      const down = vm.hostDown ? `host ${vm.host} is down` : null;    // its state is unknown
      actions = el("td", { className: "actions operator-only" },
        running ? actionButton("Stop", () => vmAction("stop", vm))
          : actionButton("Start", () => vmAction("start", vm), null, down),
        running ? actionButton("Reboot", () => vmAction("reboot", vm)) : null,
        actionButton("Migrate", () => migrate(vm), null, down),
        actionButton("Backup", () => backup(vm), null, down),
        running ? actionButton("Console", () => openConsole(vm), `The serial console of ${pattern}`) : null);
    }
    return el("tr", { dataset: { vm: vm.name, host: vm.host } },
      el("td", {}, vm.name),
      el("td", {}, vm.host),
      el("td", {}, el("span", { className: `state ${vm.state}` }, vm.state), vm.crashed ? " (crashed)" : null),
      el("td", { className: "mono" }, vm.ip || "-"),
      el("td", {}, vm.ha || "none"),
      el("td", { title: vm.backup ? `backup ${vm.backup.id} at ${vm.backup.time}` : "no backup" },
        vm.backup ? `${age(vm.backup.time)} ago` : "-"),
      actions);
  });
  $("vms-count").textContent = `${vms.length}`;
  fill($("vms").tBodies[0], rows, "No VMs.", 7);
  renderHosts();                    // its VM counts come from the same rows
}

// What a person follows of a VM: its newest step among these, in words
// (the rest, locks and claims, is an automation's bookkeeping); inside a
// move (after claim_move) some of the same requests mean something else.
const PHASES = {
  build: ["building", "built"], start: ["starting", "started"], stop: ["stopping", "stopped"],
  reboot: ["rebooting", "rebooted"], suspend: ["suspending", "suspended"],
  resume: ["resuming", "resumed"], destroy: ["destroying", "destroyed"],
  ha_start: ["starting again", "started again"], set_ha: ["setting its HA policy", "HA policy set"],
  backup_take: ["backing up", "backed up"], backup_verify: ["verifying its backup on {target}", "backup verified on {target}"],
  restore_disks: ["restoring", "restored"], backup_delete: ["deleting a backup on {target}", "backup deleted on {target}"],
  ping: ["pinging", "ping ok"],
  move_prepare: ["preparing {target}", "{target} prepared"], move_migrate: ["moving", "copied"],
  move_adopt: ["taking it over on {target}", "running on {target}"], confirm_move: ["confirming the move", "moved"],
};
const IN_A_MOVE = {
  stop: ["stopping for the move", "stopped for the move"],
  build: ["restarting from its image", "restarted from its image"],
  destroy: ["removing the copy left on {target}", "copy left on {target} removed"],
};
const STEP_DONE = new Set(["ok", "done"]);

function stepLines(view) {
  const stories = new Map();        // label -> {entry, words, moving}
  for (const entry of view.log || []) {
    const label = entry.label || entry.target;
    const story = stories.get(label) || { entry, words: null, moving: false };
    if (entry.request === "claim_move") story.moving = true;
    const words = (story.moving && IN_A_MOVE[entry.request]) || PHASES[entry.request];
    if (words || !story.words) Object.assign(story, { entry, words });
    stories.set(label, story);
  }
  return [...stories.entries()].sort((a, b) => natural(a[0], b[0])).map(([label, { entry, words }]) => {
    const said = !words ? entry.request
      : (entry.status === "running" ? words[0] : STEP_DONE.has(entry.status) ? words[1] : entry.request)
        .replace("{target}", entry.target);
    const progress = entry.progress && typeof entry.progress.percent === "number" ? entry.progress : null;
    return el("li", { dataset: { label } },
      el("span", { className: "label" }, label),
      el("span", { className: "said" }, said),
      el("span", { className: `state ${entry.status}` }, entry.status),
      progress ? el("progress", { max: 100, value: progress.percent }) : null,
      progress ? `${progress.phase ? `${progress.phase} ` : ""}${Math.round(progress.percent)}%` : null,
      entry.error ? el("span", { className: "error" }, entry.error) : null);
  });
}

const ended = (task) => TERMINAL.has(task.state);
const newestFirst = (a, b) => (seconds(b.created) || Infinity) - (seconds(a.created) || Infinity)
  || natural(b.id, a.id);

function renderAutomations() {
  const rows = [...state.tasks.values()];
  for (const id of state.mine.keys()) if (!state.tasks.has(id)) rows.push({ id, state: "starting" });
  const cards = rows.sort(newestFirst).map((row) => {
    const id = row.id;
    // the read view has the log and the error; the newest record, the state
    const view = { ...row, ...state.views.get(id), ...state.tasks.get(id) };
    const asked = state.mine.get(id);
    const title = asked ? asked.title : view.kind;
    const steps = stepLines(view);
    return el("article", { className: `automation ${view.state}`, dataset: { automation: id } },
      el("header", {},
        el("strong", {}, title || "automation"), " ",
        el("span", { className: `state ${view.state}` }, view.state || "running"), " ",
        el("code", { className: "id" }, id)),
      view.error ? el("p", { className: "error" }, view.error) : null,
      steps.length ? el("ul", { className: "steps" }, ...steps) : null);
  });
  $("automations-count").textContent = `${rows.filter((task) => !ended(task)).length} running`;
  $("automations").replaceChildren(...(cards.length ? cards
    : [el("p", { className: "empty" }, "No automation runs.")]));
}

function renderLeases() {
  const rows = state.leases.map((lease) => el("tr", { dataset: { lease: lease.lease } },
    el("td", {}, lease.lease),
    el("td", {}, el("span", { className: `state ${lease.state}` }, lease.state)),
    el("td", { className: "time" }, when(lease.start)),
    el("td", { className: "time" }, when(lease.end)),
    el("td", {}, lease.kind === "hosts"
      ? `${lease.amount} host${lease.amount === 1 ? "" : "s"}${lease.hosts && lease.hosts.length ? `: ${lease.hosts.join(", ")}` : ""}`
      : `${lease.amount} × ${lease.resources}`),
    el("td", { className: "num" }, lease.used)));
  $("leases-count").textContent = `${state.leases.length}`;
  fill($("leases").tBodies[0], rows, "No leases.", 6);
}

const RENDER = { hosts: renderHosts, vms: renderVms, automations: renderAutomations, leases: renderLeases };

// -- listing, and following the event stream ---------------------------------------------

async function listEverything() {
  const [hosts, vms, tasks, leases] = await Promise.all(
    ["/v1/hosts", "/v1/vms", "/v1/tasks?all=true", "/v1/leases"].map((path) => api("GET", path)));
  state.hosts = new Map(hosts.doc.map((host) => [host.host, host]));
  state.records = new Map(vms.doc.map((vm) => [`vms/${vm.host}/${vm.uuid}`, { row: vm, revision: 0 }]));
  state.tasks = new Map(tasks.doc.map((task) => [task.id, task]));
  state.leases = leases.doc;
  keepNewestEnded();
  for (const id of state.tasks.keys()) readAutomation(id);
  changed("vms", "hosts", "automations", "leases");
}

function vmRow(key, record, previous) {
  const [, host, uuid] = key.split("/");
  const addresses = Array.isArray(record.addresses) ? record.addresses : [];
  return {
    host: record.host || host, name: record.name, uuid: record.uuid || uuid, state: record.state,
    ip: record.ip || (addresses[0] && addresses[0].addr) || null, ha: record.ha || "none",
    crashed: record.crashed === true && ["shutoff", "crashed"].includes(record.state),
    backup: previous ? previous.backup : null,
  };
}

function previousRow(uuid) {
  for (const { row } of state.records.values()) if (row.uuid === uuid) return row;
  return null;
}

const HOST_FIGURES = ["vcpus", "memory_mb", "free_memory_mb", "disk_gb", "free_disk_gb"];

const APPLY = {
  vm(change, revision) {
    if (change.type === "put" && change.value) {
      const uuid = change.value.uuid || change.key.split("/")[2];
      state.records.set(change.key, { row: vmRow(change.key, change.value, previousRow(uuid)), revision });
    } else {
      state.records.delete(change.key);
    }
    changed("vms");
  },
  host(change) {
    const name = change.key.slice("hosts/".length);
    const host = { host: name, ...(state.hosts.get(name) || {}) };
    if (change.type === "put" && change.value) {
      for (const figure of HOST_FIGURES) if (figure in change.value) host[figure] = change.value[figure];
      host.alive = true;
    } else {
      host.alive = false;
    }
    state.hosts.set(name, host);
    changed("hosts", "vms");
  },
  automation(change) {
    const id = change.key.slice("tasks/".length);
    const task = change.value;
    if (change.type === "put" && task) {
      const before = state.tasks.get(id);
      state.tasks.set(id, { ...task, id });
      keepNewestEnded();
      if (state.tasks.has(id)) readAutomation(id);
      if (ended(task) && state.mine.has(id) && !(before && ended(before))) finished(id, task);
    } else {
      forget(id);
    }
    changed("automations");
  },
  step(change) {
    const id = change.key.split("/")[1];
    if (state.tasks.has(id) || state.mine.has(id)) readAutomation(id);
  },
  lease() {
    readLeases();
  },
  drain() {             // a host's status is derived from its drain: hostlist says it
    readHosts();
  },
  backup() {
    readBackups();
  },
};

function apply(message) {
  for (const change of message.changes) {
    const handler = APPLY[change.kind];
    if (handler) handler(change, message.revision);
  }
}

// Reads the events call for, at most one in flight (and one queued) per thing.
const reading = new Map();

function readOnce(key, read) {
  const current = reading.get(key);
  if (current) {
    current.again = true;
    return;
  }
  const entry = { again: false };
  reading.set(key, entry);
  read().catch((error) => console.warn(key, error.message)).finally(() => {
    reading.delete(key);
    if (entry.again) readOnce(key, read);
  });
}

function readAutomation(id) {
  readOnce(`automation ${id}`, async () => {
    const { doc } = await api("GET", `/v1/automations/${encodeURIComponent(id)}`);
    if (state.tasks.has(id) || state.mine.has(id)) state.views.set(id, doc);
    changed("automations");
  });
}

function readLeases() {
  readOnce("leases", async () => {
    state.leases = (await api("GET", "/v1/leases")).doc;
    changed("leases");
  });
}

function readHosts() {
  readOnce("hosts", async () => {
    const { doc } = await api("GET", "/v1/hosts");
    state.hosts = new Map(doc.map((host) => [host.host, host]));
    changed("hosts");
  });
}

// A backup's age is not in the VM records: vmlist's rows carry it.
function readBackups() {
  readOnce("backups", async () => {
    const { doc } = await api("GET", "/v1/vms");
    const backups = new Map(doc.map((vm) => [vm.uuid, vm.backup]));
    for (const { row } of state.records.values()) if (backups.has(row.uuid)) row.backup = backups.get(row.uuid);
    changed("vms");
  });
}

function forget(id) {
  state.tasks.delete(id);
  state.views.delete(id);
  state.mine.delete(id);
}

// Every running automation stays; of the ended ones, the newest KEPT_ENDED.
function keepNewestEnded() {
  const done = [...state.tasks.values()].filter(ended).sort(newestFirst);
  for (const task of done.slice(KEPT_ENDED)) forget(task.id);
}

function finished(id, task) {
  const asked = state.mine.get(id);
  if (asked.kind === "backup") readBackups();
  if (task.state !== "done") notice(`${asked.title}: ${task.state}${task.error ? `: ${task.error}` : ""}`);
}

let source = null;

function setLive(text, on) {
  $("live").textContent = text;
  $("live").className = `live ${on ? "on" : "off"}`;
}

function follow() {
  if (source) source.close();
  let buffered = [];                // changes that come while it lists
  setLive("connecting", false);
  const stream = new EventSource("/v1/events");
  source = stream;
  stream.addEventListener("hello", async () => {
    try {
      await listEverything();
    } catch (error) {
      notice(`Listing the cluster failed: ${error.message}`);
    }
    const pending = buffered;
    buffered = null;
    pending.forEach(apply);
    setLive("live", true);
  });
  stream.addEventListener("change", (event) => {
    const message = JSON.parse(event.data);
    if (buffered) buffered.push(message);
    else apply(message);
  });
  stream.addEventListener("open", () => {
    if (!buffered) setLive("live", true);   // resumed from its last id: nothing missed
  });
  stream.addEventListener("error", () => {
    setLive("reconnecting", false);
    if (stream.readyState === EventSource.CLOSED && source === stream) {
      // ended for good (410: history compacted; 401; a restart): list again
      setTimeout(start, RETRY_MS);
    }                                   // else the browser resumes from the last id itself
  });
}

// -- actions (operators) --------------------------------------------------------------------

function ask(title, text, { okLabel = "OK", askTo = false } = {}) {
  const dialog = $("confirm");
  if (dialog.open) return Promise.resolve(null);
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  $("confirm-to-row").hidden = !askTo;
  $("confirm-to").value = "";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"
      ? { to: $("confirm-to").value.trim() } : null), { once: true });
    dialog.showModal();
    $("confirm-ok").focus();
  });
}

async function write(title, kind, method, path, body) {
  try {
    const { status, doc } = await api(method, path, body);
    clearNotice();                  // accepted: an earlier error is history
    if (status === 202 && doc.automation) {
      state.mine.set(doc.automation, { title, kind });
      readAutomation(doc.automation);
      changed("automations");
    } else if (doc && doc.automation === null) {
      notice(`${title}: nothing to do`, "info");
    }
    return doc;
  } catch (error) {
    notice(`${title}: ${error.message}`);
    return null;
  }
}

async function vmAction(action, vm) {
  const pattern = `${vm.host}/${vm.name}`;
  const verb = action[0].toUpperCase() + action.slice(1);
  if (!await ask(`${verb} ${vm.name}?`, `${verb} VM ${vm.name} on ${vm.host}.`, { okLabel: verb })) return;
  await write(`${action} ${pattern}`, action, "POST", `/v1/vms/${action}`, { patterns: [pattern], yes: true });
}

async function migrate(vm) {
  const pattern = `${vm.host}/${vm.name}`;
  const answer = await ask(`Migrate ${vm.name}?`, `Move VM ${vm.name} off ${vm.host}, live if it runs.`,
                           { okLabel: "Migrate", askTo: true });
  if (!answer) return;
  const body = { patterns: [pattern], yes: true };
  if (answer.to) body.to = answer.to;
  await write(`migrate ${pattern}${answer.to ? ` to ${answer.to}` : ""}`, "migrate", "POST", "/v1/migrate", body);
}

async function backup(vm) {
  const pattern = `${vm.host}/${vm.name}`;
  if (!await ask(`Back up ${vm.name}?`, `Back up the disks of VM ${vm.name} to another host.`,
                 { okLabel: "Back up" })) return;
  await write(`backup ${pattern}`, "backup", "POST", "/v1/backups", { patterns: [pattern], yes: true });
}

const HOST_ACTIONS = {
  drain: ["Drain", "Place no new VM on it; its VMs stay."],
  undrain: ["Undrain", "New VMs may land on it again; nothing moves back."],
  evacuate: ["Evacuate", "Drain it, then move every VM off it."],
};

async function hostAction(action, host) {
  const [verb, what] = HOST_ACTIONS[action];
  const answer = await ask(`${verb} ${host}?`, `${verb} host ${host}. ${what}`,
                           { okLabel: verb, askTo: action === "evacuate" });
  if (!answer) return;
  const body = action === "undrain" ? {} : { yes: true };
  if (answer.to) body.to = answer.to;
  // the drain itself comes back through the event stream (kind `drain`)
  await write(`${action} ${host}`, action, "POST", `/v1/hosts/${encodeURIComponent(host)}/${action}`, body);
}

async function boot(event) {
  event.preventDefault();
  const names = $("boot-names").value.split(/[\s,]+/).filter(Boolean);
  const resources = $("boot-resources").value.trim();
  const on = $("boot-on").value.trim();
  if (!names.length || !resources) return;
  if (!await ask(`Boot ${names.join(", ")}?`,
                 `Create and start ${names.length === 1 ? "VM" : "VMs"} ${names.join(", ")} with ${resources}` +
                 `${on ? ` on ${on}` : ""}.`, { okLabel: "Boot" })) return;
  const body = { names, resources };
  if (on) body.on = on;
  if (await write(`boot ${names.join(" ")}`, "boot", "POST", "/v1/vms", body)) $("boot-names").value = "";
}

// -- the serial console ---------------------------------------------------------------------

let session = null;                 // {socket, terminal}

async function openConsole(vm) {
  closeConsole();
  const { Terminal } = await import("./vendor/xterm/xterm.mjs");
  const dialog = $("console");
  const status = $("console-status");
  $("console-title").textContent = `Console of ${vm.name} on ${vm.host}`;
  status.textContent = "connecting";
  status.className = "";
  dialog.showModal();
  const terminal = new Terminal({ cols: 100, rows: 30, fontSize: 14, scrollback: 2000,
                                  fontFamily: "ui-monospace, 'DejaVu Sans Mono', monospace" });
  terminal.open($("terminal"));
  terminal.focus();
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}/v1/vms/${encodeURIComponent(vm.name)}/console` +
                               `?csrf=${encodeURIComponent(cookie("peerctl_csrf"))}`);
  socket.binaryType = "arraybuffer";
  session = { socket, terminal };
  const encoder = new TextEncoder();
  let ended = "";                   // the server's whole line (a close frame's reason is cut)
  socket.addEventListener("message", (event) => {
    if (typeof event.data === "string") {
      const message = JSON.parse(event.data);
      if (message.attached) {
        status.textContent = `attached to ${message.attached.vm} on ${message.attached.host}` +
          " (a quiet console shows its prompt after Enter)";
      }
      if (message.ended) ended = message.ended;
    } else {
      terminal.write(new Uint8Array(event.data));
    }
  });
  socket.addEventListener("close", (event) => {
    status.textContent = ended || event.reason ||
      (event.code === 1006 ? "could not open the console (refused, or the server is unreachable)"
        : `console closed (${event.code})`);
    status.className = event.code === 1000 ? "" : "error";
  });
  terminal.onData((data) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
  });
}

function closeConsole() {
  if (!session) return;
  session.socket.close(1000, "the browser left the console");
  session.terminal.dispose();
  session = null;
}

// -- session --------------------------------------------------------------------------------

function showLogin(message) {
  if (source) source.close();
  $("cluster").hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  $("logout").hidden = true;
  setLive("offline", false);
  if (message) notice(message);
  $("token").focus();
}

async function login(event) {
  event.preventDefault();
  try {
    await api("POST", "/v1/session", { token: $("token").value.trim() });
    $("token").value = "";
    $("notice").hidden = true;
    await start();
  } catch (error) {
    notice(`Log in: ${error.message}`);
  }
}

async function logout() {
  await api("DELETE", "/v1/session").catch(() => null);
  state.session = null;
  showLogin();
}

async function start() {
  try {
    state.session = (await api("GET", "/v1/session")).doc;
  } catch (error) {
    if (error.status === 401) showLogin();
    else {
      setLive("offline", false);
      notice(`The API does not answer: ${error.message}`);
      setTimeout(start, RETRY_MS);
    }
    return;
  }
  $("login").hidden = true;
  $("cluster").hidden = false;
  $("who").textContent = `${state.session.user} (${state.session.role})`;
  $("logout").hidden = state.session.how !== "session";
  document.body.classList.toggle("operator", isOperator());
  follow();
}

$("login-form").addEventListener("submit", login);
$("logout").addEventListener("click", logout);
$("boot-form").addEventListener("submit", boot);
$("notice-close").addEventListener("click", () => { $("notice").hidden = true; });
$("console-close").addEventListener("click", () => $("console").close());
$("console").addEventListener("close", closeConsole);
$("console").addEventListener("cancel", (event) => event.preventDefault());   // Esc is the guest's
setInterval(() => changed("vms"), 30000);   // backup ages grow; nothing is read
start();
