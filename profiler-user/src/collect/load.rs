//! Starting the collector, in the order the kernel needs: the capabilities and kernel features
//! checked, the tracepoints' field offsets read (tracefs) and set as the programs' globals, the
//! object loaded, the sampler attached to every online CPU, then the tracepoints, each group
//! optional: without them the profiler still profiles, and the log says what is missing.

use std::collections::BTreeMap;

use aya::{
    Ebpf, EbpfLoader, VerifierLogLevel,
    maps::{Array, PerCpuArray, RingBuf},
    programs::{PerfEvent, TracePoint, perf_event::PerfEventLinkId},
    util::online_cpus,
};
use profiler_common::MAXIMA_EPOCH;

use super::{
    CgroupFields, CollectConfig, CollectError, Collector, PROGRAM, Rings, attach_cpu, caps, features, lifecycle,
    reclaim, runq, start, tracefs, unwind_maps,
};

impl Collector {
    pub fn start(config: &CollectConfig) -> Result<Self, CollectError> {
        check_capabilities()?;
        let ring_bytes = config.ring_bytes.max(4096).next_power_of_two();
        probe_kernel()?;
        let offsets = Offsets::read();
        let mut ebpf = load(config, ring_bytes, &offsets)?;
        // The maps, the stack walkers (about a second of the verifier's time here, 16 s on 6.1
        // in qemu), then the sampler; the CUDA probes when a GPU or a driver calls for them
        // (`cuda_load`). The walkers come before the sampler, not after: loaded after, they
        // held the pipeline back, and the processes that ended meanwhile (a short job) were
        // symbolized once their maps were gone.
        let unwind = take_unwind(&mut ebpf, config.unwind_rows);
        if unwind.is_some() {
            load_walkers(&mut ebpf);
        }
        let links = attach_sampler(&mut ebpf, config.frequency_hz)?;
        let sampling = start::Moment::now();
        start::record(|f| f.sampling = Some(sampling));
        tracing::info!(
            after_ms = (sampling.seconds * 1e3).round(),
            cpu_ms = (sampling.cpu_seconds * 1e3).round(),
            "sampler attached: samples are taken from now on"
        );
        let tracepoints = Tracepoints::attach(&mut ebpf);
        tracepoints.log();
        let netrx = match tracepoints.netrx {
            Ok(_) => ebpf.take_map("NETRX").and_then(|m| PerCpuArray::try_from(m).ok()),
            Err(_) => None,
        };
        let runq = match tracepoints.runq {
            Ok(_) => ebpf.take_map("RUNQ").and_then(|m| PerCpuArray::try_from(m).ok()).map(runq::RunQueue),
            Err(_) => None,
        };
        let reclaim = tracepoints
            .reclaim
            .contains(&true)
            .then(|| ebpf.take_map("RECLAIM").and_then(|m| PerCpuArray::try_from(m).ok()).map(reclaim::Reclaim))
            .flatten();
        let events = match tracepoints.cgroup.map(drop).or(tracepoints.exec).or(tracepoints.lifecycle) {
            Ok(()) => match ebpf.take_map("EVENTS").map(RingBuf::try_from) {
                Some(Ok(ring)) => Some(ring),
                _ => None,
            },
            Err(_) => None,
        };
        let ring = ebpf.take_map("SAMPLES").ok_or(CollectError::Missing("map SAMPLES"))?;
        let ring = RingBuf::try_from(ring).map_err(|e| CollectError::Map("SAMPLES", e))?;
        let counters = ebpf.take_map("COUNTERS").ok_or(CollectError::Missing("map COUNTERS"))?;
        let counters = PerCpuArray::try_from(counters).map_err(|e| CollectError::Map("COUNTERS", e))?;
        let epoch_map = ebpf.take_map(MAXIMA_EPOCH).ok_or(CollectError::Missing("map MAXIMA_EPOCH"))?;
        let epoch_map = Array::try_from(epoch_map).map_err(|e| CollectError::Map("MAXIMA_EPOCH", e))?;
        Ok(Self {
            ebpf,
            rings: Some(Rings { samples: ring, events }),
            unwind,
            cuda: None,
            cuda_refused: None,
            offcpu: None,
            counters,
            netrx,
            runq,
            reclaim,
            epoch_map,
            epoch: 0,
            cgroup_fields: offsets.cgroup,
            process_fields: offsets.process,
            ring_bytes: u64::from(ring_bytes),
            frequency_hz: config.frequency_hz,
            links,
            boosted: BTreeMap::new(),
        })
    }
}

/// Refuses to start without a capability the daemon needs; warns of those it can do without.
fn check_capabilities() -> Result<(), CollectError> {
    let Some(eff) = caps::effective() else { return Ok(()) };
    for cap in caps::missing(eff) {
        if cap.required {
            return Err(CollectError::Capability(cap.name, cap.needed_for));
        }
        tracing::warn!(
            capability = cap.name,
            needed_for = cap.needed_for,
            "capability missing: some frames will show as [unknown]"
        );
    }
    Ok(())
}

/// Mounts tracefs, then refuses a kernel without what the daemon cannot run without and warns
/// of each feature missing.
fn probe_kernel() -> Result<(), CollectError> {
    if let Err(e) = tracefs::ensure_mounted() {
        tracing::warn!(error = %e, "cannot mount tracefs: NET_RX and cgroup tracepoints will be missing");
    }
    // After tracefs is mounted: the tracepoints are among the features probed.
    let kernel = features::probe();
    if let Some(sentence) = kernel.refusal() {
        return Err(CollectError::Kernel(sentence));
    }
    for (feature, lost) in kernel.degraded() {
        tracing::warn!(
            kernel = %kernel.release,
            since = %format!("{}.{}", feature.since.0, feature.since.1),
            "this kernel lacks {}: {lost}",
            feature.name
        );
    }
    tracing::info!(kernel = %kernel.release, missing = kernel.missing.len(), "kernel features probed");
    Ok(())
}

/// The tracepoints' field offsets as this kernel lays them out (tracefs; the usual layout where
/// unreadable), set as globals of the programs that read those fields.
struct Offsets {
    softirq_vec: u64,
    napi_work: u64,
    napi_budget: u64,
    cgroup: CgroupFields,
    process: lifecycle::ProcessFields,
}

impl Offsets {
    fn read() -> Self {
        let off = |cat: &str, ev: &str, field: &str, default: usize| {
            tracefs::field(cat, ev, field).map_or(default as u64, |(o, _)| o as u64)
        };
        Self {
            softirq_vec: off("irq", "softirq_raise", "vec", 8),
            napi_work: off("napi", "napi_poll", "work", 20),
            napi_budget: off("napi", "napi_poll", "budget", 24),
            cgroup: CgroupFields {
                root: off("cgroup", "cgroup_mkdir", "root", 8) as usize,
                id: off("cgroup", "cgroup_mkdir", "id", 16) as usize,
                path: off("cgroup", "cgroup_mkdir", "path", 24) as usize,
            },
            process: lifecycle::ProcessFields::read(),
        }
    }
}

/// Loads the object with its maps sized and its globals set.
fn load(config: &CollectConfig, ring_bytes: u32, offsets: &Offsets) -> Result<Ebpf, CollectError> {
    // Wake the reader when a quarter of the ring is used; the daemon's tick drains the rest.
    let wakeup = u64::from(ring_bytes / 4);
    let flags_off = offsets.process.clone_flags as u64;
    let group_dead_off = offsets.process.group_dead.map_or(u64::MAX, |o| o as u64);
    let runq_offsets = runq::offsets();
    let mut loader = EbpfLoader::new();
    let memcg_offsets = reclaim::memcg_offsets();
    for (global, offset) in runq_offsets.iter().chain(&memcg_offsets) {
        loader.override_global(global, offset, true);
    }
    loader
        // A refused program is retried with the verifier's log: its statistics (the verdict),
        // not a line per instruction, which made one refusal cost 35-50 s of CPU at start.
        .verifier_log_level(VerifierLogLevel::STATS)
        .map_max_entries("SAMPLES", ring_bytes)
        // Two words an element (`profiler_common::unwind::packed`).
        .map_max_entries("UNWIND_ROWS", config.unwind_rows.div_ceil(2).max(1))
        .override_global("WAKEUP_BYTES", &wakeup, true)
        .override_global("SOFTIRQ_VEC_OFFSET", &offsets.softirq_vec, true)
        .override_global("NAPI_WORK_OFFSET", &offsets.napi_work, true)
        .override_global("NAPI_BUDGET_OFFSET", &offsets.napi_budget, true)
        .override_global("NEWTASK_FLAGS_OFFSET", &flags_off, true)
        .override_global("EXIT_GROUP_DEAD_OFFSET", &group_dead_off, true)
        .load(PROGRAM)
        .map_err(CollectError::Load)
}

/// Whether the unwind tables are wanted and this machine can use them (x86_64's rules).
fn unwind_rows_wanted(unwind_rows: u32) -> bool {
    unwind_rows > 0 && cfg!(target_arch = "x86_64")
}

/// The unwind tables' maps, when asked for (`unwind_rows` > 0) and this machine can use them;
/// their programs come after the sampler.
fn take_unwind(ebpf: &mut Ebpf, unwind_rows: u32) -> Option<unwind_maps::Maps> {
    if unwind_rows == 0 {
        return None;
    }
    if !unwind_rows_wanted(unwind_rows) {
        // The tables encode x86_64's rules (DWARF registers 6/7/16, the return address below
        // the CFA); arm64 keeps it in x30 and numbers registers otherwise (docs/arm64.md).
        tracing::warn!("unwind tables are built for x86_64 only: user stacks follow frame pointers here");
        return None;
    }
    match unwind_maps::Maps::take(ebpf) {
        Ok(maps) => Some(maps),
        Err(e) => {
            tracing::warn!(error = %e, "user stacks without frame pointers will be cut short: unwind tables unavailable");
            None
        }
    }
}

/// Loads the stack walkers into the sampler's slots (tables, scan, Python frames), and says
/// when, with the CPU spent by then and each program's cost.
fn load_walkers(ebpf: &mut Ebpf) {
    let loaded = unwind_maps::load_walkers(ebpf);
    let done = start::Moment::now();
    start::record(|f| f.walkers = Some(done));
    let programs: Vec<String> = loaded
        .iter()
        .map(|l| match l.verified_insns {
            Some(i) => format!("{} {} ms ({i} instructions verified)", l.name, l.took.as_millis()),
            None => format!("{} {} ms", l.name, l.took.as_millis()),
        })
        .collect();
    tracing::info!(
        after_ms = (done.seconds * 1e3).round(),
        cpu_ms = (done.cpu_seconds * 1e3).round(),
        programs = %programs.join(", "),
        "stack walkers loaded"
    );
}

/// Loads the sampler and attaches it to every online CPU.
fn attach_sampler(ebpf: &mut Ebpf, frequency_hz: u64) -> Result<BTreeMap<u32, PerfEventLinkId>, CollectError> {
    let program: &mut PerfEvent =
        ebpf.program_mut("sample").ok_or(CollectError::Missing("program `sample`"))?.try_into()?;
    program.load()?;
    let cpus = online_cpus().map_err(|(what, e)| CollectError::Cpus(what, e))?;
    let mut links = BTreeMap::new();
    for &cpu in &cpus {
        links.insert(cpu, attach_cpu(program, cpu, frequency_hz)?);
    }
    Ok(links)
}

/// Which groups of tracepoints are attached (`Err`: why not). They feed detectors; without
/// them the profiler still profiles.
struct Tracepoints {
    netrx: Result<Vec<()>, String>,
    cgroup: Result<Vec<()>, String>,
    runq: Result<Vec<()>, String>,
    /// Per reclaim or compaction kind: attached or not.
    reclaim: Vec<bool>,
    exec: Result<(), String>,
    lifecycle: Result<(), String>,
}

impl Tracepoints {
    /// Attaches each group, warning of each that could not be.
    fn attach(ebpf: &mut Ebpf) -> Self {
        let mut attached = |name: &str, category: &str| -> Result<(), String> {
            let prog: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| format!("program {name} missing"))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| e.to_string())?;
            prog.load().map_err(|e| e.to_string())?;
            prog.attach(category, name).map(drop).map_err(|e| e.to_string())
        };
        // `softirq_exit` before `softirq_entry`: entry marks the softirq running for the sampler
        // (interrupt work on the idle task is busy) and only exit clears it, so entry must never
        // be attached without exit (the list stops at the first failure).
        let netrx =
            [("softirq_exit", "irq"), ("softirq_raise", "irq"), ("softirq_entry", "irq"), ("napi_poll", "napi")]
                .iter()
                .map(|(n, c)| attached(n, c))
                .collect::<Result<Vec<_>, _>>();
        if let Err(e) = &netrx {
            tracing::warn!(error = %e, "NET_RX tracepoints not attached: no softirq starvation detection, and softirq work on idle CPUs counts as idle");
        }
        let cgroup = ["cgroup_mkdir", "cgroup_rmdir", "cgroup_release"]
            .iter()
            .map(|n| attached(n, "cgroup"))
            .collect::<Result<Vec<_>, _>>();
        if let Err(e) = &cgroup {
            tracing::warn!(error = %e, "cgroup tracepoints not attached: zombie cgroups will not be attributed");
        }
        let runq = runq::TRACEPOINTS.iter().map(|(n, c)| attached(n, c)).collect::<Result<Vec<_>, _>>();
        if let Err(e) = &runq {
            tracing::warn!(error = %e, "scheduler tracepoints not attached: no run-queue starvation detection");
        }
        // Each kind on its own: a kernel without compaction tracepoints still has reclaim's.
        let reclaim: Vec<bool> = reclaim::TRACEPOINTS
            .iter()
            .map(|pair| match pair.iter().map(|(n, c)| attached(n, c)).collect::<Result<Vec<_>, _>>() {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(tracepoint = pair[1].0, error = %e, "reclaim or compaction stalls of this kind will not be seen");
                    false
                }
            })
            .collect();
        let exec = attached("sched_process_exec", "sched");
        if let Err(e) = &exec {
            tracing::warn!(error = %e, "exec tracepoint not attached: processes that live only milliseconds may show unnamed frames");
        }
        let lifecycle = attached("task_newtask", "task").and_then(|()| attached("sched_process_exit", "sched"));
        if let Err(e) = &lifecycle {
            tracing::warn!(error = %e, "fork and exit tracepoints not attached: a reused pid is told from its old process only by its program");
        }
        Self { netrx, cgroup, runq, reclaim, exec, lifecycle }
    }

    /// One line naming the detectors' tracepoint groups that are attached.
    fn log(&self) {
        let attached: Vec<&str> = [
            ("NET_RX/NAPI", self.netrx.is_ok()),
            ("runq", self.runq.is_ok()),
            ("reclaim", self.reclaim.contains(&true)),
            ("cgroup", self.cgroup.is_ok()),
            ("exec", self.exec.is_ok()),
        ]
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(name, _)| *name)
        .collect();
        tracing::info!(attached = %attached.join(","), "tracepoint detectors");
    }
}
