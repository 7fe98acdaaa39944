// Small helpers every view uses: building elements (text from the cluster
// only ever goes in as text), formatting times and sizes, the banner.

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    else if (key === "attrs") for (const [name, v] of Object.entries(value)) node.setAttribute(name, v);
    else node[key] = value;
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// host2 before host10; one collator (localeCompare with options makes one per call: slow on 1,000 rows)
const collator = new Intl.Collator(undefined, { numeric: true });
export const natural = (a, b) => collator.compare(String(a ?? ""), String(b ?? ""));

export function seconds(time) {
  if (typeof time === "number") return time;
  const parsed = Date.parse(time);
  return Number.isNaN(parsed) ? null : parsed / 1000;
}

export function age(time) {
  const then = seconds(time);
  if (then === null) return "-";
  const s = Math.max(0, Date.now() / 1000 - then);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

// 86400 -> "1d", 5400 -> "1h 30m"
export function duration(total) {
  if (typeof total !== "number") return "-";
  const parts = [];
  let left = Math.round(total);
  for (const [unit, size] of [["w", 604800], ["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (left >= size) {
      parts.push(`${Math.floor(left / size)}${unit}`);
      left %= size;
    }
  }
  return parts.join(" ") || "0s";
}

export function when(time) {
  const then = seconds(time);
  return then === null ? "-" : new Date(then * 1000).toISOString().slice(0, 16).replace("T", " ");
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(value, suffix = "") {
  if (typeof value !== "number") return "-";
  let v = value;
  let unit = 0;
  while (Math.abs(v) >= 1024 && unit < UNITS.length - 1) {
    v /= 1024;
    unit += 1;
  }
  const shown = v >= 100 || unit === 0 || Number.isInteger(v) ? Math.round(v) : v.toFixed(1);
  return `${shown} ${UNITS[unit]}${suffix}`;
}

export const mib = (value) => (typeof value === "number" ? bytes(value * 1024 * 1024) : "-");
export const gb = (value) => (typeof value === "number" ? `${Math.round(value * 10) / 10} GB` : "-");

export function notice(text, kind = "error") {
  $("notice-text").textContent = text;
  $("notice").className = kind;
  $("notice").hidden = false;
}

export function clearNotice() {
  $("notice").hidden = true;
}

export function usage(used, total, unit) {
  if (typeof total !== "number" || typeof used !== "number") return "-";
  const meter = el("meter", { min: 0, max: total, value: used, low: total * 0.7, high: total * 0.9,
                              optimum: 0 });
  return el("span", { className: "usage" }, meter,
            el("span", {}, `${Math.round(used)} / ${Math.round(total)} ${unit}`));
}

export const badge = (text) => el("span", { className: `state ${text}` }, text);

export function section(title, ...children) {
  return el("section", { className: "card" }, el("h2", {}, title), ...children);
}

// A table: `columns` headers, `rows` <tr>s (or the `empty` line).
export function table(columns, rows, empty, props = {}) {
  const head = el("thead", {}, el("tr", {}, columns.map((c) => (c instanceof Node ? c : el("th", {}, c)))));
  const body = el("tbody", {}, rows.length ? rows
    : el("tr", { className: "empty" }, el("td", { colSpan: columns.length }, empty)));
  return el("div", { className: "scroll-x" }, el("table", props, head, body));
}

export const link = (href, text) => el("a", { href, textContent: text });
export const vmHref = (name) => `#/vm/${encodeURIComponent(name)}`;
export const hostHref = (name) => `#/host/${encodeURIComponent(name)}`;

// A definition list of [term, value] pairs.
export function facts(pairs) {
  return el("dl", { className: "facts" }, pairs.filter(Boolean).map(([term, value]) => [
    el("dt", {}, term), el("dd", {}, value === null || value === undefined || value === "" ? "-" : value)]));
}

// `fn`, called at most once per `ms` however often it is asked for; the last
// request is always honoured (a trailing call): for views whose changes come
// many times a second (the automations' steps) and need not redraw each frame.
export function throttled(fn, ms) {
  let last = -Infinity, timer = null;
  return () => {
    if (timer) return;
    const wait = Math.max(0, last + ms - performance.now());
    timer = setTimeout(() => {
      timer = null;
      last = performance.now();
      fn();
    }, wait);
  };
}

// Draws `items` into `parent`, one node each, by key: an item whose
// signature (an array, compared item by item with ===) is the one drawn
// keeps its node, and nodes already in place are not moved, so that a
// redraw touches, and the browser lays out again, only what changed.
const drawnIn = new WeakMap();      // parent -> Map(key -> {signature, node})

export function keyed(parent, items, { key, signature, make }) {
  const before = drawnIn.get(parent) || new Map();
  const now = new Map();
  const nodes = items.map((item) => {
    const k = key(item);
    const sig = signature(item);
    const was = before.get(k);
    const entry = was && was.signature.length === sig.length && sig.every((v, i) => v === was.signature[i])
      ? was : { signature: sig, node: make(item) };
    now.set(k, entry);
    return entry.node;
  });
  drawnIn.set(parent, now);
  place(parent, nodes);
}

// Makes `nodes` the children of `parent`, in order, moving only those not
// already in their place (replaceChildren would move, and dirty, them all).
export function place(parent, nodes) {
  nodes.forEach((node, i) => {
    const there = parent.children[i];
    if (there !== node) parent.insertBefore(node, there || null);
  });
  while (parent.children.length > nodes.length) parent.lastElementChild.remove();
}

// Writes that leave the document alone when the value is already there
// (any write, even of the same value, makes the browser look again).
export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

export function setAttr(node, name, value) {
  if (node.getAttribute(name) !== value) node.setAttribute(name, value);
}
