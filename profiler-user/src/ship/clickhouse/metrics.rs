//! The shipper's lines of `/metrics` (Prometheus text format).

use std::{
    fmt::Write,
    time::{SystemTime, UNIX_EPOCH},
};

use super::Stats;

pub fn render(s: &Stats) -> String {
    let mut out = String::new();
    // (labels, value) per line of a family.
    let mut family = |name: &str, kind: &str, help: &str, values: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in values {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let get = |v: &std::sync::atomic::AtomicU64| Stats::get(v) as f64;
    let shipped_to = Stats::get(&s.shipped_to_ns);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    // Before the first batch there is no lag to speak of: NaN, not the age of the epoch.
    let lag = if shipped_to == 0 { f64::NAN } else { (now - shipped_to as f64 / 1e9).max(0.0) };
    family(
        "profiler_clickhouse_lag_seconds",
        "gauge",
        "Age of the oldest sample not yet in ClickHouse (the shipper's cursor), seconds.",
        &[("", lag)],
    );
    family("profiler_clickhouse_rows_total", "counter", "Sample rows inserted into ClickHouse.", &[("", get(&s.rows))]);
    family(
        "profiler_clickhouse_stacks_total",
        "counter",
        "Stack rows inserted into ClickHouse (each new stack once per daemon run).",
        &[("", get(&s.stacks))],
    );
    family(
        "profiler_clickhouse_notes_total",
        "counter",
        "Finding and kernel-log event rows inserted into ClickHouse (an open finding again with every batch).",
        &[("{table=\"findings\"}", get(&s.findings)), ("{table=\"events\"}", get(&s.events))],
    );
    family(
        "profiler_clickhouse_counter_rows_total",
        "counter",
        "Counter-track rows (kernel counters, GPU tracks; one per track and tick) inserted into ClickHouse.",
        &[("", get(&s.counter_rows))],
    );
    family(
        "profiler_clickhouse_cuda_rows_total",
        "counter",
        "CUDA rows (launches, time blocked, bytes copied per second, thread and stack) inserted into ClickHouse.",
        &[("", get(&s.cuda_rows))],
    );
    family(
        "profiler_clickhouse_sent_bytes_total",
        "counter",
        "Bytes of insert bodies sent to ClickHouse (gzipped RowBinary), by table.",
        &[("{table=\"samples\"}", get(&s.sample_bytes)), ("{table=\"stacks\"}", get(&s.stack_bytes))],
    );
    family(
        "profiler_clickhouse_errors_total",
        "counter",
        "Requests to ClickHouse that failed (the store keeps the samples; each is retried).",
        &[("", get(&s.errors))],
    );
    family("profiler_clickhouse_retries_total", "counter", "Retries after a failed request.", &[("", get(&s.retries))]);
    family(
        "profiler_clickhouse_batches_already_there_total",
        "counter",
        "Batches found in ClickHouse after an insert of unknown outcome, and not sent again.",
        &[("", get(&s.batches_already_there))],
    );
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn every_figure_is_a_family() {
        let s = Stats::default();
        s.rows.store(7, Ordering::Relaxed);
        let text = render(&s);
        assert!(text.contains("\nprofiler_clickhouse_rows_total 7\n"), "{text}");
        assert!(text.contains("\nprofiler_clickhouse_lag_seconds NaN\n"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 10);
    }
}
