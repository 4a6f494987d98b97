//! The CUDA probes' kernel side (`profiler-ebpf/src/cuda.rs`): loading their programs,
//! attaching them to one library file's functions, and draining the per-stack counts. Which
//! files, which functions and what the counts become is `gpu::cuda`'s business.

use std::path::Path;

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, ProgramArray},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use profiler_common::{
    Record,
    cuda::{CudaCount, CudaKey, Lookup, LookupKey, OwnerKey, OwnerUse, Pending},
    python::PYTHON_PROGRAM,
    unwind::{SCAN_PROGRAM, UNWIND_PROGRAM},
};

use super::Collector;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("the CUDA probe program {0} is missing from the BPF object")]
    Missing(&'static str),
    #[error("the kernel refused the CUDA probe program {0}: {1}")]
    Program(&'static str, #[source] aya::programs::ProgramError),
    #[error("the CUDA map {0} cannot be opened: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("the kernel refused the CUDA probe programs: {0}")]
    Refused(String),
    #[error("attaching a CUDA probe to {path} at offset {offset:#x} failed: {source}")]
    Attach { path: String, offset: u64, source: aya::programs::ProgramError },
}

/// One function to probe in a library file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// File offset of the function's first instruction.
    pub offset: u64,
    /// What the probe counts (`profiler_common::cuda::cookie`).
    pub cookie: u64,
    /// Its return is probed too (a synchronisation's time blocked, a look-up's handle).
    pub returns: bool,
    pub program: Program,
}

/// Which programs a probe runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// A counted call: `cuda_call` (and `cuda_return`).
    Call,
    /// A look-up or a runtime launch: `cuda_lookup` (and `cuda_lookup_return`).
    Lookup,
}

impl Program {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Program::Call => ("cuda_call", "cuda_return"),
            Program::Lookup => ("cuda_lookup", "cuda_lookup_return"),
        }
    }
}

/// Probes being detached in the background ([`Collector::cuda_detach`]).
#[derive(Debug)]
pub struct Detaching(Option<std::thread::JoinHandle<std::time::Duration>>);

impl Detaching {
    /// Whether every probe is gone.
    pub fn done(&self) -> bool {
        self.0.as_ref().is_none_or(std::thread::JoinHandle::is_finished)
    }

    /// How long it took, once [`Self::done`] (`None` before, or when it ran inline).
    pub fn took(self) -> Option<std::time::Duration> {
        self.0.filter(std::thread::JoinHandle::is_finished)?.join().ok()
    }
}

/// The attachments of one file, to detach them together.
#[derive(Debug, Default)]
pub struct Links {
    links: Vec<(&'static str, UProbeLinkId)>,
}

impl Links {
    pub fn len(&self) -> usize {
        self.links.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one drain read: a thread's calls from one stack in one second.
#[derive(Clone, Copy)]
pub struct Drained {
    pub key: CudaKey,
    pub count: CudaCount,
    /// Wall-clock start of the second the calls were made in ([`CudaKey::sec`]), in ns.
    pub ts_ns: u64,
}

/// One drain: the counts, their stacks, and each owner's (uid's) calls that were not kept.
#[derive(Default)]
pub struct Drain {
    pub counts: Vec<Drained>,
    /// The stacks of the counts and of the synchronisations still blocked, by hash, but those
    /// the caller said it holds; the kernel's copies are gone after the drain.
    pub stacks: std::collections::HashMap<u64, Record>,
    /// Per uid, calls whose count or stack did not fit its share of the maps.
    pub dropped: Vec<(u32, u64)>,
}

/// The maps the probes fill.
pub struct Maps {
    stacks: [HashMap<MapData, u64, Record>; 2],
    pending: HashMap<MapData, u32, Pending>,
    counts: [HashMap<MapData, CudaKey, CudaCount>; 2],
    owners: HashMap<MapData, OwnerKey, OwnerUse>,
    gate: HashMap<MapData, u32, u32>,
    lookups: HashMap<MapData, LookupKey, Lookup>,
    generation: Array<MapData, u32>,
    current: u32,
    clock: Array<MapData, u64>,
    /// What `clock` holds: the boot-to-wall offset's fraction of a second (ns).
    frac_ns: u64,
}

/// Loads the probe programs, fills their tail-call slots and takes their maps.
pub(super) fn load(ebpf: &mut Ebpf) -> Result<Maps, CudaError> {
    let mut verified = Vec::new();
    for name in
        ["cuda_call", "cuda_return", "cuda_unwind", "cuda_python", "cuda_scan", "cuda_lookup", "cuda_lookup_return"]
    {
        let p: &mut UProbe = program(ebpf, name)?;
        let t = std::time::Instant::now();
        p.load().map_err(|e| CudaError::Program(name, e))?;
        let insns = p.fd().ok().and_then(|fd| {
            use std::os::fd::AsFd;
            super::prog_info::stats(fd.as_fd()).ok()?.verified_insns
        });
        verified.push(format!("{name} {} ms ({} instructions verified)", t.elapsed().as_millis(), insns.unwrap_or(0)));
    }
    tracing::info!(programs = %verified.join(", "), "CUDA probe programs verified");
    for (name, slot) in [("cuda_unwind", UNWIND_PROGRAM), ("cuda_python", PYTHON_PROGRAM), ("cuda_scan", SCAN_PROGRAM)]
    {
        let p: &mut UProbe = program(ebpf, name)?;
        let fd = p.fd().map_err(|e| CudaError::Program(name, e))?;
        let fd = fd.try_clone().map_err(|e| CudaError::Program(name, aya::programs::ProgramError::IOError(e)))?;
        let mut slots: ProgramArray<_> = ebpf
            .map_mut("CUDA_PROGRAMS")
            .ok_or(CudaError::Missing("CUDA_PROGRAMS"))?
            .try_into()
            .map_err(|e| CudaError::Map("CUDA_PROGRAMS", e))?;
        slots.set(slot, &fd, 0).map_err(|e| CudaError::Map("CUDA_PROGRAMS", e))?;
    }
    let mut take = |name: &'static str| ebpf.take_map(name).ok_or(CudaError::Missing(name));
    let s0 = HashMap::try_from(take("CUDA_STACKS_0")?).map_err(|e| CudaError::Map("CUDA_STACKS_0", e))?;
    let s1 = HashMap::try_from(take("CUDA_STACKS_1")?).map_err(|e| CudaError::Map("CUDA_STACKS_1", e))?;
    let pending = HashMap::try_from(take("CUDA_PENDING")?).map_err(|e| CudaError::Map("CUDA_PENDING", e))?;
    let c0 = HashMap::try_from(take("CUDA_COUNTS_0")?).map_err(|e| CudaError::Map("CUDA_COUNTS_0", e))?;
    let c1 = HashMap::try_from(take("CUDA_COUNTS_1")?).map_err(|e| CudaError::Map("CUDA_COUNTS_1", e))?;
    let generation = Array::try_from(take("CUDA_GEN")?).map_err(|e| CudaError::Map("CUDA_GEN", e))?;
    let owners = HashMap::try_from(take("CUDA_OWNERS")?).map_err(|e| CudaError::Map("CUDA_OWNERS", e))?;
    let gate = HashMap::try_from(take("CUDA_GATE")?).map_err(|e| CudaError::Map("CUDA_GATE", e))?;
    let clock = Array::try_from(take("CUDA_CLOCK")?).map_err(|e| CudaError::Map("CUDA_CLOCK", e))?;
    let lookups = HashMap::try_from(take("CUDA_LOOKUPS")?).map_err(|e| CudaError::Map("CUDA_LOOKUPS", e))?;
    Ok(Maps {
        stacks: [s0, s1],
        pending,
        counts: [c0, c1],
        owners,
        gate,
        lookups,
        generation,
        current: 0,
        clock,
        frac_ns: 0,
    })
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe, CudaError> {
    ebpf.program_mut(name).ok_or(CudaError::Missing(name))?.try_into().map_err(|e| CudaError::Program(name, e))
}

impl Collector {
    /// Loads the probes' programs (a second of the verifier's time), when a process first maps
    /// the driver; once: a refusal is final, and said by the error.
    pub fn cuda_load(&mut self) -> Result<(), CudaError> {
        if self.cuda.is_some() {
            return Ok(());
        }
        if let Some(e) = &self.cuda_refused {
            return Err(CudaError::Refused(e.clone()));
        }
        let t = std::time::Instant::now();
        match load(&mut self.ebpf) {
            Ok(maps) => {
                tracing::info!(ms = t.elapsed().as_millis() as u64, "CUDA probe programs loaded");
                self.cuda = Some(maps);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "CUDA launches and synchronisations will not be counted");
                self.cuda_refused = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Attaches the probes to `target` (a path this process can open: `/proc/self/fd/N` of the
    /// file opened through a process's `map_files`), for every process mapping it. A probe the
    /// kernel refuses (an instruction it cannot step at that offset) is skipped and logged; an
    /// error only if none attached.
    pub fn cuda_attach(&mut self, target: &Path, probes: &[Probe]) -> Result<Links, CudaError> {
        self.cuda_load()?;
        let started = std::time::Instant::now();
        let mut links = Links::default();
        let mut last_error = None;
        for p in probes {
            let (call, ret) = p.program.names();
            match self.attach_one(call, target, p.offset, Some(p.cookie)) {
                Ok(id) => links.links.push((call, id)),
                Err(e) => {
                    tracing::debug!(error = %e, "a CUDA probe was refused; the others stay");
                    last_error = Some(e);
                    continue;
                }
            }
            if p.returns {
                match self.attach_one(ret, target, p.offset, None) {
                    Ok(id) => links.links.push((ret, id)),
                    Err(e) => {
                        tracing::debug!(error = %e, "a CUDA return probe was refused; the others stay");
                        last_error = Some(e);
                    }
                }
            }
        }
        tracing::debug!(probes = links.links.len(), ms = started.elapsed().as_millis() as u64, "CUDA probes attached");
        match (links.links.is_empty(), last_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(links),
        }
    }

    fn attach_one(
        &mut self,
        name: &'static str,
        target: &Path,
        offset: u64,
        cookie: Option<u64>,
    ) -> Result<UProbeLinkId, CudaError> {
        let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie };
        program(&mut self.ebpf, name)?
            .attach(point, target, UProbeScope::AllProcesses)
            .map_err(|source| CudaError::Attach { path: target.display().to_string(), offset, source })
    }

    /// Detaches `links` without waiting. Each uprobe's detach waits for the kernel's
    /// RCU-tasks-trace grace period: about 110 ms here (6.18), so the stand-in driver's 21
    /// probes, one after another, held the stage 2.4 s, and on an H200 the real driver's 59
    /// held it long enough that the seconds the rate guard had them attached counted a third of
    /// the launches. They are dropped on a thread of their own while the stage goes on. The
    /// file is not probed again before [`Detaching::done`]: two sets of probes on it would
    /// count each call twice.
    pub fn cuda_detach(&mut self, links: Links) -> Detaching {
        let mut owned = Vec::with_capacity(links.links.len());
        for (name, id) in links.links {
            let Ok(prog) = program(&mut self.ebpf, name) else { continue };
            match prog.take_link(id) {
                Ok(link) => owned.push(link),
                Err(e) => tracing::debug!(error = %e, "detaching a CUDA probe failed"),
            }
        }
        let detach = move || {
            let (n, started) = (owned.len(), std::time::Instant::now());
            // One at a time, in the order attached (the launches' probes first): the kernel
            // serialises them anyway (21 on threads of their own took as long).
            drop(owned);
            let took = started.elapsed();
            tracing::debug!(probes = n, ms = took.as_millis() as u64, "CUDA probes detached");
            took
        };
        // No thread at all: the links are dropped with the closure, here, one by one.
        Detaching(std::thread::Builder::new().name("cuda-detach".into()).spawn(detach).ok())
    }

    /// What the look-ups named since the last call (`CUDA_LOOKUPS`), the map emptied: a look-up
    /// is rare (once per kernel and process), so reading all of it each drain is cheap.
    pub fn cuda_lookups(&mut self) -> Vec<(LookupKey, Lookup)> {
        let Some(maps) = self.cuda.as_mut() else { return Vec::new() };
        let keys: Vec<LookupKey> = maps.lookups.keys().filter_map(Result::ok).collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Ok(l) = maps.lookups.get(&key, 0) {
                out.push((key, l));
            }
            let _ = maps.lookups.remove(&key);
        }
        out
    }

    /// What the probes counted in the map they left at the previous drain (a drain's counts
    /// come a drain late); then they move to the map just emptied. A probe that read the
    /// generation before a switch may still add to the map it read for a while (its program can
    /// be preempted on a busy machine: with a millisecond's grace 14 of 5,000 launches were
    /// lost), so a map is read a whole drain after the probes left it, never while they may
    /// still write.
    /// `held`: whether the caller keeps a stack already (its kernel copy is not read).
    /// `boot_to_unix`: `CLOCK_REALTIME - CLOCK_BOOTTIME` now (ns), which turns the counts'
    /// seconds into wall-clock time (and is passed on to the probes, [`Self::cuda_clock`]).
    pub fn cuda_drain(&mut self, held: impl Fn(u64) -> bool, boot_to_unix: i128) -> Drain {
        let Some(maps) = self.cuda.as_mut() else { return Drain::default() };
        let retired = (maps.current ^ 1) as usize & 1;
        let mut counts = read_and_clear(&mut maps.counts[retired]);
        for d in &mut counts {
            d.ts_ns = wall_second_ns(d.key.sec, maps.frac_ns, boot_to_unix);
        }
        let dropped = read_owners(&mut maps.owners, retired as u32);
        // The stacks the counts name, and those of synchronisations entered in that generation
        // and still blocked (their count comes in a later one), before the map is emptied for
        // the probes' next use of it.
        let blocked = maps.pending.iter().filter_map(Result::ok).filter(|(_, p)| p.generation as usize == retired);
        let wanted: std::collections::BTreeSet<u64> =
            counts.iter().map(|d| d.key.hash).chain(blocked.map(|(_, p)| p.hash)).filter(|&h| !held(h)).collect();
        let stacks = wanted.into_iter().filter_map(|h| Some((h, maps.stacks[retired].get(&h, 0).ok()?))).collect();
        clear(&mut maps.stacks[retired]);
        let out = Drain { counts, stacks, dropped };
        self.cuda_clock(boot_to_unix);
        let Some(maps) = self.cuda.as_mut() else { return out };
        if let Err(e) = maps.generation.set(0, retired as u32, 0) {
            tracing::warn!(error = %e, "cannot switch the CUDA counts map; counts wait for the next drain");
            return out;
        }
        maps.current = retired as u32;
        out
    }

    /// Tells the probes where wall-clock seconds start in boot time (`CUDA_CLOCK`): `boot_to_unix`
    /// is `CLOCK_REALTIME - CLOCK_BOOTTIME` (ns). Set when the probes load and at every drain,
    /// so an NTP step moves the counts' seconds within a drain.
    pub fn cuda_clock(&mut self, boot_to_unix: i128) {
        let Some(maps) = self.cuda.as_mut() else { return };
        let frac = boot_to_unix.rem_euclid(NS_PER_SEC as i128) as u64;
        if frac != maps.frac_ns {
            match maps.clock.set(0, frac, 0) {
                Ok(()) => maps.frac_ns = frac,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot set the CUDA probes' clock; counts may land a second off")
                }
            }
        }
    }

    /// Switches the probes off (`off`) or on again for process `pid` while its library stays
    /// probed for the others (the rate guard, per process).
    pub fn cuda_gate(&mut self, pid: u32, off: bool) {
        let Some(maps) = self.cuda.as_mut() else { return };
        let result = if off { maps.gate.insert(pid, 1, 0) } else { maps.gate.remove(&pid) };
        if let Err(e) = result
            && off
        {
            tracing::warn!(pid, error = %e, "cannot switch a process's CUDA probes off; its counts stay exact");
        }
    }
}

/// Each owner's calls not kept in generation `generation`, its entries cleared for the next use.
fn read_owners(map: &mut HashMap<MapData, OwnerKey, OwnerUse>, generation: u32) -> Vec<(u32, u64)> {
    let keys: Vec<OwnerKey> = map.keys().filter_map(Result::ok).filter(|k| k.generation == generation).collect();
    let mut out = Vec::new();
    for key in keys {
        if let Ok(u) = map.get(&key, 0)
            && u.dropped > 0
        {
            out.push((key.uid, u.dropped));
        }
        let _ = map.remove(&key);
    }
    out
}

fn clear(map: &mut HashMap<MapData, u64, Record>) {
    let keys: Vec<u64> = map.keys().filter_map(Result::ok).collect();
    for key in keys {
        let _ = map.remove(&key);
    }
}

fn read_and_clear(map: &mut HashMap<MapData, CudaKey, CudaCount>) -> Vec<Drained> {
    let keys: Vec<CudaKey> = map.keys().filter_map(Result::ok).collect();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(count) = map.get(&key, 0) {
            out.push(Drained { key, count, ts_ns: 0 });
        }
        let _ = map.remove(&key);
    }
    out
}

pub(super) const NS_PER_SEC: u64 = 1_000_000_000;

/// The wall-clock start (ns) of the second a count keyed `sec` (the CUDA probes', off-CPU's): it counted in boot time plus
/// `frac_ns` (the offset's fraction of a second it was told), so adding the rest of the offset
/// lands on a second's start; rounded, so that a small drift of the offset since (NTP slewing)
/// keeps it there.
pub(super) fn wall_second_ns(sec: u32, frac_ns: u64, boot_to_unix: i128) -> u64 {
    let ns = i128::from(sec) * NS_PER_SEC as i128 - i128::from(frac_ns) + boot_to_unix;
    let second = (ns + NS_PER_SEC as i128 / 2).div_euclid(NS_PER_SEC as i128);
    (second.max(0) as u64).saturating_mul(NS_PER_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probes_second_is_the_wall_clock_second_of_the_call() {
        // Wall clock = boot + 1,700,000,000.3 s: boot 41.8 s is wall ...042.1 s, in second
        // ...042. The probe adds the 0.3 s fraction: (41.8 + 0.3) -> second 42 of its clock.
        let offset: i128 = 1_700_000_000 * NS_PER_SEC as i128 + 300_000_000;
        let frac = offset.rem_euclid(NS_PER_SEC as i128) as u64;
        let boot_ns: u64 = 41_800_000_000;
        let sec = ((boot_ns + frac) / NS_PER_SEC) as u32;
        assert_eq!(wall_second_ns(sec, frac, offset), 1_700_000_042 * NS_PER_SEC);
        // Boot 41.6 s is wall ...041.9 s: second ...041.
        let sec = ((41_600_000_000 + frac) / NS_PER_SEC) as u32;
        assert_eq!(wall_second_ns(sec, frac, offset), 1_700_000_041 * NS_PER_SEC);
        // The offset slewed by 20 ms since the probe was told: still that second.
        assert_eq!(wall_second_ns(sec, frac, offset + 20_000_000), 1_700_000_041 * NS_PER_SEC);
        assert_eq!(wall_second_ns(sec, frac, offset - 20_000_000), 1_700_000_041 * NS_PER_SEC);
        // Probes not told yet (fraction 0): the second whose start is nearest.
        let sec = (41_600_000_000 / NS_PER_SEC) as u32;
        assert_eq!(wall_second_ns(sec, 0, offset), 1_700_000_041 * NS_PER_SEC);
    }
}
