//! Names of JIT-compiled code from `/tmp/perf-PID.map`, which Node (`--perf-basic-prof`),
//! Python 3.12+ (`-X perf`), the JVM (with an agent) and .NET write: one line per function,
//! `START SIZE name`, both numbers hex, appended as the JIT compiles.
//!
//! The file is the process's, in its own `/tmp`: it is read as
//! `/proc/PID/root/tmp/perf-NSPID.map` (NSPID being the pid in the process's own namespace, the
//! one it names the file by), through `file::open_regular` (no link followed, a FIFO never
//! opened for real), and kept only if it is owned by the process's user: in a shared /tmp
//! anyone could otherwise write a map for a process that has none and name its frames. What is
//! read is bounded in bytes, lines and name length per process, and in memory across
//! processes (the caller's budget: a thousand processes each with a large map would otherwise
//! hold gigabytes). The file only grows, so a re-read starts where the last one stopped, and its
//! lines are merged into what was read (no sort of the whole map per read); a later line for the
//! same start wins (the JIT reused the space).

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use super::{MAPS_REFRESH, PERF_MAP_REFRESH, file};
use crate::memory;

/// Most bytes of a perf map read in all. Node writes ~100 bytes a function; a large service
/// compiles some 100,000 functions.
pub const MAX_BYTES: u64 = 32 << 20;
/// Most functions kept per process.
pub const MAX_ENTRIES: usize = 250_000;
/// Most bytes read at once: a large map is read over several refreshes.
pub const MAX_READ: u64 = 4 << 20;
/// Least memory room worth a read.
const MIN_ROOM: usize = 64 << 10;
/// Longest name kept (bytes); the rest of a longer one is cut.
pub const MAX_NAME_BYTES: usize = 512;

/// Why a process's perf map is not read.
#[derive(Debug, thiserror::Error)]
pub enum PerfMapError {
    #[error("no perf map: {0}")]
    Open(#[from] file::Refused),
    #[error("cannot read the process's status: {0}")]
    Status(std::io::Error),
    #[error("the perf map is owned by uid {file}, not by the process's uid {process}")]
    NotOwner { file: u32, process: u32 },
    #[error("cannot read the perf map: {0}")]
    Read(std::io::Error),
}

/// One JIT-compiled function: `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub start: u64,
    pub end: u64,
    pub name: Arc<str>,
}

/// What has been read so far of one process's perf map.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// Sorted by start, one entry per start.
    entries: Vec<Entry>,
    /// The file read (device, inode), and how many bytes of it were parsed (whole lines only).
    file: Option<(u64, u64)>,
    parsed: u64,
    /// Memory the entries hold (see `entry_bytes`).
    bytes: usize,
}

/// Memory one entry holds: itself, its name and the name's reference counts.
fn entry_bytes(name: &str) -> usize {
    std::mem::size_of::<Entry>() + 2 * std::mem::size_of::<usize>() + name.len()
}

impl PerfMap {
    /// The name of the function holding `addr`, as of the last read.
    pub fn find(&self, addr: u64) -> Option<&Arc<str>> {
        let i = self.entries.partition_point(|e| e.start <= addr);
        self.entries[..i].last().filter(|e| addr < e.end).map(|e| &e.name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A perf map of this process was read (it writes one).
    pub fn exists(&self) -> bool {
        self.file.is_some()
    }

    /// Memory held by the entries.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reads what was appended to process `pid`'s perf map since the last call (all of it the
    /// first time, or when the file was replaced), adding at most `room` bytes of memory.
    pub fn refresh(&mut self, pid: u32, room: usize) -> Result<(), PerfMapError> {
        let (mut file, uid) = open(pid)?;
        let meta = file.metadata().map_err(PerfMapError::Read)?;
        if meta.uid() != uid {
            return Err(PerfMapError::NotOwner { file: meta.uid(), process: uid });
        }
        let id = (meta.dev(), meta.ino());
        if self.file != Some(id) || meta.len() < self.parsed {
            *self = PerfMap { file: Some(id), ..PerfMap::default() };
        }
        // Full, or (nearly) out of room: reading would only read the same lines again.
        if self.entries.len() >= MAX_ENTRIES || room < MIN_ROOM {
            return Ok(());
        }
        let want = meta.len().min(MAX_BYTES).saturating_sub(self.parsed).min(MAX_READ);
        if want == 0 {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.parsed)).map_err(PerfMapError::Read)?;
        let mut text = Vec::with_capacity(want as usize);
        file.take(want).read_to_end(&mut text).map_err(PerfMapError::Read)?;
        self.parsed += self.add(&text, room) as u64;
        Ok(())
    }

    /// Parses the whole lines of `text` into the map, within `room` bytes of memory and
    /// `MAX_ENTRIES`; returns the bytes consumed. A last line without its newline is being
    /// written, and lines past a bound wait for room: both are read next time.
    pub fn add(&mut self, text: &[u8], room: usize) -> usize {
        let (mut consumed, mut grown) = (0, 0);
        let mut new = Vec::new();
        while let Some(len) = text[consumed..].iter().position(|&b| b == b'\n') {
            let entry = parse_line(&text[consumed..consumed + len]);
            if let Some(e) = &entry {
                if grown + entry_bytes(&e.name) > room || self.entries.len() + new.len() >= MAX_ENTRIES {
                    break;
                }
                grown += entry_bytes(&e.name);
            }
            new.extend(entry);
            consumed += len + 1;
        }
        if !new.is_empty() {
            self.merge(new);
        }
        consumed
    }

    /// Merges new entries into the sorted ones: O(old + new), where sorting all would be
    /// O(n log n) per read. For one start the newest line wins.
    fn merge(&mut self, mut new: Vec<Entry>) {
        // Stable: lines for one start keep their order, the newest last.
        new.sort_by_key(|e| e.start);
        let old = std::mem::take(&mut self.entries);
        let mut out: Vec<Entry> = Vec::with_capacity(old.len() + new.len());
        let (mut old, mut new) = (old.into_iter().peekable(), new.into_iter().peekable());
        // On equal starts the old entry goes first, so that the new one replaces it.
        while let Some(e) = match (old.peek(), new.peek()) {
            (Some(a), Some(b)) if a.start <= b.start => old.next(),
            (_, Some(_)) => new.next(),
            _ => old.next(),
        } {
            match out.last_mut() {
                Some(last) if last.start == e.start => *last = e,
                _ => out.push(e),
            }
        }
        self.bytes = out.iter().map(|e| entry_bytes(&e.name)).sum();
        self.entries = out;
    }
}

/// The symbolizer's side of perf maps: which process's map to read on, and when.
impl super::Symbolizer {
    /// The name a process's perf map gives an address in anonymous memory (JIT-compiled code).
    /// The map grows as the JIT compiles, so an address it does not name reads on from where
    /// the last read stopped, at most every `PERF_MAP_REFRESH` (meanwhile the frame is
    /// `[unknown]`, which is never cached as final).
    pub(super) fn jit_frame(&mut self, pid: u32, addr: u64, now: Instant) -> Option<Arc<str>> {
        let p = self.processes.get_mut(&pid)?;
        if let Some(name) = p.perf_map.find(addr) {
            self.stats.jit_frames += 1;
            return Some(name.clone());
        }
        let every = if p.perf_map.exists() { PERF_MAP_REFRESH } else { MAPS_REFRESH };
        if p.perf_map_read_at.is_none_or(|t| now.duration_since(t) >= every) {
            p.perf_map_read_at = Some(now);
            self.stats.perf_map_reads += 1;
            let held = p.perf_map.bytes();
            // The perf maps of all processes share one pool of the memory budget; past it they
            // are not read on (their JIT frames stay `[unknown]` until processes exit).
            let room = (memory::PERF_MAPS.limit() as usize).saturating_sub(self.perf_map_bytes);
            if room < MIN_ROOM {
                memory::PERF_MAPS.note_refused();
            }
            if let Err(why) = p.perf_map.refresh(pid, room) {
                tracing::trace!(pid, "perf map not read: {why}");
            }
            // Grown (or, when the file was replaced, started over: counted at the next sweep).
            self.perf_map_bytes += p.perf_map.bytes().saturating_sub(held);
            memory::PERF_MAPS.set_used(self.perf_map_bytes as u64);
        }
        let name = p.perf_map.find(addr).cloned();
        self.stats.jit_frames += u64::from(name.is_some());
        self.jit_missed |= name.is_none() && p.perf_map.exists();
        name
    }
}

/// `START SIZE name`: hex numbers (with or without `0x`), the name the rest of the line.
fn parse_line(line: &[u8]) -> Option<Entry> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut fields = line.splitn(3, ' ');
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let name = fields.next()?.trim();
    if name.is_empty() || size == 0 {
        return None;
    }
    let mut cut = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(Entry { start, end: start.checked_add(size)?, name: Arc::from(&name[..cut]) })
}

/// Opens process `pid`'s perf map; returns it with the process's effective uid.
fn open(pid: u32) -> Result<(File, u32), PerfMapError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(PerfMapError::Status)?;
    let (ns_pid, uid) = parse_status(&status).ok_or_else(|| {
        PerfMapError::Status(std::io::Error::new(std::io::ErrorKind::InvalidData, "no NSpid or Uid line"))
    })?;
    let path = PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map"));
    Ok((file::open_regular(&path)?, uid))
}

/// The pid in the process's own namespace (the last `NSpid` field; a kernel before 4.1 has no
/// such line: then the pid is not namespaced as far as we can tell, the `Pid` line) and the
/// effective uid.
fn parse_status(status: &str) -> Option<(u32, u32)> {
    let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(str::split_whitespace);
    let ns_pid = field("NSpid:").or_else(|| field("Pid:"))?.next_back()?.parse().ok()?;
    let uid = field("Uid:")?.nth(1)?.parse().ok()?;
    Some((ns_pid, uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_of_node_python_and_the_jvm() {
        let mut m = PerfMap::default();
        let text = b"3ad1c0a0 2c LazyCompile:*hot_loop /tmp/x.js:3\n\
7f8a10001000 40 py::compute:/app/main.py\n\
0x7f00 0x10 Interpreter\n\
garbage\n\
1000 0 zero_sized\n\
2000 10 \n";
        assert_eq!(m.add(text, usize::MAX), text.len());
        assert_eq!(m.len(), 3);
        assert_eq!(m.find(0x3ad1c0a0).map(|n| &**n), Some("LazyCompile:*hot_loop /tmp/x.js:3"));
        assert_eq!(m.find(0x3ad1c0cb).map(|n| &**n), Some("LazyCompile:*hot_loop /tmp/x.js:3"));
        assert!(m.find(0x3ad1c0cc).is_none(), "end is exclusive");
        assert_eq!(m.find(0x7f8a10001010).map(|n| &**n), Some("py::compute:/app/main.py"));
        assert_eq!(m.find(0x7f05).map(|n| &**n), Some("Interpreter"));
        assert!(m.find(0x1000).is_none() && m.find(0x2005).is_none() && m.find(0).is_none());
    }

    #[test]
    fn a_partial_last_line_waits_and_later_lines_win() {
        let mut m = PerfMap::default();
        let first = b"1000 100 old\n2000 10 half";
        assert_eq!(m.add(first, usize::MAX), 13, "only the whole line is consumed");
        assert_eq!(m.len(), 1);
        assert_eq!(m.add(b"2000 10 half_written\n1000 80 new\n", usize::MAX), 33);
        assert_eq!(m.find(0x1010).map(|n| &**n), Some("new"), "the JIT reused the space");
        assert!(m.find(0x1090).is_none(), "the newer, shorter function ends sooner");
        assert_eq!(m.find(0x2001).map(|n| &**n), Some("half_written"));
    }

    #[test]
    fn names_and_entries_are_bounded() {
        let mut m = PerfMap::default();
        let long = format!("1000 10 {}é\n", "n".repeat(MAX_NAME_BYTES - 1));
        m.add(long.as_bytes(), usize::MAX);
        let name = m.find(0x1000).unwrap();
        assert!(name.len() <= MAX_NAME_BYTES && name.starts_with("nnn"), "{}", name.len());
        let many: String = (0..MAX_ENTRIES as u64 + 10).map(|i| format!("{:x} 1 f{i}\n", 0x10_0000 + i)).collect();
        m.add(many.as_bytes(), usize::MAX);
        assert_eq!(m.len(), MAX_ENTRIES);
    }

    #[test]
    fn a_read_stops_at_its_memory_room_and_goes_on_from_there() {
        let mut m = PerfMap::default();
        let text = b"1000 10 a\n2000 10 b\n3000 10 c\n";
        let room = entry_bytes("a") + entry_bytes("b");
        assert_eq!(m.add(text, room), 20, "two lines fit");
        assert_eq!((m.len(), m.bytes()), (2, room));
        assert!(m.find(0x3000).is_none());
        // Given room, the rest is read from where the last read stopped.
        assert_eq!(m.add(&text[20..], usize::MAX), 10);
        assert_eq!(m.find(0x3000).map(|n| &**n), Some("c"));
    }

    #[test]
    fn merging_keeps_the_map_sorted_and_the_newest_line_per_start() {
        let mut m = PerfMap::default();
        m.add(b"5000 10 e\n1000 10 a\n3000 10 c\n", usize::MAX);
        m.add(b"4000 10 d\n3000 10 c2\n0 10 z\n6000 10 f\n3000 10 c3\n", usize::MAX);
        let starts: Vec<u64> = m.entries.iter().map(|e| e.start).collect();
        assert_eq!(starts, [0, 0x1000, 0x3000, 0x4000, 0x5000, 0x6000]);
        assert_eq!(m.find(0x3001).map(|n| &**n), Some("c3"));
        assert_eq!(m.bytes(), m.entries.iter().map(|e| entry_bytes(&e.name)).sum::<usize>());
    }

    #[test]
    fn status_gives_the_namespaced_pid_and_effective_uid() {
        let status = "Name:\tnode\nPid:\t4242\nUid:\t1000\t1001\t1000\t1000\nNSpid:\t4242\t17\n";
        assert_eq!(parse_status(status), Some((17, 1001)));
        let old_kernel = "Pid:\t99\nUid:\t0\t0\t0\t0\n";
        assert_eq!(parse_status(old_kernel), Some((99, 0)));
        assert_eq!(parse_status("Pid:\t1\n"), None);
    }

    #[test]
    fn a_process_without_a_map_has_none() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep runs");
        let read = PerfMap::default().refresh(child.id(), usize::MAX);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(read, Err(PerfMapError::Open(_))), "{read:?}");
    }

    /// A map in a process's /tmp that the process's user does not own is refused, and one that
    /// is owned is read, also after it grew. Needs root (to give the file another owner).
    #[test]
    fn a_map_someone_else_owns_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            profiler_common::test_skip::skip("a_map_someone_else_owns_is_refused: needs root to chown the map");
            return;
        }
        let me = std::process::id();
        let path = format!("/tmp/perf-{me}.map");
        std::fs::write(&path, "1000 10 mine\n").unwrap();
        let mut m = PerfMap::default();
        let read = m.refresh(me, usize::MAX);
        let grown = {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(b"2000 10 later\n").unwrap();
            m.refresh(me, usize::MAX)
        };
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let other = PerfMap::default().refresh(me, usize::MAX);
        std::fs::remove_file(&path).unwrap();
        read.unwrap();
        grown.unwrap();
        assert_eq!((m.find(0x1001).map(|n| &**n), m.find(0x2001).map(|n| &**n)), (Some("mine"), Some("later")));
        assert!(matches!(other, Err(PerfMapError::NotOwner { file: 65534, process: 0 })), "{other:?}");
    }
}
