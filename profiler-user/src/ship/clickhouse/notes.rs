//! Findings and kernel-log events as `JSONEachRow` rows: a few per hour, so readability beats
//! compactness here.

use serde_json::json;

use super::schema::col::{CPU, END_TS, EVIDENCE, ID, KIND, MESSAGE, NODE, PATTERN, SEVERITY, SUMMARY, TS, VERSION};
use crate::{collect::kmsg::Event, detect::Finding};

pub fn events(node: &str, events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        let row = json!({NODE: node, TS: e.ts_ns, ID: e.id, PATTERN: e.pattern, MESSAGE: e.message});
        out.push_str(&row.to_string());
        out.push('\n');
    }
    out
}

/// `end_ts` 0 while open; `cpu` -1 when the finding is not about one CPU. The version is the
/// end (or the start while open), so a closed finding replaces its open row.
pub fn findings(node: &str, findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let text = |v: serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let row = json!({
            NODE: node,
            ID: f.id,
            KIND: text(json!(f.kind)),
            TS: f.start_ns,
            END_TS: f.end_ns.unwrap_or(0),
            CPU: f.cpu.map_or(-1, i64::from),
            SEVERITY: text(json!(f.severity)),
            SUMMARY: f.summary,
            EVIDENCE: f.evidence.to_string(),
            VERSION: f.end_ns.unwrap_or(f.start_ns),
        });
        out.push_str(&row.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{Kind, Severity};

    #[test]
    fn a_closed_finding_outranks_its_open_row() {
        let open = Finding {
            id: "f1".into(),
            kind: Kind::SaturatedCore,
            start_ns: 10,
            end_ns: None,
            cpu: Some(1),
            severity: Severity::Warning,
            summary: "s".into(),
            evidence: json!({"a": 1}),
        };
        let closed = Finding { end_ns: Some(20), ..open.clone() };
        let rows = findings("n", &[open, closed]);
        let v: Vec<serde_json::Value> = rows.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(v[0]["kind"], "saturated-core");
        assert_eq!((v[0]["end_ts"].as_u64(), v[0]["version"].as_u64()), (Some(0), Some(10)));
        assert_eq!((v[1]["end_ts"].as_u64(), v[1]["version"].as_u64()), (Some(20), Some(20)));
        assert_eq!(v[1]["evidence"], "{\"a\":1}");
        assert_eq!(v[1]["cpu"], 1);
    }
}
