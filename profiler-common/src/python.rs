//! CPython frames: for a process running CPython 3.9+, userspace describes where the
//! interpreter keeps its state ([`PyProc`]); the sampler finds the sampled thread's
//! `PyThreadState` and copies its interpreter frames into the record, after the native ones,
//! as pairs `(code object address, instruction address | flags)`, leaf first (before 3.11,
//! `(code object, f_lasti << 1 | ENTRY_FRAME)`: see [`PyProc::every_frame_entry`]). Userspace
//! names them from the process's memory and puts them where `_PyEval_EvalFrameDefault` runs
//! them.

/// Python frames copied per sample.
pub const MAX_PYTHON_FRAMES: usize = 48;
/// Threads of an interpreter searched for the sampled one.
pub const MAX_PYTHON_THREADS: usize = 32;
/// Slot of the Python program in the sampler's program array.
pub const PYTHON_PROGRAM: u32 = 1;
/// In the instruction word: this frame is the outermost one its `_PyEval_EvalFrameDefault`
/// call runs (3.11's `is_entry`). A pair `(0, ENTRY_FRAME)` is a 3.12+ C-stack shim frame: the
/// frame before it began an evaluation.
pub const ENTRY_FRAME: u64 = 1;
/// `NONE` in an offset: the field does not exist in this version.
pub const NONE: u16 = u16::MAX;
/// Low bits of a frame's code reference that are not the address: 3.14's `f_executable` is a
/// `_PyStackRef`, a pointer tagged in its low bits (objects are at least 8-aligned, so masking
/// changes nothing for the plain pointers of earlier versions).
pub const CODE_TAG_BITS: u64 = 7;

/// Where one CPython process keeps what a stack walk needs (offsets from its headers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub interpreters_head: u16,
    pub threads_head: u16,
    pub tstate_next: u16,
    /// The thread's kernel id (3.11+), or its `pthread_t` when `pthread_tid` is set.
    pub tstate_native_thread_id: u16,
    /// `cframe` (3.11, 3.12) or `current_frame` (3.13+).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame`, or [`NONE`] when `tstate_frame` is the frame itself.
    pub cframe_current: u16,
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instr: u16,
    pub frame_owner: u16,
    /// 3.11's `is_entry`, else [`NONE`].
    pub frame_is_entry: u16,
    /// The lowest `owner` value of frames that are not Python functions' own (3.12 and 3.13:
    /// the C-stack shim, 3; 3.14: the interpreter's entry frame, 3, and C-stack frames, 4), else
    /// [`NONE`].
    pub owner_shim: u16,
    /// Before 3.11 a thread state knows its `pthread_t`, not its kernel id: the id is read from
    /// the C library's thread descriptor at this offset (glibc's `struct pthread.tid`); else
    /// [`NONE`].
    pub pthread_tid: u16,
    /// 1 when each interpreter call runs one frame (before 3.11: frame objects), so every
    /// frame is an entry frame. `frame_instr` is then the offset of the frame object's
    /// `int f_lasti` (3.9: a byte offset, 3.10: an instruction index), sent as
    /// `(f_lasti as u32) << 1 | ENTRY_FRAME`.
    pub every_frame_entry: u16,
    pub _pad: [u16; 2],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for PyProc {}
