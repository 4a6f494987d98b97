//! The most rows a node sends per second (`[clickhouse] max_rows_per_sec`), whatever its
//! backlog. A node back from hours offline, or a whole shard's nodes once the shard is back,
//! would otherwise send batch after batch as fast as the server takes them, and the nodes still
//! shipping live would queue behind them. In steady state a node sends a few seconds of rows
//! every few seconds, far under the bound, and never waits.

use std::time::Duration;

/// The default bound: ten times what a 192-CPU node busy on every CPU at 99 Hz writes (about
/// 19,000 rows a second), so that a node catches up ten times faster than it falls behind.
pub const DEFAULT_ROWS_PER_SEC: u64 = 200_000;

/// What `max_rows_per_sec` may be: below what a busy node writes it would never catch up.
pub const ROWS_PER_SEC: std::ops::RangeInclusive<u64> = 1_000..=100_000_000;

/// How long to wait after a batch of `rows` rows that took `took` to read and send, so that
/// the node sends at most `rows_per_sec` rows a second over any run of batches (at most one
/// batch more over any interval).
pub fn pause(rows: usize, rows_per_sec: u64, took: Duration) -> Duration {
    Duration::from_secs_f64(rows as f64 / rows_per_sec.max(1) as f64).saturating_sub(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_followed_by_the_time_its_rows_are_worth() {
        assert_eq!(pause(50_000, 100_000, Duration::ZERO), Duration::from_millis(500));
        // The time spent reading and sending counts.
        assert_eq!(pause(50_000, 100_000, Duration::from_millis(200)), Duration::from_millis(300));
        assert_eq!(pause(50_000, 100_000, Duration::from_secs(2)), Duration::ZERO);
        // A live node's few seconds of rows: no wait worth the name.
        assert!(pause(500, DEFAULT_ROWS_PER_SEC, Duration::ZERO) <= Duration::from_millis(3));
        assert_eq!(pause(0, 1, Duration::ZERO), Duration::ZERO);
    }
}
