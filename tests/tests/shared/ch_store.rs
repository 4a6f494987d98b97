//! A node's store of synthetic samples, and a shipper run over it: what the ClickHouse tests
//! share. Each test file uses some of them.
#![allow(dead_code)]

use std::path::Path;

use integration_tests::now_secs;
use profiler::ship::Stats;

const SEC: u64 = 1_000_000_000;

/// A store written directly (no BPF, no root): `cpus` CPUs at 50 Hz for `secs` that ended 30 s
/// ago.
pub fn synthetic_store(data: &Path, cpus: u32, secs: u64) -> (u64, u64) {
    synthetic_store_ending(data, cpus, secs, (now_secs() as u64 - 30) * SEC)
}

pub fn synthetic_store_ending(data: &Path, cpus: u32, secs: u64, end: u64) -> (u64, u64) {
    synthetic_store_with(data, cpus, secs, end, 50, 20)
}

/// `cpus` CPUs sampled at `hz` for `secs` up to `end`, `stacks` distinct stacks in turn.
pub fn synthetic_store_with(data: &Path, cpus: u32, secs: u64, end: u64, hz: u64, stacks: usize) -> (u64, u64) {
    use std::sync::Arc;

    use profiler::{
        model::{Sample, Stack},
        store::{StoreWriter, create_and_lock, segments_dir},
    };
    let _lock = create_and_lock(data).unwrap();
    let start = end - secs * SEC;
    let n_stacks = stacks as u64;
    let stacks: Vec<Arc<Stack>> = (0..stacks)
        .map(|i| {
            let frames = ["main".to_string(), format!("work_{i}"), "do_syscall_64".into()];
            Arc::new(Stack::new(frames.iter().map(|f| Arc::from(f.as_str())).collect(), 2))
        })
        .collect();
    let mut w = StoreWriter::new(&segments_dir(data));
    let mut ts = start;
    let mut i = 0u64;
    while ts < end {
        for cpu in 0..cpus {
            w.push(&Sample {
                ts_ns: ts + u64::from(cpu) * 1000,
                cpu,
                pid: 100 + cpu,
                tid: 100 + cpu,
                cgroup_id: 0,
                comm: Arc::from(["app", "db", "web"][cpu as usize % 3]),
                stack: stacks[(i % n_stacks) as usize].clone(),
                workload: Arc::from(""),
            });
            i += 1;
        }
        let next = ts + SEC / hz;
        if next / SEC != ts / SEC {
            w.flush(ts).unwrap();
        }
        ts = next;
    }
    w.flush(end).unwrap();
    (start, end)
}

/// Runs a shipper of node `node` with the `[clickhouse]` table `file` while `wait` waits.
pub fn ship_with(
    url: &str,
    node: &str,
    data: &Path,
    file: &profiler::ship::clickhouse::FileConfig,
    max_age_secs: u64,
    wait: impl FnOnce(),
) -> Stats {
    use profiler::ship::{
        SharedStats,
        clickhouse::{Config, Shipper},
    };
    let config =
        Config::resolve(Some(url.to_string()), Some(file), node, data.to_path_buf(), max_age_secs).unwrap().unwrap();
    let stats = SharedStats::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let thread = profiler::ship::spawn(Shipper { config, stats: stats.clone(), stop: stop_rx }).unwrap();
    wait();
    let _ = stop.send(true);
    thread.join().unwrap();
    stats.lock().unwrap().clone()
}
