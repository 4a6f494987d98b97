// The flamegraph of the selected range, drawn from /api/flamegraph?format=json
// (`{unit, name, value, children}`): search with highlight, click a frame to zoom, reset,
// flame or icicle, and the functions with the most self samples. It counts CPU samples, or
// (the `samples` selector) what the daemon's CUDA probes counted: its answer names the unit.
const ROW = 17;
// What each kind counts, for a tree that does not say (a report's).
const UNITS = { cpu: "samples", "cuda-launches": "launches", "cuda-sync": "µs blocked", "cuda-copies": "bytes", "off-cpu": "µs off CPU" };
const NONE = { cpu: "samples", "cuda-launches": "GPU launches", "cuda-sync": "time waiting on the GPU", "cuda-copies": "GPU copies" };
const samplesKind = () => $("samples").value || "cpu";
const kindLabel = () => $("samples").selectedOptions[0]?.textContent || "CPU";
const fmtCount = (v) => v.toLocaleString("en-US");
const counted = (v) => `${fmtCount(v)} ${S.unit || "samples"}`;

// Requests overlap (a drag, then a filter): only the latest may draw, or a slow earlier answer
// would replace the one asked for last. `data-drawn` says which request the drawing answers.
let flames = 0;
async function showFlamegraph(a, b) {
  const mine = ++flames, kind = samplesKind(), q = { from: a.toFixed(3), to: b.toFixed(3), format: "json" };
  if (kind !== "cpu") q.samples = kind;
  const query = params(q).toString();
  $("range").textContent = `${full(a)} → ${clock(b, true)} (${span(b - a)})${$("cpu").value.trim() ? ", CPUs " + $("cpu").value.trim() : ""}` +
    (kind !== "cpu" ? ` · ${kindLabel()}` : "");
  $("flamegraph").dataset.query = query;
  try {
    const r = await get("/api/flamegraph", q), tree = await r.json();
    if (mine !== flames) return;
    S.tree = tree; S.zoom = null; S.truncated = r.headers.get("x-profiler-truncated");
    S.unit = tree.unit || UNITS[kind];
    S.range = [a, b]; $("baseline").disabled = false;
    showPicked(null); drawFlame(); drawTop();
  } catch (e) {
    if (mine !== flames) return;
    S.tree = null;
    const p = document.createElement("p"); p.className = "err";
    // A CUDA kind the daemon never recorded: the server's sentence says why.
    const never = kind !== "cpu" && /libcuda/.test(e.message);
    p.textContent = e.status !== 404 ? e.message : never ? e.message[0].toUpperCase() + e.message.slice(1)
      : `No ${NONE[kind]} in this range with these filters.`;
    $("flamegraph").replaceChildren(p); $("top").replaceChildren();
  }
  $("flamegraph").dataset.drawn = query;
  drawWindow();
}

// Warm colours for user code, orange-red for the kernel, stable per name.
function frameColor(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
  const v = Math.abs(h) % 55;
  if (/^\[k\]|_\[k\]$|^\[softirq|^(__|do_|sys_|entry_|asm_)/.test(name)) return `rgb(${215 + (v % 40)},${90 + v},${40})`;
  return `rgb(${225 + (v % 30)},${150 + v * 1.5},${50 + (v % 20)})`;
}

function searchRe() {
  const q = $("search").value;
  if (!q) return null;
  try { return new RegExp(q, "i"); } catch (_) { return new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i"); }
}

function drawFlame() {
  const root = S.tree, el = $("flamegraph");
  if (!root) return;
  const zoom = S.zoom || [root], focus = zoom[zoom.length - 1], W = el.clientWidth || plotWidth() + LEFT;
  const re = searchRe(), icicle = !$("flameup").checked, boxes = [];
  let depth = 0, matched = 0;
  // The zoomed frame's ancestors span the full width, then the frame's subtree scaled to it.
  zoom.forEach((n, d) => boxes.push([n, d, 0, W, d < zoom.length - 1]));
  const walk = (n, d, x, w) => {
    depth = Math.max(depth, d);
    let cx = x;
    for (const c of n.children || []) {
      const cw = (c.value / n.value) * w;
      if (cw >= 1) { boxes.push([c, d + 1, cx, cw, false]); walk(c, d + 1, cx, cw); }
      cx += cw;
    }
  };
  walk(focus, zoom.length - 1, 0, W);
  depth = Math.max(depth, zoom.length - 1);
  // Samples under matching frames, counted once per path (the outermost match).
  const count = (n, inMatch) => {
    const hit = re && re.test(n.name);
    if (hit && !inMatch) matched += n.value;
    for (const c of n.children || []) count(c, inMatch || hit);
  };
  if (re) count(root, false);
  el.style.height = (depth + 1) * ROW + "px";
  el.replaceChildren(...boxes.map(([n, d, x, w, anc]) => {
    const f = document.createElement("div");
    f.className = "f" + (re && re.test(n.name) ? " hit" : "") + (anc ? " dim" : "");
    f.style.left = x + "px"; f.style.width = w + "px";
    f.style.top = (icicle ? d : depth - d) * ROW + "px";
    f.style.background = S.base ? diffColor(n) : frameColor(n.name);
    f.textContent = w > 20 ? n.name : "";
    f.dataset.name = n.name;
    f.title = `${n.name}\n${counted(n.value)}, ${((n.value / root.value) * 100).toFixed(2)} % of the range` + (S.base ? diffText(n) : "");
    f.addEventListener("click", () => {
      const path = d < zoom.length ? zoom.slice(0, d + 1) : [...zoom, ...pathTo(focus, n)];
      S.zoom = path.length > 1 ? path : null; drawFlame();
      showPicked({ name: n.name, depth: path.length - 1, process: path[1] });
    });
    return f;
  }));
  $("matched").textContent = re ? `matched ${((matched / root.value) * 100).toFixed(1)} % (${fmtCount(matched)} of ${counted(root.value)})` : counted(root.value) + (S.truncated ? ` — ${S.truncated}` : "");
}

// A clicked frame offers to filter everything by it: only the stacks through it (the function
// filter), only its process (the first frame under the root is the process name) or only a
// pod that process ran in (the tree lists them on the process, most samples first). Each
// reloads every chart with the filter, which the URL keeps.
function showPicked(p) {
  const el = $("picked");
  el.replaceChildren();
  if (!p || p.depth < 1) return;
  const offer = (label, title, apply) => {
    const b = document.createElement("button");
    b.type = "button"; b.textContent = label; b.title = title;
    b.addEventListener("click", () => { apply(); el.replaceChildren(); writeURL(true); load(); });
    el.appendChild(b);
  };
  if (p.depth >= 2) {
    const fn = p.name.replace(/_\[k\]$/, "");
    offer(`only stacks through ${fn}`, "every chart and the flamegraph keep only samples whose stack has this function", () => { $("function").value = fn; });
  }
  const proc = p.process;
  if (!proc) return;
  offer(`only process ${proc.name}`, "every chart and the flamegraph keep only this process", () => { $("comm").value = proc.name; });
  for (const [pod, n] of (proc.pods || []).slice(0, 3)) {
    const share = n < proc.value ? ` (${((n / proc.value) * 100).toFixed(0)} % of ${proc.name})` : "";
    offer(`only pod ${pod}${share}`, "every chart and the flamegraph keep only the processes of this pod", () => { $("pod").value = pod; });
  }
}

function pathTo(from, target) {
  const stack = [[from, []]];
  while (stack.length) {
    const [n, p] = stack.pop();
    for (const c of n.children || []) {
      const q = [...p, c];
      if (c === target) return q;
      stack.push([c, q]);
    }
  }
  return [];
}

// Self samples per function (what was on CPU itself), and the total under it once per path.
function drawTop() {
  const root = S.tree, self = new Map(), total = new Map();
  const walk = (n, seen) => {
    const kids = n.children || [];
    const s = n.value - kids.reduce((a, c) => a + c.value, 0);
    if (n !== root) {
      self.set(n.name, (self.get(n.name) || 0) + s);
      if (!seen.has(n.name)) total.set(n.name, (total.get(n.name) || 0) + n.value);
    }
    const next = n === root ? seen : new Set(seen).add(n.name);
    for (const c of kids) walk(c, next);
  };
  walk(root, new Set());
  const rows = [...self.entries()].filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]).slice(0, 20);
  const pct = (v) => ((v / root.value) * 100).toFixed(1) + " %";
  $("top-unit").textContent = S.unit || "samples";
  const head = document.createElement("tr");
  head.innerHTML = "<th>self</th><th></th><th>total</th><th>function</th>";
  $("top").replaceChildren(head, ...rows.map(([name, v]) => {
    const tr = document.createElement("tr");
    for (const t of [fmtCount(v), pct(v), pct(total.get(name) || 0), name]) { const td = document.createElement("td"); td.textContent = t; tr.appendChild(td); }
    tr.tabIndex = 0; tr.title = "highlight it in the flamegraph";
    const pick = () => { $("search").value = "^" + name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$"; writeURL(false); drawFlame(); };
    tr.addEventListener("click", pick);
    tr.addEventListener("keydown", (ev) => { if (ev.key === "Enter") pick(); });
    return tr;
  }));
}

$("search").addEventListener("input", () => { writeURL(false); drawFlame(); });
$("reset").addEventListener("click", () => { S.zoom = null; drawFlame(); });
$("flameup").addEventListener("change", () => { writeURL(false); drawFlame(); });
// Another count: the selected range's flamegraph again (a baseline of another count would
// compare unlike things: it is cleared). The heatmap and CPU x time stay CPU.
$("samples").addEventListener("change", () => {
  writeURL(false);
  if (S.base) $("baseline").click();
  const r = S.sel || S.range;
  if (r) showFlamegraph(...r);
});
// A report offers the counts it holds: CPU samples, and those the node recorded in its
// window (report.js); no selector when it holds CPU samples only.
if (window.PROFILER_REPORT) {
  const have = new Set(window.PROFILER_REPORT.flamegraphs.map((f) => f.samples || "cpu"));
  for (const o of [...$("samples").options]) if (!have.has(o.value)) o.remove();
  $("samples-pick").hidden = $("samples").options.length < 2;
}

// Differential mode: each frame coloured by how its share of the samples changed from the
// baseline range (red: more, blue: less), matched by its path from the root.
function shares(root) {
  const m = new Map(), walk = (n, key) => { m.set(key, n.value / root.value); for (const c of n.children || []) walk(c, key + ";" + c.name); };
  walk(root, "");
  return m;
}
function keyOf(n) {
  if (!S.keys || S.keys.tree !== S.tree) {
    S.keys = { tree: S.tree, map: new Map() };
    const walk = (x, key) => { S.keys.map.set(x, key); for (const c of x.children || []) walk(c, key + ";" + c.name); };
    walk(S.tree, "");
  }
  return S.keys.map.get(n);
}
function delta(n) { return n.value / S.tree.value - (S.base.shares.get(keyOf(n)) || 0); }
function diffColor(n) {
  const d = delta(n), x = Math.min(1, Math.abs(d) / 0.2), l = Math.round(235 - 150 * x);
  return d >= 0 ? `rgb(255,${l},${l})` : `rgb(${l},${l},255)`;
}
function diffText(n) {
  const d = delta(n) * 100;
  return `\n${d >= 0 ? "+" : ""}${d.toFixed(2)} points vs the baseline`;
}
$("baseline").addEventListener("click", () => {
  if (S.base) { S.base = null; $("baseline").textContent = "Use as baseline"; $("base-info").textContent = ""; drawFlame(); return; }
  if (!S.tree) return;
  S.base = { shares: shares(S.tree), range: S.range };
  $("baseline").textContent = "Clear baseline";
  $("base-info").textContent = `baseline ${clock(S.range[0], true)} → ${clock(S.range[1], true)}: select another range to compare (red: more, blue: less)`;
  drawFlame();
});
