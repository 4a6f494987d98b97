//! The daemon's logs on the real kernel: the periodic self report as one line of `key=value`
//! fields, JSON objects with `--log-format json` (aya's `log` records included), and the choice
//! between the journal and stderr that `JOURNAL_STREAM` drives.

use std::{collections::HashMap, os::unix::fs::MetadataExt, path::Path, time::Duration};

use integration_tests::{Daemon, privileged, status_json, wait_for};

/// The figures every self report carries.
const REPORT_FIELDS: [&str; 17] = [
    "samples_per_s",
    "per_cpu_hz",
    "busy",
    "idle",
    "lost",
    "bytes_written",
    "held",
    "cpu_pct",
    "rss_mib",
    "store_bytes",
    "cached_processes",
    "cached_modules",
    "cached_stacks",
    "cached_names",
    "stack_hits",
    "stack_total",
    // and, in JSON, the sentence
    "message",
];

/// The `key=value` fields of a text log line.
fn text_fields(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).collect()
}

/// The daemon's self reports in text format, once at least two have been written (the first
/// interval includes loading the BPF programs).
fn wait_for_reports(daemon: &Daemon) -> Vec<String> {
    wait_for("two self reports in the daemon's log", Duration::from_secs(30), || {
        let lines: Vec<String> =
            daemon.log_text().lines().filter(|l| l.contains(" self report ")).map(str::to_string).collect();
        (lines.len() >= 2).then_some(lines)
    })
}

#[test]
fn the_self_report_is_one_line_of_fields() {
    if !privileged("the_self_report_is_one_line_of_fields") {
        return;
    }
    let (_tmp, _data, mut daemon) = Daemon::ready_in_tempdir(&["--report-secs", "1", "--listen", "off"]);
    // Something to sample: an idle vCPU may get no ticks at all on a VM.
    let spin = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinner = {
        let spin = spin.clone();
        std::thread::spawn(move || {
            while spin.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let reports = wait_for_reports(&daemon);
    spin.store(false, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    for line in &reports {
        // `2026-11-21T10:02:03.250Z  INFO self report samples_per_s=198.0 ...`
        let time = line.split_whitespace().next().unwrap();
        assert!(time.len() == 24 && time.as_bytes()[10] == b'T' && time.ends_with('Z'), "RFC 3339 UTC: {line}");
        assert!(line.contains(" INFO "), "{line}");
        let fields = text_fields(line);
        for key in REPORT_FIELDS.iter().filter(|k| **k != "message") {
            let value = fields.get(key).unwrap_or_else(|| panic!("{key} missing: {line}"));
            assert!(value.parse::<f64>().is_ok(), "{key}={value} is not a number: {line}");
        }
        let total: u64 = fields["stack_total"].parse().unwrap();
        assert!(fields["stack_hits"].parse::<u64>().unwrap() <= total, "{line}");
    }
    // The second covers a whole interval (of at least 1 s) while this test kept a CPU busy.
    let text = daemon.log_text();
    let started = text.lines().find(|l| l.contains(" profiling started ")).expect("the start line");
    let cpus: f64 = text_fields(started)["cpus"].parse().unwrap();
    let last = text_fields(&reports[1]);
    let get = |key: &str| last[key].parse::<f64>().unwrap();
    let (rate, samples) = (get("samples_per_s"), get("busy") + get("idle"));
    assert!(get("busy") > 0.0 && rate > 0.0, "{}", reports[1]);
    assert!(samples / rate > 0.9 && samples / rate < 2.0, "samples_per_s is over about 1 s: {}", reports[1]);
    assert!((get("per_cpu_hz") * cpus - rate).abs() <= 0.1 * cpus, "per_cpu_hz is the rate per CPU: {}", reports[1]);
    assert!(get("per_cpu_hz") <= 99.0 * 1.5, "more samples than the frequency gives: {}", reports[1]);
    assert!(get("rss_mib") > 1.0, "{}", reports[1]);
    assert!(!text.contains('\u{1b}'), "colours in a log that is not a terminal:\n{text}");
    assert!(text.contains(" profiling started ") && text.contains("frequency_hz=99"), "{text}");
    assert!(daemon.stop().success());
    assert!(daemon.log_text().contains("flushed, exiting"), "{}", daemon.log_text());
}

#[test]
fn json_logs_are_one_object_per_line() {
    if !privileged("json_logs_are_one_object_per_line") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // aya logs through the `log` crate: its debug records must come through the same way.
    let mut daemon = Daemon::start_wrapped(
        &["env", "RUST_LOG=info,aya=debug"],
        &data,
        &["--report-secs", "1", "--listen", "off", "--log-format", "json"],
        200,
    );
    daemon.wait_ready();
    let parse = |daemon: &Daemon| -> Vec<serde_json::Value> {
        let text = daemon.log_text();
        // Lines still being written (the last, without its newline) are left for the next look.
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
    };
    let report = wait_for("a self report in JSON", Duration::from_secs(30), || {
        parse(&daemon).into_iter().find(|v| v["fields"]["message"] == "self report")
    });
    for key in REPORT_FIELDS {
        assert!(!report["fields"][key].is_null(), "{key} missing: {report}");
    }
    assert!(report["fields"]["samples_per_s"].is_f64(), "numbers stay numbers: {report}");
    assert!(report["fields"]["store_bytes"].is_u64(), "{report}");
    assert_eq!(report["level"], "INFO");
    assert!(report["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{report}");
    let all = parse(&daemon);
    for v in &all {
        assert!(v.is_object() && v["fields"]["message"].is_string(), "{v}");
    }
    assert!(
        all.iter().any(|v| v["fields"]["log.target"].as_str().is_some_and(|t| t.starts_with("aya"))),
        "no record of aya's (through the log crate) at debug level:\n{}",
        daemon.log_text()
    );
    assert!(daemon.stop().success());
}

#[test]
fn stderr_named_by_journal_stream_goes_to_the_journal_or_falls_back() {
    if !privileged("stderr_named_by_journal_stream_goes_to_the_journal_or_falls_back") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // As systemd does for a service whose stderr is the journal: JOURNAL_STREAM names the file
    // stderr is. Here that file is the daemon's log.
    let log = data.with_extension("log");
    let meta = std::fs::File::create(&log).unwrap().metadata().unwrap();
    let stream = format!("JOURNAL_STREAM={}:{}", meta.dev(), meta.ino());
    let mut daemon = Daemon::start_wrapped(&["env", &stream], &data, &["--report-secs", "1", "--listen", "off"], 200);
    let journald = std::os::unix::net::UnixDatagram::unbound()
        .and_then(|s| s.send_to(&[], Path::new("/run/systemd/journal/socket")))
        .is_ok();
    if journald {
        // Events go to the journal with the native protocol, not as lines on stderr.
        wait_for("the daemon's first block", Duration::from_secs(30), || {
            status_json(&data)?["summary"]["span"][1].as_u64()
        });
        std::thread::sleep(Duration::from_secs(3));
        let text = daemon.log_text();
        assert!(!text.contains("self report") && !text.contains("profiling started"), "{text}");
    } else {
        // No journal to talk to: a warning, and lines on stderr as anywhere else.
        let text = wait_for("the fallback to stderr", Duration::from_secs(30), || {
            let text = daemon.log_text();
            text.contains(" self report ").then_some(text)
        });
        assert!(text.contains("cannot write to the journal's socket; logging to stderr instead"), "{text}");
    }
    assert!(daemon.stop().success());
}
