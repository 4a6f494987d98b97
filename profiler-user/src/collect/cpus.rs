//! CPU hotplug: which CPUs to start and stop sampling, from the set sampled now and the set
//! online now (`/sys/devices/system/cpu/online`, re-read every few seconds by the daemon).

use std::collections::{BTreeMap, BTreeSet};

/// CPUs to attach to (online, not sampled) and to let go of (sampled, no longer online).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Change {
    pub added: Vec<u32>,
    pub removed: Vec<u32>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

pub fn diff(sampled: impl IntoIterator<Item = u32>, online: &[u32]) -> Change {
    let sampled: BTreeSet<u32> = sampled.into_iter().collect();
    let online: BTreeSet<u32> = online.iter().copied().collect();
    Change {
        added: online.difference(&sampled).copied().collect(),
        removed: sampled.difference(&online).copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Whether this machine allows hotplug or not, the decision what to attach is tested here
    // without root; tests/tests/stages.rs takes a real CPU offline where the VM allows it.
    #[test]
    fn a_cpu_back_online_is_added_and_one_gone_is_removed() {
        assert!(diff([0, 1, 2], &[0, 1, 2]).is_empty());
        assert_eq!(diff([0, 2], &[0, 1, 2]), Change { added: vec![1], removed: vec![] });
        assert_eq!(diff([0, 1, 2], &[0, 2]), Change { added: vec![], removed: vec![1] });
        assert_eq!(diff([0, 1], &[0, 3]), Change { added: vec![3], removed: vec![1] });
        assert_eq!(diff([], &[0, 1]), Change { added: vec![0, 1], removed: vec![] });
    }
}

/// Per CPU: seconds spent not idle (user, nice, system, irq, softirq), cumulative since boot,
/// from `/proc/stat`. Steal time is left out (the vCPU was not running: no tick can fire) and
/// iowait is idle. `clk_tck`: `sysconf(_SC_CLK_TCK)`, the unit of `/proc/stat`.
pub fn busy_seconds(proc_stat: &str, clk_tck: f64) -> BTreeMap<u32, f64> {
    proc_stat
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse::<u32>().ok()?;
            let v: Vec<f64> = f.take(7).filter_map(|x| x.parse().ok()).collect();
            // user nice system idle iowait irq softirq
            (v.len() == 7).then(|| (cpu, (v[0] + v[1] + v[2] + v[5] + v[6]) / clk_tck.max(1.0)))
        })
        .collect()
}

/// [`busy_seconds`] of this machine now; empty when `/proc/stat` cannot be read.
pub fn read_busy_seconds() -> BTreeMap<u32, f64> {
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    std::fs::read_to_string("/proc/stat").map(|s| busy_seconds(&s, tck)).unwrap_or_default()
}

#[cfg(test)]
mod stat_tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_iowait_and_steal() {
        let stat = "cpu  10 0 0 0 0 0 0 0 0 0\n\
                    cpu0 100 5 20 900 50 3 2 40 0 0\n\
                    cpu1 0 0 0 1000 0 0 0 0 0 0\n\
                    intr 1 2 3\n";
        let got = busy_seconds(stat, 100.0);
        assert_eq!(got, BTreeMap::from([(0, 1.3), (1, 0.0)]));
    }
}
