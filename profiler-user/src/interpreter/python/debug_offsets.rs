//! The layout CPython 3.13+ publishes of itself: `_Py_DebugOffsets`, the first member of
//! `_PyRuntime` (what CPython's own remote debugging reads), with a cookie, the build's
//! `PY_VERSION_HEX`, whether it is free-threaded, and the size and offsets of each structure a
//! stack walk reads. Read from the process, checked, and made into a [`Layout`], so a patch
//! release or a distribution's own build needs no table.
//!
//! What is not published stays per version here: where each offset sits in the structure
//! (`SPEC_313`, `SPEC_314`: the field lists of `pycore_runtime.h` in 3.13 and
//! `pycore_debug_offsets.h` in 3.14, in order) and the frame `owner` from which frames are the
//! interpreter's own (3.13's `FRAME_OWNED_BY_CSTACK`, 3.14's `FRAME_OWNED_BY_INTERPRETER`).

use profiler_common::python::NONE;

use super::layout::{Layout, LineFormat, proc};

/// `_Py_Debug_Cookie`.
const COOKIE: &[u8; 8] = b"xdebugpy";

/// The structure's groups and their fields, in order, after the cookie, version and
/// free-threaded words; as far as the groups read here (the rest is not read).
type Spec = &'static [(&'static str, &'static [&'static str])];

const SPEC_313: Spec = &[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    ("interpreter_frame", &["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
];

const SPEC_314: Spec = &[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "threads_main",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
            "code_object_generation",
            "tlbc_generation",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    (
        "interpreter_frame",
        &["size", "previous", "executable", "instr_ptr", "localsplus", "owner", "stackpointer", "tlbc_index"],
    ),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
            "co_tlbc",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("set_object", &["size", "used", "table", "mask"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
];

/// The structure of 3.`minor` and the lowest frame `owner` that is not a function's.
fn spec(minor: u8) -> Option<(Spec, u16)> {
    match minor {
        13 => Some((SPEC_313, 3)),
        14 => Some((SPEC_314, 3)),
        _ => None,
    }
}

/// Bytes read from the start of `_PyRuntime`: the longest spec's words, with room.
pub(super) const READ_BYTES: usize = 8 * 96;

/// Why a CPython process's frames are not read (its native frames still are).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("CPython 3.{0} is a version this profiler does not read")]
    UnknownVersion(u8),
    #[error("a free-threaded build (no GIL): its frames are not read")]
    FreeThreaded,
    #[error("its published layout (_Py_DebugOffsets) fails a check: {0}")]
    Bad(String),
    #[error("its published layout (_Py_DebugOffsets) cannot be read from the process")]
    Unreadable,
}

impl Refused {
    /// The reason's label on `/metrics`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownVersion(_) => "unknown_version",
            Self::FreeThreaded => "free_threaded",
            Self::Bad(_) => "bad_layout",
            Self::Unreadable => "unreadable",
        }
    }
}

/// The layout process `pid` publishes at `runtime` (its `_PyRuntime`), checked.
pub(super) fn read(pid: u32, runtime: u64, minor: u8) -> Result<Layout, Refused> {
    let mut bytes = vec![0u8; READ_BYTES];
    if !super::code::read(pid, runtime, &mut bytes) {
        return Err(Refused::Unreadable);
    }
    parse(&bytes, minor)
}

/// The layout of a CPython 3.`minor` (from its file name) whose `_PyRuntime` starts with
/// `bytes`.
pub(super) fn parse(bytes: &[u8], minor: u8) -> Result<Layout, Refused> {
    let word = |i: usize| -> Option<u64> { Some(u64::from_ne_bytes(bytes.get(8 * i..8 * i + 8)?.try_into().ok()?)) };
    if bytes.get(..8) != Some(&COOKIE[..]) {
        return Err(Refused::Bad("no \"xdebugpy\" cookie at the start of _PyRuntime".into()));
    }
    let version = word(1).ok_or_else(|| Refused::Bad("too short".into()))?;
    let (major, published) = ((version >> 24) & 0xff, ((version >> 16) & 0xff) as u8);
    if major != 3 || published != minor {
        return Err(Refused::Bad(format!(
            "it says version {major}.{published} (PY_VERSION_HEX {version:#x}), its file name 3.{minor}"
        )));
    }
    // Free-threaded builds keep frames and code per thread (thread-local bytecode) and lock
    // objects differently: not read (no such build was at hand to check a reading against).
    if word(2) != Some(0) {
        return Err(Refused::FreeThreaded);
    }
    let Some((spec, owner_shim)) = spec(minor) else { return Err(Refused::UnknownVersion(minor)) };
    let at = |group: &str, field: &str| -> Result<u64, Refused> {
        let mut i = 3;
        for (g, fields) in spec {
            if *g == group {
                let k = fields.iter().position(|f| *f == field).expect("a field of the spec");
                return word(i + k).ok_or_else(|| Refused::Bad("too short".into()));
            }
            i += fields.len();
        }
        unreachable!("a group of the spec")
    };
    // Each group's size must be plausible, and each offset read (with its width) within it:
    // a structure misread (a spec that does not match) fails here rather than walk garbage.
    let sized = |group: &str, min: u64, max: u64| -> Result<u64, Refused> {
        let size = at(group, "size")?;
        if !(min..=max).contains(&size) {
            return Err(Refused::Bad(format!("{group} is {size} bytes")));
        }
        Ok(size)
    };
    let offset = |group: &str, field: &str, size: u64, width: u64| -> Result<u64, Refused> {
        let o = at(group, field)?;
        if o.checked_add(width).is_none_or(|end| end > size) {
            return Err(Refused::Bad(format!("{group}.{field} at {o}, past its {size} bytes")));
        }
        Ok(o)
    };
    let short = |group: &str, field: &str, size: u64, width: u64| -> Result<u16, Refused> {
        let o = offset(group, field, size, width)?;
        u16::try_from(o)
            .ok()
            .filter(|&o| o != NONE)
            .ok_or_else(|| Refused::Bad(format!("{group}.{field} at {o}, past what the sampler reads")))
    };
    let runtime = sized("runtime_state", 64, 64 << 20)?;
    let interp = sized("interpreter_state", 64, 64 << 20)?;
    let tstate = sized("thread_state", 64, 1 << 20)?;
    let frame = sized("interpreter_frame", 32, 4096)?;
    let code = sized("code_object", 64, 4096)?;
    let bytes_size = sized("bytes_object", 24, 256)?;
    let unicode = sized("unicode_object", 24, 256)?;
    let ascii = at("unicode_object", "asciiobject_size")?;
    if !(24..=unicode).contains(&ascii) {
        return Err(Refused::Bad(format!("a compact ASCII string's header is {ascii} bytes")));
    }
    let mut p = proc([
        short("runtime_state", "interpreters_head", runtime, 8)?,
        short("interpreter_state", "threads_head", interp, 8)?,
        short("thread_state", "next", tstate, 8)?,
        short("thread_state", "native_thread_id", tstate, 8)?,
        short("thread_state", "current_frame", tstate, 8)?,
        NONE,
        short("interpreter_frame", "executable", frame, 8)?,
        short("interpreter_frame", "previous", frame, 8)?,
        short("interpreter_frame", "instr_ptr", frame, 8)?,
        short("interpreter_frame", "owner", frame, 1)?,
        NONE,
    ]);
    p.owner_shim = owner_shim;
    Ok(Layout {
        minor,
        proc: p,
        code_qualname: offset("code_object", "qualname", code, 8)?,
        code_adaptive: offset("code_object", "co_code_adaptive", code, 0)?,
        code_linetable: offset("code_object", "linetable", code, 8)?,
        lines: LineFormat::Locations,
        code_filename: offset("code_object", "filename", code, 8)?,
        code_firstlineno: offset("code_object", "firstlineno", code, 4)?,
        str_length: offset("unicode_object", "length", ascii, 8)?,
        str_state: offset("unicode_object", "state", ascii, 4)?,
        ascii_data: ascii,
        // `PyCompactUnicodeObject`: the ASCII header, then `utf8_length` and `utf8`.
        compact_data: ascii + 16,
        bytes_size: offset("bytes_object", "ob_size", bytes_size, 8)?,
        bytes_data: offset("bytes_object", "ob_sval", bytes_size, 0)?,
        eval_body: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `_Py_DebugOffsets` of `spec` with `values` (group, field, value); other words 8.
    fn made(spec: Spec, version: u64, free_threaded: u64, values: &[(&str, &str, u64)]) -> Vec<u8> {
        let mut words = vec![0u64, version, free_threaded];
        for (g, fields) in spec {
            for f in *fields {
                let v = values.iter().find(|(vg, vf, _)| vg == g && vf == f).map_or(8, |v| v.2);
                words.push(v);
            }
        }
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes[..8].copy_from_slice(COOKIE);
        bytes.resize(READ_BYTES, 0);
        bytes
    }

    /// 3.13.0's own values (pyenv's build; the 3.13 table these replace).
    const V313: &[(&str, &str, u64)] = &[
        ("runtime_state", "size", 60_000),
        ("runtime_state", "interpreters_head", 632),
        ("interpreter_state", "size", 400_000),
        ("interpreter_state", "threads_head", 7344),
        ("thread_state", "size", 300),
        ("thread_state", "next", 8),
        ("thread_state", "native_thread_id", 160),
        ("thread_state", "current_frame", 72),
        ("interpreter_frame", "size", 80),
        ("interpreter_frame", "executable", 0),
        ("interpreter_frame", "previous", 8),
        ("interpreter_frame", "instr_ptr", 56),
        ("interpreter_frame", "owner", 70),
        ("code_object", "size", 208),
        ("code_object", "qualname", 128),
        ("code_object", "filename", 112),
        ("code_object", "firstlineno", 68),
        ("code_object", "linetable", 136),
        ("code_object", "co_code_adaptive", 200),
        ("bytes_object", "size", 40),
        ("bytes_object", "ob_size", 16),
        ("bytes_object", "ob_sval", 32),
        ("unicode_object", "size", 64),
        ("unicode_object", "state", 32),
        ("unicode_object", "length", 16),
        ("unicode_object", "asciiobject_size", 40),
    ];

    #[test]
    fn a_published_layout_becomes_the_walkers_offsets() {
        let l = parse(&made(SPEC_313, 0x030d00f0, 0, V313), 13).expect("3.13");
        let p = l.proc;
        assert_eq!(
            (p.interpreters_head, p.threads_head, p.tstate_next, p.tstate_native_thread_id),
            (632, 7344, 8, 160)
        );
        assert_eq!((p.tstate_frame, p.cframe_current, p.frame_code, p.frame_previous), (72, NONE, 0, 8));
        assert_eq!((p.frame_instr, p.frame_owner, p.frame_is_entry, p.owner_shim), (56, 70, NONE, 3));
        assert_eq!((l.code_qualname, l.code_filename, l.code_firstlineno), (128, 112, 68));
        assert_eq!((l.code_linetable, l.code_adaptive, l.ascii_data, l.compact_data), (136, 200, 40, 56));
        assert_eq!((l.str_length, l.str_state, l.bytes_size, l.bytes_data), (16, 32, 16, 32));
        // 3.14's structure has more fields before the frame's: the same values land the same.
        let l14 = parse(&made(SPEC_314, 0x030e0af0, 0, V313), 14).expect("3.14");
        assert_eq!(Layout { minor: 13, ..l14 }, l);
    }

    #[test]
    fn a_layout_that_fails_a_check_is_refused_with_its_reason() {
        let ok = made(SPEC_313, 0x030d00f0, 0, V313);
        assert_eq!(parse(&made(SPEC_313, 0x030d00f0, 1, V313), 13), Err(Refused::FreeThreaded));
        assert_eq!(parse(&made(SPEC_313, 0x030f02f0, 0, V313), 15), Err(Refused::UnknownVersion(15)));
        let mut bad_cookie = ok.clone();
        bad_cookie[0] = b'X';
        let bad = |r: Result<Layout, Refused>| match r {
            Err(Refused::Bad(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(bad(parse(&bad_cookie, 13)).contains("cookie"));
        assert!(bad(parse(&ok, 14)).contains("file name 3.14"), "the version must be the file's");
        assert!(bad(parse(&ok[..100], 13)).contains("too short"));
        let with = |g: &'static str, f: &'static str, v: u64| {
            let mut values = V313.to_vec();
            values.retain(|(vg, vf, _)| !(*vg == g && *vf == f));
            values.push((g, f, v));
            parse(&made(SPEC_313, 0x030d00f0, 0, &values), 13)
        };
        assert!(bad(with("interpreter_frame", "previous", 80)).contains("past its 80 bytes"));
        assert!(bad(with("interpreter_frame", "size", 1 << 20)).contains("interpreter_frame is"));
        assert!(bad(with("interpreter_state", "threads_head", 70_000)).contains("past what the sampler reads"));
        assert!(bad(with("unicode_object", "asciiobject_size", 4)).contains("header"));
        assert!(bad(with("code_object", "qualname", u64::MAX)).contains("past its"));
    }

    /// The real interpreters' published layouts, from their files (`_PyRuntime` is initialized
    /// data): Debian sid's 3.13 and 3.14 in the Python test's root, pyenv's 3.13 where present.
    #[test]
    fn real_interpreters_publish_what_the_specs_read() {
        let roots = std::env::var("PROFILER_PYTHON_ROOTS").unwrap_or_else(|_| "/var/cache/profiler-tests/roots".into());
        let home = std::env::var("HOME").unwrap_or_default();
        let files = [
            (format!("{roots}/sid/usr/bin/python3.13"), 13),
            (format!("{roots}/sid/usr/bin/python3.14"), 14),
            (format!("{home}/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0"), 13),
        ];
        let mut checked = 0;
        for (path, minor) in &files {
            let Ok(data) = std::fs::read(path) else { continue };
            let Some(bytes) = runtime_bytes(&data) else { panic!("{path}: no _PyRuntime in its data") };
            let l = parse(&bytes, *minor).unwrap_or_else(|e| panic!("{path}: {e}"));
            // What every 3.13/3.14 build keeps where it is.
            assert_eq!((l.proc.frame_previous, l.proc.tstate_next), (8, 8), "{path}");
            assert_eq!((l.str_length, l.str_state, l.bytes_data), (16, 32, 32), "{path}");
            eprintln!("{path}: {l:?}");
            checked += 1;
        }
        if checked < 2 {
            profiler_common::test_skip::skip(&format!(
                "real_interpreters_publish_what_the_specs_read: {checked} of {files:?} found (cargo xtask setup makes the roots)"
            ));
        }
    }

    /// The first [`READ_BYTES`] of `_PyRuntime` in an ELF file's initialized data.
    fn runtime_bytes(data: &[u8]) -> Option<Vec<u8>> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(data).ok()?;
        let vaddr = super::super::layout::runtime_vaddr(&file)?;
        let section = file.sections().find(|s| (s.address()..s.address() + s.size()).contains(&vaddr))?;
        let at = (vaddr - section.address()) as usize;
        Some(section.data().ok()?.get(at..at + READ_BYTES)?.to_vec())
    }
}
