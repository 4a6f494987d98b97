//! Which process a pid is: fork and exit, from the kernel's `PROCESS_FORK` and `PROCESS_EXIT`
//! events. A comm and an executable do not tell two processes apart: a pid is reused (every few
//! minutes under churn), and a child that forks without exec has its parent's comm and
//! executable, so the mappings cached for the pid's previous process would name its frames.
//!
//! Events are handled ahead of the samples queued before them (the daemon does so, so that an
//! exec is seen while the process lives), so an exit usually arrives before the last samples of
//! the process that exited. Each sample is therefore placed by its time (the kernel's boot-time
//! clock, the same as the events'): a sample taken after the exit of the process cached for its
//! pid belongs to a new process, one taken before it still resolves with the old mappings, which
//! are forgotten once the samples have moved `EXIT_LINGER_NS` past the exit.
//!
//! A child starts with its parent's mappings: they are copied from the parent's cache when the
//! child's first sample is met (not at the fork: most children exec at once, and the exec reads
//! their own), and marked unverified, so that the first address outside them re-reads the
//! child's own maps at once. A copy costs no `/proc` read, and it names a short-lived fork-only
//! worker whose `/proc/PID` is already gone when its samples are read.
//!
//! Besides the exec event (`note_exec`), a sample says the process exec'd when it comes under a
//! comm none of the pid's threads had and `/proc/PID/exe` leads elsewhere: its maps are read
//! afresh (`note_process`), as for a pid not cached.

use std::{sync::Arc, time::Instant};

use super::{Process, Symbolizer, maps};

/// Samples of an exited process still in the queue resolve until the samples read have moved
/// this far past its exit (one ring buffer, filled in time order by every CPU: its late samples
/// are close behind the exit).
pub(super) const EXIT_LINGER_NS: u64 = 1_000_000_000;
/// A fork whose child has not been sampled by then (in sample time) is forgotten: most
/// children exec at once, and the exec reads their mappings.
const FORK_PENDING_NS: u64 = 10_000_000_000;
/// Most forks remembered at once (a build machine forks thousands of processes a second).
const MAX_FORKS: usize = 65_536;

/// A process created and not yet sampled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fork {
    parent: u32,
    at_ns: u64,
    /// It exited before its first sample was read.
    exited_ns: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    /// Newest sample time seen (boot-time ns).
    clock_ns: u64,
    /// Child pid → its fork.
    forks: std::collections::HashMap<u32, Fork>,
    /// Exits of cached processes, oldest first: (exit time, pid, image).
    exits: std::collections::VecDeque<(u64, u32, u64)>,
    /// Pids forgotten since the last sweep, whose Python names the sweep drops (one pass over
    /// them for all, not one per exit), or a new process under the pid at once.
    python_stale: std::collections::HashSet<u32>,
}

impl Symbolizer {
    /// `parent` created the process `child` at `at_ns` (boot time).
    pub fn note_fork(&mut self, parent: u32, child: u32, at_ns: u64) {
        // A live process cannot have this pid: whatever is cached for it ended by now (its exit
        // event was lost, or is still behind).
        self.mark_exited(child, at_ns);
        let forks = &mut self.lifecycle.forks;
        if forks.len() >= MAX_FORKS {
            let clock = self.lifecycle.clock_ns;
            forks.retain(|_, f| f.at_ns + FORK_PENDING_NS > clock);
            if forks.len() >= MAX_FORKS {
                forks.clear();
            }
        }
        forks.insert(child, Fork { parent, at_ns, exited_ns: None });
    }

    /// The process `pid` ended at `at_ns` (boot time).
    pub fn note_exit(&mut self, pid: u32, at_ns: u64) {
        if let Some(f) = self.lifecycle.forks.get_mut(&pid) {
            f.exited_ns = Some(at_ns);
        }
        self.mark_exited(pid, at_ns);
    }

    /// Places a sample of `pid` taken at `ts_ns` (boot time), before it is symbolized. True when
    /// it is the first sample of a process other than the one cached for the pid: per-pid state
    /// elsewhere (workload, unwind tables) belongs to the old one.
    pub fn at_sample(&mut self, pid: u32, ts_ns: u64) -> bool {
        self.advance(ts_ns);
        let mut replaced = false;
        if self.processes.get(&pid).and_then(|p| p.exited_ns).is_some_and(|e| ts_ns > e) {
            self.forget_process(pid);
            replaced = true;
        }
        if !self.processes.contains_key(&pid)
            && let Some(fork) = self.lifecycle.forks.get(&pid).copied()
            && ts_ns >= fork.at_ns
        {
            self.lifecycle.forks.remove(&pid);
            self.seed_from_parent(pid, fork);
            replaced = true;
        }
        replaced
    }

    /// Moves the sample clock (every sample, idle ones included), forgetting the processes
    /// whose exit it has passed by `EXIT_LINGER_NS`.
    pub fn advance(&mut self, ts_ns: u64) {
        let clock = self.lifecycle.clock_ns.max(ts_ns);
        self.lifecycle.clock_ns = clock;
        while let Some(&(at, pid, image)) = self.lifecycle.exits.front() {
            if at.saturating_add(EXIT_LINGER_NS) > clock {
                break;
            }
            self.lifecycle.exits.pop_front();
            if self.processes.get(&pid).is_some_and(|p| p.image == image && p.exited_ns.is_some()) {
                self.forget_process(pid);
            }
        }
    }

    fn mark_exited(&mut self, pid: u32, at_ns: u64) {
        let Some(p) = self.processes.get_mut(&pid) else { return };
        if p.exited_ns.is_some() {
            return;
        }
        p.exited_ns = Some(at_ns);
        self.lifecycle.exits.push_back((at_ns, pid, p.image));
    }

    fn forget_process(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_some() {
            tracing::debug!(pid, "process exited: its cached mappings are forgotten");
            self.stats.processes_exited += 1;
            // Its stacks, modules and perf map go at the next sweep's collection.
            self.image_replaced = true;
            self.lifecycle.python_stale.insert(pid);
        }
    }

    /// A sample of `pid` under `comm`: a process not cached, or one that exec'd (a comm its
    /// threads never had, and another program), has its mappings read afresh.
    pub(super) fn note_process(&mut self, pid: u32, comm: &str, now: Instant) {
        let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let exec = match self.processes.get_mut(&pid) {
            Some(p) => {
                p.seen_at = now;
                if p.comms.iter().any(|c| &**c == comm) {
                    false
                } else if exe(pid) == p.exe {
                    // Another thread's name, same program: remember it, nothing to re-read.
                    if p.comms.len() < 64 {
                        let c = Arc::from(comm);
                        p.comms.push(c);
                    }
                    false
                } else {
                    true
                }
            }
            None => true,
        };
        if exec {
            // Read as the exec event would have (it may come later, or have been lost).
            self.load_process(pid, comm, now);
            if let Some(p) = self.processes.get_mut(&pid) {
                p.read_at_exec = true;
            }
        }
    }

    /// Reads a process's mappings afresh (new, or it exec'd).
    pub(super) fn load_process(&mut self, pid: u32, comm: &str, now: Instant) {
        self.new_image(pid);
        let comm = self.intern(comm);
        let read = self.read_maps(pid, None);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let process = Process::new(self.next_image(), vec![comm], exe, read, now);
        // The stacks cached for an image this replaces are unreachable now (their key has the
        // old image) and go at the next sweep.
        self.image_replaced |= self.processes.insert(pid, process).is_some();
    }

    /// A serial for a new process image, never reused: the stack cache's key, so a new program
    /// under the same pid never meets the stacks of the old one.
    pub(super) fn next_image(&mut self) -> u64 {
        self.images += 1;
        self.images
    }

    /// A new process image under `pid`: Python names read for a process that had the pid
    /// before must not name its frames (code objects can sit at the same addresses).
    pub(super) fn new_image(&mut self, pid: u32) {
        if self.lifecycle.python_stale.remove(&pid) {
            self.python.retain(|p| p != pid);
        }
    }

    /// Pids whose Python names the sweep drops (see `python_stale`).
    pub(super) fn take_python_stale(&mut self) -> std::collections::HashSet<u32> {
        std::mem::take(&mut self.lifecycle.python_stale)
    }

    /// The child's cache entry, from its parent's as it is now (unverified: see the module
    /// comment); without a cached parent, the child's maps are read at its first address.
    fn seed_from_parent(&mut self, child: u32, fork: Fork) {
        let Some(parent) = self.processes.get(&fork.parent) else { return };
        let (comms, exe) = (parent.comms.clone(), parent.exe.clone());
        let read = maps::Read { maps: parent.maps.clone(), truncated: parent.over_bound };
        let seeded =
            Process { read_at_exec: true, ..Process::new(self.next_image(), comms, exe, read, Instant::now()) };
        self.new_image(child);
        self.processes.insert(child, seeded);
        if let Some(e) = fork.exited_ns {
            self.mark_exited(child, e);
        }
    }

    /// Forgets forks whose child was never sampled (see `FORK_PENDING_NS`).
    pub(super) fn sweep_forks(&mut self) {
        let clock = self.lifecycle.clock_ns;
        self.lifecycle.forks.retain(|_, f| f.at_ns + FORK_PENDING_NS > clock);
    }

    /// An exec replaced the process image under `pid`: no fork record applies any more.
    pub(super) fn exec_replaces_fork(&mut self, pid: u32) {
        self.lifecycle.forks.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::symbolize::{UNKNOWN, maps::Mapping};

    /// Pids no process has (above the kernel's limit of 2^22): their `/proc` is empty, so what
    /// names their frames is what the cache holds.
    const OLD: u32 = 5_000_001;
    const PARENT: u32 = 5_000_002;
    const CHILD: u32 = 5_000_003;
    const ADDR: u64 = 0x1800;

    /// Caches `pid` with one mapping at 0x1000..0x2000 named `name` (a `[name]` pseudo-file).
    fn cache(s: &mut Symbolizer, pid: u32, name: &str) {
        let m = Mapping { start: 0x1000, end: 0x2000, offset: 0, dev: 0, inode: 0, path: Arc::from(name) };
        let read = maps::Read { maps: vec![m], truncated: false };
        let p = Process::new(s.next_image(), vec![Arc::from("same")], None, read, Instant::now());
        s.processes.insert(pid, p);
    }

    fn leaf(s: &mut Symbolizer, pid: u32, ts_ns: u64) -> String {
        s.at_sample(pid, ts_ns);
        s.stack(pid, "same", &[], &[ADDR]).frames[0].to_string()
    }

    #[test]
    fn a_sample_after_the_exit_is_another_process() {
        let mut s = Symbolizer::new();
        cache(&mut s, OLD, "[old]");
        assert_eq!(leaf(&mut s, OLD, 10), "[old]");
        s.note_exit(OLD, 100);
        // A late sample of the process that exited still resolves with its mappings...
        assert_eq!(leaf(&mut s, OLD, 90), "[old]");
        // ... one taken after the exit is a new process, same comm and all: its own maps.
        assert!(s.at_sample(OLD, 101));
        assert_eq!(&*s.stack(OLD, "same", &[], &[ADDR]).frames[0], UNKNOWN);
        assert_eq!(s.stats().processes_exited, 1);
    }

    #[test]
    fn an_exited_process_is_forgotten_once_the_samples_pass_its_exit() {
        let mut s = Symbolizer::new();
        cache(&mut s, OLD, "[old]");
        cache(&mut s, PARENT, "[other]");
        s.note_exit(OLD, 1_000);
        s.advance(1_000 + EXIT_LINGER_NS - 1);
        assert_eq!(s.stats().processes, 2, "kept while its late samples may come");
        s.advance(1_000 + EXIT_LINGER_NS);
        assert_eq!(s.stats().processes, 1);
        assert!(!s.processes.contains_key(&OLD) && s.processes.contains_key(&PARENT));
        assert_eq!(s.stats().processes_exited, 1);
        // Nothing left to forget twice; a second exit of the pid (a new process never sampled)
        // changes nothing.
        s.note_exit(OLD, 5_000_000_000);
        s.advance(u64::MAX);
        assert_eq!(s.stats().processes_exited, 1);
    }

    #[test]
    fn only_the_kernel_saying_so_ends_a_process() {
        // No event: the same pid, comm and (no) executable is the same process for the cache,
        // which is what a reused pid looked like before fork and exit were tracked.
        let mut s = Symbolizer::new();
        cache(&mut s, OLD, "[old]");
        s.advance(u64::MAX / 2);
        assert!(!s.at_sample(OLD, u64::MAX / 2));
        assert_eq!(leaf(&mut s, OLD, u64::MAX / 2), "[old]");
    }

    #[test]
    fn a_fork_child_starts_with_its_parents_mappings() {
        let mut s = Symbolizer::new();
        cache(&mut s, PARENT, "[parent]");
        s.note_fork(PARENT, CHILD, 200);
        // The child's /proc is gone (it lived milliseconds): named from its parent's mappings.
        assert!(s.at_sample(CHILD, 250));
        assert_eq!(&*s.stack(CHILD, "same", &[], &[ADDR]).frames[0], "[parent]");
        let (parent, child) = (&s.processes[&PARENT], &s.processes[&CHILD]);
        assert_ne!(parent.image, child.image, "its own image: stacks are cached per process");
        assert!(child.read_at_exec, "the first address outside them re-reads the child's own maps");
        // The fork is used once.
        assert!(!s.at_sample(CHILD, 300));
    }

    #[test]
    fn a_fork_under_a_cached_pid_ends_the_process_cached_there() {
        // The exit event was lost (or is still behind): the fork alone says the pid is new.
        let mut s = Symbolizer::new();
        cache(&mut s, OLD, "[old]");
        cache(&mut s, PARENT, "[parent]");
        s.note_fork(PARENT, OLD, 300);
        assert_eq!(leaf(&mut s, OLD, 299), "[old]");
        assert_eq!(leaf(&mut s, OLD, 301), "[parent]");
    }

    #[test]
    fn a_child_that_exited_before_its_first_sample_keeps_its_exit() {
        let mut s = Symbolizer::new();
        cache(&mut s, PARENT, "[parent]");
        s.note_fork(PARENT, CHILD, 200);
        s.note_exit(CHILD, 400);
        assert_eq!(leaf(&mut s, CHILD, 300), "[parent]");
        s.advance(400 + EXIT_LINGER_NS);
        assert!(!s.processes.contains_key(&CHILD));
    }

    #[test]
    fn an_exec_wins_over_the_fork() {
        let mut s = Symbolizer::new();
        cache(&mut s, PARENT, "[parent]");
        s.note_fork(PARENT, CHILD, 200);
        s.note_exec(CHILD, "other");
        assert!(!s.at_sample(CHILD, 300));
        assert_eq!(&*s.stack(CHILD, "other", &[], &[ADDR]).frames[0], UNKNOWN);
    }

    #[test]
    fn forks_never_sampled_are_bounded() {
        let mut s = Symbolizer::new();
        for child in 0..(MAX_FORKS as u32 + 100) {
            s.note_fork(1, 10_000_000 + child, u64::from(child));
        }
        assert!(s.lifecycle.forks.len() <= MAX_FORKS);
        s.advance(u64::from(MAX_FORKS as u32) + 100 + FORK_PENDING_NS);
        s.sweep_forks();
        assert!(s.lifecycle.forks.is_empty());
    }
}
