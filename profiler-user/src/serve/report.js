// Report mode: `profiler report` writes this page with its data in `window.PROFILER_REPORT`
// (export/report.rs). The page then answers its own requests from that data: the window's
// heatmap, CPU x time, findings, events and counter tracks, and the flamegraphs of the whole
// window and of each finding's window on its CPU; for the other counts the node recorded (GPU
// launches, waits and copies, off-CPU time), the whole window's, chosen with the page's count
// selector. Nothing is fetched; it works from a file.
// (Read through `window`: page.js's start-up runs before this file's top-level code would.)

function reportAnswer(body, headers) {
  return new Response(JSON.stringify(body), { headers: { "content-type": "application/json", ...(headers || {}) } });
}

function reportRefusal(message) {
  const e = new Error(message); e.status = 400;
  return e;
}

// The window a report opens on, when its address says none.
function reportDefault(k) {
  const R = window.PROFILER_REPORT;
  if (k === "from") return iso(R.from_ns / 1e9);
  if (k === "to") return iso(R.to_ns / 1e9);
  return "";
}

function fromReport(path, extra) {
  const p = params(extra), R = window.PROFILER_REPORT;
  if (path === "/api/status") return reportAnswer(R.status);
  if (path === "/api/findings") return reportAnswer(R.findings);
  if (path === "/api/events") return reportAnswer(R.events);
  if (path === "/api/counters") return reportAnswer(R.counters || { tracks: [] });
  const meta = (R.status && R.status.meta) || {}, own = meta.node || meta.hostname;
  if (p.get("node") && p.get("node") !== own) throw reportRefusal(`this report holds node ${own} only`);
  // The report holds its window unfiltered (a finding's CPU aside, below).
  if (FIELDS.slice(3, -1).some((k) => p.get(k))) {
    throw reportRefusal("a report holds its window without filters: open the live page (`profiler ui`) to filter");
  }
  if (path === "/api/heatmap") return reportAnswer(R.heatmap);
  if (path === "/api/cputime") return reportAnswer(R.cputime);
  if (path === "/api/flamegraph") {
    // The precomputed flamegraph of this CPU filter whose window is, within a half, the range
    // asked for (a finding's mark asks for exactly its window).
    const a = Number(p.get("from")), b = Number(p.get("to")), cpu = p.get("cpu") || "", kind = p.get("samples") || "cpu";
    let best = null, most = 0;
    for (const f of R.flamegraphs) {
      if ((f.cpu == null ? "" : String(f.cpu)) !== cpu || (f.samples || "cpu") !== kind) continue;
      const overlap = Math.min(b, f.to) - Math.max(a, f.from);
      if (overlap >= 0.5 * Math.max(b - a, f.to - f.from) && overlap > most) { best = f; most = overlap; }
    }
    if (!best && kind !== "cpu") {
      throw reportRefusal(`a report holds the ${$("samples").selectedOptions[0]?.textContent || kind} flamegraph of its whole window (all CPUs) only: open the live page (\`profiler ui\`) for another range`);
    }
    if (!best) {
      const have = R.flamegraphs.filter((f) => (f.samples || "cpu") === "cpu").map((f) => f.caption.split(":")[0] + (f.cpu == null ? "" : ` (CPU ${f.cpu})`)).join("; ");
      throw reportRefusal(`a report holds the flamegraphs of its whole window and of each finding's window on its CPU (${have}): select one of those (a finding's mark opens it), or open the live page`);
    }
    return reportAnswer(best.tree, { "x-profiler-truncated": `from this report: ${best.caption}` });
  }
  throw reportRefusal(`${path} is not in this report`);
}
