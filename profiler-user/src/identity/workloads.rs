//! What the pipeline stores with each sample: the workload of its process as a string (the JSON
//! of its [`Identity`], empty when nothing is known), looked up per sample in a few nanoseconds.
//! A process is resolved when it is first seen or exec's, and again every few seconds while
//! it runs (names the kubelet writes after a container starts arrive then).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{Identity, Resolver};

/// How long a pid's answer is used before the resolver is asked again (it answers from its
/// cache, and fills in names that were not on disk yet).
const RECHECK: Duration = Duration::from_secs(5);
/// Pids and distinct identities remembered before the tables start over.
const MAX_ENTRIES: usize = 65_536;

pub struct Workloads {
    resolver: Resolver,
    by_pid: HashMap<u32, (Arc<str>, Instant)>,
    encoded: HashMap<Identity, Arc<str>>,
    empty: Arc<str>,
}

impl Workloads {
    pub fn new(resolver: Resolver) -> Self {
        Self { resolver, by_pid: HashMap::new(), encoded: HashMap::new(), empty: Arc::from("") }
    }

    /// The stored form of `pid`'s workload.
    pub fn of(&mut self, pid: u32, now: Instant) -> Arc<str> {
        if let Some((s, at)) = self.by_pid.get(&pid)
            && now.duration_since(*at) < RECHECK
        {
            return s.clone();
        }
        let identity = self.resolver.resolve(pid);
        let s = self.encode(identity);
        if self.by_pid.len() >= MAX_ENTRIES {
            self.by_pid.clear();
        }
        self.by_pid.insert(pid, (s.clone(), now));
        s
    }

    /// `pid` exec'd: it may be a new process under a reused number, or one that just entered
    /// its container. Resolved now, while `/proc/PID` still exists.
    pub fn exec(&mut self, pid: u32) {
        self.resolver.forget(pid);
        self.by_pid.remove(&pid);
        self.of(pid, Instant::now());
    }

    fn encode(&mut self, identity: Identity) -> Arc<str> {
        if identity == Identity::default() {
            return self.empty.clone();
        }
        if let Some(s) = self.encoded.get(&identity) {
            return s.clone();
        }
        if self.encoded.len() >= MAX_ENTRIES {
            self.encoded.clear();
        }
        let s: Arc<str> = Arc::from(encode(&identity));
        self.encoded.insert(identity, s.clone());
        s
    }
}

/// The stored form of an identity.
pub fn encode(identity: &Identity) -> String {
    serde_json::to_string(identity).expect("an identity serialises")
}

/// An identity read back from its stored form; `None` for the empty string or anything else.
pub fn decode(stored: &str) -> Option<Identity> {
    if !stored.starts_with('{') {
        return None;
    }
    serde_json::from_str(stored).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_identity_stores_the_empty_string_and_others_their_json() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        for (pid, cgroup) in [(10, "0::/system.slice/kubelet.service\n"), (11, "0::/\n")] {
            std::fs::create_dir_all(proc_root.join(pid.to_string())).unwrap();
            std::fs::write(proc_root.join(format!("{pid}/cgroup")), cgroup).unwrap();
        }
        let mut w = Workloads::new(Resolver::new(&proc_root, dir.path().join("c"), dir.path().join("p")));
        let kubelet = w.of(10, Instant::now());
        let id = decode(&kubelet).expect("json");
        assert_eq!(id.unit.as_deref(), Some("kubelet.service"));
        assert!(Arc::ptr_eq(&kubelet, &w.of(10, Instant::now())), "one string per identity");
        assert_eq!(&*w.of(11, Instant::now()), "");
        assert_eq!(&*w.of(12, Instant::now()), "", "a process that is gone");
        assert_eq!(decode(""), None);
        assert_eq!(decode("main"), None);
    }
}
