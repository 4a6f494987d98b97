//! Where a user-stack walk's record lives and where it goes when the walk ends: the sampler's
//! record goes to the ring (`Sampler`), a CUDA probe's into per-stack counters
//! (`cuda::Probes`). The table walk (`unwind`) and the Python frame reader (`python`) are written
//! once, for any sink.

use aya_ebpf::EbpfContext;
use profiler_common::unwind::State;

use crate::Record;

/// Where a walk's record lives and where it goes when the walk is done: the sampler's goes to
/// the ring (`Sampler`), a CUDA probe's into per-stack counters (`cuda::Probes`). Static
/// dispatch: BPF has no indirect calls.
pub(crate) trait Sink {
    fn record() -> Option<*mut Record>;
    fn state() -> Option<*mut State>;
    /// Tail-calls `slot` of this path's program array (programs of the caller's own type);
    /// returns only if it failed.
    fn tail_call<C: EbpfContext>(ctx: &C, slot: u32);
    /// The record is complete: `kernel` + `user` frames and its Python pairs.
    fn finish(record: &mut Record, kernel: usize, user: usize);
}
