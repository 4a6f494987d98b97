//! Findings and kernel log events of any set of nodes, read by the server for a window: the
//! latest version of each finding (a finding is written when it opens and again when it
//! closes), each event once (a retried batch sends rows again). For one node the lists are
//! those its own journal gives for the window (`detect::journal::findings_in`, `events_in`):
//! the same findings in the same order, so `profiler findings --clickhouse URL --node N`
//! prints what the node prints (tests/tests/fleet.rs).

use serde::Serialize;

use super::{Fleet, FleetError, rowbinary::Reader, select::Selection};
use crate::{
    collect::kmsg::Event,
    detect::Finding,
    query::Window,
    ship::clickhouse::schema::{self, col::*},
};

/// Most findings or events one read returns (a node logs a few an hour; a flood is cut).
pub const MAX_NOTES: u64 = 100_000;

/// A finding and the node it was found on.
#[derive(Debug, Clone, Serialize)]
pub struct NodeFinding {
    pub node: String,
    #[serde(flatten)]
    pub finding: Finding,
}

/// A kernel log event and the node that logged it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeEvent {
    pub node: String,
    #[serde(flatten)]
    pub event: Event,
}

/// The columns [`finding`] decodes, after `node`: the latest version of each.
fn finding_columns() -> String {
    format!(
        "{ID}, argMax({KIND}, {VERSION}), argMax({TS}, {VERSION}) AS start, argMax({END_TS}, {VERSION}) AS stop, \
         argMax({CPU}, {VERSION}), argMax({SEVERITY}, {VERSION}), argMax({SUMMARY}, {VERSION}), \
         argMax({EVIDENCE}, {VERSION})"
    )
}

/// One finding as [`finding_columns`] reads it.
fn finding(r: &mut Reader<'_>) -> Result<Finding, FleetError> {
    let (id, kind, start, end, cpu, severity, summary, evidence) =
        (r.string()?, r.string()?, r.u64()?, r.u64()?, r.i32()?, r.string()?, r.string()?, r.string()?);
    let text = |s: &str| serde_json::Value::String(s.to_string());
    let decode = |what: &str, e: serde_json::Error| FleetError::Decode(format!("finding {id}: {what}: {e}"));
    Ok(Finding {
        id: id.to_string(),
        kind: serde_json::from_value(text(kind)).map_err(|e| decode("kind", e))?,
        start_ns: start,
        end_ns: (end != 0).then_some(end),
        cpu: u32::try_from(cpu).ok(),
        severity: serde_json::from_value(text(severity)).map_err(|e| decode("severity", e))?,
        summary: summary.to_string(),
        evidence: serde_json::from_str(evidence).map_err(|e| decode("evidence", e))?,
    })
}

/// The findings of the chosen nodes that overlap `window` (`None`: every one), oldest first.
pub fn findings(fleet: &Fleet, sel: &Selection, window: Option<Window>) -> Result<Vec<NodeFinding>, FleetError> {
    // An open finding (no end yet) overlaps every window after its start.
    let (during, overlaps) = match window {
        Some(w) => (format!(" AND {TS} < {}", w.to_ns), format!(" HAVING stop = 0 OR stop >= {}", w.from_ns)),
        None => (String::new(), String::new()),
    };
    let sql = format!(
        "SELECT {NODE}, {} FROM {} WHERE {}{during} GROUP BY {NODE}, {ID}{overlaps} ORDER BY start, {NODE}, {ID} \
         LIMIT {MAX_NOTES}",
        finding_columns(),
        fleet.table(schema::FINDINGS),
        sel.predicate(),
    );
    let mut list = fleet.rows(&sql, |r| Ok(NodeFinding { node: r.string()?.to_string(), finding: finding(r)? }))?;
    // An open finding lasts until now, as the journal reads it: not into a window after now.
    if let Some(w) = window {
        let now = crate::timespec::now_ns();
        list.retain(|f| f.finding.end_ns.unwrap_or(now) >= w.from_ns);
    }
    Ok(list)
}

/// The chosen nodes' events in `window` (`None`: the newest [`MAX_NOTES`]), in time order
/// (then by node and id).
pub fn events(fleet: &Fleet, sel: &Selection, window: Option<Window>) -> Result<Vec<NodeEvent>, FleetError> {
    let during = window.map_or(String::new(), |w| format!(" AND {TS} >= {} AND {TS} < {}", w.from_ns, w.to_ns));
    let sql = format!(
        "SELECT {NODE}, {TS}, {ID}, any({PATTERN}), any({MESSAGE}) FROM {} WHERE {}{during} \
         GROUP BY {NODE}, {TS}, {ID} ORDER BY {TS} DESC, {NODE} DESC, {ID} DESC LIMIT {MAX_NOTES}",
        fleet.table(schema::EVENTS),
        sel.predicate(),
    );
    let mut events = fleet.rows(&sql, |r| {
        let node = r.string()?.to_string();
        let (ts_ns, id, pattern, message) = (r.u64()?, r.string()?, r.string()?, r.string()?);
        Ok(NodeEvent { node, event: Event { ts_ns, id: id.into(), pattern: pattern.into(), message: message.into() } })
    })?;
    events.reverse();
    Ok(events)
}
