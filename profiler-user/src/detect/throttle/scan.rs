//! Which cgroups have a CPU quota, and how often the quota stopped them: `cpu.stat` of every
//! cgroup with a quota, in the cgroup v1 `cpu` hierarchy and in a cgroup v2 hierarchy that has
//! the `cpu` controller (both, on a hybrid host where either holds it).
//!
//! Cheap by construction: one small read per cgroup directory (its quota), and `cpu.stat` plus
//! `cgroup.procs` only where a quota applies; the walk stops at [`MAX_DIRS`] directories and
//! [`MAX_DEPTH`] levels, and each cgroup keeps at most [`MAX_PIDS`] pids.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// Directories looked at per hierarchy and scan (a Kubernetes node has a few hundred).
pub const MAX_DIRS: usize = 20_000;
/// Levels below the mount point (kubepods/burstable/pod/container/crun's subgroup is 5).
pub const MAX_DEPTH: usize = 12;
/// Pids kept per cgroup with a quota (its own and its descendants').
pub const MAX_PIDS: usize = 4096;
/// Cgroups with a quota reported per scan.
pub const MAX_CGROUPS: usize = 2048;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    V1,
    V2,
}

/// The throttling counters of one cgroup's `cpu.stat` (cumulative since it was made).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// Enforcement periods in which the cgroup had runnable threads.
    pub nr_periods: u64,
    /// Of those, periods that ended with the quota spent and the cgroup throttled.
    pub nr_throttled: u64,
    /// Time its runqueues spent throttled, summed over CPUs, ns.
    pub throttled_ns: u64,
}

/// Parses `cpu.stat`: v1 (`nr_periods`, `nr_throttled`, `throttled_time` in ns) or v2
/// (`nr_periods`, `nr_throttled`, `throttled_usec`, beside `usage_usec` and the rest). `None`
/// when the throttling lines are missing (no quota was ever set on v2, or not a cpu.stat).
pub fn parse_cpu_stat(text: &str) -> Option<CpuStat> {
    let (mut periods, mut throttled, mut time_ns) = (None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else { continue };
        let Ok(v) = value.trim().parse::<u64>() else { continue };
        match key {
            "nr_periods" => periods = Some(v),
            "nr_throttled" => throttled = Some(v),
            "throttled_time" => time_ns = Some(v),
            "throttled_usec" => time_ns = Some(v.saturating_mul(1000)),
            _ => {}
        }
    }
    Some(CpuStat { nr_periods: periods?, nr_throttled: throttled?, throttled_ns: time_ns? })
}

/// A CPU quota: `quota_us` of CPU time per `period_us` of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub quota_us: u64,
    pub period_us: u64,
}

impl Quota {
    /// CPUs' worth of time the quota allows.
    pub fn cpus(&self) -> f64 {
        self.quota_us as f64 / self.period_us.max(1) as f64
    }
}

/// v1: `cpu.cfs_quota_us` (`-1`: no quota) and `cpu.cfs_period_us`.
pub fn parse_v1_quota(quota: &str, period: &str) -> Option<Quota> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    (quota > 0 && period > 0).then_some(Quota { quota_us: quota as u64, period_us: period })
}

/// v2: `cpu.max`, `QUOTA PERIOD` or `max PERIOD` (no quota).
pub fn parse_cpu_max(text: &str) -> Option<Quota> {
    let mut f = text.split_whitespace();
    let quota: u64 = f.next()?.parse().ok()?;
    let period: u64 = f.next()?.parse().ok()?;
    (quota > 0 && period > 0).then_some(Quota { quota_us: quota, period_us: period })
}

/// One cgroup with a CPU quota, as read in one scan.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub version: Version,
    /// Below the hierarchy's mount point, `/` first (`/kubepods/burstable/pod.../abc`).
    pub path: String,
    pub quota: Quota,
    pub stat: CpuStat,
    /// Processes in it and its descendants (their threads are all limited by its quota).
    pub pids: Vec<u32>,
    /// v2: the ids of it and its descendants (the inode numbers of their directories, what
    /// the sampler records as a sample's cgroup id). Empty on v1: the sampler records the v2
    /// cgroup, which says nothing about v1 ones.
    pub ids: Vec<u64>,
}

/// The hierarchies that hold the cpu controller, from `/proc/mounts`' text and, for cgroup2
/// mounts, whether their root's `cgroup.controllers` lists `cpu`.
pub fn cpu_hierarchies(mounts: &str, has_cpu_v2: impl Fn(&Path) -> bool) -> Vec<(Version, PathBuf)> {
    let mut out = Vec::new();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dir), Some(fstype), Some(opts)) = (f.get(1), f.get(2), f.get(3)) else { continue };
        // Octal escapes (`\040` for a space) are left alone: such a mount point is not used.
        let dir = PathBuf::from(dir);
        match *fstype {
            "cgroup" if opts.split(',').any(|o| o == "cpu") => out.push((Version::V1, dir)),
            "cgroup2" if has_cpu_v2(&dir) => out.push((Version::V2, dir)),
            _ => {}
        }
    }
    // The same hierarchy mounted twice (bind mounts, containers): once.
    let mut seen = std::collections::HashSet::new();
    out.retain(|(_, dir)| std::fs::metadata(dir).map(|m| seen.insert((m.dev(), m.ino()))).unwrap_or(true));
    out
}

fn v2_has_cpu(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers")).is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
}

/// Reads the cgroups with a quota on this host: the upkeep stage calls it every few seconds
/// and hands the readings to the detector.
#[derive(Debug, Default)]
pub struct Scanner {
    hierarchies: Option<Vec<(Version, PathBuf)>>,
}

impl Scanner {
    /// `None`: no hierarchy has the cpu controller (nothing to watch).
    pub fn read(&mut self) -> Option<Vec<Reading>> {
        let hierarchies = self.hierarchies.get_or_insert_with(|| {
            let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
            cpu_hierarchies(&mounts, v2_has_cpu)
        });
        if hierarchies.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for (version, root) in hierarchies.iter() {
            scan(*version, root, &mut out);
        }
        Some(out)
    }
}

/// Walks one hierarchy (depth first, bounded) and appends its cgroups with a quota.
pub fn scan(version: Version, root: &Path, out: &mut Vec<Reading>) {
    let first = out.len();
    let mut visited = 0;
    // (directory, depth, indices in `out` of the quota'd cgroups above it, itself included)
    let mut stack: Vec<(PathBuf, usize, Vec<usize>)> = vec![(root.to_path_buf(), 0, Vec::new())];
    while let Some((dir, depth, mut limited_by)) = stack.pop() {
        visited += 1;
        if visited > MAX_DIRS {
            tracing::debug!(root = %root.display(), "cgroup walk stopped at {MAX_DIRS} directories");
            break;
        }
        let quota = match version {
            Version::V1 => {
                let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
                read("cpu.cfs_quota_us").zip(read("cpu.cfs_period_us")).and_then(|(q, p)| parse_v1_quota(&q, &p))
            }
            // The root has no cpu.max: it is never limited.
            Version::V2 => std::fs::read_to_string(dir.join("cpu.max")).ok().and_then(|t| parse_cpu_max(&t)),
        };
        if let Some(quota) = quota
            && out.len() - first < MAX_CGROUPS
            && let Some(stat) = std::fs::read_to_string(dir.join("cpu.stat")).ok().and_then(|t| parse_cpu_stat(&t))
        {
            let rel = dir.strip_prefix(root).map_or(String::new(), |p| p.to_string_lossy().into_owned());
            out.push(Reading { version, path: format!("/{rel}"), quota, stat, pids: Vec::new(), ids: Vec::new() });
            limited_by.push(out.len() - 1);
        }
        if !limited_by.is_empty() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            let id = (version == Version::V2).then(|| std::fs::metadata(&dir).map(|m| m.ino()).ok()).flatten();
            for &i in &limited_by {
                let r = &mut out[i];
                r.ids.extend(id);
                for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    if r.pids.len() < MAX_PIDS {
                        r.pids.push(pid);
                    }
                }
            }
        }
        if depth >= MAX_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1, limited_by.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_cpu_stat_counts_periods_and_throttled_nanoseconds() {
        // A 6.x kernel's cgroup v1 cpu.stat (burst lines since 5.14).
        let text = "nr_periods 120\nnr_throttled 97\nthrottled_time 7812345678\nnr_bursts 0\nburst_time 0\n";
        assert_eq!(
            parse_cpu_stat(text),
            Some(CpuStat { nr_periods: 120, nr_throttled: 97, throttled_ns: 7_812_345_678 })
        );
    }

    #[test]
    fn v2_cpu_stat_counts_throttled_microseconds() {
        let text = "usage_usec 5023417\nuser_usec 5000000\nsystem_usec 23417\nnr_periods 51\nnr_throttled 40\n\
                    throttled_usec 3900123\nnr_bursts 0\nburst_usec 0\n";
        assert_eq!(
            parse_cpu_stat(text),
            Some(CpuStat { nr_periods: 51, nr_throttled: 40, throttled_ns: 3_900_123_000 })
        );
        // The root (or a cgroup without the cpu controller) has usage only: no throttling figures.
        assert_eq!(parse_cpu_stat("usage_usec 5\nuser_usec 3\nsystem_usec 2\n"), None);
        assert_eq!(parse_cpu_stat("nr_periods x\nnr_throttled 1\nthrottled_usec 1\n"), None);
    }

    #[test]
    fn quotas_v1_and_v2_and_their_absence() {
        assert_eq!(parse_v1_quota("20000\n", "100000\n"), Some(Quota { quota_us: 20_000, period_us: 100_000 }));
        assert_eq!(parse_v1_quota("-1\n", "100000\n"), None, "-1: no quota");
        assert_eq!(parse_v1_quota("20000", "0"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(Quota { quota_us: 50_000, period_us: 100_000 }));
        assert_eq!(parse_cpu_max("max 100000\n"), None, "max: no quota");
        assert_eq!(parse_cpu_max(""), None);
        assert!((parse_cpu_max("250000 100000").unwrap().cpus() - 2.5).abs() < 1e-9);
    }

    #[test]
    fn the_cpu_controller_is_found_in_v1_and_in_v2_only_where_enabled() {
        let mounts = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n\
                      cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n\
                      cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n\
                      cgroup2 /mnt/v2 cgroup2 rw 0 0\n";
        let found: Vec<_> = cpu_hierarchies(mounts, |p| p == Path::new("/mnt/v2")).into_iter().collect();
        assert_eq!(
            found,
            vec![(Version::V1, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")), (Version::V2, PathBuf::from("/mnt/v2"))]
        );
    }

    /// A v1 hierarchy laid out in a temporary directory: only cgroups with a quota are read,
    /// and each gets the pids of its descendants.
    #[test]
    fn the_walk_reports_quota_cgroups_with_their_descendants_pids() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cg = |rel: &str, quota: &str, procs: &str| {
            let d = root.join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpu.cfs_quota_us"), quota).unwrap();
            std::fs::write(d.join("cpu.cfs_period_us"), "100000\n").unwrap();
            std::fs::write(d.join("cpu.stat"), "nr_periods 10\nnr_throttled 4\nthrottled_time 5\n").unwrap();
            std::fs::write(d.join("cgroup.procs"), procs).unwrap();
        };
        cg("", "-1", "1\n2\n");
        cg("free", "-1", "10\n");
        cg("pod", "40000", "");
        cg("pod/c1", "-1", "20\n21\n");
        cg("pod/c2", "20000", "30\n");
        let mut out = Vec::new();
        scan(Version::V1, root, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        let summary: Vec<_> = out
            .iter()
            .map(|r| {
                let mut pids = r.pids.clone();
                pids.sort();
                (r.path.as_str(), r.quota.quota_us, pids)
            })
            .collect();
        assert_eq!(summary, vec![("/pod", 40_000, vec![20, 21, 30]), ("/pod/c2", 20_000, vec![30])]);
        assert_eq!(out[0].stat, CpuStat { nr_periods: 10, nr_throttled: 4, throttled_ns: 5 });
        assert!(out.iter().all(|r| r.ids.is_empty()), "v1 cgroups carry no v2 id");
    }
}
