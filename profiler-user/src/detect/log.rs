//! Findings and events on disk: `DATA_DIR/findings.jsonl` and `DATA_DIR/events.jsonl`, one JSON
//! object per line, appended. A finding is written when it opens and again when it closes; the
//! last line of an id wins. Root-only, like the store.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

use super::Finding;
use crate::store::StoreError;

pub const FINDINGS: &str = "findings.jsonl";
pub const EVENTS: &str = "events.jsonl";

/// Appends and prunes do not interleave (a prune rewrites the file; an append in between would
/// be lost with the old file).
static FILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Appends one record as a line.
pub fn append<T: Serialize>(data_dir: &Path, file: &str, record: &T) -> Result<(), StoreError> {
    let _guard = FILES.lock().unwrap_or_else(|p| p.into_inner());
    let path = data_dir.join(file);
    let mut line = serde_json::to_vec(record).expect("records serialise");
    line.push(b'\n');
    let mut f = crate::store::files::open_append(&path).map_err(|e| StoreError::Io(path.clone(), e))?;
    f.write_all(&line).map_err(|e| StoreError::Io(path, e))
}

/// Every record of a file; lines that do not parse (a torn last line) are skipped.
pub fn read_all<T: DeserializeOwned>(data_dir: &Path, file: &str) -> Result<Vec<T>, StoreError> {
    let path: PathBuf = data_dir.join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io(path, e)),
    };
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Findings, latest state per id, in start order.
pub fn findings(data_dir: &Path) -> Result<Vec<Finding>, StoreError> {
    let mut by_id: BTreeMap<String, Finding> = BTreeMap::new();
    for f in read_all::<Finding>(data_dir, FINDINGS)? {
        by_id.insert(f.id.clone(), f);
    }
    let mut v: Vec<_> = by_id.into_values().collect();
    v.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(a.id.cmp(&b.id)));
    Ok(v)
}

/// Findings that overlap `[from_ns, to_ns)`; open ones count as lasting until now.
pub fn findings_in(data_dir: &Path, from_ns: u64, to_ns: u64) -> Result<Vec<Finding>, StoreError> {
    let now = crate::timespec::now_ns();
    Ok(findings(data_dir)?.into_iter().filter(|f| f.start_ns < to_ns && f.end_ns.unwrap_or(now) >= from_ns).collect())
}

/// Kernel log events in `[from_ns, to_ns)`.
pub fn events_in(data_dir: &Path, from_ns: u64, to_ns: u64) -> Result<Vec<crate::collect::kmsg::Event>, StoreError> {
    Ok(read_all::<crate::collect::kmsg::Event>(data_dir, EVENTS)?
        .into_iter()
        .filter(|e| (from_ns..to_ns).contains(&e.ts_ns))
        .collect())
}

/// Closes the findings an earlier daemon left open (it was killed, or the machine went down)
/// at `end_ns`, the end of the data that daemon wrote: a finding cannot have outlived the
/// sampling that saw it, and "open forever" would mislead every later query. The evidence
/// says it was closed this way.
pub fn close_abandoned(data_dir: &Path, end_ns: u64) -> Result<Vec<Finding>, StoreError> {
    let mut closed = Vec::new();
    for mut f in findings(data_dir)?.into_iter().filter(|f| f.end_ns.is_none()) {
        f.end_ns = Some(end_ns.max(f.start_ns));
        if let Some(evidence) = f.evidence.as_object_mut() {
            evidence.insert("closed_by".into(), "restart: the daemon that opened it stopped without closing it".into());
        }
        append(data_dir, FINDINGS, &f)?;
        closed.push(f);
    }
    Ok(closed)
}

/// Retention for findings and events: drops findings that ended before `cutoff_ns` (the
/// oldest data the store keeps) and events before it, rewriting each file whole (they are
/// small once pruned). Returns how many records went.
pub fn prune(data_dir: &Path, cutoff_ns: u64) -> Result<usize, StoreError> {
    let _guard = FILES.lock().unwrap_or_else(|p| p.into_inner());
    let mut removed = 0;
    let mut keep = |file: &str, keep_line: &dyn Fn(&str) -> bool| -> Result<(), StoreError> {
        let path = data_dir.join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::Io(path, e)),
        };
        let kept: Vec<&str> = text.lines().filter(|l| keep_line(l)).collect();
        let gone = text.lines().count() - kept.len();
        if gone > 0 {
            removed += gone;
            let mut out = kept.join("\n");
            if !out.is_empty() {
                out.push('\n');
            }
            crate::store::files::write_private(&path, out.as_bytes())?;
        }
        Ok(())
    };
    // The last state of each finding decides; a finding still open is kept.
    let mut ends: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for f in read_all::<Finding>(data_dir, FINDINGS)? {
        ends.insert(f.id, f.end_ns);
    }
    keep(FINDINGS, &|l| {
        serde_json::from_str::<Finding>(l)
            .is_ok_and(|f| ends.get(&f.id).copied().flatten().is_none_or(|end| end >= cutoff_ns))
    })?;
    keep(EVENTS, &|l| serde_json::from_str::<crate::collect::kmsg::Event>(l).is_ok_and(|e| e.ts_ns >= cutoff_ns))?;
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

    #[test]
    fn findings_left_open_by_a_crash_are_closed_at_the_end_of_the_data() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), FINDINGS, &finding("a", 10, None)).unwrap();
        append(dir.path(), FINDINGS, &finding("b", 20, None)).unwrap();
        append(dir.path(), FINDINGS, &finding("b", 20, Some(30))).unwrap();
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
    fn retention_prunes_old_findings_and_events_and_keeps_open_ones() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), FINDINGS, &finding("old", 10, None)).unwrap();
        append(dir.path(), FINDINGS, &finding("old", 10, Some(20))).unwrap();
        append(dir.path(), FINDINGS, &finding("open", 15, None)).unwrap();
        append(dir.path(), FINDINGS, &finding("new", 200, Some(300))).unwrap();
        let event = |ts| crate::collect::kmsg::Event {
            id: format!("e{ts}"),
            ts_ns: ts,
            pattern: "p".into(),
            message: "m".into(),
        };
        append(dir.path(), EVENTS, &event(5)).unwrap();
        append(dir.path(), EVENTS, &event(500)).unwrap();
        assert_eq!(prune(dir.path(), 100).unwrap(), 3);
        let ids: Vec<String> = findings(dir.path()).unwrap().into_iter().map(|f| f.id).collect();
        assert_eq!(ids, ["open", "new"]);
        assert_eq!(events_in(dir.path(), 0, u64::MAX).unwrap().len(), 1);
        assert_eq!(prune(dir.path(), 100).unwrap(), 0);
    }
}
