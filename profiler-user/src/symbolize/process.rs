//! A process the symbolizer knows: its executable mappings, which image of its pid it is, its
//! perf map as read so far; how one is built (its maps read afresh, or seeded from its parent's
//! at a fork, see `lifecycle`) and when it is read again (a new program under its pid).

use std::{path::PathBuf, sync::Arc, time::Instant};

use super::{
    Symbolizer,
    maps::{self, Mapping},
    perfmap,
};

pub(super) struct Process {
    /// Thread names seen in this process (a comm is per thread: a new one is not an exec).
    pub(super) comms: Vec<Arc<str>>,
    /// Target of /proc/PID/exe when the maps were read: it changes when the process execs.
    pub(super) exe: Option<std::path::PathBuf>,
    pub(super) maps: Vec<Mapping>,
    pub(super) read_at: Instant,
    /// The last read of its maps hit a bound: re-read after `MAPS_REFRESH_OVER_BOUND`.
    pub(super) over_bound: bool,
    /// The maps were read as it exec'd, before the loader mapped its libraries: the first
    /// address outside them re-reads them at once (waiting `MAPS_REFRESH` left a stripped
    /// program's first third of a second with `[unknown]` for libc).
    pub(super) read_at_exec: bool,
    pub(super) seen_at: Instant,
    /// When the sweep last looked at it (see `IDLE_RECHECK`).
    pub(super) checked_at: Instant,
    /// Which image of this pid this is (a serial, never reused): the stack cache's key, so a
    /// new program under the same pid never meets the stacks of the old one.
    pub(super) image: u64,
    /// Its perf map as read so far, and when it was last read (see `jit_frame`).
    pub(super) perf_map: perfmap::PerfMap,
    pub(super) perf_map_read_at: Option<Instant>,
    /// When the kernel said it ended (boot-time ns; see `lifecycle`): a sample taken later is
    /// another process's.
    pub(super) exited_ns: Option<u64>,
}

impl Symbolizer {
    /// A new image of a process whose maps were read `now` (its own, or its parent's at a
    /// fork): a serial of its own, so the stacks cached for the pid's earlier image are never
    /// its; no perf map read yet; not exited.
    pub(super) fn new_process(
        &mut self,
        comms: Vec<Arc<str>>,
        exe: Option<PathBuf>,
        read: maps::Read,
        now: Instant,
    ) -> Process {
        self.images += 1;
        Process {
            comms,
            exe,
            maps: read.maps,
            read_at: now,
            over_bound: read.truncated,
            read_at_exec: false,
            seen_at: now,
            checked_at: now,
            image: self.images,
            perf_map: perfmap::PerfMap::default(),
            perf_map_read_at: None,
            exited_ns: None,
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
            self.load_process(pid, comm, now);
        }
    }

    /// Reads a process's mappings afresh (new, or it exec'd).
    pub(super) fn load_process(&mut self, pid: u32, comm: &str, now: Instant) {
        self.new_image(pid);
        let comm = self.intern(comm);
        let read = self.read_maps(pid, None);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let process = self.new_process(vec![comm], exe, read, now);
        // The stacks cached for an image this replaces are unreachable now (their key has the
        // old image) and go at the next sweep.
        self.image_replaced |= self.processes.insert(pid, process).is_some();
    }

    pub(super) fn read_maps(&mut self, pid: u32, wanted: Option<u64>) -> maps::Read {
        self.stats.maps_reads += 1;
        maps::read(pid, wanted)
    }
}
