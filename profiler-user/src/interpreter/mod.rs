//! Language runtimes whose own frames the profiler shows: one folder per runtime, each behind
//! [`Runtime`]. A runtime says what the kernel side needs to walk its frames (is a mapped file
//! one of its own, which version, where its state is, the offsets the walker reads) and how
//! those frames get their names (read from the process's memory, cached, and put in place of
//! the native frames of the interpreter that ran them).
//!
//! CPython is the one runtime (`python`). Another would be a sibling folder with its own
//! `Runtime`, its own walker on the kernel side (`profiler-ebpf`) and its own words in the
//! sampler's records. The unwinder and the symbolizer import this room; it imports neither,
//! so what a runtime looks like is said once, below both.

pub mod python;

use std::sync::Arc;

use crate::model::Location;

/// A frame's name and where it lives, root first in a stack.
pub type Frame = (Arc<str>, Location);

/// What the profiler needs of one language runtime.
pub trait Runtime {
    /// A build of the runtime, as a mapped file's name says it is.
    type Version: Copy + std::fmt::Display;
    /// One build's layout: the offsets the kernel side's walker and the frame namer read.
    type Layout: 'static;
    /// What the kernel side's walker is given for one process (a `profiler_common` type).
    type Process;
    /// The names of the runtime's frames, cached across samples.
    type Names: Default;
    /// Why a process's runtime frames are not read (its native frames still are).
    type Refused: std::error::Error;

    /// The version a mapped file's name says it is, if the file is one of the runtime's.
    fn version_of(path: &str) -> Option<Self::Version>;

    /// Where the runtime's state is in a file (an ELF virtual address), from its symbols.
    fn state_in<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Option<u64>;

    /// The layout of process `pid`'s runtime, of `version`, whose state is at `state`: what
    /// the runtime publishes of itself (read from the process and checked), or a table kept
    /// for its version; the error says why its frames are not read.
    fn layout(pid: u32, version: Self::Version, state: u64) -> Result<Self::Layout, Self::Refused>;

    /// The walker's description of a process whose runtime state is at `state`; `None` when
    /// such a process cannot be walked on this machine.
    fn describe(layout: &Self::Layout, state: u64) -> Option<Self::Process>;

    /// `native` (root first) with the runtime frames the sampler sent as `words` named and put
    /// where the interpreter ran them.
    fn name_frames(
        names: &mut Self::Names,
        pid: u32,
        layout: &Self::Layout,
        native: Vec<Frame>,
        words: &[u64],
    ) -> Vec<Frame>;
}
