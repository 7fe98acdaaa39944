// Graphs of a host or a VM, drawn as inline SVG: CPU, memory, disk and
// network over the last hour (10 s points) or day (5 min points), from
// GET /v1/hosts/NAME/graphs or /v1/vms/NAME/graphs.  A point not measured
// (null) is a gap, never zero.  The series are not in the event stream: a
// panel on screen reads them again every step (10 s for the hour, a minute
// for the day) and stops when it leaves the page.

import { api, enc } from "./api.js";
import { el, bytes } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 300;
const H = 90;

const CHARTS = [
  { name: "cpu", title: "CPU", series: [["cpu_pct", "busy"]], format: (v) => `${Math.round(v)}%`, max: 100 },
  { name: "memory", title: "Memory", series: [["mem_bytes", "used"]], format: (v) => bytes(v) },
  { name: "disk", title: "Disk", series: [["disk_read_bytes_per_s", "read"], ["disk_write_bytes_per_s", "write"]],
    format: (v) => bytes(v, "/s") },
  { name: "network", title: "Network", series: [["net_rx_bytes_per_s", "in"], ["net_tx_bytes_per_s", "out"]],
    format: (v) => bytes(v, "/s") },
];

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

// The runs of points that were measured, each a polyline's "x,y ..." list.
function runs(values, top) {
  const lines = [];
  let current = [];
  const n = values.length;
  values.forEach((v, i) => {
    if (v === null || v === undefined) {
      if (current.length) lines.push(current);
      current = [];
      return;
    }
    const x = n > 1 ? (i / (n - 1)) * W : W;
    const y = H - (top > 0 ? (v / top) * (H - 4) : 0);
    current.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  if (current.length) lines.push(current);
  return lines;
}

function stamp(epoch, span) {
  const iso = new Date(epoch * 1000).toISOString();
  return span === "day" ? `${iso.slice(5, 10)} ${iso.slice(11, 16)}` : iso.slice(11, 16);
}

export function drawChart(chart, doc) {
  const all = chart.series.flatMap(([key]) => (doc.series[key] || []).filter((v) => typeof v === "number"));
  const peak = all.length ? Math.max(...all) : 0;
  const top = chart.max || (peak > 0 ? peak * 1.1 : 1);
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", class: "chart",
                           role: "img", "aria-label": `${chart.title} over the last ${doc.span}` });
  for (const y of [0.25, 0.5, 0.75]) box.append(svg("line", { x1: 0, x2: W, y1: H * y, y2: H * y, class: "grid" }));
  chart.series.forEach(([key], index) => {
    for (const points of runs(doc.series[key] || [], top)) {
      box.append(svg("polyline", { points: points.join(" "), class: `series s${index}`, "data-series": key }));
      if (points.length === 1) {      // a lone point (between gaps): a dot, so that it shows
        const [x, y] = points[0].split(",");
        box.append(svg("ellipse", { cx: x, cy: y, rx: 2, ry: 2, class: `point s${index}` }));
      }
    }
  });
  const newest = chart.series.map(([key, label], index) => {
    const values = (doc.series[key] || []).filter((v) => typeof v === "number");
    const last = values.length ? chart.format(values[values.length - 1]) : "-";
    return el("span", { className: `legend s${index}` }, `${label} ${last}`);
  });
  const end = doc.start + ((doc.series[chart.series[0][0]] || []).length - 1) * doc.step_s;
  return el("figure", { className: "graph", dataset: { chart: chart.name } },
    el("figcaption", {}, el("strong", {}, chart.title), " ", newest,
       el("span", { className: "peak" }, all.length ? `max ${chart.format(peak)}` : "not measured")),
    box,
    el("div", { className: "axis" }, el("span", {}, stamp(doc.start, doc.span)), el("span", {}, `${stamp(end, doc.span)} UTC`)));
}

// A panel of the four charts of `kind` ("hosts" or "vms") `name`, with its
// span switch; `panel.stop()` ends its reads.
export function graphPanel(kind, name) {
  let span = "hour";
  let timer = null;
  let stopped = false;
  const charts = el("div", { className: "graphs" }, el("p", { className: "empty" }, "reading the graphs..."));
  const choose = (value) => {
    span = value;
    for (const button of switcher.querySelectorAll("button")) button.setAttribute("aria-pressed", String(button.value === span));
    read();
  };
  const switcher = el("span", { className: "span-switch" },
    ["hour", "day"].map((value) => el("button", { type: "button", value, textContent: `last ${value}`,
                                                 attrs: { "aria-pressed": String(value === span) },
                                                 on: { click: () => choose(value) } })));
  const panel = el("section", { className: "card graphs-card", dataset: { graphs: `${kind}/${name}` } },
    el("h2", {}, "Graphs ", switcher), charts);

  async function read() {
    clearTimeout(timer);
    if (stopped) return;
    let step = 10;
    const asked = span;
    try {
      const { doc } = await api("GET", `/v1/${kind}/${enc(name)}/graphs?span=${asked}`);
      if (stopped || asked !== span) return;    // left, or another span chosen meanwhile
      step = doc.step_s;
      charts.replaceChildren(...CHARTS.map((chart) => drawChart(chart, doc)));
      panel.dataset.span = doc.span;
    } catch (error) {
      if (stopped || asked !== span) return;
      charts.replaceChildren(el("p", { className: "empty graphs-error" }, error.message));
    }
    timer = setTimeout(read, Math.min(step, 60) * 1000);
  }
  panel.stop = () => {
    stopped = true;
    clearTimeout(timer);
  };
  read();
  return panel;
}
