use std::{collections::HashMap, path::Path, process::Command, sync::Arc};

use prost::Message;

use super::{proto::*, *};
use crate::{
    model::{Sample as Stored, Stack as StoredStack},
    query::{self, Filter, KERNEL_SUFFIX},
    store::{Store, StoreWriter, format::NS_PER_SEC, identity::Identity, segments_dir},
    untrusted::folded_frame,
};

const T0: u64 = 1_795_000_000 * NS_PER_SEC; // on a minute boundary

fn sample<'a>(ts_ns: u64, tid: u32, frames: &'a [(&'a str, bool)], workload: &'a str) -> SampleRef<'a> {
    SampleRef {
        ts_ns,
        cpu: 1,
        pid: 42,
        tid,
        comm: "dd",
        frames,
        locations: &[],
        count: 1,
        frequency_hz: None,
        workload,
    }
}

fn roundtrip(b: Builder) -> ExportProfilesServiceRequest {
    let mut bytes = Vec::new();
    b.write(&mut bytes).unwrap();
    ExportProfilesServiceRequest::decode(&bytes[..]).unwrap()
}

/// A sample's attributes by key, and the value as text.
fn attrs(d: &ProfilesDictionary, indices: &[i32]) -> HashMap<String, String> {
    indices
        .iter()
        .map(|&i| {
            let a = &d.attribute_table[i as usize];
            let v = match a.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Value::String(s)) => s,
                Some(Value::Int(n)) => n.to_string(),
                None => String::new(),
            };
            (d.string_table[a.key_strindex as usize].clone(), v)
        })
        .collect()
}

/// (function name, frame type, file, line) of a stack, leaf first.
fn stack_frames(d: &ProfilesDictionary, stack: i32) -> Vec<(String, String, String, i64)> {
    d.stack_table[stack as usize]
        .location_indices
        .iter()
        .map(|&l| {
            let loc = &d.location_table[l as usize];
            let f = &d.function_table[loc.lines[0].function_index as usize];
            let kind = attrs(d, &loc.attribute_indices).remove("profile.frame.type").unwrap();
            let s = |i: i32| d.string_table[i as usize].clone();
            (s(f.name_strindex), kind, s(f.filename_strindex), loc.lines[0].line)
        })
        .collect()
}

#[test]
fn request_decodes_with_stacks_attributes_and_one_observation_per_sample() {
    let frames_a = [("main", false), ("outer (/srv/app.py:31)", false), ("read_zero", true)];
    let frames_b = [("main", false), ("[softirq:NET_RX]", true), ("net_rx_action", true)];
    let w = Window::new(T0, T0 + 10 * NS_PER_SEC).unwrap();
    let mut b = Builder::new(w, "node-1", 99);
    for i in 0..3 {
        b.add(&sample(T0 + i, 43, &frames_a, ""));
    }
    b.add(&sample(T0 + 5, 44, &frames_a, ""));
    b.add(&SampleRef { count: 7, ..sample(T0 + 6, 43, &frames_b, "") });
    assert_eq!(b.samples(), 11);
    let r = roundtrip(b);
    let d = r.dictionary.as_ref().unwrap();
    // Entry 0 of each table is its zero value.
    assert_eq!(d.string_table[0], "");
    assert_eq!((&d.location_table[0], &d.function_table[0]), (&Location::default(), &Function::default()));
    assert_eq!((&d.stack_table[0], &d.attribute_table[0]), (&Stack::default(), &KeyValueAndUnit::default()));
    let rp = &r.resource_profiles[0];
    let host = &rp.resource.as_ref().unwrap().attributes[0];
    assert_eq!(host.key, "host.name");
    assert_eq!(host.value.as_ref().unwrap().value, Some(Value::String("node-1".into())));
    let profiles = &rp.scope_profiles[0].profiles;
    assert_eq!(profiles.len(), 1);
    let p = &profiles[0];
    let s = |i: i32| d.string_table[i as usize].as_str();
    let st = p.sample_type.as_ref().unwrap();
    assert_eq!((s(st.type_strindex), s(st.unit_strindex)), ("samples", "count"));
    let pt = p.period_type.as_ref().unwrap();
    assert_eq!((s(pt.type_strindex), s(pt.unit_strindex), p.period), ("cpu", "nanoseconds", 1_000_000_000 / 99));
    assert_eq!((p.time_unix_nano, p.duration_nano), (T0, 10 * NS_PER_SEC));
    assert_eq!(p.profile_id.len(), 16);
    // Samples of one thread and stack are one sample with one observation each.
    assert_eq!(p.samples.len(), 3, "{:?}", p.samples);
    let first = &p.samples[0];
    assert_eq!(first.timestamps_unix_nano, vec![T0, T0 + 1, T0 + 2]);
    assert_eq!(first.values, vec![1, 1, 1]);
    assert_eq!(p.samples[2].values, vec![7]);
    let a = attrs(d, &first.attribute_indices);
    let want: HashMap<String, String> = [
        ("thread.id", "43"),
        ("process.pid", "42"),
        ("thread.name", "dd"),
        ("cpu.logical_number", "1"),
        ("context", "task"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_eq!(a, want);
    // The softirq marker (a kernel frame at the root of the kernel part) is the sample's context.
    assert_eq!(attrs(d, &p.samples[2].attribute_indices)["context"], "softirq:NET_RX");
    // Leaf first; the kernel frame and the Python frame are typed, the names unmarked.
    let f = stack_frames(d, first.stack_index);
    let f: Vec<(&str, &str, &str, i64)> = f.iter().map(|(n, k, file, l)| (&n[..], &k[..], &file[..], *l)).collect();
    assert_eq!(f, [("read_zero", "kernel", "", 0), ("outer", "cpython", "/srv/app.py", 31), ("main", "native", "", 0)]);
    // Shared frames are one location (the zero one, three of a, two more of b).
    assert_eq!(d.location_table.len(), 6);
    assert_eq!(p.samples[1].stack_index, first.stack_index);
}

#[test]
fn a_window_spanning_two_frequencies_is_one_profile_per_period() {
    let frames = [("main", false)];
    let w = Window::new(T0, T0 + 2 * NS_PER_SEC).unwrap();
    let mut b = Builder::new(w, "h", 99);
    b.add(&SampleRef { frequency_hz: Some(99), ..sample(T0, 1, &frames, "") });
    b.add(&SampleRef { frequency_hz: Some(999), ..sample(T0 + NS_PER_SEC, 1, &frames, "") });
    b.add(&sample(T0 + 2, 1, &frames, "")); // no frequency recorded: the default (99)
    let r = roundtrip(b);
    let profiles = &r.resource_profiles[0].scope_profiles[0].profiles;
    let periods: Vec<(i64, usize)> = profiles.iter().map(|p| (p.period, p.samples[0].values.len())).collect();
    assert_eq!(periods, [(1_000_000_000 / 999, 1), (1_000_000_000 / 99, 2)]);
    assert_ne!(profiles[0].profile_id, profiles[1].profile_id);
}

#[test]
fn a_workload_every_sample_shares_describes_the_resource() {
    let frames = [("main", false)];
    let pod = r#"{"pod_name":"web-1","pod_namespace":"shop","pod_uid":"u-1","container_name":"web","container_id":"abc","runtime":"containerd"}"#;
    let w = Window::new(T0, T0 + NS_PER_SEC).unwrap();
    let mut b = Builder::new(w, "h", 99);
    b.add(&sample(T0, 1, &frames, pod));
    b.add(&sample(T0 + 1, 2, &frames, pod));
    let r = roundtrip(b);
    let resource: HashMap<String, String> = r.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| match kv.value.as_ref().and_then(|v| v.value.clone()) {
            Some(Value::String(s)) => (kv.key.clone(), s),
            other => panic!("{other:?}"),
        })
        .collect();
    for (k, v) in [
        ("k8s.pod.name", "web-1"),
        ("k8s.namespace.name", "shop"),
        ("k8s.pod.uid", "u-1"),
        ("k8s.container.name", "web"),
        ("container.id", "abc"),
        ("container.runtime.name", "containerd"),
        ("host.name", "h"),
    ] {
        assert_eq!(resource.get(k).map(String::as_str), Some(v), "{k} in {resource:?}");
    }
    let d = r.dictionary.as_ref().unwrap();
    let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
    assert!(p.samples.iter().all(|s| !attrs(d, &s.attribute_indices).contains_key("k8s.pod.name")));

    // Mixed: each sample carries its own (or none).
    let mut b = Builder::new(w, "h", 99);
    b.add(&sample(T0, 1, &frames, pod));
    b.add(&sample(T0 + 1, 2, &frames, r#"{"unit":"cron.service","extra":"ignored"}"#));
    b.add(&sample(T0 + 2, 3, &frames, ""));
    b.add(&sample(T0 + 3, 4, &frames, "not json"));
    let r = roundtrip(b);
    let d = r.dictionary.as_ref().unwrap();
    let resource = &r.resource_profiles[0].resource.as_ref().unwrap().attributes;
    assert_eq!(resource.len(), 1, "only host.name: {resource:?}");
    let samples = &r.resource_profiles[0].scope_profiles[0].profiles[0].samples;
    let a: Vec<HashMap<String, String>> = samples.iter().map(|s| attrs(d, &s.attribute_indices)).collect();
    assert_eq!(a[0]["k8s.pod.name"], "web-1");
    assert_eq!(a[1]["systemd.unit"], "cron.service");
    assert_eq!((a[1].len(), a[2].len(), a[3].len()), (6, 5, 5), "{a:?}");
}

/// Structured output: names travel exactly, and only the frame type says "kernel".
#[test]
fn hostile_names_round_trip_and_cannot_fake_a_kernel_frame() {
    let frames = [("evil\n;x 12\x1b", false), ("x [kernel]", false), ("y_[k]", false), ("read_zero", true)];
    let w = Window::new(T0, T0 + NS_PER_SEC).unwrap();
    let mut b = Builder::new(w, "h", 99);
    b.add(&SampleRef { comm: "a\tb;c 5", ..sample(T0, 1, &frames, "") });
    let r = roundtrip(b);
    let d = r.dictionary.as_ref().unwrap();
    let s = &r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    let got: Vec<(String, String)> = stack_frames(d, s.stack_index).into_iter().map(|(n, k, _, _)| (n, k)).collect();
    let want = [("read_zero", "kernel"), ("y_[k]", "native"), ("x [kernel]", "native"), ("evil\n;x 12\x1b", "native")];
    assert_eq!(got, want.map(|(n, k)| (n.to_string(), k.to_string())));
    assert_eq!(attrs(d, &s.attribute_indices)["thread.name"], "a\tb;c 5");
}

/// Runs `summarize.py` (the official definitions) on `file`; `None` when python3 or the
/// package is missing (said loudly; under CI=true, a failure).
pub(crate) fn official_summary(file: &Path) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export/otlp/summarize.py");
    let skip = |why: String| {
        profiler_common::test_skip::skip(&format!("the official OTLP decoder check: {why}"));
        None
    };
    let out = match Command::new("python3").arg(&script).arg(file).output() {
        Ok(out) => out,
        Err(e) => return skip(format!("python3 cannot run ({e})")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named") {
        return skip(format!(
            "{} (`cargo xtask test` installs it: pip install opentelemetry-proto==1.45.*)",
            stderr.trim()
        ));
    }
    assert!(out.status.success(), "the official definitions refuse the request: {stderr}");
    Some(serde_json::from_slice(&out.stdout).expect("summary JSON"))
}

/// A store of two minutes, recorded at 99 Hz then (after a "restart") at 199 Hz: 3 threads,
/// 3 stacks (one Python, one with kernel frames), names the folded format must escape, and
/// workloads on some samples.
fn write_store(dir: &Path) -> Vec<Stored> {
    let stack = |user: &[&str], kernel: &[&str]| {
        let frames = user.iter().chain(kernel).map(|f| Arc::from(*f)).collect();
        Arc::new(StoredStack::new(frames, user.len()))
    };
    let stacks = [
        stack(&["main", "spin"], &[]),
        stack(&["main", "read;all 12"], &["ksys_read", "vfs_read"]),
        stack(&["python3", "handler (/srv/app.py:40)", "work (/srv/app.py:7)"], &[]),
    ];
    let comms: [Arc<str>; 3] = ["app".into(), "db x_[k]".into(), "py".into()];
    let workloads: [Arc<str>; 3] =
        ["".into(), r#"{"pod_name":"a","pod_namespace":"ns"}"#.into(), r#"{"unit":"b.service"}"#.into()];
    crate::store::create_and_lock(dir).unwrap();
    let samples: Vec<Stored> = (0..3000u64)
        .map(|i| {
            let x = i.wrapping_mul(2654435761) % 1000;
            Stored {
                ts_ns: T0 + i * 40_000_000 + x * 1000,
                cpu: (x % 2) as u32,
                pid: 100 + (x % 3) as u32,
                tid: 1000 + (x % 3) as u32,
                cgroup_id: 0,
                comm: comms[(x % 3) as usize].clone(),
                stack: stacks[(x % 3) as usize].clone(),
                workload: workloads[(i % 3) as usize].clone(),
            }
        })
        .collect();
    for (minute, hz) in [(0, 99), (1, 199)] {
        let identity = Identity { frequency_hz: hz, online_cpus: "0-1".into(), ..Default::default() };
        let mut w = StoreWriter::new(&segments_dir(dir)).with_identity(identity);
        let (from, to) = (T0 + minute * 60 * NS_PER_SEC, T0 + (minute + 1) * 60 * NS_PER_SEC);
        for (i, s) in samples.iter().filter(|s| (from..to).contains(&s.ts_ns)).enumerate() {
            w.push(s);
            if i % 300 == 0 {
                w.flush(s.ts_ns).unwrap(); // several blocks per second, as the daemon writes
            }
        }
        w.flush(to).unwrap();
    }
    samples
}

/// Folded lines (the store's `fold`) from the official decoder's stacks.
fn fold_summary(summary: &serde_json::Value) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for s in summary["stacks"].as_array().unwrap() {
        let mut line = folded_frame(s[0].as_str().unwrap(), true).into_owned();
        for f in s[1].as_array().unwrap() {
            let kernel = f[1].as_bool().unwrap();
            line.push(';');
            line.push_str(&folded_frame(f[0].as_str().unwrap(), !kernel));
            if kernel {
                line.push_str(KERNEL_SUFFIX);
            }
        }
        *out.entry(line).or_default() += s[2].as_u64().unwrap();
    }
    out
}

#[test]
fn the_official_definitions_read_what_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let stored = write_store(dir.path());
    let mut store = Store::open(dir.path()).unwrap();
    // Across the restart, cut inside seconds at both ends.
    let w = Window::new(T0 + 30 * NS_PER_SEC + 500_000_000, T0 + 100 * NS_PER_SEC + 250_000_000).unwrap();
    let mut b = Builder::new(w, "node-7", 99);
    let n = query::for_each_sample(&mut store, w, &Filter::default(), |s| b.add(s)).unwrap();
    let file = dir.path().join("req.otlp");
    b.write(std::fs::File::create(&file).unwrap()).unwrap();
    let Some(summary) = official_summary(&file) else { return };

    let want: Vec<&Stored> = stored.iter().filter(|s| w.contains(s.ts_ns)).collect();
    assert_eq!(n, want.len() as u64);
    assert_eq!(summary["samples"].as_u64(), Some(n));
    // Stacks: what the store folds, exactly (with Python lines: OTLP keeps them).
    let folded = query::fold(&mut store, w, &Filter { lines: true, ..Filter::default() }).unwrap();
    let stacks: HashMap<String, u64> = folded.stacks.into_iter().collect();
    assert_eq!(fold_summary(&summary), stacks);
    // Every sample once, with its own time, thread, process and CPU.
    let mut got: Vec<(u64, u64, u64, u64, u64)> = summary["observations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let o: Vec<u64> = o.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            (o[0], o[1], o[2], o[3], o[4])
        })
        .collect();
    got.sort_unstable();
    let mut expected: Vec<_> =
        want.iter().map(|s| (s.ts_ns, u64::from(s.tid), u64::from(s.pid), u64::from(s.cpu), 1)).collect();
    expected.sort_unstable();
    assert_eq!(got, expected);
    // One profile per frequency, each with its period.
    let mut periods: Vec<i64> =
        summary["profiles"].as_array().unwrap().iter().map(|p| p["period"].as_i64().unwrap()).collect();
    periods.sort_unstable();
    assert_eq!(periods, [1_000_000_000 / 199, 1_000_000_000 / 99]);
    let p = &summary["profiles"][0];
    assert_eq!(p["sample_type"], serde_json::json!(["samples", "count"]));
    assert_eq!(p["period_type"], serde_json::json!(["cpu", "nanoseconds"]));
    assert_eq!(
        (p["time_unix_nano"].as_u64(), p["duration_nano"].as_u64()),
        (Some(w.from_ns), Some(w.to_ns - w.from_ns))
    );
    assert_eq!(summary["resource"]["host.name"], "node-7");
    assert_eq!(summary["frame_types"], serde_json::json!(["cpython", "kernel", "native"]));
    // Workloads, per sample (they differ).
    let workloads = summary["workloads"].as_object().unwrap();
    let count = |k: &str| workloads.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let pods = want.iter().filter(|s| s.workload.contains("pod_name")).count() as u64;
    let units = want.iter().filter(|s| s.workload.contains("unit")).count() as u64;
    assert_eq!(count(r#"{"k8s.namespace.name": "ns", "k8s.pod.name": "a"}"#), pods, "{workloads:?}");
    assert_eq!(count(r#"{"systemd.unit": "b.service"}"#), units, "{workloads:?}");
    assert_eq!(count("{}"), n - pods - units);
}

/// One Python function sampled on two lines is one Function (its first line unknown: 0), with a
/// location per line; a user frame's location has its file's mapping and its function's address.
#[test]
fn a_python_function_is_one_function_and_user_frames_have_mappings_and_addresses() {
    let w = Window::new(T0, T0 + 10 * NS_PER_SEC).unwrap();
    let mut b = Builder::new(w, "node-1", 99);
    let on =
        |line: u32| [("_start", false), (if line == 4 { "work (/srv/a.py:4)" } else { "work (/srv/a.py:5)" }, false)];
    let places = [("/usr/bin/python3.12", 0x4a_1000u64), ("", 0)];
    let (four, five) = (on(4), on(5));
    b.add(&SampleRef { locations: &places, ..sample(T0, 43, &four, "") });
    b.add(&SampleRef { locations: &places, ..sample(T0 + 1, 43, &five, "") });
    let r = roundtrip(b);
    let d = r.dictionary.as_ref().unwrap();
    let s = |i: i32| d.string_table[i as usize].as_str();
    let works: Vec<&Function> = d.function_table.iter().filter(|f| s(f.name_strindex) == "work").collect();
    assert_eq!(works.len(), 1, "{:?}", d.function_table);
    assert_eq!((s(works[0].filename_strindex), works[0].start_line), ("/srv/a.py", 0));
    let lines: Vec<i64> = d
        .location_table
        .iter()
        .filter(|l| {
            l.lines.first().is_some_and(|x| s(d.function_table[x.function_index as usize].name_strindex) == "work")
        })
        .map(|l| l.lines[0].line)
        .collect();
    assert_eq!(lines, vec![4, 5]);
    let start = d
        .location_table
        .iter()
        .find(|l| {
            l.lines.first().is_some_and(|x| s(d.function_table[x.function_index as usize].name_strindex) == "_start")
        })
        .expect("_start's location");
    assert_eq!(start.address, 0x4a_1000);
    assert_eq!(s(d.mapping_table[start.mapping_index as usize].filename_strindex), "/usr/bin/python3.12");
    assert_eq!(d.mapping_table.len(), 2, "the zero mapping and python3.12's: {:?}", d.mapping_table);
}

/// Issue 41, part 1: a launch's kernel is an attribute of its sample (`kernel`), beside the
/// stack's `[gpu] NAME` leaf; other kinds and launches of no named kernel have none.
#[test]
fn a_launchs_kernel_is_an_attribute() {
    let w = Window::new(T0, T0 + 10 * NS_PER_SEC).unwrap();
    let named = [("main", false), ("train_step (/srv/train.py:93)", false), ("[gpu] ampere_sgemm_128x64_tn", false)];
    let plain = [("main", false), ("cuLaunchKernel", false)];
    let kernels = |kind: crate::model::SampleKind| {
        let mut b = Builder::new(w, "node-1", 99).with_kind(kind);
        b.add(&SampleRef { count: 5, ..sample(T0, 43, &named, "") });
        b.add(&SampleRef { count: 2, ..sample(T0, 43, &plain, "") });
        let r = roundtrip(b);
        let d = r.dictionary.as_ref().unwrap();
        let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
        let mut got: Vec<Option<String>> =
            p.samples.iter().map(|s| attrs(d, &s.attribute_indices).remove("kernel")).collect();
        got.sort();
        got
    };
    assert_eq!(kernels(crate::model::SampleKind::CudaLaunches), [None, Some("ampere_sgemm_128x64_tn".into())]);
    assert_eq!(kernels(crate::model::SampleKind::CudaSync), [None, None]);
}
