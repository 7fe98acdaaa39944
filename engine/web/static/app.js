// peerctl's page: the entry.  It logs in (a token makes a session), follows
// the cluster (store.js) and shows one view at a time, chosen by the hash so
// that views are linkable and Back works:
//   #/            the datacenter: hosts, every VM, leases (overview.js)
//   #/vm/NAME     a VM's page (vmpage.js)
//   #/host/NAME   a host's page (hostpage.js)
//   #/tasks[/ID]  the cluster's task log (tasks.js)
// The tree (tree.js) and the automations' dock are beside every view.
// An operator gets the actions (actions.js), each confirmed; a viewer none.

import { api } from "./api.js";
import { $, notice } from "./dom.js";
import { state, follow, stopFollowing, isOperator, changed } from "./store.js";
import { overview } from "./overview.js";
import { vmPage } from "./vmpage.js";
import { hostPage } from "./hostpage.js";
import { tasksView, startDock } from "./tasks.js";
import { startTree } from "./tree.js";
import { setUpConsole } from "./console.js";

const RETRY_MS = 2000;
let leaveView = null;

function route() {
  if (!state.session) return;
  if (leaveView) leaveView();
  const root = $("view");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [kind, name] = parts;
  if (kind === "vm" && name) {
    leaveView = vmPage(root, name);
    document.title = `${name} - peerctl`;
  } else if (kind === "host" && name) {
    leaveView = hostPage(root, name);
    document.title = `${name} - peerctl`;
  } else if (kind === "tasks") {
    leaveView = tasksView(root, name || null);
    document.title = "tasks - peerctl";
  } else {
    leaveView = overview(root);
    document.title = "peerctl";
  }
  document.body.dataset.view = kind || "datacenter";
  $("nav").classList.remove("shown");
  changed("route");
  window.scrollTo(0, 0);
}

function showLogin(message) {
  stopFollowing();
  $("cluster").hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  $("logout").hidden = true;
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
  if (leaveView) leaveView();
  leaveView = null;
  showLogin();
}

let started = false;

async function start() {
  try {
    state.session = (await api("GET", "/v1/session")).doc;
  } catch (error) {
    if (error.status === 401) showLogin();
    else {
      stopFollowing();
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
  if (!started) {
    started = true;
    startTree();
    startDock();
  }
  route();
  follow(start);
}

$("login-form").addEventListener("submit", login);
$("logout").addEventListener("click", logout);
$("notice-close").addEventListener("click", () => { $("notice").hidden = true; });
$("nav-toggle").addEventListener("click", () => $("nav").classList.toggle("shown"));
$("dock-toggle").addEventListener("click", () => document.body.classList.toggle("dock-closed"));
window.addEventListener("hashchange", route);
setUpConsole();
setInterval(() => changed("vms"), 30000);   // backup ages grow; nothing is read
start();
