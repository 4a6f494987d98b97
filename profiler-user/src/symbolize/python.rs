//! Names of CPython frames: the sampler sends each frame's code object address; its qualified
//! name, file and first line are read from the process's memory (`process_vm_readv`, bounded)
//! and cached per process and address (`names`). The frames then take the place of the interpreter's
//! `_PyEval_EvalFrameDefault` frames that ran them.

mod lines;
mod names;

use std::sync::Arc;

use profiler_common::python::ENTRY_FRAME;

use crate::{model::Location, unwind::python::Layout};
use names::Code;
pub use names::PyNames;

/// The native frame that runs Python frames.
pub const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";
/// Longest name or file name read.
const MAX_STR: usize = 512;

/// Longest line table read (a function of thousands of lines has a few KiB).
const MAX_LINE_TABLE: usize = 64 << 10;

/// A Python frame's name, `function (file:line)` as [`PyNames::name`] makes it, split into its
/// parts (for exports with fields for them); `None` for any other frame.
pub fn source(frame: &str) -> Option<(&str, &str, u32)> {
    let (function, rest) = frame.strip_suffix(')')?.rsplit_once(" (")?;
    let (file, line) = rest.rsplit_once(':')?;
    let line = line.parse().ok()?;
    (!function.is_empty() && !file.is_empty()).then_some((function, file, line))
}

fn describe(pid: u32, l: &Layout, code: u64) -> Option<Code> {
    let qualname = read_u64(pid, code.wrapping_add(l.code_qualname))?;
    let filename = read_u64(pid, code.wrapping_add(l.code_filename))?;
    let first_line = read_u32(pid, code.wrapping_add(l.code_firstlineno))? as i32 as i64;
    let name = read_str(pid, l, qualname)?;
    let file = read_str(pid, l, filename).unwrap_or_else(|| "?".into());
    let lines =
        (l.code_linetable != 0).then(|| read_bytes(pid, read_u64(pid, code.wrapping_add(l.code_linetable))?)).flatten();
    Some(Code::new(name, file, first_line, lines))
}

/// A `bytes` object's contents (`ob_size` at 16, `ob_sval` at 32 in every 3.x), at most
/// [`MAX_LINE_TABLE`] bytes.
fn read_bytes(pid: u32, obj: u64) -> Option<Vec<u8>> {
    let len = read_u64(pid, obj.wrapping_add(16))? as usize;
    if len > MAX_LINE_TABLE {
        return None;
    }
    let mut buf = vec![0u8; len];
    read(pid, obj.wrapping_add(32), &mut buf).then_some(buf)
}

/// Reads another process's memory. Every address here is computed from pointers read out of
/// that process (a frame being torn down holds garbage): offsets are added wrapping, and an
/// address that is not mapped there simply reads nothing. (An overflowing `+` on a garbage
/// pointer panicked the pipeline of a debug build, and the daemon with it.)
fn read(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: both vectors describe valid ranges (ours writable); the kernel checks theirs.
    let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    read(pid, addr, &mut b).then(|| u64::from_ne_bytes(b))
}

fn read_u32(pid: u32, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    read(pid, addr, &mut b).then(|| u32::from_ne_bytes(b))
}

/// A `str` object's text: compact ASCII or Latin-1 strings (what names and paths nearly always
/// are); anything else reads as `?`.
fn read_str(pid: u32, l: &Layout, obj: u64) -> Option<String> {
    // PyASCIIObject: ob_refcnt, ob_type, length at 16, hash, state at 32.
    let len = read_u64(pid, obj.wrapping_add(16))? as usize;
    let state = read_u32(pid, obj.wrapping_add(32))?;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact || kind != 1 {
        return Some("?".into());
    }
    let data = obj.wrapping_add(if ascii { l.ascii_data } else { l.compact_data });
    let mut buf = vec![0u8; len.min(MAX_STR)];
    if !read(pid, data, &mut buf) {
        return None;
    }
    Some(buf.iter().map(|&b| b as char).collect())
}

/// Puts Python frames where the interpreter ran them. `user` is root first; `python` holds
/// `(name, starts its evaluation)` leaf first. Each `_PyEval_EvalFrameDefault`, from the leaf
/// outwards, is replaced by the Python frames it ran: up to and including the next frame that
/// began its evaluation. Python frames left over (the native walk stopped short of their
/// evaluation) go on the root side.
/// A Python frame takes the location of the evaluation frame it replaces (the interpreter runs
/// it); the frames left over, that of the outermost one.
pub fn merge(user: &[(Arc<str>, Location)], python: &[(Arc<str>, bool)]) -> Vec<(Arc<str>, Location)> {
    let mut out: Vec<(Arc<str>, Location)> = Vec::with_capacity(user.len() + python.len());
    let mut next = 0;
    let mut outermost = Location::default();
    for native in user.iter().rev() {
        if &*native.0 == EVAL_FRAME && next < python.len() {
            outermost = native.1.clone();
            while next < python.len() {
                out.push((python[next].0.clone(), native.1.clone()));
                next += 1;
                if python[next - 1].1 {
                    break;
                }
            }
        } else {
            out.push(native.clone());
        }
    }
    out.reverse();
    // Frames left over belong to evaluations further out than the native walk reached (it was
    // cut short): they go on the root side, so the Python story stays whole.
    if next < python.len() {
        let mut merged: Vec<(Arc<str>, Location)> =
            python[next..].iter().rev().map(|p| (p.0.clone(), outermost.clone())).collect();
        merged.append(&mut out);
        return merged;
    }
    out
}

/// The sampler's words as `(code object, instruction address, starts its evaluation)`, leaf
/// first; a shim pair `(0, ENTRY_FRAME)` marks the frame before it and is dropped.
pub fn frames(words: &[u64]) -> Vec<(u64, u64, bool)> {
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

    /// Pointers read out of a frame being torn down are garbage: near the top of the address
    /// space, offsets added to them overflowed and panicked the pipeline (and the daemon).
    #[test]
    fn garbage_pointers_read_nothing_and_panic_nowhere() {
        let layout = crate::unwind::python::layout(11).expect("3.11's layout");
        let me = std::process::id();
        let mut names = PyNames::default();
        for code in [u64::MAX, u64::MAX - 3, u64::MAX - 40, 0, 8] {
            assert_eq!(&*names.name(me, layout, code, u64::MAX), "[python]");
            assert!(read_str(me, layout, code).is_none());
            assert!(read_bytes(me, code).is_none());
        }
    }

    /// Native frames, each in a file of its own (`/f<i>`) at address `i`.
    fn a(v: &[&str]) -> Vec<(Arc<str>, Location)> {
        v.iter()
            .enumerate()
            .map(|(i, s)| (Arc::from(*s), Location { file: format!("/f{i}").into(), addr: i as u64 }))
            .collect()
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
    fn each_evaluation_gets_its_python_frames() {
        // Native, root first: main → eval → C extension → eval (leaf side).
        let user = a(&["main", "Py_RunMain", EVAL_FRAME, "ext_call", EVAL_FRAME, "leaf_c"]);
        // Python, leaf first: inner (run by the leaf-side eval, its entry), then outer, top.
        let python = [(Arc::from("inner"), true), (Arc::from("middle"), false), (Arc::from("top"), true)];
        let merged = merge(&user, &python);
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
        let merged = merge(&user, &python);
        assert_eq!(names(&merged), ["outer", "[unknown]", "inner", "leaf_c"]);
        assert_eq!(&*merged[0].1.file, "/f1", "the outermost evaluation's file");
        assert_eq!(names(&merge(&a(&["[unknown]"]), &python)), ["outer", "inner", "[unknown]"]);
    }

    #[test]
    fn without_python_frames_the_native_stack_is_unchanged() {
        let user = a(&["main", EVAL_FRAME, "x"]);
        assert_eq!(merge(&user, &[]), user);
    }
}
