// A process's threads on the heatmap's time axis (GET /api/threads): a strip per thread, each
// bucket's height split into running (its CPU samples), runnable (preempted, waiting for a CPU),
// blocked in I/O and blocked otherwise (its off-CPU time by state), bottom to top. A loader
// blocked in I/O while the GPU idles shows as a red strip under the GPU's flat line.
const TL_STATES = [
  ["--tl-running", "running"],
  ["--tl-runnable", "runnable (preempted)"],
  ["--tl-io", "blocked in I/O"],
  ["--tl-sleep", "blocked otherwise"],
];
const TL_ROW = 16;

// The pid asked for, or null (a pid is digits, not 0).
function tlPid() {
  const v = $("tl-pid").value.trim();
  return /^[1-9][0-9]{0,9}$/.test(v) ? v : null;
}

let tlLoads = 0;
async function loadThreads() {
  const pid = tlPid(), mine = ++tlLoads, st = $("tl-status");
  st.className = "";
  if (!S.dom || !pid) {
    S.threads = null;
    $("tl-rows").replaceChildren(); $("tl-legend").replaceChildren();
    st.textContent = $("tl-pid").value.trim() && !pid ? "pid is a process id (digits)" : "";
    if (st.textContent) st.className = "err";
    return;
  }
  st.textContent = "loading…";
  try {
    const t = await (await get("/api/threads", { pid, from: String(S.dom.t0), to: String(S.dom.t1) })).json();
    if (mine !== tlLoads) return;
    S.threads = t;
    drawThreads();
    $("tl-rows").dataset.query = `pid=${pid}&from=${S.dom.t0}&to=${S.dom.t1}`;
    const notes = [];
    if (!t.threads.length) notes.push(`no samples and no waits of pid ${pid} in this window`);
    if (t.more_threads) notes.push(`${t.more_threads} more threads with less time not drawn`);
    if (!t.off_cpu) notes.push("no off-CPU time recorded (the daemon runs with --off-cpu-threshold-ms 0): running only");
    if (t.note) notes.push(t.note);
    st.textContent = notes.join("; ");
  } catch (e) {
    if (mine !== tlLoads) return;
    S.threads = null;
    $("tl-rows").replaceChildren();
    st.textContent = e.message; st.className = "err";
  }
}

// The cell under x of thread row `t`: its column's numbers, or null.
function tlCell(t, x) {
  const g = S.threads, col = Math.floor((T(x) - g.first_ns / 1e9) / (g.bucket_ns / 1e9));
  return t.cells.find((c) => c[0] === col) || null;
}

function tlText(t, c) {
  const g = S.threads, t0 = g.first_ns / 1e9 + (c[0] * g.bucket_ns) / 1e9;
  const ms = (v) => (v >= 100 ? Math.round(v) : +v.toFixed(1));
  return `thread ${t.tid} ${t.comm}  ${full(t0, false)} (+${span(g.bucket_ns / 1e9)})\n` +
    TL_STATES.map(([, label], i) => `${label}: ${ms(c[i + 1])} ms`).join("\n");
}

function drawThreads() {
  const g = S.threads, d = S.dom;
  if (!g || !d) return;
  const colors = TL_STATES.map(([v]) => css(v)), bucketMs = g.bucket_ns / 1e6, out = [];
  for (const t of g.threads) {
    const row = document.createElement("div"), name = document.createElement("div"), cv = document.createElement("canvas");
    row.className = "track"; name.className = "name";
    name.append(Object.assign(document.createElement("span"), { textContent: t.comm || "?" }),
      Object.assign(document.createElement("span"), { textContent: String(t.tid) }));
    name.title = `thread ${t.tid} ${t.comm}: ` + TL_STATES.map(([, l], i) => `${l} ${Math.round(t.totals_ms[i])} ms`).join(", ");
    row.dataset.tid = t.tid;
    const c = canvas(cv, d.w, TL_ROW);
    c.fillStyle = css("--empty"); c.fillRect(0, 0, d.w, TL_ROW);
    for (const cell of t.cells) {
      const a = g.first_ns / 1e9 + (cell[0] * g.bucket_ns) / 1e9;
      const x0 = X(a), x1 = X(a + g.bucket_ns / 1e9);
      if (x1 < 0 || x0 > d.w) continue;
      // Bottom up, each state's share of the bucket (sampling can make running a little over).
      let y = TL_ROW;
      for (let i = 0; i < 4; i++) {
        const h = Math.min(y, (cell[i + 1] / bucketMs) * TL_ROW);
        if (h <= 0) continue;
        c.fillStyle = colors[i];
        c.fillRect(Math.max(0, x0), y - h, Math.max(1, x1 - x0 - (x1 - x0 > 4 ? 1 : 0)), h);
        y -= h;
      }
    }
    cv.setAttribute("aria-label", name.title);
    cv.addEventListener("mousemove", (ev) => {
      const cell = tlCell(t, ev.clientX - cv.getBoundingClientRect().left);
      if (!cell) return hideTip();
      showTip(tlText(t, cell), ev.clientX, ev.clientY);
    });
    cv.addEventListener("mouseleave", hideTip);
    row.append(name, cv); out.push(row);
  }
  $("tl-rows").replaceChildren(...out);
  const sw = (color, label) => { const s = document.createElement("span"), i = document.createElement("i"); i.style.background = color; s.append(i, label); return s; };
  $("tl-legend").replaceChildren(...TL_STATES.map(([, label], i) => sw(colors[i], label)),
    `bucket ${span(g.bucket_ns / 1e9)}; height: share of the bucket`);
}

$("tl-form").addEventListener("submit", (ev) => { ev.preventDefault(); writeURL(false); loadThreads(); });
// What tests can ask: the answer drawn, and the text of a thread's cell at time t (unix s).
window.profilerUI.threads = () => S.threads;
window.profilerUI.threadCellText = (tid, t) => {
  const th = S.threads && S.threads.threads.find((x) => x.tid === tid);
  const cell = th && tlCell(th, X(t));
  return cell ? tlText(th, cell) : null;
};
