//! Parsing `/proc/PID/maps`: which file (device, inode, offset) backs a user address.
//!
//! A process decides how large its maps are: 60,000 mappings of one file under a 3,779-character
//! path are 230 MB of text, which the kernel takes seconds to write. So the file is read line by
//! line (never whole) within a byte and a time budget, a path is kept once per file and
//! shortened, and the mappings kept per file and per process are bounded. A read that hit a
//! budget says so: the caller then re-reads that process's maps less often.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read as _},
    sync::Arc,
};

/// Most executable mappings kept per process, and per file within it (a program maps each of
/// its files executable once; more is a JIT or an attack, and the rest re-read the maps on a miss).
pub const MAX_MAPPINGS: usize = 1024;
pub const MAX_MAPPINGS_PER_FILE: usize = 64;
/// Most bytes of a path kept (its file name, the part that is shown, is kept whole).
pub const MAX_PATH_BYTES: usize = 256;
/// Most bytes of maps text read per process; the rest is not looked at. A real process's maps
/// are tens of KB (a line is ~100 bytes); 4 MiB took ~0.2 s of kernel time at 3.8 KB a line.
pub const MAX_MAPS_BYTES: u64 = 4 << 20;
/// Most time one read of a maps file may take.
pub const MAPS_READ_BUDGET: std::time::Duration = std::time::Duration::from_millis(20);
/// A maps line is at most a path (PATH_MAX) and its fields.
const MAX_LINE_BYTES: u64 = 4096 + 256;

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
    /// The path column: a file path, `[vdso]`, or empty for anonymous memory; shared by the
    /// mappings of one file, at most `MAX_PATH_BYTES` (plus a marker) long.
    pub path: Arc<str>,
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

/// What one read of a process's maps found.
#[derive(Debug, Default)]
pub struct Read {
    pub maps: Vec<Mapping>,
    /// A byte, time or count budget stopped the read before the end.
    pub truncated: bool,
}

/// Executable mappings of a process, bounded as the module comment says; empty if it is gone.
/// The mapping holding `wanted` (the address that made us read) is kept past the count bounds.
pub fn read(pid: u32, wanted: Option<u64>) -> Read {
    read_within(pid, wanted, MAX_MAPPINGS, MAPS_READ_BUDGET)
}

/// [`read`] with its own count and time bounds (the byte and per-file bounds stay): the
/// unwinder reads every executable mapping, on its own thread, to choose the ones it describes.
pub fn read_within(pid: u32, wanted: Option<u64>, max_mappings: usize, budget: std::time::Duration) -> Read {
    match std::fs::File::open(format!("/proc/{pid}/maps")) {
        Ok(f) => read_from(f.take(MAX_MAPS_BYTES), wanted, max_mappings, budget),
        Err(_) => Read::default(),
    }
}

/// Executable mappings of a maps file, sorted by address. Malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mapping> {
    read_from(text.as_bytes(), None, MAX_MAPPINGS, std::time::Duration::MAX).maps
}

fn read_from(input: impl std::io::Read, wanted: Option<u64>, max_mappings: usize, budget: std::time::Duration) -> Read {
    let started = std::time::Instant::now();
    let mut bytes = 0u64;
    let mut truncated = false;
    let mut kept = Kept::default();
    let mut input = BufReader::with_capacity(64 << 10, input);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut input).take(MAX_LINE_BYTES).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(n) => bytes += n as u64,
        }
        // The clock is read every 64 lines: cheap next to what the kernel spends on a line.
        if (bytes >= MAX_MAPS_BYTES) || (kept.lines % 64 == 0 && started.elapsed() > budget) {
            truncated = true;
            break;
        }
        kept.lines += 1;
        if line.last() != Some(&b'\n') && line.len() as u64 == MAX_LINE_BYTES {
            // Longer than any real line: skip the rest of it.
            loop {
                line.clear();
                match (&mut input).take(MAX_LINE_BYTES).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.last() == Some(&b'\n') => break,
                    Ok(_) => {}
                }
            }
            continue;
        }
        let Some(m) = std::str::from_utf8(&line).ok().and_then(|l| parse_line(l.trim_end_matches('\n'), &mut kept))
        else {
            continue;
        };
        if wanted.is_some_and(|a| m.start <= a && a < m.end) {
            kept.out.push(m);
            if kept.out.len() >= max_mappings {
                break;
            }
        } else if kept.out.len() < max_mappings {
            kept.push(m);
        } else if wanted.is_none() {
            truncated = true;
            break;
        }
    }
    truncated |= kept.out.len() >= max_mappings || kept.files.values().any(|(_, n)| *n >= MAX_MAPPINGS_PER_FILE);
    let mut maps = kept.out;
    maps.sort_by_key(|m| m.start);
    Read { maps, truncated }
}

/// What a read keeps: the mappings, one path per file, how many mappings each file has.
#[derive(Default)]
struct Kept {
    out: Vec<Mapping>,
    files: HashMap<(u64, u64), (Arc<str>, usize)>,
    lines: u64,
}

impl Kept {
    fn path(&mut self, dev: u64, inode: u64, raw: &str) -> Arc<str> {
        if let Some((p, _)) = self.files.get(&(dev, inode)).filter(|(p, _)| inode != 0 || **p == *shorten(raw)) {
            return p.clone();
        }
        Arc::from(shorten(raw))
    }

    fn push(&mut self, m: Mapping) {
        let n = &mut self.files.entry((m.dev, m.inode)).or_insert_with(|| (m.path.clone(), 0)).1;
        if *n < MAX_MAPPINGS_PER_FILE {
            *n += 1;
            self.out.push(m);
        }
    }
}

/// A path cut to `MAX_PATH_BYTES`, keeping its end: the file name and a ` (deleted)` mark.
fn shorten(path: &str) -> std::borrow::Cow<'_, str> {
    if path.len() <= MAX_PATH_BYTES {
        return path.into();
    }
    let mut cut = path.len() - MAX_PATH_BYTES;
    while !path.is_char_boundary(cut) {
        cut += 1;
    }
    format!("/...{}", &path[cut..]).into()
}

fn parse_line(line: &str, kept: &mut Kept) -> Option<Mapping> {
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
    let dev = libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let path = kept.path(dev, inode, fields.next().unwrap_or("").trim_start());
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        dev,
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
        assert_eq!(&*maps[0].path, "/tmp/gone (deleted)");
        assert!(maps[0].is_deleted());
        let libc = find(&maps, 0x7f1c2a428000 + 0x10).unwrap();
        assert_eq!(libc.inode, 1835131);
        assert_eq!(libc.dev, libc::makedev(0xfd, 1));
        assert_eq!(libc.file_offset(0x7f1c2a428010), 0x28010);
        assert!(libc.is_file());
        let anon = find(&maps, 0x7f1c2a600010).unwrap();
        assert!(!anon.is_file() && anon.path.is_empty());
        assert_eq!(&*find(&maps, 0x7ffd5e1f4001).unwrap().path, "[vdso]");
    }

    #[test]
    fn addresses_outside_mappings_find_nothing() {
        let maps = parse(MAPS);
        assert!(find(&maps, 0).is_none());
        assert!(find(&maps, 0x55d0c1a07000).is_none()); // end is exclusive
        assert!(find(&maps, 0x55d0c1a00010).is_none()); // not executable
        assert!(find(&maps, u64::MAX).is_none());
    }

    #[test]
    fn many_mappings_of_one_file_under_a_long_path_are_bounded() {
        let long = format!("/tmp/{}/evil.so", "d".repeat(3_779));
        let mut text = String::from("55d0c1a02000-55d0c1a07000 r-xp 00002000 fd:01 393320 /usr/bin/cat\n");
        // 1,000 of them: 3.8 MB of text, under the byte budget.
        for i in 0..1_000u64 {
            let start = 0x7000_0000_0000 + i * 0x1000;
            text.push_str(&format!("{start:x}-{:x} r-xp 00000000 fd:01 4242 {long}\n", start + 0x1000));
        }
        text.push_str("7f1c2a428000-7f1c2a5bd000 r-xp 00028000 fd:01 1835131 /usr/lib/libc.so.6\n");
        let read = read_from(text.as_bytes(), None, MAX_MAPPINGS, std::time::Duration::MAX);
        assert!(read.truncated, "over the per-file bound");
        let maps = read.maps;
        let evil: Vec<&Mapping> = maps.iter().filter(|m| m.inode == 4242).collect();
        assert_eq!(evil.len(), MAX_MAPPINGS_PER_FILE);
        // One path for all of them, shortened, its file name kept.
        assert!(evil.iter().all(|m| Arc::ptr_eq(&m.path, &evil[0].path)));
        assert!(evil[0].path.len() <= MAX_PATH_BYTES + 4 && evil[0].path.ends_with("/evil.so"), "{}", evil[0].path);
        // The files after it are still found.
        assert_eq!(find(&maps, 0x7f1c2a428010).map(|m| m.inode), Some(1835131));
        assert_eq!(find(&maps, 0x55d0c1a02010).map(|m| m.inode), Some(393320));
        // Past the bound, the mapping of the address that made us read is kept all the same.
        let wanted = 0x7000_0000_0000 + 900 * 0x1000 + 0x400;
        let read = read_from(text.as_bytes(), Some(wanted), MAX_MAPPINGS, std::time::Duration::MAX);
        assert!(read.truncated);
        let maps = read.maps;
        assert_eq!(find(&maps, wanted).map(|m| m.inode), Some(4242));
        assert_eq!(maps.iter().filter(|m| m.inode == 4242).count(), MAX_MAPPINGS_PER_FILE + 1);
    }

    #[test]
    fn a_process_keeps_at_most_max_mappings() {
        let text: String = (0..5_000u64)
            .map(|i| format!("{:x}-{:x} r-xp 00000000 fd:01 {} /lib/f{i}.so\n", i * 0x2000, i * 0x2000 + 0x1000, i + 1))
            .collect();
        assert_eq!(parse(&text).len(), MAX_MAPPINGS);
        let all = read_from(text.as_bytes(), None, 10_000, std::time::Duration::MAX);
        assert_eq!((all.maps.len(), all.truncated), (5_000, false), "a caller's own bound");
    }

    #[test]
    fn overlong_lines_are_skipped_not_kept() {
        let text = format!(
            "1000-2000 r-xp 00000000 fd:01 7 /{}\n3000-4000 r-xp 00000000 fd:01 8 /lib/ok.so\n",
            "x".repeat(MAX_LINE_BYTES as usize * 3)
        );
        let maps = parse(&text);
        assert_eq!(maps.len(), 1);
        assert_eq!(&*maps[0].path, "/lib/ok.so");
    }

    #[test]
    fn deleted_files_keep_their_mark_when_shortened() {
        let long = format!("/{}/prog (deleted)", "p".repeat(1000));
        let maps = parse(&format!("1000-2000 r-xp 00000000 fd:01 7 {long}\n"));
        assert!(maps[0].is_deleted() && maps[0].is_file());
    }

    #[test]
    fn a_read_stops_at_its_byte_budget() {
        let line = format!("1000-2000 r-xp 00000000 fd:01 7 /{}\n", "d/".repeat(1_800));
        let text = line.repeat((MAX_MAPS_BYTES as usize / line.len()) + 10);
        let read = read_from(text.as_bytes(), None, MAX_MAPPINGS, std::time::Duration::MAX);
        assert!(read.truncated);
    }

    #[test]
    fn a_read_stops_at_its_time_budget() {
        let text: String = (0..10_000u64)
            .map(|i| format!("{:x}-{:x} r-xp 00000000 fd:01 7 /lib/a.so\n", i * 0x2000, i * 0x2000 + 0x1000))
            .collect();
        let read = read_from(text.as_bytes(), None, MAX_MAPPINGS, std::time::Duration::ZERO);
        assert!(read.truncated && read.maps.is_empty());
        assert!(
            !read_from(
                &b"1000-2000 r-xp 00000000 fd:01 7 /lib/a.so\n"[..],
                None,
                MAX_MAPPINGS,
                std::time::Duration::MAX
            )
            .truncated
        );
    }
}
