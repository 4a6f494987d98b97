//! What /metrics shows of the detectors, read from the engine in one piece (the daemon's
//! stage publishes it with the pipeline's figures on every flush tick).

use std::collections::BTreeMap;

use super::{Engine, Labels};

/// The detectors' figures at one moment.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Per CPU: busy share in the last evaluated second.
    pub busy_share: BTreeMap<u32, f64>,
    /// Dying memory cgroups at the last count (`None`: not counted yet, or unreadable).
    pub dying_memcgs: Option<u64>,
    /// Open findings by kind name.
    pub open_findings: BTreeMap<String, u64>,
    /// Each open finding's labels.
    pub finding_labels: Vec<Labels>,
}

impl Engine {
    pub fn figures(&self) -> Figures {
        Figures {
            busy_share: self.last_busy_shares().into_iter().collect(),
            dying_memcgs: self.zombies.series.back().map(|c| c.dying),
            open_findings: self.open_counts(),
            finding_labels: self.open_labels(),
        }
    }

    /// Busy share per CPU in the last evaluated second.
    fn last_busy_shares(&self) -> Vec<(u32, f64)> {
        let Some(s) = self.history.back() else { return Vec::new() };
        let f = self.machine.frequency_hz.max(1) as f64;
        s.cpus.iter().enumerate().map(|(cpu, c)| (cpu as u32, (c.busy.len() as f64 / f).min(1.0))).collect()
    }

    /// Open findings by kind name.
    pub fn open_counts(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (kind, _, _) in self.open.keys() {
            *m.entry(kind.name().to_string()).or_default() += 1;
        }
        m
    }

    /// Open findings' metric labels.
    fn open_labels(&self) -> Vec<Labels> {
        self.open
            .values()
            .map(|o| Labels {
                kind: o.finding.kind,
                cpu: o.finding.cpu,
                pod: o.finding.pod(),
                severity: o.finding.severity,
            })
            .collect()
    }
}
