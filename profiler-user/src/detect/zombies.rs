//! Detector 4: dying ("zombie") memory cgroups — removed, but still pinned by the page cache
//! charged to them — piling up, and who makes them. Counts come from /proc/cgroups and cgroupfs
//! every few seconds (`collect::memcg`); attribution from the cgroup_mkdir / rmdir / release tracepoints: a cgroup
//! removed and never released was made by the process that created it.

pub mod outlook;

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::json;

use super::{
    finding::{Active, Kind, Severity},
    thresholds::Thresholds,
};
use crate::collect::{
    CgroupEvent,
    memcg::{Hierarchy, MemcgCount, count, find_hierarchy},
};
use profiler_common::event;

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
    /// `memory.stat` read timings: (memory cgroups then, live and dying; CPU ns), the last hour.
    timings: VecDeque<(u64, u64)>,
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
        if let Some(ns) = c.stat_read_ns {
            self.timings.push_back((c.live + c.dying, ns));
            while self.timings.len() > 60 {
                self.timings.pop_front();
            }
        }
        if c.dying < t.zombie_min || (c.dying as f64) < t.zombie_ratio * c.live as f64 {
            self.onset_ns = None;
            return None;
        }
        let onset = *self.onset_ns.get_or_insert(now_ns);
        Some(self.active(c, onset, t.zombie_critical))
    }

    fn active(&self, c: MemcgCount, onset: u64, critical: u64) -> Active {
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
        let timings: Vec<(u64, u64)> = self.timings.iter().copied().collect();
        let outlook = outlook::outlook(&c, &self.series, &timings);
        summary.push_str(&outlook.describe());
        let first = self.series.iter().find(|s| s.ts_ns >= onset).copied().unwrap_or(c);
        Active {
            kind: Kind::ZombieMemcgs,
            cpu: None,
            subject: None,
            onset_ns: onset,
            severity: if c.dying >= critical { Severity::Critical } else { Severity::Warning },
            summary,
            evidence: json!({
                "dying": c.dying,
                "live": c.live,
                "dying_at_onset": first.dying,
                "attributed": attributed,
                "growth_per_minute": outlook.per_minute,
                "stat_read_ns_per_memcg": outlook.per_memcg_ns.map(|(ns, _)| ns),
                "stat_read_cost_method": outlook.per_memcg_ns.map(|(_, m)| format!("{m:?}").to_lowercase()),
                "core_saturated_at_dying": outlook.saturating_at,
                "minutes_to_core_saturated": outlook.minutes_left,
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

    #[test]
    fn the_finding_says_how_fast_zombies_grow_and_when_a_reader_would_need_a_core() {
        use crate::store::format::NS_PER_SEC;
        let (mut z, t) = (Zombies::default(), Thresholds::default());
        let c = |s: u64, dying: u64, read| MemcgCount { ts_ns: s * NS_PER_SEC, live: 100, dying, stat_read_ns: read };
        // One read of memory.stat over 2100 memory cgroups took 2.1 ms of CPU: 1 us each.
        z.evaluate_count(c(0, 2000, Some(2_100_000)), 0, &t).expect("2000 dying, 20x the live ones");
        let a = z.evaluate_count(c(60, 3000, None), 60 * NS_PER_SEC, &t).unwrap();
        assert!(
            a.summary.contains(
                "; growing 1000 a minute; a reader of memory.stat once a second would need a whole core at about \
                 1.0 million dying (in about 16 h 37 min at this rate; a read costs 1.00 us per memory cgroup here"
            ),
            "{}",
            a.summary
        );
        assert_eq!(a.evidence["growth_per_minute"], 1000.0);
        assert_eq!(a.evidence["core_saturated_at_dying"], 999_900);
        assert_eq!(a.evidence["stat_read_cost_method"], "average");
    }
}
