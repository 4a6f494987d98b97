// The node's GPUs on the page (issue 26), from `/api/status`'s `gpus` (a report carries the
// same): a line per GPU under the header (model, UUID, bus, the CPUs local to it and those that
// take its interrupts), the GPU-local CPUs marked beside their rows in CPU x time (a GPU's
// feeders on CPUs far from it cross the socket for every batch), and each GPU's faults (the
// Xid events naming it) as marks on its strip.

// The GPU list a status answer has; none on a node without NVML or without GPUs (the page does
// not say so on every CPU-only node: `profiler status` does).
function showGpus(st) {
  const inv = st.gpus || {}, gpus = inv.unavailable ? [] : inv.gpus || [];
  S.gpus = gpus;
  const cpus = (l) => (l && l.length ? cpuRuns(l) : "unknown");
  $("gpus").textContent = gpus
    .map((g) => `GPU ${g.index} ${g.model} (${g.uuid}, bus ${g.bus_id}): local CPUs ${cpus(g.local_cpus)}, interrupts on CPUs ${cpus(g.irq_cpus)}`)
    .join(" | ");
  if (S.ct) drawCputime();
}

// `0-5,14,15` as `profiler status` writes it.
function cpuRuns(list) {
  const out = [];
  for (let i = 0; i < list.length; i++) {
    let j = i;
    while (j + 1 < list.length && list[j + 1] === list[j] + 1) j++;
    out.push(j > i ? `${list[i]}-${list[j]}` : String(list[i]));
    i = j;
  }
  return out.join(",");
}

// The GPUs a CPU is local to.
function gpusLocalTo(cpu) {
  return (S.gpus || []).filter((g) => (g.local_cpus || []).includes(cpu)).map((g) => g.index);
}

// A bar left of each GPU-local CPU's row, in the plot's margin (the row itself stays its heat).
function markGpuLocal(c, cpus, rh) {
  c.fillStyle = css("--info");
  cpus.forEach((cpu, row) => { if (gpusLocalTo(cpu).length) c.fillRect(LEFT - 4, row * rh, 3, Math.max(1, rh - 1)); });
}

// The legend's entry for those bars, when there are some.
function gpuLegend() {
  const gpus = (S.gpus || []).filter((g) => (g.local_cpus || []).length);
  if (!gpus.length) return [];
  const s = document.createElement("span"), i = document.createElement("i");
  i.className = "gpu-local"; i.style.background = css("--info");
  s.append(i, gpus.map((g) => `local to GPU ${g.index}: CPUs ${cpuRuns(g.local_cpus)}`).join("; "));
  return [s];
}

// The Xid events of GPU `index` (the kernel log's `[GPU 0 (...): Xid ...]`, NVML's `on GPU 0`)
// as red lines across its strip, where the utilisation shows what the fault did.
function markGpuFaults(c, index) {
  const mine = new RegExp(`(\\[GPU ${index} \\(|\\bon GPU ${index}\\b)`);
  c.fillStyle = css("--critical");
  for (const e of S.events) {
    if (/Xid/.test(e.message) && mine.test(e.message)) c.fillRect(Math.round(X(e.ts_ns / 1e9)) - 1, 0, 2, 26);
  }
}
