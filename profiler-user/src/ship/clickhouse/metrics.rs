//! The shipper's lines of `/metrics` (Prometheus text format).

use std::{
    fmt::Write,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::ship::Stats;

pub fn render(s: &Stats) -> String {
    let mut out = String::new();
    // (labels, value) per line of a family.
    let mut family = |name: &str, kind: &str, help: &str, values: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in values {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let shipped_to = s.cursor_ns;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    // Before the first batch there is no lag to speak of: NaN, not the age of the epoch.
    let lag = if shipped_to == 0 { f64::NAN } else { (now - shipped_to as f64 / 1e9).max(0.0) };
    family(
        "profiler_clickhouse_lag_seconds",
        "gauge",
        "Age of the oldest sample not yet in ClickHouse (the shipper's cursor), seconds.",
        &[("", lag)],
    );
    family(
        "profiler_clickhouse_rows_total",
        "counter",
        "Sample rows inserted into ClickHouse.",
        &[("", s.sample_rows as f64)],
    );
    family(
        "profiler_clickhouse_stacks_total",
        "counter",
        "Stack rows inserted into ClickHouse (each new stack once per daemon run).",
        &[("", s.stacks as f64)],
    );
    family(
        "profiler_clickhouse_notes_total",
        "counter",
        "Finding and kernel-log event rows inserted into ClickHouse (an open finding again with every batch).",
        &[("{table=\"findings\"}", s.findings as f64), ("{table=\"events\"}", s.events as f64)],
    );
    family(
        "profiler_clickhouse_counter_rows_total",
        "counter",
        "Counter-track rows (kernel counters, GPU tracks; one per track and tick) inserted into ClickHouse.",
        &[("", s.counter_rows as f64)],
    );
    family(
        "profiler_clickhouse_cuda_rows_total",
        "counter",
        "CUDA rows (launches, time blocked, bytes copied per second, thread and stack) inserted into ClickHouse.",
        &[("", s.cuda_samples as f64)],
    );
    family(
        "profiler_clickhouse_sent_bytes_total",
        "counter",
        "Bytes of insert bodies sent to ClickHouse (gzipped RowBinary), by table.",
        &[("{table=\"samples\"}", s.bytes as f64), ("{table=\"stacks\"}", s.stack_bytes as f64)],
    );
    family(
        "profiler_clickhouse_errors_total",
        "counter",
        "Requests to ClickHouse that failed (the store keeps the samples; each is retried).",
        &[("", s.errors.values().sum::<u64>() as f64)],
    );
    family(
        "profiler_clickhouse_retries_total",
        "counter",
        "Retries after a failed request.",
        &[("", s.retries as f64)],
    );
    family(
        "profiler_clickhouse_batches_already_there_total",
        "counter",
        "Batches found in ClickHouse after an insert of unknown outcome, and not sent again.",
        &[("", s.batches_already_there as f64)],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_is_a_family() {
        let s = Stats { sample_rows: 7, ..Default::default() };
        let text = render(&s);
        assert!(text.contains("\nprofiler_clickhouse_rows_total 7\n"), "{text}");
        assert!(text.contains("\nprofiler_clickhouse_lag_seconds NaN\n"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 10);
    }
}
