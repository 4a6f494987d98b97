//! The page for any node of a fleet (issue 15): `profiler ui --clickhouse URL` serves the UI
//! from what two daemons shipped to ClickHouse. Its API answers for a node as the node's own
//! store does, asks which node when several shipped, refuses unknown nodes and requests
//! without the token, listens on loopback, and leaves no copy behind when it stops; in
//! Chromium, the node field lists the nodes and switches the page between them.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Command, Stdio},
};

use integration_tests::{
    Daemon, Kill,
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

/// The private copies (`profiler-fleet-*` in the temporary directory) that exist now.
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
        // A selection inside the window, then the window with a CPU filter (from the copy).
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

    fleet_page_cells(&ch, &base, token, a, b);
    page_switches_nodes(&base, &token_text, &from, &to);

    // Stopped, it leaves none of its copies behind.
    assert!(copies().difference(&before).count() > 0, "the copies exist while it serves");
    assert!(Command::new("kill").args(["-TERM", &ui.0.id().to_string()]).status().unwrap().success());
    let stopped = ui.0.wait().unwrap();
    assert!(stopped.success(), "{stopped}");
    let left: Vec<_> = copies().difference(&before).cloned().collect();
    assert!(left.is_empty(), "copies left behind: {left:?}");
    eprintln!("2 nodes served from ClickHouse; flamegraphs equal to each node's store");
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
             max(idle) AS i FROM profiler.cpu_seconds WHERE ts >= {} AND ts < {} GROUP BY node, ts, cpu) \
             GROUP BY node, col, cpu FORMAT TSV",
            a * SEC,
            a * SEC,
            b * SEC
        ))
        .unwrap();
    let mut want: std::collections::BTreeMap<(String, usize), f64> = Default::default();
    for line in raw.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let (busy, idle): (f64, f64) = (f[3].parse().unwrap(), f[4].parse().unwrap());
        let peak = want.entry((f[0].to_string(), f[1].parse().unwrap())).or_insert(0.0);
        if busy + idle > 0.0 {
            *peak = peak.max(busy / (busy + idle));
        }
    }
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
