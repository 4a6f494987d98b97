//! `profiler fleet` (issue 13, "fleet questions a node cannot answer") against a private
//! ClickHouse 18.16: three synthetic nodes (no BPF, no root) shipped by the real shipper, and
//! the command's answer checked against what the stores were built from: busy shares, peak
//! CPU, saturated seconds, the top stack and on how many nodes it ran, the grid's shape and
//! cells, findings and events, and `--event` naming the node and the CPU (by kernel-mode
//! samples) behind a reset. Then its errors, and its SQL on current ClickHouse (chdb).
//!
//! `fleet_benchmark` (ignored; `cargo xtask bench fleet`) measures a 50-node fleet.

use std::{
    collections::BTreeMap,
    path::Path,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use integration_tests::{
    clickhouse::{ClickHouse, cursor_ns},
    now_secs, profiler, wait_for,
};
use profiler::{
    collect::kmsg::Event,
    detect::{self, Finding},
    model::{Sample, Stack},
    ship::{
        SharedStats, Stats,
        clickhouse::{Config, FileConfig, Shipper},
    },
    store::{Meta, StoreWriter, create_and_lock, format::FORMAT_VERSION, segments_dir},
};

#[path = "../../profiler-user/benches/shared/synth.rs"]
#[allow(dead_code)] // each user takes part of it
mod synth;

const SEC: u64 = 1_000_000_000;
const HZ: u64 = 50;
const SECS: u64 = 60;

fn stack(frames: &[&str], user_len: usize) -> Arc<Stack> {
    Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), user_len))
}

/// One CPU of a synthetic node: `busy` of every `HZ` ticks run `stack` as `comm`, the rest idle
/// (`ticks_idle`: false for a CPU whose idle takes no cpu-clock ticks, as on some VMs).
struct CpuPlan {
    busy: u64,
    ticks_idle: bool,
    comm: &'static str,
    stack: Arc<Stack>,
}

/// A node's store, as its daemon would have written it, ending at `end`; its `meta.json`
/// says 2 CPUs at `HZ`.
fn write_node(data: &Path, node: &str, end: u64, plan: &[CpuPlan; 2]) {
    let _lock = create_and_lock(data).unwrap();
    Meta {
        format_version: FORMAT_VERSION,
        hostname: node.into(),
        node: node.into(),
        cpus: 2,
        frequency_hz: HZ,
        started_ns: end - SECS * SEC,
    }
    .write(data)
    .unwrap();
    let mut w = StoreWriter::new(&segments_dir(data));
    for s in 0..SECS {
        let second = end - (SECS - s) * SEC;
        for tick in 0..HZ {
            for (cpu, p) in plan.iter().enumerate() {
                let ts_ns = second + tick * (SEC / HZ) + cpu as u64 * 1000;
                if tick < p.busy {
                    w.push(&Sample {
                        ts_ns,
                        cpu: cpu as u32,
                        pid: 100 + cpu as u32,
                        tid: 100 + cpu as u32,
                        cgroup_id: 0,
                        comm: Arc::from(p.comm),
                        stack: p.stack.clone(),
                        workload: Arc::from(""),
                    });
                } else if p.ticks_idle {
                    w.push_idle(ts_ns, cpu as u32);
                }
            }
        }
        w.flush(second + SEC).unwrap();
    }
}

/// Ships every store in `nodes` (name, data dir) with the real shipper, one thread each, until
/// every cursor passes `to`.
fn ship_all(ch: &ClickHouse, nodes: &[(String, std::path::PathBuf)], to: u64) -> Vec<Stats> {
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut threads = Vec::new();
    let mut stats = Vec::new();
    for (node, data) in nodes {
        let file = FileConfig { batch_rows: Some(100_000), ..Default::default() };
        let config = Config::resolve(Some(ch.url()), Some(&file), node, data.clone(), 86_400).unwrap().unwrap();
        let s = SharedStats::default();
        let shipper = Shipper { config, stats: s.clone(), stop: stop_rx.clone() };
        threads.push(profiler::ship::spawn(shipper).unwrap());
        stats.push(s);
    }
    wait_for("every node shipped", Duration::from_secs(600), || {
        nodes.iter().all(|(_, d)| cursor_ns(d).is_some_and(|c| c >= to)).then_some(())
    });
    let _ = stop.send(true);
    for t in threads {
        t.join().unwrap();
    }
    stats.into_iter().map(|s| s.lock().unwrap().clone()).collect()
}

/// `profiler fleet ...` as JSON.
fn fleet_json(args: &[&str]) -> serde_json::Value {
    let out = profiler(&[&["fleet", "--format", "json"], args].concat());
    assert!(out.status.success(), "profiler fleet {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `profiler fleet ...` that must fail: its one-line message.
fn fleet_error(args: &[&str]) -> String {
    let out = profiler(&[&["fleet"], args].concat());
    assert!(!out.status.success(), "profiler fleet {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The three nodes: (name, CPU 0, CPU 1).
fn plans() -> Vec<(&'static str, [CpuPlan; 2])> {
    let shared = stack(&["main", "serve", "handle"], 3);
    let kernel = stack(&["ret_from_fork", "kthread", "net_rx_action", "ena_io_poll"], 0);
    let user = |leaf: &str| stack(&["main", leaf], 2);
    vec![
        (
            "node-a",
            [
                CpuPlan { busy: 45, ticks_idle: true, comm: "web", stack: shared.clone() },
                CpuPlan { busy: 5, ticks_idle: true, comm: "cron", stack: user("tick") },
            ],
        ),
        (
            "node-b",
            [
                CpuPlan { busy: 25, ticks_idle: true, comm: "web", stack: shared.clone() },
                CpuPlan { busy: 10, ticks_idle: true, comm: "db", stack: user("query") },
            ],
        ),
        (
            "node-c",
            [
                // More samples than CPU 1, none in the kernel: `--event` must pick CPU 1.
                CpuPlan { busy: 30, ticks_idle: true, comm: "web", stack: shared },
                // Its idle takes no ticks: 20 busy ticks of 50 a second are 40 %, not 100 %, and no
                // second of it is saturated.
                CpuPlan { busy: 20, ticks_idle: false, comm: "ksoftirqd/1", stack: kernel },
            ],
        ),
    ]
}

#[test]
fn fleet_answers_what_the_stores_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let end = (now_secs() as u64 - 30) * SEC;
    let start = end - SECS * SEC;
    let event_ts = start + 40 * SEC + SEC / 2;
    let mut nodes = Vec::new();
    for (name, plan) in plans() {
        let data = tmp.path().join(name);
        write_node(&data, name, end, &plan);
        nodes.push((name.to_string(), data));
    }
    let event = |node: usize, ts_ns: u64, id: &str, message: &str| {
        let e = Event { id: id.into(), ts_ns, pattern: "x".into(), message: message.into() };
        detect::journal::record_event(&nodes[node].1, &e).unwrap();
    };
    event(2, event_ts, "ev-reset", "ena 0000:00:06.0: Device reset completed successfully");
    event(0, start + 10 * SEC, "ev-lockup", "watchdog: BUG: soft lockup - CPU#1 stuck for 22s!");
    // 2 s after the reset on its node: their lookbacks share 3 s.
    event(2, event_ts + 2 * SEC, "ev-watchdog", "NETDEV WATCHDOG: ens5 (ena): transmit queue 3 timed out");
    let finding = Finding {
        id: "f-1".into(),
        kind: detect::Kind::SaturatedCore,
        start_ns: start + 5 * SEC,
        end_ns: Some(start + 50 * SEC),
        cpu: Some(0),
        severity: detect::Severity::Warning,
        summary: "CPU 0 saturated".into(),
        evidence: serde_json::json!({}),
    };
    detect::journal::record_finding(&nodes[0].1, &finding).unwrap();
    let shipped = ship_all(&ch, &nodes, end);
    assert!(shipped.iter().all(|s| s.errors.is_empty()));
    // A node that shipped once, long ago.
    ch.query("INSERT INTO profiler.nodes VALUES ('node-gone', 4, 99, '0-3', 'old-host', 1)").unwrap();

    let (from, to) = (format!("{}", start / SEC), format!("{}", end / SEC));
    let j = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to]);
    eprintln!("{}", serde_json::to_string_pretty(&j["nodes"]).unwrap());
    let plans = plans();
    // What the stores were built from, node by node.
    let mut top_samples = 0;
    for (i, (name, plan)) in plans.iter().enumerate() {
        let n = &j["nodes"][i];
        assert_eq!(n["node"], *name);
        assert_eq!(n["cpus"], 2);
        assert_eq!(n["hz"], HZ);
        let busy = plan[0].busy + plan[1].busy;
        let want = busy as f64 / (2 * HZ) as f64;
        assert!(close(n["busy_share"].as_f64().unwrap(), want), "{name}: busy {} vs {want}", n["busy_share"]);
        let peak = plan[0].busy.max(plan[1].busy) as f64 / HZ as f64;
        assert!(close(n["peak_cpu_busy_share"].as_f64().unwrap(), peak), "{name}: peak {}", n["peak_cpu_busy_share"]);
        let saturated = if plan.iter().any(|p| p.busy * 10 >= HZ * 9) { SECS } else { 0 };
        assert_eq!(n["saturated_seconds"].as_f64(), Some(saturated as f64), "{name}");
        assert_eq!(n["seconds"].as_f64(), Some(SECS as f64), "{name}");
        assert_eq!(n["samples"].as_u64(), Some(busy * SECS), "{name}");
        assert_eq!(n["events"].as_u64(), Some([1, 0, 2][i]), "{name}");
        top_samples += plan[0].busy * SECS;
    }
    assert_eq!(j["nodes"][0]["findings"], 1);
    assert_eq!(j["nodes"][0]["finding_kinds"], serde_json::json!({"saturated-core": 1}));
    assert_eq!(j["nodes"][1]["findings"], 0);
    let top = &j["top_stacks"][0];
    assert_eq!(top["stack"], "web;main;serve;handle");
    assert_eq!(top["samples"].as_u64(), Some(top_samples));
    assert_eq!(top["nodes"], 3);
    assert_eq!(j["top_stacks"].as_array().unwrap().len(), 4, "web's stack, and one more per node");
    assert_eq!(j["samples"].as_u64(), Some(plans.iter().map(|(_, p)| (p[0].busy + p[1].busy) * SECS).sum()));
    assert_eq!(j["nodes"].as_array().unwrap().len(), 3, "node-gone is counted, not listed");
    assert_eq!(j["nodes_without_data"], 1);

    // The grid: one row per node, a column per second, every cell the node's share.
    let g = &j["grid"];
    assert_eq!((g["bucket_seconds"].as_u64(), g["columns"].as_u64()), (Some(1), Some(SECS)));
    assert_eq!(g["nodes"], serde_json::json!(["node-a", "node-b", "node-c"]));
    for (i, (name, plan)) in plans.iter().enumerate() {
        let row = g["values"][i].as_array().unwrap();
        assert_eq!(row.len() as u64, SECS);
        let want = (plan[0].busy + plan[1].busy) as f64 / (2 * HZ) as f64;
        assert!(row.iter().all(|v| close(v.as_f64().unwrap(), want)), "{name}: {row:?}");
    }
    // A longer window: coarser columns, empty ones null.
    let wide = fleet_json(&["--clickhouse", &url, "--from", &format!("{}", end / SEC - 3600), "--to", &to]);
    assert_eq!((wide["grid"]["bucket_seconds"].as_u64(), wide["grid"]["columns"].as_u64()), (Some(10), Some(360)));
    assert!(wide["grid"]["values"][0][0].is_null());

    // One node, the top list cut.
    let b = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--node", "node-b", "--top", "1"]);
    assert_eq!(b["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(b["top_stacks"].as_array().unwrap().len(), 1);
    assert_eq!(b["top_stacks"][0]["samples"].as_u64(), Some(25 * SECS));
    assert_eq!(b["top_stacks"][0]["nodes"], 1);

    // Named, a node without data is listed: no busy share, an empty grid row.
    let gone =
        fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--node", "node-gone", "--node", "node-a"]);
    assert_eq!(gone["grid"]["nodes"], serde_json::json!(["node-a", "node-gone"]));
    assert_eq!((gone["nodes"][1]["cpus"].as_u64(), gone["nodes"][1]["busy_share"].is_null()), (Some(4), true));
    assert!(gone["grid"]["values"][1].as_array().unwrap().iter().all(|v| v.is_null()));

    // "Which nodes had an ENA reset, and what ran on the NIC's CPU before it."
    let e = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--event", "ena.*reset"]);
    let ev = &e["events"];
    assert_eq!(ev["matched"], 1, "{ev}");
    let reset = &ev["events"][0];
    assert_eq!((reset["node"].as_str(), reset["ts_ns"].as_u64()), (Some("node-c"), Some(event_ts)));
    assert_eq!(reset["cpu"], 1, "the CPU with the most kernel-mode samples: {reset}");
    assert_eq!(reset["cpu_kernel_samples"].as_u64(), Some(5 * 20));
    assert_eq!(
        reset["stacks"][0]["stack"],
        "ksoftirqd/1;ret_from_fork_[k];kthread_[k];net_rx_action_[k];ena_io_poll_[k]"
    );
    assert_eq!(reset["stacks"][0]["samples"].as_u64(), Some(5 * 20));
    // Two events, explained at once: each keeps its own CPU and stacks.
    let two = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--event", "ena.*reset|soft lockup"]);
    let two = two["events"]["events"].as_array().unwrap().clone();
    assert_eq!(two.len(), 2, "{two:?}");
    assert_eq!((two[0]["node"].as_str(), two[0]["ts_ns"].as_u64()), (Some("node-a"), Some(start + 10 * SEC)));
    assert_eq!(two[1], *reset, "the reset explained alone and beside another event");
    // Two events of one node 2 s apart: the seconds both look back on count for each.
    let near = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--event", "ena.*reset|WATCHDOG"]);
    let near = near["events"]["events"].as_array().unwrap().clone();
    assert_eq!(near.len(), 2, "{near:?}");
    assert_eq!(near[0], *reset, "the reset explained beside an event whose lookback overlaps it");
    assert_eq!((near[1]["node"].as_str(), near[1]["cpu"].as_u64()), (Some("node-c"), Some(1)), "{near:?}");
    assert_eq!(near[1]["cpu_kernel_samples"].as_u64(), Some(5 * 20), "{near:?}");
    assert_eq!(near[1]["stacks"], reset["stacks"], "{near:?}");

    // Text: a table a human reads.
    let out = profiler(&["fleet", "--clickhouse", &url, "--from", &from, "--to", &to, "--event", "reset"]);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success());
    assert!(text.starts_with("3 nodes, "), "{text}");
    assert!(text.contains("node-a     2  50.0%     90.0%      1m 0s"), "{text}");
    assert!(text.contains("CPU 1: most kernel-mode samples in the 5 s before (100 of its 100)"), "{text}");

    // Errors: one sentence that says what to do.
    let e = fleet_error(&["--clickhouse", &url, "--node", "nope"]);
    assert!(e.contains("node 'nope' has shipped nothing") && e.contains("node-a, node-b, node-c, node-gone"), "{e}");
    let e = fleet_error(&["--clickhouse", &url, "--database", "empty"]);
    assert!(e.contains("holds no node in database `empty`"), "{e}");
    let e = fleet_error(&["--clickhouse", "https://h:8123"]);
    assert!(e.contains("is not http://"), "{e}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = fleet_error(&["--clickhouse", &format!("http://127.0.0.1:{closed}")]);
    assert!(e.contains(&format!("ClickHouse at 127.0.0.1:{closed} does not answer")), "{e}");
    let e = fleet_error(&["--clickhouse", &url, "--event", "ena("]);
    assert!(e.contains("--event 'ena(' is not a regular expression"), "{e}");
}

/// The nodes a stack ran on, over whole hours, come from `stack_nodes_1h` (found by the stack,
/// not by reading every node's minutes) and agree with the minutes' count: three nodes' minute
/// in the middle of an hour two hours ago, asked for that whole hour and for the same hour less
/// a minute and a second (minutes only: the edge is widened to its minute).
#[test]
fn fleet_counts_a_stacks_nodes_from_their_hours() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let hour = 3600 * SEC;
    let h = (now_secs() as u64 * SEC - 2 * hour) / hour * hour;
    let end = h + 31 * 60 * SEC;
    let nodes: Vec<(String, std::path::PathBuf)> = plans()
        .into_iter()
        .map(|(name, plan)| {
            let data = tmp.path().join(name);
            write_node(&data, name, end, &plan);
            (name.to_string(), data)
        })
        .collect();
    assert!(ship_all(&ch, &nodes, end).iter().all(|s| s.errors.is_empty()));
    let ask = |from: u64| {
        fleet_json(&[
            "--clickhouse",
            &ch.url(),
            "--from",
            &format!("{}", from / SEC),
            "--to",
            &format!("{}", (h + hour) / SEC),
        ])
    };
    let (whole, minutes) = (ask(h), ask(h + 61 * SEC));
    let read_from = whole["read_from"].as_str().unwrap();
    assert!(read_from.contains("their nodes stack_nodes_1h 1h 0m"), "{read_from}");
    assert!(!minutes["read_from"].as_str().unwrap().contains("stack_nodes_1h"), "{}", minutes["read_from"]);
    let nodes_of = |j: &serde_json::Value| -> Vec<(String, u64)> {
        j["top_stacks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["stack"].as_str().unwrap().into(), t["nodes"].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(nodes_of(&whole)[0], ("web;main;serve;handle".to_string(), 3));
    assert_eq!(nodes_of(&whole), nodes_of(&minutes), "the hours' count and the minutes' agree");
    assert!(nodes_of(&whole)[1..].iter().all(|(_, n)| *n == 1), "one more stack per node");
}

/// `--event` on a cluster of two 18.16 shards with Distributed tables, each node shipping to
/// its own shard: the CPU behind the reset is found through either shard (its query joins
/// `stacks` with a subquery of `samples`, both Distributed: it needs `GLOBAL`, which it once
/// lacked: "Double-distributed IN/JOIN subqueries is denied").
#[test]
fn fleet_event_on_two_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let layout = profiler::ship::clickhouse::schema::Layout {
        database: "profiler",
        cluster: Some("fleet"),
        ttl_secs: None,
        codecs: false,
    };
    for s in &shards {
        for statement in profiler::ship::clickhouse::schema::statements(&layout) {
            s.query(&statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }
    let end = (now_secs() as u64 - 30) * SEC;
    let start = end - SECS * SEC;
    let event_ts = start + 40 * SEC + SEC / 2;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut threads = Vec::new();
    let mut datas = Vec::new();
    for (i, (name, plan)) in plans().into_iter().enumerate() {
        let data = tmp.path().join(name);
        write_node(&data, name, end, &plan);
        if name == "node-c" {
            let e = Event {
                id: "ev-reset".into(),
                ts_ns: event_ts,
                pattern: "x".into(),
                message: "ena 0000:00:06.0: Device reset completed successfully".into(),
            };
            detect::journal::record_event(&data, &e).unwrap();
        }
        let file = FileConfig { batch_rows: Some(100_000), cluster: Some("fleet".into()), ..Default::default() };
        let url = shards[i % 2].url();
        let config = Config::resolve(Some(url), Some(&file), name, data.clone(), 86_400).unwrap().unwrap();
        let shipper = Shipper { config, stats: SharedStats::default(), stop: stop_rx.clone() };
        threads.push(profiler::ship::spawn(shipper).unwrap());
        datas.push(data);
    }
    wait_for("every node shipped", Duration::from_secs(600), || {
        datas.iter().all(|d| cursor_ns(d).is_some_and(|c| c >= end)).then_some(())
    });
    let _ = stop.send(true);
    for t in threads {
        t.join().unwrap();
    }
    // node-c is on shard 1 (the third node), with its stacks.
    let on = |s: &ClickHouse| s.number("SELECT count() FROM profiler.samples_local WHERE node = 'node-c'");
    assert!(on(&shards[0]) > 0 && on(&shards[1]) == 0);
    let (from, to) = ((start / SEC).to_string(), (end / SEC).to_string());
    for s in &shards {
        let url = s.url();
        let e = fleet_json(&["--clickhouse", &url, "--from", &from, "--to", &to, "--event", "ena.*reset"]);
        let reset = &e["events"]["events"][0];
        assert_eq!((reset["node"].as_str(), reset["ts_ns"].as_u64()), (Some("node-c"), Some(event_ts)), "{e}");
        assert_eq!(reset["cpu"], 1, "the CPU with the most kernel-mode samples: {reset}");
        assert_eq!(reset["cpu_kernel_samples"].as_u64(), Some(5 * 20));
        assert_eq!(reset["stacks"][0]["samples"].as_u64(), Some(5 * 20));
    }
}

/// The same SQL on today's ClickHouse (chdb from PyPI), over a few rows that exercise every
/// query: the answers must be those 18.16 gives.
#[test]
fn fleet_sql_runs_on_current_clickhouse() {
    use profiler::{
        fleet::{
            Fleet,
            overview::{Sql, node_filter},
            rollup::{Piece, Source},
        },
        query::Window,
        ship::clickhouse::{frames::frame_id, schema},
    };
    let mut statements =
        schema::statements(&schema::Layout { database: "p", cluster: None, ttl_secs: Some(604_800), codecs: true });
    // Rows of a minute ago: the tables' 7-day TTL would drop a fixed date's rows once it is a
    // week old (1_795_000_000 s expired on 2026-11-25), in a background merge, at random.
    let t = (integration_tests::now_secs() as u64 - 60) * SEC;
    statements.extend([
        "INSERT INTO p.nodes VALUES ('n1', 2, 99, '0-1', 'h', 1)".to_string(),
        format!(
            "INSERT INTO p.cpu_seconds VALUES ('n1', {t}, {SEC}, 0, 90, 10, 9, 0, 99), ('n1', {t}, {SEC}, 0, 90, 10, 9, 0, 99), \
             ('n1', {t}, {SEC}, 1, 10, 10, 89, 0, 99)"
        ),
        // Sent again (a retried batch): a part of its own, which no merge has collapsed yet
        // (current servers collapse the copies within one insert).
        format!("INSERT INTO p.cpu_seconds VALUES ('n1', {t}, {SEC}, 0, 90, 10, 9, 0, 99)"),
        // Stack 7 as text (`stacks`, as daemons before the frames dictionary wrote it), 8 as ids.
        "INSERT INTO p.stacks VALUES (7, ['main', 'do_syscall_64'], [0, 1])".into(),
        format!("INSERT INTO p.stack_frames VALUES (8, [{}], [0])", frame_id("main")),
        format!("INSERT INTO p.frames VALUES ({}, 'main')", frame_id("main")),
        format!("INSERT INTO p.samples VALUES ('n1', {}, 1, 2, 3, 'bash', 7, '', 4), ('n1', {}, 0, 2, 3, 'bash', 8, '', 6)", t + 1, t + 2),
        format!("INSERT INTO p.events VALUES ('n1', {}, 'e1', 'p', 'ena reset')", t + 3),
        format!("INSERT INTO p.findings VALUES ('n1', 'f1', 'saturated-core', {t}, 0, 0, 'warning', 's', '{{}}', 1)"),
    ]);
    let fleet = Fleet::new("http://unused:1", "p").unwrap();
    // The window's samples from raw rows and, for an earlier minute, from the minute rollup: the
    // `UNION ALL` the overview sends when the rollup resolves part of its window.
    let minute = (t / 60 / SEC - 1) * 60 * SEC;
    statements.push(format!("INSERT INTO p.samples_1m VALUES ('n1', {minute}, 'bash', 8, '', 5)"));
    let pieces = vec![
        Piece { source: Source::Minutes, window: Window::new(minute, minute + 60 * SEC).unwrap() },
        Piece { source: Source::Raw, window: Window::new(t, t + 10 * SEC).unwrap() },
    ];
    let sql = Sql {
        fleet: &fleet,
        window: Window::new(t, t + 10 * SEC).unwrap(),
        nodes: node_filter(&["n1".into()]),
        pieces,
        fleet_pieces: Vec::new(),
        node_pieces: Vec::new(),
        cpu: profiler::fleet::minutes::Split::raw(Window::new(t, t + 10 * SEC).unwrap()),
        cpu_minutes: Default::default(),
    };
    // The nodes of a stack from the nodes' hours (n1 and n2), with the raw rows' (n1).
    let hour = (t / 3600 / SEC - 1) * 3600 * SEC;
    statements.push(format!(
        "INSERT INTO p.stack_nodes_1h VALUES ({hour}, 7, 'bash', 'n1', 3), ({hour}, 7, 'bash', 'n2', 1), ({hour}, 9, 'bash', 'n3', 1)"
    ));
    let node_pieces = vec![
        Piece { source: Source::NodeHours, window: Window::new(hour, hour + 3600 * SEC).unwrap() },
        Piece { source: Source::Raw, window: Window::new(t, t + 10 * SEC).unwrap() },
    ];
    let stack_nodes = Sql {
        fleet: &fleet,
        window: sql.window,
        nodes: String::new(),
        pieces: Vec::new(),
        fleet_pieces: Vec::new(),
        node_pieces,
        cpu: profiler::fleet::minutes::Split::raw(sql.window),
        cpu_minutes: Default::default(),
    }
    .top_nodes(&[7]);
    let queries = [
        (sql.cells(1), "n1\t0\t100\t98\t0\t0.9090909090909091\t1000000000\t1000000000"),
        (sql.findings(), "n1\tsaturated-core\t1"),
        (sql.events(), "n1\t1"),
        (sql.top(1), "bash\t8\t11\t1"),
        (sql.matching_events("ena.*reset"), &format!("n1\t{}\te1\tena reset", t + 3)),
        (sql.matching_count("ena.*reset"), "1"),
        // Two events of one node whose lookbacks overlap: the rows count in each, the row sent
        // twice once.
        (
            sql.event_cpus(&[("n1", t + SEC + 3), ("n1", t + 2 * SEC)]),
            "0\t0\t10\t90\n0\t1\t10\t10\n1\t0\t10\t90\n1\t1\t10\t10",
        ),
        (sql.event_stacks(&[("n1", t + SEC, 1), ("n1", t + SEC, 0)]), "0\tbash\t7\t4\n1\tbash\t8\t6"),
        (stack_nodes, "bash\t7\t2"),
    ];
    let n = statements.len();
    statements.extend(queries.iter().map(|(q, _)| format!("{q} FORMAT TSV")));
    let Some(answers) = integration_tests::clickhouse::chdb(&statements) else { return };
    for ((q, want), got) in queries.iter().zip(&answers[n..]) {
        assert_eq!(got, want, "on chdb: {q}");
    }
}

/// A simulated fleet: `nodes` synthetic GPU-like nodes (`synth`: 2 CPUs at 99 Hz, one busy,
/// one nearly idle, the same 2,000 stacks fleet-wide) for `secs` ending 30 s ago, each in its
/// own store, all shipped at once by the real shipper into one 18.16 server. Prints the figures
/// BENCHMARKS.md records. Run by `cargo xtask bench fleet` (release binary in PROFILER_BIN).
/// FLEET_NODES (50), FLEET_SECS (600) and FLEET_CPUS (2) size it: `FLEET_NODES=1 FLEET_CPUS=192`
/// with an hour is issue 39's big node.
#[test]
#[ignore]
fn fleet_benchmark() {
    use synth::{Rng, StackPool, Tick, second};
    let nodes: usize = std::env::var("FLEET_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let secs: u64 = std::env::var("FLEET_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let cpus: u32 = std::env::var("FLEET_CPUS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    // The node whose minute, and whole window, is read: node-07 of the default fleet.
    let probe = format!("node-{:02}", 7.min(nodes.saturating_sub(1)));
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let end = (now_secs() as u64 - 30) * SEC;
    let start = end - secs * SEC;
    let t = Instant::now();
    let pool = Arc::new(StackPool::new(2000, &mut Rng::new(13)));
    let dirs: Vec<(String, std::path::PathBuf)> =
        (0..nodes).map(|i| (format!("node-{i:02}"), tmp.path().join(format!("node-{i:02}")))).collect();
    // Two writers at a time: the machine has 2 CPUs.
    std::thread::scope(|s| {
        for chunk in dirs.chunks(nodes.div_ceil(2)) {
            let pool = pool.clone();
            s.spawn(move || {
                for (name, data) in chunk {
                    let _lock = create_and_lock(data).unwrap();
                    let meta = Meta {
                        format_version: FORMAT_VERSION,
                        hostname: name.clone(),
                        node: name.clone(),
                        cpus,
                        frequency_hz: 99,
                        started_ns: start,
                    };
                    meta.write(data).unwrap();
                    let mut rng = Rng::new(name.bytes().map(u64::from).sum());
                    let mut w = StoreWriter::new(&segments_dir(data));
                    for sec in 0..secs {
                        let at = start + sec * SEC;
                        second(&pool, &mut rng, at, cpus, 99, |tick| match tick {
                            Tick::Busy(s) => w.push(&s),
                            Tick::Idle { ts_ns, cpu } => w.push_idle(ts_ns, cpu),
                        });
                        w.flush(at + SEC).unwrap();
                    }
                }
            });
        }
    });
    eprintln!("{nodes} stores of {cpus} CPUs x {secs} s written in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let stats = ship_all(&ch, &dirs, end);
    let ship_secs = t.elapsed().as_secs_f64();
    let rows: u64 = stats.iter().map(|s| s.sample_rows).sum();
    let wire: u64 = stats.iter().map(|s| s.bytes).sum();
    let mut figures = BTreeMap::new();
    figures.insert("ingest", format!("{rows} sample rows from {nodes} shippers at once in {ship_secs:.1} s: {:.0} rows/s, {:.1} B/row on the wire", rows as f64 / ship_secs, wire as f64 / rows as f64));
    let bytes = |table: &str| {
        ch.number(&format!(
            "SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = 'profiler' AND table = '{table}'"
        ))
    };
    let per_row = |what: &str| {
        let (s, st, c) = (bytes("samples"), bytes("stacks"), bytes("cpu_seconds"));
        let parts =
            ch.number("SELECT count() FROM system.parts WHERE active AND database = 'profiler' AND table = 'samples'");
        format!(
            "{what} ({parts} parts): samples {s} B ({:.2} B/row), stacks {st} B, cpu_seconds {c} B; all {:.2} B per sample",
            s as f64 / rows as f64,
            (s + st + c) as f64 / rows as f64
        )
    };
    figures.insert("disk", per_row("in ClickHouse"));
    figures.insert(
        "disk_rollups",
        format!(
            "the rollups the server keeps beside: samples_1m {} B, samples_1h {} B",
            bytes("samples_1m"),
            bytes("samples_1h")
        ),
    );

    let median = |args: Vec<String>| {
        let mut runs = Vec::new();
        let mut out = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let o = profiler(&args.iter().map(String::as_str).collect::<Vec<_>>());
            runs.push(t.elapsed().as_secs_f64() * 1000.0);
            assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
            out = o.stdout;
        }
        runs.sort_by(f64::total_cmp);
        (runs[3], runs[0], runs[6], out)
    };
    let minute = start + secs / 2 * SEC;
    let flame: Vec<String> = [
        "flamegraph",
        "--clickhouse",
        &url,
        "--node",
        &probe,
        "--from",
        &(minute / SEC).to_string(),
        "--to",
        &(minute / SEC + 60).to_string(),
        "--format",
        "folded",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (med, lo, hi, out) = median(flame.clone());
    let lines = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
    // The part of it that is not the minute's copy and fold: the node's row, its findings and
    // events (`Mirror::new`), and the process's start.
    let (notes, _, _, _) = median(
        ["events", "--clickhouse", &url, "--node", &probe, "--from", &(minute / SEC).to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    );
    figures
        .insert("flamegraph_setup", format!("`profiler events --clickhouse URL --node {probe}`: median {notes:.0} ms"));
    // The command's own CPU time against its wall time: the rest is waiting for ClickHouse.
    if Path::new("/usr/bin/time").exists() {
        let mut cpu = Vec::new();
        for _ in 0..7 {
            let o = Command::new("/usr/bin/time")
                .args(["-f", "TIME %e %U %S"])
                .arg(integration_tests::profiler_bin())
                .args(&flame)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            let t: Vec<f64> = err
                .lines()
                .find_map(|l| l.strip_prefix("TIME "))
                .map(|l| l.split(' ').filter_map(|v| v.parse().ok()).collect())
                .unwrap_or_default();
            if t.len() == 3 {
                cpu.push((t[1] + t[2]) * 1000.0);
            }
        }
        cpu.sort_by(f64::total_cmp);
        if let Some(c) = cpu.get(cpu.len() / 2) {
            figures.insert("flamegraph_cpu", format!("the flamegraph command's own user+sys CPU: median {c:.0} ms"));
        }
    }
    figures.insert(
        "flamegraph",
        format!("`profiler {}`: median {med:.0} ms of 7 ({lo:.0}-{hi:.0}), {lines} folded lines", flame.join(" ")),
    );
    // The whole fleet's window, summed by the server (issue 39): no node named, no copy.
    let all = |cmd: &str, extra: &[&str]| -> Vec<String> {
        [
            &[cmd, "--clickhouse", &url, "--from", &(start / SEC).to_string(), "--to", &(end / SEC).to_string()][..],
            extra,
        ]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let (med, lo, hi, out) = median(all("flamegraph", &["--format", "folded"]));
    let total: u64 =
        String::from_utf8_lossy(&out).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum();
    assert_eq!(total, rows, "the fleet's flamegraph holds every sample shipped");
    let said = profiler(&all("flamegraph", &["--format", "folded"]).iter().map(String::as_str).collect::<Vec<_>>());
    let said = String::from_utf8_lossy(&said.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("note: "))
        .collect::<Vec<_>>()
        .join("; ");
    figures.insert(
        "fleet_flamegraph",
        format!("`profiler flamegraph --clickhouse URL` over all {nodes} nodes' {secs} s ({total} samples; {said}): median {med:.0} ms of 7 ({lo:.0}-{hi:.0})"),
    );
    let (med, lo, hi, _) = median(all("heatmap", &["--format", "json"]));
    figures.insert(
        "fleet_heatmap",
        format!("`profiler heatmap --clickhouse URL` over all {nodes} nodes' {secs} s: median {med:.0} ms of 7 ({lo:.0}-{hi:.0})"),
    );
    // What the command says it read (rollups or raw rows), from a run of its own.
    let note = |args: Vec<String>| {
        let o = profiler(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        err.lines().filter_map(|l| l.strip_prefix("note: ")).collect::<Vec<_>>().join("; ")
    };
    // One node's whole window, summed by the server (and with `--cpu 0`, which the rollups do
    // not keep: raw rows), against the copy (`fleet/mirror.rs`) that what the server cannot sum
    // still makes: CPU x time at 100 ms (its first 10 minutes) and, for longer windows,
    // `report` over the whole window (refused past `MAX_SAMPLES`).
    let node = ["--node", probe.as_str()];
    for (name, filter) in [("node_flamegraph", &[][..]), ("node_flamegraph_cpu0", &["--cpu", "0"][..])] {
        let args = all("flamegraph", &[&node[..], filter, &["--format", "folded"]].concat());
        let (med, lo, hi, out) = median(args.clone());
        let total: u64 =
            String::from_utf8_lossy(&out).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum();
        figures.insert(
            name,
            format!(
                "`profiler flamegraph --clickhouse URL --node {probe} {}--format folded` over its {secs} s ({total} samples; {}): median {med:.0} ms of 7 ({lo:.0}-{hi:.0})",
                filter.iter().map(|a| format!("{a} ")).collect::<String>(),
                note(args)
            ),
        );
    }
    let (med, lo, hi, _) = median(all("heatmap", &[&node[..], &["--format", "json"]].concat()));
    figures.insert(
        "node_heatmap",
        format!("`profiler heatmap --clickhouse URL --node {probe}` over its {secs} s: median {med:.0} ms of 7 ({lo:.0}-{hi:.0})"),
    );
    let (med, lo, hi, _) = median(all("cputime", &[&node[..], &["--format", "json"]].concat()));
    figures.insert(
        "node_cputime",
        format!("`profiler cputime --clickhouse URL --node {probe}` (1 s buckets, summed by the server) over its {secs} s: median {med:.0} ms of 7 ({lo:.0}-{hi:.0})"),
    );
    let (report, grid) = (tmp.path().join("report.html"), tmp.path().join("cputime.json"));
    let copies = [(
        "node_copy_cputime_100ms",
        secs.min(600),
        7,
        vec!["cputime", "--bucket", "100ms", "--format", "json", "-o", grid.to_str().unwrap()],
    )]
    .into_iter()
    .chain((secs > 600).then(|| ("node_copy_report", secs, 3, vec!["report", "-o", report.to_str().unwrap()])));
    for (name, span, times, extra) in copies {
        let args: Vec<String> =
            [extra[0], "--clickhouse", &url, "--node", &probe, "--from", &(start / SEC).to_string()]
                .into_iter()
                .chain(["--to", &(start / SEC + span).to_string()])
                .chain(extra[1..].iter().copied())
                .map(str::to_string)
                .collect();
        let mut runs = Vec::new();
        let mut said = String::new();
        for _ in 0..times {
            let t = Instant::now();
            let o = profiler(&args.iter().map(String::as_str).collect::<Vec<_>>());
            runs.push(t.elapsed().as_secs_f64() * 1000.0);
            said = if o.status.success() {
                "answered".into()
            } else {
                format!("refused: {}", String::from_utf8_lossy(&o.stderr).trim())
            };
        }
        runs.sort_by(f64::total_cmp);
        let (med, lo, hi) = (runs[runs.len() / 2], runs[0], runs[runs.len() - 1]);
        figures.insert(
            name,
            format!(
                "`profiler {}` over {span} s (the copy): median {med:.0} ms of {times} ({lo:.0}-{hi:.0}), {said}",
                extra.iter().take_while(|&&a| a != "-o").copied().collect::<Vec<_>>().join(" ")
            ),
        );
    }
    let fleet: Vec<String> = [
        "fleet",
        "--clickhouse",
        &url,
        "--from",
        &(start / SEC).to_string(),
        "--to",
        &(end / SEC).to_string(),
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (med, lo, hi, out) = median(fleet.clone());
    let j: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(j["grid"]["nodes"].as_array().unwrap().len(), nodes);
    figures.insert(
        "fleet",
        format!(
            "`profiler {}`: median {med:.0} ms of 7 ({lo:.0}-{hi:.0}); grid {} x {} of {} s",
            fleet.join(" "),
            nodes,
            j["grid"]["columns"],
            j["grid"]["bucket_seconds"]
        ),
    );
    // Where `profiler fleet`'s time goes: each of its queries alone, on the server (FORMAT Null).
    {
        use profiler::{
            fleet::{
                Fleet,
                overview::{Sql, choose_bucket},
            },
            query::Window,
        };
        let fleet = Fleet::new(&url, "profiler").unwrap();
        let window = Window::new(start, end).unwrap();
        let cpu = profiler::fleet::minutes::Split::raw(window);
        let sql = Sql {
            fleet: &fleet,
            window,
            nodes: String::new(),
            pieces: Vec::new(),
            fleet_pieces: Vec::new(),
            node_pieces: Vec::new(),
            cpu,
            cpu_minutes: Default::default(),
        };
        let queries = [
            ("cells (busy shares and grid)", sql.cells(choose_bucket(window).0)),
            ("findings", sql.findings()),
            ("events", sql.events()),
            ("top", sql.top(10)),
        ];
        let mut parts = Vec::new();
        for (name, q) in queries {
            let mut runs: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    ch.query(&format!("{q} FORMAT Null")).unwrap();
                    t.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            runs.sort_by(f64::total_cmp);
            parts.push(format!("{name} {:.0} ms", runs[2]));
        }
        figures.insert("fleet_queries", format!("median of 5 each: {}", parts.join(", ")));
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    figures.insert("load", format!("/proc/loadavg at the end: {}", load.trim()));
    for (k, v) in figures {
        println!("FLEET {k}: {v}");
    }
}
