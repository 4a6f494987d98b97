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

/// Appends one record as a line.
pub fn append<T: Serialize>(data_dir: &Path, file: &str, record: &T) -> Result<(), StoreError> {
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
