//! Finding CPython in a process and describing it to the sampler (`profiler_common::python`);
//! the same offsets let the names be read (`code`).
//! 3.13 and later publish their own offsets (`_Py_DebugOffsets`, read by `debug_offsets`); the
//! versions before keep a table here, from their own headers (`offsetof` against the internal
//! headers of CPython 3.9.18, 3.10.13, 3.11.7 and 3.12.1), each checked by the Python test
//! against a distribution's build (bullseye's 3.9.2, jammy's 3.10.4, Debian's 3.11, noble's
//! 3.12.3). A version neither describes gets native frames only.

use object::{Object, ObjectSymbol};
use profiler_common::python::{NONE, PyProc};

/// How a code object maps its instructions to lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// 3.9's `co_lnotab`: (byte offset delta, line delta) pairs; `f_lasti` a byte offset.
    Lnotab,
    /// 3.10's `co_linetable`: (byte length, line delta) pairs; `f_lasti` an instruction index.
    Pairs,
    /// 3.11+'s location table (`lines`); instruction addresses.
    Locations,
}

/// What the sampler and the symbolizer need of one CPython build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub minor: u8,
    /// The sampler's offsets; `runtime` is filled per process.
    pub proc: PyProc,
    /// `co_qualname`, or `co_name` before 3.11 (which has no qualified names).
    pub code_qualname: u64,
    /// `co_code_adaptive` (where the instructions start, 3.11+), or 0.
    pub code_adaptive: u64,
    /// `co_linetable` (`co_lnotab` in 3.9), in `lines`' format.
    pub code_linetable: u64,
    pub lines: LineFormat,
    pub code_filename: u64,
    pub code_firstlineno: u64,
    /// A `str`'s length and state, where a compact ASCII string's bytes start
    /// (`sizeof(PyASCIIObject)`), and a compact non-ASCII one's (`sizeof(PyCompactUnicodeObject)`).
    pub str_length: u64,
    pub str_state: u64,
    pub ascii_data: u64,
    pub compact_data: u64,
    /// A `bytes` object's size and contents.
    pub bytes_size: u64,
    pub bytes_data: u64,
    /// The evaluation loop of a build that split it off its exported name (`eval_body`): ELF
    /// virtual addresses in the interpreter's file; set per file.
    pub eval_body: Option<(u64, u64)>,
}

impl Layout {
    /// The code unit (2 bytes) a frame runs, from the sampler's instruction word without its
    /// flag; `None` when the frame has not started or the word says nothing.
    pub fn unit(&self, code: u64, instr: u64) -> Option<u64> {
        match self.lines {
            // `f_lasti` was sent shifted past the flag; -1 before the first instruction.
            LineFormat::Lnotab => u64::try_from((instr >> 1) as u32 as i32).ok().map(|byte| byte / 2),
            LineFormat::Pairs => u64::try_from((instr >> 1) as u32 as i32).ok(),
            LineFormat::Locations => {
                let start = code.wrapping_add(self.code_adaptive);
                (instr >= start).then(|| (instr - start) / 2)
            }
        }
    }
}

pub(super) const fn proc(o: [u16; 11]) -> PyProc {
    PyProc {
        runtime: 0,
        interpreters_head: o[0],
        threads_head: o[1],
        tstate_next: o[2],
        tstate_native_thread_id: o[3],
        tstate_frame: o[4],
        cframe_current: o[5],
        frame_code: o[6],
        frame_previous: o[7],
        frame_instr: o[8],
        frame_owner: o[9],
        frame_is_entry: o[10],
        owner_shim: NONE,
        pthread_tid: NONE,
        every_frame_entry: 0,
        _pad: [0; 2],
    }
}

/// 3.9 and 3.10: a thread state holds its `pthread_t` (see [`pthread_tid_offset`]) and the
/// frame objects it runs, one per interpreter call; `frame_instr` is `f_lasti`.
const fn frame_objects(minor: u8, f_lasti: u16, lines: LineFormat) -> Layout {
    Layout {
        minor,
        proc: PyProc { every_frame_entry: 1, ..proc([32, 8, 8, 176, 24, NONE, 32, 24, f_lasti, NONE, NONE]) },
        code_qualname: 112,
        code_filename: 104,
        code_firstlineno: 40,
        code_adaptive: 0,
        code_linetable: 120,
        lines,
        str_length: 16,
        str_state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
        eval_body: None,
    }
}

/// The versions that publish no layout of their own.
pub const TABLES: [Layout; 4] = [
    frame_objects(9, 104, LineFormat::Lnotab),
    frame_objects(10, 96, LineFormat::Pairs),
    Layout {
        minor: 11,
        proc: proc([40, 16, 8, 160, 56, 8, 32, 48, 56, 69, 68]),
        code_qualname: 128,
        code_filename: 112,
        code_firstlineno: 72,
        code_adaptive: 184,
        code_linetable: 136,
        lines: LineFormat::Locations,
        str_length: 16,
        str_state: 32,
        ascii_data: 48,
        compact_data: 72,
        bytes_size: 16,
        bytes_data: 32,
        eval_body: None,
    },
    Layout {
        minor: 12,
        proc: PyProc { owner_shim: 3, ..proc([40, 72, 8, 144, 56, 0, 0, 8, 56, 70, NONE]) },
        code_qualname: 128,
        code_filename: 112,
        code_firstlineno: 68,
        code_adaptive: 192,
        code_linetable: 136,
        lines: LineFormat::Locations,
        str_length: 16,
        str_state: 32,
        ascii_data: 40,
        compact_data: 56,
        bytes_size: 16,
        bytes_data: 32,
        eval_body: None,
    },
];

/// The table of CPython 3.`minor`, for the versions that publish no layout.
pub(super) fn table(minor: u8) -> Option<&'static Layout> {
    TABLES.iter().find(|l| l.minor == minor)
}

/// The sampler's description of a process whose `_PyRuntime` is at `runtime`; `None` when the
/// version needs the thread descriptor's layout and it is not known.
pub(super) fn describe(layout: &Layout, runtime: u64) -> Option<PyProc> {
    let mut p = PyProc { runtime, ..layout.proc };
    if p.every_frame_entry != 0 {
        p.pthread_tid = pthread_tid_offset()?;
    }
    Some(p)
}

/// Where glibc keeps a thread's kernel id in its thread descriptor (`pthread_self()` points to
/// it; offset 720 on x86_64 for many years). Found in this process, whose C library is the
/// machine's, by looking for the calling thread's id there, and checked on a second thread.
pub(super) fn pthread_tid_offset() -> Option<u16> {
    static OFFSET: std::sync::OnceLock<Option<u16>> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        let here = own_tid_offsets();
        let there = std::thread::spawn(own_tid_offsets).join().ok()?;
        here.into_iter().find(|o| there.contains(o))
    })
}

/// The offsets in the calling thread's descriptor that hold its kernel id.
fn own_tid_offsets() -> Vec<u16> {
    // SAFETY: no preconditions.
    let (me, tid) = unsafe { (libc::pthread_self() as *const u8, libc::gettid() as u32) };
    // glibc's descriptor is about 2.3 KiB; its first KiB holds the id.
    (0..1024u16)
        .step_by(4)
        // SAFETY: within the calling thread's own descriptor, which lives as long as the thread.
        .filter(|&o| unsafe { me.add(o as usize).cast::<u32>().read_unaligned() } == tid)
        .collect()
}

/// A CPython build as a mapped file's name says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub minor: u8,
    /// `python3.13t`, `libpython3.14t.so`: built without the GIL (`Py_GIL_DISABLED`).
    pub free_threaded: bool,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "3.{}{}", self.minor, if self.free_threaded { "t" } else { "" })
    }
}

/// The CPython 3 version a mapped file's name says it is (`python3.11`,
/// `libpython3.12.so.1.0`, `python3.13t`), if any.
pub(super) fn version_of(path: &str) -> Option<Version> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix("libpython3.").or_else(|| name.strip_prefix("python3."))?;
    let (digits, after) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len()));
    let free_threaded = after.starts_with('t');
    let after = after.strip_prefix('t').unwrap_or(after);
    if !(after.is_empty() || after.starts_with('.') || after.starts_with('d') || after.starts_with('m')) {
        return None;
    }
    Some(Version { minor: digits.parse().ok()?, free_threaded })
}

/// `_PyRuntime`'s address in the file (an ELF virtual address), from its symbol tables.
pub(super) fn runtime_vaddr<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Option<u64> {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok("_PyRuntime"))
        .map(|s| s.address())
        .filter(|a| *a != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_file_names() {
        let minor = |p: &str| version_of(p).map(|v| v.minor);
        assert_eq!(minor("/usr/bin/python3.11"), Some(11));
        assert_eq!(minor("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"), Some(12));
        assert_eq!(minor("/usr/lib/libpython3.13d.so"), Some(13));
        assert_eq!(minor("/usr/bin/python3"), None);
        assert_eq!(minor("/opt/python3.11-tools/helper"), None);
        assert_eq!(minor("/usr/bin/python3.14-config"), None);
        let gil = |p: &str| version_of(p).map(|v| v.free_threaded);
        assert_eq!(gil("/usr/bin/python3.13t"), Some(true));
        assert_eq!(gil("/usr/lib/libpython3.14t.so.1.0"), Some(true));
        assert_eq!(gil("/usr/lib/libpython3.14td.so.1.0"), Some(true));
        assert_eq!(gil("/usr/bin/python3.14"), Some(false));
        assert_eq!(version_of("/usr/bin/python3.13t").map(|v| v.to_string()).as_deref(), Some("3.13t"));
    }

    // 720 is x86_64 glibc's; arm64 finds its own (unverified: docs/arm64.md).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_thread_descriptor_holds_the_kernel_id_where_glibc_puts_it() {
        assert_eq!(pthread_tid_offset(), Some(720));
    }

    #[test]
    fn the_pythons_of_this_machine_export_their_runtime() {
        // Debian's, and the `python3` on PATH (pyenv's links libpython beside it).
        let mut paths: Vec<std::path::PathBuf> =
            ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"].map(Into::into).to_vec();
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
            .and_then(|p| std::fs::canonicalize(p).ok());
        if let Some(bin) = on_path {
            let lib = bin.parent().and_then(|d| d.parent()).map(|prefix| prefix.join("lib"));
            if let Some(Ok(entries)) = lib.map(std::fs::read_dir) {
                paths.extend(
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libpython3."))),
                );
            }
            paths.push(bin);
        }
        let mut found = 0;
        for (i, path) in paths.iter().enumerate() {
            let Ok(data) = std::fs::read(path) else { continue };
            let exported = object::File::parse(&*data).ok().and_then(|f| runtime_vaddr(&f)).is_some();
            // Debian's two files hold the runtime; a python3 linked to libpython holds none of its own.
            assert!(exported || i >= 2, "{} exports no _PyRuntime", path.display());
            if exported && version_of(&path.to_string_lossy()).is_some() {
                found += 1;
            }
        }
        // Nothing checked is a failure where CI says every check must run.
        if found == 0 {
            profiler_common::test_skip::skip(&format!(
                "the_pythons_of_this_machine_export_their_runtime: no CPython with an exported _PyRuntime among {paths:?}"
            ));
        }
        eprintln!("{found} CPython files checked");
    }
}
