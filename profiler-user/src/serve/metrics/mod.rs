//! `/metrics`: what the daemon knows about itself and the machine, in Prometheus' text format.

use std::collections::BTreeMap;

mod exposition;
mod gpu;
mod live;
mod memory;
mod offcpu;
mod python;
mod start;

pub use exposition::escape_label;
use exposition::write_family;
pub use live::{CpuTotals, Depth, Live, Part, Sampling, Upkeep};

use crate::pipeline::Figures;

pub fn render(l: &Live) -> String {
    // Copies, so that no producer waits on the rendering.
    let (s, p, u) = (l.sampling.get(), l.pipeline.get(), l.upkeep.get());
    let mut out = String::new();
    sampler(&s, &p, &mut out);
    queue_and_latency(&s, &p, &mut out);
    machine_store_and_caches(&s, &p, &u, &mut out);
    otlp(l.otlp.as_ref(), &mut out);
    let mut family = |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| {
        write_family(&mut out, name, kind, help, values)
    };
    family(
        "profiler_sampling_frequency_hertz",
        "gauge",
        "Samples per second per CPU.",
        vec![(String::new(), l.frequency_hz as f64)],
    );
    out.push_str(&gpu::xids(&l.gpu_xids.lock().unwrap_or_else(|p| p.into_inner())));
    if let Some(stats) = &l.clickhouse {
        out.push_str(&crate::ship::clickhouse::metrics::render(&stats.lock().unwrap_or_else(|p| p.into_inner())));
    }
    if let Some(gpu) = &l.gpu {
        out.push_str(&gpu::render(&gpu.lock().unwrap_or_else(|p| p.into_inner())));
    }
    if let Some(cuda) = &l.cuda.get() {
        out.push_str(&gpu::cuda(cuda));
    }
    if let Some(o) = &l.offcpu.get() {
        offcpu::render(o, &mut out);
    }
    memory::render(&mut out);
    python::render(&mut out);
    start::render(&mut out, &crate::collect::start::figures());
    out
}

/// Samples, their losses and stacks, the unwinder's tables, the BPF programs' cost.
fn sampler(s: &Sampling, p: &Figures, out: &mut String) {
    let mut family =
        |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| write_family(out, name, kind, help, values);
    family("profiler_samples_total", "counter", "Samples taken, by CPU and state.", {
        let mut v: Vec<(String, f64)> =
            p.per_cpu.iter().map(|(cpu, c)| (format!("{{cpu=\"{cpu}\",state=\"busy\"}}"), c.0 as f64)).collect();
        v.extend(p.per_cpu.iter().map(|(cpu, c)| (format!("{{cpu=\"{cpu}\",state=\"idle\"}}"), c.1 as f64)));
        v
    });
    // (label value, the figure of a CPU)
    type Figure<'a> = (&'a str, &'a dyn Fn(&CpuTotals) -> u64);
    let by_cpu = |label: &str, values: &[Figure<'_>]| -> Vec<(String, f64)> {
        values
            .iter()
            .flat_map(|(value, f)| {
                s.per_cpu.iter().map(move |(cpu, c)| (format!("{{cpu=\"{cpu}\",{label}=\"{value}\"}}"), f(c) as f64))
            })
            .collect()
    };
    family(
        "profiler_lost_samples_total",
        "counter",
        "Samples taken but never stored, by cause: ring_full (the kernel's ring buffer had no room) or queue_full \
         (the queue behind the ring reader had no room).",
        by_cpu("reason", &[("ring_full", &|c| c.ring_full), ("queue_full", &|c| c.queue_full)]),
    );
    family(
        "profiler_unwind_walk_ends_total",
        "counter",
        "Why table walks ended, summed over CPUs: outermost (the thread's first frame), fp_zero (a zero frame \
         pointer outside the tables), no_row (code without unwind information), no_rule (a gap or a rule the \
         compiler could not follow), unreadable (a stack word), limit (frames or tail calls). After no_row, no_rule \
         or unreadable the stack scan may go on (profiler_unwind_scanned_frames_total); the last end counts.",
        profiler_common::unwind::end::NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let total: u64 = s.per_cpu.values().map(|c| c.stacks.unwind_ends[i]).sum();
                (format!("{{reason=\"{name}\"}}"), total as f64)
            })
            .collect(),
    );
    family(
        "profiler_unwind_scanned_frames_total",
        "counter",
        "Return addresses found by scanning the stack where no unwind rule went on (a word returning into an \
         executable mapping just after a call instruction), summed over CPUs.",
        vec![(String::new(), s.per_cpu.values().map(|c| c.stacks.unwind_scanned).sum::<u64>() as f64)],
    );
    family(
        "profiler_stack_errors_total",
        "counter",
        "Samples stored whose kernel or user stack could not be captured (delivered, not lost).",
        by_cpu("stack", &[("kernel", &|c| c.stacks.kernel_stack_errors), ("user", &|c| c.stacks.user_stack_errors)]),
    );
    family(
        "profiler_unwind_walks_total",
        "counter",
        "User stacks walked with unwind tables (code without frame pointers), and of those the walks that stopped \
         before the outermost frame (an address without a rule, an unreadable stack word, the frame limit).",
        by_cpu("outcome", &[("walked", &|c| c.stacks.unwind_walks), ("stopped", &|c| c.stacks.unwind_stopped)]),
    );
    if let Some(u) = &p.unwind {
        let mut gauge = |name: &str, help: &str, v: u64| family(name, "gauge", help, vec![(String::new(), v as f64)]);
        gauge("profiler_unwind_tables", "Binaries whose unwind table is in the kernel.", u.tables);
        gauge(
            "profiler_unwind_table_rows",
            "Rows of unwind tables in the kernel, with their page indexes (4 bytes each; bounded by --unwind-table-mib).",
            u.rows,
        );
        gauge("profiler_unwind_processes", "Processes described to the unwinder.", u.processes);
        gauge(
            "profiler_unwind_files_without_table",
            "Mapped binaries without a usable unwind table (no or malformed call frame information): their \
             frames are walked with frame pointers.",
            u.without,
        );
        gauge(
            "profiler_unwind_mappings_left_out",
            "Executable mappings of files with unwind tables left out of their process's description (over 256 \
             per process): their frames are walked with frame pointers.",
            u.mappings_left_out,
        );
        family(
            "profiler_unwind_tables_did_not_fit_total",
            "counter",
            "Unwind tables that did not fit in --unwind-table-mib after unused ones were evicted: their binaries \
             are walked with frame pointers.",
            vec![(String::new(), u.did_not_fit as f64)],
        );
        family(
            "profiler_unwind_processes_evicted_total",
            "counter",
            "Processes that gave up their place in the kernel's full table of described processes to a newer one (the \
             least recently sampled first): walked with frame pointers until sampled again.",
            vec![(String::new(), u.processes_evicted as f64)],
        );
        family(
            "profiler_unwind_processes_refused_total",
            "counter",
            "Processes the kernel's table of described processes refused even after an eviction: walked with frame \
             pointers.",
            vec![(String::new(), u.processes_refused as f64)],
        );
    }
    family(
        "profiler_throttled_samples_estimate_total",
        "counter",
        "Estimate of ticks the kernel skipped (perf throttling, another BPF program running): ticks expected at the \
         sampling frequency since the CPU was attached minus ticks the sampler saw, beyond a tolerance of one \
         second's ticks plus 2 %.",
        s.per_cpu.iter().map(|(cpu, c)| (format!("{{cpu=\"{cpu}\"}}"), c.throttled_estimate as f64)).collect(),
    );
    family(
        "profiler_bpf_recursion_misses_total",
        "counter",
        "Runs of the sampler the kernel skipped because another BPF program was running on that CPU \
         (bpf_prog_info.recursion_misses, kernel 5.12+).",
        s.recursion_misses.map(|n| vec![(String::new(), n as f64)]).unwrap_or_default(),
    );
    family(
        "profiler_bpf_program_run_seconds_total",
        "counter",
        "Time the kernel spent in each of the daemon's BPF programs (bpf_prog_info.run_time_ns). Counted only \
         while the sysctl kernel.bpf_stats_enabled is 1 (it costs ~20 ns a run), so 0 otherwise.",
        s.programs.iter().map(|(name, ns, _)| (format!("{{program=\"{name}\"}}"), *ns as f64 / 1e9)).collect(),
    );
    family(
        "profiler_bpf_program_runs_total",
        "counter",
        "Runs of each of the daemon's BPF programs (bpf_prog_info.run_cnt), counted only while \
         kernel.bpf_stats_enabled is 1.",
        s.programs.iter().map(|(name, _, n)| (format!("{{program=\"{name}\"}}"), *n as f64)).collect(),
    );
}

/// The queue between the ring reader and the pipeline, and the ring-to-disk latency.
fn queue_and_latency(s: &Sampling, p: &Figures, out: &mut String) {
    let mut family =
        |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| write_family(out, name, kind, help, values);
    family(
        "profiler_queue_records",
        "gauge",
        "Ring records waiting in the queue between the ring reader and the pipeline.",
        vec![(String::new(), s.queue.records as f64)],
    );
    family(
        "profiler_queue_records_max",
        "gauge",
        "Most ring records waiting in the queue at once since the daemon started.",
        vec![(String::new(), s.queue.max_records as f64)],
    );
    family(
        "profiler_queue_bytes",
        "gauge",
        "Bytes of ring records waiting in the queue.",
        vec![(String::new(), s.queue.bytes as f64)],
    );
    family(
        "profiler_queue_bytes_max",
        "gauge",
        "Most bytes waiting in the queue at once since the daemon started.",
        vec![(String::new(), s.queue.max_bytes as f64)],
    );
    family(
        "profiler_queue_capacity_bytes",
        "gauge",
        "The queue's bound: records beyond it are dropped and counted (profiler_lost_samples_total{reason=\"queue_full\"}).",
        vec![(String::new(), s.queue.capacity_bytes as f64)],
    );
    family(
        "profiler_queue_dropped_events_total",
        "counter",
        "Exec and cgroup event records dropped because the queue was full.",
        vec![(String::new(), s.events_dropped as f64)],
    );
    family(
        "profiler_kernel_dropped_events_total",
        "counter",
        "Exec, fork, exit and cgroup event records the kernel dropped because the events ring buffer was full.",
        vec![(String::new(), s.events_lost as f64)],
    );
    // A summary: a `quantile` label belongs to no other type (`promtool check metrics` refuses
    // it on a gauge), and a summary has its `_sum` and `_count` (written here as the "labels"
    // that follow the family's name).
    family(
        "profiler_ring_to_disk_latency_seconds",
        "summary",
        "Age of the oldest sample a flush wrote (flush time minus sample time): p50 and max over the last 120 \
         flushes; sum and count over every flush since start.",
        {
            let mut v: Vec<(String, f64)> = p
                .ring_to_disk_seconds
                .map(|(p50, max)| vec![("{quantile=\"0.5\"}".to_string(), p50), ("{quantile=\"1\"}".to_string(), max)])
                .unwrap_or_default();
            v.push(("_sum".to_string(), p.ring_to_disk_total.0));
            v.push(("_count".to_string(), p.ring_to_disk_total.1 as f64));
            v
        },
    );
}

/// The machine (CPUs, memory cgroups, findings), the store, the daemon's own cost and the symbolizer's caches.
fn machine_store_and_caches(s: &Sampling, p: &Figures, u: &Upkeep, out: &mut String) {
    let (d, symbols) = (&p.detectors, &p.symbols);
    let mut family =
        |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| write_family(out, name, kind, help, values);
    family(
        "profiler_sampled_cpus",
        "gauge",
        "CPUs the sampler is attached to (CPU hotplug is followed).",
        vec![(String::new(), s.sampled_cpus as f64)],
    );
    family(
        "profiler_cpu_busy_ratio",
        "gauge",
        "Busy share of each CPU in the last complete second (busy ticks / ticks the frequency gives a CPU).",
        d.busy_share.iter().map(|(cpu, v)| (format!("{{cpu=\"{cpu}\"}}"), *v)).collect(),
    );
    family(
        "profiler_dying_memcgs",
        "gauge",
        "Dying (zombie) memory cgroups.",
        d.dying_memcgs.map(|d| vec![(String::new(), d as f64)]).unwrap_or_default(),
    );
    family(
        "profiler_open_findings",
        "gauge",
        "Findings currently open, by kind.",
        crate::detect::Kind::ALL
            .iter()
            .map(|k| (format!("{{kind=\"{}\"}}", k.name()), d.open_findings.get(k.name()).copied().unwrap_or(0) as f64))
            .collect(),
    );
    family(
        "profiler_finding",
        "gauge",
        &format!(
            "Open findings by kind, CPU (empty: not about one CPU), pod (namespace/name, empty: none) and severity: \
             1 per open finding. Past {MAX_FINDING_SERIES} label sets the rest are summed under pod=\"{OTHER_POD}\" \
             (one series per kind and severity)."
        ),
        finding_series(&d.finding_labels),
    );
    family(
        "profiler_store_bytes",
        "gauge",
        "Bytes of segment files in the store.",
        vec![(String::new(), u.store_bytes as f64)],
    );
    family(
        "profiler_store_span_seconds",
        "gauge",
        "Time span the store covers.",
        vec![(String::new(), u.store_span_seconds)],
    );
    family(
        "profiler_pending_samples",
        "gauge",
        "Samples held in memory, not yet written.",
        vec![(String::new(), p.pending_samples as f64)],
    );
    family(
        "profiler_process_cpu_seconds_total",
        "counter",
        "CPU time of the daemon.",
        vec![(String::new(), u.cpu_seconds)],
    );
    family(
        "profiler_process_resident_memory_bytes",
        "gauge",
        "Resident memory of the daemon.",
        vec![(String::new(), u.rss_bytes as f64)],
    );
    family(
        "profiler_ring_buffer_used_bytes",
        "gauge",
        "Most bytes waiting in the sample ring buffer during the last flush interval.",
        vec![(String::new(), s.ring_used_bytes as f64)],
    );
    family(
        "profiler_ring_buffer_size_bytes",
        "gauge",
        "Size of the sample ring buffer.",
        vec![(String::new(), s.ring_size_bytes as f64)],
    );
    family(
        "profiler_symbol_cache_entries",
        "gauge",
        "Entries in the symbolizer's caches, by kind.",
        vec![
            ("{kind=\"processes\"}".to_string(), symbols.processes as f64),
            ("{kind=\"modules\"}".to_string(), symbols.modules as f64),
            ("{kind=\"stacks\"}".to_string(), symbols.stacks as f64),
            ("{kind=\"names\"}".to_string(), symbols.names as f64),
        ],
    );
    family(
        "profiler_symbol_stack_cache_lookups_total",
        "counter",
        "Lookups of a sample's raw stack in the symbolizer's stack cache, by result: a hit costs a hash of the addresses, a miss names every frame.",
        vec![
            ("{result=\"hit\"}".to_string(), symbols.stack_hits as f64),
            ("{result=\"miss\"}".to_string(), symbols.stack_misses as f64),
        ],
    );
    family(
        "profiler_symbol_files_refused_total",
        "counter",
        "Mapped files the symbolizer refused to parse (over its size or symbol bounds, or too many open); their frames are named by module only.",
        vec![(String::new(), symbols.files_refused as f64)],
    );
    family(
        "profiler_symbol_processes_exited_total",
        "counter",
        "Processes the symbolizer forgot because the kernel said they ended (fork and exit tracepoints); a pid seen again is a new process.",
        vec![(String::new(), symbols.processes_exited as f64)],
    );
}

/// The OTLP shipper's figures, when it runs.
fn otlp(stats: Option<&crate::ship::SharedStats>, out: &mut String) {
    let mut family =
        |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| write_family(out, name, kind, help, values);
    if let Some(o) = stats {
        let o = &*o.lock().unwrap_or_else(|p| p.into_inner());
        let mut counter =
            |name: &str, help: &str, v: u64| family(name, "counter", help, vec![(String::new(), v as f64)]);
        counter("profiler_otlp_batches_total", "OTLP export requests the receiver accepted.", o.batches);
        counter("profiler_otlp_samples_total", "Samples in the OTLP requests the receiver accepted.", o.samples);
        counter(
            "profiler_otlp_cuda_samples_total",
            "Samples of CUDA profiles (launches, time blocked, bytes copied per second, thread and stack) the OTLP \
             receiver accepted.",
            o.cuda_samples,
        );
        counter("profiler_otlp_bytes_total", "Bytes of the OTLP requests the receiver accepted, as sent.", o.bytes);
        counter(
            "profiler_otlp_log_records_total",
            "Findings' openings and closings the OTLP receiver accepted as log records.",
            o.log_records,
        );
        counter(
            "profiler_otlp_retries_total",
            "OTLP export attempts that failed in a way worth another try (connection, timeout, 429, 502-504, \
             retryable gRPC codes).",
            o.retries,
        );
        family(
            "profiler_otlp_errors_total",
            "counter",
            "OTLP shipping failures by reason: rejected (a batch refused for good, skipped), partial (the receiver \
             dropped profiles of an accepted batch), store (the store could not be read or the cursor saved).",
            ["rejected", "partial", "store"]
                .iter()
                .map(|r| (format!("{{reason=\"{r}\"}}"), o.errors.get(r).copied().unwrap_or(0) as f64))
                .collect(),
        );
        family(
            "profiler_otlp_lag_seconds",
            "gauge",
            "Time between now and the end of what the OTLP receiver has taken (an interval and a few seconds when \
             all is well).",
            vec![(String::new(), o.lag_seconds)],
        );
    }
}

/// Label sets of `profiler_finding` at most (a node with a hundred throttled pods must not
/// grow the series without bound).
pub const MAX_FINDING_SERIES: usize = 100;
/// Where findings past [`MAX_FINDING_SERIES`] are counted.
pub const OTHER_POD: &str = "_other";

/// `profiler_finding`'s samples: open findings counted by their labels, bounded.
fn finding_series(labels: &[crate::detect::Labels]) -> Vec<(String, f64)> {
    let mut counts: BTreeMap<(&str, String, String, &str), u64> = BTreeMap::new();
    // The most severe first keep their own series when the bound is reached.
    let mut sorted: Vec<&crate::detect::Labels> = labels.iter().collect();
    sorted.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.cmp(b)));
    for l in sorted {
        let cpu = l.cpu.map_or(String::new(), |c| c.to_string());
        let mut key = (l.kind.name(), cpu, l.pod.clone().unwrap_or_default(), l.severity.name());
        if !counts.contains_key(&key) && counts.len() >= MAX_FINDING_SERIES - 1 {
            (key.1, key.2) = (String::new(), OTHER_POD.to_string());
        }
        *counts.entry(key).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((kind, cpu, pod, severity), n)| {
            let labels =
                format!("{{kind=\"{kind}\",cpu=\"{cpu}\",pod=\"{}\",severity=\"{severity}\"}}", escape_label(&pod));
            (labels, n as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests;
