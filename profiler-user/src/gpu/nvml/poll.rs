//! The GPU poller: its own thread, once a second on the wall clock's multiples, reads every GPU
//! (`library`), appends the readings to the store as counter tracks (`gpu.<index>.<quantity>`),
//! and shares the latest reading and one summary per second. Utilisation comes from NVML's own
//! samples (`samples`: the driver's, every 1/6 s or so, each at its time on the `interval` grid,
//! 100 ms by default: `timeline`); a driver without them is polled every `interval` instead, as
//! before, said once in the log and `profiler status`. A wake-up cost more than all of a poll's
//! NVML reads on a VM (`cargo xtask bench nvml`, BENCHMARKS.md).
//! Its own CPU per second is a track too (`profiler.gpu_poll_cpu`, µs) and on `/metrics`.
//! For a GPU that idled over a second, what its holders' threads asked of the CPUs (`demand`)
//! and the processes they started (`family`) go with the second's summary: the detectors read
//! them as data, not from `/proc`.
//!
//! Memory is bounded whatever runs on the GPUs: one reading per GPU, [`SECONDS_KEPT`] seconds
//! of summaries, at most [`super::MAX_HOLDERS`] processes a GPU.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use super::{
    demand::Demand,
    family::Family,
    holders::Namer,
    library::Source,
    samples::{Sampled, period_ms},
    timeline::{Timeline, updates},
};
use crate::{
    collect::counters::{Point, thread_cpu},
    gpu_readings::{GpuSecond, Inventory, Reading, SECONDS_KEPT, Seconds, Shared},
    store::{counters::CountersWriter, format::NS_PER_SEC},
    timespec::now_ns,
};

/// Intervals `[gpu] poll_ms` accepts: the grid of the fast tracks' points (NVML's samples' times,
/// or the polls of a driver without them). NVML's utilisation is itself an average over 1/6 s to
/// 1 s, and a finer grid only costs points; slower than 10 s misses the detectors' windows. At
/// 1 s or more utilisation is polled (samples give nothing finer).
pub const POLL_MS: std::ops::RangeInclusive<u64> = 10..=10_000;

pub struct Poller {
    pub data_dir: PathBuf,
    pub stop: Arc<AtomicBool>,
    pub interval: Duration,
    /// The library's file name or path.
    pub library: String,
    pub shared: Shared,
    /// The kubelet's log directory (`--kubelet-logs`): holders' pods and containers.
    pub kubelet_logs: PathBuf,
    /// `/metrics`' figures: NVML's Xid events count in `profiler_gpu_xid_total`.
    /// Xid faults counted for `/metrics`.
    pub xids: crate::gpu_readings::XidCounts,
    /// Utilisation (%) below which a second's holders have their threads' demand and the
    /// processes they started read (`demand`, `family`): what the GPU detectors call idle
    /// (`detect.gpu_idle_below`, as the daemon started: a new value given by SIGHUP applies to
    /// the detectors, and here at the next start). A busy GPU's holders cost nothing.
    pub idle_below: f64,
}

impl Poller {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("gpu".into()).spawn(move || self.run())
    }

    /// Opens the library and lists the GPUs; `None` (said once, in the log and `gpus.json`)
    /// when there is nothing to poll.
    fn open(&self) -> Option<Source> {
        let unavailable = |why: String| {
            tracing::info!("no GPU tracks: {why}");
            let inv = Inventory { library: self.library.clone(), unavailable: Some(why), ..Default::default() };
            self.publish(inv);
        };
        let mut source = match Source::open(&self.library) {
            Ok(s) => s,
            Err(e) => {
                unavailable(e.to_string());
                return None;
            }
        };
        let inv = source.inventory(&self.library, &crate::collect::irqs::Placement::read());
        if let Some(why) = inv.unavailable.clone() {
            unavailable(why);
            return None;
        }
        let models: Vec<String> = inv.gpus.iter().map(|g| format!("{} {}", g.index, g.model)).collect();
        // NVML's samples give nothing finer than a grid of a second or more.
        if self.interval >= Duration::from_secs(1) {
            source.stop_sampling();
        }
        let mut inv = inv;
        inv.utilisation = Some(if source.sampling() {
            format!("{SAMPLED}, on a {} ms grid", self.interval.as_millis())
        } else {
            format!("polled every {} ms", self.interval.as_millis())
        });
        tracing::info!(
            library = %self.library,
            driver = inv.driver.as_deref().unwrap_or("unknown"),
            interval_ms = self.interval.as_millis() as u64,
            "GPU tracks: {} GPU(s): {}",
            inv.gpus.len(),
            models.join(", ")
        );
        self.publish(inv);
        Some(source)
    }

    fn publish(&self, inv: Inventory) {
        if let Err(e) = inv.write(&self.data_dir) {
            tracing::warn!(error = %e, "the GPU list will not show in profiler status");
        }
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).inventory = inv;
    }

    /// NVML's Xid events waiting now, recorded as events (and a fatal one as a finding).
    fn record_xids(&self, source: &mut Source, ts_ns: u64) {
        let Some(events) = source.events.as_mut() else { return };
        let xids = events.take();
        if xids.is_empty() {
            return;
        }
        let inv = self.shared.lock().unwrap_or_else(|p| p.into_inner()).inventory.clone();
        for (index, code) in xids {
            let fatal = events.record(&self.data_dir, &inv, index, code, ts_ns);
            let code = u32::try_from(code).unwrap_or(u32::MAX);
            crate::gpu_readings::count_xid(&self.xids, code, fatal);
        }
    }

    fn run(self) {
        let Some(mut source) = self.open() else { return };
        // Two files a minute: what every poll reads, and what is read once a second. A reader
        // gives every track a point at each tick of its file, so the slow tracks in the fast
        // file would be ten times the points (an 8-GPU hour past `/api/counters`' bound).
        // The fast file's ticks are written together once a second: a write a poll cost more
        // than the poll's NVML reads (BENCHMARKS.md); the page reads the tracks a second later.
        let step = self.interval.as_nanos().max(1) as u64;
        let writers = CountersWriter::stream(&self.data_dir, "gpu")
            .map(|fast| fast.holding(NS_PER_SEC.saturating_sub(step)))
            .and_then(|fast| Ok((fast, CountersWriter::stream(&self.data_dir, "gpuslow")?)));
        let (mut fast_writer, mut slow_writer) = match writers {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "GPU tracks will not be recorded");
                return;
            }
        };
        let mut acc = Seconds::default();
        let mut unsupported = source.unsupported().len();
        let mut namer = Namer::new(&self.kubelet_logs);
        let mut demand = Demand::new(std::path::Path::new("/proc"));
        let mut family = Family::new(std::path::Path::new("/proc"));
        let (mut second_cpu, mut failing) = (0.0, false);
        // The fast tracks of the last poll: the same tracks' new values go into them, their
        // names formatted once (a poll's own cost is what the poller is measured by).
        let mut fast = FastPoints::default();
        // The thread's CPU at the end of the last poll: a poll's cost is from there to its end,
        // the sleep and the wakeup included (a tenth of a poll's cost on a VM).
        let mut cpu_before = thread_cpu();
        // The fast tracks' ticks while they come from NVML's samples.
        let mut timeline = Timeline::new(step);
        let mut period_said = false;
        while !self.stop.load(Ordering::Acquire) {
            let wake = if source.sampling() { NS_PER_SEC } else { step };
            std::thread::sleep(Duration::from_nanos(wake - now_ns() % wake));
            let ts_ns = now_ns();
            // The first poll of each second (every one while sampling) also reads processes, ECC
            // counts, GPM.
            let slow = source.sampling() || acc.second != ts_ns / NS_PER_SEC;
            let mut readings = source.read(slow);
            let sampled = if source.sampling() {
                match source.read_samples(&mut readings, ts_ns) {
                    Ok(s) => Some(s),
                    Err(why) => {
                        tracing::info!(
                            "GPU utilisation polled every {} ms: NVML gives no utilisation samples here ({why})",
                            step / 1_000_000
                        );
                        self.say_utilisation(format!("polled every {} ms (no NVML samples: {why})", step / 1_000_000));
                        // This poll has no utilisation; the next, `interval` later, reads it.
                        None
                    }
                }
            } else {
                None
            };
            if let Some(period) = sampled.as_ref().filter(|_| !period_said).and_then(|s| period_ms(&s.first()?.util)) {
                period_said = true;
                self.say_utilisation(format!("{SAMPLED}, one every {period} ms, on a {} ms grid", step / 1_000_000));
            }
            namer.name(&mut readings, slow);
            self.record_xids(&mut source, ts_ns);
            let mut written = match &sampled {
                Some(batch) => {
                    timeline.add(updates(batch, &readings, ts_ns, &timeline.gpus()));
                    let ticks = timeline.drain(ts_ns, |t, state| fast_writer.append(t, fast.of(state)));
                    ticks.and_then(|()| fast_writer.flush())
                }
                None => fast_writer.append(ts_ns, fast.of(&readings)),
            };
            let mut slow_points = if slow { points(&readings).1 } else { Vec::new() };
            if slow {
                if acc.second != 0 {
                    slow_points.push(Point {
                        name: "profiler.gpu_poll_cpu".into(),
                        cpu: None,
                        unit: "us".into(),
                        value: second_cpu * 1e6,
                    });
                }
                second_cpu = 0.0;
                written = written.and(slow_writer.append(ts_ns, &slow_points));
            }
            match written {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot write GPU tracks; retrying at each poll");
                }
                Err(_) => {}
            }
            let mut done = fold(&mut acc, ts_ns, &readings, sampled.as_deref());
            // Read at each second's first poll, it covers the second `acc` ends now.
            for (_, gpus) in done.iter_mut() {
                let idle = idle_holders(gpus, self.idle_below);
                let started = family.read(&idle);
                // The workers' demand too: workers competing for CPUs get a third of a core
                // each while asking for a whole one (`gpu-starved`).
                let asked = demand.read(&with_workers(&idle, &started), ts_ns);
                for g in gpus.iter_mut() {
                    g.descendants = descendants(&g.holders, &started);
                    g.demand = asked
                        .iter()
                        .filter(|d| g.holders.contains(&d.pid) || g.descendants.binary_search(&d.pid).is_ok())
                        .copied()
                        .collect();
                }
            }
            let cpu_now = thread_cpu();
            let cost = (cpu_now - cpu_before).as_secs_f64();
            cpu_before = cpu_now;
            second_cpu += cost;
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            s.latest = readings;
            s.polls += 1;
            s.poll_cpu_seconds += cost;
            for done in done {
                s.seconds.push_back(done);
                while s.seconds.len() > SECONDS_KEPT {
                    s.seconds.pop_front();
                }
            }
            // The processes holding a GPU changed (read once a second), or a call was found
            // unsupported after the start: status says so.
            let mut changed = false;
            if slow {
                for (index, procs) in Namer::processes(&s.latest) {
                    if let Some(g) = s.inventory.gpus.iter_mut().find(|g| g.index == index)
                        && g.processes != procs
                    {
                        g.processes = procs;
                        changed = true;
                    }
                }
            }
            if source.unsupported().len() != unsupported || changed {
                unsupported = source.unsupported().len();
                s.inventory.unsupported = source.unsupported();
                let inv = s.inventory.clone();
                drop(s);
                let _ = inv.write(&self.data_dir);
            }
        }
    }
}

/// How `profiler status` says utilisation is read while NVML's samples are.
const SAMPLED: &str = "NVML's own samples, read once a second";

impl Poller {
    /// Says in `profiler status` how utilisation is read now.
    fn say_utilisation(&self, how: String) {
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        s.inventory.utilisation = Some(how);
        let inv = s.inventory.clone();
        drop(s);
        let _ = inv.write(&self.data_dir);
    }
}

/// Adds a poll to the per-second summaries: its readings, or, while NVML's samples are read,
/// the samples at their times (utilisation) and the readings for the rest. The summaries of the
/// seconds that ended (one, or more after a late wake-up).
fn fold(
    acc: &mut Seconds,
    ts_ns: u64,
    readings: &[Reading],
    sampled: Option<&[Sampled]>,
) -> Vec<(u64, Vec<GpuSecond>)> {
    let Some(sampled) = sampled else { return acc.add(ts_ns, readings).into_iter().collect() };
    let mut utils: Vec<(u64, u32, f64)> =
        sampled.iter().flat_map(|g| g.util.iter().map(move |&(t, v)| (t, g.index, v))).collect();
    utils.sort_by_key(|u| u.0);
    let mut done: Vec<_> = utils.into_iter().filter_map(|(t, gpu, v)| acc.add_util(t, gpu, v)).collect();
    let rest: Vec<Reading> = readings.iter().map(|r| Reading { util: None, ..r.clone() }).collect();
    done.extend(acc.add(ts_ns, &rest));
    done
}

/// Every process holding a GPU that idled over the second (below `idle_below` %), once.
fn idle_holders(gpus: &[GpuSecond], idle_below: f64) -> Vec<u32> {
    let idle = gpus.iter().filter(|g| g.util.is_some_and(|u| u < idle_below));
    let mut pids: Vec<u32> = idle.flat_map(|g| g.holders.iter().copied()).collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Workers per holder whose threads' demand is read at most (a DataLoader has 2 to 16; the
/// cost is a `schedstat` read a thread).
pub const WORKERS_READ: usize = 32;

/// The pids whose threads' demand is read: the idle GPUs' holders, and the first
/// [`WORKERS_READ`] processes each started.
fn with_workers(holders: &[u32], started: &HashMap<u32, Vec<u32>>) -> Vec<u32> {
    let workers = holders.iter().filter_map(|h| started.get(h)).flat_map(|w| w.iter().take(WORKERS_READ));
    let mut pids: Vec<u32> = holders.iter().copied().chain(workers.copied()).collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The processes `holders` started, once each, from what [`Family::read`] found per holder.
fn descendants(holders: &[u32], started: &HashMap<u32, Vec<u32>>) -> Vec<u32> {
    let mut pids: Vec<u32> = holders.iter().filter_map(|h| started.get(h)).flatten().copied().collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// What every poll reads of a GPU, as (quantity, unit, value).
fn every_poll(r: &Reading) -> [(&'static str, &'static str, Option<f64>); 5] {
    [
        ("util", "%", r.util),
        ("mem_util", "%", r.mem_util),
        ("sm_clock_mhz", "MHz", r.sm_clock_mhz),
        ("clock_events", "bits", r.clock_events.map(|b| b as f64)),
        ("power_w", "W", r.power_w),
    ]
}

/// The fast tracks' points, kept from poll to poll: while the same tracks are read (always,
/// but for a GPU lost or a call found unsupported), only their values change.
#[derive(Default)]
struct FastPoints {
    keys: Vec<(u32, &'static str)>,
    points: Vec<Point>,
}

impl FastPoints {
    fn of(&mut self, readings: &[Reading]) -> &[Point] {
        let mut i = 0;
        let mut same = true;
        for r in readings {
            for (what, _, v) in every_poll(r) {
                let Some(v) = v else { continue };
                same &= self.keys.get(i) == Some(&(r.index, what));
                if same {
                    self.points[i].value = v;
                }
                i += 1;
            }
        }
        if !same || i != self.points.len() {
            self.points = points(readings).0;
            self.keys = readings
                .iter()
                .flat_map(|r| every_poll(r).into_iter().filter(|q| q.2.is_some()).map(|q| (r.index, q.0)))
                .collect();
        }
        &self.points
    }
}

/// The tracks of one poll: (read every poll, read once a second).
pub fn points(readings: &[Reading]) -> (Vec<Point>, Vec<Point>) {
    let (mut fast, mut out) = (Vec::with_capacity(readings.len() * 5), Vec::with_capacity(readings.len() * 12));
    for r in readings {
        let point = |what: &str, unit: &str, value: f64| Point {
            name: format!("gpu.{}.{what}", r.index),
            cpu: None,
            unit: unit.into(),
            value,
        };
        for (what, unit, v) in every_poll(r) {
            fast.extend(v.map(|v| point(what, unit, v)));
        }
        let mut put = |what: &str, unit: &str, v: Option<f64>| out.extend(v.map(|v| point(what, unit, v)));
        put("mem_clock_mhz", "MHz", r.mem_clock_mhz);
        put("temp_c", "C", r.temp_c);
        put("mem_used_mib", "MiB", r.mem_used_mib);
        put("mem_total_mib", "MiB", r.mem_total_mib);
        put("pcie_rx_mbps", "MB/s", r.pcie_rx_mbps);
        put("pcie_tx_mbps", "MB/s", r.pcie_tx_mbps);
        put("ecc_corrected", "errors", r.ecc_corrected);
        put("ecc_uncorrected", "errors", r.ecc_uncorrected);
        if let Some(m) = r.remap {
            put("remapped_rows_correctable", "rows", Some(f64::from(m.corrected)));
            put("remapped_rows_uncorrectable", "rows", Some(f64::from(m.uncorrected)));
            put("row_remap_pending", "bool", Some(f64::from(u8::from(m.pending))));
            put("row_remap_failed", "bool", Some(f64::from(u8::from(m.failed))));
        }
        if let Some(g) = &r.gpm {
            put("sm_active", "%", g.sm_active);
            put("sm_occupancy", "%", g.sm_occupancy);
            put("tensor_active", "%", g.tensor_active);
            put("dram_bw_util", "%", g.dram_bw_util);
            put("nvlink_rx_mbps", "MB/s", g.nvlink_rx_mbps);
            put("nvlink_tx_mbps", "MB/s", g.nvlink_tx_mbps);
        }
        if let Some(holders) = &r.holders {
            put("processes", "processes", Some(holders.len() as f64));
            for h in holders {
                put(&format!("pid.{}.sm_util", h.pid), "%", h.sm_util);
                put(&format!("pid.{}.mem_mib", h.pid), "MiB", h.mem_mib);
            }
        }
    }
    (fast, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_readings::reading;

    #[test]
    fn tracks_say_gpu_and_quantity_and_skip_what_was_not_read() {
        let (fast, slow) = points(&[reading(20.0, 0)]);
        let names = |p: &[Point]| p.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&fast), ["gpu.0.util", "gpu.0.clock_events"]);
        assert_eq!(names(&slow), ["gpu.0.processes", "gpu.0.pid.812.sm_util", "gpu.0.pid.812.mem_mib"]);
        assert!(fast.iter().chain(&slow).all(|p| p.cpu.is_none()));
    }

    #[test]
    fn the_fast_points_kept_between_polls_are_each_polls_values() {
        let mut fast = FastPoints::default();
        let values = |p: &[Point]| p.iter().map(|p| (p.name.clone(), p.value)).collect::<Vec<_>>();
        let gpu = |index, util| Reading { index, ..reading(util, 4) };
        let a = [gpu(0, 20.0), gpu(1, 30.0)];
        assert_eq!(values(fast.of(&a)), values(&points(&a).0));
        let b = [gpu(0, 25.0), gpu(1, 35.0)];
        assert_eq!(values(fast.of(&b)), values(&points(&b).0));
        assert_eq!(fast.of(&b)[2].name, "gpu.1.util");
        // GPU 0 gone from a poll, then a quantity more: the tracks follow.
        let c = [gpu(1, 40.0)];
        assert_eq!(values(fast.of(&c)), values(&points(&c).0));
        let mut d = [gpu(1, 45.0)];
        d[0].power_w = Some(300.0);
        assert_eq!(values(fast.of(&d)), values(&points(&d).0));
    }

    #[test]
    fn only_the_holders_of_a_gpu_that_idled_have_their_threads_read() {
        let g =
            |util: Option<f64>, holders: &[u32]| GpuSecond { util, holders: holders.to_vec(), ..Default::default() };
        let gpus = [g(Some(8.0), &[812, 813]), g(Some(95.0), &[900]), g(None, &[901]), g(Some(20.0), &[812])];
        assert_eq!(idle_holders(&gpus, 50.0), [812, 813]);
        assert!(idle_holders(&gpus[1..3], 50.0).is_empty());
    }

    #[test]
    fn a_gpus_descendants_are_those_of_each_of_its_holders_once() {
        let started = HashMap::from([(812, vec![901, 902]), (813, vec![902, 950])]);
        assert_eq!(descendants(&[812, 813, 814], &started), [901, 902, 950]);
        assert!(descendants(&[900], &started).is_empty());
    }
}
