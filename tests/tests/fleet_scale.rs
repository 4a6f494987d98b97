//! The fleet at scale (issue 39, part 5), `cargo xtask bench fleet`: N synthetic GPU training
//! nodes (`fleet_scale/synth.rs`) written as their daemons would have, shipped by the real
//! shipper (`ship::clickhouse`, `cluster = "fleet"`) into a private cluster of two ClickHouse
//! 18.16 shards with Distributed tables, half the nodes to each; then the reads a user makes of a
//! fleet, each timed as the median of 7 runs of the `profiler` binary, with what the servers
//! read for it (`system.query_log`). Ignored: it is a benchmark (a thousand nodes take most of
//! an hour and ~20 GB here); `FLEET_NODES=4 FLEET_SECS=60 FLEET_BIG_SECS=60 FLEET_ROLLUP_DAYS=2`
//! is a two-minute run of the whole path.
//!
//! Knobs (environment, set by `cargo xtask bench fleet --nodes N --cpus C --gpus G --minutes M`):
//! FLEET_NODES (1000), FLEET_CPUS (16), FLEET_GPUS (8), FLEET_SECS (600) size the fleet;
//! FLEET_BIG_CPUS (192) and FLEET_BIG_SECS (3600) the one big node beside it (0: none);
//! FLEET_ROLLUP_DAYS (30): days of hourly rollup rows written directly on the servers before the
//! raw data (a 30-day fleet's raw rows would not fit); FLEET_SHIPPERS (16): shippers at once;
//! FLEET_DIR: where the servers and stores go (default a temporary directory); FLEET_HOLD: a
//! file written with the URL before the reads, which wait until it is removed; FLEET_SHIPPED
//! (FLEET_NODES): of the nodes, how many are written and shipped (ingest is measured on them),
//! the rest copied from them by the servers (`fleet_scale/clone.rs`), for fleets larger than
//! this machine writes and ships in a session.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use integration_tests::{
    clickhouse::{ClickHouse, cursor_ns},
    now_secs, profiler, wait_for,
};
use profiler::ship::{
    SharedStats, Stats,
    clickhouse::{Config, FileConfig, Shipper, schema},
};

#[path = "fleet_scale/clone.rs"]
mod clone;
#[path = "fleet_scale/synth.rs"]
mod synth;

const SEC: u64 = 1_000_000_000;
const HOUR: u64 = 3600;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// utime + stime of a process, seconds (`/proc/PID/stat` fields 14 and 15).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    f.iter().sum::<u64>() as f64 / tick
}

/// The pid of the server whose config is in `dir` (the harness keeps its child private).
fn server_pid(dir: &Path) -> u32 {
    let want = format!("--config-file={}", dir.join("config.xml").display());
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmd.split(|&b| b == 0).any(|a| a == want.as_bytes()) {
            return pid;
        }
    }
    panic!("no clickhouse-server runs with {want}");
}

/// Both servers' CPU seconds so far.
fn servers_cpu(pids: &[u32]) -> f64 {
    pids.iter().map(|&p| cpu_secs(p)).sum()
}

/// Ships every node (name, data dir, shard) with the real shipper, `at_once` at a time, each
/// until its cursor passes `to` (a fleet catching up: each node's whole window at once).
fn ship(shards: &[ClickHouse], nodes: &[(String, PathBuf, usize)], to: u64, at_once: usize) -> Vec<Stats> {
    type Running = (usize, tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>, SharedStats);
    let mut stats = vec![Stats::default(); nodes.len()];
    let mut running: Vec<Running> = Vec::new();
    let mut next = 0;
    while next < nodes.len() || !running.is_empty() {
        while running.len() < at_once && next < nodes.len() {
            let (node, data, shard) = &nodes[next];
            let file = FileConfig { batch_rows: Some(500_000), cluster: Some("fleet".into()), ..Default::default() };
            let config = Config::resolve(Some(shards[*shard].url()), Some(&file), node, data.clone(), 40 * 86_400)
                .unwrap()
                .unwrap();
            let (stop, stop_rx) = tokio::sync::watch::channel(false);
            let s = SharedStats::default();
            let t = profiler::ship::spawn(Shipper { config, stats: s.clone(), stop: stop_rx }).unwrap();
            running.push((next, stop, t, s));
            next += 1;
        }
        let done = wait_for("a shipper to finish", Duration::from_secs(1800), || {
            running.iter().position(|(i, ..)| cursor_ns(&nodes[*i].1).is_some_and(|c| c >= to))
        });
        let (i, stop, t, s) = running.swap_remove(done);
        let _ = stop.send(true);
        t.join().unwrap();
        // A failed request is retried by the shipper (counted in the figures); nothing lost or
        // doubled is checked on the servers' totals.
        stats[i] = s.lock().unwrap().clone();
    }
    stats
}

/// Runs `profiler args` 7 times: (median, min, max) ms and the last run's stdout and stderr, or
/// what the command said when it failed (a figure of the bench, not a panic: the other reads
/// still get measured).
fn median7(args: &[String]) -> Result<(f64, f64, f64, Vec<u8>, String), String> {
    let mut runs = Vec::new();
    let (mut out, mut err) = (Vec::new(), String::new());
    for _ in 0..7 {
        let t = Instant::now();
        let o = profiler(&args.iter().map(String::as_str).collect::<Vec<_>>());
        runs.push(t.elapsed().as_secs_f64() * 1000.0);
        err = String::from_utf8_lossy(&o.stderr).into_owned();
        if !o.status.success() {
            return Err(format!("FAILED in {:.0} ms: {}", runs[runs.len() - 1], err.trim()));
        }
        out = o.stdout;
    }
    runs.sort_by(f64::total_cmp);
    Ok((runs[3], runs[0], runs[6], out, err))
}

/// The queries that fetch stacks' text: `stacks` (stacks as text), `stack_frames` and `frames`
/// (the frames dictionary); sample queries name `stack_id`, never these.
const STACK_TEXT: &str = "(query LIKE '%stacks%' OR query LIKE '%frames%')";

/// What the servers did for one more run of `args`: the queries `system.query_log` holds from
/// a second that began before it, on both shards (rows and bytes read, peak memory, the
/// slowest query and its time).
fn server_side(shards: &[ClickHouse], args: &[String]) -> String {
    let now = |s: &ClickHouse| s.number("SELECT toUInt64(now())");
    let t0 = now(&shards[0]);
    wait_for("the servers' clock to turn a second", Duration::from_secs(5), || {
        shards.iter().all(|s| now(s) > t0).then_some(())
    });
    let from = t0 + 1;
    profiler(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut parts = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        s.query("SYSTEM FLUSH LOGS").unwrap();
        let a = s
            .query(&format!(
                "SELECT count(), sum(read_rows), sum(read_bytes), max(memory_usage), max(query_duration_ms), \
                 argMax(replaceRegexpAll(substring(query, 1, 90), '\\\\s+', ' '), query_duration_ms), \
                 countIf({TEXT}), sumIf(read_bytes, {TEXT}), sumIf(result_bytes, {TEXT} AND is_initial_query) \
                 FROM system.query_log WHERE type = 2 AND query_start_time >= {from} \
                 AND query NOT LIKE '%system.%' FORMAT TSV",
                TEXT = STACK_TEXT
            ))
            .unwrap_or_else(|e| format!("(no query_log: {e})"));
        let f: Vec<&str> = a.trim().split('\t').collect();
        if f.len() == 9 {
            let mb = |v: &str| v.parse::<f64>().unwrap_or(0.0) / 1e6;
            parts.push(format!(
                "shard {}: {} queries, {} rows, {:.0} MB read, peak {:.0} MB, slowest {} ms ({}); \
                 the stacks' text: {} queries, {:.1} MB read, {:.1} MB sent",
                i + 1,
                f[0],
                f[1],
                mb(f[2]),
                mb(f[3]),
                f[4],
                f[5],
                f[6],
                mb(f[7]),
                mb(f[8])
            ));
        } else {
            parts.push(format!("shard {}: {}", i + 1, a.trim()));
        }
    }
    parts.join("; ")
}

/// Writes the shard's stacks as text into `stacks_local`, as daemons before the frames
/// dictionary did, and drops the dictionary's `Distributed` tables (readers then read `stacks`
/// alone); the stacks written.
fn stacks_to_text(s: &ClickHouse) -> usize {
    let stacks =
        integration_tests::clickhouse::stacks_as_text_in(s, "profiler.frames_local", "profiler.stack_frames_local");
    let rows: Vec<String> = stacks
        .iter()
        .map(|(id, (frames, kernel))| {
            let frames: Vec<String> = frames.iter().map(|f| schema::quote_str(f)).collect();
            let kernel: Vec<String> = kernel.iter().map(u8::to_string).collect();
            format!("({id}, [{}], [{}])", frames.join(", "), kernel.join(", "))
        })
        .collect();
    for chunk in rows.chunks(1_000) {
        let sql = format!("INSERT INTO profiler.stacks_local VALUES {}", chunk.join(", "));
        s.query(&sql).unwrap_or_else(|e| panic!("stacks as text: {e}"));
    }
    for t in ["stack_frames", "frames"] {
        s.query(&format!("DROP TABLE profiler.{t}")).unwrap();
    }
    rows.len()
}

/// Bytes on disk of the stacks: as frame ids and the frames dictionary, and as text (`stacks`).
fn stack_bytes(d: &BTreeMap<String, u64>) -> u64 {
    ["stack_frames_local", "frames_local", "stacks_local"].iter().map(|t| d.get(*t).copied().unwrap_or(0)).sum()
}

/// Bytes on disk of each table (both shards' active parts), by table.
fn disk(shards: &[ClickHouse]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in shards {
        let a = s
            .query(
                "SELECT table, sum(bytes_on_disk) FROM system.parts WHERE active AND database = 'profiler' \
                 GROUP BY table FORMAT TSV",
            )
            .unwrap();
        for l in a.lines() {
            if let Some((t, b)) = l.split_once('\t') {
                *out.entry(t.to_string()).or_default() += b.parse::<u64>().unwrap_or(0);
            }
        }
    }
    out
}

fn du(path: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(path) else { return 0 };
    if m.is_dir() {
        std::fs::read_dir(path).map(|d| d.flatten().map(|e| du(&e.path())).sum()).unwrap_or(0)
    } else {
        m.len()
    }
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
#[ignore]
fn fleet_scale_benchmark() {
    let nodes = knob("FLEET_NODES", 1000);
    let shipped = knob("FLEET_SHIPPED", nodes).min(nodes);
    let cpus = knob("FLEET_CPUS", 16) as u32;
    let gpus = knob("FLEET_GPUS", 8) as u32;
    let secs = knob("FLEET_SECS", 600);
    let (big_cpus, big_secs) = (knob("FLEET_BIG_CPUS", 192) as u32, knob("FLEET_BIG_SECS", HOUR));
    let days = knob("FLEET_ROLLUP_DAYS", 30);
    let at_once = knob("FLEET_SHIPPERS", 16) as usize;
    let tmp =
        tempfile::tempdir_in(std::env::var_os("FLEET_DIR").unwrap_or_else(|| std::env::temp_dir().into())).unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let pids: Vec<u32> = dirs.iter().map(|d| server_pid(d)).collect();
    // Every shard has the tables before any node ships (stacks go through a Distributed table).
    let layout = schema::Layout { database: "profiler", cluster: Some("fleet"), ttl_secs: None, codecs: false };
    for s in &shards {
        for statement in schema::statements(&layout) {
            s.query(&statement).unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }
    let url = shards[0].url();
    let mut figures: Vec<(String, String)> = Vec::new();
    let mut say = |k: &str, v: String| {
        eprintln!("FLEET {k}: {v}");
        figures.push((k.to_string(), v));
    };

    // The fleet's window ends 30 s ago; the big node's hour ends with it.
    let end = (now_secs() as u64 - 30) * SEC;
    let start = end - secs * SEC;
    let t = Instant::now();
    let fleet = synth::Fleet::new(8, [4000, 1500, 300]);
    say(
        "stacks",
        format!(
            "{} distinct stacks fleet-wide: 8 jobs x (4,000 main thread, 1,500 data loader, 300 autograd) + 600 daemons' + kubelet's memcg stack",
            fleet.distinct()
        ),
    );
    let mut plans: Vec<(synth::NodePlan<'_>, PathBuf, usize)> = (0..shipped)
        .map(|i| {
            let name = format!("gpu-{i:04}");
            let data = tmp.path().join("stores").join(&name);
            let plan = synth::NodePlan {
                name,
                index: i,
                cpus,
                gpus,
                start_ns: start,
                secs,
                signature: synth::signature_of(i),
                fleet: &fleet,
            };
            (plan, data, (i % 2) as usize)
        })
        .collect();
    if big_cpus > 0 && big_secs > 0 {
        let plan = synth::NodePlan {
            name: "big-0000".into(),
            index: shipped,
            cpus: big_cpus,
            gpus,
            start_ns: end - big_secs * SEC,
            secs: big_secs,
            signature: synth::Signature::Healthy,
            fleet: &fleet,
        };
        plans.push((plan, tmp.path().join("stores/big-0000"), 0));
    }
    let written: Vec<synth::Written> = {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out = std::sync::Mutex::new(vec![synth::Written::default(); plans.len()]);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((plan, data, _)) = plans.get(i) else { break };
                        let w = plan.write(data);
                        out.lock().unwrap()[i] = w;
                    }
                });
            }
        });
        out.into_inner().unwrap()
    };
    let fleet_samples: u64 = written.iter().take(shipped as usize).map(|w| w.samples).sum();
    let samples: u64 = written.iter().map(|w| w.samples).sum();
    let ticks: u64 = written.iter().map(|w| w.ticks).sum();
    let points: u64 = written.iter().map(|w| w.counter_points).sum();
    let store_bytes = du(&tmp.path().join("stores"));
    say(
        "stores",
        format!(
            "{shipped} nodes x {cpus} CPUs x {gpus} GPUs x {secs} s ({fleet_samples} samples) + big-0000 ({big_cpus} CPUs x {big_secs} s, {} samples): {samples} samples of {ticks} ticks ({:.1} % busy), {points} GPU track points, written in {:.0} s, {:.2} GB of stores ({:.2} B per sample)",
            samples - fleet_samples,
            100.0 * samples as f64 / ticks.max(1) as f64,
            t.elapsed().as_secs_f64(),
            store_bytes as f64 / 1e9,
            store_bytes as f64 / samples.max(1) as f64
        ),
    );

    // Ingest: the servers' CPU while the shippers run, then until their merges are done.
    let to_ship: Vec<(String, PathBuf, usize)> =
        plans.iter().map(|(p, d, shard)| (p.name.clone(), d.clone(), *shard)).collect();
    let (cpu0, self0, t) = (servers_cpu(&pids), cpu_secs(std::process::id()), Instant::now());
    let stats = ship(&shards, &to_ship, end, at_once);
    let (wall, server, shippers) =
        (t.elapsed().as_secs_f64(), servers_cpu(&pids) - cpu0, cpu_secs(std::process::id()) - self0);
    wait_for("the servers' merges to finish", Duration::from_secs(3600), || {
        shards.iter().all(|s| s.number("SELECT count() FROM system.merges") == 0).then_some(())
    });
    let merged = servers_cpu(&pids) - cpu0;
    let rows: u64 = stats.iter().map(|s| s.sample_rows).sum();
    let wire: u64 = stats.iter().map(|s| s.bytes).sum();
    let counter_rows: u64 = stats.iter().map(|s| s.counter_rows).sum();
    let retries: u64 = stats.iter().map(|s| s.retries).sum();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    say(
        "ingest",
        format!(
            "{rows} sample rows ({samples} samples) and {counter_rows} GPU track rows from {} shippers ({at_once} at once) in {wall:.0} s ({:.0} samples/s wall): servers' CPU {server:.0} s while shipping = {:.2} M samples/s per server core; {merged:.0} s with their merges done = {:.2} M samples/s per server core; the shippers' own CPU {shippers:.0} s; {:.1} B per sample on the wire; {retries} requests retried; load {}",
            to_ship.len(),
            samples as f64 / wall,
            samples as f64 / server / 1e6,
            samples as f64 / merged / 1e6,
            wire as f64 / rows.max(1) as f64,
            load.trim()
        ),
    );
    let on_servers = shards.iter().map(|s| s.number("SELECT sum(count) FROM profiler.samples_local")).sum::<u64>();
    assert_eq!(on_servers, samples, "every sample written is on a shard");
    // The rest of the fleet, copied by the servers from the shipped nodes.
    let samples = if shipped < nodes {
        say("copies", clone::copies(&shards, shipped, nodes, secs));
        wait_for("the servers' merges to finish", Duration::from_secs(3600), || {
            shards.iter().all(|s| s.number("SELECT count() FROM system.merges") == 0).then_some(())
        });
        shards.iter().map(|s| s.number("SELECT sum(count) FROM profiler.samples_local")).sum::<u64>()
    } else {
        samples
    };
    let per_shard: Vec<u64> =
        shards.iter().map(|s| s.number("SELECT uniqExact(node) FROM profiler.samples_local")).collect();
    say("shards", format!("nodes per shard: {per_shard:?}; {samples} samples on the servers"));
    if std::env::var_os("FLEET_KEEP_STORES").is_none() {
        let _ = std::fs::remove_dir_all(tmp.path().join("stores"));
    }
    let d = disk(&shards);
    let of = |t: &str| d.get(t).copied().unwrap_or(0);
    say(
        "disk",
        format!(
            "samples {:.2} B per sample ({:.2} GB); with stacks, cpu_seconds: {:.2} B per sample; counters {:.2} GB ({:.1} B per GPU track row); samples_1m {:.0} MB ({:.2} B per sample), samples_1h {:.0} MB; every table: {d:?}",
            of("samples_local") as f64 / samples as f64,
            of("samples_local") as f64 / 1e9,
            (of("samples_local") + stack_bytes(&d) + of("cpu_seconds_local")) as f64 / samples as f64,
            of("counters_local") as f64 / 1e9,
            of("counters_local") as f64 / counter_rows.max(1) as f64,
            of("samples_1m_local") as f64 / 1e6,
            of("samples_1m_local") as f64 / samples as f64,
            of("samples_1h_local") as f64 / 1e6,
        ),
    );
    let rollup_rows = |s: &ClickHouse, t: &str| s.number(&format!("SELECT count() FROM profiler.{t}"));
    // One row per stack (and frame) and shard is the floor: the shipper sends only what its
    // shard lacks. Stacks as text (`stacks`, what daemons before the frames dictionary wrote)
    // beside, for a database of both.
    let text_bytes =
        |s: &ClickHouse, t: &str, cols: &str| s.number(&format!("SELECT toUInt64(sum({cols})) FROM profiler.{t}"));
    say(
        "stack_rows",
        format!(
            "stack_frames_local {} rows on the shards ({} distinct ids, {} frame ids), {:.1} MB on disk; \
             frames_local {} rows ({:.1} MB of text), {:.1} MB on disk; stacks_local (as text) {} rows, {:.1} MB on disk",
            shards.iter().map(|s| rollup_rows(s, "stack_frames_local")).sum::<u64>(),
            shards.iter().map(|s| s.number("SELECT uniqExact(stack_id) FROM profiler.stack_frames_local")).sum::<u64>(),
            shards.iter().map(|s| text_bytes(s, "stack_frames_local", "length(frame_ids)")).sum::<u64>(),
            of("stack_frames_local") as f64 / 1e6,
            shards.iter().map(|s| rollup_rows(s, "frames_local")).sum::<u64>(),
            shards.iter().map(|s| text_bytes(s, "frames_local", "length(name)")).sum::<u64>() as f64 / 1e6,
            of("frames_local") as f64 / 1e6,
            shards.iter().map(|s| rollup_rows(s, "stacks_local")).sum::<u64>(),
            of("stacks_local") as f64 / 1e6
        ),
    );
    say(
        "rollup_rows",
        format!(
            "from the raw rows: samples_1m {} rows, samples_1h {} rows (both shards; rows per hour of the fleet: {})",
            shards.iter().map(|s| rollup_rows(s, "samples_1m_local")).sum::<u64>(),
            shards.iter().map(|s| rollup_rows(s, "samples_1h_local")).sum::<u64>(),
            shards
                .iter()
                .map(|s| s.number(&format!(
                    "SELECT count() FROM profiler.samples_1h_local WHERE ts = {}",
                    start / SEC / HOUR * HOUR * SEC
                )))
                .sum::<u64>()
        ),
    );

    // 30 days of hours before the raw data, written on each shard from the hours its nodes'
    // raw rows made (their sums scaled from `secs` to an hour): the raw rows of 30 days of a
    // thousand nodes would not fit on this machine's disk. The hourly rollup keeps a workload's
    // class (namespace, container name, unit: `schema::workload_class`), the same for a job's
    // pods on every node, so its rows are what the view made, copied back in time.
    let first_hour = start / SEC / HOUR * HOUR;
    let scale = (HOUR / secs.max(1)).max(1);
    let t = Instant::now();
    for s in &shards {
        for day in 0..=days {
            // Hours `first_hour - h` for h in [24 day + 1, 24 day + 24].
            let sql = format!(
                "INSERT INTO profiler.samples_1h_local (ts, comm, stack_id, workload, count) \
                 SELECT toUInt64({first_hour} - h * 3600) * {SEC} AS ts, comm, stack_id, workload, \
                 c * {scale} FROM (SELECT comm, stack_id, workload, sum(count) AS c FROM profiler.samples_1h_local \
                 WHERE ts >= {} GROUP BY comm, stack_id, workload) \
                 ARRAY JOIN arrayMap(x -> x + {}, range(24)) AS h",
                first_hour * SEC,
                day * 24 + 1
            );
            s.query(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        // Their days, as the daily rollup's view would have made them from the raw rows (the
        // raw data's own day is there already, from the view).
        let sql = format!(
            "INSERT INTO profiler.samples_1d_local (ts, comm, stack_id, workload, count) \
             SELECT intDiv(ts, {DAY}) * {DAY} AS d, comm, stack_id, workload, sum(count) \
             FROM profiler.samples_1h_local WHERE ts < {} GROUP BY d, comm, stack_id, workload",
            first_hour * SEC,
            DAY = schema::DAY_NS
        );
        s.query(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    wait_for("the servers' merges to finish", Duration::from_secs(3600), || {
        shards.iter().all(|s| s.number("SELECT count() FROM system.merges") == 0).then_some(())
    });
    let d = disk(&shards);
    say(
        "rollups_30d",
        format!(
            "{} days of hourly rows (per workload class) written on the servers in {:.0} s: samples_1h {} rows, {:.2} GB ({:.0} MB a day); samples_1d {} rows",
            days + 1,
            t.elapsed().as_secs_f64(),
            shards.iter().map(|s| rollup_rows(s, "samples_1h_local")).sum::<u64>(),
            d.get("samples_1h_local").copied().unwrap_or(0) as f64 / 1e9,
            d.get("samples_1h_local").copied().unwrap_or(0) as f64 / 1e6 / (days + 1) as f64,
            shards.iter().map(|s| rollup_rows(s, "samples_1d_local")).sum::<u64>(),
        ),
    );

    // FLEET_HOLD: the servers stay up for reads by hand until the file it names is removed
    // (its text: the URL and the window's end).
    if let Some(hold) = std::env::var_os("FLEET_HOLD") {
        std::fs::write(&hold, format!("{url} {}\n", end / SEC)).unwrap();
        eprintln!("FLEET hold: servers at {url} until {} is removed", Path::new(&hold).display());
        while Path::new(&hold).exists() {
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    // The reads, each the median of 7.
    let e = (end / SEC).to_string();
    let back = |s: u64| (end / SEC - s).to_string();
    let total = |out: &[u8]| -> u64 {
        String::from_utf8_lossy(out).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum()
    };
    let note = |err: &str| err.lines().filter_map(|l| l.strip_prefix("note: ")).collect::<Vec<_>>().join("; ");
    let mut read = |key: &str, a: Vec<String>, what: &dyn Fn(&[u8], &str) -> String| {
        let said = match median7(&a) {
            Ok((med, lo, hi, out, err)) => {
                format!("median {med:.0} ms of 7 ({lo:.0}-{hi:.0}); {}", what(&out, &err))
            }
            Err(failed) => failed,
        };
        let server = server_side(&shards, &a);
        say(key, format!("`profiler {}`: {said}; servers: {server}", a.join(" ")));
    };
    let folded = |out: &[u8], err: &str| {
        format!(
            "{} samples in {} folded lines, read from {}",
            total(out),
            out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count(),
            note(err)
        )
    };
    for (key, span) in
        [("fleet_flamegraph_1h", HOUR), ("fleet_flamegraph_1d", 86_400), ("fleet_flamegraph_30d", 30 * 86_400)]
    {
        read(
            key,
            args(&["flamegraph", "--clickhouse", &url, "--from", &back(span), "--to", &e, "--format", "folded"]),
            &folded,
        );
    }
    if big_cpus > 0 && big_secs > 0 {
        read(
            "big_node_hour",
            args(&[
                "flamegraph",
                "--clickhouse",
                &url,
                "--node",
                "big-0000",
                "--from",
                &back(big_secs.min(HOUR)),
                "--to",
                &e,
                "--format",
                "folded",
            ]),
            &folded,
        );
    }
    read(
        "fleet_overview_1d",
        args(&["fleet", "--clickhouse", &url, "--from", &back(86_400), "--to", &e, "--format", "json"]),
        &|out, _| {
            let j: serde_json::Value = serde_json::from_slice(out).unwrap_or_default();
            format!(
                "{} nodes, grid {} columns of {} s, {} bytes of JSON",
                j["nodes"].as_array().map_or(0, Vec::len),
                j["grid"]["columns"],
                j["grid"]["bucket_seconds"],
                out.len()
            )
        },
    );
    read(
        "signature_findings_1d",
        args(&["findings", "--clickhouse", &url, "--from", &back(86_400), "--to", &e, "--format", "json"]),
        &|out, _| {
            let text = String::from_utf8_lossy(out);
            let j: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let list = j.as_array().cloned().unwrap_or_else(|| j["findings"].as_array().cloned().unwrap_or_default());
            let hot: std::collections::BTreeSet<String> = list
                .iter()
                .filter(|f| f.to_string().contains(synth::HOT_FUNCTION))
                .filter_map(|f| f["node"].as_str().map(String::from))
                .collect();
            format!("{} findings; {} nodes with {} hot (kubelet)", list.len(), hot.len(), synth::HOT_FUNCTION)
        },
    );
    read(
        "signature_what_ran_1h",
        args(&[
            "flamegraph",
            "--clickhouse",
            &url,
            "--function",
            synth::HOT_FUNCTION,
            "--from",
            &back(HOUR),
            "--to",
            &e,
            "--format",
            "folded",
        ]),
        &folded,
    );
    read(
        "signature_event_1d",
        args(&[
            "fleet",
            "--clickhouse",
            &url,
            "--event",
            "Device reset",
            "--from",
            &back(86_400),
            "--to",
            &e,
            "--format",
            "json",
        ]),
        &|out, _| {
            let j: serde_json::Value = serde_json::from_slice(out).unwrap_or_default();
            format!(
                "{} events explained of {}",
                j["events"]["events"].as_array().map_or(0, Vec::len),
                j["events"]["matched"]
            )
        },
    );
    // The same flamegraphs from the stacks as text (`stacks`: what daemons before the frames
    // dictionary wrote, and what every read fetched then): each shard's stacks written there as
    // text, the dictionary's tables dropped, so the readers take a server of older daemons' path,
    // the queries of the reads before the dictionary. FLEET_TEXT_PASS=0 leaves it out.
    if knob("FLEET_TEXT_PASS", 1) == 1 {
        let t = Instant::now();
        let written: usize = shards.iter().map(stacks_to_text).sum();
        let converted = format!("{written} stacks written as text on the shards in {:.0} s", t.elapsed().as_secs_f64());
        for (key, span) in [("fleet_flamegraph_1h", HOUR), ("fleet_flamegraph_1d", 86_400)] {
            read(
                &format!("{key}_as_text"),
                args(&["flamegraph", "--clickhouse", &url, "--from", &back(span), "--to", &e, "--format", "folded"]),
                &folded,
            );
        }
        read(
            "signature_what_ran_1h_as_text",
            args(&[
                "flamegraph",
                "--clickhouse",
                &url,
                "--function",
                synth::HOT_FUNCTION,
                "--from",
                &back(HOUR),
                "--to",
                &e,
                "--format",
                "folded",
            ]),
            &folded,
        );
        let d = disk(&shards);
        say("stacks_as_text", format!("{converted}; stacks_local {:.1} MB on disk", stack_bytes(&d) as f64 / 1e6));
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    say("load", format!("/proc/loadavg at the end: {}", load.trim()));
    println!("\n---- fleet scale figures ----");
    for (k, v) in &figures {
        println!("FLEET {k}: {v}");
    }
}
