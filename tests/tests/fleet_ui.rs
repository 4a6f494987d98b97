//! The page for any node of a fleet (issue 15): `profiler ui --clickhouse URL` serves the UI
//! from what two daemons shipped to ClickHouse. Every endpoint the node page calls answers for
//! a node as the node's own store does, byte for byte, summed by the server (issue 39: nothing
//! is copied), on 18.16 and on chdb (current ClickHouse) alike; it asks which node when several
//! shipped, refuses unknown nodes and requests without the token, and listens on loopback; in
//! Chromium, the node field lists the nodes and switches the page between them.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Command, Stdio},
};

use integration_tests::{
    Daemon, Kill,
    chdb::ChdbServer,
    clickhouse::{ClickHouse, ship_for},
    helper_bin, privileged, profiler, skip,
};

mod browser;

const SEC: u64 = 1_000_000_000;

/// A GET to the server at `base` (`http://host:port`): (status, body).
fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    get_as(base, path, "127.0.0.1", token)
}

fn get_as(base: &str, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    integration_tests::http_get(base.strip_prefix("http://").unwrap(), path, host, token)
}

/// The private copies (`profiler-fleet-*` in the temporary directory) that exist now: the page
/// once copied a node's window there; none must appear.
fn copies() -> BTreeSet<String> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("profiler-fleet-"))
        .collect()
}

/// `profiler flamegraph --format folded` of the node's own store.
fn folded_from_store(data: &Path, from: &str, to: &str) -> String {
    let out = profiler(&[
        "flamegraph",
        "--format",
        "folded",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        from,
        "--to",
        to,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_page_reads_any_node_from_clickhouse() {
    if !privileged("the_page_reads_any_node_from_clickhouse") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let _busy = Kill(Command::new(helper_bin()).args(["1", "600"]).stdout(Stdio::null()).spawn().unwrap());
    let nodes = ["node-a", "node-b"];
    let data: Vec<_> = nodes.iter().map(|n| tmp.path().join(n)).collect();
    let (a, b) = ship_for(&data, 4, |i| {
        let mut d = Daemon::start(&data[i], &["--listen", "off", "--node", nodes[i], "--clickhouse", &url]);
        d.wait_ready();
        d
    });
    let (from, to) = (a.to_string(), b.to_string());

    // The default address: loopback.
    let before = copies();
    let mut child = Command::new(integration_tests::profiler_bin())
        .args(["ui", "--clickhouse", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut ui = Kill(child);
    let (base, token) =
        line.trim().split_once("/#token=").map(|(b, t)| (b.to_string(), t.to_string())).unwrap_or_else(|| {
            let mut err = String::new();
            let _ = ui.0.stderr.take().unwrap().read_to_string(&mut err);
            panic!("no address from `profiler ui --clickhouse`: {line} {err}")
        });
    assert_eq!(base, "http://127.0.0.1:7071", "the page listens on loopback unless told otherwise");
    let token_text = token;
    let token = Some(token_text.as_str());

    // Which nodes; several and none chosen: a sentence that asks for one.
    let (code, body) = get(&base, "/api/status", token);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{code} {body}"));
    assert_eq!(status["nodes"], serde_json::json!(nodes), "{status}");
    assert!(status["problem"].as_str().unwrap_or("").contains("2 nodes (node-a, node-b)"), "{status}");
    let (code, body) = get(&base, &format!("/api/flamegraph?format=folded&from={from}&to={to}"), token);
    assert!(code == 400 && body.contains("type one in the node field"), "{code} {body}");

    // Each node: its description, and the same flamegraph as its own store's.
    for (node, dir) in nodes.iter().zip(&data) {
        let (_, body) = get(&base, &format!("/api/status?node={node}"), token);
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["meta"]["node"], *node, "{status}");
        let span = &status["summary"]["span"];
        assert!(span[0].as_u64() <= Some(a * SEC) && span[1].as_u64() >= Some(b * SEC), "{status}");
        let path = format!("/api/flamegraph?format=folded&node={node}&from={from}&to={to}");
        let (code, folded) = get(&base, &path, token);
        assert_eq!(code, 200, "{folded}");
        assert!(folded.contains("profiler_test_hot_loop"), "{folded}");
        assert_eq!(folded, folded_from_store(dir, &from, &to), "{node}: the page's flamegraph is the store's");
        // A selection inside the window, then the window with a CPU filter.
        let (code, _) = get(&base, &format!("/api/heatmap?node={node}&from={from}&to={to}&cpu=1"), token);
        assert_eq!(code, 200);
        let mid = (a + 2).to_string();
        let (code, body) = get(&base, &format!("/api/flamegraph?format=json&node={node}&from={from}&to={mid}"), token);
        // Not parsed: a tree holds stacks deeper than serde_json's recursion limit (the
        // daemon's own table builds through gimli, sampled on a busy machine).
        let head = body.get(..200).unwrap_or(&body);
        assert!(code == 200 && body.starts_with("{\"unit\":\"samples\",\"name\":\"all\""), "{code} {head}");
    }

    // Clear refusals: an unknown node, no token, another host name; no /metrics (no daemon).
    let (code, body) = get(&base, &format!("/api/heatmap?node=nope&from={from}&to={to}"), token);
    assert!(code == 404 && body.contains("node 'nope' has shipped nothing"), "{code} {body}");
    let (code, body) = get(&base, "/api/status?node=node-a", None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = get_as(&base, "/api/status?node=node-a", "attacker.example", token);
    assert_eq!(code, 403, "{body}");
    assert_eq!(get(&base, "/metrics", None).0, 404);

    // Every endpoint of the node page, as the node's own store answers it.
    let mut compared = 0;
    for (node, dir) in nodes.iter().zip(&data) {
        let store = store_server(dir);
        compared +=
            same_api(&base, token, &store, Some(STORE_TOKEN), &page_reads(node, a, b), "ClickHouse 18.16", "the store");
        let (_, body) = get(&base, &format!("/api/status?node={node}"), token);
        let (fleet, own): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(&body).unwrap(),
            serde_json::from_str(&get(&store, "/api/status", Some(STORE_TOKEN)).1).unwrap(),
        );
        for field in ["node", "cpus", "frequency_hz"] {
            assert_eq!(fleet["meta"][field], own["meta"][field], "{node}'s {field}");
        }
        assert!(
            fleet["missing"].as_str().unwrap_or("").contains("not in ClickHouse"),
            "the page says what it lacks: {fleet}"
        );
    }

    // The same requests on today's ClickHouse: what 18.16 holds, copied into chdb, answers alike.
    if let Some(chdb) = ChdbServer::start(&tmp.path().join("chdb")) {
        copy_into(&chdb, &ch);
        let (current, current_token, _ui) = serve(&chdb.url(), "127.0.0.1:7072");
        for node in nodes {
            same_api(&base, token, &current, Some(&current_token), &page_reads(node, a, b), "ClickHouse 18.16", "chdb");
        }
        eprintln!("the node page's endpoints answer alike from 18.16 and chdb");
    }

    fleet_page_cells(&ch, &base, token, a, b);
    page_switches_nodes(&base, &token_text, &from, &to);

    // Nothing was copied out of ClickHouse to answer.
    let made: Vec<_> = copies().difference(&before).cloned().collect();
    assert!(made.is_empty(), "copies made: {made:?}");
    assert!(Command::new("kill").args(["-TERM", &ui.0.id().to_string()]).status().unwrap().success());
    let stopped = ui.0.wait().unwrap();
    assert!(stopped.success(), "{stopped}");
    eprintln!("2 nodes served from ClickHouse; {compared} answers of the node page equal to each node's store's");
}

const STORE_TOKEN: &str = "store-token";

/// The node page's API over a node's own data directory, served in this process on a free
/// loopback port, as the daemon serves it: the answers to compare with.
fn store_server(dir: &Path) -> String {
    use profiler::serve::{self, AppState, source::Source};
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let state = AppState {
        source: std::sync::Arc::new(Source::Store(dir.to_path_buf())),
        live: Default::default(),
        token: STORE_TOKEN.into(),
        hosts: serve::hosts(addr),
        metrics_from_any_host: false,
    };
    format!("http://{}", serve::spawn(addr, state).unwrap())
}

/// `profiler ui --clickhouse URL --listen ADDR`: its base address, token and process.
fn serve(url: &str, listen: &str) -> (String, String, Kill) {
    let mut child = Command::new(integration_tests::profiler_bin())
        .args(["ui", "--clickhouse", url, "--listen", listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let (base, token) = line.trim().split_once("/#token=").unwrap_or_else(|| panic!("no address: {line}"));
    (base.to_string(), token.to_string(), Kill(child))
}

/// What the node page asks for a node's window `[a, b)`: every endpoint (heatmap, CPU x time,
/// findings, events, counter tracks, flamegraphs), with the filters and selections it sends.
fn page_reads(node: &str, a: u64, b: u64) -> Vec<String> {
    let w = format!("node={node}&from={a}&to={b}");
    let sel = format!("node={node}&from={}&to={}", a + 1, a + 3);
    let mut reads: Vec<String> = [
        "heatmap?",
        "heatmap?rows=10&",
        "heatmap?cpu=1&",
        "heatmap?function=profiler_test_hot_loop&",
        "cputime?",
        "cputime?bucket=100ms&",
        "findings?",
        "events?",
        "counters?",
        "flamegraph?format=folded&",
        "flamegraph?format=folded&cpu=1&comm=busy-helper&",
        "flamegraph?format=folded&function=profiler_test_hot_loop&",
        "flamegraph?format=folded&context=task&",
    ]
    .iter()
    .map(|r| format!("/api/{r}{w}"))
    .collect();
    reads.push(format!("/api/flamegraph?format=svg&{sel}"));
    reads.push(format!("/api/heatmap?{sel}"));
    reads
}

/// Each of `paths` from the servers at `x` and `y`: the same status and body, byte for byte;
/// returns how many were compared.
fn same_api(x: &str, xt: Option<&str>, y: &str, yt: Option<&str>, paths: &[String], xn: &str, yn: &str) -> usize {
    for path in paths {
        let ((xc, xb), (yc, yb)) = (get(x, path, xt), get(y, path, yt));
        assert_eq!(xc, 200, "{xn}: {path}: {xb}");
        if path.contains("/api/counters") {
            assert!(xb.contains("\"points\":[["), "{path}: the node recorded counter tracks: {xb}");
        }
        if (xc, &xb) != (yc, &yb) {
            let at = xb.bytes().zip(yb.bytes()).position(|(p, q)| p != q).unwrap_or(xb.len().min(yb.len()));
            let around = |s: &str| s.get(at.saturating_sub(200)..(at + 200).min(s.len())).unwrap_or("").to_string();
            panic!(
                "{path}: {xn} answered {xc} ({} bytes), {yn} {yc} ({} bytes); at byte {at}:\n--- {xn}\n{}\n--- {yn}\n{}",
                xb.len(),
                yb.len(),
                around(&xb),
                around(&yb)
            );
        }
    }
    paths.len()
}

/// The fleet page over what the real daemons shipped (issue 39, part 4): `/` without a node is
/// the fleet page (with one, the node's), and each cell of `/api/fleet` is the busiest CPU's
/// share that the raw `cpu_seconds` rows give for that node and second.
fn fleet_page_cells(ch: &ClickHouse, base: &str, token: Option<&str>, a: u64, b: u64) {
    assert!(get(base, "/", None).1.contains("window.fleetUI"), "/ is the fleet page");
    assert!(get(base, "/?node=node-a", None).1.contains("window.profilerUI"), "a node's address is its page");
    let (code, body) = get(base, &format!("/api/fleet?from={a}&to={b}"), token);
    assert_eq!(code, 200, "{body}");
    let board: serde_json::Value = serde_json::from_str(&body).unwrap();
    let raw = ch
        .query(&format!(
            "SELECT node, intDiv(ts - {}, {SEC}) AS col, cpu, sum(b), sum(i) FROM (SELECT node, ts, cpu, max(busy) AS b, \
             max(greatest(toInt64(idle), toInt64(intDiv(toUInt64(hz) * span, 1000000000)) - busy - lost)) AS i \
             FROM profiler.cpu_seconds WHERE ts >= {} AND ts < {} GROUP BY node, ts, cpu) \
             GROUP BY node, col, cpu FORMAT TSV",
            a * SEC,
            a * SEC,
            b * SEC
        ))
        .unwrap();
    // Per cell the busiest CPU's busy ticks over the most ticks a CPU had there, idle being the
    // ticks Hz gives a block's span that were neither busy nor lost (at least those counted):
    // this VM's CPUs take no ticks while idle, and busy / (busy + idle) read them 100 % busy.
    let mut most: std::collections::BTreeMap<(String, usize), (f64, f64)> = Default::default();
    for line in raw.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let (busy, idle): (f64, f64) = (f[3].parse().unwrap(), f[4].parse().unwrap());
        let m = most.entry((f[0].to_string(), f[1].parse().unwrap())).or_default();
        *m = (m.0.max(busy), m.1.max(busy + idle));
    }
    let want: std::collections::BTreeMap<(String, usize), f64> =
        most.into_iter().map(|(k, (b, t))| (k, if t > 0.0 { b / t } else { 0.0 })).collect();
    let rows = board["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{board}");
    for row in rows {
        let node = row["label"].as_str().unwrap();
        for (col, v) in row["values"].as_array().unwrap().iter().enumerate() {
            let w = want.get(&(node.to_string(), col));
            assert_eq!(v.as_f64().map(|v| (v * 1e9).round()), w.map(|w| (w * 1e9).round()), "{node} column {col}");
        }
        // The busy loop holds CPU 1 of both nodes.
        assert!(row["score"].as_f64().unwrap() > 0.9, "{row}");
    }
}

/// In Chromium: the node field lists both nodes, the address picks node-b, and typing node-a
/// then Load switches every chart and the header to it.
fn page_switches_nodes(base: &str, token: &str, from: &str, to: &str) {
    if !browser::installed() {
        skip("the page check needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let url = format!("{base}/?node=node-b&from={from}&to={to}&cpu=1#token={token}");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&url).await.unwrap();
        let shown = |node: &str| {
            format!(
                "const q = document.getElementById('heatmap').dataset.query || ''; \
                 return q.includes('node={node}') && window.profilerUI.state.grid \
                     && document.getElementById('h-node').textContent === '{node}' \
                 ? [[...document.querySelectorAll('#nodes option')].map((o) => o.value), \
                    document.getElementById('h-health').textContent, location.search] : null"
            )
        };
        let b = browser::until(&client, "node-b's heatmap", &shown("node-b")).await;
        assert_eq!(b[0], serde_json::json!(["node-a", "node-b"]), "{b}");
        assert!(b[1].as_str().unwrap().contains("2 nodes"), "the header says where it reads: {b}");
        client
            .execute(
                "const n = document.getElementById('node'); n.value = 'node-a'; \
                 document.getElementById('load').click()",
                vec![],
            )
            .await
            .unwrap();
        let a = browser::until(&client, "node-a's heatmap", &shown("node-a")).await;
        assert!(a[2].as_str().unwrap().contains("node=node-a"), "the address keeps the node: {a}");
        let _ = client.close().await;
    });
}

/// What the node page costs for one 192-CPU node's hour at 99 Hz, half busy (34.2 M sample
/// rows, 1.4 M counter points, `integration_tests::big_node`), in a local 18.16: each endpoint
/// the page calls for the hour, and a 10 s selection's flamegraph, median of 3. Nothing is
/// copied, so no cap refuses it (the copy stopped at 12 M samples). Prints what BENCHMARKS.md
/// records: `CI=true PROFILER_BIN=$PWD/target/release/profiler cargo test --release -p
/// integration-tests --test fleet_ui -- --ignored --nocapture big_node_page`.
#[test]
#[ignore]
fn big_node_page_answers_an_hour() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let secs = 3600;
    let t0 = integration_tests::big_node::make(&ch, &big_schema(), 192, 99, secs, true) / SEC;
    let (base, token, _ui) = serve(&ch.url(), "127.0.0.1:7073");
    let w = format!("node=big&from={t0}&to={}", t0 + secs);
    let sel = format!("node=big&from={}&to={}", t0 + 1800, t0 + 1810);
    let reads = [
        ("status", "/api/status?node=big".to_string()),
        ("heatmap, the hour", format!("/api/heatmap?{w}")),
        ("CPU x time, the hour", format!("/api/cputime?{w}")),
        ("findings", format!("/api/findings?{w}")),
        ("events", format!("/api/events?{w}")),
        ("counter tracks, the hour", format!("/api/counters?{w}")),
        ("flamegraph (JSON), the hour", format!("/api/flamegraph?format=json&{w}")),
        ("flamegraph (JSON), 10 s selected", format!("/api/flamegraph?format=json&{sel}")),
        ("heatmap, CPU 3, the hour", format!("/api/heatmap?cpu=3&{w}")),
    ];
    let mut load = 0.0;
    for (what, path) in reads {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let (code, body) = get(&base, &path, Some(&token));
            times.push(t.elapsed().as_secs_f64());
            assert_eq!(code, 200, "{what}: {}", body.get(..300).unwrap_or(&body));
            size = body.len();
        }
        times.sort_by(f64::total_cmp);
        load += times[1];
        eprintln!(
            "{what}: {:.0} ms (median of 3: {:.0}, {:.0}, {:.0} ms), {size} bytes",
            times[1] * 1e3,
            times[0] * 1e3,
            times[1] * 1e3,
            times[2] * 1e3
        );
    }
    eprintln!("the page's load (every read above once, one after another): {load:.1} s");
}

/// What `ch` holds, into chdb: the schema, and the rows of every table a read uses.
fn copy_into(chdb: &ChdbServer, ch: &ClickHouse) {
    use profiler::ship::clickhouse::schema;
    let layout = schema::Layout { database: "profiler", cluster: None, ttl_secs: Some(604_800), codecs: true };
    let tables = [
        schema::NODES,
        schema::STACKS,
        schema::STACK_FRAMES,
        schema::FRAME_DICT,
        schema::STACK_LOCATIONS,
        schema::FINDINGS,
        schema::EVENTS,
        schema::CPU_SECONDS,
        schema::COUNTERS,
        schema::SAMPLES,
        schema::CUDA_SAMPLES,
    ];
    chdb.copy_of(ch, &schema::statements(&layout), &tables);
}

/// The statements of the schema the big node is made in (no codecs: 18.16).
fn big_schema() -> Vec<String> {
    use profiler::ship::clickhouse::schema;
    schema::statements(&schema::Layout { database: "profiler", cluster: None, ttl_secs: None, codecs: false })
}
