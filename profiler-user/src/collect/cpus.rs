//! CPU hotplug: which CPUs to start and stop sampling, from the set sampled now and the set
//! online now (`/sys/devices/system/cpu/online`, re-read every few seconds by the daemon).

use std::collections::BTreeSet;

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
