use std::{collections::BTreeMap, sync::Arc};

use super::*;
use crate::{
    model::{Sample, Stack},
    store::{
        StoreWriter,
        format::NS_PER_SEC,
        reader::{BlockView, Need},
        segments_dir,
        writer::WriterLimits,
    },
};

const T0: u64 = 1_795_000_000 * NS_PER_SEC; // on a minute boundary

fn stack(user: &[&str], kernel: &[&str]) -> Arc<Stack> {
    let frames = user.iter().chain(kernel).map(|f| Arc::from(*f)).collect();
    Arc::new(Stack::new(frames, user.len()))
}

/// A deterministic mix: 3 CPUs, 4 processes, 3 stacks, spread over 130 s (3 segments).
fn samples() -> Vec<Sample> {
    let stacks = [
        stack(&["main", "spin"], &[]),
        stack(&["main", "read"], &["ksys_read", "vfs_read"]),
        stack(&[], &["kthread", "worker"]),
    ];
    let comms: [Arc<str>; 4] = ["app".into(), "db".into(), "kworker/0:1".into(), "semi;colon".into()];
    let pod = crate::identity::Identity {
        pod_namespace: Some("ml".into()),
        pod_name: Some("trainer-0".into()),
        container_name: Some("main".into()),
        ..Default::default()
    };
    let unit = crate::identity::Identity { unit: Some("kubelet.service".into()), ..Default::default() };
    let encode = crate::identity::workloads::encode;
    let workloads: [Arc<str>; 3] = ["".into(), encode(&pod).into(), encode(&unit).into()];
    (0..5000u64)
        .map(|i| {
            let x = i.wrapping_mul(2654435761) % 1000;
            Sample {
                ts_ns: T0 + i * 26_000_000 + x * 1000,
                cpu: (x % 3) as u32,
                pid: 100 + (x % 4) as u32,
                tid: 1000 + (x % 7) as u32,
                cgroup_id: x % 5,
                comm: comms[(x % 4) as usize].clone(),
                stack: stacks[(x % 3) as usize].clone(),
                // Whole seconds without any: their blocks have no workload column.
                workload: if i % 200 < 50 { workloads[0].clone() } else { workloads[(x % 3) as usize].clone() },
            }
        })
        .collect()
}

fn write_store(samples: &[Sample], idle: &[(u64, u32)]) -> (tempfile::TempDir, Store) {
    write_store_with(samples, idle, WriterLimits::default())
}

fn write_store_with(samples: &[Sample], idle: &[(u64, u32)], limits: WriterLimits) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    crate::store::create_and_lock(dir.path()).unwrap();
    let mut w = StoreWriter::with_limits(&segments_dir(dir.path()), limits);
    for (i, s) in samples.iter().enumerate() {
        w.push(s);
        if i % 700 == 0 {
            w.flush(s.ts_ns).unwrap(); // several blocks per second, as the daemon writes them
        }
    }
    for &(ts, cpu) in idle {
        w.push_idle(ts, cpu);
    }
    w.add_lost(2, 5);
    w.flush(T0).unwrap();
    let store = Store::open(dir.path()).unwrap();
    (dir, store)
}

/// What `fold` should return, computed the obvious way.
pub(super) fn naive(samples: &[Sample], w: Window, f: &Filter) -> rustc_hash::FxHashMap<String, u64> {
    let mut out = rustc_hash::FxHashMap::default();
    for s in samples.iter().filter(|s| {
        w.contains(s.ts_ns)
            && (f.cpus.is_empty() || f.cpus.contains(&s.cpu))
            && f.pid.is_none_or(|p| p == s.pid)
            && f.comm.as_deref().is_none_or(|c| c == &*s.comm)
            && (f.workload.is_empty()
                || crate::identity::workloads::decode(&s.workload).is_some_and(|w| w.matches(&f.workload)))
            && f.function.as_deref().is_none_or(|name| s.stack.frames.iter().any(|fr| &**fr == name))
    }) {
        let mut line = s.comm.replace(';', ":");
        for (i, fr) in s.stack.frames.iter().enumerate() {
            line.push(';');
            line.push_str(&fr.replace(';', ":"));
            if i >= s.stack.user_len {
                line.push_str("_[k]");
            }
        }
        *out.entry(line).or_default() += 1;
    }
    out
}

/// What `Folded::pods` should be: per process, its samples per pod.
fn naive_pods(samples: &[Sample], w: Window, f: &Filter) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for s in samples {
        let Some(pod) = crate::identity::workloads::decode(&s.workload).and_then(|i| i.pod()) else { continue };
        let one = [s.clone()];
        if !naive(&one, w, f).is_empty() {
            *out.entry(s.comm.replace(';', ":")).or_default().entry(pod).or_default() += 1;
        }
    }
    out
}

#[test]
fn store_round_trip_keeps_every_field() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[]);
    let mut got = Vec::new();
    store
        .scan(0, u64::MAX, Need::Samples, &mut |v: BlockView<'_>| {
            let (b, h, d) = (v.samples.unwrap(), v.header, v.dict);
            for (i, ts) in b.timestamps(h.start_ns).enumerate() {
                assert!((h.start_ns..h.end_ns).contains(&ts));
                let mut nodes = Vec::new();
                d.frames(b.stack[i], &mut nodes);
                let user_len = nodes.iter().filter(|(_, k)| !k).count();
                let frames = nodes.iter().map(|&(f, _)| Arc::from(d.strings[f as usize].as_str())).collect();
                got.push(Sample {
                    ts_ns: ts,
                    cpu: b.cpu[i],
                    pid: b.pid[i],
                    tid: b.tid[i],
                    cgroup_id: b.cgroup[i],
                    comm: Arc::from(d.strings[b.comm[i] as usize].as_str()),
                    stack: Arc::new(Stack::new(frames, user_len)),
                    workload: b
                        .workload(i)
                        .map_or_else(Default::default, |w| Arc::from(d.strings[w as usize].as_str())),
                });
            }
        })
        .unwrap();
    got.sort_by_key(|s| (s.ts_ns, s.tid));
    let mut want = input.clone();
    want.sort_by_key(|s| (s.ts_ns, s.tid));
    assert_eq!(got, want);
    assert!(store.take_warnings().is_empty());
    assert_eq!(store.segments().unwrap().len(), 3);
}

#[test]
fn fold_equals_naive_count_for_windows_and_filters() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[]);
    let windows = [(0, 130), (5, 6), (59, 61), (17, 95), (0, 1)];
    let filters = [
        Filter::default(),
        Filter { cpus: vec![1], ..Default::default() },
        Filter { cpus: vec![0, 2], pid: Some(101), ..Default::default() },
        Filter { comm: Some("db".into()), ..Default::default() },
        Filter { comm: Some("semi;colon".into()), ..Default::default() },
        Filter {
            workload: crate::identity::Filter { pod: Some("ml/trainer-0".into()), ..Default::default() },
            ..Default::default()
        },
        Filter {
            cpus: vec![1],
            workload: crate::identity::Filter { unit: Some("kubelet".into()), ..Default::default() },
            ..Default::default()
        },
        Filter {
            workload: crate::identity::Filter { namespace: Some("none".into()), ..Default::default() },
            ..Default::default()
        },
    ];
    for (a, b) in windows {
        let w = Window::new(T0 + a * NS_PER_SEC + 123, T0 + b * NS_PER_SEC + 456).unwrap();
        for f in &filters {
            let want = naive(&input, w, f);
            match fold(&mut store, w, f) {
                Ok(got) => {
                    assert_eq!(got.stacks, want, "window {a}..{b}, {f:?}");
                    assert_eq!(got.pods, naive_pods(&input, w, f), "window {a}..{b}, {f:?}");
                }
                Err(e) => assert!(want.is_empty(), "window {a}..{b}, {f:?}: {e}"),
            }
        }
    }
}

#[test]
fn subsecond_grid_from_summaries_equals_the_one_from_samples() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[]);
    let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
    let fast = subsecond_grid(&mut store, w, 50, &Filter::default()).unwrap();
    // Forcing the sample path with a filter that keeps everything.
    let all_cpus = Filter { cpus: vec![0, 1, 2], ..Default::default() };
    let slow = subsecond_grid(&mut store, w, 50, &all_cpus).unwrap();
    assert_eq!(fast, slow);
    // Edges inside a 10 ms bucket: summaries for the inside, samples for the slivers.
    let odd = Window::new(T0 + 7 * NS_PER_SEC + 303_456_789, T0 + 99 * NS_PER_SEC + 5_000_001).unwrap();
    assert_eq!(
        subsecond_grid(&mut store, odd, 50, &Filter::default()).unwrap(),
        subsecond_grid(&mut store, odd, 50, &all_cpus).unwrap()
    );
    let tiny = Window::new(T0 + 7 * NS_PER_SEC + 1, T0 + 7 * NS_PER_SEC + 2_000_000).unwrap();
    assert_eq!(
        subsecond_grid(&mut store, tiny, 50, &Filter::default()).unwrap(),
        subsecond_grid(&mut store, tiny, 50, &all_cpus).unwrap()
    );
    let mut naive = vec![vec![0u64; 50]; 130];
    for s in &input {
        let off = s.ts_ns - T0;
        naive[(off / NS_PER_SEC) as usize][((off % NS_PER_SEC) / 20_000_000) as usize] += 1;
    }
    let got: Vec<Vec<u64>> =
        (0..fast.columns).map(|c| fast.column(c).iter().map(|&v| u64::from(v)).collect()).collect();
    assert_eq!(got, naive);
    assert_eq!(fast.first_second, T0 / NS_PER_SEC);
}

#[test]
fn seconds_the_daemon_did_not_record_are_gaps_and_an_idle_second_is_not() {
    // Samples every 26 ms but none in seconds 20-24 (the daemon was down); second 30 holds only
    // idle ticks (an idle machine): recorded, not a gap.
    let input: Vec<Sample> = samples()
        .into_iter()
        .filter(|s| !(20..25).contains(&((s.ts_ns - T0) / NS_PER_SEC)) && (s.ts_ns - T0) / NS_PER_SEC != 30)
        .collect();
    let (_dir, mut store) = write_store(&input, &[(T0 + 30 * NS_PER_SEC + 5, 0)]);
    let w = Window::new(T0 + 10 * NS_PER_SEC, T0 + 40 * NS_PER_SEC).unwrap();
    for filter in [Filter::default(), Filter { cpus: vec![1], ..Default::default() }] {
        let grid = subsecond_grid(&mut store, w, 50, &filter).unwrap();
        assert_eq!(grid.gaps().collect::<Vec<_>>(), (10..15).collect::<Vec<_>>(), "{filter:?}");
        let mut text = Vec::new();
        crate::export::heatmap::write_json_with(&grid, true, &mut text).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(json["gaps"], serde_json::json!([10, 11, 12, 13, 14]));
        assert!(grid.column(20).iter().all(|&n| n == 0), "the idle second has no busy sample");
    }
    // Coarsened: a column is a gap only when none of its seconds was recorded.
    let long = Window::new(T0 - 1000 * NS_PER_SEC, T0 + 130 * NS_PER_SEC).unwrap();
    let grid = subsecond_grid(&mut store, long, 1000, &Filter::default()).unwrap();
    assert!(grid.coarsened());
    let (k, t0) = (grid.seconds_per_column, T0 / NS_PER_SEC);
    let recorded = |s: u64| (t0..t0 + 130).contains(&s) && !(t0 + 20..t0 + 25).contains(&s);
    let expect: Vec<usize> =
        (0..grid.columns).filter(|&c| (0..k).all(|i| !recorded(grid.first_second + c as u64 * k + i))).collect();
    assert_eq!(grid.gaps().collect::<Vec<_>>(), expect);
    assert!(expect.len() > 490, "the 1000 s before the data are gaps: {}", expect.len());
}

#[test]
fn heatmap_json_equals_a_naive_count_cell_for_cell() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[]);
    // A window that starts mid-second: the first column is the floor of its first second.
    let from = T0 + 7 * NS_PER_SEC + 300_000_000;
    let w = Window::new(from, T0 + 100 * NS_PER_SEC).unwrap();
    for filter in [Filter::default(), Filter { cpus: vec![2], ..Default::default() }] {
        let grid = subsecond_grid(&mut store, w, 50, &filter).unwrap();
        let mut text = Vec::new();
        crate::export::heatmap::write_json(&grid, &mut text).unwrap();
        let fs: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let rows: Vec<f64> = serde_json::from_value(fs["rows"].clone()).unwrap();
        let values: Vec<Vec<u64>> = serde_json::from_value(fs["values"].clone()).unwrap();
        assert_eq!(grid.first_second, from / NS_PER_SEC);
        let mut naive = vec![vec![0u64; 50]; fs["columns"].as_array().unwrap().len()];
        for s in
            input.iter().filter(|s| w.contains(s.ts_ns) && (filter.cpus.is_empty() || filter.cpus.contains(&s.cpu)))
        {
            let col = (s.ts_ns / NS_PER_SEC - grid.first_second) as usize;
            let row_ms = (s.ts_ns % NS_PER_SEC) / 20_000_000 * 20;
            // rows[i] is the row's offset in ms, listed from 980 down to 0.
            let i = rows.iter().position(|&r| r == row_ms as f64).unwrap();
            naive[col][i] += 1;
        }
        assert_eq!(values, naive);
        assert_eq!(fs["maxvalue"], naive.iter().flatten().copied().max().unwrap());
    }
}

#[test]
fn perf_script_export_parses_back_to_the_folded_counts() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[]);
    let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
    let mut text = Vec::new();
    crate::export::perf_script::write_header(&mut text).unwrap();
    for_each_sample(&mut store, w, &Filter::default(), |s| {
        crate::export::perf_script::write_sample(s, &mut text).unwrap()
    })
    .unwrap();
    let parsed = crate::export::perf_script::parse(&String::from_utf8(text).unwrap());
    assert_eq!(parsed.len(), input.len());
    let mut got: rustc_hash::FxHashMap<String, u64> = Default::default();
    for p in &parsed {
        let mut line = p.comm.replace(';', ":");
        for (f, k) in &p.frames {
            line.push(';');
            line.push_str(&f.replace(';', ":"));
            if *k {
                line.push_str("_[k]");
            }
        }
        *got.entry(line).or_default() += 1;
    }
    assert_eq!(got, naive(&input, w, &Filter::default()));
    let mut times: Vec<u64> = parsed.iter().map(|p| p.ts_us).collect();
    let mut want: Vec<u64> = input.iter().map(|s| s.ts_ns / 1000).collect();
    times.sort_unstable();
    want.sort_unstable();
    assert_eq!(times, want);
}

#[test]
fn names_cannot_forge_folded_lines_and_huge_grids_are_refused() {
    let mut dict = Dict { strings: vec!["evil 999999\nfake".into(), "f;g".into()], ..Default::default() };
    dict.nodes.push(crate::store::format::Node { parent: 0, frame: 1, kernel: true });
    // Control characters are shown as escapes (`untrusted::visible`), not `?`.
    assert_eq!(fold_line(&dict, 0, 1), "evil 999999\\nfake;f:g_[k]");
    let mut dict = Dict { strings: vec!["x 12".into(), "x_[k]".into()], ..Default::default() };
    dict.nodes.push(crate::store::format::Node { parent: 0, frame: 1, kernel: false });
    assert_eq!(fold_line(&dict, 0, 1), "x_12;x_{k}", "a user frame cannot pass for a kernel one");
    // The same rules for stacks given by name (ClickHouse's `stacks`).
    assert_eq!(super::fold_names("x 12", [("x_[k]", false), ("f;g", true)]), "x_12;x_{k};f:g_[k]");
    let (_dir, mut store) = write_store(&samples()[..10], &[]);
    // 56 years of seconds: coarsened to the cell budget, not refused, not 20 GB.
    let w = Window::new(NS_PER_SEC, T0).unwrap();
    let g = subsecond_grid(&mut store, w, 50, &Filter::default()).unwrap();
    assert!(g.coarsened() && g.counts.len() as u64 <= budget::HEATMAP_CELLS, "{}", g.seconds_per_column);
    assert_eq!(g.columns as u64, (T0 / NS_PER_SEC - 1).div_ceil(g.seconds_per_column));
    let c = cpu_time(&mut store, w, 10_000_000, 4, 99).unwrap();
    assert_eq!(c.requested_bucket_ns, 10_000_000);
    assert!(c.bucket_ns.is_multiple_of(NS_PER_SEC) && (c.busy[0].len() * 4) as u64 <= budget::CPUTIME_CELLS);
    // Sample counts survive coarsening: the same total in 10 s columns as in 1 s ones.
    let w = Window::new(T0, T0 + 130 * NS_PER_SEC).unwrap();
    let fine = subsecond_grid(&mut store, w, 50, &Filter { cpus: vec![0, 1, 2], ..Default::default() }).unwrap();
    let sum = |g: &Grid| g.counts.iter().map(|&v| u64::from(v)).sum::<u64>();
    assert_eq!(sum(&fine), 10);
}

#[test]
fn a_fold_over_its_stack_budget_folds_the_rarest_leaves_into_their_parent() {
    let mut f = Folded::default();
    for i in 0..100u64 {
        f.stacks.insert(format!("app;f{i:03}"), i + 1);
    }
    let total = f.total();
    f.fold_rarest(11, usize::MAX);
    assert_eq!(f.stacks.len(), 11);
    assert_eq!(f.truncated_stacks, 90);
    assert_eq!(f.total(), total, "no sample is lost, only folded");
    assert!(f.stacks.contains_key("app;f099") && !f.stacks.contains_key("app;f089"));
    assert!(!f.stacks.contains_key(budget::TRUNCATED), "nothing at the root");
    // A byte budget folds too; folding again keeps what was folded before.
    f.fold_rarest(1000, 4 * "app;f099".len());
    assert_eq!(f.total(), total);
    f.name_folded();
    let more: Vec<(&String, &u64)> = f.stacks.iter().filter(|(l, _)| l.contains("more]")).collect();
    assert_eq!(more.len(), 1, "{:?}", f.stacks);
    assert!(more[0].0.starts_with("app;[… ") && more[0].0.ends_with(" more]"), "{more:?}");
    assert!(f.stacks.keys().all(|l| l.starts_with("app;")), "every sample under its process: {:?}", f.stacks);
}

/// Deep stacks of a few processes, far over the budget: the rarest fold a level at a time, so
/// each keeps its process and its upper frames; the `[… N more]` leaves add up to the stacks
/// folded, and the totals per process are exact.
#[test]
fn rare_deep_stacks_keep_their_process_and_upper_frames() {
    let mut f = Folded::default();
    let mut per_process: BTreeMap<String, u64> = BTreeMap::new();
    for p in 0..3u64 {
        for a in 0..20u64 {
            for b in 0..50u64 {
                let n = 1 + (a * 50 + b) % 7 + if b == 0 { 500 } else { 0 };
                f.stacks.insert(format!("proc{p};main;handler{a};leaf{b};inner"), n);
                *per_process.entry(format!("proc{p}")).or_default() += n;
            }
        }
    }
    let (distinct, total) = (f.stacks.len() as u64, f.total());
    f.fold_rarest(200, usize::MAX);
    f.name_folded();
    assert!(f.stacks.len() <= 200, "{}", f.stacks.len());
    assert_eq!(f.total(), total);
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for (line, n) in &f.stacks {
        *got.entry(line.split(';').next().unwrap().to_string()).or_default() += n;
    }
    assert_eq!(got, per_process, "totals per process exact, nothing at the root");
    // The frequent stacks stay whole; the folded ones sit under their handler or main.
    assert!(f.stacks.contains_key("proc0;main;handler0;leaf0;inner"));
    let held: u64 =
        f.stacks.keys().filter_map(|l| l.rsplit_once(";[… ")?.1.strip_suffix(" more]")?.parse::<u64>().ok()).sum();
    let whole = f.stacks.keys().filter(|l| !l.contains("more]")).count() as u64;
    assert_eq!(held + whole, distinct, "every distinct stack is whole or counted in one [… N more]");
    assert!(f.stacks.keys().all(|l| l.matches(';').count() >= 1 && l.split(';').nth(1) == Some("main")));
}

/// More processes than the budget holds lines: those that do not fit merge at the root, said.
#[test]
fn processes_beyond_the_budget_merge_at_the_root() {
    let mut f = Folded::default();
    for p in 0..50u64 {
        f.stacks.insert(format!("proc{p:02};main"), p + 1);
    }
    let total = f.total();
    f.fold_rarest(10, usize::MAX);
    assert_eq!(f.total(), total);
    assert!(f.stacks.len() <= 10, "{:?}", f.stacks);
    assert!(f.stacks.contains_key(budget::TRUNCATED));
}

/// A CPU busy all along, recorded at 99 Hz and then, after a restart, at 999 Hz (in the same
/// minute and in the next): each part reads 100 % busy by its own frequency, also after
/// rollup, and pprof weighs each sample by its own period.
#[test]
fn a_restart_at_another_frequency_reads_each_part_by_its_own() {
    use crate::store::identity::Identity;
    let dir = tempfile::tempdir().unwrap();
    crate::store::create_and_lock(dir.path()).unwrap();
    let busy = |hz: u64, from_s: u64, to_s: u64| -> Vec<Sample> {
        let period = NS_PER_SEC / hz;
        (from_s * hz..to_s * hz)
            .map(|i| Sample {
                ts_ns: T0 + i * period,
                cpu: 1,
                pid: 7,
                tid: 7,
                cgroup_id: 0,
                comm: Arc::from("spin"),
                stack: stack(&["main", "spin"], &[]),
                workload: Default::default(),
            })
            .collect()
    };
    let id = |hz| Identity { frequency_hz: hz, online_cpus: "0-1".into(), boot_id: "b".into(), host: "h".into() };
    // 0-30 s at 99 Hz; the daemon restarts at 999 Hz for 30-90 s (30-60 s is the same minute).
    for (hz, from, to) in [(99, 0, 30), (999, 30, 90)] {
        let mut w = StoreWriter::new(&segments_dir(dir.path())).with_identity(id(hz));
        for s in busy(hz, from, to) {
            w.push(&s);
        }
        w.flush(T0).unwrap();
    }
    let mut store = Store::open(dir.path()).unwrap();
    let check = |store: &mut Store, bucket: u64| {
        let w = Window::new(T0, T0 + 90 * NS_PER_SEC).unwrap();
        // The fallback frequency (meta.json's, the last daemon's) must not matter.
        let ct = cpu_time(store, w, bucket, 2, 999).unwrap();
        // Per second, or on average over each part (a 100 ms bucket at 99 Hz holds 9 or 10).
        let per_part = (NS_PER_SEC / bucket).max(1) as usize * 30;
        for (part, shares) in ct.busy[1].chunks(per_part).enumerate() {
            let mean = shares.iter().sum::<f64>() / shares.len() as f64;
            assert!((mean - 1.0).abs() < 0.02, "part {part} in {bucket} ns buckets reads {mean}");
            if bucket >= NS_PER_SEC {
                assert!(shares.iter().all(|s| (s - 1.0).abs() < 0.02), "{shares:?}");
            }
        }
    };
    check(&mut store, NS_PER_SEC);
    check(&mut store, 100_000_000);
    let mut pprof = crate::export::pprof::Builder::new(999);
    let w = Window::new(T0, T0 + 90 * NS_PER_SEC).unwrap();
    for_each_sample(&mut store, w, &Filter::default(), |s| pprof.add(s)).unwrap();
    let cpu_ns: i64 = pprof.profile.sample.iter().map(|s| s.value[1]).sum();
    // 90 s of one busy CPU, whichever the frequency: 30 s at 99 Hz + 60 s at 999 Hz.
    assert!((cpu_ns as f64 / 90e9 - 1.0).abs() < 0.01, "pprof says {cpu_ns} ns of CPU");
    for (_, path) in store.segments().unwrap() {
        crate::store::rollup::rollup_segment(&path).unwrap().expect("rolls up");
    }
    check(&mut store, 10 * NS_PER_SEC);
    assert!(store.take_warnings().is_empty());
}

#[test]
fn a_tiny_dictionary_cap_resets_often_and_loses_nothing() {
    let input = samples();
    let (_dir, mut store) = write_store_with(&input, &[], WriterLimits { dict_cap: 3, max_pending: 1 << 20 });
    let w = Window::new(T0, T0 + 200 * NS_PER_SEC).unwrap();
    let got = fold(&mut store, w, &Filter::default()).unwrap();
    assert_eq!(got.stacks, naive(&input, w, &Filter::default()));
    assert!(store.take_warnings().is_empty());
}

#[test]
fn rolled_up_segments_keep_flamegraphs_at_ten_second_resolution() {
    let input = samples();
    let (_dir, mut store) = write_store(&input, &[(T0 + 5, 0), (T0 + 15 * NS_PER_SEC, 1)]);
    let before = store.summary().unwrap();
    for (_, path) in store.segments().unwrap() {
        let r = crate::store::rollup::rollup_segment(&path).unwrap().expect("raw segment rolls up");
        assert!(r.rows < r.samples && r.bytes_after < r.bytes_before, "{r:?}");
        assert_eq!(crate::store::rollup::rollup_segment(&path).unwrap(), None, "rolled twice");
    }
    let after = store.summary().unwrap();
    assert_eq!(before.cpus, after.cpus);
    let filters = [
        Filter::default(),
        Filter { cpus: vec![2], ..Default::default() },
        Filter { pid: Some(103), comm: Some("semi;colon".into()), ..Default::default() },
    ];
    for (a, b) in [(0, 130), (10, 60), (60, 120)] {
        let w = Window::new(T0 + a * NS_PER_SEC, T0 + b * NS_PER_SEC).unwrap();
        for f in &filters {
            assert_eq!(fold(&mut store, w, f).unwrap().stacks, naive(&input, w, f), "{a}..{b} {f:?}");
        }
    }
    let idle = fold(
        &mut store,
        Window::new(T0, T0 + 20 * NS_PER_SEC).unwrap(),
        &Filter { include_idle: true, ..Default::default() },
    );
    assert_eq!(idle.unwrap().stacks[IDLE_FRAME], 2);
    assert!(store.take_warnings().is_empty());
}

#[test]
fn idle_counts_per_cpu_only_with_include_idle_and_whole_seconds() {
    let input = samples();
    // 10 idle samples on CPU 0 and 4 on CPU 1 in second 3; 7 on CPU 0 in second 4.
    let mut idle: Vec<(u64, u32)> = (0..10).map(|i| (T0 + 3 * NS_PER_SEC + i * 1_000_000, 0)).collect();
    idle.extend((0..4).map(|i| (T0 + 3 * NS_PER_SEC + i, 1)));
    idle.extend((0..7).map(|i| (T0 + 4 * NS_PER_SEC + i, 0)));
    let (_dir, mut store) = write_store(&input, &idle);
    let whole = Window::new(T0 + 3 * NS_PER_SEC, T0 + 5 * NS_PER_SEC).unwrap();
    let busy = fold(&mut store, whole, &Filter::default()).unwrap();
    assert!(!busy.stacks.contains_key(IDLE_FRAME));
    let with_idle = fold(&mut store, whole, &Filter { include_idle: true, ..Default::default() }).unwrap();
    assert_eq!(with_idle.stacks[IDLE_FRAME], 21);
    assert_eq!(with_idle.per_cpu[&0].1, 17);
    assert_eq!(with_idle.per_cpu[&1].1, 4);
    let cpu1 = fold(&mut store, whole, &Filter { include_idle: true, cpus: vec![1], ..Default::default() }).unwrap();
    assert_eq!(cpu1.stacks[IDLE_FRAME], 4);
    // Half of second 4 only: its idle count cannot be split, so it is left out.
    let half = Window::new(T0 + 3 * NS_PER_SEC, T0 + 4 * NS_PER_SEC + NS_PER_SEC / 2).unwrap();
    let h = fold(&mut store, half, &Filter { include_idle: true, ..Default::default() }).unwrap();
    assert_eq!(h.stacks[IDLE_FRAME], 14);
    // Idle samples belong to no process: a pid or comm filter drops them.
    let p = fold(&mut store, whole, &Filter { include_idle: true, pid: Some(100), ..Default::default() }).unwrap();
    assert!(!p.stacks.contains_key(IDLE_FRAME));
    // And the store's summary counts them, with the lost samples.
    let s = store.summary().unwrap();
    assert_eq!(s.cpus[&0].idle, 17);
    assert_eq!(s.cpus[&2].lost, 5);
    assert_eq!(s.cpus.values().map(|c| c.samples).sum::<u64>(), input.len() as u64);
}

#[test]
fn empty_windows_say_what_the_store_holds() {
    let (_dir, mut store) = write_store(&samples(), &[]);
    let before = Window::new(T0 - 100 * NS_PER_SEC, T0 - 50 * NS_PER_SEC).unwrap();
    let err = fold(&mut store, before, &Filter::default()).unwrap_err().to_string();
    assert!(err.contains("no samples between") && err.contains("it holds 2026-"), "{err}");
    let w = Window::new(T0, T0 + 10 * NS_PER_SEC).unwrap();
    let err = fold(&mut store, w, &Filter { pid: Some(4242), ..Default::default() }).unwrap_err().to_string();
    assert!(err.contains("no samples match --pid 4242"), "{err}");
    assert!(matches!(Window::new(5, 4), Err(QueryError::Reversed { .. })));
    assert!(matches!(Window::new(5, 5), Err(QueryError::Empty(_))));
}

#[test]
fn unknown_cpu_is_refused_when_the_machine_is_known() {
    let meta =
        Meta { format_version: 1, hostname: "h".into(), node: "h".into(), cpus: 2, frequency_hz: 99, started_ns: 0 };
    let f = Filter { cpus: vec![0, 7], ..Default::default() };
    let err = check_filter(&f, Some(&meta)).unwrap_err().to_string();
    assert_eq!(err, "CPU 7 does not exist on the profiled machine (it has CPUs 0-1)");
    assert!(check_filter(&f, None).is_ok());
}

#[test]
fn torn_tail_is_cut_and_later_blocks_stay_readable() {
    let input = samples();
    let (dir, mut store) = write_store(&input[..100], &[]);
    let (_, path) = store.segments().unwrap()[0].clone();
    // A daemon killed mid-write: half a block at the end.
    let len = std::fs::metadata(&path).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, b"PBLK\x20\x00\x00\x00half a block").unwrap();
    let torn = fold(&mut store, Window::new(T0, T0 + 60 * NS_PER_SEC).unwrap(), &Filter::default()).unwrap();
    assert_eq!(torn.total(), 100);
    assert!(store.take_warnings().is_empty(), "an incomplete tail is not a warning");
    // The next daemon cuts the tail before appending.
    let mut w = StoreWriter::new(&segments_dir(dir.path()));
    for s in &input[100..200] {
        w.push(s);
    }
    w.flush(T0).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > len);
    let all = fold(&mut store, Window::new(T0, T0 + 60 * NS_PER_SEC).unwrap(), &Filter::default()).unwrap();
    assert_eq!(all.total(), 200);
    assert!(store.take_warnings().is_empty());
}

#[test]
fn corrupt_bytes_are_skipped_with_a_warning_naming_the_file() {
    let (_dir, mut store) = write_store(&samples(), &[]);
    let (_, path) = store.segments().unwrap()[1].clone();
    let mut bytes = std::fs::read(&path).unwrap();
    // Inside the first block's first section (a flipped length field would look like a
    // write in progress instead).
    let inside = crate::store::format::SEGMENT_HEADER_LEN + crate::store::format::BLOCK_HEADER_LEN + 2;
    bytes[inside] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let w = Window::new(T0, T0 + 200 * NS_PER_SEC).unwrap();
    let got = fold(&mut store, w, &Filter::default()).unwrap();
    assert!(got.total() > 0 && got.total() < 5000);
    let warnings = store.take_warnings();
    assert!(warnings.iter().any(|w| w.contains("checksum mismatch")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains(path.to_str().unwrap())), "{warnings:?}");
    // A segment of another version is skipped, named.
    bytes[8] = 9;
    std::fs::write(&path, &bytes).unwrap();
    fold(&mut store, w, &Filter::default()).unwrap();
    let warnings = store.take_warnings();
    assert!(warnings.iter().any(|w| w.contains("version 9")), "{warnings:?}");
    // Zero-length and truncated-header files: skipped, named.
    std::fs::write(&path, b"").unwrap();
    fold(&mut store, w, &Filter::default()).unwrap();
    let warnings = store.take_warnings();
    assert!(warnings.iter().any(|w| w.contains(path.to_str().unwrap()) && w.contains("shorter")), "{warnings:?}");
}

/// Where each user frame lives is kept per stack node, through rollup; the same names in two
/// files stay two stacks; stacks without locations (older data) read back without.
#[test]
fn frame_locations_survive_the_store_and_rollup() {
    use crate::model::Location;
    let loc = |file: &str, addr| Location { file: Arc::from(file), addr };
    let located = |file: &str| {
        let mut s = Stack::new(vec![Arc::from("main"), Arc::from("spin"), Arc::from("ksys_read")], 2);
        s.locations = vec![loc(file, 0x1120), loc("/usr/lib/libc.so.6", 0x3fb90)];
        Arc::new(s)
    };
    let stacks = [located("/srv/a"), located("/srv/b"), stack(&["main", "spin"], &["ksys_read"])];
    let input: Vec<Sample> = (0..300u64)
        .map(|i| Sample {
            ts_ns: T0 + i * 100_000_000,
            cpu: 0,
            pid: 1,
            tid: 1,
            cgroup_id: 0,
            comm: Arc::from("app"),
            stack: stacks[(i % 3) as usize].clone(),
            workload: Arc::from(""),
        })
        .collect();
    let (_dir, mut store) = write_store(&input, &[]);
    let read = |store: &mut Store| {
        let mut seen: std::collections::BTreeMap<Vec<(String, u64)>, u64> = Default::default();
        let w = Window::new(T0, T0 + 60 * NS_PER_SEC).unwrap();
        for_each_sample(store, w, &Filter::default(), |s| {
            assert_eq!(s.frames.len(), 3);
            let l: Vec<(String, u64)> = s.locations.iter().map(|&(f, a)| (f.to_string(), a)).collect();
            *seen.entry(l).or_default() += s.count;
        })
        .unwrap();
        seen
    };
    let want =
        |file: &str| vec![(file.to_string(), 0x1120), ("/usr/lib/libc.so.6".to_string(), 0x3fb90), (String::new(), 0)];
    let before = read(&mut store);
    assert_eq!(before.get(&want("/srv/a")), Some(&100), "{before:?}");
    assert_eq!(before.get(&want("/srv/b")), Some(&100), "{before:?}");
    assert_eq!(before.values().sum::<u64>(), 300, "{before:?}");
    for (_, path) in store.segments().unwrap() {
        crate::store::rollup::rollup_segment(&path).unwrap().expect("rolls up");
    }
    assert_eq!(read(&mut store), before);
    assert!(store.take_warnings().is_empty());
}
