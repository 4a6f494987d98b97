//! Kernel counters beside the samples: `DATA_DIR/counters/<unix second of the minute>.cnt`, one
//! file per minute like the segments, removed by the same retention (what is older than the
//! oldest segment, or than the age limit, goes).
//!
//! A file is text, appended once a second with one write, so a killed daemon leaves at most a
//! partial last line, which readers skip and count:
//!
//! ```text
//! profiler-counters 1                     each writer that opens the file starts with this
//! track 0 3 /s softnet.time_squeeze       id, CPU (`-` for none), unit, name (to the end)
//! t 1795000000000 0:12.5 1:0              unix ms, then id:value for what changed
//! t 1795000001000 0:13                    track 1 is still 0
//! t 1795000002000 1:-                     track 1 has no value any more (a NIC went away)
//! about 2 python3 (pod ml/trainer-0)      what track 2 is of (a process's tracks: its name)
//! ```
//!
//! A tick line carries only the values that changed since the tick before (most rates of an
//! idle CPU stay 0: a third of the bytes on a 2-CPU VM); `-` ends a track. Ids and values hold
//! from a header to the next, so a daemon restarted within a minute appends its own.

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use super::{
    files,
    format::{NS_PER_SEC, SEGMENT_NS},
};
use crate::collect::counters::Point;

// Reading is its own module; its names are the counters' API.
pub use super::counters_read::{Select, Track, Tracks, glob, read};

pub const HEADER: &str = "profiler-counters 1";
/// Largest counters file read (a minute of a 192-CPU node is about 2 MB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("{0} is not a directory of counters (a symbolic link or a file): remove it and restart the daemon")]
    NotADirectory(PathBuf),
}

/// The counters directory inside a data directory.
pub fn counters_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("counters")
}

/// `<unix second>.cnt` for the kernel counters; `<unix second>.<stream>.cnt` for a writer of
/// its own (the GPU poller ticks every 100 ms: in the kernel counters' file each of its ticks
/// would repeat every kernel track).
fn file_path(dir: &Path, minute_ns: u64, stream: Option<&str>) -> PathBuf {
    match stream {
        Some(s) => dir.join(format!("{}.{s}.cnt", minute_ns / NS_PER_SEC)),
        None => dir.join(format!("{}.cnt", minute_ns / NS_PER_SEC)),
    }
}

/// The counters files, oldest first, as (start of the minute, path); a minute may have one
/// file per stream.
pub fn list(data_dir: &Path) -> Result<Vec<(u64, PathBuf)>, CountersError> {
    let dir = counters_dir(data_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CountersError::Io(dir, e)),
    };
    let mut out: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let stem = name.to_str()?.strip_suffix(".cnt")?;
            // `<secs>` or `<secs>.<stream>` (a stream name is letters only).
            let secs = match stem.split_once('.') {
                Some((secs, stream)) if !stream.is_empty() && stream.bytes().all(|b| b.is_ascii_lowercase()) => secs,
                Some(_) => return None,
                None => stem,
            };
            let secs: u64 = secs.parse().ok()?;
            Some((secs.checked_mul(NS_PER_SEC)?, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Appends ticks; one file per minute.
pub struct CountersWriter {
    dir: PathBuf,
    stream: Option<String>,
    current: Option<Current>,
    /// Ticks are held in memory until the oldest held is this old (0: each tick is written at
    /// once). The GPU poller ticks ten times a second: a write each cost it more than its
    /// NVML reads (`cargo xtask bench nvml`).
    hold_ns: u64,
    /// Ticks not yet written, and the time of the first of them.
    held: String,
    held_since_ns: u64,
    /// What each track name is of ([`Self::describe`]), said in each file that defines it.
    about: HashMap<String, String>,
}

struct Current {
    minute_ns: u64,
    file: std::fs::File,
    /// Track ids by CPU, then name (looked up without building a key).
    ids: HashMap<Option<u32>, HashMap<String, usize>>,
    /// By id: what the last tick left the track at (the value's bits, and as written), `None`
    /// when the track has no value.
    last: Vec<Option<(u64, String)>>,
    /// By id: whether this tick has the track (kept between ticks, for its allocation).
    seen: Vec<bool>,
}

impl CountersWriter {
    /// Creates `DATA_DIR/counters` (0700) if missing; refuses a link or a file in its place.
    pub fn new(data_dir: &Path) -> Result<Self, CountersError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = counters_dir(data_dir);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CountersError::Io(dir, e)),
        }
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(Self {
                dir,
                stream: None,
                current: None,
                hold_ns: 0,
                held: String::new(),
                held_since_ns: 0,
                about: HashMap::new(),
            }),
            Ok(_) => Err(CountersError::NotADirectory(dir)),
            Err(e) => Err(CountersError::Io(dir, e)),
        }
    }

    /// A writer of files of its own (`<minute>.<stream>.cnt`, `stream` in lower-case letters),
    /// read and removed with the others.
    pub fn stream(data_dir: &Path, stream: &str) -> Result<Self, CountersError> {
        assert!(!stream.is_empty() && stream.bytes().all(|b| b.is_ascii_lowercase()), "stream names are letters");
        let mut w = Self::new(data_dir)?;
        w.stream = Some(stream.to_string());
        Ok(w)
    }

    /// Holds ticks and writes them together once the first held is `hold_ns` old (and at a new
    /// minute's file, and when dropped): readers see them that much later, and a killed daemon
    /// loses at most that much.
    pub fn holding(mut self, hold_ns: u64) -> Self {
        self.hold_ns = hold_ns;
        self
    }

    /// Says what the track(s) named `name` are of, in a few words on one line (a process's
    /// tracks: `python3 (pod ml/trainer-0)`, as the page labels them): written beside the
    /// track's definition in each file, and again when it changes. A name not written to in a
    /// minute is forgotten at the next minute's file (bounded by the tracks of a minute).
    pub fn describe(&mut self, name: &str, about: &str) {
        let about: String = about.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        if self.about.get(name).is_some_and(|a| *a == about) {
            return;
        }
        if let Some(c) = &self.current {
            for id in c.ids.values().filter_map(|m| m.get(name)) {
                let _ = writeln!(self.held, "about {id} {about}");
            }
        }
        self.about.insert(name.to_string(), about);
    }

    /// Writes one tick (at `ts_ns`) in one append (or holds it: [`Self::holding`]).
    pub fn append(&mut self, ts_ns: u64, points: &[Point]) -> Result<(), CountersError> {
        let minute_ns = ts_ns / SEGMENT_NS * SEGMENT_NS;
        if self.current.as_ref().is_none_or(|c| c.minute_ns != minute_ns) {
            // The held ticks belong to the file of their minute.
            self.flush()?;
            if let Some(old) = self.current.take() {
                self.about.retain(|name, _| old.ids.values().any(|m| m.contains_key(name)));
            }
            let path = file_path(&self.dir, minute_ns, self.stream.as_deref());
            let mut file = files::open_append(&path).map_err(|e| CountersError::Io(path.clone(), e))?;
            // A line a killed writer left half-written ends here, not in our header.
            if !ends_with_newline(&mut file).map_err(|e| CountersError::Io(path.clone(), e))? {
                self.held.push('\n');
            }
            self.held.push_str(HEADER);
            self.held.push('\n');
            self.held_since_ns = ts_ns;
            self.current = Some(Current { minute_ns, file, ids: HashMap::new(), last: Vec::new(), seen: Vec::new() });
        }
        let Some(c) = self.current.as_mut() else { return Ok(()) };
        if self.held.is_empty() {
            self.held_since_ns = ts_ns;
        }
        let buf = &mut self.held;
        let mut tick = format!("t {}", ts_ns / 1_000_000);
        c.seen.iter_mut().for_each(|s| *s = false);
        for p in points {
            let id = match c.ids.get(&p.cpu).and_then(|m| m.get(p.name.as_str())) {
                Some(&id) => id,
                None => {
                    let id = c.last.len();
                    let cpu = p.cpu.map_or("-".to_string(), |c| c.to_string());
                    let _ = writeln!(buf, "track {id} {cpu} {} {}", p.unit, p.name);
                    if let Some(about) = self.about.get(&p.name) {
                        let _ = writeln!(buf, "about {id} {about}");
                    }
                    c.ids.entry(p.cpu).or_default().insert(p.name.clone(), id);
                    c.last.push(None);
                    c.seen.push(false);
                    id
                }
            };
            c.seen[id] = true;
            let bits = p.value.to_bits();
            // The same value as the last tick's: not formatted again.
            if c.last[id].as_ref().is_some_and(|(b, _)| *b == bits) {
                continue;
            }
            let v = compact(p.value);
            if c.last[id].as_ref().is_none_or(|(_, w)| *w != v) {
                let _ = write!(tick, " {id}:{v}");
            }
            c.last[id] = Some((bits, v));
        }
        for (id, last) in c.last.iter_mut().enumerate() {
            if !c.seen[id] && last.take().is_some() {
                let _ = write!(tick, " {id}:-");
            }
        }
        buf.push_str(&tick);
        buf.push('\n');
        if ts_ns.saturating_sub(self.held_since_ns) >= self.hold_ns {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the held ticks.
    pub fn flush(&mut self) -> Result<(), CountersError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let Some(c) = self.current.as_mut() else {
            self.held.clear();
            return Ok(());
        };
        let written = c.file.write_all(self.held.as_bytes());
        self.held.clear();
        if let Err(e) = written {
            let path = file_path(&self.dir, c.minute_ns, self.stream.as_deref());
            // Start a fresh file section at the next tick (the ids may be half written).
            self.current = None;
            return Err(CountersError::Io(path, e));
        }
        Ok(())
    }
}

impl Drop for CountersWriter {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "the last counter ticks were not written");
        }
    }
}

fn ends_with_newline(f: &mut std::fs::File) -> std::io::Result<bool> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    let mut last = [0u8];
    f.seek(SeekFrom::Start(len - 1))?;
    f.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// A value in few bytes: at most 3 decimals, no trailing zeros.
fn compact(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

/// Removes the counters of minutes that ended before `cutoff_ns` (the retention of the
/// samples). Returns how many files went.
pub fn prune(data_dir: &Path, cutoff_ns: u64) -> Result<usize, CountersError> {
    files::remove_ended(list(data_dir)?, SEGMENT_NS, cutoff_ns).map_err(|(path, e)| CountersError::Io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(name: &str, cpu: Option<u32>, value: f64) -> Point {
        Point { name: name.into(), cpu, unit: "/s".into(), value }
    }

    const T0: u64 = 1_795_000_020 * NS_PER_SEC; // a minute boundary

    fn all() -> Select {
        Select::default()
    }

    #[test]
    fn round_trip_across_minutes_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::new(dir.path()).unwrap();
        for s in 0..70u64 {
            let mut points = vec![point("softnet.processed", Some(1), s as f64 * 1.5)];
            if s >= 30 {
                points.push(point("psi.cpu.some", None, 0.125));
            }
            w.append(T0 + s * NS_PER_SEC, &points).unwrap();
        }
        // A second daemon in the same minute: its own ids, in another order.
        let mut w2 = CountersWriter::new(dir.path()).unwrap();
        w2.append(T0 + 70 * NS_PER_SEC, &[point("psi.cpu.some", None, 9.0), point("softnet.processed", Some(1), 1.0)])
            .unwrap();
        assert_eq!(list(dir.path()).unwrap().len(), 2);
        let t = read(dir.path(), T0, T0 + 100 * NS_PER_SEC, &all()).unwrap();
        assert_eq!(t.skipped_lines, 0);
        assert_eq!(t.tracks.len(), 2);
        let psi = &t.tracks[0];
        assert_eq!((psi.name.as_str(), psi.cpu, psi.unit.as_str()), ("psi.cpu.some", None, "/s"));
        assert_eq!(psi.points.len(), 41);
        assert_eq!(psi.points.last(), Some(&(T0 / 1_000_000 + 70_000, 9.0)));
        let net = &t.tracks[1];
        assert_eq!(net.points.len(), 71);
        assert_eq!(net.points[3], (T0 / 1_000_000 + 3000, 4.5));
        // A window and a selection.
        let sel = Select { cpu: Some(1), name: Some("softnet.*".into()) };
        let t = read(dir.path(), T0 + 10 * NS_PER_SEC, T0 + 20 * NS_PER_SEC, &sel).unwrap();
        assert_eq!(t.tracks.len(), 1);
        assert_eq!(t.tracks[0].points.len(), 10);
        let none = Select { cpu: Some(0), name: None };
        assert!(read(dir.path(), T0, T0 + 100 * NS_PER_SEC, &none).unwrap().tracks.is_empty());
    }

    #[test]
    fn unchanged_values_are_not_written_and_gone_tracks_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::new(dir.path()).unwrap();
        w.append(T0, &[point("a", None, 0.0), point("b", Some(0), 1.0)]).unwrap();
        w.append(T0 + NS_PER_SEC, &[point("a", None, 0.0), point("b", Some(0), 2.0)]).unwrap();
        w.append(T0 + 2 * NS_PER_SEC, &[point("a", None, 0.0)]).unwrap();
        w.append(T0 + 3 * NS_PER_SEC, &[point("a", None, 0.0), point("b", Some(0), 2.0)]).unwrap();
        let (_, path) = list(dir.path()).unwrap().remove(0);
        let text = std::fs::read_to_string(path).unwrap();
        let ticks: Vec<&str> =
            text.lines().filter(|l| l.starts_with("t ")).map(|l| l.split_once(' ').unwrap().1).collect();
        let ms = T0 / 1_000_000;
        assert_eq!(
            ticks,
            vec![
                format!("{ms} 0:0 1:1"),
                format!("{} 1:2", ms + 1000),
                format!("{} 1:-", ms + 2000),
                format!("{} 1:2", ms + 3000)
            ]
        );
        let t = read(dir.path(), T0, T0 + SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.tracks[0].points.len(), 4, "a: every tick, though written once");
        let b = &t.tracks[1];
        assert_eq!(b.points.iter().map(|p| p.1).collect::<Vec<_>>(), vec![1.0, 2.0, 2.0]);
        assert_eq!(b.points[2].0, ms + 3000, "no point while it was gone");
        // A window that starts after the value was written still sees it.
        let t = read(dir.path(), T0 + 2 * NS_PER_SEC, T0 + SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.tracks[0].points, vec![(ms + 2000, 0.0), (ms + 3000, 0.0)]);
    }

    /// The GPU poller's file: ten ticks a second written together once a second, a new
    /// minute's ticks in their own file, and what is held written when the writer goes.
    #[test]
    fn held_ticks_are_written_together_in_their_minutes_file() {
        let dir = tempfile::tempdir().unwrap();
        let step = NS_PER_SEC / 10;
        let mut w = CountersWriter::stream(dir.path(), "gpu").unwrap().holding(NS_PER_SEC - step);
        let start = T0 + SEGMENT_NS - 15 * step; // 1.5 s before the next minute
        let ticks = |text: &str| text.lines().filter(|l| l.starts_with("t ")).count();
        let file = |minute: u64| file_path(&counters_dir(dir.path()), minute, Some("gpu"));
        for i in 0..9 {
            w.append(start + i * step, &[point("gpu.0.util", None, i as f64)]).unwrap();
        }
        assert_eq!(ticks(&std::fs::read_to_string(file(T0)).unwrap()), 0, "held: nothing written yet");
        w.append(start + 9 * step, &[point("gpu.0.util", None, 9.0)]).unwrap();
        assert_eq!(ticks(&std::fs::read_to_string(file(T0)).unwrap()), 10, "a second held, written");
        // Five more in this minute, then the next minute's.
        for i in 10..20 {
            w.append(start + i * step, &[point("gpu.0.util", None, i as f64)]).unwrap();
        }
        assert_eq!(ticks(&std::fs::read_to_string(file(T0)).unwrap()), 15, "the minute's last ticks, at its end");
        drop(w);
        assert_eq!(ticks(&std::fs::read_to_string(file(T0 + SEGMENT_NS)).unwrap()), 5, "the rest, when dropped");
        let t = read(dir.path(), T0, T0 + 2 * SEGMENT_NS, &all()).unwrap();
        let values: Vec<f64> = t.tracks[0].points.iter().map(|p| p.1).collect();
        assert_eq!(values, (0..20).map(f64::from).collect::<Vec<_>>());
    }

    /// Issue 41, part 7: a CUDA track names a pid; what process it is rides beside it.
    #[test]
    fn a_track_says_what_it_is_of_in_each_file_and_when_that_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::stream(dir.path(), "cuda").unwrap();
        w.describe("cuda.812.launches", "python3 (pod ml/trainer-0)");
        w.append(T0, &[point("cuda.812.launches", None, 5.0), point("cuda.900.launches", None, 1.0)]).unwrap();
        // The pid's process changed its name (exec): said again.
        w.describe("cuda.812.launches", "torchrun\nx");
        w.append(T0 + NS_PER_SEC, &[point("cuda.812.launches", None, 6.0)]).unwrap();
        // A new minute's file says it again, beside the track's definition.
        w.append(T0 + SEGMENT_NS, &[point("cuda.812.launches", None, 7.0)]).unwrap();
        drop(w);
        let t = read(dir.path(), T0, T0 + SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.about.len(), 1, "{:?}", t.about);
        assert_eq!(t.about["cuda.812.launches"], "torchrun x", "the newest, on one line");
        let t = read(dir.path(), T0 + SEGMENT_NS, T0 + 2 * SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.about["cuda.812.launches"], "torchrun x");
        assert_eq!(t.skipped_lines, 0);
        // Only the tracks kept: another name asked for, nothing said of this one.
        let other = Select { cpu: None, name: Some("cuda.900.*".into()) };
        let t = read(dir.path(), T0, T0 + SEGMENT_NS, &other).unwrap();
        assert!(t.about.is_empty(), "{:?}", t.about);
        let json = serde_json::to_string(&t).unwrap();
        assert!(!json.contains("about"), "no about when nothing is said: {json}");
    }

    #[test]
    fn a_truncated_file_loses_its_last_line_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::new(dir.path()).unwrap();
        for s in 0..5u64 {
            w.append(T0 + s * NS_PER_SEC, &[point("softirq.NET_RX", Some(0), 100.0 + s as f64)]).unwrap();
        }
        drop(w);
        let (_, path) = list(dir.path()).unwrap().remove(0);
        let bytes = std::fs::read(&path).unwrap();
        // Killed in the middle of the last tick's line.
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let t = read(dir.path(), T0, T0 + SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.skipped_lines, 1);
        assert_eq!(t.tracks[0].points.len(), 4);
        // The next daemon appends after it, on a line of its own.
        let mut w = CountersWriter::new(dir.path()).unwrap();
        w.append(T0 + 10 * NS_PER_SEC, &[point("softirq.NET_RX", Some(0), 7.0)]).unwrap();
        let t = read(dir.path(), T0, T0 + SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.skipped_lines, 1, "the cut line, now complete but garbled");
        assert_eq!(t.tracks[0].points.len(), 5);
        assert_eq!(t.tracks[0].points[4].1, 7.0);
        // Cut anywhere: never a panic.
        for cut in 0..bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let _ = read(dir.path(), T0, T0 + SEGMENT_NS, &all()).unwrap();
        }
    }

    #[test]
    fn garbage_is_skipped_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let d = counters_dir(dir.path());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(file_path(&d, T0, None), b"\x7fELF binary stuff\n").unwrap();
        std::fs::write(
            file_path(&d, T0 + SEGMENT_NS, None),
            format!("{HEADER}\ntrack 0 - /s a\nt 1 0:x\nt 2 5:1\ntrack zz\nt {} 0:1\n", (T0 + SEGMENT_NS) / 1_000_000),
        )
        .unwrap();
        let t = read(dir.path(), T0, T0 + 2 * SEGMENT_NS, &all()).unwrap();
        assert_eq!(t.skipped_files.len(), 1);
        assert!(t.skipped_files[0].contains("not a counters file"), "{:?}", t.skipped_files);
        assert_eq!(t.skipped_lines, 3);
        assert_eq!(t.tracks[0].points, vec![((T0 + SEGMENT_NS) / 1_000_000, 1.0)]);
    }

    #[test]
    fn prune_follows_the_cutoff() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = CountersWriter::new(dir.path()).unwrap();
        for m in 0..4 {
            w.append(T0 + m * SEGMENT_NS, &[point("x", None, 1.0)]).unwrap();
        }
        assert_eq!(prune(dir.path(), T0 + 2 * SEGMENT_NS + 1).unwrap(), 2);
        assert_eq!(list(dir.path()).unwrap().first().unwrap().0, T0 + 2 * SEGMENT_NS);
    }

    #[test]
    fn globs_and_values() {
        assert!(glob("softnet.*", "softnet.time_squeeze"));
        assert!(glob("*NET_RX", "softirq.NET_RX"));
        assert!(glob("irq.virtio?-input.*", "irq.virtio2-input.0"));
        assert!(!glob("softnet.*", "softirq.NET_RX"));
        assert!(glob("*", ""));
        assert_eq!(compact(12.0), "12");
        assert_eq!(compact(0.1254), "0.125");
        assert_eq!(compact(-0.0001), "0");
    }

    #[test]
    fn the_json_shape() {
        let t = Tracks {
            tracks: vec![Track {
                name: "softnet.time_squeeze".into(),
                cpu: Some(3),
                unit: "/s".into(),
                points: vec![(1000, 2.5)],
            }],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"tracks":[{"name":"softnet.time_squeeze","cpu":3,"unit":"/s","points":[[1000,2.5]]}]}"#
        );
    }
}
