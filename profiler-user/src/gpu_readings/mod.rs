//! What the GPUs were read to be, as the detectors, `/metrics` and `profiler status` see it:
//! one reading per GPU and poll, one summary per GPU and second (the fold of a second's polls),
//! which GPUs there are (`inventory`), and the state the poller shares. Plain data below the
//! detectors; the rooms that read the GPUs (`gpu::nvml`, `gpu::cuda`) sit above them and fill
//! it in.

pub mod inventory;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

pub use inventory::{GpuInfo, Inventory};

use crate::store::format::NS_PER_SEC;

/// NVIDIA Xid faults seen, by (Xid, fatal), since the start: counted by whichever source saw
/// the fault (the kernel log or NVML's events) and read by `/metrics`. Shared rather than kept
/// in the server's figures so the sources need not know the server.
pub type XidCounts = Arc<Mutex<std::collections::BTreeMap<(u32, bool), u64>>>;

/// Counts one Xid fault.
pub fn count_xid(counts: &XidCounts, code: u32, fatal: bool) {
    *counts.lock().unwrap_or_else(|p| p.into_inner()).entry((code, fatal)).or_default() += 1;
}

/// Clock-event (throttle) reasons that mean the clocks are held down by heat or the hardware,
/// not by an idle GPU, an application's setting or the power cap (NVML's
/// `nvmlClocksEventReason*`): hardware slowdown (0x8), software and hardware thermal slowdown
/// (0x20, 0x40), the hardware power brake (0x80).
///
/// The software power cap (0x4) is left out on purpose: a GPU doing dense work runs at its power
/// limit, and the driver then trades clock for power as designed. On an H100 the GPU-bound phase
/// of `cargo xtask gpu-check` (BF16 8192² products) sat at its 700 W limit with the SM clock at
/// 1375 of 1980 MHz and that bit set for the whole run (BENCHMARKS.md): counted, every healthy
/// busy GPU would be a `gpu-throttled` finding. The bit is still stored (`gpu.N.clock_events`),
/// named in a finding's evidence and on `/metrics`; a lowered power limit shows in `power_w`.
pub const SLOWDOWN_REASONS: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// Names of the clock-event bits, for findings and status.
pub fn reason_names(bits: u64) -> Vec<&'static str> {
    const NAMES: [(u64, &str); 9] = [
        (0x1, "idle"),
        (0x2, "application clocks setting"),
        (0x4, "software power cap"),
        (0x8, "hardware slowdown"),
        (0x10, "sync boost"),
        (0x20, "software thermal slowdown"),
        (0x40, "hardware thermal slowdown"),
        (0x80, "hardware power brake"),
        (0x100, "display clock setting"),
    ];
    NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect()
}

/// One process holding a GPU (a compute context), with its share of the GPU where NVML says.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Holder {
    pub pid: u32,
    pub mem_mib: Option<f64>,
    /// SM utilisation of this process, %, from the last per-process sample.
    pub sm_util: Option<f64>,
    /// Its command and who it belongs to (`holders::Namer`); `None` until named.
    pub comm: Option<std::sync::Arc<str>>,
    pub identity: Option<crate::identity::Identity>,
}

/// What one poll read of one GPU (`None`: the call is missing or unsupported there).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Reading {
    pub index: u32,
    pub util: Option<f64>,
    pub mem_util: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    pub mem_clock_mhz: Option<f64>,
    pub clock_events: Option<u64>,
    pub power_w: Option<f64>,
    pub temp_c: Option<f64>,
    pub mem_used_mib: Option<f64>,
    pub mem_total_mib: Option<f64>,
    pub pcie_rx_mbps: Option<f64>,
    pub pcie_tx_mbps: Option<f64>,
    pub ecc_corrected: Option<f64>,
    pub ecc_uncorrected: Option<f64>,
    /// Row remapping where the GPU has it (A100 and later).
    pub remap: Option<RowRemap>,
    /// Processes holding the GPU as of the last read of them (read once a second).
    pub holders: Option<Vec<Holder>>,
    /// GPM's figures over the last second (Hopper and later; read once a second).
    pub gpm: Option<Gpm>,
}

/// What the SMs did over a second, from GPM (`gpu::nvml::gpm`): shares in %, throughput in MB/s;
/// `None` where the GPU lacks that metric.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Gpm {
    /// The share of time each SM had at least one warp assigned, averaged over the SMs.
    pub sm_active: Option<f64>,
    /// Warps resident against the SMs' maximum.
    pub sm_occupancy: Option<f64>,
    /// The share of time the tensor cores did anything.
    pub tensor_active: Option<f64>,
    pub dram_bw_util: Option<f64>,
    pub nvlink_rx_mbps: Option<f64>,
    pub nvlink_tx_mbps: Option<f64>,
}

/// Rows of GPU memory replaced by spares because of errors (NVML's remapped rows): a pending
/// remap needs a GPU reset to take effect; a failed one means the GPU ran out of spares.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RowRemap {
    /// Rows remapped after correctable errors, and after uncorrectable ones.
    pub corrected: u32,
    pub uncorrected: u32,
    pub pending: bool,
    pub failed: bool,
}

/// One GPU over one wall-clock second, as the detectors see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSecond {
    pub index: u32,
    /// Mean utilisation over the second's readings (its polls, or NVML's own samples taken in
    /// it), %; `None` when none read it.
    pub util: Option<f64>,
    pub polls: u32,
    /// Polls whose clock-event reasons had a slowdown bit ([`SLOWDOWN_REASONS`]).
    pub slowed_polls: u32,
    /// Every clock-event bit seen in the second.
    pub reasons: u64,
    /// Mean SM clock over the second's polls, MHz (`None`: not read).
    pub sm_clock_mhz: Option<f64>,
    /// GPM's figures over the second (`None`: the GPU has no GPM, or not read yet).
    pub gpm: Option<Gpm>,
    pub holders: Vec<u32>,
    /// Each holder's share of the SMs (NVML's per-process samples, %), where NVML gave one.
    pub holder_sm: Vec<(u32, f64)>,
    /// Per holder, its thread that asked most of the CPUs over the second (`gpu::nvml::demand`;
    /// empty where the kernel keeps no scheduler statistics).
    pub demand: Vec<ThreadDemand>,
    /// The processes the holders started, down 8 generations (a DataLoader's workers;
    /// `gpu::nvml::family`), sorted; read, like `demand`, for a GPU that idled over the second.
    pub descendants: Vec<u32>,
}

/// One thread over one second, from its scheduler statistics: the share of the second it ran,
/// and the share it waited runnable for a CPU. Their sum is what it asked of the CPUs: a thread
/// launching kernels back to back asks for a whole core, whether it got one or not.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThreadDemand {
    pub pid: u32,
    pub tid: u32,
    pub ran: f64,
    pub waited: f64,
}

impl ThreadDemand {
    pub fn asked(&self) -> f64 {
        self.ran + self.waited
    }
}

/// Seconds of GPU summaries kept for the detectors (they evaluate 1.5 s after a second ends).
pub const SECONDS_KEPT: usize = 30;

/// What the poller shares with the detectors and `/metrics`; bounded: the latest reading per
/// GPU and [`SECONDS_KEPT`] seconds of summaries.
#[derive(Debug, Default)]
pub struct State {
    pub inventory: Inventory,
    pub latest: Vec<Reading>,
    /// (start of the second, unix ns; one summary per GPU), oldest first.
    pub seconds: VecDeque<(u64, Vec<GpuSecond>)>,
    pub polls: u64,
    /// CPU time the poller spent reading NVML and writing the tracks, since the start.
    pub poll_cpu_seconds: f64,
}

impl State {
    /// The summaries of the second that starts at `start_ns`, if the poller made them.
    pub fn second(&self, start_ns: u64) -> Option<&[GpuSecond]> {
        self.seconds.iter().find(|(s, _)| *s == start_ns).map(|(_, g)| g.as_slice())
    }
}

pub type Shared = Arc<Mutex<State>>;

/// Folds the polls of each wall-clock second into one summary per GPU.
#[derive(Debug, Default)]
pub struct Seconds {
    /// The unix second being summed (0: none yet).
    pub second: u64,
    per: Vec<(GpuSecond, f64, u32)>,
    /// Per GPU (by position in `per`): the SM clock's sum and count this second.
    clocks: Vec<(f64, u32)>,
}

impl Seconds {
    /// Adds a poll; returns the summary of the second before when this poll begins a new one.
    pub fn add(&mut self, ts_ns: u64, readings: &[Reading]) -> Option<(u64, Vec<GpuSecond>)> {
        let done = self.roll(ts_ns / NS_PER_SEC);
        for r in readings {
            let at = self.slot(r.index);
            let (g, sum, n) = &mut self.per[at];
            g.polls += 1;
            if let Some(u) = r.util {
                *sum += u;
                *n += 1;
            }
            if let Some(c) = r.sm_clock_mhz {
                self.clocks[at].0 += c;
                self.clocks[at].1 += 1;
            }
            let reasons = r.clock_events.unwrap_or(0);
            g.reasons |= reasons;
            g.slowed_polls += u32::from(reasons & SLOWDOWN_REASONS != 0);
            if let Some(h) = &r.holders {
                g.holders = h.iter().map(|h| h.pid).collect();
                g.holder_sm = h.iter().filter_map(|h| Some((h.pid, h.sm_util?))).collect();
            }
            if r.gpm.is_some() {
                g.gpm = r.gpm;
            }
        }
        done
    }

    /// Adds one utilisation reading of GPU `index` taken at `ts_ns` (NVML's own samples, read a
    /// second at a time: `gpu::nvml::samples`), in time order; returns the summary of the second
    /// before when it begins a new one. A reading of a second already summed is dropped.
    pub fn add_util(&mut self, ts_ns: u64, index: u32, util: f64) -> Option<(u64, Vec<GpuSecond>)> {
        let second = ts_ns / NS_PER_SEC;
        if second < self.second {
            return None;
        }
        let done = self.roll(second);
        let at = self.slot(index);
        self.per[at].1 += util;
        self.per[at].2 += 1;
        done
    }

    /// The position of GPU `index` in this second's sums.
    fn slot(&mut self, index: u32) -> usize {
        match self.per.iter().position(|(g, _, _)| g.index == index) {
            Some(i) => i,
            None => {
                self.per.push((GpuSecond { index, ..Default::default() }, 0.0, 0));
                self.clocks.push((0.0, 0));
                self.per.len() - 1
            }
        }
    }

    /// Moves to `second`; the summary of the one before when it ends now.
    fn roll(&mut self, second: u64) -> Option<(u64, Vec<GpuSecond>)> {
        let mut done = None;
        if second != self.second {
            if self.second != 0 {
                let per = std::mem::take(&mut self.per);
                let clocks = std::mem::take(&mut self.clocks);
                let summary = per
                    .into_iter()
                    .zip(clocks)
                    .map(|((mut g, sum, n), (clock, m))| {
                        g.util = (n > 0).then(|| sum / f64::from(n));
                        g.sm_clock_mhz = (m > 0).then(|| clock / f64::from(m));
                        g
                    })
                    .collect();
                done = Some((self.second * NS_PER_SEC, summary));
            }
            self.second = second;
            self.per.clear();
            self.clocks.clear();
        }
        done
    }
}

/// GPU 0 busy `util` % with clock-event bits `reasons`, held by pid 812 (tests of the readings'
/// users share it).
#[cfg(test)]
pub fn reading(util: f64, reasons: u64) -> Reading {
    Reading {
        index: 0,
        util: Some(util),
        clock_events: Some(reasons),
        holders: Some(vec![Holder {
            pid: 812,
            mem_mib: Some(1024.0),
            sm_util: Some(30.0),
            comm: None,
            identity: None,
        }]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_fold_into_one_summary_per_second() {
        let mut s = Seconds::default();
        let t = 1_795_000_000 * NS_PER_SEC;
        assert_eq!(s.add(t, &[reading(20.0, 0)]), None);
        assert_eq!(s.add(t + 100_000_000, &[reading(40.0, 0x40)]), None);
        // The software power cap alone is a GPU at its limit, not a slowdown (`SLOWDOWN_REASONS`).
        assert_eq!(s.add(t + 200_000_000, &[reading(30.0, 0x4)]), None);
        let (start, done) = s.add(t + NS_PER_SEC, &[reading(90.0, 0)]).expect("the second ended");
        assert_eq!(start, t);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].util, Some(30.0));
        assert_eq!((done[0].polls, done[0].slowed_polls, done[0].reasons), (3, 1, 0x44));
        assert_eq!(done[0].holders, vec![812]);
        assert_eq!(done[0].sm_clock_mhz, None, "not read");
    }

    #[test]
    fn nvmls_samples_fold_into_the_second_they_were_taken_in() {
        let mut s = Seconds::default();
        let t = 1_795_000_000 * NS_PER_SEC;
        // Read at 1.003 s: the samples of second 0, one of second 1, then the wake-up's reading
        // (clocks, reasons, holders: its utilisation is the samples').
        for (ms, u) in [(0, 10.0), (167, 20.0), (333, 30.0), (500, 40.0), (667, 50.0), (833, 60.0)] {
            assert_eq!(s.add_util(t + ms * 1_000_000, 0, u), None);
        }
        let (start, done) = s.add_util(t + NS_PER_SEC, 0, 90.0).expect("second 0 ended");
        assert_eq!((start, done[0].util, done[0].polls), (t, Some(35.0), 0));
        let mut once = reading(20.0, 0x40);
        once.util = None;
        assert_eq!(s.add(t + NS_PER_SEC + 3_000_000, &[once]), None);
        // A sample of second 0 handed over late changes nothing summed.
        assert_eq!(s.add_util(t + 900_000_000, 0, 0.0), None);
        assert_eq!(s.add_util(t + 1_167_000_000, 0, 70.0), None);
        let (_, done) = s.add_util(t + 2 * NS_PER_SEC, 0, 0.0).expect("second 1 ended");
        assert_eq!(done[0].util, Some(80.0));
        assert_eq!((done[0].polls, done[0].slowed_polls, done[0].holders.clone()), (1, 1, vec![812]));
    }
}
