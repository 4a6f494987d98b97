//! Kernel counters read once a second beside the samples: what an engineer checks next when a
//! CPU is hot in softirq. Per CPU: softnet (`processed`, `dropped`, `time_squeeze`), softirqs
//! by kind, interrupts taken; per NIC queue its interrupts; PSI (cpu, memory, io); live and
//! dying memory cgroups (the zombie detector's count, not read twice); CFS throttling summed
//! over the cpu hierarchy; NIC counters (`/proc/net/dev`, and the driver's through ethtool).
//!
//! Monotonic counters become rates per second (the first read of each gives no point; a counter
//! that went back, a NIC reset, gives none either); gauges are kept as read. A source the kernel
//! does not have (PSI on 4.19, a v2 hierarchy without the cpu controller) is skipped, said once.

pub mod ethtool;
pub mod parse;

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{memcg::MemcgCount, reclaim::ReclaimSecond, runq::RunqSecond};

/// The latest memory cgroup count the upkeep stage read (for the zombie detector) and when,
/// shared so that the cgroup tree is walked once for both.
pub type LatestMemcg = Arc<Mutex<Option<(Instant, MemcgCount)>>>;

/// Run-queue waits per CPU since the counters last took them: the pipeline stage adds each
/// read of the BPF histograms (every flush, up to 20 a second), the counters thread takes the
/// sum once a second for the p99 and the longest wait of that second.
pub type LatestRunq = Arc<Mutex<std::collections::BTreeMap<u32, RunqSecond>>>;

/// Reclaim and compaction stalls per CPU since the counters last took them, added the same way
/// (`reclaim.stall`, `.._p99`, `.._max`: memory pressure on the samples' time axis).
pub type LatestReclaim = Arc<Mutex<std::collections::BTreeMap<u32, ReclaimSecond>>>;

/// One value of one track at one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub name: String,
    pub cpu: Option<u32>,
    pub unit: String,
    pub value: f64,
}

/// A counter as read, before it becomes a rate.
enum Raw {
    /// Monotonic; the rate is `delta × scale` per second.
    Counter(u64, f64),
    Gauge(f64),
}

/// How often the cpu hierarchy is walked for CFS throttling (one `cpu.stat` per cgroup).
const CFS_EVERY: Duration = Duration::from_secs(5);
/// How often NIC driver statistics are asked for (an ioctl per interface that makes the driver
/// gather every queue's counters): what they count, resets and timeouts, is rare, and a rate
/// over 10 s shows it as well.
const ETHTOOL_EVERY: Duration = Duration::from_secs(10);
/// The walk stops after this many cgroups (a node with more says so once).
const CFS_MAX_CGROUPS: usize = 20_000;
/// A memory cgroup count older than this (upkeep reads it every 5 s) is not shown.
const MEMCG_FRESH: Duration = Duration::from_secs(15);

/// Reads the counters; keeps the previous values to make rates.
pub struct Sampler {
    /// `/` in the daemon; a directory laid out like it in tests.
    root: PathBuf,
    prev: HashMap<(String, Option<u32>), (u64, Instant)>,
    cfs_at: Option<Instant>,
    cfs_mounts: Option<Vec<PathBuf>>,
    /// The latest memory cgroup count, which the upkeep stage reads for the zombie detector.
    memcg: Option<LatestMemcg>,
    runq: Option<LatestRunq>,
    reclaim: Option<LatestReclaim>,
    missing: BTreeSet<&'static str>,
    /// `None` in tests on a fake tree, or when no socket could be made.
    ethtool: Option<ethtool::Ethtool>,
    ethtool_at: Option<Instant>,
}

impl Sampler {
    /// Tracks of run-queue waits per CPU from `runq` (`sched.runq_wait_p99`, `.._max`).
    pub fn with_runq(mut self, runq: LatestRunq) -> Self {
        self.runq = Some(runq);
        self
    }

    /// Tracks of reclaim and compaction stalls per CPU from `reclaim`.
    pub fn with_reclaim(mut self, reclaim: LatestReclaim) -> Self {
        self.reclaim = Some(reclaim);
        self
    }

    pub fn new(root: impl Into<PathBuf>, memcg: Option<LatestMemcg>) -> Self {
        let root: PathBuf = root.into();
        // Driver counters come from the real kernel only (an ioctl, not a file under `root`).
        let ethtool = (root == Path::new("/")).then(ethtool::Ethtool::new).and_then(Result::ok);
        Self {
            root,
            prev: HashMap::new(),
            cfs_at: None,
            cfs_mounts: None,
            memcg,
            runq: None,
            reclaim: None,
            missing: BTreeSet::new(),
            ethtool,
            ethtool_at: None,
        }
    }

    fn read(&mut self, what: &'static str, rel: &str) -> Option<String> {
        match std::fs::read_to_string(self.root.join(rel)) {
            Ok(t) => Some(t),
            Err(e) => {
                if self.missing.insert(what) {
                    tracing::info!(file = rel, error = %e, "no {what} counters on this kernel; skipped");
                }
                None
            }
        }
    }

    /// One read of everything; the points of this tick (rates need the tick before).
    pub fn tick(&mut self, now: Instant) -> Vec<Point> {
        let mut raw: Vec<(String, Option<u32>, &'static str, Raw)> = Vec::new();
        if let Some(t) = self.read("softnet", "proc/net/softnet_stat") {
            for s in parse::softnet(&t) {
                raw.push(("softnet.processed".into(), Some(s.cpu), "/s", Raw::Counter(s.processed, 1.0)));
                raw.push(("softnet.dropped".into(), Some(s.cpu), "/s", Raw::Counter(s.dropped, 1.0)));
                raw.push(("softnet.time_squeeze".into(), Some(s.cpu), "/s", Raw::Counter(s.time_squeeze, 1.0)));
            }
        }
        if let Some(t) = self.read("softirq", "proc/softirqs") {
            for (name, cpu, n) in parse::softirqs(&t) {
                raw.push((format!("softirq.{name}"), Some(cpu), "/s", Raw::Counter(n, 1.0)));
            }
        }
        if let Some(t) = self.read("interrupt", "proc/interrupts") {
            let i = parse::interrupts(&t);
            for (cpu, n) in i.per_cpu {
                raw.push(("irq.total".into(), Some(cpu), "/s", Raw::Counter(n, 1.0)));
            }
            for (queue, n) in i.queues {
                raw.push((format!("irq.{queue}"), None, "/s", Raw::Counter(n, 1.0)));
            }
        }
        for resource in ["cpu", "memory", "io"] {
            let Some(t) = self.read("PSI", &format!("proc/pressure/{resource}")) else { continue };
            for p in parse::pressure(&t) {
                raw.push((format!("psi.{resource}.{}.avg10", p.kind), None, "%", Raw::Gauge(p.avg10)));
                // µs stalled per second, as a percentage of the second.
                raw.push((format!("psi.{resource}.{}", p.kind), None, "%", Raw::Counter(p.total_us, 1e-4)));
            }
        }
        self.nic(now, &mut raw);
        self.cfs(now, &mut raw);
        if let Some(m) = self.memcg.as_ref().and_then(|m| *m.lock().unwrap_or_else(|p| p.into_inner()))
            && now.saturating_duration_since(m.0) <= MEMCG_FRESH
        {
            raw.push(("memcg.live".into(), None, "count", Raw::Gauge(m.1.live as f64)));
            raw.push(("memcg.dying".into(), None, "count", Raw::Gauge(m.1.dying as f64)));
        }
        if let Some(r) = self.runq.as_ref() {
            let waits = std::mem::take(&mut *r.lock().unwrap_or_else(|p| p.into_inner()));
            let ms = |ns: u64| ns as f64 / 1e6;
            for (cpu, w) in waits {
                if let Some(p99) = w.p99_ns() {
                    raw.push(("sched.runq_wait_p99".into(), Some(cpu), "ms", Raw::Gauge(ms(p99))));
                }
                raw.push(("sched.runq_wait_max".into(), Some(cpu), "ms", Raw::Gauge(ms(w.max_ns))));
            }
        }
        if let Some(r) = self.reclaim.as_ref() {
            let stalls = std::mem::take(&mut *r.lock().unwrap_or_else(|p| p.into_inner()));
            let ms = |ns: u64| ns as f64 / 1e6;
            for (cpu, s) in stalls {
                // Stalls that ended in the second since the last tick: ms stalled per second.
                raw.push(("reclaim.stall".into(), Some(cpu), "ms/s", Raw::Gauge(ms(s.total_ns()))));
                if let Some(p99) = s.p99_ns() {
                    raw.push(("reclaim.stall_p99".into(), Some(cpu), "ms", Raw::Gauge(ms(p99))));
                }
                raw.push(("reclaim.stall_max".into(), Some(cpu), "ms", Raw::Gauge(ms(s.max_ns))));
            }
        }
        self.rates(now, raw)
    }

    fn rates(&mut self, now: Instant, raw: Vec<(String, Option<u32>, &'static str, Raw)>) -> Vec<Point> {
        let mut out = Vec::with_capacity(raw.len());
        for (name, cpu, unit, r) in raw {
            let value = match r {
                Raw::Gauge(v) => Some(v),
                Raw::Counter(v, scale) => {
                    let before = self.prev.insert((name.clone(), cpu), (v, now));
                    before.and_then(|(b, at)| {
                        let dt = now.saturating_duration_since(at).as_secs_f64();
                        (v >= b && dt > 0.0).then(|| (v - b) as f64 * scale / dt)
                    })
                }
            };
            if let Some(value) = value.filter(|v| v.is_finite()) {
                out.push(Point { name, cpu, unit: unit.into(), value });
            }
        }
        out
    }

    fn nic(&mut self, now: Instant, raw: &mut Vec<(String, Option<u32>, &'static str, Raw)>) {
        let Some(t) = self.read("NIC", "proc/net/dev") else { return };
        let driver = self.ethtool_at.is_none_or(|t| now.saturating_duration_since(t) >= ETHTOOL_EVERY);
        if driver {
            self.ethtool_at = Some(now);
        }
        for (ifname, values) in parse::net_dev(&t).into_iter().filter(|(n, _)| n != "lo") {
            for (c, v) in parse::NET_DEV_NAMES.iter().zip(values) {
                raw.push((format!("nic.{ifname}.{c}"), None, "/s", Raw::Counter(v, 1.0)));
            }
            if let Some(e) = self.ethtool.as_mut().filter(|_| driver) {
                for (stat, v) in e.stats(&ifname) {
                    raw.push((format!("ethtool.{ifname}.{stat}"), None, "/s", Raw::Counter(v, 1.0)));
                }
            }
        }
    }

    /// CFS throttling summed over every cgroup of the cpu hierarchy (v1 and v2), every
    /// [`CFS_EVERY`]: times throttled per second, and ms throttled per second.
    fn cfs(&mut self, now: Instant, raw: &mut Vec<(String, Option<u32>, &'static str, Raw)>) {
        if self.cfs_at.is_some_and(|t| now.saturating_duration_since(t) < CFS_EVERY) {
            return;
        }
        self.cfs_at = Some(now);
        let root = self.root.clone();
        let mounts = self.cfs_mounts.get_or_insert_with(|| cpu_mounts(&root)).clone();
        let (mut times, mut ns, mut seen, mut any) = (0u64, 0u64, 0usize, false);
        for m in mounts {
            let mut stack = vec![m];
            while let Some(dir) = stack.pop() {
                seen += 1;
                if seen > CFS_MAX_CGROUPS {
                    if self.missing.insert("CFS (too many cgroups)") {
                        tracing::info!(max = CFS_MAX_CGROUPS, "CFS throttling is summed over the first cgroups only");
                    }
                    break;
                }
                if let Some((t, n)) =
                    std::fs::read_to_string(dir.join("cpu.stat")).ok().and_then(|t| parse::cpu_stat(&t))
                {
                    (times, ns, any) = (times + t, ns + n, true);
                }
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    stack.extend(
                        entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()),
                    );
                }
            }
        }
        if any {
            raw.push(("cfs.throttled".into(), None, "/s", Raw::Counter(times, 1.0)));
            raw.push(("cfs.throttled_time".into(), None, "ms/s", Raw::Counter(ns, 1e-6)));
        } else if self.missing.insert("CFS") {
            tracing::info!("no cgroup with CFS bandwidth figures (cpu.stat nr_throttled); throttling not recorded");
        }
    }
}

/// The cpu controller's mounts: a v1 `cgroup` mount with the `cpu` option, and the v2 mount.
fn cpu_mounts(root: &Path) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string(root.join("proc/mounts")).unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let v1 = f.get(2) == Some(&"cgroup") && f.get(3).is_some_and(|o| o.split(',').any(|x| x == "cpu"));
            let v2 = f.get(2) == Some(&"cgroup2");
            // Mount points are relative to the real root; a test tree has them under `root`.
            if !(v1 || v2) {
                return None;
            }
            Some(root.join(f.get(1)?.trim_start_matches('/')))
        })
        .collect()
}

/// CPU time this thread has used (for the collector's cost per tick).
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn find<'a>(points: &'a [Point], name: &str, cpu: Option<u32>) -> Option<&'a Point> {
        points.iter().find(|p| p.name == name && p.cpu == cpu)
    }

    #[test]
    fn counters_become_rates_and_gauges_stay() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/net/softnet_stat", "00000010 00000000 00000001 0 0 0 0 0 0 0 0 0 00000001\n");
        write(r, "proc/softirqs", "  CPU1\nNET_RX: 100\n");
        write(r, "proc/pressure/cpu", "some avg10=5.00 avg60=0 avg300=0 total=1000\n");
        write(r, "proc/net/dev", "h|\nh|\n eth0: 0 7 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n");
        write(r, "proc/mounts", "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n");
        write(r, "sys/fs/cgroup/cpu/cpu.stat", "nr_throttled 0\nthrottled_time 0\n");
        write(r, "sys/fs/cgroup/cpu/pod/cpu.stat", "nr_throttled 1\nthrottled_time 1000000\n");
        let memcg = Arc::new(Mutex::new(None));
        let runq: LatestRunq = Arc::default();
        let reclaim: LatestReclaim = Arc::default();
        let mut s = Sampler::new(r, Some(memcg.clone())).with_runq(runq.clone()).with_reclaim(reclaim.clone());
        let t0 = Instant::now();
        let first = s.tick(t0);
        assert!(find(&first, "sched.runq_wait_max", Some(1)).is_none(), "no run-queue read yet");
        // Only gauges at the first tick.
        assert_eq!(find(&first, "psi.cpu.some.avg10", None).unwrap().value, 5.0);
        assert!(find(&first, "softnet.processed", Some(1)).is_none());
        *memcg.lock().unwrap() = Some((t0, MemcgCount { ts_ns: 0, live: 40, dying: 7, stat_read_ns: None }));
        {
            let h = |ns: u64, n: u64| {
                let mut v = vec![0; profiler_common::LATENCY_BUCKETS as usize];
                v[profiler_common::latency_bucket(ns) as usize] = n;
                v
            };
            let mut w = runq.lock().unwrap();
            w.insert(0, RunqSecond { waits: 3, histogram: h(500_000, 3), max_ns: 500_000, waiter: None });
            // Two reads within the second: the longest wait and the histogram add up.
            let one = RunqSecond { waits: 30, histogram: h(12_000_000, 30), max_ns: 12_000_000, waiter: None };
            w.entry(1).or_default().add(one);
            w.entry(1).or_default().add(RunqSecond {
                waits: 1,
                histogram: h(930_000_000, 1),
                max_ns: 930_000_000,
                waiter: None,
            });
        }
        {
            let mut h = vec![0; profiler_common::LATENCY_BUCKETS as usize];
            h[profiler_common::latency_bucket(2_000_000) as usize] = 60;
            // Two reads of 60 stalls of 2 ms on CPU 1 (240 ms), the longest 2.05 ms.
            let read = ReclaimSecond {
                count: [0, 60, 0],
                ns: [0, 120_000_000, 0],
                histogram: h,
                max_ns: 2_050_000,
                staller: None,
            };
            let mut w = reclaim.lock().unwrap();
            w.entry(1).or_default().add(read.clone());
            w.entry(1).or_default().add(read);
        }
        write(r, "proc/net/softnet_stat", "00000030 00000000 00000001 0 0 0 0 0 0 0 0 0 00000001\n");
        write(r, "proc/softirqs", "  CPU1\nNET_RX: 400\n");
        write(r, "proc/pressure/cpu", "some avg10=5.00 avg60=0 avg300=0 total=501000\n");
        write(r, "proc/net/dev", "h|\nh|\n eth0: 0 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n");
        write(r, "sys/fs/cgroup/cpu/pod/cpu.stat", "nr_throttled 11\nthrottled_time 501000000\n");
        let second = s.tick(t0 + Duration::from_secs(2));
        assert_eq!(find(&second, "softnet.processed", Some(1)).unwrap().value, 16.0);
        assert_eq!(find(&second, "reclaim.stall", Some(1)).unwrap().value, 240.0);
        assert_eq!(find(&second, "reclaim.stall_max", Some(1)).unwrap().value, 2.05);
        // 120 stalls in the bucket of 2 ms (1.97-2.10 ms), capped by the longest.
        assert_eq!(find(&second, "reclaim.stall_p99", Some(1)).unwrap().value, 2.05);
        assert!(find(&second, "reclaim.stall", Some(0)).is_none(), "no stalls on CPU 0: no point");
        assert!(s.tick(t0 + Duration::from_secs(3)).iter().all(|p| p.name != "reclaim.stall"), "taken once");
        assert_eq!(find(&second, "softnet.time_squeeze", Some(1)).unwrap().value, 0.0);
        assert_eq!(find(&second, "softirq.NET_RX", Some(1)).unwrap().value, 150.0);
        assert_eq!(find(&second, "sched.runq_wait_max", Some(1)).unwrap().value, 930.0);
        // 31 waits, the p99 is the longest one's bucket (the upper edge: up to 1/8 over).
        let p99 = find(&second, "sched.runq_wait_p99", Some(1)).unwrap().value;
        assert!((930.0..=1050.0).contains(&p99), "{p99}");
        assert!(find(&second, "sched.runq_wait_p99", Some(0)).is_none(), "too few waits for a p99");
        assert_eq!(find(&second, "psi.cpu.some", None).unwrap().value, 25.0, "0.5 s stalled of 2 s");
        assert!(find(&second, "nic.eth0.rx_packets", None).is_none(), "a counter that went back gives no rate");
        assert_eq!(find(&second, "memcg.dying", None).unwrap().value, 7.0);
        // The cpu hierarchy is walked every 5 s: not yet.
        assert!(find(&second, "cfs.throttled", None).is_none());
        let third = s.tick(t0 + Duration::from_secs(5));
        assert_eq!(find(&third, "cfs.throttled", None).unwrap().value, 2.0, "10 in 5 s");
        assert_eq!(find(&third, "cfs.throttled_time", None).unwrap().unit, "ms/s");
        assert_eq!(find(&third, "cfs.throttled_time", None).unwrap().value, 100.0);
    }

    #[test]
    fn missing_sources_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sampler::new(dir.path(), None);
        assert!(s.tick(Instant::now()).is_empty());
        assert!(s.missing.contains("PSI"));
        assert!(s.tick(Instant::now() + Duration::from_secs(1)).is_empty());
    }

    /// The real files of this machine read, and cheaply.
    #[test]
    fn the_real_kernel_reads() {
        let mut s = Sampler::new("/", None);
        let t0 = Instant::now();
        s.tick(t0);
        let before = thread_cpu();
        let points = s.tick(t0 + Duration::from_secs(1));
        let cost = thread_cpu() - before;
        assert!(points.iter().any(|p| p.name == "softirq.TIMER"), "{points:?}");
        assert!(cost < Duration::from_millis(200), "one read took {cost:?} of CPU");
    }
}
