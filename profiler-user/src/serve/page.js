"use strict";
// The live page: header, subsecond heatmap, counter tracks and CPU x time on one time axis,
// findings and kernel events as marks on it (the heatmap in heatmap.js), and the flamegraph of
// the selected range (flame.js). The state lives in the address's query, the API token never
// does.
const $ = (id) => document.getElementById(id);
const FIELDS = ["from", "to", "cpu", "pod", "namespace", "container", "unit", "comm", "function", "node"];
// The fields that filter samples (the node is a source, shown in the header).
const FILTERS = FIELDS.slice(2, -1);
const TRACKS = 6; // counter tracks drawn before "more"
const LEFT = 70; // px left of every plot (labels); the time axes start there, so all align.

// The token comes in the fragment of the address `profiler ui` prints (a fragment is never
// sent over the wire). Kept for the tab's life, then removed from the address, so a link
// copied into a ticket carries the state but not the token.
const TOKEN_KEY = "profiler-token";
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
// A report opened from a file may have no storage (an opaque origin): it needs no token.
const store = (() => { try { return sessionStorage; } catch (_) { return null; } })();
if (hashToken && store) store.setItem(TOKEN_KEY, hashToken);
const token = hashToken || (store && store.getItem(TOKEN_KEY)) || "";

const S = { sel: null, anchor: null, grid: null, ct: null, dom: null, findings: [], events: [], cursor: null };

function params(extra) {
  const p = new URLSearchParams();
  for (const k of FIELDS) if ($(k).value.trim()) p.set(k, $(k).value.trim());
  for (const [k, v] of Object.entries(extra || {})) p.set(k, v);
  return p;
}

async function get(path, extra) {
  if (window.PROFILER_REPORT) return fromReport(path, extra); // report.js
  for (let attempt = 0; ; attempt++) {
    const r = await fetch(path + "?" + params(extra), { headers: { "X-Profiler-Token": token } });
    // The daemon sheds load (503/429 with Retry-After): come back as told, twice at most.
    if ((r.status === 503 || r.status === 429) && attempt < 2) {
      const wait = Math.min(5, Number(r.headers.get("retry-after")) || 1);
      await new Promise((ok) => setTimeout(ok, wait * 1000));
      continue;
    }
    if (!r.ok) { const e = new Error((await r.text()).trim()); e.status = r.status; throw e; }
    return r;
  }
}

// ---- state in the address ----
function writeURL(push) {
  const p = params();
  if (S.sel) p.set("sel", S.sel.map((t) => t.toFixed(3)).join(","));
  if ($("local").checked) p.set("tz", "local");
  if ($("flameup").checked) p.set("view", "flame");
  if ($("samples").value !== "cpu") p.set("samples", $("samples").value);
  if ($("search").value) p.set("search", $("search").value);
  if (tlPid()) p.set("threads", tlPid()); // timeline.js
  const url = location.pathname + "?" + p;
  // Zooms and jumps push (the browser's Back and ours return); other changes replace.
  const depth = (history.state && history.state.depth) || 0;
  try {
    if (push) history.pushState({ depth: depth + 1 }, "", url); else history.replaceState({ depth }, "", url);
  } catch (_) { /* a report opened from a file: no address to keep the state in */ }
  $("back").disabled = !((history.state && history.state.depth) > 0);
}

function readURL() {
  const p = new URLSearchParams(location.search);
  const fallback = (k) => (window.PROFILER_REPORT ? reportDefault(k) : k === "from" ? "-5m" : k === "to" ? "now" : "");
  for (const k of FIELDS) $(k).value = p.get(k) ?? fallback(k);
  $("local").checked = p.get("tz") === "local";
  $("flameup").checked = p.get("view") === "flame";
  const kind = p.get("samples"); // one of the selector's, else CPU
  $("samples").value = [...$("samples").options].some((o) => o.value === kind) ? kind : "cpu";
  $("search").value = p.get("search") || "";
  $("tl-pid").value = p.get("threads") || "";
  const sel = (p.get("sel") || "").split(",").map(Number);
  S.sel = sel.length === 2 && sel.every((x) => x > 0) && sel[0] < sel[1] ? sel : null;
}

// ---- time ----
const pad = (n, w = 2) => String(n).padStart(w, "0");
function clock(t, ms) {
  const d = new Date(t * 1000), L = $("local").checked;
  const h = L ? d.getHours() : d.getUTCHours(), m = L ? d.getMinutes() : d.getUTCMinutes(), s = L ? d.getSeconds() : d.getUTCSeconds();
  let out = `${pad(h)}:${pad(m)}:${pad(s)}`;
  if (ms) out += "." + pad(L ? d.getMilliseconds() : d.getUTCMilliseconds(), 3);
  return out;
}
function dateOf(t) {
  const d = new Date(t * 1000), L = $("local").checked;
  return L ? `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` : d.toISOString().slice(0, 10);
}
// What the page writes into the from/to inputs (and so the address): RFC 3339 in UTC, which
// a human reads and the API parses, to the millisecond.
const iso = (t) => new Date(Math.round(t * 1000)).toISOString();
const zone = () => ($("local").checked ? "local" : "UTC");
const full = (t, ms = true) => `${dateOf(t)} ${clock(t, ms)} ${zone()}`;
function span(s) {
  if (s < 120) return `${+s.toFixed(1)} s`;
  if (s < 7200) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${(s / 3600).toFixed(1)} h`;
}

// The time domain every chart shares, from the heatmap's columns.
function X(t) { const d = S.dom; return ((t - d.t0) / (d.t1 - d.t0)) * d.w; }
function T(x) { const d = S.dom; return d.t0 + (x / d.w) * (d.t1 - d.t0); }

function plotWidth() { return Math.max(400, document.documentElement.clientWidth - LEFT - 40); }

function drawTimeAxis(el) {
  const d = S.dom, spanS = d.t1 - d.t0;
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const step = steps.find((s) => spanS / s <= d.w / 80) || 86400;
  const ticks = [];
  // (A label centred closer than its half width to the right end would be cut off.)
  for (let t = Math.ceil(d.t0 / step) * step; t <= d.t1 && X(t) <= d.w - 28; t += step) {
    const s = document.createElement("span");
    s.style.left = X(t) + "px"; s.dataset.t = t;
    s.textContent = clock(t, false);
    ticks.push(s);
  }
  const u = document.createElement("span");
  u.className = "unit"; u.textContent = `${zone()}, ${dateOf(d.t0)}`;
  el.style.width = d.w + "px";
  el.replaceChildren(...ticks, u);
}

// ---- canvas helpers ----
function canvas(el, w, h) {
  const r = window.devicePixelRatio || 1;
  el.width = Math.round(w * r); el.height = Math.round(h * r);
  el.style.width = w + "px"; el.style.height = h + "px";
  const c = el.getContext("2d"); c.setTransform(r, 0, 0, r, 0, 0);
  return c;
}
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

// The charts' cells are drawn once per data, window, size and theme into an offscreen canvas;
// a selection, the cursor or the anchor only re-composite it over that (a 64-CPU hour's cells
// took ~350 ms to draw, and every selection redrew them).
const layers = new Map();
function layer(name, key, w, h, draw) {
  const hit = layers.get(name);
  if (hit && hit.key.length === key.length && hit.key.every((v, j) => v === key[j])) return hit.canvas;
  const off = document.createElement("canvas"), r = window.devicePixelRatio || 1;
  off.width = Math.round(w * r); off.height = Math.round(h * r);
  const c = off.getContext("2d"); c.setTransform(r, 0, 0, r, 0, 0);
  draw(c);
  layers.set(name, { key, canvas: off });
  return off;
}

function heat(v, max) {
  if (!v || !max) return palette ? palette.empty : css("--empty");
  const x = Math.sqrt(v / max), l = (a, b, t) => Math.round(a + (b - a) * t);
  if (x < 0.5) { const t = x * 2; return `rgb(${l(255, 253, t)},${l(230, 141, t)},${l(150, 60, t)})`; }
  const t = (x - 0.5) * 2; return `rgb(${l(253, 190, t)},${l(141, 0, t)},${l(60, 38, t)})`;
}

const tip = $("tip");
function showTip(text, x, y) {
  tip.textContent = text; tip.hidden = false;
  const w = tip.offsetWidth;
  tip.style.left = Math.min(x + 14, innerWidth - w - 8) + "px"; tip.style.top = y + 14 + "px";
}
function hideTip() { tip.hidden = true; }

// ---- CPU x time ----
function ctInfo() {
  const g = S.ct, n = g.cpus.length;
  return { g, n, rh: Math.max(3, Math.min(14, Math.floor(640 / Math.max(1, n)))) };
}
// The theme's colours, read once per drawing (getComputedStyle per cell is slow at 192 CPUs).
let palette = null;
function ctColor(busy, kern) {
  const p = palette || { empty: css("--empty"), u: css("--user").split(",").map(Number), k: css("--kernel").split(",").map(Number) };
  if (!busy) return p.empty;
  const { u, k } = p, f = Math.min(1, kern / busy);
  const m = u.map((x, j) => Math.round(x + (k[j] - x) * f));
  return `rgba(${m.join(",")},${(0.12 + 0.88 * Math.min(1, busy)).toFixed(3)})`;
}
function drawCputime() {
  const { g, n, rh } = ctInfo(), d = S.dom, h = n * rh;
  const el = $("ct"), c = canvas(el, LEFT + d.w, h);
  el.style.marginLeft = "0";
  const cols = g.busy.length ? g.busy[0].length : 0, b0 = g.first_ns / 1e9, bs = g.bucket_ns / 1e9;
  const base = layer("ct", [g, d.w, h, d.t0, d.t1, css("--empty")], LEFT + d.w, h, (c) => {
    c.fillStyle = css("--empty"); c.fillRect(LEFT, 0, d.w, h);
    const every = Math.ceil(11 / rh);
    c.font = "11px system-ui, sans-serif"; c.textAlign = "right"; c.textBaseline = "middle"; c.fillStyle = css("--muted");
    palette = { empty: css("--empty"), u: css("--user").split(",").map(Number), k: css("--kernel").split(",").map(Number) };
    const muted = css("--muted");
    g.cpus.forEach((cpu, row) => {
      if (row % every === 0) { c.fillStyle = muted; c.fillText("CPU " + cpu, LEFT - 6, row * rh + rh / 2); }
      for (let k = 0; k < cols; k++) {
        const b = g.busy[row][k];
        if (!b) continue;
        const x0 = LEFT + X(b0 + k * bs), x1 = LEFT + X(b0 + (k + 1) * bs);
        if (x1 < LEFT || x0 > LEFT + d.w) continue;
        c.fillStyle = ctColor(b, g.kernel[row][k]);
        c.fillRect(Math.max(LEFT, x0), row * rh, Math.max(1, x1 - x0 - (x1 - x0 > 4 ? 1 : 0)), rh - (rh > 5 ? 1 : 0));
      }
    });
    palette = null;
  });
  c.drawImage(base, 0, 0, LEFT + d.w, h);
  markGpuLocal(c, g.cpus, rh);
  for (const f of S.findings) {
    const row = g.cpus.indexOf(f.cpu);
    if (row < 0) continue;
    const x0 = LEFT + Math.max(0, X(f.start_ns / 1e9)), x1 = LEFT + Math.min(d.w, X((f.end_ns ?? Date.now() * 1e6) / 1e9));
    c.strokeStyle = css("--" + f.severity); c.lineWidth = 2; c.strokeRect(x0, row * rh + 1, Math.max(4, x1 - x0), rh - 2);
  }
  if (S.sel) {
    const x0 = LEFT + X(S.sel[0]), x1 = LEFT + X(S.sel[1]);
    c.fillStyle = css("--sel"); c.fillRect(x0, 0, Math.max(2, x1 - x0), h);
    c.strokeStyle = css("--sel-line"); c.lineWidth = 2; c.strokeRect(x0, 1, Math.max(2, x1 - x0), h - 2);
  }
  drawTimeAxis($("ct-x"));
  const sw = (busy, kern, label) => { const s = document.createElement("span"), i = document.createElement("i"); i.style.background = ctColor(busy, kern); s.append(i, label); return s; };
  $("ct-legend").replaceChildren(
    sw(0.1, 0, "10 % busy"), sw(0.5, 0, "50 %"), sw(1, 0, "100 % busy, user"), sw(1, 0.5, "half kernel"), sw(1, 1, "100 % kernel"),
    ...gpuLegend(), `bucket ${span(bs)}` + (g.coarsened ? ` — ${g.coarsened.reason}` : ""));
}
function ctCell(ev) {
  const { g, n, rh } = ctInfo(), r = $("ct").getBoundingClientRect();
  const x = ev.clientX - r.left - LEFT, row = Math.floor((ev.clientY - r.top) / rh);
  if (x < 0 || row < 0 || row >= n) return null;
  const k = Math.floor((T(x) - g.first_ns / 1e9) / (g.bucket_ns / 1e9));
  return k >= 0 && k < (g.busy[row] || []).length ? [row, k] : null;
}
$("ct").addEventListener("mousemove", (ev) => {
  const cell = S.ct && ctCell(ev);
  if (!cell) return hideTip();
  const { g } = ctInfo(), [row, k] = cell, t = g.first_ns / 1e9 + (k * g.bucket_ns) / 1e9;
  showTip(`CPU ${g.cpus[row]}  ${full(t, false)}\n${Math.round(g.busy[row][k] * 100)} % busy, ${Math.round(g.kernel[row][k] * 100)} % kernel` +
    (g.softirq ? `, ${Math.round(g.softirq[row][k] * 100)} % softirq` : ""), ev.clientX, ev.clientY);
});
$("ct").addEventListener("mouseleave", hideTip);
// A cell selects its CPU and its bucket everywhere: the heatmap and flamegraph follow.
async function pickCpuCell([row, k]) {
  const { g } = ctInfo(), t = g.first_ns / 1e9 + (k * g.bucket_ns) / 1e9;
  $("cpu").value = String(g.cpus[row]);
  S.sel = [t, t + g.bucket_ns / 1e9];
  writeURL(true);
  await load();
}
$("ct").addEventListener("click", (ev) => { const cell = S.ct && ctCell(ev); if (cell) pickCpuCell(cell); });
let ctCursor = null;
$("ct").addEventListener("keydown", (ev) => {
  if (!S.ct) return;
  const { g, rh } = ctInfo(), cur = ctCursor || [0, 0], cols = g.busy.length ? g.busy[0].length : 0;
  const moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
  if (moves[ev.key]) {
    ev.preventDefault();
    ctCursor = [Math.max(0, Math.min(g.cpus.length - 1, cur[0] + moves[ev.key][0])), Math.max(0, Math.min(cols - 1, cur[1] + moves[ev.key][1]))];
    const r = $("ct").getBoundingClientRect(), [row, k] = ctCursor, t = g.first_ns / 1e9 + (k * g.bucket_ns) / 1e9;
    showTip(`CPU ${g.cpus[row]}  ${full(t, false)}\n${Math.round(g.busy[row][k] * 100)} % busy, ${Math.round(g.kernel[row][k] * 100)} % kernel`,
      r.left + LEFT + X(t), r.top + row * rh);
  } else if (ev.key === "Enter" && ctCursor) { ev.preventDefault(); pickCpuCell(ctCursor); }
});
$("ct").addEventListener("blur", hideTip);

// ---- findings and events: marks on both time lines ----
function around(from, to, cpu) {
  return async () => {
    $("from").value = iso(from / 1e9); $("to").value = iso(to / 1e9);
    if (cpu !== null && cpu !== undefined) $("cpu").value = String(cpu);
    S.sel = null; writeURL(true);
    await load();
  };
}
function findingWindow(f) {
  const end = f.end_ns ?? Date.now() * 1e6;
  return { open: around(f.start_ns - 5e9, end + 1e9, f.cpu), sel: [f.start_ns / 1e9, end / 1e9] };
}
function marks(el) {
  const d = S.dom, out = [];
  el.style.width = d.w + "px";
  for (const f of S.findings) {
    const x0 = Math.max(0, X(f.start_ns / 1e9)), x1 = Math.min(d.w, X((f.end_ns ?? Date.now() * 1e6) / 1e9));
    const b = document.createElement("button");
    b.type = "button"; b.className = "finding " + f.severity; b.dataset.id = f.id;
    b.style.left = x0 + "px"; b.style.width = Math.max(6, x1 - x0) + "px"; b.style.background = css("--" + f.severity);
    b.setAttribute("aria-label", `${f.severity} finding ${f.id}${f.cpu != null ? " on CPU " + f.cpu : ""}: ${f.summary}`);
    b.title = b.getAttribute("aria-label") + "\n" + full(f.start_ns / 1e9, false) + "\nclick: its window on its CPU";
    b.addEventListener("click", async () => { const w = findingWindow(f); await w.open(); select(...w.sel); });
    out.push(b);
  }
  for (const e of S.events) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "event"; b.dataset.id = e.id;
    b.style.left = X(e.ts_ns / 1e9) - 5 + "px"; b.style.background = css("--event");
    b.setAttribute("aria-label", `kernel event ${e.id}: ${e.message}`);
    b.title = `${full(e.ts_ns / 1e9)}\n${e.message}\nclick: the window around it`;
    b.addEventListener("click", around(e.ts_ns - 5e9, e.ts_ns + 1e9, null));
    out.push(b);
  }
  el.replaceChildren(...out);
}
function listItem(text, severity, open) {
  const li = document.createElement("li"), a = document.createElement("a");
  a.href = "#"; a.textContent = text;
  if (severity) a.className = "sev-" + severity;
  a.addEventListener("click", (ev) => { ev.preventDefault(); open(); });
  li.appendChild(a);
  return li;
}

// ---- counter tracks (GET /api/counters, when the daemon has it) ----
async function loadCounters() {
  if (!S.dom) return;
  let tracks = [], about = {};
  try {
    const r = await get("/api/counters", { from: String(S.dom.t0), to: String(S.dom.t1) }), body = await r.json();
    tracks = (body.tracks || []).filter((t) => t.points && t.points.length);
    // What a track is of, where its writer said: a CUDA track's process and pod (issue 41).
    about = body.about || {};
  } catch (_) { tracks = []; } // 404 (no counters in this build) or nothing recorded: no tracks.
  // At a glance: the tracks of the CPUs shown (and machine-wide ones) that moved in the window,
  // a few unless asked for all; a flat line says nothing, so those are only counted.
  const cpus = $("cpu").value.trim() ? new Set($("cpu").value.split(",").map((c) => Number(c.trim()))) : null;
  const all = tracks.filter((t) => t.cpu == null || !cpus || cpus.has(t.cpu));
  // One strip per GPU first, on a fixed 0-100 % scale and drawn even when flat: a GPU at 0 %
  // while its feeders are busy is the answer, not a flat line.
  const gpu = (t) => /^gpu\.\d+\.util$/.test(t.name);
  const mine = all.filter((t) => !gpu(t));
  // The GPUs' other tracks (power, clocks, per process) and the CUDA tracks before the rest:
  // an idle NIC's counter must not take their slot (issue 41, part 7).
  const gpuSide = (t) => /^(gpu|cuda)\./.test(t.name);
  const moved = mine.filter((t) => t.points.some((p) => p[1] !== t.points[0][1]))
    .sort((a, b) => gpuSide(b) - gpuSide(a));
  const shown = [...all.filter(gpu), ...(S.allTracks ? moved : moved.slice(0, TRACKS))];
  const d = S.dom, out = [];
  for (const t of shown) {
    const row = document.createElement("div"), name = document.createElement("div"), cv = document.createElement("canvas");
    row.className = "track"; name.className = "name";
    const label = `${t.name}${t.cpu != null ? " cpu" + t.cpu : ""}${about[t.name] ? " " + about[t.name] : ""}`;
    // The counter's name and its CPU on lines of their own: cut to the 70 px column on one
    // line, `irq.total cp…` lost the CPU. The whole label is on the plot too.
    const line = (text) => Object.assign(document.createElement("span"), { textContent: text });
    // `cuda.21440.launches` and `cuda.21440.sync_ms` were both cut to `cuda.2144…`: the last
    // part of a dotted name on a line of its own (the spans are blocks: the name reads whole).
    const dot = t.name.lastIndexOf(".");
    if (dot > 0) name.append(line(t.name.slice(0, dot + 1)), line(t.name.slice(dot + 1)));
    else name.append(line(t.name));
    if (t.cpu != null) name.append(" ", line("cpu" + t.cpu));
    // `cuda.21440.launches` names a pid: the process (and pod) under it.
    if (about[t.name]) name.append(" ", line(about[t.name]));
    name.title = `${label} (${t.unit || ""})`;
    const top = Math.max(...t.points.map((p) => p[1]), 0);
    const c = canvas(cv, d.w, 26), max = gpu(t) ? 100 : top;
    c.fillStyle = css("--empty"); c.fillRect(0, 0, d.w, 26);
    c.strokeStyle = css("--info"); c.lineWidth = 1.5; c.beginPath();
    t.points.forEach(([ms, v], j) => { const x = X(ms / 1000), y = 24 - (max ? (v / max) * 21 : 0); j ? c.lineTo(x, y) : c.moveTo(x, y); });
    c.stroke();
    if (gpu(t)) markGpuFaults(c, Number(t.name.split(".")[1]));
    c.fillStyle = css("--muted"); c.font = "10px system-ui, sans-serif"; c.textBaseline = "top"; c.fillText(`${label} · max ${+top.toPrecision(3)} ${t.unit || ""}${gpu(t) ? " (scale 0-100 %)" : ""}`, 3, 1);
    cv.addEventListener("mousemove", (ev) => {
      const tm = T(ev.clientX - cv.getBoundingClientRect().left) * 1000;
      const p = t.points.reduce((a, b) => (Math.abs(b[0] - tm) < Math.abs(a[0] - tm) ? b : a));
      showTip(`${label}\n${full(p[0] / 1000, false)}: ${+p[1].toPrecision(4)} ${t.unit || ""}`, ev.clientX, ev.clientY);
    });
    cv.addEventListener("mouseleave", hideTip);
    row.append(name, cv); out.push(row);
  }
  const flat = mine.length - moved.length, more = moved.length - shown.length;
  if (more || flat || S.allTracks) {
    const note = document.createElement("div");
    note.className = "tracks-note";
    if (more || (S.allTracks && moved.length > TRACKS)) {
      const b = document.createElement("button");
      b.type = "button"; b.textContent = more ? `${more} more counter tracks` : "fewer counter tracks";
      b.addEventListener("click", () => { S.allTracks = !S.allTracks; loadCounters(); });
      note.append(b, " ");
    }
    if (flat) note.append(`${flat} flat (unchanged over the window) not drawn`);
    out.push(note);
  }
  $("counters").replaceChildren(...out);
}

// ---- header ----
function filtersText() {
  const f = FILTERS.filter((k) => $(k).value.trim()).map((k) => `${k === "cpu" ? "CPUs" : k} ${$(k).value.trim()}`);
  return f.length ? f.join(", ") : "no filter (all CPUs, all processes)";
}
function drawWindow() {
  let text = S.dom ? `window ${full(S.dom.t0, false)} → ${clock(S.dom.t1, false)} (${span(S.dom.t1 - S.dom.t0)})` : "window: none loaded";
  text += ` · ${filtersText()}`;
  if (S.sel) text += ` · selected ${clock(S.sel[0], true)} → ${clock(S.sel[1], true)} (${span(S.sel[1] - S.sel[0])})`;
  $("h-window").textContent = text;
}
async function loadStatus() {
  try {
    const st = await (await get("/api/status", {})).json(), m = st.meta || {}, s = st.summary || {}, h = st.health || {};
    // Which nodes the node field offers: the daemon's own, or every node in ClickHouse.
    $("nodes").replaceChildren(...(st.nodes || []).map((n) => Object.assign(document.createElement("option"), { value: n })));
    const name = m.node || m.hostname;
    $("node").placeholder = name || (st.nodes && st.nodes.length > 1 ? `one of ${st.nodes.length}` : "");
    $("h-node").textContent = name || (st.problem ? "pick a node" : "unknown node");
    document.title = `profiler · ${$("h-node").textContent}`;
    $("h-kernel").textContent = st.kernel ? `kernel ${st.kernel}` : "";
    $("h-cpus").textContent = m.cpus ? `${m.cpus} CPUs` : "";
    $("h-freq").textContent = m.frequency_hz ? `${m.frequency_hz} Hz` : "";
    showGpus(st);
    $("h-span").textContent = s.span ? `data ${full(s.span[0] / 1e9, false)} → ${clock(s.span[1] / 1e9, false)} (${span((s.span[1] - s.span[0]) / 1e9)})` : "";
    let lost = 0, all = 0;
    for (const c of Object.values(s.cpus || {})) { lost += c.lost; all += c.samples + c.idle + c.lost; }
    if (st.report) {
      $("h-lost").textContent = "";
      $("h-health").textContent = "a report (profiler report): this window's data, read offline";
      return;
    }
    const lh = $("h-lost"); lh.textContent = `lost samples ${lost}${all ? ` (${((lost / all) * 100).toFixed(2)} %)` : ""}`;
    lh.className = all && lost / all > 0.01 ? "bad" : "";
    if (st.source) { // `profiler ui --clickhouse`: no daemon here to report on
      const n = (st.nodes || []).length;
      // Back to the fleet page (fleet.js), at this window.
      $("h-fleet").hidden = false;
      $("h-fleet").href = "/?" + new URLSearchParams({ from: $("from").value, to: $("to").value });
      $("h-health").textContent = st.problem || `read from ${st.source}: ${n} node${n === 1 ? "" : "s"} (the node field picks one)`;
      $("h-health").className = st.problem ? "warn" : "";
      // What daemons do not ship, said rather than left blank.
      $("irqs").textContent = st.missing || "";
      return;
    }
    const hh = $("h-health"), problems = [];
    const online = h.online_cpus || m.cpus;
    if (online && h.sampled_cpus < online) problems.push(`sampling ${h.sampled_cpus} of ${online} online CPUs`);
    if (h.ring_to_disk_seconds && h.ring_to_disk_seconds[1] > 10) problems.push(`ring to disk up to ${h.ring_to_disk_seconds[1].toFixed(1)} s`);
    if (h.events_lost) problems.push(`${h.events_lost} process events lost`);
    const open = Object.values(h.open_findings || {}).reduce((a, b) => a + b, 0);
    hh.textContent = `daemon ${problems.length ? problems.join(", ") : "healthy"}` +
      (h.ring_to_disk_seconds ? ` · ring→disk p50 ${h.ring_to_disk_seconds[0].toFixed(2)} s` : "") + (open ? ` · open findings: ${open}` : "");
    hh.className = problems.length ? "warn" : "";
    // Which CPUs take the NIC and GPU interrupts: a busy one of those starves its queue.
    const byDevice = {};
    for (const i of (st.interrupts && st.interrupts.irqs) || []) {
      for (const cpu of i.cpus) ((byDevice[i.device] ||= {})[cpu] ||= []).push(i.name);
    }
    $("irqs").textContent = Object.entries(byDevice)
      .map(([d, cpus]) => d + " interrupts: " + Object.entries(cpus).map(([c, n]) => "CPU " + c + " (" + n.join(", ") + ")").join("; "))
      .join(" | ");
  } catch (e) {
    $("h-health").textContent = "daemon status unavailable: " + e.message; $("h-health").className = "bad";
  }
}

// ---- loading ----
function redraw() {
  $("zoom").disabled = !S.sel;
  if (!S.dom) return;
  S.dom.w = plotWidth();
  if (S.grid) drawHeatmap();
  if (S.ct) drawCputime();
  marks($("hm-marks")); marks($("ct-marks"));
  if (S.threads) drawThreads();
  drawWindow();
}

// Loads overlap (the one at page load, a click on Load): only the latest may draw, or a slow
// earlier answer would replace the range asked for last.
let loads = 0;
async function load() {
  const mine = ++loads, query = params().toString();
  $("status").textContent = "loading…"; $("status").className = "";
  try {
    const [h, c, f, e] = await Promise.all([
      get("/api/heatmap").then((r) => r.json()),
      get("/api/cputime").then((r) => r.json()),
      get("/api/findings").then((r) => r.json()),
      get("/api/events").then((r) => r.json()),
    ]);
    if (mine !== loads) return;
    const k = h.coarsened ? h.coarsened.seconds_per_column : 1;
    S.grid = h; S.ct = c; S.findings = f; S.events = e; S.anchor = null; S.cursor = null;
    S.dom = { t0: h.first_second, t1: h.first_second + h.columns.length * k, w: plotWidth() };
    redraw();
    $("heatmap").dataset.query = query;
    $("findings").replaceChildren(...f.map((x) => listItem(`${full(x.start_ns / 1e9, false)} ${x.severity}${x.cpu != null ? " CPU " + x.cpu : ""}: ${x.summary}`, x.severity,
      async () => { const w = findingWindow(x); await w.open(); select(...w.sel); })));
    $("events").replaceChildren(...e.map((x) => listItem(`${full(x.ts_ns / 1e9)}: ${x.message}`, null, around(x.ts_ns - 5e9, x.ts_ns + 1e9, null))));
    $("status").textContent = "";
    if (S.sel) showFlamegraph(...S.sel);
    // A report opens on its whole window's flamegraph (it holds it), not on an empty panel.
    else if (window.PROFILER_REPORT) showFlamegraph(window.PROFILER_REPORT.from_ns / 1e9, window.PROFILER_REPORT.to_ns / 1e9);
    loadCounters();
    loadThreads();
  } catch (err) {
    if (mine === loads) { $("status").textContent = err.message; $("status").className = "err"; }
  }
}

$("controls").addEventListener("submit", (ev) => { ev.preventDefault(); S.sel = null; writeURL(true); loadStatus(); load(); });
$("zoom").addEventListener("click", () => {
  if (!S.sel) return;
  $("from").value = iso(S.sel[0]); $("to").value = iso(S.sel[1]);
  writeURL(true); load();
});
$("back").addEventListener("click", () => history.back());
window.addEventListener("popstate", () => { readURL(); $("back").disabled = !((history.state && history.state.depth) > 0); loadStatus(); load(); });
$("local").addEventListener("change", () => { writeURL(false); redraw(); loadStatus(); if (S.sel) showFlamegraph(...S.sel); });
document.addEventListener("keydown", (ev) => {
  if (ev.target.tagName === "INPUT") return;
  if (ev.key === "z" && S.sel) $("zoom").click();
  if (ev.key === "Backspace" && !$("back").disabled) { ev.preventDefault(); history.back(); }
  if (ev.key === "Escape") { S.anchor = null; hideTip(); redraw(); }
});
let resizing = 0;
window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(() => { redraw(); loadCounters(); if (S.tree) drawFlame(); }, 150); });

// What tests (and a curious engineer in the console) can ask the page.
function ctPoint(row, k) {
  const { g, rh } = ctInfo(), r = $("ct").getBoundingClientRect(), t = g.first_ns / 1e9 + ((k + 0.5) * g.bucket_ns) / 1e9;
  return { x: r.left + LEFT + X(t), y: r.top + row * rh + rh / 2 };
}
window.profilerUI = { cellPoint, cellText, ctPoint, loadCounters, redraw, select, state: S, X: (t) => X(t) };

readURL();
if (hashToken) writeURL(false); // drops the token from the address
loadStatus();
load();
