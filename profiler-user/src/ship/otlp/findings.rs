//! Which findings' openings and closings the OTLP shipper still owes the receiver.
//!
//! A finding is written some seconds after its onset (a detector needs its window), so a
//! transition cannot be matched to the profile batch whose window holds its time: each batch
//! looks back [`LOOKBACK_NS`] and sends what it has not sent yet. What was sent is remembered in
//! memory only: after a restart, the transitions of the last `LOOKBACK_NS` go again (the same
//! finding id: at least once, as OTLP delivers everything).

use std::collections::HashMap;

use crate::{
    detect::Finding,
    export::otlp::logs::{self, LogRecord, Transition},
};

/// How far before the batch's start transitions are looked for: longer than any detector
/// takes from an onset to writing its finding.
pub const LOOKBACK_NS: u64 = 600 * 1_000_000_000;

#[derive(Debug, Default)]
pub struct Owed {
    /// (finding id, closed) → the transition's time, forgotten once it falls out of the look-back.
    sent: HashMap<(String, bool), u64>,
}

impl Owed {
    /// The records for transitions in `[from, end)` (`from` = the batch start minus the
    /// look-back) not sent yet, oldest first, with the keys to mark once delivered.
    pub fn due(
        &self,
        findings: &[Finding],
        from: u64,
        end: u64,
        now_ns: u64,
    ) -> (Vec<LogRecord>, Vec<(String, bool, u64)>) {
        let within = |t: u64| (from..end).contains(&t);
        let mut due: Vec<(LogRecord, (String, bool, u64))> = Vec::new();
        for f in findings {
            let mut owe = |closed: bool, t: u64, which: Transition| {
                if within(t) && !self.sent.contains_key(&(f.id.clone(), closed)) {
                    due.push((logs::record(f, which, now_ns), (f.id.clone(), closed, t)));
                }
            };
            owe(false, f.start_ns, Transition::Opened);
            if let Some(end_ns) = f.end_ns {
                owe(true, end_ns, Transition::Closed);
            }
        }
        due.sort_by_key(|(r, _)| r.time_unix_nano);
        due.into_iter().unzip()
    }

    /// Marks `keys` sent and forgets what is older than `from`.
    pub fn sent(&mut self, keys: Vec<(String, bool, u64)>, from: u64) {
        self.sent.extend(keys.into_iter().map(|(id, closed, t)| ((id, closed), t)));
        self.sent.retain(|_, t| *t >= from);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::detect::{Kind, Severity};

    fn finding(id: &str, start: u64, end: Option<u64>) -> Finding {
        Finding {
            id: id.into(),
            kind: Kind::LockSpinning,
            start_ns: start,
            end_ns: end,
            cpu: None,
            severity: Severity::Warning,
            summary: "s".into(),
            evidence: json!({}),
        }
    }

    #[test]
    fn a_finding_written_after_its_batch_went_is_still_sent_and_only_once() {
        let mut owed = Owed::default();
        // Batch [100, 200): the finding (onset 150) is not written yet.
        let (records, keys) = owed.due(&[], 0, 200, 0);
        assert!(records.is_empty());
        owed.sent(keys, 0);
        // Batch [200, 300): now it is, with an onset in the previous batch's window.
        let f = [finding("a", 150, None)];
        let (records, keys) = owed.due(&f, 0, 300, 0);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].event_name, "profiler.finding.open");
        owed.sent(keys, 0);
        assert!(owed.due(&f, 0, 400, 0).0.is_empty(), "sent once");
        // It closes: the close goes, the opening does not go again.
        let f = [finding("a", 150, Some(420))];
        let (records, keys) = owed.due(&f, 0, 500, 0);
        assert_eq!(records.iter().map(|r| r.event_name.as_str()).collect::<Vec<_>>(), ["profiler.finding.closed"]);
        owed.sent(keys, 0);
        assert!(owed.due(&f, 0, 600, 0).0.is_empty());
    }

    #[test]
    fn what_falls_out_of_the_look_back_is_forgotten_and_not_sent_again() {
        let mut owed = Owed::default();
        let f = [finding("a", 150, Some(160))];
        let (_, keys) = owed.due(&f, 0, 200, 0);
        owed.sent(keys, 0);
        owed.sent(Vec::new(), 170);
        assert!(owed.sent.is_empty());
        assert!(owed.due(&f, 170, 1000, 0).0.is_empty(), "outside the look-back: not owed");
    }

    #[test]
    fn a_transition_not_yet_in_the_batch_waits_for_a_later_one() {
        let owed = Owed::default();
        assert!(owed.due(&[finding("a", 250, None)], 0, 200, 0).0.is_empty());
    }
}
