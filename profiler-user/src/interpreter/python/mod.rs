//! CPython, the one language runtime whose frames the profiler shows (behind
//! [`crate::interpreter::Runtime`]):
//! - `layout`: finding CPython in a process (a mapped `python3.X` or `libpython3.X`, its
//!   `_PyRuntime`) and the offsets of the versions before 3.13, for the kernel side's walker
//!   (`profiler_common::python`) and for the names;
//! - `debug_offsets`: the layout 3.13+ publishes of itself (`_Py_DebugOffsets`), read from the
//!   process and checked; why a process is not read (`Refused`), counted (`unread`);
//! - `code`: what a code object says of itself, read from the process's memory (bounded);
//! - `names`: the cache of frame names, per process and code object, within the memory budget;
//! - `lines`, `legacy_lines`: the line a frame is at, from its code object's line table (3.11+'s
//!   location table; 3.10's and 3.9's).
//!
//! The sampler sends each frame's code object address and instruction; the frames then take
//! the place of the interpreter's `_PyEval_EvalFrameDefault` frames that ran them, and the
//! interpreter's calls between two Python frames are left out (`merge`).

mod code;
mod debug_offsets;
mod eval_body;
mod layout;
mod legacy_lines;
mod lines;
mod merge;
mod names;
mod unread;

use std::sync::Arc;

use profiler_common::python::PyProc;

use super::{Frame, Runtime};
pub use debug_offsets::Refused;
pub use eval_body::find as eval_body;
pub use layout::{Layout, LineFormat, Version};
pub use names::PyNames;
pub use unread::{note_unread, unread_counts};

/// The native frame that runs Python frames.
const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// CPython 3.9 to 3.14.
pub struct CPython;

/// The first version that publishes its layout (`_Py_DebugOffsets`).
const PUBLISHES_LAYOUT: u8 = 13;

impl Runtime for CPython {
    type Version = Version;
    type Layout = Layout;
    type Process = PyProc;
    type Names = PyNames;
    type Refused = Refused;

    fn version_of(path: &str) -> Option<Version> {
        layout::version_of(path)
    }

    fn layout(pid: u32, version: Version, state: u64) -> Result<Layout, Refused> {
        if version.free_threaded {
            return Err(Refused::FreeThreaded);
        }
        if version.minor >= PUBLISHES_LAYOUT {
            return debug_offsets::read(pid, state, version.minor);
        }
        layout::table(version.minor).copied().ok_or(Refused::UnknownVersion(version.minor))
    }

    fn state_in<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Option<u64> {
        layout::runtime_vaddr(file)
    }

    fn describe(layout: &Layout, state: u64) -> Option<PyProc> {
        layout::describe(layout, state)
    }

    fn name_frames(names: &mut PyNames, pid: u32, layout: &Layout, native: Vec<Frame>, words: &[u64]) -> Vec<Frame> {
        // The names made already are looked up first, their counts prefetched, and only then
        // cloned: cloned as they were found, each clone waited for its count's cache miss in
        // turn (`crate::prefetch`). The others are made after, as before.
        let frames = merge::frames(words);
        let found = names.cached_all(pid, layout, &frames);
        found.iter().flatten().for_each(|n| crate::prefetch::arc_count(n));
        let found: Vec<Option<Arc<str>>> = found.into_iter().map(Option::<&Arc<str>>::cloned).collect();
        let python: Vec<(Arc<str>, bool)> = frames
            .into_iter()
            .zip(found)
            .map(|((code, instr, entry), name)| (name.unwrap_or_else(|| names.name(pid, layout, code, instr)), entry))
            .collect();
        merge::merge(native, python, |f| merge::is_eval(layout, f), merge::plumbing_in_files())
    }
}

/// The table kept for CPython 3.`minor` (3.9 to 3.12: the versions that publish no layout).
pub fn table_layout(minor: u8) -> Option<&'static Layout> {
    layout::table(minor)
}

/// A Python frame's name, `function (file:line)` as [`PyNames::name`] makes it, split into its
/// parts (for exports with fields for them); `None` for any other frame.
pub fn source(frame: &str) -> Option<(&str, &str, u32)> {
    let (function, rest) = frame.strip_suffix(')')?.rsplit_once(" (")?;
    let (file, line) = rest.rsplit_once(':')?;
    let line = line.parse().ok()?;
    (!function.is_empty() && !file.is_empty()).then_some((function, file, line))
}

/// The leaf-most Python frame ([`source`] reads it as one) of a stack's frames, root first: the
/// line a detector names (`step (train.py:42)`).
pub fn leaf_frame(frames: &[Arc<str>]) -> Option<&Arc<str>> {
    frames.iter().rev().find(|f| source(f).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_frame_name_splits_into_function_file_and_line() {
        assert_eq!(source("Outer.run (/srv/app.py:12)"), Some(("Outer.run", "/srv/app.py", 12)));
        assert_eq!(source("<module> (<frozen runpy>:88)"), Some(("<module>", "<frozen runpy>", 88)));
        assert_eq!(source("[unknown] (libc.so.6)"), None);
        assert_eq!(source("operator()(int)"), None);
        assert_eq!(source("libc.so.6+0x3fb9c"), None);
    }

    #[test]
    fn the_leaf_most_python_frame_is_the_one_nearest_the_leaf() {
        let stack = |v: &[&str]| v.iter().map(|f| Arc::from(*f)).collect::<Vec<Arc<str>>>();
        let s = stack(&["_start", "main (/srv/app.py:3)", "step (/srv/train.py:42)", "cudaLaunchKernel"]);
        assert_eq!(leaf_frame(&s).map(|f| &**f), Some("step (/srv/train.py:42)"));
        let s = stack(&["main (/srv/app.py:3)", "_call (<frozen importlib._bootstrap>:241)", "memcpy"]);
        assert_eq!(leaf_frame(&s).map(|f| &**f), Some("_call (<frozen importlib._bootstrap>:241)"));
        let s = stack(&["_start", "[unknown] (libc.so.6)", "operator()(int)", "libc.so.6+0x3fb9c"]);
        assert_eq!(leaf_frame(&s), None, "no Python frame");
        assert_eq!(leaf_frame(&[]), None);
    }
}
