"use strict";
// The page asks the JSON endpoints every few seconds and redraws its tables.
const REFRESH_MS = 2000;

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function cell(value, cls) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "" : String(value);
  if (cls) td.className = cls;
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    cells.forEach(c => tr.appendChild(Array.isArray(c) ? cell(c[0], c[1]) : cell(c)));
    return tr;
  }));
}

async function getJSON(path) {
  const r = await fetch(path, {cache: "no-store"});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function overview() {
  const o = await getJSON("/api/ray_lite/overview");
  const cards = [["Object store", bytes(o.object_store.used_bytes) + " / " + bytes(o.object_store.capacity_bytes)],
                 ["Processes", o.processes.length], ["Driver PID", o.driver_pid]];
  for (const [k, v] of Object.entries(o.resources)) {
    if (k === "object_store_memory") continue;   // the store's use is the first card
    const show = k === "memory" ? bytes : String;
    cards.push([k, show(v.used) + " / " + show(v.total) + " used"]);
  }
  document.getElementById("store").replaceChildren(...cards.map(([k, v]) => {
    const d = document.createElement("div");
    d.className = "card";
    const b = document.createElement("b");
    b.textContent = v;
    d.append(b, k);
    return d;
  }));
  fill("processes-table", o.processes.map(p => [p.pid, p.kind, p.cpu_percent, p.cpu_seconds, bytes(p.rss_bytes)]));
}

async function actors() {
  const r = await getJSON("/api/v0/actors?limit=1000&detail=true");
  fill("actors-table", r.data.result.result.map(a =>
    [a.actor_id, a.class_name, a.name, [a.state, a.state], a.pid, a.num_restarts]));
}

async function tasks() {
  const r = await getJSON("/api/ray_lite/recent_tasks");
  document.getElementById("tasks-note").textContent = r.timeline_recording ? "" :
    "Finished tasks are recorded while RAY_LITE_TIMELINE=1; waiting and running ones are always listed.";
  fill("tasks-table", r.tasks.map(t => [t.name, [t.state, t.state], t.pid, t.duration_ms, [t.error_type, "FAILED"]]));
}

async function serve() {
  const s = await getJSON("/api/serve/applications/");
  const rows = [];
  for (const app of Object.values(s.applications)) {
    for (const d of Object.values(app.deployments)) {
      const m = d.metrics || {};
      const replicas = Object.entries(d.replica_states).map(([k, v]) => k + ": " + v).join(", ");
      rows.push([app.name, d.name, [d.status, d.status], replicas, m.requests_per_s, m.mean_latency_ms, m.errors]);
    }
  }
  document.getElementById("serve-note").textContent = rows.length ? (s.metrics_enabled ? "" :
    "Request rate, latency and errors show when Serve exports metrics (http_options metrics_export_port).") :
    "No Serve application is running.";
  fill("serve-table", rows);
}

async function timeline() {
  const events = (await getJSON("/api/v0/tasks/timeline")).filter(e => e.ph === "X");
  const svg = document.getElementById("timeline-svg");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  if (!events.length) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 4); t.setAttribute("y", 20);
    t.textContent = "Nothing recorded (run the program with RAY_LITE_TIMELINE=1).";
    svg.appendChild(t);
    return;
  }
  const pids = [...new Set(events.map(e => e.pid))].sort((a, b) => a - b);
  const start = Math.min(...events.map(e => e.ts));
  const end = Math.max(...events.map(e => e.ts + e.dur));
  const width = svg.clientWidth || 900, left = 110, lane = 22;
  const scale = (width - left - 10) / Math.max(end - start, 1);
  svg.setAttribute("height", pids.length * lane + 10);
  pids.forEach((pid, i) => {
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", 4); label.setAttribute("y", i * lane + 16);
    label.textContent = "pid " + pid;
    svg.appendChild(label);
  });
  for (const e of events) {
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", left + (e.ts - start) * scale);
    r.setAttribute("y", pids.indexOf(e.pid) * lane + 4);
    r.setAttribute("width", Math.max(e.dur * scale, 1));
    r.setAttribute("height", lane - 6);
    r.setAttribute("fill", e.args.state === "FAILED" ? "#d9534f" : "#4a7bd0");
    r.setAttribute("class", "event");
    const title = document.createElementNS(ns, "title");
    title.textContent = e.name + " (" + (e.dur / 1000).toFixed(3) + " ms)";
    r.appendChild(title);
    svg.appendChild(r);
  }
}

let refreshes = 0;

async function refresh() {
  const results = await Promise.allSettled([overview(), actors(), tasks(), serve(), timeline()]);
  const failed = results.filter(r => r.status === "rejected");
  refreshes++;
  const stamp = document.getElementById("updated");
  stamp.dataset.refreshes = String(refreshes);
  stamp.textContent = (failed.length ? "error: " + failed[0].reason.message + " — " : "") +
    "updated " + new Date().toLocaleTimeString();
}

refresh();
setInterval(refresh, REFRESH_MS);
