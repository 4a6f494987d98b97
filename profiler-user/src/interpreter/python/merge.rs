//! Python frames put where the interpreter ran them. The sampler's words name each Python frame
//! (leaf first, each marked when it began an evaluation); the native walk has the interpreter's
//! evaluation frames (`_PyEval_EvalFrameDefault`, or addresses in a loop split off it). Each
//! evaluation frame is replaced by the Python frames it ran, and the interpreter's call
//! machinery between two Python frames (`PyObject_Call`, `_PyFunction_Vectorcall`, …) is left
//! out, as py-spy leaves out the interpreter's frames: a program reads the same on 3.9, whose
//! every Python call is an evaluation of its own reached through such frames, as on 3.11, which
//! runs most calls in one evaluation (and the store walks half the frames). What a user can act
//! on stays: C functions that call back into Python (`sorted()`, a C extension, libc's
//! `qsort`), the collector, the interpreter's frames on the root side and under the leaf-most
//! Python frame (`PyList_Append`), and every frame the interpreter's symbols do not name.

use std::sync::Arc;

use profiler_common::python::ENTRY_FRAME;

use super::{EVAL_FRAME, Frame, Layout, layout};
use crate::model::Location;

/// The sampler's words as `(code object, instruction address, starts its evaluation)`, leaf
/// first; a shim pair `(0, ENTRY_FRAME)` marks the frame before it and is dropped.
pub(super) fn frames(words: &[u64]) -> Vec<(u64, u64, bool)> {
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

/// A native frame that runs Python frames: `_PyEval_EvalFrameDefault` by name, or, in a build
/// that split the loop off that name, an address of the loop in the interpreter's own file.
pub(super) fn is_eval(layout: &Layout, frame: &Frame) -> bool {
    &*frame.0 == EVAL_FRAME
        || layout.eval_body.is_some_and(|(start, end)| {
            (start..end).contains(&frame.1.addr) && layout::version_of(&frame.1.file).is_some()
        })
}

/// The interpreter's call machinery, by name (prefixes, so that `.cold` and `.lto_priv` copies
/// match): the frames between a Python call and the evaluation it starts. A frame of the
/// interpreter not named here stays, named (`builtin_sorted`, `list_sort_impl`, `gc_collect`)
/// or not (`python3.11+0x…` in a stripped build, which may be `sorted()` calling back).
const CALLS: &[&str] = &[
    "PyObject_Call",
    "PyObject_Vectorcall",
    "PyVectorcall_",
    "_PyObject_Call",
    "_PyObject_Vectorcall",
    "_PyObject_FastCall",
    "_PyObject_MakeTpCall",
    "_PyFunction_Vectorcall",
    "_PyFunction_FastCall",
    "function_code_fastcall",
    "_PyEval_Vector",
    "_PyEval_EvalCode",
    "method_vectorcall",
    "cfunction_call",
    "cfunction_vectorcall",
    "_PyCFunction_FastCall",
    "slot_tp_call",
    "call_function",
    "do_call_core",
];

/// Whether `frame`, between two Python frames, is the interpreter's call machinery: named in
/// [`CALLS`] and in the interpreter's own file (`python3.X`, `libpython3.X`; checked once per
/// run of frames in one file, which share their `Arc`).
pub(super) fn plumbing_in_files() -> impl FnMut(&Frame) -> bool {
    let mut last: Option<(Arc<str>, bool)> = None;
    move |frame: &Frame| {
        if !is_call(&frame.0) {
            return false;
        }
        match &last {
            Some((file, is)) if Arc::ptr_eq(file, &frame.1.file) => *is,
            _ => {
                let is = layout::version_of(&frame.1.file).is_some();
                last = Some((frame.1.file.clone(), is));
                is
            }
        }
    }
}

fn is_call(name: &str) -> bool {
    CALLS.iter().any(|c| name.starts_with(c))
}

/// Puts Python frames where the interpreter ran them. `user` is root first; `python` holds
/// `(name, starts its evaluation)` leaf first. Each evaluation frame, from the leaf outwards, is
/// replaced by the Python frames it ran: up to and including the next frame that began its
/// evaluation; the native frames between two evaluations lose those `plumbing` says are.
/// Python frames left over (the native walk stopped short of their evaluation) go on the root
/// side.
/// A Python frame takes the location of the evaluation frame it replaces (the interpreter runs
/// it); the frames left over, that of the outermost one.
/// The names are moved, not cloned: each clone is an atomic add on a name's count, a cache miss
/// apiece for names spread over the heap.
pub(super) fn merge(
    user: Vec<Frame>,
    python: Vec<(Arc<str>, bool)>,
    is_eval: impl Fn(&Frame) -> bool,
    mut plumbing: impl FnMut(&Frame) -> bool,
) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::with_capacity(user.len() + python.len());
    let mut python = python.into_iter().peekable();
    let mut outermost = Location::default();
    // Where the native frames since the last Python frame begin in `out` (leaf first here).
    let mut since_python: Option<usize> = None;
    for native in user.into_iter().rev() {
        if python.peek().is_some() && is_eval(&native) {
            if let Some(from) = since_python {
                let mut kept = from;
                for i in from..out.len() {
                    if !plumbing(&out[i]) {
                        out.swap(kept, i);
                        kept += 1;
                    }
                }
                out.truncate(kept);
            }
            for (name, entry) in python.by_ref() {
                out.push((name, native.1.clone()));
                if entry {
                    break;
                }
            }
            since_python = Some(out.len());
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

    fn none(_: &Frame) -> bool {
        false
    }

    fn names(frames: &[(Arc<str>, Location)]) -> Vec<&str> {
        frames.iter().map(|s| &*s.0).collect()
    }

    /// A build whose loop has no name: its frames are found by address in the interpreter.
    #[test]
    fn a_loop_without_a_name_is_found_by_its_addresses() {
        let mut layout = *super::super::table_layout(12).expect("3.12");
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
        let merged = merge(user.clone(), python.clone(), |f| is_eval(&layout, f), none);
        assert_eq!(names(&merged), ["Py_RunMain", "outer", "PyObject_CallOneArg", "inner", "libfoo.so+0x4490b3"]);
        let merged = merge(user.clone(), python.clone(), |f| is_eval(&layout, f), plumbing_in_files());
        assert_eq!(
            names(&merged),
            ["Py_RunMain", "outer", "inner", "libfoo.so+0x4490b3"],
            "the call between them goes"
        );
        layout.eval_body = None;
        let unplaced = merge(user, python, |f| is_eval(&layout, f), none);
        assert_eq!(&*unplaced[0].0, "outer", "without the loop's addresses: on the root side");
    }

    #[test]
    fn each_evaluation_gets_its_python_frames() {
        // Native, root first: main → eval → C extension → eval (leaf side).
        let user = a(&["main", "Py_RunMain", EVAL_FRAME, "ext_call", EVAL_FRAME, "leaf_c"]);
        // Python, leaf first: inner (run by the leaf-side eval, its entry), then outer, top.
        let python = [(Arc::from("inner"), true), (Arc::from("middle"), false), (Arc::from("top"), true)];
        let merged = merge(user.clone(), python.to_vec(), by_name, none);
        assert_eq!(names(&merged), ["main", "Py_RunMain", "top", "middle", "ext_call", "inner", "leaf_c"]);
        // Each Python frame lives where the interpreter frame running it does.
        let files: Vec<&str> = merged.iter().map(|s| &*s.1.file).collect();
        assert_eq!(files, ["/f0", "/f1", "/f2", "/f2", "/f3", "/f4", "/f5"]);
    }

    /// 3.9's stack of three Python calls: an evaluation frame and call frames per Python frame,
    /// a C function calling back (named and not), an extension. Only the interpreter's named
    /// calls between Python frames go.
    #[test]
    fn the_interpreters_calls_between_python_frames_go_and_everything_else_stays() {
        let py = "/usr/bin/python3.9";
        let at = |name: &str, file: &str| (Arc::from(name), Location { file: file.into(), addr: name.len() as u64 });
        let user = vec![
            at("_start", py),
            at("Py_BytesMain", py),
            at("PyEval_EvalCode", py),
            at(EVAL_FRAME, py),
            at("_PyFunction_Vectorcall", py),
            at("function_code_fastcall", py),
            at(EVAL_FRAME, py),
            at("PyObject_Call", py),
            at("builtin_sorted", py),
            at("python3.9+0x1234", py),
            at("PyObject_Call", "/usr/lib/python3/dist-packages/_ext.so"),
            at("ext_call", "/usr/lib/python3/dist-packages/_ext.so"),
            at("PyObject_CallFunction", "/usr/lib/x86_64-linux-gnu/libpython3.9.so.1.0"),
            at("gc_collect_main", py),
            at(EVAL_FRAME, py),
            at("PyList_Append", py),
            at("list_resize", py),
        ];
        let python = vec![(Arc::from("leaf"), true), (Arc::from("middle"), true), (Arc::from("top"), true)];
        let merged = merge(user, python, by_name, plumbing_in_files());
        assert_eq!(
            names(&merged),
            [
                "_start",
                "Py_BytesMain",
                "PyEval_EvalCode",
                "top",
                "middle",
                "builtin_sorted",
                "python3.9+0x1234",
                "PyObject_Call",
                "ext_call",
                "gc_collect_main",
                "leaf",
                "PyList_Append",
                "list_resize"
            ]
        );
    }

    #[test]
    fn the_call_machinery_is_known_by_name() {
        for name in ["PyObject_Call", "_PyFunction_Vectorcall", "function_code_fastcall.lto_priv.0", "_PyEval_Vector"] {
            assert!(is_call(name), "{name}");
        }
        for name in ["builtin_sorted", "list_sort_impl", "gc_collect_main", "PyList_Append", "python3.9+0x1234", ""] {
            assert!(!is_call(name), "{name}");
        }
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
        let merged = merge(user.clone(), python.to_vec(), by_name, none);
        assert_eq!(names(&merged), ["outer", "[unknown]", "inner", "leaf_c"]);
        assert_eq!(&*merged[0].1.file, "/f1", "the outermost evaluation's file");
        assert_eq!(names(&merge(a(&["[unknown]"]), python.to_vec(), by_name, none)), ["outer", "inner", "[unknown]"]);
    }

    #[test]
    fn without_python_frames_the_native_stack_is_unchanged() {
        let user = a(&["main", EVAL_FRAME, "x"]);
        assert_eq!(merge(user.clone(), Vec::new(), by_name, plumbing_in_files()), user);
    }
}
