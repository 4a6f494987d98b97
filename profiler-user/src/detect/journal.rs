//! The findings journal: every finding's states and the kernel-log events beside them, on
//! disk, partitioned by hour so that a query reads the hours of its window and retention drops
//! whole files (the daemon's own logging is `logs.rs`):
//!
//! - `DATA_DIR/events/<unix second of the hour>.jsonl`: kernel-log events, one JSON object per
//!   line, in the hour of their time.
//! - `DATA_DIR/findings/<hour>.jsonl`: a finding's state in every hour it covers. A finding is
//!   written when it opens (its start hour) and when it closes (every hour from its start to
//!   its end), and the last line of an id wins, so each hour file alone answers "what was
//!   found in this hour".
//! - `DATA_DIR/findings/open.json`: the findings still open, rewritten at each open and close:
//!   an open finding may cover hours it has not been written to yet. A finding a crash left
//!   open stays there until the next daemon closes it ([`close_abandoned`]).
//!
//! Root-only, like the store. Files of the single-file layout before it (`findings.jsonl`,
//! `events.jsonl`) are moved into this one when the daemon starts ([`migrate`]).

use std::{
    collections::BTreeMap,
    io::Write,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

use super::finding::Finding;
use crate::{collect::kmsg::Event, store::StoreError};

const HOUR_NS: u64 = 3600 * 1_000_000_000;
const FINDINGS_DIR: &str = "findings";
const EVENTS_DIR: &str = "events";
const OPEN: &str = "open.json";
/// The layout before partitioning.
const LEGACY_FINDINGS: &str = "findings.jsonl";
const LEGACY_EVENTS: &str = "events.jsonl";
/// Largest hour file or open list read (a flood of kernel messages would be cut here, not OOM
/// a reader).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// Appends, rewrites of the open list and prunes do not interleave.
static FILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    FILES.lock().unwrap_or_else(|p| p.into_inner())
}

fn hour_of(ns: u64) -> u64 {
    ns - ns % HOUR_NS
}

fn hour_path(data_dir: &Path, dir: &str, hour_ns: u64) -> PathBuf {
    data_dir.join(dir).join(format!("{}.jsonl", hour_ns / 1_000_000_000))
}

fn ensure_dir(data_dir: &Path, dir: &str) -> Result<PathBuf, StoreError> {
    let path = data_dir.join(dir);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => Ok(path),
        Ok(_) => Err(StoreError::Unsafe(path, "it is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| StoreError::Io(path.clone(), e))?;
            Ok(path)
        }
        Err(e) => Err(StoreError::Io(path, e)),
    }
}

fn append_line<T: Serialize>(path: &Path, record: &T) -> Result<(), StoreError> {
    let mut line = serde_json::to_vec(record).expect("records serialise");
    line.push(b'\n');
    let mut f = crate::store::files::open_append(path).map_err(|e| StoreError::Io(path.to_path_buf(), e))?;
    f.write_all(&line).map_err(|e| StoreError::Io(path.to_path_buf(), e))
}

/// Every record of a JSON-lines file; lines that do not parse (a torn last line) are skipped.
fn read_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, StoreError> {
    let bytes = match crate::store::files::read_regular(path, MAX_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io(path.to_path_buf(), e)),
    };
    Ok(String::from_utf8_lossy(&bytes).lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// The hours on disk under `dir`, oldest first, with their files.
fn hours(data_dir: &Path, dir: &str) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let path = data_dir.join(dir);
    let entries = match std::fs::read_dir(&path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io(path, e)),
    };
    let mut out: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let secs = e.file_name().to_str()?.strip_suffix(".jsonl")?.parse::<u64>().ok()?;
            Some((secs.checked_mul(1_000_000_000)?, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The records of the hours overlapping `[from_ns, to_ns)`.
fn read_hours<T: DeserializeOwned>(data_dir: &Path, dir: &str, from_ns: u64, to_ns: u64) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::new();
    for (hour, path) in hours(data_dir, dir)? {
        if hour < to_ns && hour.saturating_add(HOUR_NS) > from_ns {
            out.extend(read_lines(&path)?);
        }
    }
    Ok(out)
}

fn read_open(data_dir: &Path) -> Result<Vec<Finding>, StoreError> {
    let path = data_dir.join(FINDINGS_DIR).join(OPEN);
    match crate::store::files::read_regular(&path, MAX_FILE_BYTES) {
        Ok(b) => Ok(serde_json::from_slice(&b).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::Io(path, e)),
    }
}

fn write_open(data_dir: &Path, open: &[Finding]) -> Result<(), StoreError> {
    let path = ensure_dir(data_dir, FINDINGS_DIR)?.join(OPEN);
    crate::store::files::write_private(&path, &serde_json::to_vec(open).expect("findings serialise"))
}

/// Records a finding's new state: opened (its start hour and the open list) or closed (every
/// hour it covered, then out of the open list).
pub fn record_finding(data_dir: &Path, f: &Finding) -> Result<(), StoreError> {
    let _guard = lock();
    record_finding_locked(data_dir, f)
}

fn record_finding_locked(data_dir: &Path, f: &Finding) -> Result<(), StoreError> {
    ensure_dir(data_dir, FINDINGS_DIR)?;
    let mut open = read_open(data_dir)?;
    open.retain(|o| o.id != f.id);
    let last = match f.end_ns {
        None => hour_of(f.start_ns),
        Some(end) => hour_of(end.max(f.start_ns)),
    };
    // An hour file per hour covered: bounded by retention's age (a week is 168 lines).
    let mut hour = hour_of(f.start_ns);
    while hour <= last {
        append_line(&hour_path(data_dir, FINDINGS_DIR, hour), f)?;
        hour += HOUR_NS;
    }
    if f.end_ns.is_none() {
        open.push(f.clone());
    }
    // After the hour files: a reader in between sees the closed state there, which wins.
    write_open(data_dir, &open)
}

/// Replaces the figures of findings still in the open list (those closed meanwhile keep their
/// closed state).
pub fn update_open(data_dir: &Path, updated: &[Finding]) -> Result<(), StoreError> {
    if updated.is_empty() {
        return Ok(());
    }
    let _guard = lock();
    let mut open = read_open(data_dir)?;
    let mut changed = false;
    for o in open.iter_mut() {
        if let Some(u) = updated.iter().find(|u| u.id == o.id && u.end_ns.is_none()) {
            *o = u.clone();
            changed = true;
        }
    }
    if changed { write_open(data_dir, &open) } else { Ok(()) }
}

/// Records a kernel-log event in the hour of its time.
pub fn record_event(data_dir: &Path, e: &Event) -> Result<(), StoreError> {
    let _guard = lock();
    ensure_dir(data_dir, EVENTS_DIR)?;
    append_line(&hour_path(data_dir, EVENTS_DIR, hour_of(e.ts_ns)), e)
}

/// Latest state per id, in start order; a closed state wins over an open one.
fn latest(records: impl IntoIterator<Item = Finding>) -> Vec<Finding> {
    let mut by_id: BTreeMap<String, Finding> = BTreeMap::new();
    for f in records {
        match by_id.get(&f.id) {
            Some(known) if known.end_ns.is_some() && f.end_ns.is_none() => {}
            _ => {
                by_id.insert(f.id.clone(), f);
            }
        }
    }
    let mut v: Vec<_> = by_id.into_values().collect();
    v.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(a.id.cmp(&b.id)));
    v
}

/// Every finding kept, latest state per id, in start order.
pub fn findings(data_dir: &Path) -> Result<Vec<Finding>, StoreError> {
    findings_in(data_dir, 0, u64::MAX)
}

/// Findings that overlap `[from_ns, to_ns)`; open ones count as lasting until now. Reads the
/// hours of the window and the open list only.
pub fn findings_in(data_dir: &Path, from_ns: u64, to_ns: u64) -> Result<Vec<Finding>, StoreError> {
    let now = crate::timespec::now_ns();
    let mut records: Vec<Finding> = read_lines(&data_dir.join(LEGACY_FINDINGS))?;
    records.extend(read_hours::<Finding>(data_dir, FINDINGS_DIR, from_ns, to_ns)?);
    records.extend(read_open(data_dir)?);
    Ok(latest(records).into_iter().filter(|f| f.start_ns < to_ns && f.end_ns.unwrap_or(now) >= from_ns).collect())
}

/// Kernel log events in `[from_ns, to_ns)`, in time order.
pub fn events_in(data_dir: &Path, from_ns: u64, to_ns: u64) -> Result<Vec<Event>, StoreError> {
    let mut events: Vec<Event> = read_lines(&data_dir.join(LEGACY_EVENTS))?;
    events.extend(read_hours::<Event>(data_dir, EVENTS_DIR, from_ns, to_ns)?);
    events.retain(|e| (from_ns..to_ns).contains(&e.ts_ns));
    events.sort_by_key(|e| e.ts_ns);
    Ok(events)
}

/// Moves the single-file layout's records into the hour files, then removes those files.
pub fn migrate(data_dir: &Path) -> Result<usize, StoreError> {
    let legacy_findings: Vec<Finding> = read_lines(&data_dir.join(LEGACY_FINDINGS))?;
    let legacy_events: Vec<Event> = read_lines(&data_dir.join(LEGACY_EVENTS))?;
    let moved = legacy_findings.len() + legacy_events.len();
    for f in latest(legacy_findings) {
        record_finding(data_dir, &f)?;
    }
    for e in &legacy_events {
        record_event(data_dir, e)?;
    }
    for file in [LEGACY_FINDINGS, LEGACY_EVENTS] {
        match std::fs::remove_file(data_dir.join(file)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StoreError::Io(data_dir.join(file), e)),
            _ => {}
        }
    }
    Ok(moved)
}

/// Closes the findings an earlier daemon left open (it was killed, or the machine went down)
/// at `end_ns`, the end of the data that daemon wrote: a finding cannot have outlived the
/// sampling that saw it, and "open forever" would mislead every later query. The evidence
/// says it was closed this way.
pub fn close_abandoned(data_dir: &Path, end_ns: u64) -> Result<Vec<Finding>, StoreError> {
    let _guard = lock();
    let mut closed = Vec::new();
    for mut f in read_open(data_dir)? {
        f.end_ns = Some(end_ns.max(f.start_ns));
        if let Some(evidence) = f.evidence.as_object_mut() {
            evidence.insert("closed_by".into(), "restart: the daemon that opened it stopped without closing it".into());
        }
        record_finding_locked(data_dir, &f)?;
        closed.push(f);
    }
    Ok(closed)
}

/// Retention for findings and events: removes the hour files that ended before `cutoff_ns`
/// (the oldest data the store keeps). Open findings stay in the open list. Returns how many
/// files went.
pub fn prune(data_dir: &Path, cutoff_ns: u64) -> Result<usize, StoreError> {
    let _guard = lock();
    let mut removed = 0;
    for dir in [FINDINGS_DIR, EVENTS_DIR] {
        removed += crate::store::files::remove_ended(hours(data_dir, dir)?, HOUR_NS, cutoff_ns)
            .map_err(|(path, e)| StoreError::Io(path, e))?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Kind, Severity};

    fn finding(id: &str, start: u64, end: Option<u64>) -> Finding {
        Finding {
            id: id.into(),
            kind: Kind::SaturatedCore,
            start_ns: start,
            end_ns: end,
            cpu: Some(1),
            severity: Severity::Warning,
            summary: "s".into(),
            evidence: serde_json::json!({}),
        }
    }

    const H: u64 = HOUR_NS;

    fn event(ts: u64) -> Event {
        Event { id: format!("e{ts}"), ts_ns: ts, pattern: "p".into(), message: "m".into() }
    }

    #[test]
    fn findings_left_open_by_a_crash_are_closed_at_the_end_of_the_data() {
        let dir = tempfile::tempdir().unwrap();
        record_finding(dir.path(), &finding("a", 10, None)).unwrap();
        record_finding(dir.path(), &finding("b", 20, None)).unwrap();
        record_finding(dir.path(), &finding("b", 20, Some(30))).unwrap();
        let closed = close_abandoned(dir.path(), 50).unwrap();
        assert_eq!(closed.len(), 1);
        let all = findings(dir.path()).unwrap();
        assert_eq!(
            all.iter().map(|f| (f.id.as_str(), f.end_ns)).collect::<Vec<_>>(),
            [("a", Some(50)), ("b", Some(30))]
        );
        assert!(all[0].evidence["closed_by"].as_str().unwrap().starts_with("restart"));
        assert!(close_abandoned(dir.path(), 60).unwrap().is_empty(), "closed once");
    }

    #[test]
    fn an_open_finding_reads_with_its_latest_figures_and_a_closed_one_stays_closed() {
        let dir = tempfile::tempdir().unwrap();
        record_finding(dir.path(), &finding("a", 10, None)).unwrap();
        record_finding(dir.path(), &finding("b", 20, None)).unwrap();
        record_finding(dir.path(), &finding("b", 20, Some(30))).unwrap();
        let later =
            |id: &str| Finding { summary: "3000 dying".into(), ..finding(id, if id == "a" { 10 } else { 20 }, None) };
        update_open(dir.path(), &[later("a"), later("b")]).unwrap();
        let all = findings(dir.path()).unwrap();
        assert_eq!(
            all.iter().map(|f| (f.id.as_str(), f.summary.as_str(), f.end_ns)).collect::<Vec<_>>(),
            [("a", "3000 dying", None), ("b", "s", Some(30))]
        );
    }

    #[test]
    fn a_window_reads_its_hours_and_the_open_list_only() {
        let dir = tempfile::tempdir().unwrap();
        // Closed after spanning hours 1 to 4; open since hour 1; short in hour 6.
        record_finding(dir.path(), &finding("long", H + 5, None)).unwrap();
        record_finding(dir.path(), &finding("long", H + 5, Some(4 * H + 7))).unwrap();
        record_finding(dir.path(), &finding("open", H + 9, None)).unwrap();
        record_finding(dir.path(), &finding("short", 6 * H + 1, Some(6 * H + 2))).unwrap();
        let ids = |from, to| -> Vec<(String, Option<u64>)> {
            findings_in(dir.path(), from, to).unwrap().into_iter().map(|f| (f.id, f.end_ns)).collect()
        };
        assert_eq!(ids(3 * H, 3 * H + 10), [("long".into(), Some(4 * H + 7)), ("open".into(), None)]);
        assert_eq!(ids(6 * H, 7 * H), [("open".into(), None), ("short".into(), Some(6 * H + 2))]);
        // A line in an hour outside the window is not read, whatever it claims.
        let forged = finding("forged", 6 * H, Some(6 * H + 1));
        append_line(&hour_path(dir.path(), FINDINGS_DIR, 9 * H), &forged).unwrap();
        assert!(!ids(6 * H, 7 * H).iter().any(|(id, _)| id == "forged"));
        record_event(dir.path(), &event(2 * H + 1)).unwrap();
        record_event(dir.path(), &event(6 * H + 1)).unwrap();
        assert_eq!(events_in(dir.path(), 6 * H, 7 * H).unwrap().len(), 1);
        assert_eq!(events_in(dir.path(), 0, u64::MAX).unwrap().len(), 2);
    }

    #[test]
    fn retention_drops_old_hours_and_keeps_open_findings() {
        let dir = tempfile::tempdir().unwrap();
        record_finding(dir.path(), &finding("old", 10, None)).unwrap();
        record_finding(dir.path(), &finding("old", 10, Some(20))).unwrap();
        record_finding(dir.path(), &finding("open", 15, None)).unwrap();
        record_finding(dir.path(), &finding("new", 5 * H, Some(5 * H + 9))).unwrap();
        record_event(dir.path(), &event(5)).unwrap();
        record_event(dir.path(), &event(5 * H)).unwrap();
        assert_eq!(prune(dir.path(), 3 * H).unwrap(), 2, "hour 0 of findings and of events");
        let ids: Vec<String> = findings(dir.path()).unwrap().into_iter().map(|f| f.id).collect();
        assert_eq!(ids, ["open", "new"]);
        assert_eq!(events_in(dir.path(), 0, u64::MAX).unwrap().len(), 1);
        assert_eq!(prune(dir.path(), 3 * H).unwrap(), 0);
    }

    #[test]
    fn the_single_file_layout_is_moved_into_hours() {
        let dir = tempfile::tempdir().unwrap();
        let legacy =
            |file: &str, lines: &[String]| std::fs::write(dir.path().join(file), lines.join("\n") + "\n").unwrap();
        let j = |f: &Finding| serde_json::to_string(f).unwrap();
        legacy(
            LEGACY_FINDINGS,
            &[j(&finding("a", H, None)), j(&finding("a", H, Some(2 * H))), j(&finding("o", 3 * H, None))],
        );
        legacy(LEGACY_EVENTS, &[serde_json::to_string(&event(H)).unwrap()]);
        let before = findings(dir.path()).unwrap();
        assert_eq!(before.len(), 2, "readers see the old files before the move");
        assert_eq!(migrate(dir.path()).unwrap(), 4);
        assert!(!dir.path().join(LEGACY_FINDINGS).exists() && !dir.path().join(LEGACY_EVENTS).exists());
        assert_eq!(findings(dir.path()).unwrap(), before);
        assert_eq!(events_in(dir.path(), H, H + 1).unwrap().len(), 1);
        assert_eq!(close_abandoned(dir.path(), 4 * H).unwrap().len(), 1, "the open one is in the open list");
    }
}
