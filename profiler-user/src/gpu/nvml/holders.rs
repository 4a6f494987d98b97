//! Who holds each GPU: NVML gives pids; the identity module (`identity::Resolver`: the cgroup,
//! the kubelet's log directories) gives their pod, namespace and container, and `/proc` their
//! command. Named on every poll from caches (a new pid is read once), so the per-process gauges
//! of `/metrics` and the processes `profiler status` lists say which workload holds a GPU.
//!
//! Bounded: at most [`super::MAX_HOLDERS`] pids a GPU are named, and the command cache
//! keeps only the pids holding a GPU now (the resolver bounds its own).

use std::{collections::HashMap, path::Path, sync::Arc};

use crate::{
    gpu_readings::{Reading, inventory::Process},
    identity::{Identity, Resolver},
};

pub struct Namer {
    resolver: Resolver,
    /// Per pid holding a GPU: its command and what the resolver last said of it.
    names: HashMap<u32, (Arc<str>, Identity)>,
    proc_root: std::path::PathBuf,
}

impl Namer {
    /// Names from the host's `/proc` and the kubelet's log directory (`--kubelet-logs`).
    pub fn new(kubelet_logs: &Path) -> Self {
        Self::with_roots(Path::new("/proc"), kubelet_logs)
    }

    pub fn with_roots(proc_root: &Path, kubelet_logs: &Path) -> Self {
        Self {
            resolver: Resolver::new(proc_root, kubelet_logs.join("containers"), kubelet_logs.join("pods")),
            names: HashMap::new(),
            proc_root: proc_root.to_path_buf(),
        }
    }

    /// Fills in each holder's command and identity. `fresh` (the poller's first poll of a
    /// second, which read the holders) asks the resolver again (a pod named late); the polls
    /// between repeat what it said, from memory.
    pub fn name(&mut self, readings: &mut [Reading], fresh: bool) {
        let mut now: Vec<u32> = Vec::new();
        for h in readings.iter_mut().filter_map(|r| r.holders.as_mut()).flatten() {
            let root = &self.proc_root;
            let resolver = &mut self.resolver;
            let named = self.names.entry(h.pid).or_insert_with(|| {
                let text = std::fs::read_to_string(root.join(h.pid.to_string()).join("comm")).unwrap_or_default();
                (Arc::from(text.trim_end()), resolver.resolve(h.pid))
            });
            if fresh {
                named.1 = resolver.resolve(h.pid);
            }
            h.comm = Some(named.0.clone());
            h.identity = Some(named.1.clone());
            now.push(h.pid);
        }
        // Pids no GPU holds any more: their numbers may come back as other processes.
        if self.names.len() > now.len() {
            self.names.retain(|pid, _| now.contains(pid));
        }
    }

    /// The processes of each GPU in `readings`, for the inventory (`gpus.json`).
    pub fn processes(readings: &[Reading]) -> Vec<(u32, Vec<Process>)> {
        readings
            .iter()
            .map(|r| {
                let procs = r.holders.iter().flatten().map(|h| Process {
                    pid: h.pid,
                    comm: h.comm.as_deref().unwrap_or_default().to_string(),
                    identity: h.identity.clone().unwrap_or_default(),
                });
                (r.index, procs.collect())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_readings::Holder;

    #[test]
    fn holders_get_their_command_and_an_unknown_pid_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("proc/812");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), "python3\n").unwrap();
        std::fs::write(p.join("cgroup"), "0::/user.slice/user-0.slice/session-3.scope\n").unwrap();
        let mut namer = Namer::with_roots(&dir.path().join("proc"), &dir.path().join("logs"));
        let holder = |pid| Holder { pid, mem_mib: None, sm_util: None, comm: None, identity: None };
        let mut readings = [Reading { index: 0, holders: Some(vec![holder(812), holder(999)]), ..Default::default() }];
        namer.name(&mut readings, true);
        let procs = Namer::processes(&readings);
        assert_eq!(procs[0].0, 0);
        assert_eq!(procs[0].1[0].describe(), "812 python3 (unit session-3.scope)");
        assert_eq!(procs[0].1[1].describe(), "999 (exited)");
    }
}
