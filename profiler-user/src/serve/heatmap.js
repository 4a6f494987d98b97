// The subsecond heatmap on the page: a column per second (or per k seconds, coarsened), a row
// per slice of the second, each cell's samples as a colour; its tooltips (with the thread that
// ran most in the cell), and the selection by drag, clicks or keys that opens a flamegraph.
// Runs in one script after page.js (the helpers it draws with live there). The CLI's heatmap,
// as SVG or PNG, is drawn by export/heatmap.rs.
function gridInfo() {
  const g = S.grid, k = g.coarsened ? g.coarsened.seconds_per_column : 1;
  return { g, k, rows: g.rows.length, rowMs: 1000 / g.rows.length, ch: Math.max(4, Math.floor(300 / g.rows.length)) };
}
// A cell's start time: its column's second plus its row's offset (whole columns when coarsened).
function cellTime(c, i) {
  const { g, k } = gridInfo();
  return g.first_second + g.columns[c] + (k > 1 ? 0 : g.rows[i] / 1000);
}
function cellSpan() { const { k, rowMs } = gridInfo(); return k > 1 ? k : rowMs / 1000; }
// Columns the store holds nothing for (the daemon was down, or retention removed them): drawn
// hatched and said so, unlike an idle machine's empty cells.
function isGap(c) { return !!(S.grid.gaps && S.grid.gaps.includes(c)); }
function cellText(c, i) {
  const { g, k, rowMs } = gridInfo(), t = g.first_second + g.columns[c];
  const when = k > 1 ? `${full(t, false)} + ${k} s` : full(t, false);
  if (isGap(c)) return `${when}\nno data: the profiler was not recording (stopped, or the data aged out)`;
  return `${when}\noffset ${g.rows[i]}–${+(g.rows[i] + rowMs).toFixed(1)} ms\n${g.values[c][i]} samples`;
}
function hatch(c, x, w, h) {
  c.save(); c.beginPath(); c.rect(x, 0, w, h); c.clip();
  c.strokeStyle = css("--gap"); c.lineWidth = 2;
  for (let d = -h; d < w; d += 6) { c.beginPath(); c.moveTo(x + d, h); c.lineTo(x + d + h, 0); c.stroke(); }
  c.restore();
}
function cellAt(ev) {
  const { g, ch } = gridInfo(), r = $("hm").getBoundingClientRect();
  const x = ev.clientX - r.left, y = ev.clientY - r.top;
  const c = Math.floor((T(x) - g.first_second) / gridInfo().k), i = Math.floor(y / ch);
  return c >= 0 && c < g.columns.length && i >= 0 && i < g.rows.length ? [c, i] : null;
}
function cellPoint(c, i) {
  const { g, k, ch } = gridInfo(), r = $("hm").getBoundingClientRect();
  const t = g.first_second + g.columns[c] + k / 2;
  return { x: r.left + X(t), y: r.top + i * ch + ch / 2 };
}

function drawHeatmap() {
  const { g, k, rows, ch } = gridInfo(), d = S.dom, h = rows * ch;
  const c = canvas($("hm"), d.w, h);
  const base = layer("hm", [g, d.w, h, d.t0, d.t1, css("--empty")], d.w, h, (c) => {
    c.fillStyle = css("--empty"); c.fillRect(0, 0, d.w, h);
    (g.gaps || []).forEach((ci) => {
      const x0 = X(g.first_second + g.columns[ci]);
      hatch(c, x0, X(g.first_second + g.columns[ci] + k) - x0, h);
    });
    g.values.forEach((col, ci) => {
      const x0 = X(g.first_second + g.columns[ci]), x1 = X(g.first_second + g.columns[ci] + k);
      col.forEach((v, i) => { if (v) { c.fillStyle = heat(v, g.maxvalue); c.fillRect(x0, i * ch, Math.max(1, x1 - x0 - (x1 - x0 > 4 ? 1 : 0)), ch - (ch > 4 ? 1 : 0)); } });
    });
  });
  c.drawImage(base, 0, 0, d.w, h);
  if (S.sel) {
    const [a, b] = S.sel, sp = cellSpan();
    c.strokeStyle = css("--sel-line"); c.fillStyle = css("--sel"); c.lineWidth = 1;
    g.values.forEach((col, ci) => {
      // Only the columns the selection reaches (a column spans k seconds).
      const t0 = g.first_second + g.columns[ci];
      if (t0 + k <= a || t0 >= b) return;
      col.forEach((_, i) => {
        const t = cellTime(ci, i);
        if (t + sp > a + 1e-6 && t < b - 1e-6) {
          const x0 = X(t0), x1 = X(t0 + k);
          c.fillRect(x0, i * ch, x1 - x0, ch);
        }
      });
    });
  }
  if (S.anchor) {
    const [ci, i] = S.anchor, x0 = X(g.first_second + g.columns[ci]);
    c.strokeStyle = css("--sel-line"); c.lineWidth = 2; c.strokeRect(x0, i * ch, X(g.first_second + g.columns[ci] + k) - x0, ch);
  }
  if (S.cursor) {
    const [ci, i] = S.cursor, x0 = X(g.first_second + g.columns[ci]);
    c.strokeStyle = css("--fg"); c.lineWidth = 1; c.strokeRect(x0 + 0.5, i * ch + 0.5, X(g.first_second + g.columns[ci] + k) - x0 - 1, ch - 1);
  }
  // Offset axis: the grid's rows run from the last slice of the second (top) to 0 ms (bottom).
  const y = $("hm-y"); y.style.height = h + "px";
  y.replaceChildren(...[0, 200, 400, 600, 800, 1000].map((ms) => {
    const s = document.createElement("span"); s.style.top = h - (ms / 1000) * h + "px"; s.textContent = ms + " ms"; return s;
  }));
  drawTimeAxis($("hm-x"));
  const lg = [0, 0.05, 0.25, 0.5, 1].map((f) => Math.round(g.maxvalue * f)).filter((v, j, a) => j === 0 || v !== a[j - 1]);
  const cell = k > 1 ? `${k} s` : `${+(1000 / rows).toFixed(1)} ms`;
  $("hm-legend").replaceChildren(`samples per cell (${cell}):`, ...lg.map((v) => {
    const s = document.createElement("span"), i = document.createElement("i"); i.style.background = heat(v, g.maxvalue);
    s.append(i, String(v)); return s;
  }), ...(g.gaps && g.gaps.length ? [(() => {
    const s = document.createElement("span"), i = document.createElement("i");
    i.className = "gap"; s.append(i, "no data"); return s;
  })()] : []), g.coarsened ? ` — ${g.coarsened.reason}` : "");
}

// Which thread ran most in a cell: asked once the pointer rests on it (one small fold of
// that cell's slice), then remembered for the loaded grid.
let topTimer = 0;
const tops = new Map();
function topOf(cell, x, y) {
  clearTimeout(topTimer);
  const [c, i] = cell, key = `${S.grid.first_second}/${c}/${i}`;
  if (!S.grid.values[c][i] || isGap(c)) return;
  const show = (text) => { if (!tip.hidden && tip.textContent.startsWith(cellText(c, i))) showTip(`${cellText(c, i)}\n${text}`, x, y); };
  if (tops.has(key)) return show(tops.get(key));
  topTimer = setTimeout(async () => {
    const t = cellTime(c, i);
    try {
      const tree = await (await get("/api/flamegraph", { from: t.toFixed(3), to: (t + cellSpan()).toFixed(3), format: "json" })).json();
      const best = (tree.children || []).reduce((a, b) => (b.value > a.value ? b : a), { value: 0 });
      tops.set(key, best.value ? `most: ${best.name} (${best.value} of ${tree.value})` : "");
      show(tops.get(key));
    } catch (_) { /* the tooltip stays without it */ }
  }, 300);
}

// Selection: drag, or click a start cell then an end cell; shift-click extends the selection.
let drag = null;
function finishSelection(a, b) {
  const [c0, i0] = a, [c1, i1] = b;
  let t0 = cellTime(c0, i0), t1 = cellTime(c1, i1);
  if (t1 < t0) [t0, t1] = [t1, t0];
  select(t0, t1 + cellSpan());
}
function select(a, b) {
  S.sel = [a, b]; S.anchor = null;
  $("zoom").disabled = false;
  writeURL(false); redraw(); showFlamegraph(a, b);
}
$("hm").addEventListener("mousedown", (ev) => {
  const cell = S.grid && cellAt(ev);
  if (!cell) return;
  ev.preventDefault();
  if (ev.shiftKey && (S.anchor || S.sel)) {
    const [c, i] = cell, t = cellTime(c, i);
    const a = S.anchor ? cellTime(...S.anchor) : S.sel[0];
    select(Math.min(a, t), Math.max(a + (S.anchor ? cellSpan() : S.sel[1] - S.sel[0]), t + cellSpan()));
    return;
  }
  drag = { from: cell, to: cell };
});
window.addEventListener("mousemove", (ev) => {
  if (!S.grid) return;
  const cell = cellAt(ev);
  if (drag && cell) { drag.to = cell; const a = cellTime(...drag.from), b = cellTime(...cell); S.sel = [Math.min(a, b), Math.max(a, b) + cellSpan()]; redraw(); }
  if (ev.target === $("hm") && cell) { showTip(cellText(...cell), ev.clientX, ev.clientY); topOf(cell, ev.clientX, ev.clientY); }
  else if (ev.target === $("hm")) hideTip();
});
window.addEventListener("mouseup", () => {
  if (!drag) return;
  const d = drag; drag = null;
  if (d.from[0] !== d.to[0] || d.from[1] !== d.to[1]) return finishSelection(d.from, d.to);
  // A click: the first one anchors, the second ends the selection.
  if (S.anchor) return finishSelection(S.anchor, d.from);
  S.anchor = d.from; S.sel = null; $("range").textContent = "(now click the end cell)"; redraw();
});
$("hm").addEventListener("mouseleave", hideTip);
$("hm").addEventListener("keydown", (ev) => {
  if (!S.grid) return;
  const { g } = gridInfo(), cur = S.cursor || [0, g.rows.length - 1];
  const moves = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };
  if (moves[ev.key]) {
    ev.preventDefault();
    const [dc, di] = moves[ev.key];
    S.cursor = [Math.max(0, Math.min(g.columns.length - 1, cur[0] + dc)), Math.max(0, Math.min(g.rows.length - 1, cur[1] + di))];
    redraw();
    const p = cellPoint(...S.cursor); showTip(cellText(...S.cursor), p.x, p.y);
  } else if (ev.key === "Enter") {
    ev.preventDefault();
    if (S.anchor) finishSelection(S.anchor, cur);
    else { S.anchor = cur; S.sel = null; redraw(); }
  }
});
$("hm").addEventListener("blur", hideTip);
