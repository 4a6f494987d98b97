//! Reading the fleet from ClickHouse (issue 13): every read command given `--clickhouse URL
//! --node N` answers as the node's own store does, byte for byte; two daemons as two nodes ship
//! to two shards of a cluster, and either shard's Distributed tables answer for both.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, Kill,
    chdb::ChdbServer,
    clickhouse::{ClickHouse, ship_for, wait_shipped},
    helper_bin, now_secs, privileged, profiler, wait_for,
};

const SEC: u64 = 1_000_000_000;

/// A daemon shipping to `url` as `node`; `extra_config` joins the config file.
fn start_daemon(data: &Path, node: &str, url: &str, extra_config: &str) -> Daemon {
    // The busy CPU 1 is a finding even while other builds keep the machine busy.
    let config = data.with_extension("toml");
    std::fs::write(&config, format!("[detect]\nmachine_busy_max = 1.0\nsaturated_kernel_min = 0.0\n{extra_config}"))
        .unwrap();
    let config = config.to_str().unwrap();
    let mut d = Daemon::start(data, &["--listen", "off", "--node", node, "--clickhouse", url, "--config", config]);
    d.wait_ready();
    d
}

/// `profiler ARGS`: stdout, or a panic with stderr.
fn run(args: &[&str]) -> Vec<u8> {
    let out = profiler(args);
    assert!(out.status.success(), "profiler {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The command's answer from the data directory and from ClickHouse, which must be equal; the
/// answer. `-o FILE` outputs are compared as files.
/// The data a report carries (`window.PROFILER_REPORT`), without its kernel counters: they
/// stay on the node (ClickHouse gets samples, findings and events, not counters). As text:
/// flamegraph trees are deeper than serde_json's recursion limit.
fn report_data(path: &Path) -> String {
    let html = std::fs::read_to_string(path).unwrap();
    let start = html.find("window.PROFILER_REPORT = ").expect("a report's data") + "window.PROFILER_REPORT = ".len();
    let end = start + html[start..].find(";\n").expect("the end of a report's data");
    let data = &html[start..end];
    let (a, b) =
        (data.find(",\"counters\":").expect("counters"), data.find(",\"flamegraphs\":[").expect("flamegraphs"));
    format!("{}{}", &data[..a], &data[b..])
}

/// `profiler report` from the store and from ClickHouse: the same page and the same data.
fn same_report(data: &Path, url: &str, node: &str, out: &Path, window: &[&str]) {
    let o = out.to_str().unwrap();
    run(&[&["report", "-o", o, "--data-dir", data.to_str().unwrap()][..], window].concat());
    let local = report_data(out);
    run(&[&["report", "-o", o, "--clickhouse", url, "--node", node][..], window].concat());
    let fleet = report_data(out);
    assert!(local.contains("\"flamegraphs\":[{\"caption\""), "the report has flamegraphs");
    if local != fleet {
        let at = local.bytes().zip(fleet.bytes()).position(|(x, y)| x != y).unwrap_or(local.len().min(fleet.len()));
        let around = |s: &str| s.get(at.saturating_sub(200)..(at + 200).min(s.len())).unwrap_or("").to_string();
        panic!(
            "the report's data differs at byte {at}:\n--- store\n{}\n--- ClickHouse\n{}",
            around(&local),
            around(&fleet)
        );
    }
}

fn same_answer(data: &Path, url: &str, node: &str, args: &[&str]) -> Vec<u8> {
    same_answer_in(data, url, "profiler", node, args)
}

/// [`same_answer`], reading ClickHouse's database `db`.
fn same_answer_in(data: &Path, url: &str, db: &str, node: &str, args: &[&str]) -> Vec<u8> {
    let dir = data.to_str().unwrap();
    let (mut local, mut fleet) = (args.to_vec(), args.to_vec());
    local.extend(["--data-dir", dir]);
    fleet.extend(["--clickhouse", url, "--database", db, "--node", node]);
    let out_file = args.iter().position(|&a| a == "-o").map(|i| args[i + 1].to_string());
    let answer = |cmd: &[&str]| {
        let stdout = run(cmd);
        match &out_file {
            Some(f) => std::fs::read(f).unwrap(),
            None => stdout,
        }
    };
    let (a, b) = (answer(&local), answer(&fleet));
    if a != b {
        // Around the first difference (outputs can be megabytes).
        let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
        let around =
            |v: &[u8]| String::from_utf8_lossy(&v[at.saturating_sub(300)..(at + 300).min(v.len())]).into_owned();
        panic!(
            "profiler {} differs between the store ({} bytes) and ClickHouse ({} bytes) at byte {at}:\n--- store\n{}\n--- ClickHouse\n{}",
            args.join(" "),
            a.len(),
            b.len(),
            around(&a),
            around(&b)
        );
    }
    a
}

/// `profiler ARGS --clickhouse A` and `--clickhouse B` answer alike (`-o FILE`: the files).
fn same_on_both(a: &str, b: &str, args: &[&str]) {
    let out_file = args.iter().position(|&x| x == "-o").map(|i| args[i + 1].to_string());
    let answer = |url: &str| {
        let stdout = run(&[args, &["--clickhouse", url]].concat());
        match &out_file {
            Some(f) if f.ends_with(".html") => report_data(Path::new(f)).into_bytes(),
            Some(f) => std::fs::read(f).unwrap(),
            None => stdout,
        }
    };
    let (x, y) = (answer(a), answer(b));
    assert!(!x.is_empty(), "profiler {} answered nothing", args.join(" "));
    if x != y {
        let at = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
        let around =
            |v: &[u8]| String::from_utf8_lossy(&v[at.saturating_sub(200)..(at + 200).min(v.len())]).into_owned();
        panic!(
            "profiler {} differs between ClickHouse 18.16 and chdb at byte {at}:\n--- 18.16\n{}\n--- chdb\n{}",
            args.join(" "),
            around(&x),
            around(&y)
        );
    }
}

#[test]
fn read_commands_answer_from_clickhouse_as_from_the_store() {
    if !privileged("read_commands_answer_from_clickhouse_as_from_the_store") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let data = tmp.path().join("data");
    let mut daemon = start_daemon(&data, "fleet-a", &url, "");
    let a = now_secs().floor() as u64;
    // CPU 1 saturated for a while: a finding that opens and closes inside the window.
    let mut busy = Kill(Command::new(helper_bin()).args(["1", "600"]).stdout(Stdio::null()).spawn().unwrap());
    let dir = data.to_str().unwrap();
    let finding = wait_for("a finding about CPU 1", Duration::from_secs(60), || {
        let out = run(&["findings", "--data-dir", dir, "--from", "-5m", "--format", "json"]);
        let list: Vec<serde_json::Value> = serde_json::from_slice(&out).ok()?;
        list.into_iter().find(|f| f["cpu"] == 1).map(|f| f["id"].as_str().unwrap().to_string())
    });
    let _ = busy.0.kill();
    let _ = busy.0.wait();
    let b = now_secs().ceil() as u64 + 1;
    wait_shipped(&data, b * SEC);
    // Nothing changes from here on. The stop closes the findings still open (other builds may
    // keep CPU 1 busy) and ships them.
    daemon.stop();

    let (from, to) = (a.to_string(), b.to_string());
    let w = ["--from", from.as_str(), "--to", to.as_str()];
    let node = "fleet-a";
    let folded = same_answer(&data, &url, node, &[&["flamegraph", "--format", "folded"][..], &w].concat());
    let folded = String::from_utf8(folded).unwrap();
    assert!(folded.contains("profiler_test_hot_loop"), "the busy helper's stacks:\n{folded}");
    same_answer(
        &data,
        &url,
        node,
        &[&["flamegraph", "--cpu", "1", "--include-idle", "--comm", "busy-helper"][..], &w].concat(),
    );
    same_answer(&data, &url, node, &[&["flamegraph", "--format", "folded", "--include-idle"][..], &w].concat());
    same_answer(&data, &url, node, &[&["heatmap", "--format", "json"][..], &w].concat());
    let cputime = same_answer(&data, &url, node, &[&["cputime", "--format", "json"][..], &w].concat());
    let cputime: serde_json::Value = serde_json::from_slice(&cputime).unwrap();
    assert!(cputime.to_string().contains(&finding), "the finding is marked in CPU x time: {cputime}");
    same_answer(&data, &url, node, &[&["cputime", "--format", "csv", "--bucket", "100ms"][..], &w].concat());
    for format in ["perf-script", "folded", "speedscope"] {
        same_answer(&data, &url, node, &[&["export", "--format", format][..], &w].concat());
    }
    for format in ["pprof", "otlp"] {
        let file = tmp.path().join(format!("out.{format}"));
        let file = file.to_str().unwrap();
        same_answer(&data, &url, node, &[&["export", "--format", format, "-o", file][..], &w].concat());
    }
    let findings = same_answer(&data, &url, node, &[&["findings", "--format", "json"][..], &w].concat());
    assert!(String::from_utf8_lossy(&findings).contains(&finding));
    same_answer(&data, &url, node, &[&["events", "--format", "json"][..], &w].concat());

    // A server that daemons from before the frames dictionary shipped to holds stacks as text
    // (`stacks`): the reads answer alike from it, and from one holding some stacks each way.
    let (text, ids) = old_style_copy(&ch, "old");
    eprintln!("database old: {text} stacks as text, {ids} as frame ids");
    for args in [
        &["flamegraph", "--format", "folded"][..],
        &["flamegraph", "--format", "folded", "--function", "profiler_test_hot_loop"],
        &["cputime", "--format", "json"],
        &["heatmap", "--format", "json", "--function", "profiler_test_hot_loop"],
        &["export", "--format", "perf-script"],
    ] {
        same_answer_in(&data, &url, "old", node, &[args, &w].concat());
    }
    // `--around` and a report reach 1 s past a finding's end, and the daemon's stop closed
    // findings at a time ClickHouse has no samples for yet: the next run ships them.
    let stopped = now_secs().ceil() as u64;
    let mut again = start_daemon(&data, node, &url, "");
    wait_shipped(&data, (stopped + 2) * SEC);
    again.kill9();
    same_answer(&data, &url, node, &["flamegraph", "--format", "folded", "--around", &finding]);
    let report = tmp.path().join("report.html");
    same_report(&data, &url, node, &report, &w);
    eprintln!("[{a}, {b}): {} folded lines and every read command alike", folded.lines().count());

    // A read bounded in rows: the heaviest come, the rest is summed as one line, said so.
    {
        use profiler::{
            fleet::{Fleet, pushdown},
            model::SampleKind,
            query::{Filter, FoldBudget, Window},
        };
        let f = Fleet::new(&url, "profiler").unwrap();
        let sel = f.select(&[node.to_string()]).unwrap();
        let window = Window::new(a * SEC, b * SEC).unwrap();
        let budget = FoldBudget { max_stacks: 100_000, max_bytes: 1 << 30 };
        let fold = pushdown::fold_reading(&f, &sel, SampleKind::Cpu, window, &Filter::default(), budget, 3).unwrap();
        let total = |t: &str| t.lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum::<u64>();
        let other = fold.folded.stacks.get(pushdown::OTHER_STACKS).copied().unwrap_or(0);
        assert_eq!(fold.folded.stacks.len(), 4, "3 rows and the rest: {:?}", fold.folded.stacks.keys());
        assert!(other > 0 && fold.folded.total() == total(&folded), "the rest summed: {other} of {}", total(&folded));
        let note = fold.note.expect("a note says the fold was cut");
        assert!(note.contains("3 heaviest") && note.contains(pushdown::OTHER_STACKS), "{note}");
    }

    // The same reads on today's ClickHouse: what 18.16 holds, copied into chdb, answers alike.
    if let Some(chdb) = ChdbServer::start(&tmp.path().join("chdb")) {
        copy_into(&chdb, &ch);
        let c = chdb.url();
        let on = ["--node", node];
        let report = tmp.path().join("both.html");
        let pprof = tmp.path().join("both.pprof");
        let otlp = tmp.path().join("both.otlp");
        let reads: Vec<Vec<&str>> = vec![
            vec!["flamegraph", "--format", "folded"],
            vec!["flamegraph", "--format", "folded", "--cpu", "1", "--include-idle"],
            vec!["heatmap", "--format", "json"],
            vec!["cputime", "--format", "json"],
            vec!["cputime", "--format", "csv", "--bucket", "100ms"],
            vec!["export", "--format", "folded"],
            vec!["export", "--format", "perf-script"],
            vec!["export", "--format", "speedscope"],
            vec!["export", "--format", "pprof", "-o", pprof.to_str().unwrap()],
            vec!["export", "--format", "otlp", "-o", otlp.to_str().unwrap()],
            vec!["findings", "--format", "json"],
            vec!["events", "--format", "json"],
            vec!["report", "-o", report.to_str().unwrap()],
        ];
        for read in reads {
            same_on_both(&url, &c, &[&read[..], &on, &w].concat());
        }
        // The whole fleet (no --node) too.
        same_on_both(&url, &c, &[&["export", "--format", "folded"][..], &w].concat());
        eprintln!("every read answers alike from ClickHouse 18.16 and from chdb (current ClickHouse)");
    }

    // Clear sentences for the wrong node, an empty window and a server that is not there.
    let err = |args: &[&str]| {
        let out = profiler(args);
        assert!(!out.status.success(), "profiler {} succeeded", args.join(" "));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err(&["flamegraph", "--clickhouse", &url, "--node", "nope", "--from", &from, "--to", &to]);
    assert!(e.contains("node 'nope' has shipped nothing") && e.contains("fleet-a"), "{e}");
    let e = err(&["heatmap", "--clickhouse", &url, "--from", "100", "--to", "200"]);
    assert!(e.contains("no samples between") && e.contains("node fleet-a shipped"), "{e}");
    let e = err(&["events", "--clickhouse", &url, "--database", "nope"]);
    assert!(e.contains("holds no node in database `nope`"), "{e}");
    let e = err(&["cputime", "--clickhouse", "http://127.0.0.1:1", "--from", "-1m"]);
    assert!(e.contains("ClickHouse at 127.0.0.1:1 does not answer") && !e.contains("panicked"), "{e}");

    // A second node's finding, written as its shipper writes one: findings and events without
    // --node are the fleet's, read by the server, each naming its node.
    let stamp = (a + 1) * SEC;
    let rows = [
        format!(
            "INSERT INTO profiler.nodes (node, cpus, hz, online, host, version) VALUES ('fleet-b', 2, 99, '0-1', 'b', {stamp})"
        ),
        format!(
            "INSERT INTO profiler.findings (node, id, kind, ts, end_ts, cpu, severity, summary, evidence, version) VALUES \
             ('fleet-b', 'saturated-core-cpu0-b', 'saturated-core', {stamp}, {}, 0, 'warning', 'CPU 0 saturated on b', '{{}}', {stamp})",
            stamp + 3 * SEC
        ),
    ];
    for sql in rows {
        ch.query(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let fleet: Vec<serde_json::Value> = serde_json::from_slice(&run(&[
        "findings",
        "--clickhouse",
        &url,
        "--format",
        "json",
        "--from",
        &from,
        "--to",
        &to,
    ]))
    .unwrap();
    let of = |node: &str| -> Vec<serde_json::Value> {
        fleet
            .iter()
            .filter(|f| f["node"] == node)
            .map(|f| {
                let mut f = f.clone();
                f.as_object_mut().unwrap().remove("node");
                f
            })
            .collect()
    };
    let own: Vec<serde_json::Value> = serde_json::from_slice(&findings).unwrap();
    assert_eq!(of("fleet-a"), own, "the fleet's list holds node fleet-a's findings as its own list does");
    assert_eq!(of("fleet-b").len(), 1, "{fleet:?}");
    let text =
        String::from_utf8(run(&["findings", "--clickhouse", &url, "--node", "fleet-*", "--from", &from, "--to", &to]))
            .unwrap();
    assert!(text.lines().any(|l| l.starts_with("fleet-b  saturated-core-cpu0-b  Warning")), "{text}");
    assert!(text.lines().any(|l| l.starts_with(&format!("fleet-a  {finding}"))), "{text}");
}

#[test]
fn two_nodes_on_two_shards_read_through_either_shard() {
    if !privileged("two_nodes_on_two_shards_read_through_either_shard") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("shard1"), tmp.path().join("shard2")];
    let Some(shards) = ClickHouse::start_cluster("fleet", &dirs) else { return };
    let _busy = Kill(Command::new(helper_bin()).args(["1", "600"]).stdout(Stdio::null()).spawn().unwrap());
    // Each node ships to its own shard, as the docs tell a fleet to.
    let nodes = ["node-a", "node-b"];
    let data: Vec<_> = nodes.iter().map(|n| tmp.path().join(n)).collect();
    let (a, b) = ship_for(&data, 4, |i| {
        start_daemon(&data[i], nodes[i], &shards[i].url(), "[clickhouse]\ncluster = \"fleet\"\n")
    });
    let (from, to) = (a.to_string(), b.to_string());
    for (i, node) in nodes.iter().enumerate() {
        // The node's rows are on its shard only.
        let on = |s: &ClickHouse| {
            s.query(&format!("SELECT count() FROM profiler.samples_local WHERE node = '{node}'"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        assert!(on(&shards[i]) > 0 && on(&shards[1 - i]) == 0, "{node}'s rows are on shard {} only", i + 1);
        for shard in &shards {
            let args = ["flamegraph", "--format", "folded", "--from", &from, "--to", &to];
            let folded = same_answer(&data[i], &shard.url(), node, &args);
            assert!(!folded.is_empty());
            same_answer(&data[i], &shard.url(), node, &["cputime", "--format", "json", "--from", &from, "--to", &to]);
        }
    }
    // The fleet's flamegraph (no --node, or a glob) is the nodes' own folds added up, summed by
    // the servers: through either shard, the same.
    let parse = |text: &[u8]| -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for line in String::from_utf8_lossy(text).lines() {
            let (stack, n) = line.rsplit_once(' ').expect("a folded line");
            *m.entry(stack.to_string()).or_default() += n.parse::<u64>().expect("a count");
        }
        m
    };
    let mut expected = BTreeMap::new();
    for d in &data {
        let local =
            run(&["flamegraph", "--format", "folded", "--from", &from, "--to", &to, "--data-dir", d.to_str().unwrap()]);
        for (stack, n) in parse(&local) {
            *expected.entry(stack).or_insert(0) += n;
        }
    }
    for (shard, nodes) in [(&shards[0], &[][..]), (&shards[1], &["--node", "node-*"][..])] {
        let url = shard.url();
        let args =
            [&["flamegraph", "--format", "folded", "--clickhouse", &url, "--from", &from, "--to", &to][..], nodes];
        let fleet = parse(&run(&args.concat()));
        assert_eq!(fleet, expected, "the fleet's fold is its nodes' folds added up");
    }
    // Exports of several nodes: folded stacks summed by the servers, and each sample of the
    // nodes streamed in time order (perf-script: every sample of both, none twice).
    let url = shards[0].url();
    let fleet_export =
        parse(&run(&["export", "--format", "folded", "--clickhouse", &url, "--from", &from, "--to", &to]));
    assert_eq!(fleet_export, expected, "the fleet's folded export is its nodes' folds added up");
    let headers = |text: &[u8]| -> Vec<String> {
        let text = String::from_utf8_lossy(text);
        text.lines().filter(|l| !l.is_empty() && !l.starts_with(['#', '\t'])).map(String::from).collect()
    };
    let mut own: Vec<String> = data
        .iter()
        .flat_map(|d| {
            headers(&run(&[
                "export",
                "--format",
                "perf-script",
                "--from",
                &from,
                "--to",
                &to,
                "--data-dir",
                d.to_str().unwrap(),
            ]))
        })
        .collect();
    let merged =
        headers(&run(&["export", "--format", "perf-script", "--clickhouse", &url, "--from", &from, "--to", &to]));
    // `comm pid/tid [cpu] secs.micros: ...`: in time order.
    let time = |h: &String| -> f64 {
        h.split_whitespace().find(|t| t.ends_with(':')).unwrap().trim_end_matches(':').parse().unwrap()
    };
    assert!(merged.windows(2).all(|p| time(&p[0]) <= time(&p[1])), "the merged samples are in time order");
    let mut merged = merged;
    merged.sort();
    own.sort();
    assert!(!own.is_empty());
    assert_eq!(merged, own, "the fleet's perf-script holds each node's samples once");

    // One node's commands still name it.
    let out = profiler(&["cputime", "--clickhouse", &shards[0].url(), "--from", &from, "--to", &to]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("2 nodes (node-a, node-b)"), "{e}");
    eprintln!(
        "2 nodes on 2 shards: each node's flamegraph and CPU x time alike through either shard, the fleet's fold their sum"
    );
}

/// What the pushed-down reads cost one 192-CPU node's hour at 99 Hz, half busy (34.2 M sample
/// rows, made by the server itself from `numbers()`: 3,000 stacks of 12 frames, 50 processes),
/// in a local 18.16: each read's wall time, and the reader's peak RSS for the streamed exports
/// (a longer window must not cost more memory). Prints the figures BENCHMARKS.md records:
/// `CI=true PROFILER_BIN=$PWD/target/release/profiler cargo test -p integration-tests --test fleet
/// -- --ignored --nocapture big_node_reads`.
#[test]
#[ignore]
fn big_node_reads_pushed_down() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let url = ch.url();
    let secs = 3600u64;
    let t0 = integration_tests::big_node::make(&ch, &big_schema(), 192, 99, secs, false);
    let (from, to) = ((t0 / SEC).to_string(), (t0 / SEC + secs).to_string());
    let ten = (t0 / SEC + 600).to_string();
    let one = (t0 / SEC + 60).to_string();
    // Wall seconds and peak RSS (KiB) of one read, its output thrown away.
    let measure = |args: &[&str]| -> (f64, u64) {
        let o = Command::new("/usr/bin/time")
            .args(["-f", "TIME %e %M"])
            .arg(integration_tests::profiler_bin())
            .args(args)
            .args(["--clickhouse", &url, "--node", "big"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "profiler {}: {err}", args.join(" "));
        let line = err.lines().find_map(|l| l.strip_prefix("TIME ")).expect("/usr/bin/time's line");
        let (wall, rss) = line.split_once(' ').unwrap();
        (wall.parse().unwrap(), rss.parse().unwrap())
    };
    let report = tmp.path().join("report.html");
    let reads: Vec<(&str, Vec<&str>)> = vec![
        ("flamegraph folded, the hour", vec!["flamegraph", "--format", "folded", "--from", &from, "--to", &to]),
        ("export folded, the hour", vec!["export", "--format", "folded", "--from", &from, "--to", &to]),
        ("cputime 1 s, the hour", vec!["cputime", "--format", "json", "--from", &from, "--to", &to]),
        (
            "cputime 100 ms, 10 min",
            vec!["cputime", "--bucket", "100ms", "--format", "json", "--from", &from, "--to", &ten],
        ),
        ("report, the hour", vec!["report", "-o", report.to_str().unwrap(), "--from", &from, "--to", &to]),
        ("export perf-script, 1 min", vec!["export", "--format", "perf-script", "--from", &from, "--to", &one]),
        ("export perf-script, 10 min", vec!["export", "--format", "perf-script", "--from", &from, "--to", &ten]),
        ("export pprof, 1 min", vec!["export", "--format", "pprof", "--from", &from, "--to", &one]),
    ];
    for (what, args) in reads {
        let (wall, rss) = measure(&args);
        eprintln!("{what}: {wall:.2} s, peak RSS {:.0} MiB", rss as f64 / 1024.0);
    }
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

/// Database `db` as a server that daemons of both kinds shipped to holds it: this test's rows
/// (`profiler`), its stacks with an even id as text in `stacks` (what daemons before the frames
/// dictionary wrote), the others as frame ids. (Stacks as text, as frame ids.)
fn old_style_copy(ch: &ClickHouse, db: &str) -> (usize, usize) {
    use profiler::ship::clickhouse::{schema, track_rollups};
    let layout = schema::Layout { database: db, cluster: None, ttl_secs: None, codecs: false };
    for q in schema::statements(&layout).into_iter().chain(track_rollups::statements(&layout, 86_400)) {
        ch.query(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    let rows = [
        schema::NODES,
        schema::STACK_LOCATIONS,
        schema::FINDINGS,
        schema::EVENTS,
        schema::CPU_SECONDS,
        schema::COUNTERS,
        schema::CUDA_SAMPLES,
        schema::FRAME_DICT,
        schema::SAMPLES,
    ];
    for t in rows {
        ch.query(&format!("INSERT INTO {db}.{t} SELECT * FROM profiler.{t}")).unwrap();
    }
    ch.query(&format!("INSERT INTO {db}.stack_frames SELECT * FROM profiler.stack_frames WHERE stack_id % 2 = 1"))
        .unwrap();
    let stacks = integration_tests::clickhouse::stacks_as_text(ch, "profiler");
    let old: Vec<String> = stacks
        .iter()
        .filter(|(id, _)| *id % 2 == 0)
        .map(|(id, (frames, kernel))| {
            let frames: Vec<String> = frames.iter().map(|f| schema::quote_str(f)).collect();
            let kernel: Vec<String> = kernel.iter().map(u8::to_string).collect();
            format!("({id}, [{}], [{}])", frames.join(", "), kernel.join(", "))
        })
        .collect();
    ch.query(&format!("INSERT INTO {db}.stacks VALUES {}", old.join(", "))).unwrap();
    let counts = (old.len(), stacks.len() - old.len());
    assert!(counts.0 > 0 && counts.1 > 0, "stacks each way: {counts:?}");
    counts
}

/// The statements of the schema the big node is made in (no codecs: 18.16).
fn big_schema() -> Vec<String> {
    use profiler::ship::clickhouse::schema;
    schema::statements(&schema::Layout { database: "profiler", cluster: None, ttl_secs: None, codecs: false })
}
