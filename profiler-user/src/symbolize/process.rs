//! A process the symbolizer knows: its executable mappings, which image of its pid it is, its
//! perf map as read so far, built in one place whether its maps were read afresh or seeded from
//! its parent's at a fork (`lifecycle` says which process a pid is, and when).

use std::{path::PathBuf, sync::Arc, time::Instant};

use super::{
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
    /// Re-reads made for `read_at_exec` that did not find their address (a frame the walk
    /// made up, before the loader mapped what the next frames need): the flag lasts for
    /// [`super::EXEC_REREADS`] of them within [`super::EXEC_SETTLE`] of `loaded_at`.
    pub(super) exec_rereads: u8,
    /// When this image's maps were first read.
    pub(super) loaded_at: Instant,
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

impl Process {
    /// Image `image` of a process whose maps were read `now` (its own, or its parent's at a
    /// fork): no perf map read yet; not exited.
    pub(super) fn new(image: u64, comms: Vec<Arc<str>>, exe: Option<PathBuf>, read: maps::Read, now: Instant) -> Self {
        Self {
            comms,
            exe,
            maps: read.maps,
            read_at: now,
            over_bound: read.truncated,
            read_at_exec: false,
            exec_rereads: 0,
            loaded_at: now,
            seen_at: now,
            checked_at: now,
            image,
            perf_map: perfmap::PerfMap::default(),
            perf_map_read_at: None,
            exited_ns: None,
        }
    }
}
