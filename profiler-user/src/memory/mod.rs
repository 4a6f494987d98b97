//! One memory budget for the daemon. The unit caps it (`MemoryMax`, 256 MiB by default) and,
//! since kernel 5.11, charges its BPF maps to the same memory cgroup, so what grows with what
//! runs on the node (unwind-table building, symbol tables, perf maps, Python code objects,
//! symbolized stacks, queries) must fit in what is left after the maps and the daemon's base.
//! [`Plan`] says the arithmetic; each concern draws on its own [`Pool`] before it allocates and,
//! when the pool is short, degrades in a stated order (fewer unwind tables, then frame pointers,
//! then names as `module+offset`) with a counter and a log line, never growing past it.
//!
//! Pools bound what the daemon decides to hold; [`watch`] is the backstop for what it cannot
//! count in advance (allocator slack, blazesym's own caches): when the daemon's anonymous memory
//! passes the plan, the symbolizer's caches are dropped and rebuilt as samples ask again.

pub mod watch;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const MIB: u64 = 1 << 20;

/// The limit assumed when neither the flag nor a memory cgroup sets one: the shipped unit's.
pub const DEFAULT_LIMIT: u64 = 256 * MIB;
/// What the daemon holds whatever runs on the node: code and data of the binary, thread stacks,
/// the async runtime, the store writer's open block, the detectors' windows and the ring
/// reader's batches. Measured: 30-35 MiB RSS on an idle 2-CPU node (BENCHMARKS.md, overhead).
pub const BASE: u64 = 40 * MIB;
/// BPF maps besides the unwind rows and the ring: stack scratch, process tables, histograms
/// (about 3 MiB), the CUDA probes' stacks and counts (about 2.8 MiB). Measured from the maps'
/// `memlock` in `/proc/PID/fdinfo`: 5.9 MiB together; the off-CPU program's maps add about
/// 4.2 MiB (two generations of 512 stacks, 3.2 MiB; threads off CPU and armed, counts).
pub const OTHER_MAPS: u64 = 11 * MIB;
/// The least the pools may have together; below it the daemon refuses to start.
pub const MIN_POOLS: u64 = 24 * MIB;

/// Each concern's share of the pools, in percent (they add up to 100). At 256 MiB with the
/// default 80 MiB of unwind rows the pools have 98 MiB: 33 MiB build one 200 MB library's table
/// (libLLVM: 1.4 M rows, 31.5 MiB at its peak; `unwind::table` tests), 23 MiB index 1.5 M
/// symbols (three libLLVMs hold 0.9 M).
const SHARES: [(&Pool, u64); 6] =
    [(&UNWIND, 34), (&SYMBOLS, 24), (&QUERIES, 14), (&STACKS, 10), (&PERF_MAPS, 10), (&PYTHON, 8)];

/// Building unwind tables: the section read, the ranges collected, the rows before the kernel.
pub static UNWIND: Pool = Pool::new("unwind_build", 33 * MIB);
/// ELF symbol tables of the mapped files (blazesym's index of them, ~16 bytes a symbol; the
/// names stay in the file, mapped).
pub static SYMBOLS: Pool = Pool::new("symbols", 23 * MIB);
/// Folds, grids and exports of API queries in flight: requests wait for room, not for a slot.
pub static QUERIES: Pool = Pool::new("queries", 13 * MIB);
/// Symbolized stacks the pipeline caches, and the names they share.
pub static STACKS: Pool = Pool::new("stacks", 9 * MIB);
/// JIT perf maps (`/tmp/perf-PID.map`) of every process together.
pub static PERF_MAPS: Pool = Pool::new("perf_maps", 9 * MIB);
/// CPython code objects (names, files, line tables) read from processes.
pub static PYTHON: Pool = Pool::new("python", 7 * MIB);

/// Every pool, for /metrics and the log.
pub fn pools() -> [&'static Pool; 6] {
    SHARES.map(|(p, _)| p)
}

/// A part of the budget that one concern draws on.
#[derive(Debug)]
pub struct Pool {
    pub name: &'static str,
    limit: AtomicU64,
    used: AtomicU64,
    /// Requests refused for want of room.
    refused: AtomicU64,
    /// The most this pool held at once.
    peak: AtomicU64,
}

impl Pool {
    const fn new(name: &'static str, limit: u64) -> Self {
        Self {
            name,
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// A pool of its own for a test.
    #[cfg(test)]
    pub const fn new_for_tests(name: &'static str, limit: u64) -> Self {
        Self::new(name, limit)
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// `bytes` of this pool, held until the charge is dropped; `None` (and a refusal counted)
    /// when they do not fit beside what is held.
    pub fn try_charge(&'static self, bytes: u64) -> Option<Charge> {
        self.reserve(bytes).then(|| Charge { pool: self, bytes })
    }

    /// Whether `bytes` more would fit now (nothing is held).
    pub fn fits(&self, bytes: u64) -> bool {
        self.used().saturating_add(bytes) <= self.limit()
    }

    /// Whether a cache that keeps its own count ([`Self::set_used`]) may hold `bytes` in all.
    pub fn fits_total(&self, bytes: u64) -> bool {
        bytes <= self.limit()
    }

    /// Counts a refusal made by a caller that sized its request itself (e.g. a cache that
    /// evicts instead of growing).
    pub fn note_refused(&self) {
        self.refused.fetch_add(1, Relaxed);
    }

    fn reserve(&self, bytes: u64) -> bool {
        let limit = self.limit();
        let mut used = self.used.load(Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|n| *n <= limit) else {
                self.refused.fetch_add(1, Relaxed);
                return false;
            };
            match self.used.compare_exchange_weak(used, next, Relaxed, Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(next, Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// A cache that keeps its own count sets it here (its size is the pool's use).
    pub fn set_used(&self, bytes: u64) {
        self.used.store(bytes, Relaxed);
        self.peak.fetch_max(bytes, Relaxed);
    }
}

/// Bytes of a pool held until dropped; it can grow as what it pays for grows.
#[derive(Debug)]
pub struct Charge {
    pool: &'static Pool,
    bytes: u64,
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn pool(&self) -> &'static Pool {
        self.pool
    }

    /// Grows the charge to `total` bytes (never shrinks); false, with the charge unchanged,
    /// when the pool has no room for the difference.
    pub fn grow_to(&mut self, total: u64) -> bool {
        if total <= self.bytes {
            return true;
        }
        if self.pool.reserve(total - self.bytes) {
            self.bytes = total;
            true
        } else {
            false
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.pool.release(self.bytes);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "a memory limit of {limit_mib} MiB leaves {pools_mib} MiB for what grows with the node's programs after {maps_mib} MiB of BPF maps and {base_mib} MiB of base, less than the {min_mib} MiB the daemon needs: raise the unit's MemoryMax (or --memory-mib) or lower --unwind-table-mib"
    )]
    TooSmall { limit_mib: u64, maps_mib: u64, base_mib: u64, pools_mib: i64, min_mib: u64 },
}

/// How the limit is spent: the BPF maps, the base, a margin for what nobody counts (page cache
/// of the store, allocator slack), and the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub limit: u64,
    /// Where the limit came from: `flag`, `cgroup` or `default`.
    pub source: &'static str,
    pub maps: u64,
    pub base: u64,
    pub margin: u64,
    pub pools: u64,
}

impl Plan {
    /// The plan for `limit` bytes with `unwind_bytes` of unwind rows and a ring of `ring_bytes`.
    pub fn new(limit: u64, source: &'static str, unwind_bytes: u64, ring_bytes: u64) -> Result<Self, PlanError> {
        let maps = unwind_bytes + ring_bytes + OTHER_MAPS;
        let margin = limit / 10;
        let pools = limit as i64 - (maps + BASE + margin) as i64;
        if pools < MIN_POOLS as i64 {
            return Err(PlanError::TooSmall {
                limit_mib: limit / MIB,
                maps_mib: maps / MIB,
                base_mib: BASE / MIB,
                pools_mib: pools / MIB as i64,
                min_mib: MIN_POOLS / MIB,
            });
        }
        Ok(Self { limit, source, maps, base: BASE, margin, pools: pools as u64 })
    }

    /// The daemon's anonymous memory past which the symbolizer's caches are dropped: the base
    /// and the pools (the maps are kernel memory, the margin is for the page cache).
    pub fn anon_target(&self) -> u64 {
        self.base + self.pools
    }

    /// Gives each pool its share.
    pub fn apply(&self) {
        for (pool, share) in SHARES {
            pool.limit.store(self.pools * share / 100, Relaxed);
        }
    }

    /// One sentence for the log and `profiler status`.
    pub fn describe(&self) -> String {
        format!(
            "memory budget {} MiB ({}): {} MiB BPF maps, {} MiB base, {} MiB margin, {} MiB for tables, symbols, stacks and queries",
            self.limit / MIB,
            self.source,
            self.maps / MIB,
            self.base / MIB,
            self.margin / MIB,
            self.pools / MIB
        )
    }
}

/// The memory limit of the cgroup this process is in (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), `None` when it has none.
pub fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = match controllers {
            "" => format!("/sys/fs/cgroup{path}/memory.max"),
            c if c.split(',').any(|c| c == "memory") => format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"),
            _ => return None,
        };
        parse_limit(&std::fs::read_to_string(file).ok()?)
    })
}

/// A cgroup limit file's value; `max` and v1's "no limit" (a page-aligned near-`i64::MAX`) are none.
fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_units_limit_leaves_the_pools_what_the_maps_and_base_do_not_take() {
        // 256 MiB, the default 80 MiB of unwind rows, a 4 MiB ring.
        let p = Plan::new(256 * MIB, "default", 80 * MIB, 4 * MIB).unwrap();
        // The rows, the ring and the other maps' 11 MiB (off-CPU's among them).
        assert_eq!(p.maps, 95 * MIB);
        assert_eq!(p.margin, 256 * MIB / 10);
        assert_eq!(p.pools, 256 * MIB - (95 + 40) * MIB - 256 * MIB / 10);
        assert_eq!(p.pools >> 20, 95);
        assert_eq!(p.anon_target(), 40 * MIB + p.pools);
        let shares: u64 = SHARES.iter().map(|(_, s)| s).sum();
        assert_eq!(shares, 100);
        let err = Plan::new(256 * MIB, "flag", 512 * MIB, 4 * MIB).unwrap_err().to_string();
        assert!(err.contains("lower --unwind-table-mib"), "{err}");
    }

    #[test]
    fn a_charge_holds_its_bytes_until_dropped_and_refuses_past_the_limit() {
        static P: Pool = Pool::new("test", 100);
        let mut a = P.try_charge(60).unwrap();
        assert!(P.try_charge(50).is_none());
        assert_eq!(P.refused(), 1);
        assert!(a.grow_to(90));
        assert!(!a.grow_to(101));
        assert_eq!(a.bytes(), 90);
        drop(a);
        assert_eq!(P.used(), 0);
        assert_eq!(P.peak(), 90);
        assert!(P.try_charge(100).is_some());
    }

    #[test]
    fn cgroup_limit_files_say_max_or_a_number() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("268435456\n"), Some(256 * MIB));
    }
}
