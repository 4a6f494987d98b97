//! What the processes a GPU's holders started (a DataLoader's workers) asked of the CPUs, for
//! `gpu-starved` (issue 41, part 7).
//!
//! Why not their samples alone: workers competing for the CPUs (two of them with a build on a
//! 2-CPU node) each get a third of a core, and their samples say "a third busy" while the GPU
//! idles for want of them. What each asked (ran plus waited runnable, `GpuSecond::demand`, read
//! for the holders' launcher already) says they wanted whole cores and were not given them.

use crate::gpu_readings::{GpuSecond, ThreadDemand};

/// The workers that asked for a core this second: each one's busiest thread asked at least
/// `busy` of one (ran plus waited).
pub fn asking(g: &GpuSecond, busy: f64) -> Vec<ThreadDemand> {
    let worker = |d: &&ThreadDemand| !g.holders.contains(&d.pid) && g.descendants.binary_search(&d.pid).is_ok();
    g.demand.iter().filter(worker).filter(|d| d.asked() >= busy).copied().collect()
}

/// The asking workers over a run: per second the sums of their shares run and waited, and
/// how many asked.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sums {
    seconds: u64,
    workers: u64,
    ran: f64,
    waited: f64,
}

impl Sums {
    pub fn add(&mut self, asking: &[ThreadDemand]) {
        if asking.is_empty() {
            return;
        }
        self.seconds += 1;
        self.workers += asking.len() as u64;
        self.ran += asking.iter().map(|d| d.ran).sum::<f64>();
        self.waited += asking.iter().map(|d| d.waited).sum::<f64>();
    }

    /// Mean a second: (workers asking, cores asked, cores given), over the seconds that had some.
    pub fn means(&self) -> Option<(f64, f64, f64)> {
        let n = self.seconds as f64;
        (self.seconds > 0).then(|| (self.workers as f64 / n, (self.ran + self.waited) / n, self.ran / n))
    }

    /// `; 2 workers asked for 1.9 cores and were given 0.7 (they waited for a CPU the rest):
    /// the CPUs are shared`, or nothing when no worker asked for a core.
    pub fn text(&self) -> String {
        match self.means() {
            Some((n, asked, given)) if asked > given + 0.1 => format!(
                "; {n:.0} worker(s) asked for {asked:.1} cores and were given {given:.1} (they waited for a CPU \
                 the rest): the CPUs are shared, give the workers their own"
            ),
            Some((n, asked, _)) => format!("; {n:.0} worker(s) asked for {asked:.1} cores"),
            None => String::new(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        match self.means() {
            Some((n, asked, given)) => {
                serde_json::json!({"workers": n, "cores_asked": asked, "cores_given": given, "seconds": self.seconds})
            }
            None => serde_json::Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holders_workers_asking_for_a_core_count() {
        let d = |pid, ran, waited| ThreadDemand { pid, tid: pid, ran, waited };
        let g = GpuSecond {
            holders: vec![812],
            descendants: vec![901, 902, 903],
            demand: vec![d(812, 0.1, 0.0), d(901, 0.33, 0.62), d(902, 0.36, 0.6), d(903, 0.2, 0.0), d(777, 1.0, 0.0)],
            ..Default::default()
        };
        let a = asking(&g, 0.9);
        assert_eq!(a.iter().map(|d| d.pid).collect::<Vec<_>>(), [901, 902]);
        let mut s = Sums::default();
        s.add(&a);
        s.add(&[]);
        let (n, asked, given) = s.means().unwrap();
        assert_eq!(n, 2.0);
        assert!((asked - 1.91).abs() < 1e-9 && (given - 0.69).abs() < 1e-9, "{asked} {given}");
        assert!(s.text().contains("2 worker(s) asked for 1.9 cores and were given 0.7"), "{}", s.text());
    }
}
