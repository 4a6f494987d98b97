"use strict";
// The fleet page (`profiler ui --clickhouse URL`, no node chosen): nodes x time coloured by a
// measure (/api/fleet: the worst rows first, or groups), the merged flamegraph of a selection
// of rows and columns (/api/flamegraph with the rows' nodes, summed by ClickHouse), and the
// fleet's findings by signature. A node's name opens its page at this window. While the
// window ends now, the page reloads every few seconds (a shipped sample shows within ~15 s).
const $ = (id) => document.getElementById(id);
// `nodes`, not `node`: an address naming a node is that node's page (serve/mod.rs).
const FIELDS = ["from", "to", "measure", "group", "rows", "nodes"];
const ROW_H = 16;
const LABELS = 190; // px of the row names left of the grid

// The token, as the node page keeps it (page.js): from the address's fragment, for the tab.
const TOKEN_KEY = "profiler-token";
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
const store = (() => { try { return sessionStorage; } catch (_) { return null; } })();
if (hashToken && store) store.setItem(TOKEN_KEY, hashToken);
const token = hashToken || (store && store.getItem(TOKEN_KEY)) || "";

const S = { board: null, sel: null, drag: null, loading: false, lastMs: 0, loadedAt: 0, loads: 0, flames: 0 };

function params() {
  const p = new URLSearchParams();
  for (const k of FIELDS) if ($(k).value.trim()) p.set(k, $(k).value.trim());
  return p;
}
async function get(path, q) {
  const r = await fetch(path + "?" + q, { headers: { "X-Profiler-Token": token }, cache: "no-store" });
  if (!r.ok) { const e = new Error((await r.text()).trim()); e.status = r.status; throw e; }
  return r;
}
function writeURL() {
  history.replaceState(null, "", location.pathname + "?" + params());
}
function readURL() {
  const p = new URLSearchParams(location.search);
  for (const k of FIELDS) if (p.has(k)) $(k).value = p.get(k);
}

// ---- time ----
const pad = (n, w = 2) => String(n).padStart(w, "0");
const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
function clock(t) { const d = new Date(t * 1000); return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`; }
function full(t) { const d = new Date(t * 1000); return `${DAYS[d.getUTCDay()]} ${d.toISOString().slice(0, 10)} ${clock(t)} UTC`; }
function span(s) { return s < 120 ? `${+s.toFixed(1)} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`; }
const pct = (v) => `${(v * 100).toFixed(v < 0.1 ? 1 : 0)} %`;

// ---- colours: a share, 0 to 1, on one fixed scale (pale yellow to dark red) ----
function colour(v) {
  const x = Math.max(0, Math.min(1, v)), l = (a, b, t) => Math.round(a + (b - a) * t);
  if (x < 0.5) { const t = x * 2; return `rgb(${l(255, 253, t)},${l(240, 141, t)},${l(190, 60, t)})`; }
  const t = (x - 0.5) * 2; return `rgb(${l(253, 170, t)},${l(141, 0, t)},${l(60, 38, t)})`;
}
const CAUSE_COLOURS = ["#1e6eff", "#8e44ad", "#00897b", "#6d4c41", "#c2185b", "#455a64"];
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

const tip = $("tip");
function showTip(text, x, y) {
  tip.textContent = text; tip.hidden = false;
  tip.style.left = Math.min(x + 14, innerWidth - tip.offsetWidth - 8) + "px"; tip.style.top = y + 14 + "px";
}
const hideTip = () => { tip.hidden = true; };

// ---- the grid ----
function geometry() {
  const b = S.board, w = Math.max(300, document.documentElement.clientWidth - LABELS - 40);
  return { w, cw: w / Math.max(1, b.columns), h: Math.max(ROW_H, b.rows.length * ROW_H) };
}
const colStart = (c) => S.board.start_ns / 1e9 + c * S.board.bucket_seconds;
const valueText = (v) => (v == null ? "no data" : S.board.measure === "gpu-idle" ? `${pct(v)} of GPU time idle` :
  S.board.measure === "gpu-util" ? `GPU ${pct(v)} busy` : S.board.measure === "busy" ? `${pct(v)} busy` : `busiest CPU ${pct(v)} busy`);
function scoreText(row) {
  if (row.score == null) return "no data";
  return S.board.measure === "gpu-idle" ? `${row.score.toFixed(2)} GPU-hours idle` : `${pct(row.score)} (${S.board.score_unit})`;
}

function draw() {
  const b = S.board, g = geometry(), el = $("grid"), r = window.devicePixelRatio || 1;
  el.width = Math.round(g.w * r); el.height = Math.round(g.h * r);
  el.style.width = g.w + "px"; el.style.height = g.h + "px";
  const c = el.getContext("2d"); c.setTransform(r, 0, 0, r, 0, 0);
  c.fillStyle = css("--empty"); c.fillRect(0, 0, g.w, g.h);
  b.rows.forEach((row, i) => {
    row.values.forEach((v, k) => {
      if (v == null) return;
      c.fillStyle = colour(v);
      c.fillRect(k * g.cw, i * ROW_H, Math.max(1, g.cw - (g.cw > 4 ? 1 : 0)), ROW_H - 1);
      const cause = row.causes && row.causes[k];
      if (cause != null) { // a stripe at the cell's foot in the cause's colour
        c.fillStyle = CAUSE_COLOURS[cause % CAUSE_COLOURS.length];
        c.fillRect(k * g.cw, i * ROW_H + ROW_H - 5, Math.max(1, g.cw - (g.cw > 4 ? 1 : 0)), 4);
      }
    });
  });
  const sel = S.drag ? S.drag.preview : S.sel;
  if (sel) {
    const x0 = sel.cols[0] * g.cw, x1 = (sel.cols[1] + 1) * g.cw;
    const y0 = sel.rows[0] * ROW_H, y1 = (sel.rows[1] + 1) * ROW_H;
    c.fillStyle = css("--sel"); c.fillRect(x0, y0, x1 - x0, y1 - y0);
    c.strokeStyle = css("--sel-line"); c.lineWidth = 2; c.strokeRect(x0 + 1, y0 + 1, x1 - x0 - 2, y1 - y0 - 2);
  }
  drawLabels(); drawAxis(g); drawLegend();
}

function nodeHref(node) {
  const p = new URLSearchParams({ node, from: $("from").value.trim() || "-1h", to: $("to").value.trim() || "now" });
  return "/?" + p;
}
function drawLabels() {
  const b = S.board, picked = S.sel ? S.sel.rows : [-1, -2];
  $("labels").replaceChildren(...b.rows.map((row, i) => {
    const d = document.createElement("div");
    d.title = `${row.label}: ${scoreText(row)}` + (b.group === "node" ? "" : `\n${row.nodes.length} nodes: ${row.nodes.slice(0, 20).join(", ")}${row.nodes.length > 20 ? " …" : ""}`);
    if (i >= picked[0] && i <= picked[1]) d.className = "picked";
    if (b.group === "node") {
      // The node's own page, at this window: a link (opens where asked, keeps history).
      const a = document.createElement("a");
      a.href = nodeHref(row.label); a.textContent = row.label; a.dataset.node = row.label;
      d.append(a);
    } else {
      const btn = document.createElement("button");
      btn.type = "button"; btn.textContent = `${row.label} (${row.nodes.length})`;
      btn.addEventListener("click", () => selectCells([i, 0], [i, b.columns - 1]));
      d.append(btn);
    }
    return d;
  }));
  const more = [];
  if (b.more_rows) more.push(`and ${b.more_rows} more ${b.group === "node" ? "nodes" : `${b.group}s (${b.more_nodes} nodes)`} less affected`);
  if (b.nodes_without_data) more.push(`${b.nodes_without_data} nodes without ${b.measure.startsWith("gpu") ? "GPU tracks" : "data"} in this window`);
  $("more").textContent = more.join(" · ");
}
function drawAxis(g) {
  const b = S.board, secs = b.columns * b.bucket_seconds;
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const step = steps.find((s) => secs / s <= g.w / 90) || 86400 * Math.ceil(secs / 86400 / (g.w / 90));
  const t0 = b.start_ns / 1e9, ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t0 + secs; t += step) {
    const x = ((t - t0) / secs) * g.w;
    if (x > g.w - 28) break;
    const s = document.createElement("span"); s.style.left = x + "px"; s.textContent = clock(t); ticks.push(s);
  }
  const u = document.createElement("span"); u.className = "unit"; u.textContent = `UTC, ${new Date(t0 * 1000).toISOString().slice(0, 10)} · column ${span(b.bucket_seconds)}`;
  $("grid-x").style.width = g.w + "px";
  $("grid-x").replaceChildren(...ticks, u);
}
function drawLegend() {
  const b = S.board, sw = (v, label) => { const s = document.createElement("span"), i = document.createElement("i"); i.style.background = colour(v); s.append(i, label); return s; };
  const out = [sw(0.05, "0 %"), sw(0.25, "25 %"), sw(0.5, "50 %"), sw(0.75, "75 %"), sw(1, "100 %")];
  b.causes.forEach((k, j) => {
    const s = document.createElement("span"), i = document.createElement("i");
    i.style.background = CAUSE_COLOURS[j % CAUSE_COLOURS.length]; s.append(i, `idle while ${k}`); out.push(s);
  });
  $("legend").replaceChildren(...out);
}

// ---- selection: drag over cells, or a group's name, or a signature ----
function cellAt(ev) {
  if (!S.board || !S.board.rows.length) return null;
  const g = geometry(), r = $("grid").getBoundingClientRect();
  const row = Math.floor((ev.clientY - r.top) / ROW_H), col = Math.floor((ev.clientX - r.left) / g.cw);
  return [Math.max(0, Math.min(S.board.rows.length - 1, row)), Math.max(0, Math.min(S.board.columns - 1, col))];
}
function rect(a, b) {
  return { rows: [Math.min(a[0], b[0]), Math.max(a[0], b[0])], cols: [Math.min(a[1], b[1]), Math.max(a[1], b[1])] };
}
function selectCells(a, b) {
  const s = rect(a, b), board = S.board;
  s.nodes = [...new Set(board.rows.slice(s.rows[0], s.rows[1] + 1).flatMap((r) => r.nodes))].sort();
  s.t = [colStart(s.cols[0]), Math.min(board.to_ns / 1e9, colStart(s.cols[1] + 1))];
  S.sel = s; S.drag = null;
  draw(); showFlame(s.nodes, s.t[0], s.t[1]);
}
$("grid").addEventListener("mousedown", (ev) => { const c = cellAt(ev); if (c) { S.drag = { from: c, preview: rect(c, c) }; draw(); } });
$("grid").addEventListener("mousemove", (ev) => {
  const c = cellAt(ev);
  if (!c) return hideTip();
  if (S.drag) { S.drag.preview = rect(S.drag.from, c); draw(); return; }
  const row = S.board.rows[c[0]], v = row.values[c[1]], cause = row.causes && row.causes[c[1]];
  showTip(`${row.label}  ${full(colStart(c[1]))} (+${span(S.board.bucket_seconds)})\n${valueText(v)}` +
    (cause != null ? `\nmostly while ${S.board.causes[cause]}` : ""), ev.clientX, ev.clientY);
});
$("grid").addEventListener("mouseleave", hideTip);
window.addEventListener("mouseup", (ev) => { if (S.drag) { const c = cellAt(ev) || S.drag.from; selectCells(S.drag.from, c); } });

// ---- the merged flamegraph: inferno's SVG of the selection, summed by ClickHouse ----
async function showFlame(nodes, a, b, fn) {
  const mine = ++S.flames, el = $("fleet-flame");
  const q = new URLSearchParams({ format: "svg", node: nodes.join(","), from: a.toFixed(3), to: b.toFixed(3) });
  if (fn) q.set("function", fn);
  el.dataset.query = q.toString();
  $("range").textContent = `${nodes.length} node${nodes.length === 1 ? "" : "s"} · ${full(a)} → ${clock(b)} (${span(b - a)})${fn ? " · through " + fn : ""}`;
  try {
    const r = await get("/api/flamegraph", q), svg = await r.text();
    if (mine !== S.flames) return;
    const frame = document.createElement("iframe");
    frame.title = "merged flamegraph";
    frame.src = URL.createObjectURL(new Blob([svg], { type: "image/svg+xml" }));
    const note = document.createElement("div"); note.className = "note";
    note.textContent = `${nodes.slice(0, 8).join(", ")}${nodes.length > 8 ? ` and ${nodes.length - 8} more` : ""} · read from ${r.headers.get("x-profiler-read-from") || "ClickHouse"}`;
    el.replaceChildren(note, frame);
  } catch (e) {
    if (mine !== S.flames) return;
    const p = document.createElement("p"); p.className = "err";
    p.textContent = e.status === 404 ? "No samples of these nodes in this range." : e.message;
    el.replaceChildren(p);
  }
  el.dataset.drawn = q.toString();
}

// ---- findings by signature ----
function drawFindings() {
  const b = S.board, rows = b.findings.map((f) => {
    const tr = document.createElement("tr"), cost = document.createElement("td"), what = document.createElement("td");
    cost.className = "cost";
    cost.textContent = f.cost_unit === "GPU-hours" ? `${f.cost.toFixed(2)} GPU-h` : `${Math.round(f.cost).toLocaleString("en-US")} core-s`;
    const who = f.comm ? `, all running ${f.comm}` : "", unit = f.unit ? ` (${f.unit})` : "";
    const subject = f.function ? `${f.function} ${f.kind === "hot-kernel-function" ? "hot" : `(${f.kind})`}` : f.kind;
    what.textContent = `${subject} on ${f.nodes} node${f.nodes === 1 ? "" : "s"} since ${full(f.since_ns / 1e9)}${who}${unit}` +
      ` — ${f.findings} finding${f.findings === 1 ? "" : "s"}: ${f.node_names.slice(0, 5).join(", ")}${f.nodes > 5 ? " …" : ""}`;
    tr.title = f.example + "\nclick: the merged flamegraph of these nodes over it";
    tr.dataset.kind = f.kind;
    tr.addEventListener("click", () => {
      S.sel = null; draw();
      const a = Math.max(b.from_ns, f.since_ns) / 1e9, z = Math.min(b.to_ns, Math.max(f.until_ns, f.since_ns + 1e9)) / 1e9;
      showFlame(f.node_names, a, z, f.kind === "hot-kernel-function" ? f.function : null);
    });
    tr.append(cost, what);
    return tr;
  });
  if (!rows.length) { const tr = document.createElement("tr"); tr.textContent = "No findings in this window."; rows.push(tr); }
  $("findings").replaceChildren(...rows);
}

// ---- loading, and reloading while the window ends now ----
async function load() {
  const mine = ++S.loads, started = performance.now(), q = params();
  S.loading = true;
  $("status").textContent = "loading…"; $("status").className = "";
  try {
    const b = await (await get("/api/fleet", q)).json();
    if (mine !== S.loads) return;
    S.board = b; S.lastMs = performance.now() - started; S.loadedAt = Date.now();
    // A selection stays on its nodes and times: its rows are found again in the new answer.
    if (S.sel) {
      const idx = b.rows.map((r, i) => (r.nodes.some((n) => S.sel.nodes.includes(n)) ? i : -1)).filter((i) => i >= 0);
      if (idx.length) S.sel.rows = [Math.min(...idx), Math.max(...idx)]; else S.sel = null;
    }
    draw(); drawFindings();
    $("grid").dataset.query = q.toString();
    $("h-window").textContent = `window ${full(b.from_ns / 1e9)} → ${clock(b.to_ns / 1e9)} (${span((b.to_ns - b.from_ns) / 1e9)})`;
    $("h-nodes").textContent = `${b.nodes_with_data} nodes with data`;
    $("h-fresh").textContent = `read ${clock(Date.now() / 1000)} in ${Math.round(S.lastMs)} ms`;
    $("status").textContent = "";
  } catch (e) {
    if (mine === S.loads) { $("status").textContent = e.message; $("status").className = "err"; }
  } finally {
    if (mine === S.loads) S.loading = false;
  }
}
const live = () => { const t = $("to").value.trim(); return $("live").checked && (t === "" || t === "now" || t.startsWith("-")); };
// Every 2 s, or twice the last read's time on a large fleet; never two reads at once.
(function tick() {
  if (live() && !S.loading && !document.hidden && Date.now() - S.loadedAt >= Math.max(2000, 2 * S.lastMs)) load();
  setTimeout(tick, 250);
})();

async function loadStatus() {
  try {
    const st = await (await get("/api/status", new URLSearchParams())).json();
    $("h-source").textContent = st.source ? `read from ${st.source}` : "";
    document.title = `profiler · fleet of ${(st.nodes || []).length}`;
  } catch (e) { $("h-source").textContent = e.message; }
}

$("controls").addEventListener("submit", (ev) => { ev.preventDefault(); S.sel = null; writeURL(); load(); });
for (const id of ["measure", "group"]) $(id).addEventListener("change", () => { writeURL(); load(); });
let resizing = 0;
window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(() => S.board && draw(), 150); });

// What tests (and a curious engineer in the console) can ask the page.
function cellPoint(row, col) {
  const g = geometry(), r = $("grid").getBoundingClientRect();
  return { x: r.left + (col + 0.5) * g.cw, y: r.top + row * ROW_H + ROW_H / 2 };
}
window.fleetUI = { state: S, cellPoint, load, selectCells, showFlame };

readURL();
if (hashToken) writeURL(); // drops the token from the address
loadStatus();
load();
