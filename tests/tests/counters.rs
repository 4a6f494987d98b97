//! Kernel counters beside the samples (issue 16, part 6), with the real daemon: a UDP flood on
//! loopback makes NET_RX softirqs and softnet's `processed` rise on the CPU that handles it, and
//! `profiler counters --format json` shows it within a deadline; `/api/counters` answers the
//! same tracks for the same window.

use integration_tests::free_port;
use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, Kill, bin, now_secs, privileged, profiler, wait_for};
use serde_json::Value;

/// `profiler counters --format json` for a window, parsed.
fn counters(dir: &str, from: &str, to: &str, extra: &[&str]) -> Value {
    let mut args = vec!["counters", "--data-dir", dir, "--from", from, "--to", to, "--format", "json"];
    args.extend(extra);
    let out = profiler(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("counters JSON")
}

/// The largest mean rate per CPU of the track `name` over the points of `v`: (cpu, rate).
fn busiest(v: &Value, name: &str) -> Option<(u64, f64)> {
    let mut per_cpu: HashMap<u64, (f64, usize)> = HashMap::new();
    for t in v["tracks"].as_array()? {
        if t["name"] != name {
            continue;
        }
        let cpu = t["cpu"].as_u64()?;
        assert_eq!(t["unit"], "/s", "{t}");
        for p in t["points"].as_array()? {
            let e = per_cpu.entry(cpu).or_default();
            e.0 += p[1].as_f64()?;
            e.1 += 1;
        }
    }
    per_cpu.into_iter().map(|(cpu, (sum, n))| (cpu, sum / n as f64)).max_by(|a, b| a.1.total_cmp(&b.1))
}

/// The mean rate of `name` on `cpu` in `v`.
fn mean_on(v: &Value, name: &str, cpu: u64) -> f64 {
    let points: Vec<f64> = v["tracks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["name"] == name && t["cpu"].as_u64() == Some(cpu))
        .flat_map(|t| t["points"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p[1].as_f64())
        .collect();
    if points.is_empty() { 0.0 } else { points.iter().sum::<f64>() / points.len() as f64 }
}

fn get(port: u16, path: &str, token: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Profiler-Token: {token}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

#[test]
fn a_udp_flood_shows_in_net_rx_and_softnet_counters() {
    if !privileged("a_udp_flood_shows_in_net_rx_and_softnet_counters") {
        return;
    }
    let port = free_port();
    let (_tmp, data, _daemon) = Daemon::ready_in_tempdir(&["--listen", &format!("127.0.0.1:{port}")]);
    let dir = data.to_str().unwrap();
    // Before the flood: a few seconds of what the machine does anyway (other tests may run).
    let quiet_from = format!("{:.0}", now_secs().floor());
    let quiet = wait_for("three seconds of counters before the flood", Duration::from_secs(20), || {
        let v = counters(dir, &quiet_from, "now", &["--name", "softirq.NET_RX"]);
        let n = v["tracks"].as_array()?.first()?["points"].as_array()?.len();
        (n >= 3).then_some(v)
    });
    let quiet_softnet = counters(dir, &quiet_from, "now", &["--name", "softnet.processed"]);

    // Datagrams to loopback are received through the sending CPU's backlog, in NET_RX.
    let flood_from = now_secs().ceil() + 1.0;
    let _flood = Kill(
        Command::new(bin("netrx-lab"))
            .args(["pace", "127.0.0.1:9", "120", "20000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the UDP sender"),
    );
    let from = format!("{flood_from:.0}");
    let (cpu, net_rx, processed) = wait_for("NET_RX and softnet rates to rise", Duration::from_secs(40), || {
        if now_secs() < flood_from + 2.0 {
            return None;
        }
        let v = counters(dir, &from, "now", &["--name", "s*"]);
        let (cpu, net_rx) = busiest(&v, "softirq.NET_RX")?;
        let processed = mean_on(&v, "softnet.processed", cpu);
        let (before_rx, before_processed) =
            (mean_on(&quiet, "softirq.NET_RX", cpu), mean_on(&quiet_softnet, "softnet.processed", cpu));
        eprintln!(
            "CPU {cpu}: NET_RX {before_rx:.0}/s -> {net_rx:.0}/s, processed {before_processed:.0}/s -> {processed:.0}/s"
        );
        (net_rx >= before_rx + 500.0 && processed >= before_processed + 5000.0).then_some((cpu, net_rx, processed))
    });
    eprintln!("flood seen on CPU {cpu}: {net_rx:.0} NET_RX/s, {processed:.0} packets processed/s");

    // The API: the same tracks for the same (past, so settled) window.
    let to = format!("{:.0}", now_secs().floor() - 1.0);
    let cli = counters(dir, &from, &to, &[]);
    let url = String::from_utf8_lossy(&profiler(&["ui", "--data-dir", dir]).stdout).trim().to_string();
    let token = url.split_once("#token=").expect("token in the UI address").1;
    let (code, body) = get(port, &format!("/api/counters?from={from}&to={to}"), token);
    assert_eq!(code, 200, "{body}");
    let api: Value = serde_json::from_str(&body).expect("API JSON");
    assert_eq!(api.as_object().unwrap().keys().collect::<Vec<_>>(), ["tracks"], "exactly {{\"tracks\":[...]}}");
    assert_eq!(api, cli, "the API and the CLI answer the same tracks");
    let names: Vec<&str> = api["tracks"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    for want in ["softirq.NET_RX", "softnet.processed", "softnet.time_squeeze", "irq.total", "profiler.counters_cpu"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // Without the token: nothing.
    let (code, body) = get(port, "/api/counters", "wrong");
    assert_eq!(code, 401, "a wrong token is refused as such: {body}");
}
