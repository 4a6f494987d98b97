//! Parsing `/proc/PID/maps`: which file (device, inode, offset) backs a user address.

/// One executable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// `makedev(major, minor)` of the backing file's device, as `stat` reports it.
    pub dev: u64,
    pub inode: u64,
    /// The path column: a file path, `[vdso]`, or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    /// Backed by a file (as opposed to anonymous memory, the heap, `[vdso]`).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The file was deleted (or replaced) after it was mapped.
    pub fn is_deleted(&self) -> bool {
        self.path.ends_with(" (deleted)")
    }

    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// Executable mappings of a maps file, sorted by address. Malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
    out.sort_by_key(|m| m.start);
    out
}

fn parse_line(line: &str) -> Option<Mapping> {
    // 7f1c2a400000-7f1c2a428000 r-xp 00028000 fd:01 1835131    /usr/lib/x86_64-linux-gnu/libc.so.6
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        dev: libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode,
        path,
    })
}

/// The mapping that holds `addr`.
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr);
    maps[..i].last().filter(|m| addr < m.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c1a00000-55d0c1a02000 r--p 00000000 fd:01 393320                     /usr/bin/cat
55d0c1a02000-55d0c1a07000 r-xp 00002000 fd:01 393320                     /usr/bin/cat
7f1c2a400000-7f1c2a428000 r--p 00000000 fd:01 1835131                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a428000-7f1c2a5bd000 r-xp 00028000 fd:01 1835131                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a600000-7f1c2a601000 r-xp 00000000 00:00 0 
7ffd5e1f4000-7ffd5e1f6000 r-xp 00000000 00:00 0                          [vdso]
7f00000000-7f00001000 r-xp 00001000 00:2a 77 /tmp/gone (deleted)
garbage line
";

    #[test]
    fn keeps_executable_mappings_sorted() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[0].path, "/tmp/gone (deleted)");
        assert!(maps[0].is_deleted());
        let libc = find(&maps, 0x7f1c2a428000 + 0x10).unwrap();
        assert_eq!(libc.inode, 1835131);
        assert_eq!(libc.dev, libc::makedev(0xfd, 1));
        assert_eq!(libc.file_offset(0x7f1c2a428010), 0x28010);
        assert!(libc.is_file());
        let anon = find(&maps, 0x7f1c2a600010).unwrap();
        assert!(!anon.is_file() && anon.path.is_empty());
        assert_eq!(find(&maps, 0x7ffd5e1f4001).unwrap().path, "[vdso]");
    }

    #[test]
    fn addresses_outside_mappings_find_nothing() {
        let maps = parse(MAPS);
        assert!(find(&maps, 0).is_none());
        assert!(find(&maps, 0x55d0c1a07000).is_none()); // end is exclusive
        assert!(find(&maps, 0x55d0c1a00010).is_none()); // not executable
        assert!(find(&maps, u64::MAX).is_none());
    }
}
