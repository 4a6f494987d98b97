//! The daemon pushes OpenTelemetry profiles (OTLP/HTTP) to a receiver on loopback that refuses
//! the first requests: it retries, and across a SIGKILL and a restart on the same data directory
//! the receiver gets every sample of the store once, none twice, as `profiler export` reads them.
//! Over gRPC, the receiver is the reference implementation: grpcio serving opentelemetry-proto's
//! ProfilesService (PyPI).

use integration_tests::free_port;
use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::Command,
    sync::Mutex,
    time::Duration,
};

use integration_tests::{
    Daemon, Kill, helper_bin, now_secs,
    otlp::{Receiver, receiver},
    privileged, profiler, skip, wait_for, wait_for_every,
};
use profiler::export::otlp::{
    logs::ExportLogsServiceRequest,
    proto::{ExportProfilesServiceRequest, ProfilesDictionary, Value},
};
use prost::Message;

/// One sample as OTLP carries it: time, thread, process, CPU, thread name, frames root first
/// (kernel frames marked), and its value.
type Observation = (u64, i64, i64, i64, String, String, i64);

/// A request's window and its observations.
fn observations(bytes: &[u8]) -> ((u64, u64), Vec<Observation>) {
    let req = ExportProfilesServiceRequest::decode(bytes).expect("a request our definitions read");
    let d = req.dictionary.as_ref().unwrap();
    let mut window = (u64::MAX, 0);
    let mut out = Vec::new();
    for p in &req.resource_profiles[0].scope_profiles[0].profiles {
        window = (window.0.min(p.time_unix_nano), window.1.max(p.time_unix_nano + p.duration_nano));
        for s in &p.samples {
            let a = attrs(d, &s.attribute_indices);
            let int = |k: &str| match a.get(k) {
                Some(Value::Int(n)) => *n,
                other => panic!("{k}: {other:?}"),
            };
            let Some(Value::String(comm)) = a.get("thread.name") else { panic!("thread.name in {a:?}") };
            let frames: Vec<String> = d.stack_table[s.stack_index as usize]
                .location_indices
                .iter()
                .rev()
                .map(|&l| {
                    let loc = &d.location_table[l as usize];
                    let f = &d.function_table[loc.lines[0].function_index as usize];
                    let kind = match attrs(d, &loc.attribute_indices).get("profile.frame.type") {
                        Some(Value::String(k)) => k.clone(),
                        other => panic!("profile.frame.type: {other:?}"),
                    };
                    format!("{}[{kind}]", d.string_table[f.name_strindex as usize])
                })
                .collect();
            for (&t, &v) in s.timestamps_unix_nano.iter().zip(&s.values) {
                let o = (
                    t,
                    int("thread.id"),
                    int("process.pid"),
                    int("cpu.logical_number"),
                    comm.clone(),
                    frames.join(";"),
                    v,
                );
                out.push(o);
            }
        }
    }
    (window, out)
}

fn attrs(d: &ProfilesDictionary, indices: &[i32]) -> HashMap<String, Value> {
    indices
        .iter()
        .map(|&i| {
            let a = &d.attribute_table[i as usize];
            (d.string_table[a.key_strindex as usize].clone(), a.value.clone().unwrap().value.unwrap())
        })
        .collect()
}

/// `/metrics` series by name (with labels).
fn metrics(port: u16) -> Option<HashMap<String, f64>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
            .collect(),
    )
}

fn cursor(data: &Path) -> Option<u64> {
    std::fs::read_to_string(data.join("ship/otlp.cursor")).ok()?.trim().parse().ok()
}

fn secs(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

#[test]
fn the_daemon_pushes_every_sample_once_through_refusals_and_a_sigkill() {
    if !privileged("the_daemon_pushes_every_sample_once_through_refusals_and_a_sigkill") {
        return;
    }
    let (url, state) = receiver(3);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = tmp.path().join("profiler.toml");
    std::fs::write(&config, "[otlp]\ninterval = \"1s\"\n").unwrap();
    let args = |port: u16| {
        let (config, listen) = (config.to_str().unwrap().to_string(), format!("127.0.0.1:{port}"));
        // Off-CPU time ships as a profile of its own each interval (issue 42): these tests count
        // the CPU samples' batches and observations, so it is off here.
        let off_cpu = ["--off-cpu-threshold-ms".to_string(), "0".to_string()];
        [
            vec!["--config".to_string(), config, "--otlp-endpoint".into(), url.clone(), "--listen".into(), listen],
            off_cpu.to_vec(),
        ]
        .concat()
    };
    // Samples to push, whatever else the machine does.
    let _spin = Kill(Command::new(helper_bin()).args(["1", "120"]).spawn().unwrap());
    let port = free_port();
    let a = args(port);
    let mut daemon = Daemon::start(&data, &a.iter().map(String::as_str).collect::<Vec<_>>());
    daemon.wait_ready();
    wait_for("3 batches past the refusals", Duration::from_secs(60), || {
        (state.lock().unwrap().accepted.len() >= 3).then_some(())
    });
    assert_eq!(state.lock().unwrap().refused, 3);
    let m = wait_for("the shipper's counters", Duration::from_secs(10), || {
        metrics(port).filter(|m| m.get("profiler_otlp_batches_total").is_some_and(|&b| b >= 3.0))
    });
    assert!(m["profiler_otlp_retries_total"] >= 3.0, "{m:?}");
    assert!(m["profiler_otlp_lag_seconds"] < 30.0, "{m:?}");
    assert_eq!(m["profiler_otlp_errors_total{reason=\"rejected\"}"], 0.0);
    let log = daemon.log_text();
    assert!(log.contains("OTLP export failed; retrying") && log.contains("delivered after retries"), "{log}");

    // Between pushes: no request is taken, the last one's end is saved; then SIGKILL.
    state.lock().unwrap().gate_closed = true;
    let delivered_end = || {
        let s = state.lock().unwrap();
        s.accepted.iter().map(|b| observations(b).0.1).max().unwrap()
    };
    wait_for("the cursor at the end of the last delivery", Duration::from_secs(10), || {
        (cursor(&data) == Some(delivered_end())).then_some(())
    });
    daemon.kill9();
    let before = state.lock().unwrap().accepted.len();
    let restarted = now_secs();
    state.lock().unwrap().gate_closed = false;
    let a = args(free_port());
    let mut daemon = Daemon::start(&data, &a.iter().map(String::as_str).collect::<Vec<_>>());
    daemon.wait_ready_since(restarted);
    // Batches after the restart, well into its own data.
    wait_for("batches from the restarted daemon", Duration::from_secs(60), || {
        let s = state.lock().unwrap();
        let last = s.accepted.last().map(|b| observations(b).0.1 as f64 / 1e9)?;
        (s.accepted.len() >= before + 3 && last > restarted + 3.0).then_some(())
    });
    assert!(daemon.stop().success(), "{}", daemon.log_text());

    let s = state.lock().unwrap();
    let mut windows = Vec::new();
    let mut pushed: Vec<Observation> = Vec::new();
    for body in &s.accepted {
        let (w, o) = observations(body);
        windows.push(w);
        pushed.extend(o);
    }
    windows.sort_unstable();
    for pair in windows.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlapping batches: {pair:?}");
    }
    let (from, to) = (windows[0].0, windows.last().unwrap().1);
    eprintln!(
        "{} batches ({} refused, {} dropped unanswered at the SIGKILL) covering {:.1} s, {} samples",
        s.accepted.len(),
        s.refused,
        s.dropped,
        (to - from) as f64 / 1e9,
        pushed.len()
    );
    // No sample twice (the same thread cannot be sampled twice in one nanosecond).
    let mut keys: Vec<(u64, i64)> = pushed.iter().map(|o| (o.0, o.1)).collect();
    keys.sort_unstable();
    let before_dedup = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), before_dedup, "a sample was pushed twice");
    // Exactly what the store holds for the window the batches cover.
    let export = tmp.path().join("window.otlp");
    let dir = data.to_str().unwrap();
    let out = profiler(&[
        "export",
        "--data-dir",
        dir,
        "--from",
        &secs(from),
        "--to",
        &secs(to),
        "--format",
        "otlp",
        "-o",
        export.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, mut stored) = observations(&std::fs::read(&export).unwrap());
    pushed.sort();
    stored.sort();
    let (missing, extra): (Vec<_>, Vec<_>) = (
        stored.iter().filter(|o| pushed.binary_search(o).is_err()).take(3).collect(),
        pushed.iter().filter(|o| stored.binary_search(o).is_err()).take(3).collect(),
    );
    assert_eq!(pushed.len(), stored.len(), "pushed vs stored; missing e.g. {missing:?}, extra e.g. {extra:?}");
    assert!(missing.is_empty() && extra.is_empty(), "missing e.g. {missing:?}, extra e.g. {extra:?}");
    // And the helper's samples are among them, on its CPU, with its hot function.
    let hot = pushed.iter().filter(|o| o.3 == 1 && o.5.contains("profiler_test_hot_loop[native]")).count();
    assert!(hot > 50, "{hot} samples of the helper's hot loop on CPU 1");
    drop(s);
}

#[test]
fn the_daemon_pushes_over_grpc_to_the_reference_server() {
    if !privileged("the_daemon_pushes_over_grpc_to_the_reference_server") {
        return;
    }
    let check = "import grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc";
    if !Command::new("python3").args(["-c", check]).output().is_ok_and(|o| o.status.success()) {
        skip("the gRPC test needs python3 with grpcio and opentelemetry-proto (`cargo xtask test` installs them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (port_file, out) = (tmp.path().join("port"), tmp.path().join("received.jsonl"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("otlp_grpc_receiver.py");
    let _receiver = Kill(Command::new("python3").arg(&script).arg(&port_file).arg(&out).arg("2").spawn().unwrap());
    let port: u16 = wait_for("the gRPC receiver's port", Duration::from_secs(20), || {
        std::fs::read_to_string(&port_file).ok()?.trim().parse().ok()
    });
    let data = tmp.path().join("data");
    let config = tmp.path().join("profiler.toml");
    // The spinner on CPU 1 is a finding here (user time counts, the other CPU may be busy),
    // whose opening goes to the receiver's LogsService.
    let toml = format!(
        "[otlp]\nendpoint = \"http://127.0.0.1:{port}\"\nprotocol = \"grpc\"\ninterval = \"1s\"\n\
         [detect]\nsaturated_kernel_min = 0.0\nmachine_busy_max = 1.0\n"
    );
    std::fs::write(&config, toml).unwrap();
    let _spin = Kill(Command::new(helper_bin()).args(["1", "60"]).spawn().unwrap());
    // Off-CPU time (its own profile each interval) is off: this test counts the CPU samples.
    let mut daemon =
        Daemon::start(&data, &["--config", config.to_str().unwrap(), "--listen", "off", "--off-cpu-threshold-ms", "0"]);
    daemon.wait_ready();
    let lines = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    };
    wait_for("4 requests taken by the gRPC receiver", Duration::from_secs(60), || (lines().len() >= 4).then_some(()));
    let logs = tmp.path().join("received.jsonl.logs");
    let open = wait_for_every(
        "the spinner's CPU's finding opening at the gRPC LogsService",
        Duration::from_secs(40),
        Duration::from_millis(250),
        || {
            let text = std::fs::read_to_string(&logs).unwrap_or_default();
            // The spinner's CPU: the other may be saturated too for a while (CI saw CPU 0's
            // opening first, in the daemon's first seconds beside the receiver's start).
            text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|l| {
                l["event_name"] == "profiler.finding.open"
                    && l["attributes"]["profiler.finding.kind"] == "saturated-core"
                    && l["attributes"]["cpu.logical_number"] == 1
            })
        },
    );
    assert_eq!(open["attributes"]["profiler.finding.severity"], "warning", "{open}");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
    let log = daemon.log_text();
    assert!(log.contains("gRPC status 14: warming up"), "UNAVAILABLE is retried: {log}");
    let got = lines();
    let last = got.last().unwrap();
    let from = got[0]["time_unix_nano"].as_u64().unwrap();
    let to = last["time_unix_nano"].as_u64().unwrap() + last["duration_nano"].as_u64().unwrap();
    let samples: u64 = got.iter().map(|l| l["samples"].as_u64().unwrap()).sum();
    assert!(got.iter().all(|l| l["samples"] == l["observations"]), "one observation per sample: {got:?}");
    let folded =
        integration_tests::folded_window(data.to_str().unwrap(), from as f64 / 1e9, to as f64 / 1e9, &[]).unwrap();
    let stored: u64 = folded.iter().map(|(_, n)| n).sum();
    eprintln!("{} gRPC requests, {samples} samples; the store holds {stored} for their window", got.len());
    assert_eq!(samples, stored, "{got:?}");
}

/// One log record as the receiver got it: event name, time, severity, and its attributes.
type LogLine = (String, u64, i32, HashMap<String, Value>);

fn log_records(bodies: &[Vec<u8>]) -> Vec<LogLine> {
    let mut out = Vec::new();
    for b in bodies {
        let req = ExportLogsServiceRequest::decode(&b[..]).expect("a logs request our definitions read");
        for r in req.resource_logs.iter().flat_map(|r| &r.scope_logs).flat_map(|s| &s.log_records) {
            let attrs = r.attributes.iter().filter_map(|a| Some((a.key.clone(), a.value.clone()?.value?))).collect();
            out.push((r.event_name.clone(), r.time_unix_nano, r.severity_number, attrs));
        }
    }
    out
}

/// A real finding (a kernel hog on CPU 1) reaches the receiver as a log record when it opens
/// and as another, with the same id, when it closes.
#[test]
fn a_finding_opening_and_closing_reaches_the_receiver_as_log_records() {
    if !privileged("a_finding_opening_and_closing_reaches_the_receiver_as_log_records") {
        return;
    }
    let (url, state) = receiver(0);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = tmp.path().join("profiler.toml");
    // One saturated core is half of this 2-CPU machine; the daemon (a debug build) and the
    // test's queries load the other.
    std::fs::write(&config, "[otlp]\ninterval = \"1s\"\n[detect]\nmachine_busy_max = 0.75\n").unwrap();
    let config = config.to_str().unwrap();
    let mut daemon = Daemon::start(&data, &["--config", config, "--otlp-endpoint", &url, "--listen", "off"]);
    daemon.wait_ready();
    let hog = Kill(
        Command::new("taskset")
            .args(["-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let saturated = |state: &Mutex<Receiver>, event: &str| {
        log_records(&state.lock().unwrap().logs).into_iter().find(|(name, _, _, a)| {
            name == event && a.get("profiler.finding.kind") == Some(&Value::String("saturated-core".into()))
        })
    };
    let (_, opened_at, severity, open) = wait_for_every(
        "a saturated-core opening as a log record",
        Duration::from_secs(40),
        Duration::from_millis(250),
        || saturated(&state, "profiler.finding.open"),
    );
    assert_eq!(open.get("cpu.logical_number"), Some(&Value::Int(1)), "{open:?}");
    assert!(severity == 13 || severity == 17, "WARN or ERROR: {severity}");
    let Some(Value::String(id)) = open.get("profiler.finding.id").cloned() else { panic!("no id: {open:?}") };
    // The finding the node lists, with the onset the record carries.
    let listed = profiler(&["findings", "--data-dir", data.to_str().unwrap(), "--from", "-5m", "--format", "json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap();
    let f = listed.iter().find(|f| f["id"] == id.as_str()).unwrap_or_else(|| panic!("{id} not in {listed:?}"));
    assert_eq!(f["start_ns"].as_u64(), Some(opened_at), "{f}");
    drop(hog);
    let (_, closed_at, _, closed) = wait_for_every(
        "the same finding's closing as a log record",
        Duration::from_secs(40),
        Duration::from_millis(250),
        || saturated(&state, "profiler.finding.closed"),
    );
    assert_eq!(closed.get("profiler.finding.id"), Some(&Value::String(id.clone())));
    assert!(closed_at > opened_at);
    let opens = log_records(&state.lock().unwrap().logs)
        .iter()
        .filter(|(n, _, _, a)| {
            n == "profiler.finding.open" && a.get("profiler.finding.id") == Some(&Value::String(id.clone()))
        })
        .count();
    assert_eq!(opens, 1, "the opening is sent once");
    assert!(daemon.stop().success(), "{}", daemon.log_text());
}
