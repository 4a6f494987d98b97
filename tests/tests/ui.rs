//! The live UI and API with the real daemon: the web page in a real headless Chromium (through
//! chromedriver), /metrics read as Prometheus text, and bad parameters answered with a 400.

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, helper_bin, now_secs, privileged, skip, wait_for};

/// A plain HTTP/1.1 GET with the API token: (status, body).
fn get(port: u16, path: &str) -> (u16, String) {
    get_as(port, path, "127.0.0.1", Some(&token()))
}

fn get_as(port: u16, path: &str, host: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let auth = token.map_or(String::new(), |t| format!("X-Profiler-Token: {t}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

thread_local! {
    static TOKEN: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn token() -> String {
    TOKEN.with_borrow(|t| t.clone())
}

/// Reads the token the daemon wrote into its data directory (`profiler ui` prints it).
fn load_token(data: &std::path::Path) -> String {
    let out = integration_tests::profiler(&["ui", "--data-dir", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let t = url.split_once("#token=").expect("token in the UI address").1.to_string();
    TOKEN.with_borrow_mut(|s| *s = t.clone());
    t
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn api_answers_and_metrics_parse() {
    if !privileged("api_answers_and_metrics_parse") {
        return;
    }
    let port = free_port();
    let started = now_secs();
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", &format!("127.0.0.1:{port}")]);
    load_token(&data);
    // Without the token, or under another host name (DNS rebinding), the API answers nothing.
    let (code, body) = get_as(port, "/api/flamegraph?format=folded", "127.0.0.1", None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = get_as(port, "/api/flamegraph?format=folded", "attacker.example", Some(&token()));
    assert_eq!(code, 403, "{body}");
    // On loopback even the metrics keep the Host check (a rebound name is refused).
    let (code, body) = get_as(port, "/metrics", "attacker.example", None);
    assert_eq!(code, 403, "{body}");
    let mode = std::fs::metadata(data.join("ui-url")).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    // Busy shares appear once the detectors have evaluated a complete second.
    let (code, body) = wait_for("a complete second in /metrics", Duration::from_secs(10), || {
        let (code, body) = get(port, "/metrics");
        body.contains("profiler_cpu_busy_ratio{").then_some((code, body))
    });
    assert_eq!(code, 200);
    let mut samples = 0;
    for line in body.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# ") {
            assert!(rest.starts_with("HELP ") || rest.starts_with("TYPE "), "{line}");
            continue;
        }
        // name{labels} value
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let name = series.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
        if let Some(labels) = series.strip_prefix(name) {
            assert!(labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')), "{line}");
        }
        samples += 1;
    }
    assert!(samples > 10 && body.contains("profiler_samples_total{cpu=\"0\""), "{body}");
    // And a Prometheus text-format parser reads it.
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("prometheus text");
    let busy: Vec<_> = scrape.samples.iter().filter(|s| s.metric == "profiler_samples_total").collect();
    assert!(busy.len() >= 2, "{:?}", scrape.samples);
    for metric in [
        "profiler_process_resident_memory_bytes",
        "profiler_ring_buffer_used_bytes",
        "profiler_cpu_busy_ratio",
        "profiler_store_bytes",
        "profiler_symbol_cache_entries",
    ] {
        assert!(scrape.samples.iter().any(|s| s.metric == metric), "{metric} missing");
    }
    // The span runs from the first sample, not from the start of its minute's file.
    let span = wait_for("the store's span in /metrics", Duration::from_secs(15), || {
        let (_, body) = get(port, "/metrics");
        let line = body.lines().find(|l| l.starts_with("profiler_store_span_seconds "))?.to_string();
        line.rsplit_once(' ')?.1.parse::<f64>().ok().filter(|&v| v > 0.0)
    });
    let up = now_secs() - started;
    assert!(span <= up + 0.5, "the store spans {span} s of a daemon up for {up:.1} s");
    for bad in [
        "/api/heatmap?from=yesterday",
        "/api/flamegraph?cpu=x",
        "/api/heatmap?path=/etc/passwd",
        "/api/cputime?bucket=1ms",
    ] {
        let (code, body) = get(port, bad);
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(!body.trim().is_empty() && !body.contains("panicked"), "{bad}: {body}");
    }
    // Workload filters are parameters too (no pod is named so here: nothing matches).
    let (code, body) = get(port, "/api/flamegraph?format=folded&from=-30s&pod=no-such-pod&namespace=ml");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no samples match --pod no-such-pod --namespace ml"), "{body}");
    let (code, body) = get(port, "/api/heatmap?from=-30s");
    assert_eq!(code, 200, "{body}");
    // pprof: `go tool pprof` reads the export when Debian's golang-go is installed.
    let pb = tmp.path().join("profile.pb.gz");
    let out = integration_tests::profiler(&[
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        "-1m",
        "--format",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if let Ok(top) = Command::new("go").args(["tool", "pprof", "-top"]).arg(&pb).output() {
        assert!(top.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&top.stderr));
        assert!(String::from_utf8_lossy(&top.stdout).contains("flat"), "{}", String::from_utf8_lossy(&top.stdout));
    } else {
        eprintln!("go is not installed: pprof checked with the prost decoder only (unit test)");
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 50);
    assert!(daemon.stop().success());
}

/// Listening beyond loopback (as the DaemonSet does, for Prometheus): `/metrics` answers a
/// scraper that names the node's address, the API still refuses it.
#[test]
fn metrics_are_scraped_off_loopback_but_the_api_is_not() {
    if !privileged("metrics_are_scraped_off_loopback_but_the_api_is_not") {
        return;
    }
    let port = free_port();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", &format!("0.0.0.0:{port}")]);
    let token = load_token(&data);
    let node = format!("10.1.2.3:{port}");
    let (code, body) = get_as(port, "/metrics", &node, None);
    assert!(code == 200 && body.contains("profiler_samples_total"), "{code}: {body}");
    let (code, body) = get_as(port, "/api/heatmap?from=-30s", &node, Some(&token));
    assert_eq!(code, 403, "{body}");
    let (code, body) = get_as(port, "/api/heatmap?from=-30s", &format!("localhost:{port}"), Some(&token));
    assert_eq!(code, 200, "{body}");
    assert!(daemon.stop().success());
}

#[test]
fn the_page_shows_the_flamegraph_of_a_range_selected_on_the_heatmap() {
    if !privileged("the_page_shows_the_flamegraph_of_a_range_selected_on_the_heatmap") {
        return;
    }
    let chromium =
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().find(|p| std::path::Path::new(p).exists());
    let driver = ["/usr/bin/chromedriver"].into_iter().find(|p| std::path::Path::new(p).exists());
    let (Some(chromium), Some(driver)) = (chromium, driver) else {
        skip("the browser test needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    };
    let port = free_port();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--listen", &format!("127.0.0.1:{port}")]);
    let token = load_token(&data);
    let start = now_secs();
    let st = Command::new(helper_bin()).args(["1", "4"]).stdout(Stdio::null()).status().unwrap();
    assert!(st.success());
    let end = now_secs();
    wait_for("the helper's samples", Duration::from_secs(5), || {
        let (code, _) = get(port, &format!("/api/flamegraph?from={:.3}&to={:.3}&cpu=1&format=folded", start, end));
        (code == 200).then_some(())
    });

    let dport = free_port();
    let _driver = Kill(
        Command::new(driver)
            .arg(format!("--port={dport}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let found = rt.block_on(async move {
        use fantoccini::{ClientBuilder, Locator};
        let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--window-size=1400,1000"]
            }
        }))
        .unwrap();
        let url = format!("http://127.0.0.1:{dport}");
        let client = loop {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if now_secs() < end + 60.0 => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("cannot reach chromedriver: {e}"),
            }
        };
        let t0 = now_secs();
        client.goto(&format!("http://127.0.0.1:{port}/#token={token}")).await.unwrap();
        // The helper's window, on CPU 1.
        client.find(Locator::Id("from")).await.unwrap().clear().await.unwrap();
        client.find(Locator::Id("from")).await.unwrap().send_keys(&format!("{:.3}", start)).await.unwrap();
        client.find(Locator::Id("to")).await.unwrap().clear().await.unwrap();
        client.find(Locator::Id("to")).await.unwrap().send_keys(&format!("{:.3}", end)).await.unwrap();
        client.find(Locator::Id("cpu")).await.unwrap().send_keys("1").await.unwrap();
        let t_load = now_secs();
        client.find(Locator::Id("load")).await.unwrap().click().await.unwrap();
        // Cells with samples of the range asked for (the page's own first load, of its default
        // range, may land first; one WebDriver round trip per poll): click the first, then the last.
        let cells = loop {
            let busy = client
                .find_all(Locator::Css("#heatmap[data-query*='cpu=1'] rect:not([data-samples='0'])"))
                .await
                .unwrap();
            if !busy.is_empty() {
                break busy;
            }
            assert!(now_secs() < t0 + 20.0, "the heatmap never showed samples");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let heatmap_at = now_secs() - t_load;
        cells[0].click().await.unwrap();
        cells[cells.len() - 1].click().await.unwrap();
        let t_select = now_secs();
        let found = loop {
            let html = client.find(Locator::Id("flamegraph")).await.unwrap().html(true).await.unwrap();
            if html.contains("profiler_test_hot_loop") {
                break true;
            }
            if now_secs() > t0 + 20.0 {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!(
            "page: heatmap {heatmap_at:.2} s after Load, flamegraph {:.2} s after the end cell was clicked",
            now_secs() - t_select
        );
        // Where the NIC's interrupts go, as `profiler status` says it (issue 16, part 1).
        let irqs = client.find(Locator::Id("irqs")).await.unwrap().text().await.unwrap();
        client.close().await.unwrap();
        (found, irqs)
    });
    let (found, irqs) = found;
    let placement = profiler::collect::irqs::Placement::read();
    if let Some(nic) = placement.irqs.iter().find(|i| i.kind == profiler::collect::irqs::DeviceKind::Nic) {
        let expected = format!("{} interrupts: CPU {} (", nic.device, nic.cpus.first().copied().unwrap_or(0));
        assert!(
            irqs.contains(&expected) && irqs.contains(&nic.name),
            "the page shows {expected}...{}: {irqs:?}",
            nic.name
        );
    }
    assert!(found, "the flamegraph of the selected range does not name the helper's busy function");
    assert!(daemon.stop().success());
}
