//! The fleet page (issue 39, part 4) against a private ClickHouse 18.16: synthetic nodes (no
//! BPF, no root) shipped by the real shipper, with GPU tracks, workloads and findings as the
//! daemon writes them. `/api/fleet`'s grid is checked cell by cell against the raw rows it is
//! summed from, the rows' order and grouping, the findings' signatures and costs; in Chromium:
//! the grid renders, the measure switches, a node's row opens that node's page at the same
//! window, a selection's flamegraph is the pushed-down fold of its nodes; and a sample taken
//! now shows on the page within 15 s. Then the SQL on current ClickHouse (chdb).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use integration_tests::{
    Kill,
    clickhouse::{ClickHouse, cursor_ns},
    now_secs, profiler, skip, wait_for,
};
use profiler::{
    collect::counters::Point,
    detect::{self, Finding},
    identity::{Identity, workloads},
    model::{Sample, Stack},
    ship::{
        SharedStats,
        clickhouse::{Config, FileConfig, Shipper},
    },
    store::{Meta, StoreWriter, counters::CountersWriter, create_and_lock, format::FORMAT_VERSION, segments_dir},
};
use serde_json::{Value, json};

mod browser;

const SEC: u64 = 1_000_000_000;
const HZ: u64 = 50;
const SECS: u64 = 60;

fn stack(frames: &[&str], user_len: usize) -> Arc<Stack> {
    Arc::new(Stack::new(frames.iter().map(|f| Arc::from(*f)).collect(), user_len))
}

fn pod(namespace: &str) -> Arc<str> {
    let id = Identity { pod_namespace: Some(namespace.into()), pod_name: Some("p-0".into()), ..Default::default() };
    Arc::from(workloads::encode(&id))
}

/// A synthetic node: per CPU the busy ticks of each second (of `HZ`), and its GPUs' utilisation.
struct Plan {
    name: &'static str,
    busy: [u64; 2],
    /// CPUs whose idle takes no cpu-clock ticks (as on some VMs): their busy ticks only.
    tickless: [bool; 2],
    comm: &'static str,
    namespace: &'static str,
    gpus: &'static [f64],
}

fn plans() -> Vec<Plan> {
    vec![
        // The zombie signature: one core saturated in the kernel under a 50 % average.
        Plan {
            name: "gpu-a-01",
            busy: [50, 0],
            tickless: [false; 2],
            comm: "ecs-agent",
            namespace: "ml",
            gpus: &[5.0, 90.0],
        },
        Plan {
            name: "gpu-a-02",
            busy: [25, 25],
            tickless: [false; 2],
            comm: "ecs-agent",
            namespace: "ml",
            gpus: &[80.0],
        },
        // Neither CPU ticks through idle (a 2-vCPU VM, as this one): CPU 0's 10 busy ticks of 50
        // a second are 20 %, CPU 1's 5 are 10 %, not 100 %.
        Plan { name: "cpu-b-01", busy: [10, 5], tickless: [true; 2], comm: "nginx", namespace: "web", gpus: &[] },
    ]
}

/// `p`'s store for the `SECS` seconds before `end`, as its daemon would have written it.
fn write_node(data: &Path, p: &Plan, end: u64) {
    let _lock = create_and_lock(data).unwrap();
    let start = end - SECS * SEC;
    Meta {
        format_version: FORMAT_VERSION,
        hostname: p.name.into(),
        node: p.name.into(),
        cpus: 2,
        frequency_hz: HZ,
        started_ns: start,
    }
    .write(data)
    .unwrap();
    let hot = stack(&["ret_from_fork", "kthread", "mem_cgroup_nr_lru_pages"], 0);
    let user = stack(&["main", "serve"], 2);
    let mut w = StoreWriter::new(&segments_dir(data));
    let mut gpu = CountersWriter::stream(data, "gpu").unwrap();
    for s in 0..SECS {
        let second = start + s * SEC;
        for tick in 0..HZ {
            for cpu in 0..2u32 {
                let ts_ns = second + tick * (SEC / HZ) + u64::from(cpu) * 1000;
                if tick < p.busy[cpu as usize] {
                    w.push(&Sample {
                        ts_ns,
                        cpu,
                        pid: 100 + cpu,
                        tid: 100 + cpu,
                        cgroup_id: 0,
                        comm: Arc::from(p.comm),
                        stack: if cpu == 0 { hot.clone() } else { user.clone() },
                        workload: pod(p.namespace),
                    });
                } else if !p.tickless[cpu as usize] {
                    w.push_idle(ts_ns, cpu);
                }
            }
        }
        w.flush(second + SEC).unwrap();
        // Ten readings a second per GPU, as the poller takes them.
        for k in 0..10 {
            let points: Vec<Point> = p
                .gpus
                .iter()
                .enumerate()
                .map(|(i, u)| Point { name: format!("gpu.{i}.util"), cpu: None, unit: "%".into(), value: *u })
                .collect();
            if !points.is_empty() {
                gpu.append(second + k * SEC / 10, &points).unwrap();
            }
        }
    }
}

fn finding(id: &str, kind: detect::Kind, start: u64, end: u64, cpu: Option<u32>, evidence: Value) -> Finding {
    Finding {
        id: id.into(),
        kind,
        start_ns: start,
        end_ns: Some(end),
        cpu,
        severity: detect::Severity::Warning,
        summary: format!("{id} summary"),
        evidence,
    }
}

/// A shipper per store (the real one, on a thread each), stopped when dropped.
struct Shipping {
    stop: tokio::sync::watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Shipping {
    fn start(ch: &ClickHouse, nodes: &[(String, PathBuf)]) -> Self {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let threads = nodes
            .iter()
            .map(|(node, data)| {
                let file = FileConfig { batch_rows: Some(100_000), ..Default::default() };
                let config = Config::resolve(Some(ch.url()), Some(&file), node, data.clone(), 86_400).unwrap().unwrap();
                profiler::ship::spawn(Shipper { config, stats: SharedStats::default(), stop: rx.clone() }).unwrap()
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Shipping {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `profiler ui --clickhouse URL` on a free loopback port: (guard, base address, token).
fn serve(url: &str) -> (Kill, String, String) {
    let mut child = Command::new(integration_tests::profiler_bin())
        .args(["ui", "--clickhouse", url, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let (base, token) = line.trim().split_once("/#token=").expect("an address with its token");
    (Kill(child), base.to_string(), token.to_string())
}

fn get(base: &str, path: &str, token: &str) -> (u16, String) {
    integration_tests::http_get(base.strip_prefix("http://").unwrap(), path, "127.0.0.1", Some(token))
}

fn board(base: &str, token: &str, query: &str) -> Value {
    let (code, body) = get(base, &format!("/api/fleet?{query}"), token);
    assert_eq!(code, 200, "/api/fleet?{query}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Per node and column of `bucket` seconds from `from`: (the busiest CPU's share, the mean
/// busy share), computed here from the raw `cpu_seconds` rows.
pub fn raw_cells(ch: &ClickHouse, from: u64, to: u64, bucket: u64) -> BTreeMap<(String, u64), (f64, f64)> {
    let rows = ch
        .query(&format!(
            "SELECT node, ts, cpu, max(busy), max(idle), max(span) FROM profiler.cpu_seconds WHERE ts >= {from} \
             AND ts < {to} GROUP BY node, ts, cpu FORMAT TSV"
        ))
        .unwrap();
    let mut per_cpu: BTreeMap<(String, u64, u64), (u64, u64)> = BTreeMap::new();
    // Per cell the ns its blocks covered: what 2 CPUs at `HZ` should have ticked in.
    let mut covered: BTreeMap<(String, u64), BTreeMap<u64, u64>> = BTreeMap::new();
    for line in rows.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let ts = f[1].parse::<u64>().unwrap();
        let col = (ts - from) / (bucket * SEC);
        let e = per_cpu.entry((f[0].to_string(), col, f[2].parse().unwrap())).or_default();
        // Idle: the ticks `HZ` gives the block's span that were not busy, at least those counted.
        let (busy, idle, span) =
            (f[3].parse::<u64>().unwrap(), f[4].parse::<u64>().unwrap(), f[5].parse::<u64>().unwrap());
        e.0 += busy;
        e.1 += idle.max((HZ * span / SEC).saturating_sub(busy));
        covered.entry((f[0].to_string(), col)).or_default().insert(ts, f[5].parse().unwrap());
    }
    // Per cell: the busiest CPU's busy ticks, the most ticks a CPU had (a CPU whose idle takes
    // no ticks is not read 100 % busy), busy, idle.
    let mut out: BTreeMap<(String, u64), (u64, u64, u64, u64)> = BTreeMap::new();
    for ((node, col, _), (b, i)) in per_cpu {
        let e = out.entry((node, col)).or_default();
        e.0 = e.0.max(b);
        e.1 = e.1.max(b + i);
        e.2 += b;
        e.3 += i;
    }
    out.into_iter()
        .map(|(k, (pb, pt, b, i))| {
            let ticks = (b + i).max(2 * HZ * covered[&k].values().sum::<u64>() / SEC);
            (k, (if pt > 0 { pb as f64 / pt as f64 } else { 0.0 }, b as f64 / ticks as f64))
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Every cell of `row` against the raw rows of its node (`peak`: the busiest CPU; else the mean).
fn check_row(b: &Value, row: &Value, raw: &BTreeMap<(String, u64), (f64, f64)>, peak: bool) {
    let node = row["label"].as_str().unwrap();
    for (col, v) in row["values"].as_array().unwrap().iter().enumerate() {
        let want = raw.get(&(node.to_string(), col as u64)).map(|&(p, m)| if peak { p } else { m });
        match (v.as_f64(), want) {
            (Some(got), Some(want)) => assert!(close(got, want), "{node} column {col}: {got} vs raw {want}"),
            (None, None) => {}
            (got, want) => panic!("{node} column {col}: {got:?} vs raw {want:?} ({})", b["measure"]),
        }
    }
}

#[test]
fn the_fleet_page_answers_from_clickhouse() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let end = (now_secs() as u64 - 30) * SEC;
    let start = end - SECS * SEC;
    let mut nodes = Vec::new();
    for p in plans() {
        let data = tmp.path().join(p.name);
        write_node(&data, &p, end);
        nodes.push((p.name.to_string(), data));
    }
    let top = json!({"comm": "ecs-agent", "pid": 100, "samples": 500, "namespace": "ml"});
    let hot = json!({"function": "mem_cgroup_nr_lru_pages", "share": 0.9, "window_secs": 10, "watchlist": true, "processes": [top]});
    for (i, (name, data)) in nodes.iter().enumerate().take(2) {
        let f = finding(&format!("hot-{name}"), detect::Kind::HotKernelFunction, start, end, Some(0), hot.clone());
        detect::journal::record_finding(data, &f).unwrap();
        if i == 0 {
            let gpu = json!({"gpu": 0, "model": "H100", "processes": [{"comm": "python3", "pid": 9, "samples": 5}],
                             "top_functions": [{"function": "augment", "samples": 5}], "utilization_percent": 5.0});
            let f = finding("starved", detect::Kind::GpuStarved, start + 10 * SEC, start + 50 * SEC, None, gpu);
            detect::journal::record_finding(data, &f).unwrap();
        }
    }
    {
        let _ship = Shipping::start(&ch, &nodes);
        wait_for("every node shipped", Duration::from_secs(300), || {
            nodes.iter().all(|(_, d)| cursor_ns(d).is_some_and(|c| c >= end)).then_some(())
        });
    }
    let (_ui, base, token) = serve(&url);
    let window = format!("from={}&to={}", start / SEC, end / SEC);

    // The busiest CPU: the zombie node first, every cell as the raw rows say.
    let raw = raw_cells(&ch, start, end, 1);
    let b = board(&base, &token, &window);
    assert_eq!(
        (b["measure"].as_str(), b["bucket_seconds"].as_u64(), b["columns"].as_u64()),
        (Some("peak-cpu"), Some(1), Some(SECS))
    );
    let labels = |b: &Value| {
        b["rows"].as_array().unwrap().iter().map(|r| r["label"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(labels(&b), ["gpu-a-01", "gpu-a-02", "cpu-b-01"]);
    for row in b["rows"].as_array().unwrap() {
        check_row(&b, row, &raw, true);
    }
    assert_eq!(b["rows"][0]["values"][5], 1.0);
    assert_eq!((b["more_rows"].as_u64(), b["nodes_with_data"].as_u64()), (Some(0), Some(3)));
    // Mean busy: the same 50 % for both GPU nodes; checked against the raw rows too.
    let busy = board(&base, &token, &format!("{window}&measure=busy"));
    for row in busy["rows"].as_array().unwrap() {
        check_row(&busy, row, &raw, false);
    }
    assert_eq!(busy["rows"][0]["values"][0], 0.5);
    // Ten-second columns over a longer window: the raw rows summed the same way.
    let wide = board(&base, &token, &format!("from={}&to={}", end / SEC - 3600, end / SEC));
    assert_eq!(wide["bucket_seconds"], 10);
    let raw10 = raw_cells(&ch, end - 3600 * SEC, end, 10);
    for row in wide["rows"].as_array().unwrap() {
        check_row(&wide, row, &raw10, true);
    }
    // A day: columns of five minutes, the window widened to whole ones (the rollups answer it
    // all), each cell what the raw rows give for it.
    let day = board(&base, &token, &format!("from={}&to={}", end / SEC - 86_400 + 7, end / SEC + 3));
    assert_eq!(day["bucket_seconds"], 300);
    let (a, z) = (day["from_ns"].as_u64().unwrap(), day["to_ns"].as_u64().unwrap());
    assert!(a.is_multiple_of(300 * SEC) && z.is_multiple_of(300 * SEC) && a == day["start_ns"], "{a} {z}");
    assert!(a <= end - 86_393 * SEC && a + 300 * SEC > end - 86_393 * SEC && z >= end + 3 * SEC && z < end + 303 * SEC);
    let raw300 = raw_cells(&ch, day["start_ns"].as_u64().unwrap(), z, 300);
    for row in day["rows"].as_array().unwrap() {
        check_row(&day, row, &raw300, true);
    }
    // The worst row and a count of the rest; groups by pool and by namespace.
    let one = board(&base, &token, &format!("{window}&rows=1"));
    assert_eq!(
        (labels(&one), one["more_rows"].as_u64(), one["more_nodes"].as_u64()),
        (vec!["gpu-a-01".to_string()], Some(2), Some(2))
    );
    let pools = board(&base, &token, &format!("{window}&group=pool"));
    assert_eq!(labels(&pools), ["gpu-a", "cpu-b"]);
    assert_eq!(pools["rows"][0]["nodes"], json!(["gpu-a-01", "gpu-a-02"]));
    assert_eq!(pools["rows"][0]["values"][3], 1.0, "a pool's cell is its worst CPU's");
    let ns = board(&base, &token, &format!("{window}&group=namespace&measure=busy"));
    assert_eq!(labels(&ns), ["ml", "web"]);
    assert!(
        close(ns["rows"][0]["values"][0].as_f64().unwrap(), 0.5)
            && close(ns["rows"][1]["score"].as_f64().unwrap(), 0.15)
    );

    // GPUs: the least used first; idle time with its cause where the finding covers it.
    let util = board(&base, &token, &format!("{window}&measure=gpu-util"));
    assert_eq!(
        (labels(&util), util["nodes_without_data"].as_u64()),
        (vec!["gpu-a-01".to_string(), "gpu-a-02".into()], Some(1))
    );
    assert!(close(util["rows"][0]["values"][7].as_f64().unwrap(), 0.475), "{}", util["rows"][0]["values"][7]);
    let idle = board(&base, &token, &format!("{window}&measure=gpu-idle"));
    assert_eq!(idle["causes"], json!(["gpu-starved"]));
    let r0 = &idle["rows"][0];
    assert_eq!(r0["label"], "gpu-a-01");
    assert!(close(r0["score"].as_f64().unwrap(), SECS as f64 / 3600.0), "one GPU idle all along: {}", r0["score"]);
    assert_eq!(
        (r0["values"][0].as_f64(), r0["causes"][0].as_u64(), r0["causes"][10].as_u64()),
        (Some(0.5), None, Some(0))
    );
    assert_eq!((r0["causes"][49].as_u64(), r0["causes"][50].as_u64()), (Some(0), None));
    assert_eq!(idle["rows"][1]["values"][0], 0.0);

    // Findings by signature, most costly first: the GPU's hours, then the hot function's cores.
    let f = &b["findings"];
    assert_eq!(f.as_array().unwrap().len(), 2, "{f}");
    assert_eq!(
        (f[0]["kind"].as_str(), f[0]["cost_unit"].as_str(), f[0]["comm"].as_str()),
        (Some("gpu-starved"), Some("GPU-hours"), Some("python3"))
    );
    assert!(close(f[0]["cost"].as_f64().unwrap(), 40.0 / 3600.0), "{}", f[0]);
    let h = &f[1];
    assert_eq!(
        (h["kind"].as_str(), h["function"].as_str(), h["comm"].as_str()),
        (Some("hot-kernel-function"), Some("mem_cgroup_nr_lru_pages"), Some("ecs-agent"))
    );
    assert_eq!((h["nodes"].as_u64(), h["findings"].as_u64(), h["since_ns"].as_u64()), (Some(2), Some(2), Some(start)));
    assert!(close(h["cost"].as_f64().unwrap(), 2.0 * SECS as f64 * 0.9), "{h}");
    assert_eq!(h["node_names"], json!(["gpu-a-01", "gpu-a-02"]));

    // A selection's flamegraph: the pushed-down fold of those nodes, as the CLI gives it.
    let (a, z) = ((start / SEC + 10).to_string(), (start / SEC + 30).to_string());
    let (code, folded) =
        get(&base, &format!("/api/flamegraph?format=folded&node=gpu-a-01,gpu-a-02&from={a}&to={z}"), &token);
    assert_eq!(code, 200, "{folded}");
    assert_eq!(folded, cli_fold(&url, &["gpu-a-01", "gpu-a-02"], &a, &z));
    assert!(folded.contains("ecs-agent;ret_from_fork_[k];kthread_[k];mem_cgroup_nr_lru_pages_[k] 1500"), "{folded}");
    // Bad input: a sentence.
    let (code, body) = get(&base, &format!("/api/fleet?{window}&measure=cpu"), &token);
    assert!(code == 400 && body.contains("not one of peak-cpu"), "{code} {body}");

    in_chromium(&base, &token, &url, start, end);
    fresh_within_15s(&ch, &url, tmp.path());
}

/// `profiler flamegraph --clickhouse URL --node ... --format folded`: the pushed-down fold.
fn cli_fold(url: &str, nodes: &[&str], from: &str, to: &str) -> String {
    let mut args = vec!["flamegraph", "--clickhouse", url, "--from", from, "--to", to, "--format", "folded"];
    for n in nodes {
        args.extend(["--node", n]);
    }
    let out = profiler(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn in_chromium(base: &str, token: &str, url: &str, start: u64, end: u64) {
    if !browser::installed() {
        skip("the page check needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let (from, to) = ((start / SEC).to_string(), (end / SEC).to_string());
    let page = format!("{base}/?from={from}&to={to}#token={token}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&page).await.unwrap();
        // The grid: three rows, drawn.
        let drawn = browser::until(
            &client,
            "the fleet grid",
            "const b = window.fleetUI && window.fleetUI.state.board; const g = document.getElementById('grid'); \
             return b && g.width > 0 && document.querySelectorAll('#labels a').length === 3 \
               ? [[...document.querySelectorAll('#labels a')].map((a) => a.textContent), b.measure, \
                  document.getElementById('findings').textContent] : null",
        )
        .await;
        assert_eq!(drawn[0], json!(["gpu-a-01", "gpu-a-02", "cpu-b-01"]), "{drawn}");
        assert_eq!(drawn[1], "peak-cpu");
        let text = drawn[2].as_str().unwrap();
        assert!(text.contains("mem_cgroup_nr_lru_pages hot on 2 nodes since") && text.contains("all running ecs-agent"), "{text}");
        // The measure switches: the page asks again and colours by it.
        client
            .execute("const m = document.getElementById('measure'); m.value = 'gpu-idle'; m.dispatchEvent(new Event('change'))", vec![])
            .await
            .unwrap();
        let switched = browser::until(
            &client,
            "the gpu-idle grid",
            "const b = window.fleetUI.state.board; return b.measure === 'gpu-idle' && \
             document.getElementById('grid').dataset.query.includes('measure=gpu-idle') \
             ? [location.search, document.getElementById('legend').textContent] : null",
        )
        .await;
        assert!(switched[0].as_str().unwrap().contains("measure=gpu-idle"), "the address keeps it: {switched}");
        assert!(switched[1].as_str().unwrap().contains("idle while gpu-starved"), "{switched}");
        // Back to the CPU; drag over the two GPU nodes' rows, columns 10 to 29.
        client
            .execute("const m = document.getElementById('measure'); m.value = 'peak-cpu'; m.dispatchEvent(new Event('change'))", vec![])
            .await
            .unwrap();
        browser::until(&client, "the peak-cpu grid", "return window.fleetUI.state.board.measure === 'peak-cpu' && !window.fleetUI.state.loading ? 1 : null").await;
        client
            .execute(
                "const ui = window.fleetUI, g = document.getElementById('grid'), a = ui.cellPoint(0, 10), b = ui.cellPoint(1, 29); \
                 g.dispatchEvent(new MouseEvent('mousedown', {clientX: a.x, clientY: a.y, bubbles: true})); \
                 g.dispatchEvent(new MouseEvent('mousemove', {clientX: b.x, clientY: b.y, bubbles: true})); \
                 window.dispatchEvent(new MouseEvent('mouseup', {clientX: b.x, clientY: b.y, bubbles: true}));",
                vec![],
            )
            .await
            .unwrap();
        let flame = browser::until(
            &client,
            "the selection's flamegraph",
            "const f = document.getElementById('fleet-flame'), i = f.querySelector('iframe'); \
             const doc = i && i.contentDocument; const svg = doc && doc.querySelector('svg'); \
             return f.dataset.drawn && f.dataset.drawn === f.dataset.query && svg ? [Object.fromEntries(new URLSearchParams(f.dataset.query)), doc.documentElement.textContent] : null",
        )
        .await;
        let q: BTreeMap<String, String> = serde_json::from_value(flame[0].clone()).unwrap();
        assert_eq!(q["node"], "gpu-a-01,gpu-a-02", "{q:?}");
        assert_eq!((q["from"].parse::<f64>().unwrap(), q["to"].parse::<f64>().unwrap()), ((start / SEC + 10) as f64, (start / SEC + 30) as f64));
        let cli = cli_fold(url, &["gpu-a-01", "gpu-a-02"], &q["from"], &q["to"]);
        let total: u64 = cli.lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum();
        let (code, page_fold) =
            get(base, &format!("/api/flamegraph?format=folded&node={}&from={}&to={}", q["node"], q["from"], q["to"]), token);
        assert_eq!((code, page_fold), (200, cli.clone()), "the page's selection is the pushed-down fold");
        assert!(flame[1].as_str().unwrap().contains(&format!("{total} samples")), "the drawn SVG counts {total}: {}", flame[1]);
        // A node's row opens its page at the same window.
        client.execute("document.querySelector('#labels a[data-node=\"gpu-a-02\"]').click()", vec![]).await.unwrap();
        let node = browser::until(
            &client,
            "gpu-a-02's page",
            "const h = document.getElementById('h-node'); return h && h.textContent === 'gpu-a-02' && window.profilerUI \
               && window.profilerUI.state.grid ? [location.search, document.getElementById('from').value, document.getElementById('to').value] : null",
        )
        .await;
        assert_eq!((node[1].as_str(), node[2].as_str()), (Some(from.as_str()), Some(to.as_str())), "{node}");
        let _ = client.close().await;
    });
}

/// A node shipping live (a writer adding each second as a daemon does, the real shipper
/// following it): a busy second shows on the fleet page, refreshing itself, within 15 s.
fn fresh_within_15s(ch: &ClickHouse, url: &str, tmp: &Path) {
    let data = tmp.join("live-01");
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (data, stop) = (data.clone(), stop.clone());
        std::thread::spawn(move || {
            let _lock = create_and_lock(&data).unwrap();
            let now = || (now_secs() * 1e9) as u64;
            let first = now() / SEC * SEC - 20 * SEC;
            Meta {
                format_version: FORMAT_VERSION,
                hostname: "live-01".into(),
                node: "live-01".into(),
                cpus: 2,
                frequency_hz: HZ,
                started_ns: first,
            }
            .write(&data)
            .unwrap();
            let mut w = StoreWriter::new(&segments_dir(&data));
            let busy = stack(&["main", "spin"], 2);
            let mut second = first;
            let mut marked = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Each second once it ended, as the daemon flushes it.
                while second + SEC > now() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                // The marked second: CPU 0 busy all along, 15 s into the run.
                let hot = marked.is_none() && second >= first + 35 * SEC;
                for tick in 0..HZ {
                    let ts_ns = second + tick * (SEC / HZ);
                    if hot {
                        w.push(&Sample {
                            ts_ns,
                            cpu: 0,
                            pid: 7,
                            tid: 7,
                            cgroup_id: 0,
                            comm: Arc::from("spin"),
                            stack: busy.clone(),
                            workload: Arc::from(""),
                        });
                    } else {
                        w.push_idle(ts_ns, 0);
                    }
                    w.push_idle(ts_ns + 1000, 1);
                }
                w.flush(second + SEC).unwrap();
                if hot {
                    marked = Some(second);
                    tx.send(second).unwrap();
                }
                second += SEC;
            }
        })
    };
    // The shipper follows a store that exists (a daemon creates it before shipping starts).
    wait_for("the live store's first seconds", Duration::from_secs(30), || {
        let segments = std::fs::read_dir(segments_dir(&data)).ok()?.count();
        (Meta::read(&data).is_some() && segments > 0).then_some(())
    });
    let _ship = Shipping::start(ch, &[("live-01".to_string(), data)]);
    let (_ui, base, token) = serve(url);
    if !browser::installed() {
        skip("the freshness check needs Debian's chromium and chromium-driver");
        return;
    }
    let page = format!("{base}/?from=-2m&to=now&nodes=live-*#token={token}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let took = rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&page).await.unwrap();
        let marked = rx.recv_timeout(Duration::from_secs(60)).expect("the writer marks a second");
        // The page reloads itself; the marked second's column turns to 100 % on its own.
        let script = format!(
            "const b = window.fleetUI.state.board; if (!b || !b.rows.length) return null; \
             const c = Math.floor(({marked} - b.start_ns) / (b.bucket_seconds * 1e9)); \
             return c >= 0 && b.rows[0].values[c] === 1 ? Date.now() : null"
        );
        let deadline = Instant::now() + Duration::from_secs(40);
        let seen_ms = loop {
            let v = client.execute(&script, vec![]).await.unwrap();
            if let Some(ms) = v.as_f64() {
                break ms;
            }
            if Instant::now() > deadline {
                let seen = client
                    .execute(
                        "const b = window.fleetUI.state.board; return [location.href, document.getElementById('status').textContent, \
                         b && b.rows.map((r) => [r.label, r.values.filter((v) => v != null).length, Math.max(...r.values.filter((v) => v != null))]), \
                         b && b.start_ns, b && b.columns]",
                        vec![],
                    )
                    .await
                    .unwrap();
                panic!("the marked second ({marked}) never showed on the page: {seen}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _ = client.close().await;
        seen_ms / 1000.0 - (marked / SEC) as f64
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    eprintln!("a sample taken at second S showed on the fleet page {took:.1} s after S began");
    assert!(took <= 15.0, "a sample showed on the fleet page {took:.1} s after it was taken (goal: 15 s)");
}

/// The page's SQL on today's ClickHouse (chdb from PyPI) and on 18.16, over the same few rows:
/// the answers must be the same, and what the rows say.
#[test]
fn fleet_page_sql_runs_on_current_clickhouse() {
    use profiler::{
        fleet::{
            Fleet,
            board_sql::{BoardSql, Rows},
            signatures,
        },
        query::Window,
        ship::clickhouse::schema,
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    // Rows of a few minutes ago (a fixed date's would expire by the tables' TTL).
    let t = (now_secs() as u64 / 60 - 5) * 60 * SEC;
    let ev = |v: Value| v.to_string().replace('\\', "\\\\").replace('\'', "\\'");
    let hot = ev(
        json!({"function": "mem_cgroup_nr_lru_pages", "share": 0.5, "processes": [{"comm": "ecs-agent", "pid": 1}]}),
    );
    let lock = ev(
        json!({"callers": [{"function": "do_epoll_ctl", "share": 0.9}], "cpus": [{"cpu": 1, "share": 0.5}, {"cpu": 2, "share": 0.5}], "function": "_raw_spin_lock"}),
    );
    let gpu = ev(json!({"processes": [{"comm": "python3"}], "top_functions": [{"function": "augment"}]}));
    let ml = ev(json!({"pod_namespace": "ml", "pod_name": "p"}));
    let rows = [
        "INSERT INTO p.nodes VALUES ('n1', 2, 99, '0-1', 'h', 1), ('n2', 2, 99, '0-1', 'h', 1)".to_string(),
        // n1: CPU 0 saturated, CPU 1 idle, a retried row; n2: both half busy, one second later.
        format!(
            "INSERT INTO p.cpu_seconds VALUES ('n1', {t}, {SEC}, 0, 99, 0, 0, 0, 99), ('n1', {t}, {SEC}, 0, 99, 0, 0, 0, 99), \
             ('n1', {t}, {SEC}, 1, 0, 0, 99, 0, 99), ('n2', {}, {SEC}, 0, 50, 0, 49, 0, 99), ('n2', {}, {SEC}, 1, 50, 0, 49, 0, 99)",
            t + SEC,
            t + SEC
        ),
        format!(
            "INSERT INTO p.counters VALUES ('n1', {t}, 'gpu.0.util', -1, '%', 10), ('n1', {}, 'gpu.0.util', -1, '%', 30), \
             ('n1', {t}, 'gpu.1.util', -1, '%', 90), ('n1', {t}, 'gpu.0.mem_util', -1, '%', 1), ('n2', {t}, 'gpu.0.util', -1, '%', 70)",
            t + SEC / 2
        ),
        format!(
            "INSERT INTO p.samples VALUES ('n1', {}, 0, 2, 3, 'a', 7, '{ml}', 4), ('n2', {}, 0, 2, 3, 'b', 7, '', 6)",
            t + 1,
            t + 2
        ),
        format!(
            "INSERT INTO p.findings VALUES ('n1', 'f1', 'hot-kernel-function', {t}, 0, 0, 'warning', 's1', '{hot}', {t}), \
             ('n1', 'f1', 'hot-kernel-function', {t}, {e}, 0, 'warning', 's1', '{hot}', {e}), \
             ('n2', 'f2', 'hot-kernel-function', {t}, {e}, 1, 'warning', 's2', '{hot}', {e}), \
             ('n2', 'f3', 'lock-spinning', {t}, {e}, -1, 'warning', 's3', '{lock}', {e}), \
             ('n1', 'f4', 'gpu-starved', {t}, {h}, -1, 'warning', 's4', '{gpu}', {h})",
            e = t + 4 * SEC,
            h = t + 3600 * SEC
        ),
    ];
    let fleet = Fleet::new("http://unused:1", "p").unwrap();
    let window = Window::new(t, t + 10 * SEC).unwrap();
    let sql = BoardSql::raw(&fleet, window, SEC);
    let grouped = Rows::Grouped(vec![("n1".into(), "g".into()), ("n2".into(), "g".into())]);
    let order = |q: String, by: &str| format!("SELECT * FROM ({q}) ORDER BY {by}");
    let queries = [
        (order(sql.cpu_scores(&Rows::EachNode), "1"), "n1\t1\t198\t99\t198\nn2\t0.5050505050505051\t100\t98\t99"),
        (order(sql.cpu_grid(&grouped, None), "1, 2"), "g\t0\t1\t99\t99\ng\t1\t0.5050505050505051\t100\t98"),
        (order(sql.cpu_grid(&Rows::Nodes(vec!["n2".into()]), None), "1, 2"), "n2\t1\t0.5050505050505051\t100\t98"),
        // The mean's idle at least the ticks of the seconds covered: 2 CPUs at 100 Hz, 200.
        (
            order(sql.cpu_grid(&Rows::Nodes(vec!["n2".into()]), Some(&[("n2".into(), 200)])), "1, 2"),
            "n2\t1\t0.5050505050505051\t100\t100",
        ),
        (
            order(sql.gpu_scores(&Rows::EachNode, 50.0), "1"),
            "n1\t2\t86.66666666666667\t1.3333333333333333\t2\nn2\t1\t70\t0\t1",
        ),
        (order(sql.gpu_grid(&grouped, 50.0), "1, 2"), "g\t0\t4\t200\t2"),
        (sql.namespaces(&[("samples", window)]), "n1\tml"),
        (
            signatures::sql(&fleet, window, ""),
            &format!(
                "gpu-starved\taugment\tpython3\t\t1\t1\t{t}\t{}\t0.002777777777777778\t['n1']\ts4\n\
                 lock-spinning\tdo_epoll_ctl\t\t\t1\t1\t{t}\t{}\t8\t['n2']\ts3\n\
                 hot-kernel-function\tmem_cgroup_nr_lru_pages\tecs-agent\t\t2\t2\t{t}\t{}\t4\t['n1','n2']\t",
                t + 10 * SEC,
                t + 4 * SEC,
                t + 4 * SEC
            ),
        ),
    ];
    let layout = |codecs, ttl| schema::Layout { database: "p", cluster: None, ttl_secs: ttl, codecs };
    let mut old: Vec<String> = schema::statements(&layout(false, None));
    old.extend(rows.iter().cloned());
    for s in &old {
        ch.query(s).unwrap_or_else(|e| panic!("18.16 refused {s}: {e}"));
    }
    let mut new = schema::statements(&layout(true, Some(604_800)));
    new.extend(rows.iter().cloned());
    let n = new.len();
    new.extend(queries.iter().map(|(q, _)| format!("{q} FORMAT TSV")));
    let current = integration_tests::clickhouse::chdb(&new);
    for (i, (q, want)) in queries.iter().enumerate() {
        let got = ch.query(&format!("{q} FORMAT TSV")).unwrap_or_else(|e| panic!("18.16 refused {q}: {e}"));
        // `any(summary)` of a group is any of its rows: the hot function's example is not compared.
        let strip = |s: &str| {
            // The ranking counts a block sent twice twice until the table's merge collapses it
            // (current servers collapse one insert's copies at once): either answer is right.
            let s = s
                .trim()
                .replace("\ts1", "\t")
                .replace("\ts2", "\t")
                .replace("n1\t1\t198\t99\t198", "n1\t1\t99\t99\t99")
                .replace("g\t0\t1\t198\t99", "g\t0\t1\t99\t99");
            s.lines().map(|l| l.trim_end_matches('\t')).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(strip(&got), strip(want), "on 18.16: {q}");
        if let Some(c) = &current {
            assert_eq!(strip(&c[n + i]), strip(want), "on chdb: {q}");
        }
    }
}

/// How long `/api/fleet` takes for a day's window over a generated fleet: FLEET_NODES (1,000)
/// nodes of 16 CPUs and 8 GPUs with FLEET_MINUTES (10) minutes of `cpu_seconds` and GPU
/// tracks, minute rollups of 20 stacks in 5 namespaces, 2,000 findings, written by SQL into an
/// 18.16 server (not shipped: the page's reads, not ingest, are measured). Prints the median of
/// 7 per measure and grouping. `cargo test -p integration-tests --test fleet_page -- --ignored`.
#[test]
#[ignore]
fn fleet_page_latency() {
    let nodes: u64 = std::env::var("FLEET_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let minutes: u64 = std::env::var("FLEET_MINUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let layout = profiler::ship::clickhouse::schema::Layout {
        database: "profiler",
        cluster: None,
        ttl_secs: None,
        codecs: false,
    };
    let rollups = profiler::ship::clickhouse::track_rollups::statements(&layout, 30 * 86_400);
    for s in profiler::ship::clickhouse::schema::statements(&layout).into_iter().chain(rollups) {
        ch.query(&s).unwrap();
    }
    let secs = minutes * 60;
    let t0 = (now_secs() as u64 / 60 - minutes - 1) * 60 * SEC;
    let t = Instant::now();
    let node = |n: &str| format!("concat('gpu-', toString(intDiv({n}, 100)), '-', toString({n} % 100))");
    // A minute of raw rows per insert: each within the client's 30 s with the views' work.
    let mut inserts = vec![format!(
        "INSERT INTO profiler.nodes SELECT {}, 16, 99, '0-15', 'h', 1 FROM numbers({nodes})",
        node("number")
    )];
    for m in 0..minutes {
        // Every 50th node's CPU 0 saturated (a zombie), the rest 0-60 % busy.
        inserts.push(format!(
            "INSERT INTO profiler.cpu_seconds SELECT {}, toUInt64({t0} + intDiv(number, {nodes} * 16) * {SEC}), toUInt64({SEC}), \
             toUInt16(intDiv(number, {nodes}) % 16), toUInt32(b), toUInt32(0), toUInt32(99 - b), toUInt32(0), toUInt32(99) \
             FROM (SELECT number, if(number % {nodes} % 50 = 0 AND intDiv(number, {nodes}) % 16 = 0, 99, cityHash64(number) % 60) AS b \
             FROM numbers({}, {}))",
            node(&format!("(number % {nodes})")),
            nodes * 16 * 60 * m,
            nodes * 16 * 60
        ));
        inserts.push(format!(
            "INSERT INTO profiler.counters SELECT {}, toUInt64({t0} + intDiv(number, {nodes} * 8) * {SEC}), \
             concat('gpu.', toString(intDiv(number, {nodes}) % 8), '.util'), toInt32(-1), '%', toFloat64(cityHash64(number) % 100) \
             FROM numbers({}, {})",
            node(&format!("(number % {nodes})")),
            nodes * 8 * 60 * m,
            nodes * 8 * 60
        ));
    }
    inserts.extend([
        format!(
            "INSERT INTO profiler.samples_1m SELECT {}, toUInt64({t0} + intDiv(number, {nodes} * 20) * 60 * {SEC}), 'python3', \
             toUInt64(intDiv(number, {nodes}) % 20), concat('{{\"pod_namespace\":\"ns-', toString(number % {nodes} % 5), '\"}}'), \
             toUInt64(100) FROM numbers({})",
            node(&format!("(number % {nodes})")),
            nodes * 20 * minutes
        ),
        format!(
            "INSERT INTO profiler.findings SELECT {}, toString(number), if(number % 2 = 0, 'hot-kernel-function', 'gpu-starved'), \
             toUInt64({t0} + (number % {secs}) * {SEC}), toUInt64({t0} + (number % {secs} + 30) * {SEC}), toInt32(number % 16), 'warning', \
             's', if(number % 2 = 0, '{{\"function\":\"mem_cgroup_nr_lru_pages\",\"processes\":[{{\"comm\":\"ecs-agent\"}}],\"share\":0.9}}', \
             '{{\"processes\":[{{\"comm\":\"python3\"}}],\"top_functions\":[{{\"function\":\"augment\"}}]}}'), toUInt64(1) FROM numbers(2000)",
            node(&format!("(number % {nodes})"))
        ),
    ]);
    for s in &inserts {
        ch.query(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    // FLEET_ROLLUP_HOURS: that many hours before the raw minutes in the minute rollups only,
    // written as the views would (a day of 1,000 nodes' raw seconds, 1.4 G rows, does not fit
    // this machine), twenty nodes at a time.
    let hours: u64 = std::env::var("FLEET_ROLLUP_HOURS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let m0 = t0 - hours * 3600 * SEC;
    let mins = hours * 60;
    for first in (0..nodes).step_by(20) {
        let n = 20.min(nodes - first);
        let nd = node(&format!("({first} + intDiv(number, {mins} * 16))"));
        let cpu = format!(
            "INSERT INTO profiler.cpu_1m SELECT {nd}, toUInt64({m0} + intDiv(number, 16) % {mins} * 60 * {SEC}), \
             toUInt16(number % 16), arrayReduce('sumState', [toUInt64(b * 60)]), arrayReduce('sumState', [toUInt64((99 - b) * 60)]), \
             arrayReduce('sumState', [toUInt64(0)]), arrayReduce('sumState', [toUInt64(60 * {SEC})]), \
             arrayReduce('maxState', [toFloat64(b / 99)]), arrayReduce('groupBitOrState', [toUInt64(if(b = 99, 1152921504606846975, 0))]) \
             FROM (SELECT number, if(({first} + intDiv(number, {mins} * 16)) % 50 = 0 AND number % 16 = 0, 99, cityHash64(number) % 60) AS b \
             FROM numbers({}))",
            n * mins * 16
        );
        let nd = node(&format!("({first} + intDiv(number, {mins} * 8))"));
        let gpu = format!(
            "INSERT INTO profiler.gpu_util_1m SELECT {nd}, toUInt64({m0} + intDiv(number, 8) % {mins} * 60 * {SEC}), \
             concat('gpu.', toString(number % 8), '.util'), toUInt64(60), toFloat64(u * 60), toUInt64(if(u < 50, 60, 0)), toUInt64(60) \
             FROM (SELECT number, cityHash64(number) % 100 AS u FROM numbers({}))",
            n * mins * 8
        );
        let nd = node(&format!("({first} + intDiv(number, {hours} * 16))"));
        let cpu_hours = format!(
            "INSERT INTO profiler.cpu_1h SELECT {nd}, toUInt64({m0} + intDiv(number, 16) % {hours} * 3600 * {SEC}), \
             toUInt16(number % 16), toUInt64(b * 3600), toUInt64((99 - b) * 3600) \
             FROM (SELECT number, if(({first} + intDiv(number, {hours} * 16)) % 50 = 0 AND number % 16 = 0, 99, cityHash64(number) % 60) AS b \
             FROM numbers({}))",
            n * hours * 16
        );
        let nd = node(&format!("({first} + intDiv(number, {hours} * 8))"));
        let gpu_hours = format!(
            "INSERT INTO profiler.gpu_util_1h SELECT {nd}, toUInt64({m0} + intDiv(number, 8) % {hours} * 3600 * {SEC}), \
             concat('gpu.', toString(number % 8), '.util'), toUInt64(3600), toFloat64(u * 3600), toUInt64(if(u < 50, 3600, 0)), \
             toUInt64(3600) FROM (SELECT number, cityHash64(number) % 100 AS u FROM numbers({}))",
            n * hours * 8
        );
        // The per-node minutes, as `cpu_node_1m_mv` folds a node's CPUs: from those just written.
        let names: Vec<String> = (first..first + n).map(|i| format!("'gpu-{}-{}'", i / 100, i % 100)).collect();
        let cpu_node = format!(
            "INSERT INTO profiler.cpu_node_1m SELECT node, minute, sumState(b), sumState(i), sumState(l), \
             arrayReduce('sumState', [max(sp)]), maxState(pk), groupBitOrState(sm) FROM \
             (SELECT node, minute, cpu, sumMerge(busy_ticks) AS b, sumMerge(idle_ticks) AS i, sumMerge(lost_ticks) AS l, \
             sumMerge(span_ns) AS sp, maxMerge(peak) AS pk, groupBitOrMerge(saturated) AS sm FROM profiler.cpu_1m \
             WHERE minute < {t0} AND node IN ({}) GROUP BY node, minute, cpu) GROUP BY node, minute",
            names.join(", ")
        );
        // The five minutes, as `cpu_5m_mv` sums a CPU's seconds: from the minutes just written.
        let cpu_fives = format!(
            "INSERT INTO profiler.cpu_5m SELECT node, five, \
             sumForEachState(arrayPushBack(arrayResize(emptyArrayUInt64(), cpu), b)), \
             sumForEachState(arrayPushBack(arrayResize(emptyArrayUInt64(), cpu), i)) FROM \
             (SELECT node, intDiv(minute, 300 * {SEC}) * 300 * {SEC} AS five, cpu, toUInt64(sum(finalizeAggregation(busy_ticks))) AS b, \
             toUInt64(sum(finalizeAggregation(idle_ticks))) AS i FROM profiler.cpu_1m WHERE minute < {t0} AND node IN ({}) \
             GROUP BY node, five, cpu) GROUP BY node, five",
            names.join(", ")
        );
        for s in [cpu, gpu, cpu_hours, gpu_hours, cpu_node, cpu_fives] {
            ch.query(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }
    eprintln!(
        "generated {nodes} nodes x {minutes} min raw, {hours} h of minute rollups before, in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Each query alone, on the server (FORMAT Null): where the time goes.
    {
        use profiler::fleet::{
            Fleet,
            board_sql::{BoardSql, Rows},
            minutes,
            overview::choose_bucket,
            signatures,
        };
        let now = (now_secs() * 1e9) as u64;
        let w = profiler::query::Window::new(now - 86_400 * SEC, now).unwrap();
        let fleet = Fleet::new(&ch.url(), "profiler").unwrap();
        // As `/api/fleet` reads them: the minute rollups for the whole minutes they hold.
        let bucket_ns = choose_bucket(w).0 * SEC;
        let start_ns = minutes::aligned_start(w, bucket_ns);
        let parts = minutes::Parts { fleet: &fleet, start_ns, bucket_ns, nodes: String::new() };
        let cpu = parts.cpu_tiers(w).unwrap();
        let gpu = parts.gpu_split(w, 50.0).unwrap();
        let cpu_1m = profiler::ship::clickhouse::track_rollups::CPU_1M;
        println!("FLEET_PAGE_SQL reads {}; {}", minutes::describe_cpu_tiers(&cpu, cpu_1m), minutes::describe_gpu(&gpu));
        let rank = parts.tiers(w, None).unwrap();
        println!("FLEET_PAGE_SQL ranking reads {}", minutes::describe_ranking(&rank, false));
        let cpu_minutes = Default::default();
        let sql = BoardSql { fleet: &fleet, window: w, bucket_ns, start_ns, cpu, cpu_minutes, gpu, rank };
        let some = Rows::Nodes((0..40).map(|i| format!("gpu-{}-{}", i / 100, i % 100)).collect());
        // The same SQL over raw rows only, for comparison (what the page read before the rollups).
        let (cpu, gpu) = (minutes::Tiers::raw(w), minutes::Split::raw(w));
        let rank = minutes::Tiers::raw(w);
        let raw = BoardSql { fleet: &fleet, window: w, bucket_ns, start_ns, cpu, cpu_minutes, gpu, rank };
        for (from, sql) in [("rollups", &sql), ("raw rows", &raw)] {
            for (name, q) in [
                ("cpu_scores", sql.cpu_scores(&Rows::EachNode)),
                ("cpu_grid of 40 rows", sql.cpu_grid(&some, None)),
                ("gpu_scores (its ranking from the CPU tables' tiers)", sql.gpu_scores(&Rows::EachNode, 50.0)),
                ("gpu_grid of 40 rows", sql.gpu_grid(&some, 50.0)),
                ("signatures", signatures::sql(&fleet, w, "")),
            ] {
                let t = Instant::now();
                let r = ch.query(&format!("{q} FORMAT Null"));
                println!(
                    "FLEET_PAGE_SQL ({from}) {name}: {:.0} ms {}",
                    t.elapsed().as_secs_f64() * 1000.0,
                    r.err().unwrap_or_default()
                );
            }
        }
    }
    let (_ui, base, token) = serve(&ch.url());
    let mut lines = Vec::new();
    for q in [
        "measure=peak-cpu",
        "measure=busy&group=pool",
        "measure=gpu-util",
        "measure=gpu-idle",
        "measure=peak-cpu&group=namespace",
    ] {
        let path = format!("/api/fleet?from=-1d&to=now&{q}");
        let mut runs: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                let (code, body) = get(&base, &path, &token);
                if code != 200 {
                    println!("FLEET_PAGE {path}: {code} {body}");
                }
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        let b: Value = serde_json::from_str(&get(&base, &path, &token).1).unwrap();
        lines.push(format!(
            "FLEET_PAGE {path}: median {:.0} ms of 7 ({:.0}-{:.0}); {} rows of {} columns, {} more rows, {} signatures",
            runs[3],
            runs[0],
            runs[6],
            b["rows"].as_array().unwrap().len(),
            b["columns"],
            b["more_rows"],
            b["findings"].as_array().unwrap().len()
        ));
    }
    for l in lines {
        println!("{l}");
    }
    // `profiler fleet` over the same day: busy shares and grid, samples and top stacks. A run
    // past the reader's 30 s is a figure too (its message), then the server's slowest queries.
    let url = ch.url();
    let args = ["fleet", "--clickhouse", &url, "--from", "-1d", "--to", "now", "--format", "json"];
    let mut runs = Vec::new();
    let started = Instant::now();
    for _ in 0..7 {
        let t = Instant::now();
        let out = profiler(&args);
        if !out.status.success() {
            println!(
                "FLEET_OVERVIEW profiler fleet --from -1d --to now: failed after {:.0} ms: {}",
                t.elapsed().as_secs_f64() * 1000.0,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            break;
        }
        runs.push((t.elapsed().as_secs_f64() * 1000.0, out.stdout));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let [first, .., last] = &runs[..] {
        let o: Value = serde_json::from_slice(&runs[runs.len() / 2].1).unwrap();
        println!(
            "FLEET_OVERVIEW profiler fleet --from -1d --to now --format json: median {:.0} ms of {} ({:.0}-{:.0}); {} nodes, \
             grid {} x {} s, read from {}",
            runs[runs.len() / 2].0,
            runs.len(),
            first.0,
            last.0,
            o["nodes"].as_array().unwrap().len(),
            o["grid"]["columns"],
            o["grid"]["bucket_seconds"],
            o["read_from"]
        );
    }
    let _ = ch.query("SYSTEM FLUSH LOGS");
    let slowest = ch.query(&format!(
        "SELECT count() AS runs, toUInt64(avg(query_duration_ms)) AS ms, max(read_rows), substring(query, 1, 100) AS q \
         FROM system.query_log WHERE type != 1 AND event_time >= now() - {} AND query NOT LIKE '%query_log%' \
         GROUP BY q ORDER BY ms DESC LIMIT 16 FORMAT TSV",
        started.elapsed().as_secs() + 2
    ));
    println!(
        "FLEET_OVERVIEW the servers' slowest queries, by their first 100 characters (runs, mean ms, most rows read, query):\n{}",
        slowest.unwrap_or_default()
    );
}

/// The minute rollups of the per-CPU counts and GPU readings (`cpu_1m`, `cpu_node_1m`,
/// `gpu_util_1m`, made by the servers' views from the raw rows' inserts) give the raw rows'
/// answers: every query of the page and of `profiler fleet`'s busy shares and grid (from either
/// CPU rollup), read from the rollups for a window's whole minutes and raw rows at its edges,
/// equals the same query over raw rows only, on 18.16 and on current ClickHouse (chdb).
#[test]
fn cpu_and_gpu_rollups_answer_as_the_raw_rows() {
    use profiler::{
        fleet::{
            Fleet,
            board_sql::{BoardSql, Rows},
            minutes::{self, Split},
            node_minutes::NodeMinutes,
            overview::{self, node_filter},
        },
        query::Window,
        ship::clickhouse::{schema, track_rollups},
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    // Two clock hours of a little while ago (a fixed date's would expire by the tables' TTL).
    let t = (now_secs() as u64 / 3600 - 3) * 3600 * SEC;
    let node = "concat('n', toString(intDiv(number, 2) % 3))";
    // CPU 1 has no row in about a fifth of the seconds, as a CPU that took no sample in a block.
    let gap = "NOT (number % 2 = 1 AND cityHash64(intDiv(number, 6)) % 5 = 0)";
    let rows = [
        // 3 nodes x 2 CPUs x 7,200 s: 0-99 % busy, some seconds saturated; two batches, the
        // second from inside a minute (its rows of that minute in the rollups' second insert);
        // CPU 1 missing from some seconds.
        format!(
            "INSERT INTO p.cpu_seconds SELECT {node}, toUInt64({t} + intDiv(number, 6) * {SEC}), toUInt64({SEC}), \
             toUInt16(number % 2), toUInt32(b), toUInt32(0), toUInt32(99 - b), toUInt32(number % 3), toUInt32(99) \
             FROM (SELECT number, cityHash64(number) % 100 AS b FROM numbers(21630) WHERE {gap})"
        ),
        format!(
            "INSERT INTO p.cpu_seconds SELECT {node}, toUInt64({t} + intDiv(number, 6) * {SEC}), toUInt64({SEC}), \
             toUInt16(number % 2), toUInt32(b), toUInt32(0), toUInt32(99 - b), toUInt32(number % 3), toUInt32(99) \
             FROM (SELECT number, cityHash64(number) % 100 AS b FROM numbers(21630, 21570) WHERE {gap})"
        ),
        // 3 nodes x 2 GPUs, two readings a second; a memory track the measures leave out.
        format!(
            "INSERT INTO p.counters SELECT {node}, toUInt64({t} + intDiv(number, 6) * {} ), \
             concat('gpu.', toString(number % 2), if(number % 7 = 0, '.mem_util', '.util')), toInt32(-1), '%', \
             toFloat64(cityHash64(number) % 101) FROM numbers(86400)",
            SEC / 2
        ),
    ];
    let layout = |codecs, ttl| schema::Layout { database: "p", cluster: None, ttl_secs: ttl, codecs };
    let setup = |l: &schema::Layout<'_>| -> Vec<String> {
        let mut s = schema::statements(l);
        s.extend(track_rollups::statements(l, 30 * 86_400));
        s.extend(rows.iter().cloned());
        s
    };
    for s in setup(&layout(false, None)) {
        ch.query(&s).unwrap_or_else(|e| panic!("18.16 refused {s}: {e}"));
    }
    let fleet = Fleet::new(&ch.url(), "p").unwrap();
    let window = Window::new(t + 17 * SEC, t + 7200 * SEC).unwrap();
    let bucket_ns = 60 * SEC;
    let start_ns = minutes::aligned_start(window, bucket_ns);
    assert_eq!(start_ns, t);
    // The views began with the first minute: whole minutes from the second one.
    let from = minutes::whole_from(&fleet, track_rollups::CPU_1M, window).unwrap();
    assert_eq!(from, Some(t + 60 * SEC));
    assert_eq!(minutes::whole_from(&fleet, track_rollups::GPU_UTIL_1M, window).unwrap(), from);
    assert_eq!(minutes::whole_from(&fleet, track_rollups::CPU_NODE_1M, window).unwrap(), from);
    // `profiler fleet` reads the per-node minutes where they start no later than the per-CPU ones.
    let (node_split, by) = NodeMinutes::split(&fleet, window).unwrap();
    assert_eq!((node_split.minutes, by), (Split::new(window, from).minutes, NodeMinutes::PerNode));
    // A window starting after the rollups' first minute: whole minutes from its own first one
    // (found by the rows of the minute before it).
    let later = Window::new(t + 137 * SEC, t + 7200 * SEC).unwrap();
    for table in [track_rollups::CPU_1M, track_rollups::CPU_NODE_1M, track_rollups::GPU_UTIL_1M] {
        assert_eq!(minutes::whole_from(&fleet, table, later).unwrap(), Some(t + 120 * SEC), "{table}");
    }
    assert_eq!(minutes::whole_hours_from(&fleet, track_rollups::CPU_1H, later).unwrap(), Some(t + 3600 * SEC));
    assert_eq!(NodeMinutes::split(&fleet, later).unwrap().1, NodeMinutes::PerNode);
    let split = Split::new(window, from);
    assert!(minutes::describe_cpu(&split).starts_with("cpu_1m 1h 59m, cpu_seconds 43"), "{split:?}");
    let raw = Split::raw(window);
    // The ranking: the second hour from the hourly rollups, the first one's minutes, raw rows.
    let hours = minutes::whole_hours_from(&fleet, track_rollups::CPU_1H, window).unwrap();
    assert_eq!(hours, Some(t + 3600 * SEC));
    assert_eq!(minutes::whole_hours_from(&fleet, track_rollups::GPU_UTIL_1H, window).unwrap(), hours);
    let tiers = minutes::Tiers::new(window, hours, from);
    assert_eq!(tiers.hours, Some(Window::new(t + 3600 * SEC, t + 7200 * SEC).unwrap()));
    let rank = |s: &Split| if s.minutes.is_some() { tiers.clone() } else { minutes::Tiers::raw(window) };
    let board = |s: &Split, cpu_minutes| BoardSql {
        fleet: &fleet,
        window,
        bucket_ns,
        start_ns,
        cpu: s.clone().into(),
        cpu_minutes,
        gpu: s.clone(),
        rank: rank(s),
    };
    let fleet_sql = |s: &Split, cpu_minutes| overview::Sql {
        fleet: &fleet,
        window,
        nodes: node_filter(&["n0".into(), "n2".into()]),
        pieces: Vec::new(),
        fleet_pieces: Vec::new(),
        node_pieces: Vec::new(),
        cpu: s.clone(),
        cpu_minutes,
    };
    let grouped = Rows::Grouped(vec![("n0".into(), "g".into()), ("n1".into(), "g".into()), ("n2".into(), "h".into())]);
    let some = Rows::Nodes(vec!["n1".into(), "n2".into()]);
    // Lines sorted here: 18.16 reads `ORDER BY 1` as a constant, not a position.
    let sorted = |a: &str| {
        let mut l: Vec<&str> = a.trim().lines().collect();
        l.sort_unstable();
        l.join("\n")
    };
    // Each node's CPUs x Hz: its seconds' ticks, what the `busy` cells' idle is at least.
    let ticks: Vec<(String, u64)> = (0..3).map(|n| (format!("n{n}"), 2 * 99)).collect();
    let queries = |s: &Split| {
        let (b, busy_board) = (board(s, NodeMinutes::PerCpu), board(s, NodeMinutes::PerNode));
        let (o, per_node) = (fleet_sql(s, NodeMinutes::PerCpu), fleet_sql(s, NodeMinutes::PerNode));
        // The `busy` measure's cells from the per-node minutes: their sums (the peak is the
        // node's share there, unused by that measure).
        let sums = |grid: String| format!("SELECT rk, c, cb, ci FROM ({grid})");
        // Over whole hours the ranking's unit is the clock hour: raw rows grouped so too.
        let parts = minutes::Parts { fleet: &fleet, start_ns, bucket_ns, nodes: String::new() };
        let ranking = match s.minutes {
            Some(_) => b.cpu_scores(&Rows::EachNode),
            None => parts.cpu_ranking(&minutes::Tiers::raw(window)),
        };
        vec![
            ranking,
            b.cpu_grid(&some, None),
            b.cpu_grid(&grouped, None),
            b.gpu_scores(&Rows::EachNode, 50.0),
            b.gpu_grid(&some, 50.0),
            b.gpu_grid(&grouped, 50.0),
            o.cells(60),
            per_node.cells(60),
            sums(busy_board.cpu_grid(&some, Some(&ticks))),
            sums(busy_board.cpu_grid(&grouped, Some(&ticks))),
        ]
    };
    let (mut from_raw, mut from_rollups) = (queries(&raw), queries(&split));
    assert!(from_rollups.iter().all(|q| q.contains("_1m`")), "every query reads a rollup");
    assert!(from_rollups[0].contains("`cpu_1h`") && from_rollups[3].contains("`gpu_util_1h`"));
    assert!(from_rollups[7..].iter().all(|q| q.contains("`cpu_node_1m`")));
    assert!(!from_rollups[6].contains("`cpu_node_1m`"), "{}", from_rollups[6]);
    // Columns of five minutes: the per-CPU cells' whole five minutes from `cpu_5m`'s per-CPU
    // arrays, summed across the rows of two inserts (the view
    // began with the first five minutes: whole ones from the second), minutes, raw rows.
    let five_ns = 300 * SEC;
    let parts5 = minutes::Parts { fleet: &fleet, start_ns: t, bucket_ns: five_ns, nodes: String::new() };
    assert_eq!(minutes::aligned_start(window, five_ns), t);
    assert_eq!(minutes::whole_fives_from(&fleet, window).unwrap(), Some(t + five_ns));
    assert_eq!(
        minutes::whole_fives_from(&fleet, later).unwrap(),
        Some(t + five_ns),
        "the first five minutes are not whole"
    );
    let fives = parts5.cpu_tiers(window).unwrap();
    assert_eq!(fives.fives, vec![Window::new(t + five_ns, t + 7200 * SEC).unwrap()]);
    assert_eq!(
        minutes::describe_cpu_tiers(&fives, track_rollups::CPU_1M),
        "cpu_5m 1h 55m, cpu_1m 4m 0s, cpu_seconds 43.000s"
    );
    let board5 = |cpu| BoardSql {
        fleet: &fleet,
        window,
        bucket_ns: five_ns,
        start_ns: t,
        cpu,
        cpu_minutes: NodeMinutes::PerCpu,
        gpu: raw.clone(),
        rank: minutes::Tiers::raw(window),
    };
    let five_queries =
        |b: BoardSql<'_>| vec![b.cpu_grid(&some, None), b.cpu_grid(&grouped, None), b.cpu_scores(&Rows::EachNode)];
    let rolled5 = five_queries(board5(fives));
    assert!(rolled5.iter().all(|q| q.contains("`cpu_5m`") && q.contains("`cpu_1m`")), "{rolled5:?}");
    from_raw.extend(five_queries(board5(minutes::Tiers::raw(window))));
    from_rollups.extend(rolled5);
    // The ranking: whole hours, the five minutes around them, minutes, raw rows (the GPU's
    // have no five minutes).
    let rank5 = parts5.tiers(window, None).unwrap();
    let cut = |t: &minutes::Tiers| (t.hours.is_some(), t.fives.len(), t.minutes.len(), t.raw.len());
    assert_eq!(cut(&rank5), (true, 1, 1, 1), "{rank5:?}");
    assert_eq!(cut(&parts5.tiers(window, Some(50.0)).unwrap()), (true, 0, 1, 1));
    from_raw.push(parts5.cpu_ranking(&minutes::Tiers::raw(window)));
    from_rollups.push(parts5.cpu_ranking(&rank5));
    let mut answers = Vec::new();
    for (r, m) in from_raw.iter().zip(&from_rollups) {
        let a = ch.query(&format!("{r} FORMAT TSV")).unwrap_or_else(|e| panic!("18.16 refused {r}: {e}"));
        let b = ch.query(&format!("{m} FORMAT TSV")).unwrap_or_else(|e| panic!("18.16 refused {m}: {e}"));
        assert!(a.lines().count() >= 2, "{r}: {a}");
        assert_eq!(sorted(&b), sorted(&a), "on 18.16, from the rollups: {m}");
        answers.push(sorted(&a));
    }
    // The cells' columns are whole minutes: 120 of them, from the window's minute.
    assert!(answers[1].lines().any(|l| l.starts_with("n2\t119\t")), "{}", answers[1]);
    let mut statements = setup(&layout(true, Some(604_800)));
    let n = statements.len();
    statements.extend(from_raw.iter().chain(&from_rollups).map(|q| format!("{q} FORMAT TSV")));
    let Some(current) = integration_tests::clickhouse::chdb(&statements) else { return };
    for (i, want) in answers.iter().enumerate() {
        assert_eq!(&sorted(&current[n + i]), want, "on chdb, raw rows: {}", from_raw[i]);
        assert_eq!(&sorted(&current[n + answers.len() + i]), want, "on chdb, from the rollups: {}", from_rollups[i]);
    }
}
