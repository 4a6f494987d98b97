//! Reading the counters files (`super::counters` writes them; the format is described there):
//! the tracks of a window, chosen by CPU and name, with what could not be read counted.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;

use super::{
    counters::{CountersError, HEADER, MAX_FILE_BYTES, list},
    files,
    format::SEGMENT_NS,
};

/// One counter over time (the JSON shape of `/api/counters` and `profiler counters`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Track {
    pub name: String,
    pub cpu: Option<u32>,
    pub unit: String,
    /// (unix ms, value), in time order.
    pub points: Vec<(u64, f64)>,
}

/// The tracks of a window, and what could not be read.
#[derive(Debug, Default, Serialize)]
pub struct Tracks {
    pub tracks: Vec<Track>,
    /// What tracks are of, by name, where their writer said (`cuda.PID.*`: the process's
    /// name and pod).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub about: BTreeMap<String, String>,
    /// Lines skipped: half-written (a killed daemon) or not understood.
    #[serde(skip)]
    pub skipped_lines: u64,
    /// Files skipped whole (unreadable, too large, not ours), with why.
    #[serde(skip)]
    pub skipped_files: Vec<String>,
}

/// Which tracks to keep.
#[derive(Debug, Default, Clone)]
pub struct Select {
    pub cpu: Option<u32>,
    /// A glob over the name (`*` and `?`).
    pub name: Option<String>,
}

impl Select {
    fn keeps(&self, name: &str, cpu: Option<u32>) -> bool {
        self.cpu.is_none_or(|c| cpu == Some(c)) && self.name.as_deref().is_none_or(|g| glob(g, name))
    }
}

/// `*` any run of characters, `?` one; everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The tracks with points in `[from_ns, to_ns)`, ordered by name then CPU.
pub fn read(data_dir: &Path, from_ns: u64, to_ns: u64, select: &Select) -> Result<Tracks, CountersError> {
    let mut out = Tracks::default();
    let mut tracks: BTreeMap<(String, Option<u32>), Track> = BTreeMap::new();
    for (start, path) in list(data_dir)? {
        if start >= to_ns || start.saturating_add(SEGMENT_NS) <= from_ns {
            continue;
        }
        let bytes = match files::read_regular(&path, MAX_FILE_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // retention took it
            Err(e) => {
                out.skipped_files.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        match parse_file(&text, from_ns / 1_000_000, to_ns.div_ceil(1_000_000), select, &mut tracks, &mut out.about) {
            Ok(skipped) => out.skipped_lines += skipped,
            Err(why) => out.skipped_files.push(format!("{}: {why}", path.display())),
        }
    }
    out.tracks = tracks.into_values().filter(|t| !t.points.is_empty()).collect();
    let names: std::collections::BTreeSet<&str> = out.tracks.iter().map(|t| t.name.as_str()).collect();
    out.about.retain(|name, _| names.contains(name.as_str()));
    Ok(out)
}

/// Adds a file's points in `[from_ms, to_ms)` to `tracks`; returns the lines skipped, or why
/// the whole file is not ours.
fn parse_file(
    text: &str,
    from_ms: u64,
    to_ms: u64,
    select: &Select,
    tracks: &mut BTreeMap<(String, Option<u32>), Track>,
    about: &mut BTreeMap<String, String>,
) -> Result<u64, String> {
    if !text.is_empty() && !text.starts_with(HEADER) {
        return Err(format!("not a counters file (it does not start with '{HEADER}'): skipped"));
    }
    let mut ids: Vec<Option<TrackDef>> = Vec::new();
    // Each track's value as of the last tick line (ticks carry what changed).
    let mut state: BTreeMap<usize, f64> = BTreeMap::new();
    let mut skipped = 0;
    let lines: Vec<&str> = text.split('\n').collect();
    let last = lines.len() - 1;
    for (i, line) in lines.into_iter().enumerate() {
        // The piece after the last newline is a line still being written (or cut by a kill).
        if line.is_empty() || (i == last && !text.ends_with('\n')) {
            skipped += u64::from(!line.is_empty());
            continue;
        }
        if line == HEADER {
            ids.clear();
            state.clear();
            continue;
        }
        let ok = if let Some(rest) = line.strip_prefix("track ") {
            parse_track(rest).map(|(id, t)| {
                if ids.len() <= id {
                    ids.resize(id + 1, None);
                }
                ids[id] = Some(t);
            })
        } else if let Some(rest) = line.strip_prefix("t ") {
            parse_tick(rest, &ids, &mut state, from_ms, to_ms, select, tracks)
        } else if let Some(rest) = line.strip_prefix("about ") {
            rest.split_once(' ').and_then(|(id, text)| {
                let (name, cpu, _) = ids.get(id.parse::<usize>().ok()?)?.as_ref()?;
                if select.keeps(name, *cpu) {
                    about.insert(name.clone(), text.to_string());
                }
                Some(())
            })
        } else {
            None
        };
        skipped += u64::from(ok.is_none());
    }
    Ok(skipped)
}

/// A track's name, CPU and unit.
type TrackDef = (String, Option<u32>, String);

fn parse_track(rest: &str) -> Option<(usize, TrackDef)> {
    let mut w = rest.splitn(4, ' ');
    let id: usize = w.next()?.parse().ok().filter(|&i| i < 1_000_000)?;
    let cpu = match w.next()? {
        "-" => None,
        c => Some(c.parse().ok()?),
    };
    let unit = w.next()?.to_string();
    let name = w.next()?.to_string();
    (!name.is_empty()).then_some((id, (name, cpu, unit)))
}

fn parse_tick(
    rest: &str,
    ids: &[Option<TrackDef>],
    state: &mut BTreeMap<usize, f64>,
    from_ms: u64,
    to_ms: u64,
    select: &Select,
    tracks: &mut BTreeMap<(String, Option<u32>), Track>,
) -> Option<()> {
    let mut w = rest.split(' ');
    let ms: u64 = w.next()?.parse().ok()?;
    // Checked whole before anything changes: a bad line changes nothing.
    let changes: Vec<(usize, Option<f64>)> = w
        .map(|kv| {
            let (id, v) = kv.split_once(':')?;
            let v = match v {
                "-" => None,
                v => Some(v.parse::<f64>().ok().filter(|v| v.is_finite())?),
            };
            Some((id.parse().ok()?, v))
        })
        .collect::<Option<_>>()?;
    if changes.iter().any(|(id, _)| ids.get(*id).is_none_or(Option::is_none)) {
        return None;
    }
    for (id, v) in changes {
        match v {
            Some(v) => state.insert(id, v),
            None => state.remove(&id),
        };
    }
    if ms < from_ms || ms >= to_ms {
        return Some(());
    }
    for (&id, &v) in state.iter() {
        let Some((name, cpu, unit)) = &ids[id] else { continue };
        if !select.keeps(name, *cpu) {
            continue;
        }
        tracks
            .entry((name.clone(), *cpu))
            .or_insert_with(|| Track { name: name.clone(), cpu: *cpu, unit: unit.clone(), points: Vec::new() })
            .points
            .push((ms, v));
    }
    Some(())
}
