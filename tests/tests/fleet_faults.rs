//! Faults of the fleet's ClickHouse (issue 39, part 6), on real 18.16 servers, with synthetic
//! nodes (no BPF, no root) written in real time and shipped by the real shipper:
//! - a shard stopped while its nodes and another shard's ship: the other shard's nodes keep
//!   shipping, readers get a sentence naming the missing shard, and once it is back nothing is
//!   lost and nothing is there twice (the 5 minutes are 45 s here, `FAULTS_OUTAGE_SECS`
//!   to change; `docs/clickhouse.md`, Faults, has a 5-minute run);
//! - a node back from a long time offline (10 minutes of backlog here for the 2 hours)
//!   catches up at no more than `max_rows_per_sec` while another node's lag stays small;
//! - every read command works for a user with `readonly=1`;
//! - bad input gets a sentence: hostile `--node` globs, ten years, unknown names, a stopped
//!   (frozen) shard, a read past the user's time limit.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use integration_tests::{
    Kill,
    clickhouse::{ClickHouse, HASTY, READER, cursor_ns},
    free_port, now_secs, profiler, wait_for,
};
use profiler::{
    model::{Sample, Stack},
    query::{Filter, Window, for_each_sample},
    ship::{
        SharedStats, Stats,
        clickhouse::{Config, FileConfig, Shipper},
    },
    store::{Meta, Store, StoreWriter, create_and_lock, format::FORMAT_VERSION, segments_dir},
};

const SEC: u64 = 1_000_000_000;

fn now_ns() -> u64 {
    (now_secs() * 1e9) as u64
}

/// A node's store, written as its daemon writes it: `backlog` seconds before now at once (a
/// node that was offline: its store kept sampling), then each second once it ended, until
/// dropped. Every CPU busy at every tick; stacks shared by every node and one of its own.
struct LiveNode {
    data: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LiveNode {
    fn start(name: &str, data: PathBuf, cpus: u32, hz: u64, backlog_secs: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (name, dir, flag) = (name.to_string(), data.clone(), stop.clone());
        let first = (now_ns() / SEC - backlog_secs) * SEC;
        let thread = std::thread::spawn(move || {
            let _lock = create_and_lock(&dir).unwrap();
            Meta {
                format_version: FORMAT_VERSION,
                hostname: name.clone(),
                node: name.clone(),
                cpus,
                frequency_hz: hz,
                started_ns: first,
            }
            .write(&dir)
            .unwrap();
            let stack = |frames: &[&str]| Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), 2));
            let mut stacks: Vec<Arc<Stack>> =
                (0..4).map(|i| stack(&["main", &format!("shared_work_{i}"), "do_syscall_64"])).collect();
            stacks.push(stack(&["main", &format!("only_on_{name}"), "do_syscall_64"]));
            let comms: Vec<Arc<str>> = ["app", "db", "web"].iter().map(|c| Arc::from(*c)).collect();
            let empty: Arc<str> = Arc::from("");
            let mut w = StoreWriter::new(&segments_dir(&dir));
            let mut second = first;
            let mut i = 0usize;
            while !flag.load(Ordering::Relaxed) {
                // Seconds that ended: written whole, as a daemon flushes them.
                while second + SEC <= now_ns() {
                    for tick in 0..hz {
                        for cpu in 0..cpus {
                            w.push(&Sample {
                                ts_ns: second + tick * (SEC / hz) + u64::from(cpu) * 1000,
                                cpu,
                                pid: 100 + cpu,
                                tid: 100 + cpu,
                                cgroup_id: 0,
                                comm: comms[cpu as usize % comms.len()].clone(),
                                stack: stacks[i % stacks.len()].clone(),
                                workload: empty.clone(),
                            });
                            i += 1;
                        }
                    }
                    second += SEC;
                    if second.is_multiple_of(10 * SEC) || second + SEC > now_ns() {
                        w.flush(second).unwrap();
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            w.flush(second).unwrap();
        });
        // The store exists before a shipper looks at it (a daemon makes it before shipping).
        wait_for("the node's first second", Duration::from_secs(60), || {
            std::fs::read_dir(segments_dir(&data)).ok()?.next().map(|_| ())
        });
        Self { data, stop, thread: Some(thread) }
    }

    /// Seconds between now and the node's cursor (what ClickHouse lacks of it).
    fn lag_secs(&self) -> f64 {
        cursor_ns(&self.data).map_or(f64::INFINITY, |c| now_secs() - c as f64 / 1e9)
    }
}

impl Drop for LiveNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A real shipper on its own thread.
struct Shipping {
    stop: tokio::sync::watch::Sender<bool>,
    thread: JoinHandle<()>,
    stats: SharedStats,
}

fn ship(url: &str, node: &str, data: &Path, file: &FileConfig) -> Shipping {
    let config = Config::resolve(Some(url.to_string()), Some(file), node, data.to_path_buf(), 86_400).unwrap().unwrap();
    let stats = SharedStats::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let thread = profiler::ship::spawn(Shipper { config, stats: stats.clone(), stop: stop_rx }).unwrap();
    Shipping { stop, thread, stats }
}

impl Shipping {
    fn finish(self) -> Stats {
        let _ = self.stop.send(true);
        self.thread.join().unwrap();
        self.stats.lock().unwrap().clone()
    }
}

/// Samples per (CPU, comm) and rows of the store before `to`.
fn store_counts(data: &Path, to: u64) -> (BTreeMap<(u32, String), u64>, u64) {
    let mut store = Store::open(data).unwrap();
    let (mut counts, mut rows) = (BTreeMap::new(), 0);
    // From the store's first second: a window from 1970 spends the query's time budget walking
    // empty hours.
    let start = store.span().unwrap().map_or(0, |(a, _)| a / SEC * SEC);
    for_each_sample(&mut store, Window::new(start, to).unwrap(), &Filter::default(), |s| {
        *counts.entry((s.cpu, s.comm.to_string())).or_default() += s.count;
        rows += 1;
    })
    .unwrap();
    (counts, rows)
}

/// The same of ClickHouse's `table` (`samples` through the cluster, or a shard's `samples_local`).
fn ch_counts(ch: &ClickHouse, table: &str, node: &str, to: u64) -> (BTreeMap<(u32, String), u64>, u64) {
    let sql = format!(
        "SELECT cpu, comm, toUInt64(sum(count)) AS n FROM profiler.{table} WHERE node = '{node}' AND ts < {to} \
         GROUP BY cpu, comm FORMAT TabSeparated"
    );
    let mut counts = BTreeMap::new();
    for line in ch.query(&sql).unwrap().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        counts.insert((f[0].parse().unwrap(), f[1].to_string()), f[2].parse().unwrap());
    }
    let rows = ch.number(&format!("SELECT count() FROM profiler.{table} WHERE node = '{node}' AND ts < {to}"));
    (counts, rows)
}

/// Everything the node's store holds before its cursor is in ClickHouse once, read through
/// `ch`: same counts per (CPU, comm), same rows, no (ts, cpu, tid) twice, every stack there.
fn assert_exact(ch: &ClickHouse, table: &str, node: &str, data: &Path) -> u64 {
    let to = cursor_ns(data).unwrap();
    let (local, local_rows) = store_counts(data, to);
    let (remote, remote_rows) = ch_counts(ch, table, node, to);
    let twice = ch.number(&format!(
        "SELECT count() FROM (SELECT ts, cpu, tid, count() AS c FROM profiler.{table} WHERE node = '{node}' \
         GROUP BY ts, cpu, tid HAVING c > 1)"
    ));
    assert_eq!(twice, 0, "{node}: samples in ClickHouse twice");
    assert_eq!(remote, local, "{node}: samples per (CPU, comm) before {}", to / SEC);
    assert_eq!(remote_rows, local_rows, "{node}: rows before {}", to / SEC);
    let orphans = ch.number(&format!(
        "SELECT count() FROM profiler.{table} WHERE node = '{node}' AND stack_id GLOBAL NOT IN \
         (SELECT stack_id FROM profiler.stack_frames)"
    ));
    assert_eq!(orphans, 0, "{node}: samples whose stack is not in `stack_frames`");
    local_rows
}

/// `profiler ARGS` that must fail: its message, checked to be one sentence of ours.
fn refused(args: &[&str]) -> String {
    let t = Instant::now();
    let out = profiler(args);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "profiler {} succeeded", args.join(" "));
    let last = err.lines().last().unwrap_or("").to_string();
    assert!(
        !err.contains("Code:") && !err.contains("e.what()") && !err.contains("DB::"),
        "profiler {}: the server's error passed through: {err}",
        args.join(" ")
    );
    eprintln!("{:.1} s: profiler {}: {last}", t.elapsed().as_secs_f64(), args.join(" "));
    last
}

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn a_stopped_shard_loses_and_duplicates_nothing_and_the_other_shard_ships_on() {
    let outage = knob("FAULTS_OUTAGE_SECS", 45);
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(mut shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let nodes = [("up-1", 0), ("up-2", 0), ("down-1", 1), ("down-2", 1)];
    let file = FileConfig { batch_rows: Some(2_000), cluster: Some("fleet".into()), ..Default::default() };
    let live: Vec<LiveNode> = nodes.iter().map(|(n, _)| LiveNode::start(n, tmp.path().join(n), 2, 50, 30)).collect();
    let shipping: Vec<Shipping> =
        nodes.iter().zip(&live).map(|((n, s), l)| ship(&shards[*s].url(), n, &l.data, &file)).collect();
    wait_for("every node to catch up", Duration::from_secs(120), || {
        live.iter().all(|l| l.lag_secs() < 15.0).then_some(())
    });

    // Shard 2 goes: killed, as a crash or a power cut would (its parts in flight unfinished).
    let missing = shards[1].tcp_addr();
    shards[1].kill9();
    let killed = now_ns();
    let up_cursors: Vec<u64> = live[..2].iter().map(|l| cursor_ns(&l.data).unwrap()).collect();
    let mut worst_up_lag = 0f64;
    let mut told = false;
    while now_ns() < killed + outage * SEC {
        worst_up_lag = live[..2].iter().map(LiveNode::lag_secs).fold(worst_up_lag, f64::max);
        if !told {
            // A reader through the shard that is up: a sentence naming the one that is not,
            // for the raw tables, the rollups and the fleet's questions alike.
            let url = shards[0].url_as(READER);
            for args in [
                &["flamegraph", "--format", "folded", "--node", "up-1", "--from", "-20s", "--to", "-10s"][..],
                &["flamegraph", "--format", "folded", "--from", "-10m", "--to", "now"],
                &["fleet", "--from", "-1m"],
                &["findings", "--node", "up-*", "--from", "-1m"],
            ] {
                let e = refused(&[args, &["--clickhouse", &url]].concat());
                assert!(
                    e.contains(&format!("cannot reach shard {missing} of its cluster (connection refused)")),
                    "{e}"
                );
            }
            told = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(worst_up_lag < 20.0, "shard 1's nodes were held up while shard 2 was down: {worst_up_lag:.1} s behind");
    for (l, before) in live[..2].iter().zip(&up_cursors) {
        let moved = (cursor_ns(&l.data).unwrap() - before) / SEC;
        assert!(moved + 15 >= outage, "shard 1's nodes kept shipping: a cursor moved {moved} s in {outage} s");
    }
    for l in &live[2..] {
        assert!(cursor_ns(&l.data).unwrap() < killed, "nothing reached the killed shard");
    }
    let down_lag = live[2..].iter().map(LiveNode::lag_secs).fold(0f64, f64::max);

    // It comes back on the same data: its nodes catch up by themselves.
    shards[1].restart();
    let back = Instant::now();
    wait_for("shard 2's nodes to catch up", Duration::from_secs(180), || {
        live[2..].iter().all(|l| l.lag_secs() < 15.0).then_some(())
    });
    let caught_up = back.elapsed().as_secs_f64();
    let stats: Vec<Stats> = shipping.into_iter().map(Shipping::finish).collect();
    drop(live);

    eprintln!(
        "shard 2 down {outage} s: shard 1's nodes at most {worst_up_lag:.1} s behind; shard 2's {down_lag:.0} s \
         behind when it came back, caught up {caught_up:.1} s later"
    );
    for (i, (node, shard)) in nodes.iter().enumerate() {
        let data = tmp.path().join(node);
        // Through either shard, and on the node's own shard.
        let rows = assert_exact(&shards[0], "samples", node, &data);
        assert_exact(&shards[1], "samples", node, &data);
        assert_exact(&shards[*shard], "samples_local", node, &data);
        assert_eq!(stats[i].errors.is_empty(), *shard == 0, "{node}: errors {:?}", stats[i].errors);
        eprintln!("{node}: {rows} rows, each once; {} batches found there already", stats[i].batches_already_there);
    }
    // Stacks and their frames went to each node's own shard: the shared ones are on both, the
    // reads above took one row per id.
    for shard in &shards {
        let id = profiler::ship::clickhouse::frames::frame_id("shared_work_0");
        assert!(shard.number(&format!("SELECT count() FROM profiler.frames_local WHERE frame_id = {id}")) >= 1);
        assert!(
            shard.number(&format!("SELECT count() FROM profiler.stack_frames_local WHERE has(frame_ids, {id})")) >= 1
        );
    }

    // A shard frozen (SIGSTOP) holds a read on a connection that stays open: the request's
    // own timeout ends it, with a sentence.
    shards[1].freeze(true);
    let t = Instant::now();
    let e = refused(&["fleet", "--from", "-1m", "--clickhouse", &shards[0].url()]);
    shards[1].freeze(false);
    assert!(e.contains("did not answer within 30 s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(45), "a frozen shard held the read {:?}", t.elapsed());
}

/// Rows of `node` in ClickHouse now.
fn rows_of(ch: &ClickHouse, node: &str) -> u64 {
    ch.number(&format!("SELECT count() FROM profiler.samples WHERE node = '{node}'"))
}

#[test]
fn a_node_back_from_hours_offline_catches_up_at_its_bound_and_others_keep_up() {
    let (rate, batch_rows) = (knob("FAULTS_ROWS_PER_SEC", 2_000), 4_000);
    let (cpus, hz, backlog) = (knob("FAULTS_CPUS", 2) as u32, knob("FAULTS_HZ", 50), knob("FAULTS_BACKLOG_SECS", 600));
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let steady = LiveNode::start("steady", tmp.path().join("steady"), 2, 50, 0);
    let steady_ship = ship(&ch.url(), "steady", &steady.data, &FileConfig::default());
    wait_for("the steady node to ship", Duration::from_secs(120), || (steady.lag_secs() < 15.0).then_some(()));
    let back = LiveNode::start("back", tmp.path().join("back"), cpus, hz, backlog);
    wait_for("the backlog to be written", Duration::from_secs(600), || {
        let store = Store::open(&back.data).ok()?.span().ok()??;
        (store.1 + 5 * SEC >= now_ns()).then_some(())
    });
    let file = FileConfig { batch_rows: Some(batch_rows), max_rows_per_sec: Some(rate), ..Default::default() };
    let started = Instant::now();
    let back_ship = ship(&ch.url(), "back", &back.data, &file);
    // A batch is at most `batch_rows` and one read step (10 s) more; the first goes at once.
    let slack = (batch_rows as u64 + u64::from(cpus) * hz * 10) as f64;
    let (mut worst_steady, mut worst_excess, mut observed) = (0f64, f64::MIN, 0);
    let mut last = 0;
    while back.lag_secs() >= 15.0 {
        assert!(started.elapsed() < Duration::from_secs(900), "the node never caught up: {} rows", last);
        let t = started.elapsed().as_secs_f64();
        last = rows_of(&ch, "back");
        worst_excess = worst_excess.max(last as f64 - (rate as f64 * t + slack));
        worst_steady = worst_steady.max(steady.lag_secs());
        observed += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let took = started.elapsed().as_secs_f64();
    let shipped = rows_of(&ch, "back");
    let mean = shipped as f64 / took;
    eprintln!(
        "{shipped} rows ({backlog} s of {cpus} CPUs at {hz} Hz and the seconds since) caught up in {took:.1} s: \
         {mean:.0} rows/s against a bound of {rate}; worst excess over rate x t + one batch {worst_excess:.0} \
         rows ({observed} looks); the steady node at most {worst_steady:.1} s behind"
    );
    assert!(worst_excess <= 0.0, "more than {rate} rows/s (and one batch): {worst_excess:.0} rows over");
    assert!(mean >= rate as f64 * 0.5, "paced, not stalled: {mean:.0} rows/s against {rate}");
    assert!(worst_steady < 20.0, "the catch-up held the steady node up: {worst_steady:.1} s behind");
    let stats = [back_ship.finish(), steady_ship.finish()];
    assert!(stats.iter().all(|s| s.errors.is_empty()), "{:?}", stats.iter().map(|s| &s.errors).collect::<Vec<_>>());
    drop((back, steady));
    for node in ["back", "steady"] {
        assert_exact(&ch, "samples", node, &tmp.path().join(node));
    }
}

/// `profiler ARGS` that must succeed: its stdout.
fn answer(args: &[&str]) -> Vec<u8> {
    let out = profiler(args);
    assert!(out.status.success(), "profiler {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Nodes (on the shards in turn) that shipped a minute and stopped: that minute's `--from`
/// and `--to`.
fn still_fleet(tmp: &Path, nodes: &[&str], shards: &[ClickHouse]) -> (String, String) {
    let file = FileConfig { cluster: (shards.len() > 1).then(|| "fleet".to_string()), ..Default::default() };
    let from = now_ns() / SEC - 60;
    let live: Vec<LiveNode> = nodes.iter().map(|n| LiveNode::start(n, tmp.join(n), 2, 50, 60)).collect();
    let shipping: Vec<Shipping> = nodes
        .iter()
        .zip(&live)
        .enumerate()
        .map(|(i, (n, l))| ship(&shards[i % shards.len()].url(), n, &l.data, &file))
        .collect();
    wait_for("the nodes to ship their minute", Duration::from_secs(120), || {
        live.iter().all(|l| cursor_ns(&l.data).is_some_and(|c| c >= (from + 60) * SEC)).then_some(())
    });
    for s in shipping {
        assert!(s.finish().errors.is_empty());
    }
    (from.to_string(), (from + 60).to_string())
}

#[test]
fn every_read_works_for_a_readonly_user() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let (from, to) = still_fleet(tmp.path(), &["ro-a", "ro-b"], &shards);
    let w = ["--from", from.as_str(), "--to", to.as_str()];
    let out = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let (pprof, report) = (out("out.pprof"), out("report.html"));
    let reads: Vec<Vec<&str>> = vec![
        vec!["flamegraph", "--format", "folded", "--node", "ro-a"],
        vec!["flamegraph", "--format", "folded"],
        vec!["flamegraph", "--format", "folded", "--node", "ro-*", "--comm", "db"],
        vec!["heatmap", "--format", "json", "--node", "ro-b"],
        vec!["heatmap", "--format", "json"],
        vec!["cputime", "--format", "json", "--node", "ro-a"],
        vec!["cputime", "--format", "csv", "--bucket", "100ms", "--node", "ro-a"],
        vec!["findings", "--format", "json"],
        vec!["findings", "--format", "json", "--node", "ro-a"],
        vec!["events", "--format", "json"],
        vec!["events", "--format", "json", "--node", "ro-b"],
        vec!["export", "--format", "folded", "--node", "ro-a"],
        vec!["export", "--format", "pprof", "-o", &pprof, "--node", "ro-b"],
        vec!["report", "-o", &report, "--node", "ro-a"],
        vec!["fleet", "--format", "json"],
    ];
    for (i, shard) in shards.iter().enumerate() {
        let (admin, reader) = (shard.url(), shard.url_as(READER));
        for args in &reads {
            let as_admin = answer(&[&args[..], &w, &["--clickhouse", &admin]].concat());
            let as_reader = answer(&[&args[..], &w, &["--clickhouse", &reader]].concat());
            if !args.contains(&"-o") {
                assert_eq!(
                    String::from_utf8_lossy(&as_reader),
                    String::from_utf8_lossy(&as_admin),
                    "shard {}: profiler {}: the reader's answer",
                    i + 1,
                    args.join(" ")
                );
            }
        }
    }
    // The user is read-only indeed.
    let reader_write = Command::new("curl")
        .args([
            "-s",
            "--data-binary",
            "INSERT INTO profiler.nodes_local (node) VALUES ('y')",
            &shards[0].url_as(READER),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&reader_write.stdout).contains("Code: 164"), "the reader cannot write");

    // The page: its API answers for the reader as for anyone.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(integration_tests::profiler_bin())
        .args(["ui", "--clickhouse", &shards[1].url_as(READER), "--listen", &listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _ui = Kill(child);
    let (base, token) = line.trim().split_once("/#token=").expect("the page's address");
    let host = base.strip_prefix("http://").unwrap();
    for path in [
        "/api/status?node=ro-a".to_string(),
        format!("/api/flamegraph?format=folded&node=ro-b&from={from}&to={to}"),
        format!("/api/heatmap?node=ro-a&from={from}&to={to}"),
    ] {
        let (code, body) = integration_tests::http_get(host, &path, "127.0.0.1", Some(token));
        assert_eq!(code, 200, "{path}: {body}");
    }
    let e = refused(&["fleet", "--clickhouse", &shards[0].url_as((READER.0, "wrong"))]);
    assert!(e.contains("refused the user and password"), "{e}");
}

#[test]
fn bad_input_gets_a_sentence_and_no_read_runs_for_minutes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let shards = [ch];
    let (from, to) = still_fleet(tmp.path(), &["bad-a", "o'brien\\b"], &shards);
    let url = shards[0].url_as(READER);
    let c = ["--clickhouse", url.as_str()];
    let w = ["--from", from.as_str(), "--to", to.as_str()];
    let commands: [&[&str]; 5] = [
        &["flamegraph", "--format", "folded"],
        &["heatmap", "--format", "json"],
        &["findings"],
        &["export", "--format", "folded"],
        &["fleet"],
    ];
    for hostile in ["bad-*'", "*' OR 1 = 1 --", "bad-\\", "\\'", "`", "bad-a'); DROP TABLE profiler.samples; --"] {
        for cmd in commands {
            let e = refused(&[cmd, &c, &w, &["--node", hostile]].concat());
            assert!(e.contains("has shipped nothing to this ClickHouse; it holds bad-a, o'brien\\b"), "{e}");
        }
    }
    // A name with a quote and a backslash, named exactly or by a glob, is read.
    let exact = answer(&[&["flamegraph", "--format", "folded", "--node", "o'brien\\b"][..], &c, &w].concat());
    let glob = answer(&[&["flamegraph", "--format", "folded", "--node", "o'*\\?"][..], &c, &w].concat());
    assert!(!exact.is_empty() && exact == glob, "o'brien\\b's own stacks");
    assert!(String::from_utf8_lossy(&exact).contains("only_on_o'brien\\b"));

    // Ten years: each read answers (the rollups, the days there are) or says why, in seconds.
    let decade = ["--from", "-3650d", "--to", "now"];
    for cmd in [&commands[..], &[&["cputime", "--format", "json", "--node", "bad-a"], &["events"]]].concat() {
        let t = Instant::now();
        let out = profiler(&[cmd, &c, &decade].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{:.1} s: profiler {} over ten years: {}", t.elapsed().as_secs_f64(), cmd.join(" "), err.trim());
        assert!(t.elapsed() < Duration::from_secs(30), "profiler {} took {:?}", cmd.join(" "), t.elapsed());
        assert!(!err.contains("Code:") && !err.contains("DB::"), "a server error passed through: {err}");
        assert!(out.status.success() || err.trim().lines().count() == 1, "{err}");
    }

    // Names that are not there.
    let e = refused(&[&["flamegraph", "--node", "nope"][..], &c, &w].concat());
    assert!(e.contains("node 'nope' has shipped nothing"), "{e}");
    let e = refused(&[&["flamegraph", "--format", "folded", "--namespace", "no-such-ns"][..], &c, &w].concat());
    assert!(e.contains("no-such-ns") || e.contains("no samples"), "{e}");
    let e = refused(&[&["fleet", "--database", "no_such_db"][..], &c].concat());
    assert!(e.contains("holds no node in database `no_such_db`"), "{e}");
    let e = refused(&[&["flamegraph", "--database", "x`y'z"][..], &c, &w].concat());
    assert!(e.contains("holds no node in database `x`y'z`"), "{e}");
}

/// A read longer than the user's time limit (the `hasty` user: 1 s) ends at the limit with a
/// sentence. 10 M samples of distinct stacks in 10 s of one node: the server sums them by stack
/// for a flamegraph, far more than a second's work even on a quiet machine.
#[test]
fn a_read_past_the_time_limit_ends_there_with_a_sentence() {
    use profiler::ship::clickhouse::schema;
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let layout = schema::Layout { database: "big", cluster: None, ttl_secs: None, codecs: false };
    // Without the rollups' views: only `samples` is filled, quickly.
    for q in schema::statements(&layout).iter().filter(|q| !q.contains("MATERIALIZED VIEW")) {
        ch.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    let start = (now_ns() / SEC - 3600) * SEC;
    let setup = [
        "INSERT INTO big.nodes (node, cpus, hz, online, host, version) VALUES ('big', 2, 99, '0-1', 'big', 1)"
            .to_string(),
        format!(
            "INSERT INTO big.cpu_seconds SELECT 'big', {start} + number * {SEC}, {SEC}, c, 1000000, 0, 0, 0, 99 \
             FROM numbers(10) ARRAY JOIN [0, 1] AS c"
        ),
        format!(
            "INSERT INTO big.samples SELECT 'big', {start} + number * 1000, number % 2, 1, 1, 'x', number, '', 1 \
             FROM numbers(10000000)"
        ),
    ];
    for q in &setup {
        ch.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    let (from, to) = ((start / SEC).to_string(), (start / SEC + 10).to_string());
    let url = ch.url_as(HASTY);
    let t = Instant::now();
    let e = refused(&[
        "flamegraph",
        "--format",
        "folded",
        "--clickhouse",
        &url,
        "--database",
        "big",
        "--from",
        &from,
        "--to",
        &to,
    ]);
    assert!(e.contains("stopped this read at its time limit"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}
