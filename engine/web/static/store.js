// The cluster as the page knows it, kept current by the event stream
// (/v1/events), never by polling.
//
// - It lists once (hosts, VMs, automations, leases, groups) after the
//   stream's `hello`, then applies each `change`; changes that arrive while
//   it lists are applied after the listing (a put carries the whole record,
//   so the result is the state at the newest revision).  A stream the
//   server ends for good (410: history compacted; a restart) is opened anew
//   and the page lists again.
// - A `step` or `lease` change makes it read that automation or the leases
//   again (the records in etcd are not the API's rows); at most one read in
//   flight, and one queued, per thing.
// - Views subscribe to parts ("hosts", "vms", "automations", "leases",
//   "groups"); a burst of changes is drawn once, on the next animation
//   frame, and only by the views that subscribed to what changed.

import { api, enc } from "./api.js";
import { $, natural, seconds } from "./dom.js";

export const TERMINAL = new Set(["done", "failed", "aborted", "stuck"]);
const KEPT_ENDED = 40;              // ended automations kept (and read), the newest
const RETRY_MS = 2000;

export const state = {
  session: null,                    // {user, role, how}
  hosts: new Map(),                 // name -> hostlist row, its figures from host records
  records: new Map(),               // "vms/HOST/UUID" -> {row, revision}
  tasks: new Map(),                 // automation id -> tasks row: running, or among the newest ended
  views: new Map(),                 // automation id -> GET /v1/automations/ID
  mine: new Map(),                  // automation id -> what this page asked for {title, kind}
  leases: [],
  groups: new Map(),                // VM uuid -> group name
  groupRules: new Map(),            // group name -> rule
};

export const isOperator = () => Boolean(state.session && state.session.role === "operator");

// -- who draws what, once per frame ---------------------------------------------------

const subscribers = new Map();      // part -> Set(fn)
const dirty = new Set();
let frameQueued = false;

export function subscribe(parts, fn) {
  for (const part of parts) {
    if (!subscribers.has(part)) subscribers.set(part, new Set());
    subscribers.get(part).add(fn);
  }
  return () => parts.forEach((part) => subscribers.get(part).delete(fn));
}

function flush() {
  if (!frameQueued) return;         // drawn already (a person's doing overtook a burst's timer)
  frameQueued = false;
  flushedAt = performance.now();
  const parts = [...dirty];
  dirty.clear();
  if (parts.includes("vms") || parts.includes("hosts") || parts.includes("groups")) vmCache = null;
  const called = new Set();
  for (const part of parts) {
    for (const fn of subscribers.get(part) || []) {
      if (called.has(fn)) continue;
      called.add(fn);
      try {
        fn(parts);
      } catch (error) {
        console.error(error);
      }
    }
  }
}

// A change is drawn on the next frame, and a burst of them (a bulk boot's
// 50 VMs a second and their automations' steps) at most every
// FLUSH_EVERY_MS: the page stays current within a fifth of a second while
// its main thread stays mostly idle.  A person's own doing (a new view,
// "route") is drawn on the next frame.
const FLUSH_EVERY_MS = 200;
let flushedAt = -Infinity;

let flushTimer = null;

export function changed(...parts) {
  parts.forEach((part) => dirty.add(part));
  const now = parts.includes("route");
  if (frameQueued && !(now && flushTimer)) return;
  clearTimeout(flushTimer);
  flushTimer = null;
  frameQueued = true;
  const wait = now ? 0 : flushedAt + FLUSH_EVERY_MS - performance.now();
  // a hidden tab gets no frames: a timer then, so that it is current when shown
  if (document.hidden) flushTimer = setTimeout(flush, Math.max(wait, 250));
  else if (wait <= 0) requestAnimationFrame(flush);
  else flushTimer = setTimeout(() => {
    flushTimer = null;
    requestAnimationFrame(flush);
  }, wait);
}

// -- derived: the VMs, one row per VM ----------------------------------------------------

let vmCache = null;

export function hostStatus(host) {
  if (!host || !host.alive) return "down";
  if (host.drained) return "drained";
  if (host.reserved_by) return "reserved";
  return host.enabled === false ? "disabled" : "up";
}

// One row per VM (a VM with records on two hosts during a move: the newer),
// `unknown` while its host is down, with its group.
export function vmRows() {
  if (vmCache) return vmCache;
  const byUuid = new Map();
  for (const { row, revision } of state.records.values()) {
    const seen = byUuid.get(row.uuid);
    if (!seen || revision > seen.revision) byUuid.set(row.uuid, { row, revision });
  }
  vmCache = [...byUuid.values()].map(({ row }) => {
    const host = state.hosts.get(row.host);
    const group = state.groups.get(row.uuid) || null;
    return host && !host.alive ? { ...row, group, state: "unknown", hostDown: true } : { ...row, group };
  }).sort((a, b) => natural(a.host, b.host) || natural(a.name, b.name));
  return vmCache;
}

export function vmNamed(name) {
  return vmRows().find((vm) => vm.name === name) || null;
}

// -- listing, and following the event stream ---------------------------------------------

export const ended = (task) => TERMINAL.has(task.state);
export const newestFirst = (a, b) => (seconds(b.created) || Infinity) - (seconds(a.created) || Infinity)
  || natural(b.id, a.id);

function vmRow(key, record, previous) {
  const [, host, uuid] = key.split("/");
  const addresses = Array.isArray(record.addresses) ? record.addresses : [];
  return {
    host: record.host || host, name: record.name, uuid: record.uuid || uuid, state: record.state,
    vcpus: record.vcpus ?? (previous ? previous.vcpus : null),
    memory_mb: record.memory_mb ?? (previous ? previous.memory_mb : null),
    disk_gb: record.disk_gb ?? (previous ? previous.disk_gb : null),
    ip: record.ip || (addresses[0] && addresses[0].addr) || null, addresses,
    ha: record.ha || "none", restarts: record.restarts ?? null,
    crashed: record.crashed === true && ["shutoff", "crashed"].includes(record.state),
    state_reason: record.state_reason ?? null,
    backup: previous ? previous.backup : null, replica: previous ? previous.replica : null,
  };
}

function listedRow(vm) {
  return { ...vm, addresses: vm.addresses || [], ha: vm.ha || "none" };
}

async function listEverything() {
  const [hosts, vms, tasks, leases] = await Promise.all(
    ["/v1/hosts", "/v1/vms", "/v1/tasks?all=true", "/v1/leases"].map((path) => api("GET", path)));
  state.hosts = new Map(hosts.doc.map((host) => [host.host, host]));
  state.records = new Map(vms.doc.map((vm) => [`vms/${vm.host}/${vm.uuid}`, { row: listedRow(vm), revision: 0 }]));
  state.tasks = new Map(tasks.doc.map((task) => [task.id, task]));
  state.leases = leases.doc;
  keepNewestEnded();
  for (const id of state.tasks.keys()) readAutomation(id);
  readGroups();
  changed("vms", "hosts", "automations", "leases");
}

function previousRow(uuid) {
  for (const { row } of state.records.values()) if (row.uuid === uuid) return row;
  return null;
}

const HOST_FIGURES = ["vcpus", "memory_mb", "free_memory_mb", "disk_gb", "free_disk_gb", "version",
                      "feature_level", "hypervisor", "kernel", "cpu_model"];

const finishedHandlers = [];
export const onFinished = (fn) => finishedHandlers.push(fn);

const APPLY = {
  vm(change, revision) {
    if (change.type === "put" && change.value) {
      const uuid = change.value.uuid || change.key.split("/")[2];
      const previous = previousRow(uuid);
      state.records.set(change.key, { row: vmRow(change.key, change.value, previous), revision });
      if (!previous) readGroups();          // a new VM may have joined a group
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
      if (!state.hosts.has(name)) readHosts();
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
      state.tasks.set(id, { ...(before || {}), ...task, id });
      keepNewestEnded();
      if (state.tasks.has(id)) readAutomation(id);
      if (ended(task) && !(before && ended(before))) {
        for (const fn of finishedHandlers) fn(id, task);
      }
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
  foreign() {
    changed("foreign");
  },
};

function apply(message) {
  for (const change of message.changes) {
    const handler = APPLY[change.kind];
    if (handler) handler(change, change.revision ?? message.revision);
  }
}

// Reads the events call for, at most one in flight (and one queued) per thing.
const reading = new Map();

// `gap`: at least this many ms between the end of one read and the next.
export function readOnce(key, read, gap = 0) {
  const current = reading.get(key);
  if (current) {
    current.again = true;
    return;
  }
  const entry = { again: false };
  reading.set(key, entry);
  read().catch((error) => console.warn(key, error.message)).finally(() => {
    const next = () => {
      reading.delete(key);
      if (entry.again) readOnce(key, read, gap);
    };
    if (entry.again && gap) setTimeout(next, gap);
    else next();
  });
}

// An automation busy with steps is read at most 4 times a second when this
// page started it (its person watches it), once a second otherwise.
const MINE_READ_GAP_MS = 250;
const OTHERS_READ_GAP_MS = 1000;

export function readAutomation(id) {
  readOnce(`automation ${id}`, async () => {
    const { doc } = await api("GET", `/v1/automations/${enc(id)}`);
    if (state.tasks.has(id) || state.mine.has(id)) state.views.set(id, doc);
    changed("automations");
  }, state.mine.has(id) ? MINE_READ_GAP_MS : OTHERS_READ_GAP_MS);
}

function readLeases() {
  readOnce("leases", async () => {
    state.leases = (await api("GET", "/v1/leases")).doc;
    changed("leases");
  });
}

export function readHosts() {
  readOnce("hosts", async () => {
    const { doc } = await api("GET", "/v1/hosts");
    state.hosts = new Map(doc.map((host) => [host.host, host]));
    changed("hosts", "vms");
  });
}

function readGroups() {
  readOnce("groups", async () => {
    const { doc } = await api("GET", "/v1/groups");
    state.groups = new Map();
    state.groupRules = new Map();
    for (const group of doc) {
      state.groupRules.set(group.group, group.rule);
      for (const vm of group.vms || []) state.groups.set(vm.uuid, group.group);
    }
    changed("groups");
  });
}

// A backup's age and a replica are not in the VM records: vmlist's rows carry them.
export function readBackups() {
  readOnce("backups", async () => {
    const { doc } = await api("GET", "/v1/vms");
    const rows = new Map(doc.map((vm) => [vm.uuid, vm]));
    for (const { row } of state.records.values()) {
      const listed = rows.get(row.uuid);
      if (listed) Object.assign(row, { backup: listed.backup, replica: listed.replica });
    }
    changed("vms", "backups");
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

let source = null;

function setLive(text, on) {
  $("live").textContent = text;
  $("live").className = `live ${on ? "on" : "off"}`;
}

export function stopFollowing(text = "offline") {
  if (source) source.close();
  source = null;
  setLive(text, false);
}

// Follows the event stream; `restart` is called when it ended for good.
export function follow(restart) {
  if (source) source.close();
  let buffered = [];                // changes that come while it lists
  setLive("connecting", false);
  // a message every 200 ms at most, whatever the rate of revisions, and the
  // steps' names only (a step makes the page read its automation)
  const stream = new EventSource("/v1/events?batch=200&step_values=false");
  source = stream;
  stream.addEventListener("hello", async () => {
    buffered = buffered || [];
    try {
      await listEverything();
    } catch (error) {
      console.warn("listing", error.message);
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
      setTimeout(restart, RETRY_MS);
    }                                   // else the browser resumes from the last id itself
  });
}
