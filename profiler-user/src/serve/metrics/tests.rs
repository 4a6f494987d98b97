use super::*;

#[test]
fn every_line_is_a_comment_or_a_sample() {
    let mut s = Sampling::default();
    let stacks =
        crate::collect::StackCounts { user_stack_errors: 9, unwind_walks: 80, unwind_stopped: 3, ..Default::default() };
    s.per_cpu.insert(1, CpuTotals { ring_full: 2, queue_full: 5, stacks, ..Default::default() });
    s.events_lost = 4;
    let mut p = Figures::default();
    p.per_cpu.insert(0, (5, 95, 0));
    p.per_cpu.insert(1, (99, 0, 2));
    p.unwind = Some(crate::unwind::registry::Stats {
        tables: 4,
        rows: 1000,
        did_not_fit: 1,
        mappings_left_out: 46,
        ..Default::default()
    });
    p.ring_to_disk_seconds = Some((0.25, 0.75));
    p.ring_to_disk_total = (30.5, 100);
    p.detectors.busy_share.insert(1, 1.0);
    p.detectors.dying_memcgs = Some(3000);
    p.detectors.open_findings.insert("zombie-memcgs".into(), 1);
    (p.symbols.processes, p.symbols.modules) = (12, 40);
    (p.symbols.stack_hits, p.symbols.stack_misses) = (750, 250);
    p.symbols.processes_exited = 7;
    let mut l = Live::default();
    l.sampling.set(s);
    l.pipeline.set(p);
    l.otlp = Some(std::sync::Arc::new(std::sync::Mutex::new(crate::ship::Stats {
        batches: 3,
        retries: 2,
        errors: [("rejected", 1)].into(),
        lag_seconds: 12.5,
        ..Default::default()
    })));
    let text = render(&l);
    for line in text.lines() {
        assert!(line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.starts_with("profiler_"), "{line}");
        if !line.starts_with('#') {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
    assert!(text.contains("profiler_samples_total{cpu=\"1\",state=\"busy\"} 99\n"));
    assert!(text.contains("profiler_lost_samples_total{cpu=\"1\",reason=\"ring_full\"} 2\n"));
    assert!(text.contains("profiler_lost_samples_total{cpu=\"1\",reason=\"queue_full\"} 5\n"));
    assert!(text.contains("profiler_stack_errors_total{cpu=\"1\",stack=\"user\"} 9\n"));
    assert!(text.contains("profiler_ring_to_disk_latency_seconds{quantile=\"1\"} 0.75\n"));
    assert!(text.contains("profiler_open_findings{kind=\"zombie-memcgs\"} 1\n"));
    assert!(text.contains("profiler_dying_memcgs 3000\n"));
    assert!(text.contains("profiler_symbol_cache_entries{kind=\"processes\"} 12\n"));
    assert!(text.contains("profiler_symbol_cache_entries{kind=\"modules\"} 40\n"));
    assert!(text.contains("profiler_symbol_stack_cache_lookups_total{result=\"hit\"} 750\n"));
    assert!(text.contains("profiler_symbol_stack_cache_lookups_total{result=\"miss\"} 250\n"));
    assert!(text.contains("profiler_symbol_processes_exited_total 7\n"));
    assert!(text.contains("profiler_kernel_dropped_events_total 4\n"));
    assert!(text.contains("profiler_unwind_walks_total{cpu=\"1\",outcome=\"stopped\"} 3\n"));
    assert!(text.contains("profiler_unwind_table_rows 1000\n"));
    assert!(text.contains("# TYPE profiler_memory_pool_limit_bytes gauge\n"));
    assert!(text.contains("profiler_memory_pool_limit_bytes{pool=\"unwind_build\"} "));
    assert!(text.contains("profiler_memory_anon_bytes{at=\"peak\"} "));
    assert!(text.contains("profiler_unwind_tables_did_not_fit_total 1\n"));
    assert!(text.contains("profiler_otlp_batches_total 3\n"));
    assert!(text.contains("profiler_otlp_retries_total 2\n"));
    assert!(text.contains("profiler_otlp_errors_total{reason=\"rejected\"} 1\n"));
    assert!(text.contains("profiler_otlp_errors_total{reason=\"store\"} 0\n"));
    assert!(text.contains("profiler_otlp_lag_seconds 12.5\n"));
    assert!(text.contains("profiler_unwind_mappings_left_out 46\n"));
    assert!(
        text.contains(
            "profiler_ring_to_disk_latency_seconds_sum 30.5\nprofiler_ring_to_disk_latency_seconds_count 100\n"
        )
    );
    exposition_rules(&text);
}

/// What `promtool check metrics` holds the text to, as far as this exporter can break it:
/// every sample belongs to the family its `# TYPE` line announced (a summary's `_sum` and
/// `_count` included), a `quantile` label appears only in a summary (a gauge with one made
/// promtool refuse the whole page), and every summary has its `_sum` and `_count`.
fn exposition_rules(text: &str) {
    let mut family: Option<(String, String)> = None;
    let mut seen: Vec<String> = Vec::new();
    let check_summary = |family: &Option<(String, String)>, seen: &[String]| {
        if let Some((name, kind)) = family
            && kind == "summary"
        {
            for suffix in ["_sum", "_count"] {
                assert!(seen.iter().any(|n| *n == format!("{name}{suffix}")), "summary {name} without {suffix}");
            }
        }
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            check_summary(&family, &seen);
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(["counter", "gauge", "summary", "histogram", "untyped"].contains(&kind), "{line}");
            family = Some((name.to_string(), kind.to_string()));
            seen.clear();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, kind) = family.as_ref().unwrap_or_else(|| panic!("a sample before any TYPE: {line}"));
        let sample = line.split(['{', ' ']).next().unwrap();
        let allowed: Vec<String> = match kind.as_str() {
            "summary" => vec![name.clone(), format!("{name}_sum"), format!("{name}_count")],
            _ => vec![name.clone()],
        };
        assert!(allowed.iter().any(|a| a == sample), "{sample} under the TYPE of {name} ({kind})");
        if line.contains("quantile=") {
            assert_eq!(kind, "summary", "a quantile label outside a summary: {line}");
        }
        seen.push(sample.to_string());
    }
    check_summary(&family, &seen);
}

#[test]
fn open_findings_are_series_with_bounded_escaped_labels() {
    use crate::detect::{Kind, Labels, Severity};
    let label = |kind, cpu, pod: Option<&str>, severity| Labels { kind, cpu, pod: pod.map(str::to_string), severity };
    let l = Live::default();
    let labels = |finding_labels| {
        let detectors = crate::detect::Figures { finding_labels, ..Default::default() };
        l.pipeline.set(Figures { detectors, ..Default::default() });
    };
    labels(vec![
        label(Kind::SaturatedCore, Some(1), Some("ml/trainer-0"), Severity::Critical),
        label(Kind::CfsThrottling, None, Some("ml/trainer-0"), Severity::Warning),
        label(Kind::CfsThrottling, None, Some("ml/trainer-0"), Severity::Warning),
        label(Kind::ZombieMemcgs, None, None, Severity::Warning),
        label(Kind::CfsThrottling, None, Some("odd\"pod\\\nname"), Severity::Critical),
    ]);
    let text = render(&l);
    assert!(text.contains("# TYPE profiler_finding gauge\n"));
    assert!(
        text.contains(
            "profiler_finding{kind=\"saturated-core\",cpu=\"1\",pod=\"ml/trainer-0\",severity=\"critical\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "profiler_finding{kind=\"cfs-throttling\",cpu=\"\",pod=\"ml/trainer-0\",severity=\"warning\"} 2\n"
        ),
        "{text}"
    );
    assert!(text.contains("profiler_finding{kind=\"zombie-memcgs\",cpu=\"\",pod=\"\",severity=\"warning\"} 1\n"));
    assert!(text.contains("pod=\"odd\\\"pod\\\\\\nname\""), "escaped: {text}");
    assert!(text.contains("profiler_open_findings{kind=\"cfs-throttling\"} 0\n"), "every kind is listed");

    // A thousand throttled pods: a bounded number of series, every finding still counted.
    labels(
        (0..1000).map(|i| label(Kind::CfsThrottling, None, Some(&format!("ns/pod-{i}")), Severity::Warning)).collect(),
    );
    let text = render(&l);
    let series: Vec<&str> = text.lines().filter(|s| s.starts_with("profiler_finding{")).collect();
    assert_eq!(series.len(), MAX_FINDING_SERIES, "{series:?}");
    let total: f64 = series.iter().map(|s| s.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum();
    assert_eq!(total, 1000.0);
    assert!(text.contains("pod=\"_other\",severity=\"warning\"} 901\n"), "{text}");
}

#[test]
fn a_findings_pod_is_its_own_or_its_first_processes() {
    use crate::detect::{Finding, Kind, Severity};
    let finding = |evidence| Finding {
        id: "x".into(),
        kind: Kind::SaturatedCore,
        start_ns: 0,
        end_ns: None,
        cpu: Some(1),
        severity: Severity::Warning,
        summary: String::new(),
        evidence,
    };
    let own = finding(serde_json::json!({"namespace": "ml", "pod": "a", "top_processes": [{"pod": "b"}]}));
    assert_eq!(own.pod().as_deref(), Some("ml/a"));
    let first = finding(serde_json::json!({"processes": [{"namespace": "ml", "pod": "b"}, {"pod": "c"}]}));
    assert_eq!(first.pod().as_deref(), Some("ml/b"));
    let uid = finding(serde_json::json!({"held_by": [{"pod_uid": "0b3c"}]}));
    assert_eq!(uid.pod().as_deref(), Some("0b3c"));
    assert_eq!(finding(serde_json::json!({"top_processes": [{"comm": "dd"}]})).pod(), None);
}
