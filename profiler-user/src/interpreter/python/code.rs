//! What a CPython code object says of itself (qualified name, file, first line, line table),
//! read from the process's memory with `process_vm_readv`, bounded: every pointer here comes
//! from a process that may be tearing the object down.

use super::{layout::Layout, lines::Lines};

/// Longest name or file name read.
const MAX_STR: usize = 512;

/// Longest line table read (a function of thousands of lines has a few KiB).
const MAX_LINE_TABLE: usize = 64 << 10;

/// What a code object says of itself.
#[derive(Hash, PartialEq, Eq)]
pub(super) struct Code {
    /// `co_qualname` (`co_name` before 3.11).
    pub(super) name: String,
    pub(super) file: String,
    pub(super) first_line: i64,
    /// `co_linetable` (`co_lnotab` in 3.9), decoded.
    pub(super) lines: Option<Lines>,
}

/// The code object at `code` in process `pid`; `None` when it cannot be read (freed, garbage).
pub(super) fn read_code(pid: u32, l: &Layout, code: u64) -> Option<Code> {
    let qualname = read_u64(pid, code.wrapping_add(l.code_qualname))?;
    let filename = read_u64(pid, code.wrapping_add(l.code_filename))?;
    let first_line = read_u32(pid, code.wrapping_add(l.code_firstlineno))? as i32 as i64;
    let name = read_str(pid, l, qualname)?;
    let file = read_str(pid, l, filename).unwrap_or_else(|| "?".into());
    let lines = (l.code_linetable != 0)
        .then(|| read_bytes(pid, l, read_u64(pid, code.wrapping_add(l.code_linetable))?))
        .flatten()
        .map(|table| Lines::decode(l.lines, &table, first_line));
    Some(Code { name, file, first_line, lines })
}

/// A `bytes` object's contents, at most [`MAX_LINE_TABLE`] bytes.
fn read_bytes(pid: u32, l: &Layout, obj: u64) -> Option<Vec<u8>> {
    let len = read_u64(pid, obj.wrapping_add(l.bytes_size))? as usize;
    if len > MAX_LINE_TABLE {
        return None;
    }
    let mut buf = vec![0u8; len];
    read(pid, obj.wrapping_add(l.bytes_data), &mut buf).then_some(buf)
}

/// Reads another process's memory. Every address here is computed from pointers read out of
/// that process (a frame being torn down holds garbage): offsets are added wrapping, and an
/// address that is not mapped there simply reads nothing. (An overflowing `+` on a garbage
/// pointer panicked the pipeline of a debug build, and the daemon with it.)
pub(super) fn read(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
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
    // PyASCIIObject: ob_refcnt, ob_type, length, hash, state.
    let len = read_u64(pid, obj.wrapping_add(l.str_length))? as usize;
    let state = read_u32(pid, obj.wrapping_add(l.str_state))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::python::PyNames;

    /// Pointers read out of a frame being torn down are garbage: near the top of the address
    /// space, offsets added to them overflowed and panicked the pipeline (and the daemon).
    #[test]
    fn garbage_pointers_read_nothing_and_panic_nowhere() {
        let layout = super::super::layout::table(11).expect("3.11's layout");
        let me = std::process::id();
        let mut names = PyNames::default();
        for code in [u64::MAX, u64::MAX - 3, u64::MAX - 40, 0, 8] {
            assert_eq!(&*names.name(me, layout, code, u64::MAX), "[python]");
            assert!(read_str(me, layout, code).is_none());
            assert!(read_bytes(me, layout, code).is_none());
        }
    }
}
