//! Asking the CPU to fetch what will be written soon, so that a run of cold cache misses
//! overlaps instead of queueing.
//!
//! Why: a symbolized stack is dozens of `Arc<str>` names spread over the heap. Cloning or
//! dropping each is a locked add on its count, and a locked instruction waits for its cache
//! miss before anything after it runs: on the replay bench's Python node, 40 % of naming a
//! stack's Python frames was spent in those waits, one name after the other. Prefetching the
//! counts of a whole stack first lets their misses run together.

use std::sync::Arc;

/// Hints that the reference count of `a` is about to change. Only a hint: it reads nothing
/// and cannot fault, whatever the address.
#[inline(always)]
pub fn arc_count<T: ?Sized>(a: &Arc<T>) {
    // The counts sit just before the value (`ArcInner`: strong, weak, then the data); a wrong
    // guess costs a useless fetch, never a wrong result.
    let counts = Arc::as_ptr(a).cast::<u8>().wrapping_sub(2 * size_of::<usize>());
    line(counts);
}

#[inline(always)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it does not access memory architecturally and does not
    // fault on any address. SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
