//! Where a stripped interpreter keeps its evaluation loop. Python frames go where the native
//! stack has `_PyEval_EvalFrameDefault` frames (`merge`), found by name. Debian's 3.13 and 3.14
//! are built so that the exported `_PyEval_EvalFrameDefault` is a small part (2-3 KiB) and the
//! loop itself a split-off function without a symbol (the binary is stripped): its frames read
//! `python3.13+0x…`, and every Python frame went to the root of the stack instead of between
//! the C frames that called back into Python.
//!
//! The loop is then found as the function whose unwind entry (`.eh_frame`) is by far the
//! largest of the file (77 and 84 KiB there; the next 33 KiB): only when the exported symbol is
//! small, and the largest entry at least 32 KiB and twice the next, so a build named whole, or
//! one without so clear a giant, keeps the name match alone.

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{Object, ObjectSection, ObjectSymbol};

/// An exported `_PyEval_EvalFrameDefault` at least this long is the loop itself.
const WHOLE: u64 = 16 << 10;
/// The split-off loop is at least this long, and twice the next function.
const LOOP_MIN: u64 = 32 << 10;

/// The split-off evaluation loop's addresses (ELF virtual addresses, end exclusive), if the
/// file's exported `_PyEval_EvalFrameDefault` is not the loop itself.
pub fn find<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Option<(u64, u64)> {
    let exported = file.dynamic_symbols().chain(file.symbols()).find(|s| s.name() == Ok("_PyEval_EvalFrameDefault"))?;
    if exported.size() >= WHOLE {
        return None;
    }
    let section = file.section_by_name(".eh_frame")?;
    let mut eh = EhFrame::new(section.data().ok()?, LittleEndian);
    eh.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let (mut first, mut second) = ((0u64, 0u64), 0u64);
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else { continue };
        let len = fde.len();
        if len > first.1 {
            second = first.1;
            first = (fde.initial_address(), len);
        } else if len > second {
            second = len;
        }
    }
    (first.1 >= LOOP_MIN && first.1 >= 2 * second).then(|| (first.0, first.0 + first.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian sid's 3.13 and 3.14 (the Python test's root) split the loop off; noble's 3.12 and
    /// the machine's 3.11 export it whole.
    #[test]
    fn the_split_loop_is_found_only_where_the_build_split_it() {
        let roots = std::env::var("PROFILER_PYTHON_ROOTS").unwrap_or_else(|_| "/var/cache/profiler-tests/roots".into());
        let files = [
            (format!("{roots}/sid/usr/bin/python3.13"), true),
            (format!("{roots}/sid/usr/bin/python3.14"), true),
            (format!("{roots}/noble/usr/bin/python3.12"), false),
            ("/usr/bin/python3.11".to_string(), false),
        ];
        let mut checked = 0;
        for (path, split) in &files {
            let Ok(data) = std::fs::read(path) else { continue };
            let file = object::File::parse(&*data).expect("ELF");
            let found = find(&file);
            assert_eq!(found.is_some(), *split, "{path}: {found:x?}");
            if let Some((start, end)) = found {
                assert!(end - start >= LOOP_MIN, "{path}");
            }
            checked += 1;
        }
        if checked < files.len() {
            profiler_common::test_skip::skip(&format!(
                "the_split_loop_is_found_only_where_the_build_split_it: {checked} of {} interpreters found (cargo xtask setup makes the roots)",
                files.len()
            ));
        }
    }
}
