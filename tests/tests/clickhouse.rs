//! ClickHouse as the fleet store, the node side (issue 13): a real daemon ships to a private
//! ClickHouse 18.16, and what ClickHouse holds is what the node's store holds, exactly: per
//! (CPU, comm) counts and folded stacks for a window; then through a kill -9 of ClickHouse and
//! a kill -9 of the daemon, 0 samples lost and 0 duplicated once caught up. The schema is also
//! checked on today's ClickHouse (the embedded chdb from PyPI). The counter tracks (kernel
//! counters, and GPU tracks from the NVML stand-in) reach the `counters` table exactly.

#[path = "shared/ch_store.rs"]
mod ch_store;
#[path = "shared/otlp_total.rs"]
mod otlp_total;

use ch_store::{ship_with, synthetic_store, synthetic_store_ending, synthetic_store_with};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, Kill,
    clickhouse::{self, ClickHouse, cursor_ns, json_u64, stacks_as_text, wait_shipped},
    folded_window, helper_bin, now_secs,
    nvml::{StandIn, h100},
    privileged, profiler, skip, wait_for,
};
use profiler::{
    query::{Filter, Window, fold_names_with, for_each_sample},
    ship::{
        Stats,
        clickhouse::{frames::frame_id, schema},
    },
    store::Store,
};

const NODE: &str = "ch-test-node";
const SEC: u64 = 1_000_000_000;

/// Busy samples per (CPU, comm) in `[a, b)`, and rows, from the node's store.
fn local_counts(data: &Path, a: u64, b: u64) -> (BTreeMap<(u32, String), u64>, u64) {
    let mut store = Store::open(data).unwrap();
    let mut counts = BTreeMap::new();
    let mut rows = 0;
    for_each_sample(&mut store, Window::new(a, b).unwrap(), &Filter::default(), |s| {
        *counts.entry((s.cpu, s.comm.to_string())).or_default() += s.count;
        rows += 1;
    })
    .unwrap();
    (counts, rows)
}

fn range(a: u64, b: u64) -> String {
    format!("node = '{NODE}' AND ts >= {a} AND ts < {b}")
}

fn ch_counts(ch: &ClickHouse, a: u64, b: u64) -> (BTreeMap<(u32, String), u64>, u64) {
    let sql = format!(
        "SELECT cpu, comm, sum(count) AS n FROM profiler.samples WHERE {} GROUP BY cpu, comm FORMAT JSONEachRow",
        range(a, b)
    );
    let mut counts = BTreeMap::new();
    for line in ch.query(&sql).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // 18.16 writes 64-bit integers as JSON strings.
        let n = v["n"].as_str().map_or_else(|| v["n"].as_u64().unwrap(), |s| s.parse().unwrap());
        counts.insert((v["cpu"].as_u64().unwrap() as u32, v["comm"].as_str().unwrap().to_string()), n);
    }
    (counts, ch.number(&format!("SELECT count() FROM profiler.samples WHERE {}", range(a, b))))
}

/// Samples of `[a, b)` summed by (comm, stack) in ClickHouse.
fn folded_sql(db: &str, node_range: &str) -> String {
    format!(
        "SELECT comm, stack_id, sum(count) AS n FROM {db}.samples WHERE {node_range} GROUP BY comm, stack_id \
         FORMAT JSONEachRow"
    )
}

/// Folded stacks of `[a, b)` as ClickHouse holds them: the sums by stack, each stack's text
/// assembled from the frames dictionary (`stacks_as_text`).
fn ch_folded(ch: &ClickHouse, a: u64, b: u64) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let stacks = stacks_as_text(ch, "profiler");
    for line in ch.query(&folded_sql("profiler", &range(a, b))).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        // As the store folds: a Python frame once per function, without the line it ran (a
        // Python process elsewhere on the machine may be sampled in the window).
        let id = json_u64(&v["stack_id"]);
        let (frames, kernel) = stacks.get(&id).unwrap_or_else(|| panic!("stack {id} is not in stack_frames"));
        let folded = fold_names_with(
            v["comm"].as_str().unwrap(),
            frames.iter().zip(kernel).map(|(f, k)| (f.as_str(), *k == 1)),
            false,
        );
        let n = v["n"].as_str().map_or_else(|| v["n"].as_u64().unwrap(), |s| s.parse().unwrap());
        *out.entry(folded).or_default() += n;
    }
    out
}

/// Rows of the node that share (ts, cpu, tid) with another: a sample shipped twice.
fn duplicates(ch: &ClickHouse) -> u64 {
    ch.number(&format!(
        "SELECT count() FROM (SELECT ts, cpu, tid, count() AS c FROM profiler.samples WHERE node = '{NODE}' \
         GROUP BY ts, cpu, tid HAVING c > 1)"
    ))
}

/// Everything shipped so far equals the store up to the cursor: nothing lost, nothing twice.
fn assert_caught_up(ch: &ClickHouse, data: &Path, what: &str) {
    let to = cursor_ns(data).unwrap();
    let (local, local_rows) = local_counts(data, 1, to);
    let (remote, remote_rows) = ch_counts(ch, 1, to);
    assert_eq!(duplicates(ch), 0, "{what}: samples shipped twice");
    let orphans = ch.number(&format!(
        "SELECT count() FROM profiler.samples WHERE node = '{NODE}' AND stack_id NOT IN \
         (SELECT stack_id FROM profiler.stack_frames)"
    ));
    assert_eq!(orphans, 0, "{what}: samples whose stack is not in the stack_frames table");
    let frameless = ch.number(
        "SELECT count() FROM profiler.stack_frames ARRAY JOIN frame_ids AS f WHERE f NOT IN \
         (SELECT frame_id FROM profiler.frames)",
    );
    assert_eq!(frameless, 0, "{what}: stacks naming a frame that is not in the frames table");
    assert_eq!(ch.number("SELECT count() FROM profiler.stacks"), 0, "{what}: nothing written as text");
    assert_eq!(remote, local, "{what}: per (CPU, comm) counts up to {}", to / SEC);
    assert_eq!(remote_rows, local_rows, "{what}: rows up to {}", to / SEC);
    eprintln!("{what}: {local_rows} rows up to {} match exactly", to / SEC);
}

/// Every finding the store keeps that started before the cursor is in ClickHouse, and those
/// that closed before it closed there too (the spinning helper saturates CPU 1; the finding the
/// killed daemon left open is closed by the next one, with an end already shipped past).
fn assert_findings_shipped(ch: &ClickHouse, data: &Path) {
    let to = cursor_ns(data).unwrap();
    let local = profiler::detect::journal::findings_in(data, 0, to).unwrap();
    assert!(local.iter().any(|f| f.cpu == Some(1)), "no finding about the busy CPU 1: {local:?}");
    let sql = format!(
        "SELECT id, argMax(end_ts, version) AS e FROM profiler.findings WHERE node = '{NODE}' GROUP BY id \
         FORMAT JSONEachRow"
    );
    let mut remote = BTreeMap::new();
    for line in ch.query(&sql).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let e = v["e"].as_str().map_or_else(|| v["e"].as_u64().unwrap(), |s| s.parse().unwrap());
        remote.insert(v["id"].as_str().unwrap().to_string(), e);
    }
    for f in local.iter().filter(|f| f.start_ns < to) {
        let end = remote.get(&f.id).unwrap_or_else(|| panic!("finding {} not in ClickHouse: {remote:?}", f.id));
        if let Some(local_end) = f.end_ns.filter(|&e| e + 5 * SEC < to) {
            assert_eq!(*end, local_end, "finding {}: end in ClickHouse vs the store", f.id);
        }
    }
    eprintln!("{} findings in ClickHouse, as in the store", remote.len());
}

fn start_daemon(data: &Path, ch: &ClickHouse) -> Daemon {
    let url = ch.url();
    // The busy CPU 1 is a finding even while other builds keep the machine busy.
    let config = data.with_extension("toml");
    std::fs::write(&config, "[detect]\nmachine_busy_max = 1.0\nsaturated_kernel_min = 0.0\n").unwrap();
    let config = config.to_str().unwrap();
    let args = ["--listen", "off", "--node", NODE, "--clickhouse", &url, "--config", config];
    let mut d = Daemon::start(data, &args);
    d.wait_ready();
    d
}

#[test]
fn clickhouse_holds_what_the_store_holds_through_server_and_daemon_kills() {
    if !privileged("clickhouse_holds_what_the_store_holds_through_server_and_daemon_kills") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    let _busy = Kill(Command::new(helper_bin()).args(["1", "600"]).stdout(Stdio::null()).spawn().unwrap());
    let mut daemon = start_daemon(&data, &ch);

    // 1. A window, exactly.
    let a = now_secs().ceil() as u64 + 1;
    let b = a + 5;
    wait_shipped(&data, b * SEC);
    let (local, _) = local_counts(&data, a * SEC, b * SEC);
    let (remote, rows) = ch_counts(&ch, a * SEC, b * SEC);
    assert!(local.iter().any(|((cpu, comm), n)| *cpu == 1 && comm == "busy-helper" && *n > 100), "{local:?}");
    assert_eq!(remote, local, "per (CPU, comm) counts of [{a}, {b})");
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for (line, n) in folded_window(data.to_str().unwrap(), a as f64, b as f64, &[]).unwrap() {
        *folded.entry(line).or_default() += n;
    }
    let remote_folded = ch_folded(&ch, a * SEC, b * SEC);
    assert!(remote_folded.keys().any(|l| l.contains("profiler_test_hot_loop")), "{remote_folded:?}");
    assert_eq!(remote_folded, folded, "folded stacks of [{a}, {b})");
    eprintln!("window [{a}, {b}): {rows} rows, {} stacks match", folded.len());

    // 2. ClickHouse killed while the daemon ships, then restarted on its data.
    ch.kill9();
    let killed = now_secs();
    wait_for("the shipper to notice", Duration::from_secs(60), || {
        daemon.log_text().contains("shipping to ClickHouse failed").then_some(())
    });
    daemon.wait_ready_since(killed + 8.0);
    ch.restart();
    let back = now_secs().ceil() as u64;
    wait_shipped(&data, (back + 2) * SEC);
    assert_caught_up(&ch, &data, "after ClickHouse's kill -9");

    // 3. The daemon killed, then restarted: it resumes from its cursor.
    daemon.kill9();
    let daemon = start_daemon(&data, &ch);
    let again = now_secs().ceil() as u64;
    wait_shipped(&data, (again + 2) * SEC);
    assert_caught_up(&ch, &data, "after the daemon's kill -9");
    assert!(daemon.log_text().contains("shipping samples to ClickHouse"));
    assert_findings_shipped(&ch, &data);

    // What it costs in ClickHouse (printed for BENCHMARKS.md; run with --nocapture).
    let rows = ch.number("SELECT count() FROM profiler.samples");
    for table in ["samples", "stacks"] {
        let bytes = ch.number(&format!(
            "SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = 'profiler' AND table = '{table}'"
        ));
        eprintln!("{table}: {bytes} compressed bytes, {:.1} per sample row", bytes as f64 / rows as f64);
    }
}

/// The counter tracks reach ClickHouse as the store has them (issue 26: the GPU tracks ship like
/// the kernel counters): a daemon reading the NVML stand-in ships, and for a window of 5 s every
/// (track, CPU, tick, value) that `store::counters` reads on the node is a row of `counters`, and
/// nothing else is: the GPU's tracks (ten ticks a second) and the kernel counters (one) alike.
#[test]
fn counter_tracks_gpu_and_kernel_reach_clickhouse_as_the_store_has_them() {
    let test = "counter_tracks_gpu_and_kernel_reach_clickhouse_as_the_store_has_them";
    if !privileged(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, test) else { return };
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    nvml.say(&h100(37, &[], 0));
    let data = tmp.path().join("data");
    let url = ch.url();
    let args = ["--listen", "off", "--node", NODE, "--clickhouse", &url, "--nvml-library", nvml.lib_str()];
    let mut daemon = Daemon::start(&data, &args);
    daemon.wait_ready();
    let a = now_secs().ceil() as u64 + 2;
    let b = a + 5;
    // The GPU moves within the window: the rows carry each value at its tick.
    std::thread::sleep(Duration::from_secs_f64((a as f64 + 2.5 - now_secs()).max(0.0)));
    nvml.say(&h100(81, &[], 0));
    wait_shipped(&data, b * SEC);
    type Row = (String, i64, u64, String);
    let local: BTreeSet<Row> = profiler::store::counters::read(&data, a * SEC, b * SEC, &Default::default())
        .unwrap()
        .tracks
        .into_iter()
        .flat_map(|t| {
            let cpu = t.cpu.map_or(-1, i64::from);
            t.points.into_iter().map(move |(ms, v)| (t.name.clone(), cpu, ms, v.to_string()))
        })
        .collect();
    let sql = format!(
        "SELECT name, cpu, intDiv(ts, 1000000) AS ms, value FROM profiler.counters FINAL WHERE {} FORMAT JSONEachRow",
        range(a * SEC, b * SEC)
    );
    let remote: BTreeSet<Row> = ch
        .query(&sql)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            // 18.16 writes 64-bit integers as JSON strings.
            let ms = v["ms"].as_str().map_or_else(|| v["ms"].as_u64().unwrap(), |s| s.parse().unwrap());
            let value = v["value"].as_f64().unwrap().to_string();
            (v["name"].as_str().unwrap().to_string(), v["cpu"].as_i64().unwrap(), ms, value)
        })
        .collect();
    let util: Vec<&Row> = local.iter().filter(|r| r.0 == "gpu.0.util").collect();
    // The driver's own samples (the stand-in's, like NVIDIA's, one every 167 ms), each at its
    // time: about 30 in the 5 s.
    assert!(util.len() >= 25, "six GPU samples a second: {util:?}");
    assert!(util.iter().any(|r| r.3 == "37") && util.iter().any(|r| r.3 == "81"), "{util:?}");
    assert!(local.iter().any(|r| r.1 >= 0 && !r.0.starts_with("gpu.")), "per-CPU kernel counters: {local:?}");
    let missing: Vec<&Row> = local.difference(&remote).take(5).collect();
    let extra: Vec<&Row> = remote.difference(&local).take(5).collect();
    assert!(missing.is_empty() && extra.is_empty(), "not in ClickHouse: {missing:?}; only there: {extra:?}");
    eprintln!("[{a}, {b}): {} counter rows match, {} of them gpu.0.util", local.len(), util.len());
}

/// An off-CPU wait is counted when it ends, in the seconds it covered (its last 8): rows
/// written into seconds the shipper had already sent. They reach ClickHouse all the same: the
/// seconds before the cursor are sent again each step, and a row sent again replaces the one
/// sent (the reads take one row per key).
#[test]
fn a_long_wait_counted_after_its_seconds_were_shipped_reaches_clickhouse() {
    let test = "a_long_wait_counted_after_its_seconds_were_shipped_reaches_clickhouse";
    if !privileged(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    // And to an OTLP receiver, which takes a row sent again as more time: there the weighted
    // stores go 10 s behind the samples, each second sent once.
    let (otlp_url, received) = integration_tests::otlp::receiver(0);
    let config = tmp.path().join("profiler.toml");
    std::fs::write(&config, "[otlp]\ninterval = \"1s\"\n").unwrap();
    let (url, config) = (ch.url(), config.to_str().unwrap().to_string());
    let args =
        ["--listen", "off", "--node", NODE, "--clickhouse", &url, "--otlp-endpoint", &otlp_url, "--config", &config];
    let mut daemon = Daemon::start(&data, &args);
    daemon.wait_ready();
    // One wait of 9 s in one sleep, under a name of its own: after short ones (a thread's
    // first long wait arms the walk of its stack), and alive a while after (its name is read
    // when its wait is drained).
    let script = "import ctypes, time\n\
                  ctypes.CDLL(None).prctl(15, b'long-nap', 0, 0, 0)\n\
                  for _ in range(5):\n    time.sleep(0.01)\n\
                  time.sleep(9)\ntime.sleep(3)\n";
    let start = now_secs();
    let mut napper = Command::new("python3").args(["-c", script]).spawn().unwrap();
    let pid = napper.id();
    assert!(napper.wait().unwrap().success());
    let end = now_secs();
    let (a, b) = (start.floor() as u64, end.ceil() as u64);
    // Counted within a drain of its end, then shipped once the cursor passes it.
    wait_shipped(&data, (b + 1) * SEC);
    let dir = data.to_str().unwrap();
    let local: u64 = folded_window(dir, a as f64, b as f64, &["--samples", "off-cpu", "--pid", &pid.to_string()])
        .unwrap_or_default()
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert!(local >= 7_000_000, "the 9 s wait's last 8 s in the store: {local} µs");
    let remote = ch.number(&format!(
        "SELECT sum(value) FROM profiler.cuda_samples FINAL WHERE {} AND kind = 'off-cpu' AND pid = {pid}",
        range(a * SEC, b * SEC)
    ));
    eprintln!("a 9 s wait: {local} µs in the store, {remote} µs in ClickHouse");
    assert_eq!(remote, local, "the seconds counted after they were shipped");
    let pushed = wait_for("the wait at the OTLP receiver", Duration::from_secs(60), || {
        let ns = otlp_total::total(&received.lock().unwrap().accepted, "off_cpu", i64::from(pid));
        (ns >= local as i64 * 1_000).then_some(ns)
    });
    assert_eq!(pushed, local as i64 * 1_000, "the wait pushed over OTLP, once");
    daemon.stop();
}

#[test]
fn schema_and_folded_query_run_on_current_clickhouse() {
    let mut statements =
        schema::statements(&schema::Layout { database: "p", cluster: None, ttl_secs: Some(604_800), codecs: true });
    let (main, sys) = (frame_id("main"), frame_id("do_syscall_64"));
    // A stack and a frame sent twice (two nodes of a shard): one row each is read.
    statements
        .push(format!("INSERT INTO p.stack_frames VALUES (7, [{main}, {sys}], [0, 1]), (7, [{main}, {sys}], [0, 1])"));
    statements
        .push(format!("INSERT INTO p.frames VALUES ({main}, 'main'), ({sys}, 'do_syscall_64'), ({main}, 'main')"));
    // A row of now: the table's TTL (7 days) may drop an older one in a background merge before
    // the query (a row at ts 5, 1970, came back empty on one run out of many).
    let ts = now_secs() as u64 * SEC;
    statements.push(format!("INSERT INTO p.samples VALUES ('{NODE}', {ts}, 1, 2, 3, 'bash', 7, '', 4)"));
    statements.push(folded_sql("p", &range(ts - 5 * SEC, ts + 5 * SEC)).replace(" FORMAT JSONEachRow", " FORMAT TSV"));
    // What the fleet's reads ask (`fleet::stack_text`).
    statements.push("SELECT stack_id, any(frame_ids), any(kernel) FROM p.stack_frames WHERE stack_id IN (7) GROUP BY stack_id FORMAT TSV".into());
    statements.push(format!(
        "SELECT frame_id, any(name) FROM p.frames WHERE frame_id IN ({main}, {sys}) GROUP BY frame_id ORDER BY frame_id FORMAT TSV"
    ));
    let Some(answers) = clickhouse::chdb(&statements) else { return };
    let n = answers.len();
    assert_eq!(answers[n - 3].trim(), "bash\t7\t4", "the folded query on chdb");
    assert_eq!(answers[n - 2].trim(), format!("7\t[{main},{sys}]\t[0,1]"), "a stack as frame ids");
    let mut names = [(main, "main"), (sys, "do_syscall_64")];
    names.sort();
    let want: Vec<String> = names.iter().map(|(id, n)| format!("{id}\t{n}")).collect();
    assert_eq!(answers[n - 1].trim(), want.join("\n"), "each frame once");
}

/// Runs a shipper over `data` until its cursor passes `to`; returns its figures.
fn ship_until(ch: &ClickHouse, data: &Path, to: u64, batch_rows: usize) -> Stats {
    ship_while(ch, data, batch_rows, 86_400, || wait_shipped(data, to))
}

/// Runs a shipper (the store's age limit `max_age_secs`) while `wait` waits.
fn ship_while(ch: &ClickHouse, data: &Path, batch_rows: usize, max_age_secs: u64, wait: impl FnOnce()) -> Stats {
    use profiler::ship::clickhouse::FileConfig;
    let file = FileConfig { batch_rows: Some(batch_rows), ..Default::default() };
    ship_with(&ch.url(), NODE, data, &file, max_age_secs, wait)
}

#[test]
fn a_lost_cursor_sends_nothing_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    let (start, end) = synthetic_store(&data, 3, 60);
    let first = ship_until(&ch, &data, end, 1000);
    let rows = first.sample_rows;
    assert_eq!(rows, 60 * 50 * 3, "every synthetic sample shipped");
    assert_eq!(first.errors.values().sum::<u64>(), 0);
    assert!(first.stacks >= 20);
    assert_caught_up(&ch, &data, "first run");
    let status = integration_tests::status_json(&data).expect("profiler status --format json");
    assert_eq!(status["clickhouse"]["next_ns"].as_u64(), cursor_ns(&data), "the cursor in `profiler status`");

    // The worst case of a crash between an insert and the cursor write: no cursor at all (a
    // data directory restored from a backup). Every batch the server holds is skipped.
    std::fs::remove_file(data.join("ship/clickhouse.cursor")).unwrap();
    let second = ship_until(&ch, &data, end, 1000);
    assert_eq!(second.sample_rows, 0, "nothing sent again");
    assert!(second.batches_already_there >= 6, "each 10 s batch found there");
    assert_caught_up(&ch, &data, "after the lost cursor");
    assert_eq!(ch.number(&format!("SELECT count() FROM profiler.samples WHERE {}", range(start, end))), rows);
}

/// 18.16 has no TTL: the shipper drops the day partitions past the store's age limit itself.
/// A server with TTL gets a table whose TTL is that limit instead: checked, and the drop, not
/// checkable there, goes through the skip rule (a failure under CI).
#[test]
fn days_past_the_retention_are_dropped_on_a_server_without_ttl() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let version = ch.query("SELECT version()").unwrap();
    let data = tmp.path().join("data");
    if !schema::supports_ttl(schema::parse_version(&version).expect("a version")) {
        // A minute three days ago.
        let (start, end) = synthetic_store_ending(&data, 2, 60, (now_secs() as u64 - 3 * 86_400) * SEC);
        let shipped = ship_until(&ch, &data, end, 1000);
        assert_eq!(shipped.sample_rows, 60 * 50 * 2);
        // A shipper with a one-day limit drops that day on its first step.
        let count = || ch.number(&format!("SELECT count() FROM profiler.samples WHERE {}", range(start, end)));
        ship_while(&ch, &data, 1000, 86_400, || {
            wait_for("the old day dropped", Duration::from_secs(30), || (count() == 0).then_some(()))
        });
    } else {
        // This server expires rows itself: the table has a TTL of the retention instead.
        let (_, end) = synthetic_store(&data, 1, 2);
        ship_until(&ch, &data, end, 1000);
        let table = ch.query("SHOW CREATE TABLE profiler.samples").unwrap();
        assert!(table.contains("TTL") && table.contains("86400"), "no TTL of a day: {table}");
        // The shipper's own drop, the subject here, needs a server without TTL (Debian's 18.16,
        // which `cargo xtask test` installs).
        skip(&format!(
            "days_past_the_retention_are_dropped_on_a_server_without_ttl: {} is ClickHouse {}, which has TTL",
            clickhouse::SERVER,
            version.trim()
        ));
    }
}

/// Ingest rate of one shipper into one 18.16 server (a figure, not a check: `--ignored`).
#[test]
#[ignore]
fn ingest_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    let (_, end) = synthetic_store(&data, 32, 300);
    let t = std::time::Instant::now();
    let stats = ship_until(&ch, &data, end, 200_000);
    let secs = t.elapsed().as_secs_f64();
    let rows = stats.sample_rows;
    let bytes = stats.bytes;
    // 32 CPUs x 300 s at 50 Hz, every one shipped once: a figure from a run that lost rows is none.
    assert_eq!(rows, 32 * 300 * 50, "rows shipped");
    assert_eq!(ch.number("SELECT count() FROM profiler.samples"), rows, "rows in ClickHouse");
    eprintln!(
        "{rows} rows in {secs:.1} s: {:.0} rows/s, {:.1} bytes per row on the wire",
        rows as f64 / secs,
        bytes as f64 / rows as f64
    );
}

/// What shipping costs a big node: a 192-CPU node's minute at 99 Hz (1.1 M samples, 2,000
/// distinct stacks) replayed from a store into one 18.16 server; the CPU time of this process
/// (the shipper, the server is another) per second of samples is the share of one core the
/// shipper takes on such a node (a figure, not a check: `--ignored`).
#[test]
#[ignore]
fn shipping_cost_of_a_192_cpu_node() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    let secs = 60;
    let (_, end) = synthetic_store_with(&data, 192, secs, (now_secs() as u64 - 30) * SEC, 99, 2_000);
    let cpu_secs = || {
        // SAFETY: getrusage fills the struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(r.ru_utime) + t(r.ru_stime)
    };
    let (t0, c0) = (std::time::Instant::now(), cpu_secs());
    let stats = ship_until(&ch, &data, end, 200_000);
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - c0);
    let rows = stats.sample_rows;
    // One sample per CPU every SEC / 99 ns (rounded down) over the minute, as the store was written.
    let steps = (secs * SEC).div_ceil(SEC / 99);
    assert_eq!(rows, 192 * steps, "rows shipped");
    assert_eq!(ch.number("SELECT count() FROM profiler.samples"), rows, "rows in ClickHouse");
    let on_disk = ch.number(
        "SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = 'profiler' AND table = 'samples'",
    );
    eprintln!(
        "192 CPUs x {secs} s at 99 Hz: {rows} rows shipped in {wall:.1} s; shipper CPU {cpu:.2} s = {:.2} % of one core \
         over the node's {secs} s; {:.1} bytes per sample on the wire, {:.1} in ClickHouse",
        100.0 * cpu / secs as f64,
        stats.bytes as f64 / rows as f64,
        on_disk as f64 / rows as f64
    );
}

/// The rollups' answers and the raw samples' grouped the same way, as (what, rollup SQL, raw
/// SQL), TSV: per node and minute (what the fleet reads), per minute's whole key, per hour, per
/// hour's whole key.
fn rollup_checks(db: &str) -> Vec<(&'static str, String, String)> {
    let (m, h) = (schema::MINUTE_NS, schema::HOUR_NS);
    let pair = |what, rollup: &str, key: &str, raw_key: &str, grouped: &str| {
        (
            what,
            format!("SELECT {key}, sum(count) FROM {db}.{rollup} GROUP BY {key} ORDER BY {key} FORMAT TSV"),
            format!("SELECT {raw_key}, sum(count) FROM {db}.samples GROUP BY {grouped} ORDER BY {grouped} FORMAT TSV"),
        )
    };
    let minute = format!("intDiv(ts, {m}) * {m} AS minute");
    let hour = format!("intDiv(ts, {h}) * {h} AS hour");
    // The hourly rollup keeps a workload's class (namespace, container name, unit), not its pod.
    let class = format!("{} AS class", schema::workload_class("workload"));
    vec![
        pair("samples_1m per node and minute", "samples_1m", "node, ts", &format!("node, {minute}"), "node, minute"),
        pair(
            "samples_1m per node, minute, comm, stack and workload",
            "samples_1m",
            "node, ts, comm, stack_id, workload",
            &format!("node, {minute}, comm, stack_id, workload"),
            "node, minute, comm, stack_id, workload",
        ),
        pair("samples_1h per hour", "samples_1h", "ts", &hour, "hour"),
        pair(
            "samples_1h per hour, comm, stack and workload class",
            "samples_1h",
            "ts, comm, stack_id, workload",
            &format!("{hour}, comm, stack_id, {class}"),
            "hour, comm, stack_id, class",
        ),
        // The fleet's minutes and 10 minutes by class (the 10 minutes summed from the minutes'
        // inserts by a view of their table).
        pair(
            "samples_fleet_1m per minute, comm, stack and workload class",
            "samples_fleet_1m",
            "ts, comm, stack_id, workload",
            &format!("{minute}, comm, stack_id, {class}"),
            "minute, comm, stack_id, class",
        ),
        pair(
            "samples_fleet_10m per 10 minutes, comm, stack and workload class",
            "samples_fleet_10m",
            "ts, comm, stack_id, workload",
            &format!("intDiv(ts, {t}) * {t} AS ten, comm, stack_id, {class}", t = schema::TEN_MINUTES_NS),
            "ten, comm, stack_id, class",
        ),
        // Days from the hours' inserts.
        pair(
            "samples_1d per day, comm, stack and workload class",
            "samples_1d",
            "ts, comm, stack_id, workload",
            &format!("intDiv(ts, {d}) * {d} AS day, comm, stack_id, {class}", d = schema::DAY_NS),
            "day, comm, stack_id, class",
        ),
        // The fleet's seconds, what a fleet-wide window's edges are read from.
        pair(
            "samples_fleet_1s per second, comm, stack and workload class",
            "samples_fleet_1s",
            "ts, comm, stack_id, workload",
            &format!("intDiv(ts, {s}) * {s} AS second, comm, stack_id, {class}", s = schema::SECOND_NS),
            "second, comm, stack_id, class",
        ),
        // Which nodes ran each stack, per hour: what `profiler fleet` counts them from.
        pair(
            "stack_nodes_1h per hour, stack, comm and node",
            "stack_nodes_1h",
            "ts, stack_id, comm, node",
            &format!("{hour}, stack_id, comm, node"),
            "hour, stack_id, comm, node",
        ),
    ]
}

/// A window with edges inside minutes (`a` and `b` whole seconds, not whole minutes), as the
/// planner reads it for the whole fleet: its whole minutes from `samples_fleet_1m`, the seconds
/// around them from `samples_fleet_1s`; and the raw rows of the same window, by (comm, stack,
/// workload class): (rollups' SQL, raw SQL), TSV.
fn edges_check(db: &str, a: u64, b: u64) -> (String, String) {
    let m = schema::MINUTE_NS;
    let (ma, mb) = (a.div_ceil(m) * m, b / m * m);
    assert!(!a.is_multiple_of(m) && !b.is_multiple_of(m) && ma < mb, "edges inside minutes, whole minutes between");
    let class = schema::workload_class("workload");
    let key = "comm, stack_id, workload";
    (
        format!(
            "SELECT {key}, sum(count) AS n FROM (\
             SELECT {key}, count FROM {db}.samples_fleet_1s WHERE ts >= {a} AND ts < {ma} UNION ALL \
             SELECT {key}, count FROM {db}.samples_fleet_1m WHERE ts >= {ma} AND ts < {mb} UNION ALL \
             SELECT {key}, count FROM {db}.samples_fleet_1s WHERE ts >= {mb} AND ts < {b}) \
             GROUP BY {key} ORDER BY {key} FORMAT TSV"
        ),
        format!(
            "SELECT comm, stack_id, {class} AS cls, sum(count) AS n FROM {db}.samples WHERE ts >= {a} AND ts < {b} \
             GROUP BY comm, stack_id, cls ORDER BY comm, stack_id, cls FORMAT TSV"
        ),
    )
}

/// Every rollup answer equals the raw samples' (`answer` runs a query), and they hold `total`
/// samples.
fn assert_rollups_match(what: &str, total: u64, answer: impl Fn(&str) -> String) {
    for (check, rollup, raw) in rollup_checks("profiler") {
        let (rollup, raw) = (answer(&rollup), answer(&raw));
        assert!(!raw.trim().is_empty(), "{what}: no samples");
        assert_eq!(rollup, raw, "{what}: {check}");
        let sum: u64 = rollup.lines().map(|l| l.rsplit('\t').next().unwrap().parse::<u64>().unwrap()).sum();
        assert_eq!(sum, total, "{what}: {check} adds up to every sample");
    }
}

/// The rollups (issue 39), made by ClickHouse 18.16's materialized views from the shipper's
/// inserts: per minute and node, and per hour fleet-wide, they are what the raw samples add up
/// to. A database from before the views gets them on the next start, from then on.
#[test]
fn rollups_add_up_to_the_raw_samples_on_18_16() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    // Two and a half minutes of 3 CPUs at 50 Hz, in inserts of 1,000 rows or so: the views sum
    // each inserted block, the tables' merges and the reads the rest.
    let (_, end) = synthetic_store(&data, 3, 150);
    let shipped = ship_until(&ch, &data, end, 1000);
    assert_eq!(shipped.sample_rows, 150 * 50 * 3);
    let answer = |sql: &str| ch.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_rollups_match("18.16", 150 * 50 * 3, answer);
    let minutes = ch.number("SELECT uniqExact(ts) FROM profiler.samples_1m");
    assert!(minutes >= 3, "150 s over {minutes} minutes");
    // A window with edges inside minutes: the fleet's seconds and minutes, the raw rows' sums.
    let first = ch.number("SELECT min(ts) FROM profiler.samples") / SEC * SEC;
    let m = schema::MINUTE_NS;
    let a = if (first + SEC).is_multiple_of(m) { first + 2 * SEC } else { first + SEC };
    let b = (a.div_ceil(m) + 1) * m + 7 * SEC;
    let (edges, edges_raw) = edges_check("profiler", a, b);
    let (edges, edges_raw) = (answer(&edges), answer(&edges_raw));
    assert_eq!(edges, edges_raw, "18.16: a window with edges inside minutes");
    let in_window: u64 = edges.lines().map(|l| l.rsplit('\t').next().unwrap().parse::<u64>().unwrap()).sum();
    assert!(in_window >= 60 * 50 * 3, "{in_window} samples from {a} to {b}");

    // A database from before the rollups: the next start creates them, and they count what is
    // inserted from then on only.
    for table in ["samples_1m_mv", "samples_1h_mv", "samples_1m", "samples_1h"] {
        ch.query(&format!("DROP TABLE profiler.{table}")).unwrap();
    }
    let later = tmp.path().join("later");
    let (_, end) = synthetic_store(&later, 2, 20);
    let file = profiler::ship::clickhouse::FileConfig { batch_rows: Some(1000), ..Default::default() };
    ship_with(&ch.url(), "ch-later", &later, &file, 86_400, || wait_shipped(&later, end));
    for rollup in ["samples_1m", "samples_1h"] {
        let sum = ch.number(&format!("SELECT sum(count) FROM profiler.{rollup}"));
        assert_eq!(sum, 20 * 50 * 2, "{rollup}: the later node's samples, not the earlier ones");
    }
    let nodes = ch.query("SELECT DISTINCT node FROM profiler.samples_1m").unwrap();
    assert_eq!(nodes.trim(), "ch-later");
    eprintln!("18.16: rollups of {} samples over {minutes} minutes match the raw samples", 150 * 50 * 3);
}

/// The same views on today's ClickHouse (chdb, whose analyzer reads aliases as newer servers do):
/// the schema with codecs and TTLs, inserts in blocks of 1,000 rows over two nodes and four
/// hours, and the same sums.
#[test]
fn rollups_add_up_to_the_raw_samples_on_current_clickhouse() {
    let layout = schema::Layout { database: "profiler", cluster: None, ttl_secs: Some(604_800), codecs: true };
    let mut statements = schema::statements(&layout);
    let start = (now_secs() as u64 - 4 * 3600) * SEC;
    for insert in 0..3u64 {
        // 10,000 rows 1.23 s apart (3.4 h), counts 1 to 5: 30,000 samples an insert.
        statements.push(format!(
            "INSERT INTO profiler.samples SELECT if(number % 2 = 0, 'n1', 'n2'), {start} + {insert} + number * 1234567891, \
             toUInt16(number % 4), 1, 2, ['app', 'db', 'web'][number % 3 + 1], number % 7, \
             if(number % 5 = 0, concat('{{\"container_id\":null,\"pod_uid\":\"u', toString(number % 3), \
             '\",\"pod_namespace\":\"ml\",\"pod_name\":\"trainer-', toString(number % 3), \
             '\",\"container_name\":\"t\",\"unit\":null}}'), ''), \
             toUInt32(number % 5 + 1) FROM numbers(10000) SETTINGS max_block_size = 1000, max_insert_block_size = 1000"
        ));
    }
    let checks = rollup_checks("profiler");
    for (_, rollup, raw) in &checks {
        statements.extend([rollup.clone(), raw.clone()]);
    }
    // Edges 17 s into a minute and 23 s before one, over an hour of the 3.4 h.
    let off_minute = |t: u64| if t.is_multiple_of(schema::MINUTE_NS) { t + SEC } else { t };
    let (a, b) = (off_minute(start + 77 * SEC), off_minute(start + 3637 * SEC));
    let (edges, edges_raw) = edges_check("profiler", a, b);
    statements.extend([edges, edges_raw]);
    for table in ["samples_1m", "samples_1h"] {
        statements.push(format!("SHOW CREATE TABLE profiler.{table} FORMAT TSVRaw"));
    }
    statements.push(
        "SELECT DISTINCT concat('[', workload, ']') AS w FROM profiler.samples_1h ORDER BY w FORMAT TSVRaw".into(),
    );
    let Some(answers) = clickhouse::chdb(&statements) else { return };
    let mut answers = answers.into_iter().skip(statements.len() - 2 * checks.len() - 5);
    let mut next = || answers.next().unwrap();
    let asked: Vec<(String, String)> = checks.iter().map(|_| (next(), next())).collect();
    let (edges, edges_raw) = (next(), next());
    assert_eq!(edges, edges_raw, "chdb: a window with edges inside minutes, from the fleet's seconds and minutes");
    let in_window: u64 = edges.lines().map(|l| l.rsplit('\t').next().unwrap().parse::<u64>().unwrap()).sum();
    assert!(in_window > 5_000, "{in_window} samples in the window");
    for ((what, _, _), (rollup, raw)) in checks.iter().zip(&asked) {
        assert_eq!(rollup, raw, "chdb: {what}");
        let sum: u64 = rollup.lines().map(|l| l.rsplit('\t').next().unwrap().parse::<u64>().unwrap()).sum();
        assert_eq!(sum, 3 * 30_000, "chdb: {what} adds up to every sample");
    }
    assert!(asked[0].0.lines().count() > 200, "minutes of two nodes: {}", asked[0].0.lines().count());
    assert!(asked[2].0.lines().count() >= 4, "hours: {}", asked[2].0);
    let (minutes, hours, classes) = (next(), next(), next());
    // Three pods of one job, one class: the hours hold it once.
    let classes: Vec<&str> = classes.lines().collect();
    assert_eq!(classes, ["[]", "[{\"pod_namespace\":\"ml\",\"container_name\":\"t\"}]"], "the hours' workloads");
    assert!(minutes.contains("SummingMergeTree") && minutes.contains(&format!("toIntervalSecond({})", 30 * 86_400)));
    assert!(hours.contains("SummingMergeTree") && hours.contains(&format!("toIntervalSecond({})", 365 * 86_400)));
}

/// With a cluster each shard rolls up the rows it receives: a node's minutes are on its shard
/// only, and the Distributed rollup tables answer the fleet's sums through either shard.
#[test]
fn rollups_land_on_each_nodes_shard_and_read_through_either_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let nodes = ["rollup-a", "rollup-b"];
    let file = profiler::ship::clickhouse::FileConfig {
        batch_rows: Some(1000),
        cluster: Some("fleet".into()),
        ..Default::default()
    };
    // Both shards have their tables before the first node ships (a fleet's other nodes make
    // them; here, the statements the shippers run): the Distributed tables read both.
    let layout = schema::Layout { database: "profiler", cluster: Some("fleet"), ttl_secs: None, codecs: false };
    for shard in &shards {
        for statement in schema::statements(&layout) {
            shard.query(&statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        let data = tmp.path().join(node);
        let (_, end) = synthetic_store(&data, 2 + i as u32, 90);
        ship_with(&shards[i].url(), node, &data, &file, 86_400, || wait_shipped(&data, end));
    }
    let total = 90 * 50 * (2 + 3);
    for (i, node) in nodes.iter().enumerate() {
        let on =
            |s: &ClickHouse| s.number(&format!("SELECT count() FROM profiler.samples_1m_local WHERE node = '{node}'"));
        assert!(on(&shards[i]) > 0 && on(&shards[1 - i]) == 0, "{node}'s minutes are on shard {} only", i + 1);
        let hours = shards[i].number("SELECT sum(count) FROM profiler.samples_1h_local");
        assert_eq!(hours, 90 * 50 * (2 + i as u64), "shard {}'s hours are its node's samples", i + 1);
    }
    for shard in &shards {
        let answer = |sql: &str| shard.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_rollups_match("two shards", total, answer);
    }
    eprintln!("2 shards: each node's rollups on its shard, the Distributed rollups equal the raw sums");
}

/// Each rollup table keeps its own retention on 18.16 (no TTL): the shipper drops the day
/// partitions of `samples_1m` past `rollup_1m_days` and the 30-day partitions of `samples_1h`
/// past `rollup_1h_days`, beside the raw tables' days past the store's `max_age`.
#[test]
fn rollups_keep_their_own_retention_on_a_server_without_ttl() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let version = ch.query("SELECT version()").unwrap();
    if schema::supports_ttl(schema::parse_version(&version).expect("a version")) {
        // There the tables carry TTLs instead (checked on chdb).
        skip(&format!(
            "rollups_keep_their_own_retention_on_a_server_without_ttl: {} is ClickHouse {}, which has TTL",
            clickhouse::SERVER,
            version.trim()
        ));
        return;
    }
    use profiler::ship::clickhouse::FileConfig;
    let now = now_secs() as u64;
    // A minute 100 days ago and one 3 days ago, from two data directories of the node.
    let (old, recent) = (tmp.path().join("old"), tmp.path().join("recent"));
    let (old_start, old_end) = synthetic_store_ending(&old, 2, 60, (now - 100 * 86_400) * SEC);
    let (recent_start, recent_end) = synthetic_store_ending(&recent, 2, 60, (now - 3 * 86_400) * SEC);
    let sum = |table: &str, a: u64, b: u64| {
        ch.number(&format!(
            "SELECT sum(count) FROM profiler.{table} WHERE ts >= {} AND ts < {b}",
            a / 3600 / SEC * 3600 * SEC
        ))
    };
    ship_until(&ch, &old, old_end, 1000);
    // The defaults (raw: a day here; minutes 30 days; hours a year) drop the old minute's raw
    // rows and minutes when the next shipper starts, and keep its hour.
    ship_until(&ch, &recent, recent_end, 1000);
    assert_eq!(sum("samples", old_start, old_end), 0, "raw rows of 100 days ago, past a day");
    assert_eq!(sum("samples_1m", old_start, old_end), 0, "minutes of 100 days ago, past 30 days");
    assert_eq!(sum("samples_1h", old_start, old_end), 60 * 50 * 2, "hours of 100 days ago, within a year");
    assert_eq!(sum("samples_1m", recent_start, recent_end), 60 * 50 * 2);
    // A day of minutes and 30 days of hours: the recent minute's minutes go (its hour stays),
    // and the old hour's 30-day partition, which ended 70 days ago at the latest.
    let file =
        FileConfig { batch_rows: Some(1000), rollup_1m_days: Some(1), rollup_1h_days: Some(30), ..Default::default() };
    ship_with(&ch.url(), NODE, &recent, &file, 86_400, || {
        wait_for("the old partitions dropped", Duration::from_secs(30), || {
            (sum("samples_1m", recent_start, recent_end) == 0 && sum("samples_1h", old_start, old_end) == 0)
                .then_some(())
        })
    });
    assert_eq!(sum("samples_1h", recent_start, recent_end), 60 * 50 * 2, "the recent hour, within 30 days");
    assert_eq!(sum("samples", recent_start, recent_end), 0, "raw rows of 3 days ago, past a day");
}

/// A flamegraph of hours read through ClickHouse takes its whole hours from the hourly rollup,
/// the whole 10 minutes and minutes around them from the fleet's rollups (a node's own minutes
/// with `--node`) and its edges from raw rows (issue 39 parts 2 and 5), and is still the node
/// store's answer, byte for byte: the rollups' totals are the raw rows'.
#[test]
fn a_flamegraph_read_from_the_rollups_is_the_stores_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let data = tmp.path().join("data");
    // Two and a half hours of 2 CPUs at 5 Hz, 40 stacks in turn: 90,000 samples.
    let (start, end) = synthetic_store_with(&data, 2, 9000, (now_secs() as u64 - 30) * SEC, 5, 40);
    ship_until(&ch, &data, end, 20_000);
    // Edges inside seconds, so every kind of part is read.
    let (a, b) = (start + 61 * SEC + SEC / 2, end - 20 * SEC - SEC / 4);
    let (from, to) = (profiler::timespec::format(a), profiler::timespec::format(b));
    let dir = data.to_str().unwrap();
    let read = |source: &[&str]| {
        let out = profiler(&[&["flamegraph", "--format", "folded", "--from", &from, "--to", &to][..], source].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (store, _) = read(&["--data-dir", dir]);
    // The whole fleet: its own tables by class around the hours.
    let (fleet, rolled) = read(&["--clickhouse", &ch.url()]);
    assert!(
        rolled.contains("samples_1h") && rolled.contains("samples_fleet_1m") && rolled.contains("samples "),
        "{rolled}"
    );
    // The seconds around the minutes from the fleet's seconds, raw rows only within a second.
    let raw = rolled.split("samples ").nth(1).and_then(|r| r.split([',', '\n']).next()).unwrap_or_default();
    assert!(rolled.contains("samples_fleet_1s") && raw.trim() == "1.250s", "{rolled}");
    let total: u64 =
        String::from_utf8_lossy(&store).lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert!(total > 80_000, "{total} samples in the window");
    assert!(
        store == fleet,
        "the rollups' answer differs from the store's:\n--- store\n{}\n--- ClickHouse\n{}",
        String::from_utf8_lossy(&store),
        String::from_utf8_lossy(&fleet)
    );
    // --cpu is not in the rollups: raw rows answer, the same.
    let (store, _) = read(&["--data-dir", dir, "--cpu", "0"]);
    let (fleet, note) = read(&["--clickhouse", &ch.url(), "--cpu", "0"]);
    assert!(!note.contains("samples_1") && store == fleet, "{note}");
    eprintln!("{total} samples from {from} to {to}: {} (with --cpu: {})", rolled.trim(), note.trim());
}
