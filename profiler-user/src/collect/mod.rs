//! Loads the kernel programs: the sampler, attached to every online CPU, and the tracepoint
//! programs (NET_RX softirq and NAPI timing, cgroup life cycle, process exec, fork and exit);
//! reads their ring buffers and maps.

pub mod btf;
pub mod caps;
pub mod counters;
pub mod cpus;
pub mod cuda;
pub mod features;
pub mod irqs;
pub mod kmsg;
pub mod latency;
pub mod lifecycle;
mod load;
pub mod memcg;
pub mod offcpu;
pub mod prog_info;
pub mod reclaim;
pub mod runq;
pub mod start;
pub mod tracefs;
pub mod unwind_maps;

use std::collections::BTreeMap;

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
    util::online_cpus,
};
use profiler_common::{
    COMM_LEN, EVENT_DATA_LEN, EVENT_HEADER_LEN, EventHeader, HEADER_LEN, SampleHeader, counter, netrx,
};

/// The sampler, built by build.rs from profiler-ebpf.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error(
        "loading the BPF program failed: {0}. The daemon needs root (or CAP_BPF and CAP_PERFMON) and a kernel with BPF ring buffers (5.8+)"
    )]
    Load(#[source] aya::EbpfError),
    #[error(
        "the daemon lacks {0}, which it needs for {1}: run it as root, or grant it (AmbientCapabilities= in its systemd unit)"
    )]
    Capability(&'static str, &'static str),
    /// A kernel feature the daemon cannot run without is missing (one sentence naming it).
    #[error("{0}")]
    Kernel(String),
    #[error("the BPF program has no {0}: the embedded object does not match this build")]
    Missing(&'static str),
    #[error("the BPF program was rejected by the kernel: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("opening the {0} map failed: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("cannot list online CPUs ({0}): {1}")]
    Cpus(&'static str, #[source] std::io::Error),
    #[error(
        "attaching to the cpu-clock event of CPU {cpu} failed: {source}. Is perf_event_paranoid too strict, or the process missing CAP_PERFMON?"
    )]
    Attach { cpu: u32, source: aya::programs::ProgramError },
    #[error("watching the ring buffer failed: {0}")]
    Poll(#[source] std::io::Error),
}

/// The two ring buffers, handed to the reader thread (they live apart from the rest of the
/// collector, so that draining them never waits on anything else).
pub struct Rings {
    pub samples: RingBuf<MapData>,
    /// cgroup and process (exec, fork, exit) events, when those tracepoints could be attached.
    pub events: Option<RingBuf<MapData>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("ring-buffer record of {0} bytes is shorter than a sample header")]
    Short(usize),
    #[error("ring-buffer record of {len} bytes cannot hold {frames} frames")]
    Frames { len: usize, frames: usize },
}

/// Decodes one ring-buffer record into its header and stacks (leaf first).
pub fn parse_record(bytes: &[u8], kernel: &mut Vec<u64>, user: &mut Vec<u64>) -> Result<SampleHeader, RecordError> {
    let mut python = Vec::new();
    parse_record_python(bytes, kernel, user, &mut python)
}

/// [`parse_record`], with the Python frame words (two per frame, leaf first).
pub fn parse_record_python(
    bytes: &[u8],
    kernel: &mut Vec<u64>,
    user: &mut Vec<u64>,
    python: &mut Vec<u64>,
) -> Result<SampleHeader, RecordError> {
    if bytes.len() < HEADER_LEN {
        return Err(RecordError::Short(bytes.len()));
    }
    // SAFETY: SampleHeader is plain old data and the length was checked.
    let header: SampleHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let (nk, nu, np) = (header.kernel_frames as usize, header.user_frames as usize, 2 * header.python_frames as usize);
    if bytes.len() < HEADER_LEN + (nk + nu + np) * 8 {
        return Err(RecordError::Frames { len: bytes.len(), frames: nk + nu + np });
    }
    let mut frames = bytes[HEADER_LEN..].chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap()));
    kernel.clear();
    kernel.extend(frames.by_ref().take(nk));
    user.clear();
    user.extend(frames.by_ref().take(nu));
    python.clear();
    python.extend(frames.take(np));
    Ok(header)
}

/// The comm bytes up to the first NUL, lossily as UTF-8.
pub fn comm_str(comm: &[u8; COMM_LEN]) -> std::borrow::Cow<'_, str> {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end])
}

pub struct CollectConfig {
    pub frequency_hz: u64,
    /// Ring buffer size; rounded up to a power of two of at least one page.
    pub ring_bytes: u32,
    /// Words of unwind tables the kernel holds (packed rows and page indexes, 4 bytes each); 0:
    /// frame pointers only.
    pub unwind_rows: u32,
}

/// Kernel-side counters summed over a CPU.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CpuCounters {
    pub seen: u64,
    pub ringbuf_full: u64,
    pub stacks: StackCounts,
    /// Event records the kernel dropped: the `EVENTS` ring was full.
    pub events_lost: u64,
    /// Most bytes waiting in the ring in the current maxima epoch ([`Collector::next_epoch`]).
    pub ring_used_max: u64,
}

/// How a CPU's stacks were captured: the kernel's cumulative counts, and the daemon's totals
/// since its start (`serve::metrics::CpuTotals`), which add up their growth.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StackCounts {
    /// Samples delivered whose kernel or user stack could not be captured.
    pub kernel_stack_errors: u64,
    pub user_stack_errors: u64,
    /// User stacks walked with unwind tables, and of those the walks that stopped early.
    pub unwind_walks: u64,
    pub unwind_stopped: u64,
    /// How those walks ended, by `unwind::end` reason, and the frames the stack scan found.
    pub unwind_ends: [u64; profiler_common::unwind::end::COUNT],
    pub unwind_scanned: u64,
}

impl StackCounts {
    /// Adds what the cumulative counts grew by from `before` to `now`.
    pub fn add_growth(&mut self, now: &Self, before: &Self) {
        let grew = |n: u64, b: u64| n.saturating_sub(b);
        self.kernel_stack_errors += grew(now.kernel_stack_errors, before.kernel_stack_errors);
        self.user_stack_errors += grew(now.user_stack_errors, before.user_stack_errors);
        self.unwind_walks += grew(now.unwind_walks, before.unwind_walks);
        self.unwind_stopped += grew(now.unwind_stopped, before.unwind_stopped);
        for (i, n) in now.unwind_ends.iter().enumerate() {
            self.unwind_ends[i] += grew(*n, before.unwind_ends[i]);
        }
        self.unwind_scanned += grew(now.unwind_scanned, before.unwind_scanned);
    }
}

/// NET_RX figures of one CPU: cumulative counters, and maxima since the previous read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetRxCpu {
    pub raises: u64,
    pub entries: u64,
    pub latency_max_ns: u64,
    pub polls: u64,
    pub poll_gap_max_ns: u64,
    /// Cumulative raise→entry waits per log2-ns bucket.
    pub histogram: Vec<u64>,
}

/// A cgroup event as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEvent {
    pub kind: u32,
    pub pid: u32,
    pub ts_ns: u64,
    pub comm: String,
    /// Hierarchy id (as in /proc/cgroups).
    pub root: i32,
    pub id: u64,
    pub path: String,
}

/// Field offsets of the cgroup tracepoints (identical for mkdir, rmdir and release).
#[derive(Debug, Clone, Copy)]
pub struct CgroupFields {
    root: usize,
    id: usize,
    path: usize,
}

pub struct Collector {
    // Dropping the Ebpf object detaches the perf events: keep it for the collector's life.
    ebpf: Ebpf,
    rings: Option<Rings>,
    unwind: Option<unwind_maps::Maps>,
    /// The CUDA probes' maps, once their programs loaded (`cuda`, when first needed).
    cuda: Option<cuda::Maps>,
    /// Why the kernel refused them (they are not asked again).
    cuda_refused: Option<String>,
    /// The off-CPU program's maps, once started (`offcpu`).
    offcpu: Option<offcpu::Maps>,
    counters: PerCpuArray<MapData, [u64; counter::COUNT]>,
    netrx: Option<PerCpuArray<MapData, [u64; netrx::LEN]>>,
    runq: Option<runq::RunQueue>,
    reclaim: Option<reclaim::Reclaim>,
    /// The maxima epoch the kernel stamps on maxima (see `profiler_common::MAXIMA_EPOCH`).
    epoch_map: Array<MapData, u64>,
    epoch: u64,
    cgroup_fields: CgroupFields,
    process_fields: lifecycle::ProcessFields,
    ring_bytes: u64,
    frequency_hz: u64,
    /// The perf event attached on each CPU sampled now.
    links: BTreeMap<u32, PerfEventLinkId>,
    /// CPUs sampled at another frequency than `frequency_hz` for now (the flight recorder).
    boosted: BTreeMap<u32, u64>,
}

impl Collector {
    /// The ring buffers, once: the reader thread owns them from then on.
    pub fn take_rings(&mut self) -> Option<Rings> {
        self.rings.take()
    }

    /// The unwind-table maps, once: the unwind stage owns them from then on.
    pub fn take_unwind(&mut self) -> Option<unwind_maps::Maps> {
        self.unwind.take()
    }

    /// CPUs sampled now.
    pub fn cpus(&self) -> Vec<u32> {
        self.links.keys().copied().collect()
    }

    /// Follows CPU hotplug: attaches the sampler to CPUs that came online since the last call
    /// and lets go of those that went offline (the kernel already stopped their events; the
    /// links are dropped so that a CPU coming back gets a fresh one).
    pub fn sync_cpus(&mut self) -> Result<cpus::Change, CollectError> {
        let online = online_cpus().map_err(|(what, e)| CollectError::Cpus(what, e))?;
        let change = cpus::diff(self.links.keys().copied(), &online);
        if change.is_empty() {
            return Ok(change);
        }
        let program: &mut PerfEvent =
            self.ebpf.program_mut("sample").ok_or(CollectError::Missing("program `sample`"))?.try_into()?;
        for cpu in &change.removed {
            if let Some(link) = self.links.remove(cpu) {
                // The event of an offline CPU may already be gone: nothing to undo then.
                let _ = program.detach(link);
            }
        }
        let mut attached = cpus::Change { removed: change.removed, added: Vec::new() };
        for &cpu in &change.added {
            match attach_cpu(program, cpu, self.frequency_hz) {
                Ok(link) => {
                    self.links.insert(cpu, link);
                    attached.added.push(cpu);
                }
                // Tried again at the next call (a CPU can be listed online before it can take events).
                Err(e) => tracing::warn!(cpu, error = %e, "cannot sample a CPU that came online; retrying later"),
            }
        }
        Ok(attached)
    }

    /// Replaces a CPU's perf event with a new one (its old one stopped: see the daemon's stall
    /// check).
    pub fn reattach(&mut self, cpu: u32) -> Result<(), CollectError> {
        let program: &mut PerfEvent =
            self.ebpf.program_mut("sample").ok_or(CollectError::Missing("program `sample`"))?.try_into()?;
        if let Some(link) = self.links.remove(&cpu) {
            let _ = program.detach(link);
        }
        let hz = self.boosted.get(&cpu).copied().unwrap_or(self.frequency_hz);
        self.links.insert(cpu, attach_cpu(program, cpu, hz)?);
        Ok(())
    }

    /// Samples `cpu` at `hz` from now on (the base frequency: `None`). A CPU not sampled now
    /// (offline) gets it when it comes back... at the base frequency: a boost is short.
    pub fn set_frequency(&mut self, cpu: u32, hz: Option<u64>) -> Result<(), CollectError> {
        match hz.filter(|&hz| hz != self.frequency_hz) {
            Some(hz) => self.boosted.insert(cpu, hz),
            None => self.boosted.remove(&cpu),
        };
        if !self.links.contains_key(&cpu) {
            return Ok(());
        }
        self.reattach(cpu)
    }

    /// Samples the kernel did not run the sampler for because another BPF program was running
    /// on that CPU (the program's `recursion_misses`, kernel 5.12+). `None` when unreadable.
    pub fn recursion_misses(&self) -> Option<u64> {
        use std::os::fd::AsFd;
        let program: &PerfEvent = self.ebpf.program("sample")?.try_into().ok()?;
        prog_info::recursion_misses(program.fd().ok()?.as_fd()).ok()
    }

    /// Every loaded program's statistics, by program name (run time and count are zero unless
    /// `kernel.bpf_stats_enabled` is 1).
    pub fn program_stats(&self) -> Vec<(String, prog_info::Stats)> {
        use std::os::fd::AsFd;
        self.ebpf
            .programs()
            .filter_map(|(name, p)| Some((name.to_string(), prog_info::stats(p.fd().ok()?.as_fd()).ok()?)))
            .collect()
    }

    /// NET_RX figures per CPU (index = CPU id), with the maxima of the current epoch. `None`
    /// without the tracepoints.
    pub fn netrx(&self) -> Option<Vec<NetRxCpu>> {
        let values = self.netrx.as_ref()?.get(&0, 0).ok()?;
        Some(
            values
                .iter()
                .map(|v| NetRxCpu {
                    raises: v[netrx::RAISES],
                    entries: v[netrx::ENTRIES],
                    latency_max_ns: epoch_max(v, netrx::EPOCH, self.epoch, netrx::LATENCY_MAX),
                    polls: v[netrx::POLLS],
                    poll_gap_max_ns: epoch_max(v, netrx::EPOCH, self.epoch, netrx::POLL_GAP_MAX),
                    histogram: v[netrx::HISTOGRAM..].to_vec(),
                })
                .collect(),
        )
    }

    /// Run-queue waits per CPU (index = CPU id), with the longest wait of the current epoch.
    /// `None` without the scheduler tracepoints.
    pub fn runq(&self) -> Option<Vec<runq::RunqCpu>> {
        self.runq.as_ref()?.read(self.epoch)
    }

    /// Reclaim and compaction stalls per CPU (index = CPU id), with the longest of the current
    /// epoch. `None` without the tracepoints.
    pub fn reclaim(&self) -> Option<Vec<reclaim::ReclaimCpu>> {
        self.reclaim.as_ref()?.read(self.epoch)
    }

    /// Starts a new maxima epoch: what [`Self::counters`] and [`Self::netrx`] report as maxima
    /// from now on is what happens after this call. (A maximum the kernel raises between the
    /// reads and this call is lost; it is one of many in a second of traffic.)
    pub fn next_epoch(&mut self) {
        let next = self.epoch.wrapping_add(1);
        if self.epoch_map.set(0, next, 0).is_ok() {
            self.epoch = next;
        }
    }

    /// Where this kernel puts the cgroup tracepoints' fields.
    pub fn cgroup_fields(&self) -> CgroupFields {
        self.cgroup_fields
    }

    /// Where this kernel puts the fork and exit tracepoints' fields.
    pub fn process_fields(&self) -> lifecycle::ProcessFields {
        self.process_fields
    }
}

fn attach_cpu(program: &mut PerfEvent, cpu: u32, frequency_hz: u64) -> Result<PerfEventLinkId, CollectError> {
    program
        .attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(frequency_hz),
            true,
        )
        .map_err(|source| CollectError::Attach { cpu, source })
}

impl Collector {
    /// Cumulative kernel-side counters per CPU (index = CPU id), with the ring's high-water
    /// mark of the current epoch.
    pub fn counters(&self) -> Result<Vec<CpuCounters>, CollectError> {
        let values = self.counters.get(&0, 0).map_err(|e| CollectError::Map("COUNTERS", e))?;
        Ok(values
            .iter()
            .map(|v| CpuCounters {
                seen: v[counter::SEEN],
                ringbuf_full: v[counter::RINGBUF_FULL],
                stacks: StackCounts {
                    kernel_stack_errors: v[counter::KERNEL_STACK_ERROR],
                    user_stack_errors: v[counter::USER_STACK_ERROR],
                    unwind_walks: v[counter::UNWIND_TABLES],
                    // Every end but the outermost frame and a zero frame pointer (`unwind::end`).
                    unwind_stopped: (profiler_common::unwind::end::NO_ROW as usize
                        ..profiler_common::unwind::end::COUNT)
                        .map(|e| v[counter::UNWIND_ENDS + e])
                        .sum(),
                    unwind_ends: std::array::from_fn(|i| v[counter::UNWIND_ENDS + i]),
                    unwind_scanned: v[counter::UNWIND_SCANNED],
                },
                events_lost: v[counter::EVENTS_LOST],
                ring_used_max: epoch_max(v, counter::EPOCH, self.epoch, counter::RING_USED_MAX),
            })
            .collect())
    }

    /// Size of the sample ring buffer in bytes.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }
}

/// A maximum from a per-CPU value: zero when the value's stamp is not `epoch`, because then the
/// kernel raised no maximum in this epoch (the number there is an older epoch's).
fn epoch_max(value: &[u64], epoch_slot: usize, epoch: u64, slot: usize) -> u64 {
    if value[epoch_slot] == epoch { value[slot] } else { 0 }
}

/// Decodes one `EVENTS` record.
pub fn parse_event(f: CgroupFields, bytes: &[u8]) -> Option<CgroupEvent> {
    if bytes.len() < EVENT_HEADER_LEN + EVENT_DATA_LEN {
        return None;
    }
    // SAFETY: EventHeader is plain old data and the length was checked.
    let h: EventHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let data = &bytes[EVENT_HEADER_LEN..EVENT_HEADER_LEN + EVENT_DATA_LEN];
    let root = i32::from_ne_bytes(data.get(f.root..f.root + 4)?.try_into().ok()?);
    let id = u64::from_ne_bytes(data.get(f.id..f.id + 8)?.try_into().ok()?);
    // __data_loc: low 16 bits offset into the record, high 16 bits length.
    let loc = u32::from_ne_bytes(data.get(f.path..f.path + 4)?.try_into().ok()?);
    let (off, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
    let raw = data.get(off..(off + len).min(EVENT_DATA_LEN)).unwrap_or_default();
    let path = String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
    Some(CgroupEvent { kind: h.kind, pid: h.pid, ts_ns: h.ts_ns, comm: comm_str(&h.comm).into_owned(), root, id, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxima_of_an_older_epoch_read_as_zero() {
        let mut v = [0u64; counter::COUNT];
        v[counter::RING_USED_MAX] = 4096;
        v[counter::EPOCH] = 7;
        assert_eq!(epoch_max(&v, counter::EPOCH, 7, counter::RING_USED_MAX), 4096);
        // Userspace moved on to epoch 8 and the kernel raised nothing since: no maximum.
        assert_eq!(epoch_max(&v, counter::EPOCH, 8, counter::RING_USED_MAX), 0);
    }

    fn record(h: SampleHeader, frames: &[u64]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        unsafe { std::ptr::write_unaligned(b.as_mut_ptr().cast(), h) };
        for f in frames {
            b.extend_from_slice(&f.to_ne_bytes());
        }
        b
    }

    #[test]
    fn splits_kernel_and_user_frames() {
        let h = SampleHeader { pid: 7, kernel_frames: 2, user_frames: 1, ..Default::default() };
        let (mut k, mut u) = (Vec::new(), Vec::new());
        let got = parse_record(&record(h, &[1, 2, 3]), &mut k, &mut u).unwrap();
        assert_eq!(got, h);
        assert_eq!((k, u), (vec![1, 2], vec![3]));
    }

    #[test]
    fn rejects_truncated_records() {
        let (mut k, mut u) = (Vec::new(), Vec::new());
        assert_eq!(parse_record(&[0; 8], &mut k, &mut u), Err(RecordError::Short(8)));
        let h = SampleHeader { kernel_frames: 3, ..Default::default() };
        assert!(matches!(parse_record(&record(h, &[1]), &mut k, &mut u), Err(RecordError::Frames { .. })));
    }

    #[test]
    fn comm_stops_at_nul() {
        let mut c = [0u8; COMM_LEN];
        c[..4].copy_from_slice(b"spin");
        assert_eq!(comm_str(&c), "spin");
        assert_eq!(comm_str(&[b'a'; COMM_LEN]), "a".repeat(COMM_LEN));
    }
}
