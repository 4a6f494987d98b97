//! The symbolizer's caches within the memory budget: the stack cache bounded in bytes by its
//! pool, and the shed that drops every cache samples rebuild when the daemon's memory passes
//! its budget (`crate::memory::watch`).
//!
//! The stack cache is S3-FIFO (`quick_cache`), not least-recently-used: a Python node shows
//! thousands of stacks once a minute (a fifth of its samples), and under LRU each of them
//! pushed out a stack it keeps showing. There a new stack waits in a small queue and leaves
//! unless it is shown again; a hit sets a bit rather than relinking a list.

use blazesym::symbolize::evict::{self, Evict};

use super::{
    Cached, StackKey, Symbolizer,
    maps::Mapping,
    module::{self, Module},
    perfmap,
};
use crate::{memory, model::Stack};

/// What a cached stack costs: its frames and locations at their size (the names and files are
/// shared, and counted where they are made), and the cache's slot with its key.
pub(super) fn stack_bytes(stack: &Stack) -> u64 {
    let frames = stack.frames.capacity() * std::mem::size_of::<std::sync::Arc<str>>();
    let locations = stack.locations.capacity() * std::mem::size_of::<crate::model::Location>();
    (frames + locations + SLOT_BYTES) as u64
}

/// The rest of a cached stack, as allocated: the `Arc<Stack>` (counts, two vectors, a length:
/// 80 bytes from malloc), the cache's entry (key, value, queue links: about 80), its table slot
/// (about 20 at the table's load), and the two vectors' malloc headers (32).
const SLOT_BYTES: usize = 212;

/// The stack cache: weighed in bytes ([`stack_bytes`]), within the stacks' pool.
pub(super) type StackCache = quick_cache::unsync::Cache<StackKey, Cached, Weigh, rustc_hash::FxBuildHasher>;

#[derive(Clone, Copy)]
pub(super) struct Weigh;

impl quick_cache::Weighter<StackKey, Cached> for Weigh {
    fn weight(&self, _: &StackKey, c: &Cached) -> u64 {
        stack_bytes(&c.stack)
    }
}

/// An empty stack cache as large as the stacks' pool is now.
pub(super) fn stack_cache() -> StackCache {
    let limit = memory::STACKS.limit();
    StackCache::with((limit / 1_024) as usize, limit, Weigh, rustc_hash::FxBuildHasher, Default::default())
}

impl Symbolizer {
    /// Caches a symbolized stack within the stacks' pool of the memory budget (a user's
    /// 126-frame stacks of random JIT addresses cost what they weigh, not a slot each).
    pub(super) fn cache_stack(&mut self, key: StackKey, cached: Cached) {
        let limit = memory::STACKS.limit();
        if self.stacks.capacity() != limit {
            self.stacks.set_capacity(limit);
        }
        self.stacks.insert(key, cached);
        self.stack_bytes = self.stacks.weight();
        memory::STACKS.set_used(self.stack_bytes);
    }

    /// Drops every cache that samples rebuild (the daemon's memory passed its budget): stacks,
    /// names, Python code objects, perf maps, and blazesym's parsed symbols.
    pub(super) fn shed(&mut self) {
        self.stacks.clear();
        self.stack_bytes = 0;
        memory::STACKS.set_used(0);
        self.python.shed();
        self.kernel.clear();
        self.names.clear();
        for m in self.modules.values_mut() {
            m.names.clear();
            for path in m.paths() {
                let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(path.clone())));
            }
        }
        for p in self.processes.values_mut() {
            p.perf_map = perfmap::PerfMap::default();
            p.perf_map_read_at = None;
        }
        self.perf_map_bytes = 0;
        memory::PERF_MAPS.set_used(0);
        self.stats.sheds += 1;
    }

    /// Charges a module's symbol tables to the symbols' pool; a module that does not fit is
    /// given up for an unopened one.
    pub(super) fn charge_symbols(&mut self, mut module: Module, mapping: &Mapping) -> Module {
        // Symbol tables of all files share one pool of the memory budget: past it a new file's
        // frames are named `module+0xVADDR` (the last step of degrading), counted, until files
        // are forgotten with the processes that mapped them.
        let symbols = module.info.as_ref().map_or(0, |i| i.symbols);
        if symbols > 0 {
            match memory::SYMBOLS.try_charge(symbols * module::BYTES_PER_SYMBOL) {
                Some(charge) => module.charge = Some(charge),
                None => {
                    self.stats.files_refused += 1;
                    if !self.symbols_refusal_logged {
                        self.symbols_refusal_logged = true;
                        tracing::warn!(
                            file = %mapping.path,
                            symbols,
                            "the symbol tables of the mapped files fill their part of the memory budget: this file and later ones are named module+offset until files are forgotten (profiler_memory_refused_total{{pool=\"symbols\"}})"
                        );
                    }
                    return Module::unopened(mapping);
                }
            }
        }
        module
    }
}
