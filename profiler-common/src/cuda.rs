//! CUDA driver calls counted per stack (`profiler-ebpf/src/cuda.rs`): uprobes on `libcuda.so.1`
//! walk the calling thread's stack with the sampler's unwinder and add to per-stack counters in
//! the kernel, so a launch costs no ring-buffer record.
//!
//! These maps carry the counts to userspace:
//! - `CUDA_COUNTS_0` / `CUDA_COUNTS_1`: [`CudaCount`] by [`CudaKey`], double-buffered by
//!   `CUDA_GEN`: userspace flips the generation, lets the programs in flight finish, then reads
//!   and clears the other map, so no increment is lost between a read and a delete;
//! - `CUDA_STACKS_0` / `CUDA_STACKS_1` (by [`CudaKey::hash`]), double-buffered the same way: the
//!   stacks of the generation's counts, each a [`crate::Record`] (header, user addresses, Python
//!   pairs; no kernel frames), so the sampler's parser reads it;
//! - `CUDA_PENDING` (LRU, by thread id): a synchronisation entered and not yet returned (its
//!   stack follows its count into the generation it returns in);
//! - `CUDA_OWNERS`: each user's share of the counts and stacks of a generation ([`OwnerUse`]);
//! - `CUDA_CLOCK` (one `u64`, written by userspace): `CLOCK_REALTIME - CLOCK_BOOTTIME` modulo a
//!   second, so that [`CudaKey::sec`] falls on wall-clock seconds;
//! - `CUDA_LOOKUPS` (LRU, by [`LookupKey`]): what the driver's and the runtime's look-ups named
//!   (a [`Lookup`]: a kernel's name, the handle it came from, or a host stub), read and emptied
//!   by userspace each drain into its per-process tables;
//! - `CUDA_RUNTIME` (LRU, by thread id): the host stub a runtime launch (`cudaLaunchKernel`)
//!   is passing to the driver, consumed by the driver's launch probe within that call, so the
//!   launch is counted once, under the stub.

use crate::COMM_LEN;

/// What a probe counts (the low byte of its attach cookie; see [`cookie`]).
pub mod kind {
    /// A kernel launch (`cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
    /// `cuGraphLaunch`, their `_ptsz` forms): counts.
    pub const LAUNCH: u32 = 0;
    /// A host-blocking synchronisation (`cu{Stream,Event,Ctx}Synchronize`): calls and
    /// nanoseconds from entry to return.
    pub const SYNC: u32 = 1;
    /// A copy (`cuMemcpy*`): calls and bytes.
    pub const COPY: u32 = 2;
    pub const COUNT: usize = 3;
}

/// The attach cookie: what the probe counts, where its byte count is, and where the probed
/// function sits in its executable segment (to tell a call from inside the library, one launch
/// passing through two probed functions, from a call by the application).
///
/// Bits: kind 0-3, argument 4-7, how 8-11, the function's offset in its segment 12-39, the
/// segment's size in 16-byte units 40-63 (0: unknown, no check).
pub mod cookie {
    /// The byte count is the argument numbered `arg` (from 0).
    pub const BYTES_ARG: u64 = 1;
    /// The argument numbered `arg` points at a `CUDA_MEMCPY2D`: bytes = WidthInBytes × Height.
    pub const BYTES_2D: u64 = 2;
    /// No byte count is read.
    pub const BYTES_NONE: u64 = 0;
    /// A launch: the argument numbered `arg` is the kernel's handle (`CUfunction`).
    pub const FUNC_ARG: u64 = 3;
    /// A graph launch: no kernel named (`cuGraphLaunch`).
    pub const GRAPH: u64 = 4;
    /// `CUDA_MEMCPY2D::WidthInBytes` and `Height` (cuda.h: eight 8-byte fields per side, with
    /// the memory type padded to 8, then width and height).
    pub const MEMCPY2D_WIDTH: u64 = 112;
    pub const MEMCPY2D_HEIGHT: u64 = 120;
    /// Largest function offset and segment size the cookie holds.
    pub const MAX_OFFSET: u64 = (1 << 28) - 1;
    pub const MAX_SEGMENT: u64 = ((1 << 24) - 1) * 16;

    pub const fn make(kind: u32, arg: u64, how: u64) -> u64 {
        (kind as u64 & 0xf) | (arg & 0xf) << 4 | (how & 0xf) << 8
    }
    /// `c` with the function's place: `offset` from the start of its executable segment of
    /// `size` bytes (left out when either does not fit).
    pub const fn with_segment(c: u64, offset: u64, size: u64) -> u64 {
        if offset > MAX_OFFSET || size > MAX_SEGMENT || offset >= size {
            return c;
        }
        c | offset << 12 | size.div_ceil(16) << 40
    }
    pub const fn kind(c: u64) -> u32 {
        (c & 0xf) as u32
    }
    pub const fn arg(c: u64) -> u64 {
        (c >> 4) & 0xf
    }
    pub const fn how(c: u64) -> u64 {
        (c >> 8) & 0xf
    }
    /// The function's offset in its executable segment.
    pub const fn offset(c: u64) -> u64 {
        (c >> 12) & MAX_OFFSET
    }
    /// The segment's size in bytes (0: unknown).
    pub const fn segment(c: u64) -> u64 {
        (c >> 40) * 16
    }
}

/// Per thread, CPU and stack: the thread matters (a synchronisation stall is a thread's), and a
/// thread runs on one CPU at a time, so the kernel adds to an entry without atomics. The CPU
/// is the one the call was made on (a synchronisation's: the one it returned on), so that a
/// count is stored on its CPU (`--cpu`), not on the CPU of the stack's first call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CudaKey {
    pub pid: u32,
    pub tid: u32,
    /// One of [`kind`].
    pub kind: u32,
    pub cpu: u32,
    /// The second the calls were made in (a synchronisation's: the one it returned in), in
    /// boot time shifted by `CUDA_CLOCK` (the fraction of a second by which wall-clock seconds
    /// start after boot-time ones), so that it is a wall-clock second less a whole offset the
    /// daemon adds back: counts are stored in the second they were made, not the drain's.
    pub sec: u32,
    pub _pad: u32,
    /// Of the stack's words, pid and tid (the key of `CUDA_STACKS_*`).
    pub hash: u64,
    /// A launch's kernel: its handle or host stub with where it came from in the top byte
    /// ([`func`]); 0 for other kinds. Bounded like the key itself (the owner's share of keys).
    pub func: u64,
}

/// [`CudaKey::func`]: the top byte says what the rest is.
pub mod func {
    /// The driver's handle (`CUfunction`, `CUkernel`) the launch passed.
    pub const HANDLE: u64 = 1 << 56;
    /// The host stub (or CUDA 13's `cudaKernel_t`) the runtime's launch passed.
    pub const STUB: u64 = 2 << 56;
    /// A graph launch.
    pub const GRAPH: u64 = 3 << 56;
    pub const ADDR: u64 = (1 << 56) - 1;
    pub const fn tag(f: u64) -> u64 {
        f & !ADDR
    }
    pub const fn addr(f: u64) -> u64 {
        f & ADDR
    }
}

/// What a look-up probe remembers, by process and the handle it returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LookupKey {
    pub pid: u32,
    pub _pad: u32,
    pub handle: u64,
}

/// What the look-up calls are (the low byte of their attach cookie, beside [`kind`]'s).
pub mod lookup {
    /// `cuModuleGetFunction(&f, mod, name)`, `cuLibraryGetKernel(&k, lib, name)`: a name.
    pub const NAMED: u32 = 8;
    /// `cuKernelGetFunction(&f, k)`: `f` is `k`'s kernel.
    pub const ALIAS: u32 = 9;
    /// `__cudaGetKernel(&k, stub)`: `k` launches `stub`'s kernel.
    pub const STUB: u32 = 10;
    /// `cudaLaunchKernel(stub, ...)` and its forms: not counted here, passed to the driver's
    /// launch probe.
    pub const RUNTIME_LAUNCH: u32 = 11;
}

/// Bytes of a kernel's name kept (mangled; longer ones are cut and said so by userspace).
pub const LOOKUP_NAME_MAX: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Lookup {
    /// One of [`lookup`].
    pub what: u32,
    /// Bytes of `name` read (with its NUL), 0 when none.
    pub len: u32,
    /// [`lookup::ALIAS`]: the kernel handle; [`lookup::STUB`]: the stub.
    pub target: u64,
    pub name: [u8; LOOKUP_NAME_MAX],
}

/// A look-up call in progress (`CUDA_LOOKING`, by thread): its arguments, read at its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Looking {
    pub what: u32,
    pub _pad: u32,
    /// Where the handle is written.
    pub out: u64,
    /// The name's address, or the handle / stub passed in.
    pub arg: u64,
}

/// A runtime launch passing to the driver (`CUDA_RUNTIME`, by thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeLaunch {
    pub stub: u64,
    /// The stack pointer at the runtime's entry: the driver's probe takes the stub only from
    /// deeper in the same call.
    pub sp: u64,
    /// The runtime's return address (on x86_64 at `sp`): while the call lasts it stays there.
    pub ra: u64,
    pub ts_ns: u64,
}

/// Look-ups remembered in the kernel between drains (an LRU: 2.2 MiB at most).
pub const CUDA_LOOKUPS_MAX: u32 = 4096;
/// A runtime launch's stub is taken by a driver launch within this long (the same call). Long:
/// a process's first launch of a kernel loads its module in between (lazy loading, a JIT), and
/// the first call on a loaded machine took more than 5 ms here; the stack checks do the rest.
pub const RUNTIME_WITHIN_NS: u64 = 1_000_000_000;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaCount {
    pub calls: u64,
    pub bytes: u64,
    /// Nanoseconds blocked (synchronisations).
    pub ns: u64,
}

/// A synchronisation in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Pending {
    pub hash: u64,
    pub start_ns: u64,
    pub pid: u32,
    /// The generation whose stack map holds its stack.
    pub generation: u32,
}

/// One owner's (user id's) use of the counts and stacks maps in one generation: a share each, so
/// that one user's distinct stacks cannot fill the maps every process shares (`CUDA_OWNERS`,
/// cleared with its generation's counts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub uid: u32,
    /// The generation's low bit ([`CudaKey`]'s map).
    pub generation: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerUse {
    /// Count keys the owner added in the generation.
    pub keys: u32,
    /// Stacks the owner added to the generation's `CUDA_STACKS_*`.
    pub stacks: u32,
    /// Calls whose count or stack was not kept: the owner's share was used, or a map was full.
    pub dropped: u64,
}

/// The keys of the counts map one owner may add in a generation (a quarter: a user's flood
/// leaves three quarters to the others, root's trainers among them). The kernel adds without
/// atomics, so a burst on many CPUs at once can pass it by a few.
pub const OWNER_KEYS_MAX: u32 = CUDA_COUNTS_MAX / 4;
/// The stacks one owner may add to a generation's stack map: a quarter.
pub const OWNER_STACKS_MAX: u32 = CUDA_STACKS_MAX / 4;
/// Owners tracked per generation (two generations): more users than that calling CUDA in one
/// second have their calls dropped and counted under no owner.
pub const CUDA_OWNERS_MAX: u32 = 512;
/// Processes the rate guard has switched off at once (`CUDA_GATE`, by pid).
pub const CUDA_GATE_MAX: u32 = 4096;

/// Distinct stacks calling within one generation (a drain's interval), each map; sized to the
/// memory budget's `OTHER_MAPS` (3.1 KiB a record: 1.6 MiB a map).
pub const CUDA_STACKS_MAX: u32 = 512;
pub const CUDA_COUNTS_MAX: u32 = 4096;
pub const CUDA_PENDING_MAX: u32 = 4096;
const _: () = assert!(COMM_LEN == 16);

#[cfg(feature = "user")]
unsafe impl aya::Pod for CudaKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for CudaCount {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Pending {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for OwnerKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for OwnerUse {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for LookupKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Lookup {}
