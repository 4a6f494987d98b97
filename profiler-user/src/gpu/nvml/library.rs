//! NVML through `nvml-wrapper`, which opens the library by path at run time (libloading) and
//! turns a missing symbol into an error rather than a crash: the daemon builds and runs on
//! nodes without NVIDIA's driver, and tests load a stand-in library by the same path.
//!
//! Any call may be missing (an older driver), unsupported (a GPU, a MIG slice) or refused: such
//! a call is noted once per GPU and not made again (its track is absent); a transient failure
//! (a GPU fallen off the bus) skips only that poll's value.

use std::{collections::BTreeSet, ffi::OsStr};

use nvml_wrapper::{
    Device, Nvml,
    enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
};

use super::{
    GpuError,
    samples::{Kind, Sampled, Sampler},
};
use crate::gpu_readings::{
    GpuInfo, Holder, Inventory, Reading, RowRemap,
    inventory::{local_cpus, short_bus_id},
};

/// Processes listed per GPU at most (a read allocates for each; the rest are not named).
pub const MAX_HOLDERS: usize = 64;

pub struct Source {
    /// Leaked on purpose: NVML's event set (`events`) borrows it, and both live as long as the
    /// daemon (one `Source` per run).
    nvml: &'static Nvml,
    /// NVML's Xid events, where the library offers them.
    pub events: Option<super::events::XidEvents>,
    count: u32,
    /// (GPU index, call) pairs that failed for good: not called again.
    dead: BTreeSet<(u32, &'static str)>,
    /// Per GPU: the newest per-process sample's time (NVML returns those after it).
    last_process_ts: Vec<u64>,
    /// Per GPU: what the last slow read found (processes, ECC counts), repeated in the polls
    /// between, so that their tracks do not flicker.
    slow: Vec<Slow>,
    gpm: super::gpm::Sampler,
    /// Per GPU: its handle, looked up once (`None` until a look-up succeeds). NVML's look-up
    /// is a call like any other: one a GPU a poll was a fifth of the poller's CPU with the
    /// stand-in (`cargo xtask bench nvml`).
    devices: Vec<Option<Device<'static>>>,
    /// NVML's own utilisation samples, while they are read (`read_samples`) rather than polled.
    sampler: Option<Sampler>,
}

#[derive(Debug, Clone, Default)]
struct Slow {
    mem_clock_mhz: Option<f64>,
    temp_c: Option<f64>,
    mem_used_mib: Option<f64>,
    mem_total_mib: Option<f64>,
    pcie_rx_mbps: Option<f64>,
    pcie_tx_mbps: Option<f64>,
    holders: Option<Vec<Holder>>,
    ecc_corrected: Option<f64>,
    ecc_uncorrected: Option<f64>,
    remap: Option<RowRemap>,
    gpm: Option<crate::gpu_readings::Gpm>,
}

/// Whether an error means the call will never work here (rather than this once).
fn permanent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission
            | NvmlError::InvalidArg
    )
}

impl Source {
    /// Loads the library at `path` and starts it.
    pub fn open(path: &str) -> Result<Self, GpuError> {
        let nvml = Nvml::builder().lib_path(OsStr::new(path)).init().map_err(|e| match e {
            NvmlError::LibloadingError(l) => GpuError::Load { path: path.into(), why: l.to_string() },
            NvmlError::FailedToLoadSymbol(s) => GpuError::Load { path: path.into(), why: s },
            e => GpuError::Init { path: path.into(), why: e.to_string() },
        })?;
        let count = nvml.device_count().map_err(|e| GpuError::Init { path: path.into(), why: e.to_string() })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        Ok(Self {
            nvml,
            events: super::events::XidEvents::register(nvml, count),
            count,
            dead: BTreeSet::new(),
            last_process_ts: vec![0; count as usize],
            slow: vec![Slow::default(); count as usize],
            gpm: super::gpm::Sampler::new(count),
            devices: (0..count).map(|_| None).collect(),
            sampler: Some(Sampler::new(count, crate::timespec::now_ns())),
        })
    }

    /// Calls `f` unless it failed for good on this GPU before; remembers a permanent failure.
    fn call<T>(
        dead: &mut BTreeSet<(u32, &'static str)>,
        gpu: u32,
        what: &'static str,
        f: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if dead.contains(&(gpu, what)) {
            return None;
        }
        match f() {
            Ok(v) => Some(v),
            Err(e) => {
                if permanent(&e) {
                    tracing::info!(gpu, call = what, error = %e, "NVML call not available on this GPU; its track is skipped");
                    dead.insert((gpu, what));
                }
                None
            }
        }
    }

    /// The GPUs, their names and where they sit.
    pub fn inventory(&mut self, library: &str, irqs: &crate::collect::irqs::Placement) -> Inventory {
        let driver = self.nvml.sys_driver_version().ok();
        let mut gpus = Vec::new();
        for index in 0..self.count {
            let Ok(d) = self.nvml.device_by_index(index) else { continue };
            let dead = &mut self.dead;
            let model = Self::call(dead, index, "name", || d.name()).unwrap_or_default();
            let uuid = Self::call(dead, index, "uuid", || d.uuid()).unwrap_or_default();
            let bus_id = Self::call(dead, index, "pci_info", || d.pci_info()).map(|p| p.bus_id).unwrap_or_default();
            let affinity = || {
                let words = Self::call(dead, index, "cpu_affinity", || d.cpu_affinity(16)).unwrap_or_default();
                let bits = std::ffi::c_ulong::BITS as usize;
                let cpus = words
                    .iter()
                    .enumerate()
                    .flat_map(|(w, &m)| (0..bits).filter(move |b| m >> b & 1 == 1).map(move |b| (w * bits + b) as u32));
                cpus.collect()
            };
            let local_cpus = local_cpus(&bus_id).unwrap_or_else(affinity);
            let short = short_bus_id(&bus_id);
            let mut irq_cpus: Vec<u32> = irqs
                .irqs
                .iter()
                .filter(|i| short.is_some() && short_bus_id(&i.device) == short)
                .flat_map(|i| i.cpus.iter().copied())
                .collect();
            irq_cpus.sort_unstable();
            irq_cpus.dedup();
            gpus.push(GpuInfo { index, model, uuid, bus_id, local_cpus, irq_cpus, processes: Vec::new() });
        }
        let unavailable = gpus.is_empty().then(|| format!("{library} loaded, but it lists no GPU"));
        Inventory {
            library: library.into(),
            unavailable,
            driver,
            gpus,
            unsupported: self.unsupported(),
            utilisation: None,
        }
    }

    /// Calls that failed for good, as `gpu N: call`.
    pub fn unsupported(&self) -> Vec<String> {
        self.dead.iter().map(|(g, c)| format!("gpu {g}: {c}")).collect()
    }

    /// One read of every GPU. Each NVML call costs: on an H100 (driver 580) a poll of all of them
    /// took 1.7 ms of CPU, 1.7 % of a core at 10 polls a second (BENCHMARKS.md). So every poll
    /// reads what the detectors and the page follow closely (utilisation, SM clock, clock-event
    /// reasons, power); `slow` (the poller's first poll of each second) also reads what moves
    /// slowly or costs more (memory clock, temperature, memory, PCIe, ECC, processes), and the
    /// polls between repeat it.
    pub fn read(&mut self, slow: bool) -> Vec<Reading> {
        let mut out = Vec::with_capacity(self.count as usize);
        for index in 0..self.count {
            let slot = &mut self.devices[index as usize];
            if slot.is_none() {
                *slot = self.nvml.device_by_index(index).ok();
            }
            let Some(d) = slot.as_ref() else { continue };
            let dead = &mut self.dead;
            let mut r = Reading { index, ..Default::default() };
            // Read from NVML's samples instead while they are (`read_samples`).
            if self.sampler.is_none()
                && let Some(u) = Self::call(dead, index, "utilization_rates", || d.utilization_rates())
            {
                r.util = Some(f64::from(u.gpu));
                r.mem_util = Some(f64::from(u.memory));
            }
            r.sm_clock_mhz = Self::call(dead, index, "clock_info(sm)", || d.clock_info(Clock::SM)).map(f64::from);
            r.clock_events =
                Self::call(dead, index, "current_throttle_reasons", || d.current_throttle_reasons()).map(|b| b.bits());
            r.power_w = Self::call(dead, index, "power_usage", || d.power_usage()).map(|mw| f64::from(mw) / 1000.0);
            if slow {
                let s = &mut self.slow[index as usize];
                s.mem_clock_mhz =
                    Self::call(dead, index, "clock_info(mem)", || d.clock_info(Clock::Memory)).map(f64::from);
                s.temp_c =
                    Self::call(dead, index, "temperature", || d.temperature(TemperatureSensor::Gpu)).map(f64::from);
                let mem = Self::call(dead, index, "memory_info", || d.memory_info());
                s.mem_used_mib = mem.as_ref().map(|m| m.used as f64 / 1048576.0);
                s.mem_total_mib = mem.as_ref().map(|m| m.total as f64 / 1048576.0);
                // KB/s in NVML; MB/s here.
                let pcie = |c| d.pcie_throughput(c).map(pcie_mbps);
                s.pcie_rx_mbps = Self::call(dead, index, "pcie_throughput(rx)", || pcie(PcieUtilCounter::Receive));
                s.pcie_tx_mbps = Self::call(dead, index, "pcie_throughput(tx)", || pcie(PcieUtilCounter::Send));
                let ecc = |t| d.total_ecc_errors(t, EccCounter::Volatile).map(|n| n as f64);
                let slow = &mut self.slow[index as usize];
                slow.ecc_corrected = Self::call(dead, index, "ecc(corrected)", || ecc(MemoryError::Corrected));
                slow.ecc_uncorrected = Self::call(dead, index, "ecc(uncorrected)", || ecc(MemoryError::Uncorrected));
                slow.remap = Self::call(dead, index, "remapped_rows", || remapped_rows(self.nvml, d));
                // GPM: a second's SM activity (Hopper and later; "gpm" in the unsupported calls
                // otherwise, said once).
                let (nvml, sampler) = (self.nvml, &mut self.gpm);
                slow.gpm = Self::call(dead, index, "gpm", || sampler.read(nvml, d, index)).flatten();
                let procs = Self::call(dead, index, "running_compute_processes", || d.running_compute_processes());
                let since = self.last_process_ts[index as usize];
                // NOT_FOUND: no process ran anything since `since`, every holder at 0 %.
                let samples =
                    Self::call(dead, index, "process_utilization_stats", || match d.process_utilization_stats(since) {
                        Err(NvmlError::NotFound) => Ok(Vec::new()),
                        r => r,
                    });
                if let Some(s) = &samples {
                    let newest = s.iter().map(|p| p.timestamp).max().unwrap_or(since);
                    self.last_process_ts[index as usize] = newest;
                }
                self.slow[index as usize].holders = procs.map(|mut procs| {
                    procs.truncate(MAX_HOLDERS);
                    procs
                        .into_iter()
                        .map(|p| Holder {
                            pid: p.pid,
                            mem_mib: match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) => Some(b as f64 / 1048576.0),
                                UsedGpuMemory::Unavailable => None,
                            },
                            // The mean of its samples since the last read; none while the
                            // GPU holds it: it ran nothing (NVML samples only the processes
                            // that did), 0 %, as nvidia-smi pmon counts it. A track of only
                            // its busy moments read 16.9 % where pmon read 5.7 % on an H200.
                            sm_util: samples.as_ref().map(|s| {
                                let mine: Vec<f64> =
                                    s.iter().filter(|x| x.pid == p.pid).map(|x| f64::from(x.sm_util)).collect();
                                if mine.is_empty() { 0.0 } else { mine.iter().sum::<f64>() / mine.len() as f64 }
                            }),
                            comm: None,
                            identity: None,
                        })
                        .collect()
                });
            }
            let slow = &self.slow[index as usize];
            r.mem_clock_mhz = slow.mem_clock_mhz;
            r.temp_c = slow.temp_c;
            r.mem_used_mib = slow.mem_used_mib;
            r.mem_total_mib = slow.mem_total_mib;
            r.pcie_rx_mbps = slow.pcie_rx_mbps;
            r.pcie_tx_mbps = slow.pcie_tx_mbps;
            r.holders = slow.holders.clone();
            r.ecc_corrected = slow.ecc_corrected;
            r.ecc_uncorrected = slow.ecc_uncorrected;
            r.remap = slow.remap;
            r.gpm = slow.gpm;
            out.push(r);
        }
        out
    }
}

impl Source {
    /// Whether utilisation comes from NVML's samples (`read_samples`) rather than each `read`.
    pub fn sampling(&self) -> bool {
        self.sampler.is_some()
    }

    /// Utilisation is polled by `read` from now on.
    pub fn stop_sampling(&mut self) {
        self.sampler = None;
    }

    /// NVML's utilisation samples of each GPU in `readings` since the last read, at their times;
    /// each GPU's newest goes in its reading (`/metrics`). A buffer with nothing new (an idle
    /// GPU's runs dry) is one `nvmlDeviceGetUtilizationRates` read, at `now_ns`. `Err` says why
    /// a GPU has no samples at all (a driver without them, a GPU that does not keep them):
    /// utilisation is then polled (`read`), from this call on.
    pub fn read_samples(&mut self, readings: &mut [Reading], now_ns: u64) -> Result<Vec<Sampled>, String> {
        let mut out = Vec::with_capacity(readings.len());
        for r in readings.iter_mut() {
            let index = r.index;
            let (Some(sampler), Some(Some(d))) = (self.sampler.as_mut(), self.devices.get(index as usize)) else {
                continue;
            };
            let util = match sampler.read(self.nvml, d, index, Kind::Gpu) {
                Ok(read) => {
                    if let Some(clock) = read.found_clock {
                        tracing::info!(gpu = index, "NVML's utilisation samples are stamped on {}", clock.describe());
                    }
                    read.samples
                }
                Err(e) if permanent(&e) => {
                    self.sampler = None;
                    return Err(format!("gpu {index}: {e}"));
                }
                Err(_) => Vec::new(),
            };
            // Memory's buffer is read like the GPU's; without it, the snapshot below gives it.
            let dead = &mut self.dead;
            let mem = Self::call(dead, index, "samples(memory)", || sampler.read(self.nvml, d, index, Kind::Memory))
                .map(|r| r.samples)
                .unwrap_or_default();
            let mut got = Sampled { index, util, mem };
            if (got.util.is_empty() || got.mem.is_empty())
                && let Some(u) = Self::call(dead, index, "utilization_rates", || d.utilization_rates())
            {
                if got.util.is_empty() {
                    got.util.push((now_ns, f64::from(u.gpu)));
                }
                if got.mem.is_empty() {
                    got.mem.push((now_ns, f64::from(u.memory)));
                }
            }
            r.util = got.util.last().map(|s| s.1);
            r.mem_util = got.mem.last().map(|s| s.1);
            out.push(got);
        }
        Ok(out)
    }
}

/// Row remapping (A100 and later: a failing memory row replaced by a spare, NVIDIA's successor
/// to page retirement): `nvmlDeviceGetRemappedRows`, which nvml-wrapper 0.12 loads but does not
/// wrap, called through its symbol table. A missing symbol or an older GPU is `NotSupported`
/// (the call is then not made again, like any other).
fn remapped_rows(nvml: &Nvml, d: &Device<'_>) -> Result<RowRemap, NvmlError> {
    let sym = nvml_wrapper::error::nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: NVML's own function, called with a live device handle and four out-parameters
    // that outlive the call.
    let code = unsafe { sym(d.handle(), &mut corrected, &mut uncorrected, &mut pending, &mut failed) };
    nvml_wrapper::error::nvml_try(code)?;
    Ok(RowRemap { corrected, uncorrected, pending: pending != 0, failed: failed != 0 })
}

/// NVML's PCIe throughput (`nvmlDeviceGetPcieThroughput`, KB/s over its 20 ms sample) in MB/s,
/// the unit of every throughput track (GPM's NVLink too, `gpm`). NVML's KB is taken as 1,000
/// bytes; whether NVIDIA means 1,024 is for `cargo xtask gpu-check` to show, beside
/// `nvidia-smi dmon`'s `rxpci` and `txpci` (MB/s) on a GPU node.
fn pcie_mbps(kb_per_sec: u32) -> f64 {
    f64::from(kb_per_sec) / 1000.0
}

#[cfg(test)]
mod tests {
    /// The stand-in's `pcie_rx 1000` and `pcie_tx 2000` (tests/nvml/standin.c): 1 and 2 MB/s.
    #[test]
    fn pcie_throughput_is_kept_in_megabytes_a_second() {
        assert_eq!(super::pcie_mbps(1000), 1.0);
        assert_eq!(super::pcie_mbps(2000), 2.0);
        // The counter's largest value fits: about 4.3 TB/s.
        assert_eq!(super::pcie_mbps(u32::MAX), 4_294_967.295);
    }
}
