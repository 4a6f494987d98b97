//! Detector 4: dying ("zombie") memory cgroups — removed, but still pinned by the page cache
//! charged to them — piling up, and who makes them. Counts come from /proc/cgroups and cgroupfs
//! every few seconds; attribution from the cgroup_mkdir / rmdir / release tracepoints: a cgroup
//! removed and never released was made by the process that created it.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::json;

use super::{Active, Kind, Severity, Thresholds};
use crate::collect::CgroupEvent;
use profiler_common::event;

/// Dying and live memory cgroups at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemcgCount {
    pub ts_ns: u64,
    pub live: u64,
    pub dying: u64,
}

/// Where the memory controller lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hierarchy {
    V1 { id: i32, mount: String },
    V2 { mount: String },
}

fn find_hierarchy() -> Option<Hierarchy> {
    let cgroups = std::fs::read_to_string("/proc/cgroups").ok()?;
    let id: i32 = cgroups.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first() == Some(&"memory")).then(|| f.get(1)?.parse().ok())?
    })?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let mount_of = |fstype: &str, opt: Option<&str>| {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&fstype)
                && opt.is_none_or(|o| f.get(3).is_some_and(|opts| opts.split(',').any(|x| x == o))))
            .then(|| f[1].to_string())
        })
    };
    if id != 0 {
        Some(Hierarchy::V1 { id, mount: mount_of("cgroup", Some("memory"))? })
    } else {
        Some(Hierarchy::V2 { mount: mount_of("cgroup2", None)? })
    }
}

fn count_dirs(path: &std::path::Path) -> u64 {
    let mut n = 1;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                n += count_dirs(&e.path());
            }
        }
    }
    n
}

fn count(h: &Hierarchy, ts_ns: u64) -> Option<MemcgCount> {
    match h {
        Hierarchy::V1 { mount, .. } => {
            let cgroups = std::fs::read_to_string("/proc/cgroups").ok()?;
            let total: u64 = cgroups.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&"memory")).then(|| f.get(2)?.parse().ok())?
            })?;
            let live = count_dirs(std::path::Path::new(mount));
            Some(MemcgCount { ts_ns, live, dying: total.saturating_sub(live) })
        }
        Hierarchy::V2 { mount } => {
            let stat = std::fs::read_to_string(format!("{mount}/cgroup.stat")).ok()?;
            let get = |k: &str| stat.lines().find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok());
            Some(MemcgCount { ts_ns, live: get("nr_descendants ")? + 1, dying: get("nr_dying_descendants ")? })
        }
    }
}

/// Reads the memory cgroup counts (under v1 a walk of the whole hierarchy): the daemon's upkeep
/// stage calls it and hands the count to [`Zombies::evaluate_count`], so the walk never delays
/// the pipeline.
#[derive(Debug, Default)]
pub struct MemcgCounter {
    hierarchy: Option<Option<Hierarchy>>,
}

impl MemcgCounter {
    pub fn read(&mut self, ts_ns: u64) -> Option<MemcgCount> {
        count(self.hierarchy.get_or_insert_with(find_hierarchy).as_ref()?, ts_ns)
    }
}

/// Who made a cgroup, read from /proc when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Maker {
    comm: String,
    pid: u32,
    ppid: u32,
    parent_comm: String,
    unit: String,
}

fn maker(pid: u32, comm: &str) -> Maker {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    let parent_comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap_or_default().trim().to_string();
    // The systemd unit: the last .service/.scope component of the process's cgroup path.
    let unit = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .flat_map(|l| l.rsplit(':').next().unwrap_or("").split('/').map(str::to_string).collect::<Vec<_>>())
        .rfind(|c| c.ends_with(".service") || c.ends_with(".scope"))
        .unwrap_or_default();
    Maker { comm: comm.to_string(), pid, ppid, parent_comm, unit }
}

#[derive(Debug, Clone)]
struct Cgroup {
    path: String,
    maker: Maker,
    removed: bool,
}

/// Bound on the cgroups tracked (oldest removed ones are forgotten first).
const MAX_TRACKED: usize = 500_000;

#[derive(Debug, Default)]
pub struct Zombies {
    hierarchy: Option<Option<Hierarchy>>,
    cgroups: HashMap<u64, Cgroup>,
    order: VecDeque<u64>,
    /// The time series: one count per evaluation, the last hour.
    pub series: VecDeque<MemcgCount>,
    onset_ns: Option<u64>,
}

impl Zombies {
    fn hierarchy(&mut self) -> Option<&Hierarchy> {
        self.hierarchy.get_or_insert_with(find_hierarchy).as_ref()
    }

    /// A cgroup event from the tracepoints (`ts_ns` in unix time).
    pub fn on_event(&mut self, e: &CgroupEvent) {
        let root_ok = match self.hierarchy() {
            Some(Hierarchy::V1 { id, .. }) => e.root == *id,
            Some(Hierarchy::V2 { .. }) => true,
            None => false,
        };
        if !root_ok {
            return;
        }
        match e.kind {
            event::CGROUP_MKDIR => {
                if self.cgroups.len() >= MAX_TRACKED
                    && let Some(old) = self.order.pop_front()
                {
                    self.cgroups.remove(&old);
                }
                self.cgroups
                    .insert(e.id, Cgroup { path: e.path.clone(), maker: maker(e.pid, &e.comm), removed: false });
                self.order.push_back(e.id);
            }
            event::CGROUP_RMDIR => {
                if let Some(c) = self.cgroups.get_mut(&e.id) {
                    c.removed = true;
                }
            }
            event::CGROUP_RELEASE => {
                self.cgroups.remove(&e.id);
            }
            _ => {}
        }
        if self.order.len() > 2 * self.cgroups.len() + 1024 {
            let live = &self.cgroups;
            self.order.retain(|id| live.contains_key(id));
        }
    }

    /// Reads the counts, extends the series, and reports a finding while zombies pile up.
    pub fn evaluate(&mut self, now_ns: u64, t: &Thresholds) -> Option<Active> {
        let h = self.hierarchy()?.clone();
        let c = count(&h, now_ns)?;
        self.evaluate_count(c, now_ns, t)
    }

    /// As [`Self::evaluate`], with counts read elsewhere ([`MemcgCounter`]).
    pub fn evaluate_count(&mut self, c: MemcgCount, now_ns: u64, t: &Thresholds) -> Option<Active> {
        self.series.push_back(c);
        while self.series.len() > 720 {
            self.series.pop_front();
        }
        if c.dying < t.zombie_min || (c.dying as f64) < t.zombie_ratio * c.live as f64 {
            self.onset_ns = None;
            return None;
        }
        let onset = *self.onset_ns.get_or_insert(now_ns);
        Some(self.active(c, onset))
    }

    fn active(&self, c: MemcgCount, onset: u64) -> Active {
        // Zombies we saw being made: removed, never released; grouped by who made them.
        // (comm, unit) → (zombies, distinct pids, one maker, example paths)
        type Group = (u64, HashSet<u32>, Maker, Vec<String>);
        let mut groups: HashMap<(String, String), Group> = HashMap::new();
        for z in self.cgroups.values().filter(|z| z.removed) {
            let g = groups
                .entry((z.maker.comm.clone(), z.maker.unit.clone()))
                .or_insert_with(|| (0, HashSet::new(), z.maker.clone(), Vec::new()));
            g.0 += 1;
            g.1.insert(z.maker.pid);
            if g.3.len() < 3 {
                g.3.push(z.path.clone());
            }
        }
        let mut groups: Vec<_> = groups.into_values().collect();
        groups.sort_by_key(|g| std::cmp::Reverse(g.0));
        let attributed: u64 = groups.iter().map(|g| g.0).sum();
        let mut summary = format!(
            "{} dying memory cgroups ({:.0}x the {} live ones)",
            c.dying,
            c.dying as f64 / c.live.max(1) as f64,
            c.live
        );
        match groups.first() {
            Some((n, pids, m, _)) => {
                summary.push_str(&format!(
                    ": {n} made by {} (pid {}, parent {} pid {}{}) and removed but never freed",
                    m.comm,
                    m.pid,
                    if m.parent_comm.is_empty() { "?" } else { &m.parent_comm },
                    m.ppid,
                    if m.unit.is_empty() { String::new() } else { format!(", unit {}", m.unit) }
                ));
                if pids.len() >= 5 {
                    summary.push_str(&format!(
                        "; {} different pids of {} made them: looks like a restart loop",
                        pids.len(),
                        m.comm
                    ));
                }
            }
            None => summary.push_str(": made before the profiler started (no maker seen)"),
        }
        let first = self.series.iter().find(|s| s.ts_ns >= onset).copied().unwrap_or(c);
        Active {
            kind: Kind::ZombieMemcgs,
            cpu: None,
            subject: None,
            onset_ns: onset,
            severity: if c.dying >= 10_000 { Severity::Critical } else { Severity::Warning },
            summary,
            evidence: json!({
                "dying": c.dying,
                "live": c.live,
                "dying_at_onset": first.dying,
                "attributed": attributed,
                "makers": groups.iter().take(5).map(|(n, pids, m, paths)| json!({
                    "comm": m.comm, "pid": m.pid, "ppid": m.ppid, "parent_comm": m.parent_comm,
                    "unit": m.unit, "zombies": n, "distinct_pids": pids.len(), "example_paths": paths,
                })).collect::<Vec<_>>(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cgroup v2 counts come from the root's `cgroup.stat` (the incident's node: 240 live memory
    /// cgroups, 70,000 dying).
    #[test]
    fn v2_counts_live_and_dying_from_cgroup_stat() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.stat"), "nr_descendants 239\nnr_dying_descendants 70000\n").unwrap();
        let h = Hierarchy::V2 { mount: dir.path().to_str().unwrap().to_string() };
        assert_eq!(count(&h, 7), Some(MemcgCount { ts_ns: 7, live: 240, dying: 70_000 }));
        std::fs::write(dir.path().join("cgroup.stat"), "nr_descendants x\n").unwrap();
        assert_eq!(count(&h, 7), None, "an unreadable count is no count, not zero");
    }
}
