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
//! the place of the interpreter's `_PyEval_EvalFrameDefault` frames that ran them (`merge`).

mod code;
mod debug_offsets;
mod eval_body;
mod layout;
mod legacy_lines;
mod lines;
mod names;
mod unread;

use std::sync::Arc;

use profiler_common::python::{ENTRY_FRAME, PyProc};

use super::{Frame, Runtime};
use crate::model::Location;
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
        let frames = frames(words);
        let found: Vec<Option<&Arc<str>>> =
            frames.iter().map(|&(code, instr, _)| names.cached(pid, layout, code, instr)).collect();
        found.iter().flatten().for_each(|n| crate::prefetch::arc_count(n));
        let found: Vec<Option<Arc<str>>> = found.into_iter().map(Option::<&Arc<str>>::cloned).collect();
        let python: Vec<(Arc<str>, bool)> = frames
            .into_iter()
            .zip(found)
            .map(|((code, instr, entry), name)| (name.unwrap_or_else(|| names.name(pid, layout, code, instr)), entry))
            .collect();
        merge(native, python, |f| is_eval(layout, f))
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

/// A native frame that runs Python frames: `_PyEval_EvalFrameDefault` by name, or, in a build
/// that split the loop off that name, an address of the loop in the interpreter's own file.
fn is_eval(layout: &Layout, frame: &Frame) -> bool {
    &*frame.0 == EVAL_FRAME
        || layout.eval_body.is_some_and(|(start, end)| {
            (start..end).contains(&frame.1.addr) && layout::version_of(&frame.1.file).is_some()
        })
}

/// Puts Python frames where the interpreter ran them. `user` is root first; `python` holds
/// `(name, starts its evaluation)` leaf first. Each `_PyEval_EvalFrameDefault`, from the leaf
/// outwards, is replaced by the Python frames it ran: up to and including the next frame that
/// began its evaluation. Python frames left over (the native walk stopped short of their
/// evaluation) go on the root side.
/// A Python frame takes the location of the evaluation frame it replaces (the interpreter runs
/// it); the frames left over, that of the outermost one.
/// The names are moved, not cloned: each clone is an atomic add on a name's count, a cache miss
/// apiece for names spread over the heap.
fn merge(user: Vec<Frame>, python: Vec<(Arc<str>, bool)>, is_eval: impl Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::with_capacity(user.len() + python.len());
    let mut python = python.into_iter().peekable();
    let mut outermost = Location::default();
    for native in user.into_iter().rev() {
        if python.peek().is_some() && is_eval(&native) {
            for (name, entry) in python.by_ref() {
                out.push((name, native.1.clone()));
                if entry {
                    break;
                }
            }
            outermost = native.1;
        } else {
            out.push(native);
        }
    }
    out.reverse();
    // Frames left over belong to evaluations further out than the native walk reached (it was
    // cut short): they go on the root side, so the Python story stays whole.
    let left: Vec<Arc<str>> = python.map(|p| p.0).collect();
    if !left.is_empty() {
        let mut merged: Vec<Frame> = left.into_iter().rev().map(|name| (name, outermost.clone())).collect();
        merged.append(&mut out);
        return merged;
    }
    out
}

/// The sampler's words as `(code object, instruction address, starts its evaluation)`, leaf
/// first; a shim pair `(0, ENTRY_FRAME)` marks the frame before it and is dropped.
fn frames(words: &[u64]) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::with_capacity(words.len() / 2);
    for w in words.chunks_exact(2) {
        if w[0] == 0 {
            if let Some(last) = out.last_mut() {
                last.2 = true;
            }
        } else {
            out.push((w[0], w[1] & !ENTRY_FRAME, w[1] & ENTRY_FRAME != 0));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Native frames, each in a file of its own (`/f<i>`) at address `i`.
    fn a(v: &[&str]) -> Vec<(Arc<str>, Location)> {
        v.iter()
            .enumerate()
            .map(|(i, s)| (Arc::from(*s), Location { file: format!("/f{i}").into(), addr: i as u64 }))
            .collect()
    }

    fn by_name(f: &Frame) -> bool {
        &*f.0 == EVAL_FRAME
    }

    /// A build whose loop has no name: its frames are found by address in the interpreter.
    #[test]
    fn a_loop_without_a_name_is_found_by_its_addresses() {
        let mut layout = *table_layout(12).expect("3.12");
        layout.eval_body = Some((0x43d73e, 0x450458));
        let at = |name: &str, file: &str, addr: u64| (Arc::from(name), Location { file: file.into(), addr });
        let py = "/srv/root/usr/bin/python3.13";
        let user = vec![
            at("Py_RunMain", py, 0x600000),
            at("python3.13+0x44c4b4", py, 0x44c4b4),
            at("PyObject_CallOneArg", py, 0x500000),
            at("python3.13+0x4490b3", py, 0x4490b3),
            at("libfoo.so+0x4490b3", "/usr/lib/libfoo.so", 0x4490b3),
        ];
        let python = vec![(Arc::from("inner"), true), (Arc::from("outer"), true)];
        let merged = merge(user.clone(), python.clone(), |f| is_eval(&layout, f));
        assert_eq!(names(&merged), ["Py_RunMain", "outer", "PyObject_CallOneArg", "inner", "libfoo.so+0x4490b3"]);
        layout.eval_body = None;
        let unplaced = merge(user, python, |f| is_eval(&layout, f));
        assert_eq!(&*unplaced[0].0, "outer", "without the loop's addresses: on the root side");
    }

    fn names(frames: &[(Arc<str>, Location)]) -> Vec<&str> {
        frames.iter().map(|s| &*s.0).collect()
    }

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

    #[test]
    fn each_evaluation_gets_its_python_frames() {
        // Native, root first: main → eval → C extension → eval (leaf side).
        let user = a(&["main", "Py_RunMain", EVAL_FRAME, "ext_call", EVAL_FRAME, "leaf_c"]);
        // Python, leaf first: inner (run by the leaf-side eval, its entry), then outer, top.
        let python = [(Arc::from("inner"), true), (Arc::from("middle"), false), (Arc::from("top"), true)];
        let merged = merge(user.clone(), python.to_vec(), by_name);
        assert_eq!(names(&merged), ["main", "Py_RunMain", "top", "middle", "ext_call", "inner", "leaf_c"]);
        // Each Python frame lives where the interpreter frame running it does.
        let files: Vec<&str> = merged.iter().map(|s| &*s.1.file).collect();
        assert_eq!(files, ["/f0", "/f1", "/f2", "/f2", "/f3", "/f4", "/f5"]);
    }

    #[test]
    fn a_shim_frame_marks_the_frame_before_it() {
        assert_eq!(
            frames(&[0x10, 0x100, 0, ENTRY_FRAME, 0x20, 0x200, 0x30, 0x301]),
            [(0x10, 0x100, true), (0x20, 0x200, false), (0x30, 0x300, true)]
        );
    }

    #[test]
    fn frames_of_evaluations_the_native_walk_did_not_reach_go_on_the_root_side() {
        let user = a(&["[unknown]", EVAL_FRAME, "leaf_c"]);
        let python = [(Arc::from("inner"), true), (Arc::from("outer"), false)];
        let merged = merge(user.clone(), python.to_vec(), by_name);
        assert_eq!(names(&merged), ["outer", "[unknown]", "inner", "leaf_c"]);
        assert_eq!(&*merged[0].1.file, "/f1", "the outermost evaluation's file");
        assert_eq!(names(&merge(a(&["[unknown]"]), python.to_vec(), by_name)), ["outer", "inner", "[unknown]"]);
    }

    #[test]
    fn without_python_frames_the_native_stack_is_unchanged() {
        let user = a(&["main", EVAL_FRAME, "x"]);
        assert_eq!(merge(user.clone(), Vec::new(), by_name), user);
    }
}
