//! Findings as OTLP log records (`opentelemetry.proto.collector.logs.v1`): one record when a
//! finding opens, at its onset, and one when it closes, at its end, both carrying the finding's
//! id, so that a log backend (Loki, Elasticsearch, ClickHouse behind a collector) can alert on
//! the first and pair it with the second. The body is the finding's sentence; what a query
//! filters on is in the attributes.

use super::proto::{AnyValue, InstrumentationScope, KeyValue, Resource, Value};
use crate::detect::{Finding, Severity};

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportLogsServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_logs: Vec<ResourceLogs>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceLogs {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_logs: Vec<ScopeLogs>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeLogs {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub log_records: Vec<LogRecord>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `opentelemetry.proto.logs.v1.LogRecord`: the fields written.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogRecord {
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    /// `SeverityNumber`: 9 INFO, 13 WARN, 17 ERROR.
    #[prost(int32, tag = "2")]
    pub severity_number: i32,
    #[prost(string, tag = "3")]
    pub severity_text: String,
    #[prost(message, optional, tag = "5")]
    pub body: Option<AnyValue>,
    #[prost(message, repeated, tag = "6")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "11")]
    pub observed_time_unix_nano: u64,
    #[prost(string, tag = "12")]
    pub event_name: String,
}

/// A finding's transition that a record reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
}

impl Transition {
    fn as_str(self) -> &'static str {
        match self {
            Transition::Opened => "open",
            Transition::Closed => "closed",
        }
    }
}

fn string(key: &str, v: impl Into<String>) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(Value::String(v.into())) }) }
}

/// One record: at the onset for `Opened` (severity of the finding), at the end for `Closed`
/// (INFO: the condition ended). `observed_ns`: when the daemon sends it.
pub fn record(f: &Finding, t: Transition, observed_ns: u64) -> LogRecord {
    let (time, (number, text)) = match t {
        Transition::Opened => (
            f.start_ns,
            match f.severity {
                Severity::Info => (9, "INFO"),
                Severity::Warning => (13, "WARN"),
                Severity::Critical => (17, "ERROR"),
            },
        ),
        Transition::Closed => (f.end_ns.unwrap_or(observed_ns), (9, "INFO")),
    };
    let body = match t {
        Transition::Opened => f.summary.clone(),
        Transition::Closed => format!("ended: {}", f.summary),
    };
    let mut attributes = vec![
        string("profiler.finding.id", &f.id),
        string("profiler.finding.kind", f.kind.name()),
        string("profiler.finding.state", t.as_str()),
        string("profiler.finding.severity", f.severity.name()),
        // What the engineer runs next on the node (the id is also the page's `around=`).
        string("profiler.finding.flamegraph", format!("profiler flamegraph --around {}", f.id)),
    ];
    if let Some(cpu) = f.cpu {
        attributes.push(KeyValue {
            key: "cpu.logical_number".into(),
            value: Some(AnyValue { value: Some(Value::Int(i64::from(cpu))) }),
        });
    }
    match f.pod().as_deref().map(|p| p.split_once('/')) {
        Some(Some((ns, name))) => {
            attributes.push(string("k8s.namespace.name", ns));
            attributes.push(string("k8s.pod.name", name));
        }
        Some(None) => attributes.push(string("k8s.pod.name", f.pod().unwrap_or_default())),
        None => {}
    }
    // A GPU finding names its GPU (`detect::gpu`, `gpu::xid`): which one to drain or look at.
    if let Some(index) = f.evidence["gpu"].as_u64() {
        attributes.push(KeyValue {
            key: "profiler.gpu.index".into(),
            value: Some(AnyValue { value: Some(Value::Int(index as i64)) }),
        });
        for (key, field) in [("profiler.gpu.uuid", "uuid"), ("profiler.gpu.model", "model")] {
            if let Some(v) = f.evidence[field].as_str().filter(|v| !v.is_empty()) {
                attributes.push(string(key, v));
            }
        }
    }
    LogRecord {
        time_unix_nano: time,
        severity_number: number,
        severity_text: text.into(),
        body: Some(AnyValue { value: Some(Value::String(body)) }),
        attributes,
        observed_time_unix_nano: observed_ns,
        event_name: format!("profiler.finding.{}", t.as_str()),
    }
}

/// One request for `records`, with the resource the profiles carry (`host.name`).
pub fn request(host: &str, records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource { attributes: vec![string("host.name", host)] }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "profiler".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                log_records: records,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The records for the findings that opened or closed in `[from, to)`, oldest first.
pub fn transitions(findings: &[Finding], from: u64, to: u64, observed_ns: u64) -> Vec<LogRecord> {
    let within = |t: u64| (from..to).contains(&t);
    let mut out: Vec<LogRecord> = Vec::new();
    for f in findings {
        if within(f.start_ns) {
            out.push(record(f, Transition::Opened, observed_ns));
        }
        if f.end_ns.is_some_and(within) {
            out.push(record(f, Transition::Closed, observed_ns));
        }
    }
    out.sort_by_key(|r| r.time_unix_nano);
    out
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use serde_json::json;

    use super::*;
    use crate::detect::Kind;

    fn finding(start: u64, end: Option<u64>) -> Finding {
        Finding {
            id: "saturated-core-cpu1-20261124T010000".into(),
            kind: Kind::SaturatedCore,
            start_ns: start,
            end_ns: end,
            cpu: Some(1),
            severity: Severity::Critical,
            summary: "CPU 1 saturated for 12 s".into(),
            evidence: json!({"top_processes": [{"comm": "kubelet", "namespace": "kube-system", "pod": "kubelet-x"}]}),
        }
    }

    fn attr<'a>(r: &'a LogRecord, key: &str) -> Option<&'a Value> {
        r.attributes.iter().find(|a| a.key == key).and_then(|a| a.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn an_opening_is_an_error_at_the_onset_and_a_close_an_info_at_the_end() {
        let f = finding(100, Some(900));
        let open = record(&f, Transition::Opened, 1000);
        assert_eq!((open.time_unix_nano, open.severity_number, open.severity_text.as_str()), (100, 17, "ERROR"));
        assert_eq!(open.body.as_ref().unwrap().value, Some(Value::String("CPU 1 saturated for 12 s".into())));
        assert_eq!(attr(&open, "profiler.finding.kind"), Some(&Value::String("saturated-core".into())));
        assert_eq!(attr(&open, "profiler.finding.state"), Some(&Value::String("open".into())));
        assert_eq!(attr(&open, "cpu.logical_number"), Some(&Value::Int(1)));
        assert_eq!(attr(&open, "k8s.namespace.name"), Some(&Value::String("kube-system".into())));
        assert_eq!(attr(&open, "k8s.pod.name"), Some(&Value::String("kubelet-x".into())));
        let closed = record(&f, Transition::Closed, 1000);
        assert_eq!((closed.time_unix_nano, closed.severity_number), (900, 9));
        assert_eq!(attr(&closed, "profiler.finding.id"), attr(&open, "profiler.finding.id"));
        assert_eq!(closed.event_name, "profiler.finding.closed");
    }

    #[test]
    fn a_gpu_finding_names_its_gpu_and_the_pod_of_its_processes() {
        let f = Finding {
            kind: Kind::GpuStarved,
            cpu: None,
            evidence: json!({"gpu": 2, "uuid": "GPU-1", "model": "NVIDIA H100",
                "processes": [{"comm": "pt_data_worker", "namespace": "ml", "pod": "trainer-7"}]}),
            ..finding(100, None)
        };
        let open = record(&f, Transition::Opened, 1000);
        assert_eq!(attr(&open, "profiler.finding.kind"), Some(&Value::String("gpu-starved".into())));
        assert_eq!(attr(&open, "profiler.gpu.index"), Some(&Value::Int(2)));
        assert_eq!(attr(&open, "profiler.gpu.uuid"), Some(&Value::String("GPU-1".into())));
        assert_eq!(attr(&open, "profiler.gpu.model"), Some(&Value::String("NVIDIA H100".into())));
        assert_eq!(attr(&open, "k8s.pod.name"), Some(&Value::String("trainer-7".into())));
        assert_eq!(attr(&open, "cpu.logical_number"), None);
        assert_eq!(attr(&record(&finding(1, None), Transition::Opened, 2), "profiler.gpu.index"), None);
    }

    #[test]
    fn each_transition_goes_in_the_window_it_happened_in_once() {
        let findings = [finding(100, Some(250)), finding(150, None), finding(50, Some(120))];
        let first = transitions(&findings, 100, 200, 0);
        let states: Vec<_> = first.iter().map(|r| (r.time_unix_nano, r.event_name.as_str())).collect();
        assert_eq!(
            states,
            [(100, "profiler.finding.open"), (120, "profiler.finding.closed"), (150, "profiler.finding.open")]
        );
        let second = transitions(&findings, 200, 300, 0);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].time_unix_nano, 250);
        assert!(transitions(&findings, 300, 400, 0).is_empty());
    }

    #[test]
    fn the_request_decodes_with_host_name() {
        let req = request("node-7", vec![record(&finding(1, None), Transition::Opened, 2)]);
        let back = ExportLogsServiceRequest::decode(&req.encode_to_vec()[..]).unwrap();
        let resource = back.resource_logs[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "host.name");
        assert_eq!(back.resource_logs[0].scope_logs[0].log_records.len(), 1);
    }
}
