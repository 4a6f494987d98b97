//! tracefs: mounted on demand (classic tracepoints need it), and tracepoint `format` files
//! parsed for field offsets, so the BPF side reads fields where this kernel puts them.

use std::path::Path;

const TRACEFS: &str = "/sys/kernel/tracing";

/// Mounts tracefs at /sys/kernel/tracing unless it (or debugfs's copy) is there already.
pub fn ensure_mounted() -> std::io::Result<()> {
    if Path::new(TRACEFS).join("events").exists() || Path::new("/sys/kernel/debug/tracing/events").exists() {
        return Ok(());
    }
    let target = std::ffi::CString::new(TRACEFS).expect("no NUL");
    let fstype = std::ffi::CString::new("tracefs").expect("no NUL");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Where tracefs is mounted (/sys/kernel/tracing, or debugfs's copy), if it is.
pub fn root() -> Option<std::path::PathBuf> {
    [TRACEFS, "/sys/kernel/debug/tracing"]
        .iter()
        .map(Path::new)
        .find(|p| p.join("events").exists())
        .map(Path::to_path_buf)
}

/// `(offset, size)` of a field in a tracepoint's format, e.g. `field("napi", "napi_poll", "work")`.
pub fn field(category: &str, event: &str, name: &str) -> Option<(usize, usize)> {
    let text = std::fs::read_to_string(Path::new(TRACEFS).join("events").join(category).join(event).join("format"))
        .or_else(|_| {
            std::fs::read_to_string(
                Path::new("/sys/kernel/debug/tracing/events").join(category).join(event).join("format"),
            )
        })
        .ok()?;
    parse_field(&text, name)
}

/// Finds `name` in the text of a `format` file.
pub fn parse_field(format: &str, name: &str) -> Option<(usize, usize)> {
    format.lines().find_map(|line| {
        // field:int work;	offset:20;	size:4;	signed:1;
        let mut parts = line.trim().split(';').map(str::trim);
        let decl = parts.next()?.strip_prefix("field:")?;
        if decl.rsplit(|c: char| c.is_whitespace() || c == '*').next()? != name {
            return None;
        }
        let offset = parts.next()?.strip_prefix("offset:")?.parse().ok()?;
        let size = parts.next()?.strip_prefix("size:")?.parse().ok()?;
        Some((offset, size))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAPI: &str = "name: napi_poll\nID: 1508\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:struct napi_struct * napi;\toffset:8;\tsize:8;\tsigned:0;\n\
        \tfield:__data_loc char[] dev_name;\toffset:16;\tsize:4;\tsigned:0;\n\
        \tfield:int work;\toffset:20;\tsize:4;\tsigned:1;\n\tfield:int budget;\toffset:24;\tsize:4;\tsigned:1;\n";

    #[test]
    fn finds_fields_by_name() {
        assert_eq!(parse_field(NAPI, "work"), Some((20, 4)));
        assert_eq!(parse_field(NAPI, "budget"), Some((24, 4)));
        assert_eq!(parse_field(NAPI, "napi"), Some((8, 8)));
        assert_eq!(parse_field(NAPI, "dev_name"), Some((16, 4)));
        assert_eq!(parse_field(NAPI, "missing"), None);
    }
}
