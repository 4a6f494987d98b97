//! Finding the processes that map a CUDA library: a process's maps are read when its size
//! changed (at most every `MAPS_EVERY`), its driver taken under the file's probes, refused, or
//! left waiting for a slot; its runtime probed beside it, or before it (`early`: PyTorch maps the
//! runtime at `import torch`, the driver only when CUDA starts, right before the first launches
//! and their kernels' look-ups).

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    time::Instant,
};

use super::{FILES_MAX, File, MAPS_EVERY, Proc, RUNTIME_EVERY, Recorder, Refused, WAITING_MAX, guard, library};
use library::FileId;

impl Recorder {
    /// `pid` no longer waits for its driver with its runtime probed (gone, or now a process of
    /// its own, whose runtime is its `Proc`'s).
    pub(super) fn forget_early(&mut self, pid: u32) {
        if self.early.remove(&pid).is_some() {
            for f in self.files.values_mut().filter(|f| f.role == library::Role::Runtime) {
                f.pids.remove(&pid);
            }
        }
    }

    /// Reads the maps of `pid` if its size changed since the last look; true when it maps an
    /// accepted driver library (newly). A process probed without its runtime is looked at
    /// again for it, at most every [`RUNTIME_EVERY`].
    pub(super) fn look_at(&mut self, pid: u32) -> bool {
        // Never the daemon itself: its unwind-table builder maps a root-owned library it reads
        // for a sampled process (`unwind::trusted_map`), so its own maps can list that
        // `libcuda.so.1` for a while, and it was counted as one more process mapping the file.
        if pid == 0 || pid == self.own_pid || self.refused_by_pid.contains_key(&pid) || self.waiting.contains_key(&pid)
        {
            return false;
        }
        if let Some(p) = self.procs.get(&pid)
            && (p.runtime.is_some() || p.runtime_looked.elapsed() < RUNTIME_EVERY)
        {
            return false;
        }
        let Some(size) = vm_pages(pid) else { return false };
        let now = Instant::now();
        match self.sizes.get(&pid) {
            Some(&(s, _)) if s == size => return false,
            // A process whose size keeps changing (an allocator's arenas) is read at most this
            // often: its maps can be megabytes (60,000 mappings) and take its mmap lock.
            Some(&(_, at)) if now.duration_since(at) < MAPS_EVERY => return false,
            _ => {}
        }
        self.sizes.insert(pid, (size, now));
        let found = library::find_in_maps(pid);
        let has_driver = found.driver.is_some();
        let new = match found.driver {
            Some(m) if !self.procs.contains_key(&pid) => {
                self.forget_early(pid);
                self.accept(pid, m)
            }
            _ => false,
        };
        if !has_driver
            && !self.procs.contains_key(&pid)
            && let Some(m) = found.runtime
        {
            if !self.early.contains_key(&pid) && self.early.len() < WAITING_MAX {
                let map_files = m.map_files.clone();
                self.accept_runtime(pid, m);
                if self.files.values().any(|f| f.role == library::Role::Runtime && f.pids.contains(&pid)) {
                    self.early.insert(pid, map_files);
                }
            }
            return false;
        }
        let Some(p) = self.procs.get_mut(&pid) else { return new };
        p.runtime_looked = now;
        if let Some(m) = found.runtime {
            self.accept_runtime(pid, m);
        }
        new
    }

    /// Probes the runtime library `m` that process `pid` (probed: it maps the driver) maps, if
    /// it passes the checks and a slot is free.
    fn accept_runtime(&mut self, pid: u32, m: library::Mapped) {
        let decided = |procs: &mut HashMap<u32, Proc>, id: &FileId| {
            if let Some(p) = procs.get_mut(&pid) {
                p.runtime = Some(id.clone());
            }
        };
        if let Some(r) = self.refused.get_mut(&m.id) {
            r.pids.insert(pid);
            decided(&mut self.procs, &m.id);
            return;
        }
        if !self.files.contains_key(&m.id) {
            // No slot: launches are counted by handle, and the runtime looked for again later.
            if self.files.len() >= FILES_MAX {
                return;
            }
            let checked =
                library::open(&m).and_then(|open| Ok((library::probes(&open, &m.path, library::Role::Runtime)?, open)));
            let (probes, open) = match checked {
                Ok(v) => v,
                Err(library::LibraryError::Read(..)) => return,
                Err(e) => {
                    tracing::warn!(library = %m.path.display(), pid, error = %e, "the CUDA runtime library is not probed: launches through it are named by handle");
                    let refused = Refused { path: m.path.clone(), reason: e.to_string(), pids: BTreeSet::from([pid]) };
                    self.refused.put(m.id.clone(), refused);
                    decided(&mut self.procs, &m.id);
                    return;
                }
            };
            self.files.insert(m.id.clone(), File::new(m.path.clone(), library::Role::Runtime, open, probes));
        }
        if let Some(f) = self.files.get_mut(&m.id) {
            f.pids.insert(pid);
        }
        decided(&mut self.procs, &m.id);
    }

    /// Takes process `pid`, which maps `m`: under the file's probes if it passes the checks
    /// and a slot is free; under the file's refusal if it failed them; else it waits for a slot.
    fn accept(&mut self, pid: u32, m: library::Mapped) -> bool {
        if let Some(r) = self.refused.get_mut(&m.id) {
            r.pids.insert(pid);
            self.refused_by_pid.insert(pid, m.id);
            return false;
        }
        if !self.files.contains_key(&m.id) {
            if self.files.len() >= FILES_MAX {
                if self.waiting.len() < WAITING_MAX {
                    if !self.waiting.values().any(|w| w.id == m.id) {
                        tracing::warn!(
                            library = %m.path.display(),
                            pid,
                            "more CUDA driver libraries than the daemon probes ({FILES_MAX}): not probed until one is \
                             no longer mapped"
                        );
                    }
                    self.waiting.insert(pid, m);
                }
                return false;
            }
            let checked =
                library::open(&m).and_then(|open| Ok((library::probes(&open, &m.path, library::Role::Driver)?, open)));
            let (probes, open) = match checked {
                Ok(v) => v,
                // The process exited or unmapped it meanwhile: looked at again if it runs.
                Err(library::LibraryError::Read(..)) => {
                    self.sizes.remove(&pid);
                    return false;
                }
                Err(e) => {
                    tracing::warn!(library = %m.path.display(), pid, error = %e, "the CUDA driver library is not probed");
                    let refused = Refused { path: m.path.clone(), reason: e.to_string(), pids: BTreeSet::from([pid]) };
                    self.refused.put(m.id.clone(), refused);
                    self.refused_by_pid.insert(pid, m.id);
                    return false;
                }
            };
            self.files.insert(m.id.clone(), File::new(m.path.clone(), library::Role::Driver, open, probes));
        }
        let file = self.files.get_mut(&m.id).expect("just checked");
        file.pids.insert(pid);
        self.procs.insert(
            pid,
            Proc {
                file: m.id,
                runtime: None,
                // Looked for in this very read of the maps (`look_at`).
                runtime_looked: Instant::now(),
                map_files: m.map_files,
                duty: guard::DutyCycle::default(),
                cpu: guard::CpuUse::default(),
                limit: 0.0,
                gated: false,
                rate: 0.0,
                intervals: VecDeque::new(),
            },
        );
        true
    }

    /// A slot freed: the processes that waited for one are taken, while they still map it.
    pub(super) fn admit_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for (pid, m) in waiting {
            if m.map_files.exists() {
                self.accept(pid, m);
            }
        }
    }
}

/// The process's virtual size in pages (`/proc/PID/statm`'s first field): a cheap read that
/// changes when a library is mapped.
fn vm_pages(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    text.split_ascii_whitespace().next()?.parse().ok()
}
