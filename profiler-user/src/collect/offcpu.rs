//! The off-CPU program's kernel side (`profiler-ebpf/src/offcpu.rs`): loading it and its stack
//! walkers, attaching it to `sched_switch`, and draining its per-stack counts. What the counts
//! become is `offcpu`'s business.

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray},
    programs::TracePoint,
};
use profiler_common::{
    Record,
    offcpu::{OffCount, OffKey, stat},
    python::PYTHON_PROGRAM,
    unwind::{SCAN_PROGRAM, UNWIND_PROGRAM},
};

use super::{Collector, cuda::wall_second_ns};

#[derive(Debug, thiserror::Error)]
pub enum OffCpuError {
    #[error("the off-CPU program {0} is missing from the BPF object")]
    Missing(&'static str),
    #[error("the kernel refused the off-CPU program {0}: {1}")]
    Program(&'static str, #[source] aya::programs::ProgramError),
    #[error("the off-CPU map {0} cannot be opened: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
}

/// What the daemon asks of the program.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Waits shorter than this are not counted (ns, > 0).
    pub threshold_ns: u64,
    /// Waits recorded a second on one CPU before one in `SAMPLE_EVERY` is kept.
    pub rate_limit: u64,
    /// Stacks walked a second on one CPU, at most.
    pub walk_limit: u64,
}

/// One thread's time off CPU from one stack, in one state and second.
#[derive(Clone, Copy, Debug)]
pub struct Drained {
    pub key: OffKey,
    pub count: OffCount,
    /// Wall-clock start of the second ([`OffKey::sec`]), in ns.
    pub ts_ns: u64,
}

/// The program's totals over all CPUs (`profiler_common::offcpu::stat`, the ever-growing ones):
/// switch-outs seen, waits at least the threshold long, waits left out by the sampling above the
/// rate limit (their time is in the kept ones'), stacks walked, armed switch-outs not walked (the
/// walk budget was spent), waits whose count did not fit the kernel's map, and armed switch-outs
/// that took their last walk's stack (same place), unwalked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Totals {
    pub switches: u64,
    pub long_waits: u64,
    pub sampled_out: u64,
    pub walked: u64,
    pub walks_skipped: u64,
    pub dropped: u64,
    pub reused: u64,
}

pub struct Maps {
    counts: [HashMap<MapData, OffKey, OffCount>; 2],
    stacks: [HashMap<MapData, u64, Record>; 2],
    generation: Array<MapData, u32>,
    current: u32,
    clock: Array<MapData, u64>,
    frac_ns: u64,
    stats: PerCpuArray<MapData, [u64; stat::LEN]>,
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut TracePoint, OffCpuError> {
    ebpf.program_mut(name).ok_or(OffCpuError::Missing(name))?.try_into().map_err(|e| OffCpuError::Program(name, e))
}

/// Loads the walkers into the program's slots (each optional: without the table walk the user
/// stack follows frame pointers, without the Python reader it has no Python frames), sets the
/// settings, loads and attaches the program, and takes its maps.
fn load(ebpf: &mut Ebpf, s: Settings) -> Result<Maps, OffCpuError> {
    let mut loaded = Vec::new();
    for (name, slot) in
        [("offcpu_unwind", UNWIND_PROGRAM), ("offcpu_python", PYTHON_PROGRAM), ("offcpu_scan", SCAN_PROGRAM)]
    {
        let t = std::time::Instant::now();
        let fd = match program(ebpf, name).and_then(|p| {
            p.load().map_err(|e| OffCpuError::Program(name, e))?;
            let fd = p.fd().map_err(|e| OffCpuError::Program(name, e))?;
            let insns = {
                use std::os::fd::AsFd;
                super::prog_info::stats(fd.as_fd()).ok().and_then(|s| s.verified_insns)
            };
            loaded.push(format!(
                "{name} {} ms ({} instructions verified)",
                t.elapsed().as_millis(),
                insns.unwrap_or(0)
            ));
            fd.try_clone().map_err(|e| OffCpuError::Program(name, aya::programs::ProgramError::IOError(e)))
        }) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(error = %e, "off-CPU stacks will miss what this walker finds");
                continue;
            }
        };
        let mut slots: ProgramArray<_> = ebpf
            .map_mut("OFFCPU_PROGRAMS")
            .ok_or(OffCpuError::Missing("OFFCPU_PROGRAMS"))?
            .try_into()
            .map_err(|e| OffCpuError::Map("OFFCPU_PROGRAMS", e))?;
        slots.set(slot, &fd, 0).map_err(|e| OffCpuError::Map("OFFCPU_PROGRAMS", e))?;
    }
    {
        let mut config: Array<_, u64> = ebpf
            .map_mut("OFFCPU_CONFIG")
            .ok_or(OffCpuError::Missing("OFFCPU_CONFIG"))?
            .try_into()
            .map_err(|e| OffCpuError::Map("OFFCPU_CONFIG", e))?;
        for (i, v) in [s.threshold_ns.max(1), s.rate_limit, s.walk_limit].into_iter().enumerate() {
            config.set(i as u32, v, 0).map_err(|e| OffCpuError::Map("OFFCPU_CONFIG", e))?;
        }
    }
    let t = std::time::Instant::now();
    let p = program(ebpf, "offcpu_switch")?;
    p.load().map_err(|e| OffCpuError::Program("offcpu_switch", e))?;
    let insns = p.fd().ok().and_then(|fd| {
        use std::os::fd::AsFd;
        super::prog_info::stats(fd.as_fd()).ok()?.verified_insns
    });
    loaded.push(format!("offcpu_switch {} ms ({} instructions verified)", t.elapsed().as_millis(), insns.unwrap_or(0)));
    p.attach("sched", "sched_switch").map_err(|e| OffCpuError::Program("offcpu_switch", e))?;
    tracing::info!(programs = %loaded.join(", "), threshold_ns = s.threshold_ns, "off-CPU program attached");
    let mut take = |name: &'static str| ebpf.take_map(name).ok_or(OffCpuError::Missing(name));
    let c0 = HashMap::try_from(take("OFFCPU_COUNTS_0")?).map_err(|e| OffCpuError::Map("OFFCPU_COUNTS_0", e))?;
    let c1 = HashMap::try_from(take("OFFCPU_COUNTS_1")?).map_err(|e| OffCpuError::Map("OFFCPU_COUNTS_1", e))?;
    let s0 = HashMap::try_from(take("OFFCPU_STACKS_0")?).map_err(|e| OffCpuError::Map("OFFCPU_STACKS_0", e))?;
    let s1 = HashMap::try_from(take("OFFCPU_STACKS_1")?).map_err(|e| OffCpuError::Map("OFFCPU_STACKS_1", e))?;
    let generation = Array::try_from(take("OFFCPU_GEN")?).map_err(|e| OffCpuError::Map("OFFCPU_GEN", e))?;
    let clock = Array::try_from(take("OFFCPU_CLOCK")?).map_err(|e| OffCpuError::Map("OFFCPU_CLOCK", e))?;
    let stats = PerCpuArray::try_from(take("OFFCPU_STATS")?).map_err(|e| OffCpuError::Map("OFFCPU_STATS", e))?;
    Ok(Maps { counts: [c0, c1], stacks: [s0, s1], generation, current: 0, clock, frac_ns: 0, stats })
}

impl Collector {
    /// Starts counting off-CPU time (once; a refusal is said by the error and the daemon
    /// goes on without).
    pub fn offcpu_start(&mut self, settings: Settings, boot_to_unix: i128) -> Result<(), OffCpuError> {
        if self.offcpu.is_some() {
            return Ok(());
        }
        let maps = load(&mut self.ebpf, settings)?;
        self.offcpu = Some(maps);
        self.offcpu_clock(boot_to_unix);
        Ok(())
    }

    /// The counts the program left at the previous drain (read a whole drain after it left
    /// them, as the CUDA counts are: a program preempted between reading the generation and
    /// adding may still add for a while), then it moves to the map just emptied. `held`:
    /// whether the caller keeps a stack already (its kernel copy is not read).
    pub fn offcpu_drain(
        &mut self,
        held: impl Fn(u64) -> bool,
        boot_to_unix: i128,
    ) -> (Vec<Drained>, std::collections::HashMap<u64, Record>) {
        let Some(maps) = self.offcpu.as_mut() else { return Default::default() };
        let retired = (maps.current ^ 1) as usize & 1;
        let keys: Vec<OffKey> = maps.counts[retired].keys().filter_map(Result::ok).collect();
        let mut counts = Vec::with_capacity(keys.len());
        for key in keys {
            if let Ok(count) = maps.counts[retired].get(&key, 0) {
                let ts_ns = wall_second_ns(key.sec, maps.frac_ns, boot_to_unix);
                counts.push(Drained { key, count, ts_ns });
            }
            let _ = maps.counts[retired].remove(&key);
        }
        // Every stack of the generation, not only those its counts name: a thread still off
        // CPU is counted in a later one, after this map is emptied (the caller keeps them).
        let keys: Vec<u64> = maps.stacks[retired].keys().filter_map(Result::ok).collect();
        let mut stacks = std::collections::HashMap::new();
        for h in keys {
            if !held(h)
                && let Ok(r) = maps.stacks[retired].get(&h, 0)
            {
                stacks.insert(h, r);
            }
            let _ = maps.stacks[retired].remove(&h);
        }
        if let Err(e) = maps.generation.set(0, retired as u32, 0) {
            tracing::warn!(error = %e, "cannot switch the off-CPU counts map; counts wait for the next drain");
        } else {
            maps.current = retired as u32;
        }
        self.offcpu_clock(boot_to_unix);
        (counts, stacks)
    }

    /// Tells the program where wall-clock seconds start in boot time (as `cuda_clock`).
    fn offcpu_clock(&mut self, boot_to_unix: i128) {
        let Some(maps) = self.offcpu.as_mut() else { return };
        let frac = boot_to_unix.rem_euclid(1_000_000_000) as u64;
        if frac != maps.frac_ns && maps.clock.set(0, frac, 0).is_ok() {
            maps.frac_ns = frac;
        }
    }

    /// The program's totals over all CPUs, or `None` when it is not running.
    pub fn offcpu_totals(&self) -> Option<Totals> {
        let maps = self.offcpu.as_ref()?;
        let per_cpu = maps.stats.get(&0, 0).ok()?;
        let mut t = Totals::default();
        for v in per_cpu.iter() {
            t.switches += v[stat::SWITCHES];
            t.long_waits += v[stat::LONG_WAITS];
            t.sampled_out += v[stat::SAMPLED_OUT];
            t.walked += v[stat::WALKED];
            t.walks_skipped += v[stat::WALKS_SKIPPED];
            t.dropped += v[stat::DROPPED];
            t.reused += v[stat::REUSED];
        }
        Some(t)
    }
}
