// Automations: the cluster's, whoever started them (the command line, the
// API, another browser): the dock at the bottom of every view (every running
// one and the newest ended ones, each with one line per VM: its newest step
// in words, its progress, its error) and the task log (#/tasks), a table
// of them all, live, each opening to its steps; a running one can be aborted.

import { $, el, natural, when, vmHref, age, throttled, keyed, setText } from "./dom.js";
import { state, ended, newestFirst, subscribe, isOperator, readAutomation } from "./store.js";
import { abortAutomation } from "./actions.js";

const DOCKED_ENDED = 6;             // ended automations in the dock, the newest

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

export function stepLines(view) {
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

function viewOf(id) {
  return { id, ...state.views.get(id), ...state.tasks.get(id) };
}

function card(id) {
  const view = viewOf(id);
  const asked = state.mine.get(id);
  const steps = stepLines(view);
  return el("article", { className: `automation ${view.state || "starting"}`, dataset: { automation: id } },
    el("header", {},
      el("strong", {}, (asked && asked.title) || view.kind || "automation"), " ",
      el("span", { className: `state ${view.state || "running"}` }, view.state || "running"), " ",
      el("a", { className: "id", href: `#/tasks/${encodeURIComponent(id)}` }, el("code", {}, id))),
    view.error ? el("p", { className: "error" }, view.error) : null,
    steps.length ? el("ul", { className: "steps" }, steps) : null);
}

// -- the dock -----------------------------------------------------------------------------------

export function renderDock() {
  const rows = [...state.tasks.values()];
  for (const id of state.mine.keys()) if (!state.tasks.has(id)) rows.push({ id, state: "starting" });
  rows.sort(newestFirst);
  const running = rows.filter((task) => !ended(task));
  const shown = [...running, ...rows.filter(ended).slice(0, DOCKED_ENDED)].sort(newestFirst);
  setText($("automations-count"), `${running.length} running`);
  if (!shown.length) {
    $("automations").replaceChildren(el("p", { className: "empty" }, "No automation runs."));
    return;
  }
  $("automations").querySelector(":scope > p.empty")?.remove();
  keyed($("automations"), shown, {       // a card is drawn again only when what it shows changed
    key: (task) => task.id,
    signature: (task) => [state.views.get(task.id), state.tasks.get(task.id), state.mine.get(task.id)],
    make: (task) => card(task.id),
  });
}

const AUTOMATIONS_EVERY_MS = 250;   // the dock and the task log redraw at most this often

export function startDock() {
  subscribe(["automations"], throttled(renderDock, AUTOMATIONS_EVERY_MS));
}

// -- the task log (#/tasks, #/tasks/ID) ------------------------------------------------------------

// The automations touching VM `name` (its label in a step, or in the args or result), newest first.
export function automationsOf(name) {
  const touches = (view) => (view.log || []).some((entry) => entry.label === name)
    || JSON.stringify(view.args || {}).includes(`"${name}"`) || JSON.stringify(view.result || {}).includes(`"${name}"`);
  return [...state.tasks.values()].filter((task) => touches(viewOf(task.id))).sort(newestFirst);
}

export function taskTable(tasks, open = null) {
  const rows = [];
  for (const task of tasks) {
    const view = viewOf(task.id);
    const running = !ended(view);
    rows.push(el("tr", { dataset: { automation: task.id }, className: open === task.id ? "open" : "" },
      el("td", {}, el("a", { href: `#/tasks/${encodeURIComponent(task.id)}` }, el("code", {}, task.id))),
      el("td", {}, view.kind || "-"),
      el("td", {}, el("span", { className: `state ${view.state}` }, view.state || "-")),
      el("td", { className: "hide-narrow" }, view.initiator || "-"),
      el("td", { className: "time", title: when(view.created) }, `${age(view.created)} ago`),
      el("td", {}, summary(view)),
      el("td", { className: "operator-only actions" }, isOperator() && running
        ? el("button", { type: "button", className: "danger", textContent: "Abort", on: { click: () => abortAutomation(task.id) } })
        : null)));
    if (open === task.id) {
      rows.push(el("tr", { className: "detail" }, el("td", { colSpan: 7 },
        view.error ? el("p", { className: "error" }, view.error) : null,
        el("ul", { className: "steps" }, stepLines(view)),
        vmLinks(view))));
    }
  }
  const table = el("table", { className: "tasks" },
    el("thead", {}, el("tr", {}, ["Automation", "Kind", "State"].map((h) => el("th", {}, h)),
      el("th", { className: "hide-narrow" }, "Started by"), el("th", {}, "Started"), el("th", {}, "Progress"),
      el("th", { className: "operator-only" }, ""))),
    el("tbody", {}, rows.length ? rows : el("tr", { className: "empty" }, el("td", { colSpan: 7 }, "No automation runs."))));
  return el("div", { className: "scroll-x" }, table);
}

function summary(view) {
  const log = view.log || [];
  if (!log.length) return `${view.steps ?? 0} steps`;
  const labels = new Map();
  for (const entry of log) labels.set(entry.label || entry.target, entry.status);
  const done = [...labels.values()].filter((s) => STEP_DONE.has(s)).length;
  return el("span", {}, el("progress", { max: labels.size, value: done }), ` ${done}/${labels.size}`);
}

function vmLinks(view) {
  const names = new Set((view.log || []).map((e) => e.label).filter(Boolean));
  const vms = [...names].filter((n) => [...state.records.values()].some(({ row }) => row.name === n));
  return vms.length ? el("p", {}, "VMs: ", vms.map((n, i) => [i ? ", " : "", el("a", { href: vmHref(n) }, n)])) : null;
}

export function tasksView(root, open) {
  if (open) readAutomation(open);
  const draw = () => {
    const tasks = [...state.tasks.values()].sort(newestFirst);
    const running = tasks.filter((t) => !ended(t)).length;
    root.replaceChildren(el("section", { className: "card", id: "task-log" },
      el("h2", {}, "Task log ", el("span", { className: "count" }, `${running} running, ${tasks.length - running} ended`)),
      el("p", { className: "hint" }, "Every automation in the cluster, whoever started it, live."),
      taskTable(tasks, open)));
  };
  draw();
  return subscribe(["automations"], throttled(draw, AUTOMATIONS_EVERY_MS));
}
