//! Interrupt work on an idle CPU is busy, and labelled (issue 14 D): NET_RX processing steered
//! to an otherwise idle CPU shows up as busy softirq samples of the idle task (`swapper/N`) with
//! their kernel stacks (`net_rx_action`), under a `[softirq:NET_RX]` root frame; `--context`
//! selects them, and CPU x time counts them as softirq share. Before the fix every sample of
//! pid 0 was idle and had no stack, so none of this could be seen.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{Daemon, Kill, bin, folded, now_secs, privileged, profiler, skip, status_json, wait_for};

use integration_tests::netlab::{NetLab, ip};

fn nsexec(ns: &str, script: &str) {
    let st = Command::new("ip").args(["netns", "exec", ns, "sh", "-c", script]).status().expect("ip netns exec");
    assert!(st.success(), "in {ns}: {script}");
}

/// Idle time of `cpu` so far, in `/proc/stat` ticks.
fn cpu_idle_ticks(cpu: u32) -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let prefix = format!("cpu{cpu} ");
    let line = stat.lines().find(|l| l.starts_with(&prefix)).unwrap_or_default();
    line.split_whitespace().nth(4).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Polls `check` until it returns `Some` or `timeout` passes.
fn wait_for_or<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A kernel frame in folded output.
fn k(name: &str) -> String {
    format!("{name}_[k]")
}

#[test]
fn net_rx_on_an_idle_cpu_is_busy_softirq_time() {
    if !privileged("net_rx_on_an_idle_cpu_is_busy_softirq_time") {
        return;
    }
    if Command::new("ip").arg("-V").stdout(Stdio::null()).status().is_err() {
        skip("net_rx_on_an_idle_cpu_is_busy_softirq_time: iproute2 (`ip`) is not installed");
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        skip("net_rx_on_an_idle_cpu_is_busy_softirq_time: needs two CPUs (sender on 0, receiver on 1)");
        return;
    }
    let id = std::process::id() % 100_000;
    let lab = NetLab { a: format!("irq-a-{id}"), b: format!("irq-b-{id}") };
    let (va, vb) = (format!("iva{id}"), format!("ivb{id}"));
    ip(&["netns", "add", &lab.a]);
    ip(&["netns", "add", &lab.b]);
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
    ip(&["link", "set", &va, "netns", &lab.a]);
    ip(&["link", "set", &vb, "netns", &lab.b]);
    ip(&["-n", &lab.a, "addr", "add", "10.78.0.1/24", "dev", &va]);
    ip(&["-n", &lab.b, "addr", "add", "10.78.0.2/24", "dev", &vb]);
    ip(&["-n", &lab.a, "link", "set", &va, "up"]);
    ip(&["-n", &lab.b, "link", "set", &vb, "up"]);
    // The receiving veth has no NAPI of its own (GRO off, the default) and NAPI is not threaded:
    // a datagram goes to a CPU's backlog, and RPS picks the receiving CPU's. The sender runs on
    // the other CPU, so the receiver does nothing else for us: NET_RX softirqs (process_backlog,
    // ip_rcv, udp_rcv), at the exit of
    // the IPI that wakes it from idle.
    nsexec(&lab.b, &format!("test \"$(cat /sys/class/net/{vb}/threaded)\" = 0"));
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    // The receiver: of CPUs 0 and 1, the one whose idle task the sampler reaches more (other
    // work on a shared machine may keep a CPU busy, and on some VMs a halted vCPU gets no
    // cpu-clock ticks: here CPU 1's idle task never got one in 10 minutes while CPU 0's got
    // hundreds), then the one idle longer; CPU 0 when nothing tells them apart.
    // On a loaded machine neither idle task may get a sample for seconds, and /proc/stat's idle
    // ticks do not say which one the sampler reaches: wait (30 s at most) until one got a few.
    let probe = [cpu_idle_ticks(0), cpu_idle_ticks(1)];
    let idle_samples =
        |cpu: &str| status_json(&data).and_then(|s| s["summary"]["cpus"][cpu]["idle"].as_u64()).unwrap_or(0);
    let probe_start = Instant::now();
    let mut ticked = [0, 0];
    while probe_start.elapsed() < Duration::from_secs(3)
        || (ticked.iter().max() < Some(&5) && probe_start.elapsed() < Duration::from_secs(30))
    {
        std::thread::sleep(Duration::from_millis(500));
        ticked = [idle_samples("0"), idle_samples("1")];
    }
    let idled = [cpu_idle_ticks(0) - probe[0], cpu_idle_ticks(1) - probe[1]];
    let (rx, tx) = if (ticked[0], idled[0]) >= (ticked[1], idled[1]) { (0u32, 1u32) } else { (1, 0) };
    eprintln!(
        "receiving on CPU {rx} (idle samples {ticked:?}, idle ticks over the probe {idled:?}), sending from CPU {tx}"
    );
    nsexec(&lab.b, &format!("echo {:x} > /sys/class/net/{vb}/queues/rx-0/rps_cpus", 1u32 << rx));
    let start = now_secs();
    let from = format!("{start:.3}");
    let netlab = bin("netrx-lab");
    let _blast = Kill(
        Command::new("ip")
            .args(["netns", "exec", &lab.a, "taskset", "-c", &tx.to_string()])
            .arg(&netlab)
            // A steady 30,000 datagrams a second: a fifth or so of the receiver, so that it still
            // idles between bursts (as fast as possible, NET_RX alone saturates it and runs in
            // ksoftirqd/N: busy either way, never on the idle task).
            .args(["pace", "10.78.0.2:9", "150", "30000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the sender"),
    );

    // NET_RX samples on the receiver with the kernel stack that did the work, whatever task they
    // interrupted (the machine is shared: other work may run there too).
    let rx_arg = rx.to_string();
    let window = ["--cpu", &rx_arg, "--from", &from, "--to", "now"];
    let swapper = format!("swapper/{rx};");
    let on_idle = |line: &str| line.starts_with(&swapper);
    let net_rx = || {
        let mut args = window.to_vec();
        args.extend(["--context", "softirq:NET_RX"]);
        folded(dir, &args).ok()
    };
    let with_work = |lines: &[(String, u64)], idle: bool| -> u64 {
        lines.iter().filter(|(l, _)| (!idle || on_idle(l)) && l.contains(&k("net_rx_action"))).map(|(_, n)| n).sum()
    };
    let softirq = wait_for("NET_RX samples with net_rx_action on the receiving CPU", Duration::from_secs(40), || {
        net_rx().filter(|lines| with_work(lines, false) >= 20)
    });
    let total: u64 = softirq.iter().map(|(_, n)| n).sum();
    for (line, _) in &softirq {
        // The marker is the root of the kernel frames: right after the comm on the idle task
        // (no user frames), after the user frames on any other task (ksoftirqd has none).
        let first_kernel = line.split(';').find(|f| f.ends_with("_[k]"));
        assert_eq!(first_kernel, Some(k("[softirq:NET_RX]").as_str()), "{line}");
    }
    let names = ["process_backlog", "__netif_receive_skb", "ip_rcv", "udp_rcv", "__udp4_lib_rcv"];
    assert!(
        softirq.iter().any(|(l, _)| names.iter().any(|f| l.contains(&k(f)))),
        "the backlog's work under net_rx_action: {softirq:?}"
    );

    // Task context on the same CPU never carries a softirq marker; any softirq covers NET_RX.
    let mut args = window.to_vec();
    args.extend(["--context", "task"]);
    if let Ok(task) = folded(dir, &args) {
        assert!(task.iter().all(|(l, _)| !l.contains("[softirq:")), "task context with a marker: {task:?}");
    }
    let mut args = window.to_vec();
    args.extend(["--context", "softirq"]);
    let any: u64 = folded(dir, &args).expect("any softirq").iter().map(|(_, n)| n).sum();
    assert!(any >= total, "--context softirq ({any}) keeps at least the NET_RX samples ({total})");
    // A bad context is one sentence, not a panic.
    let out = profiler(&["flamegraph", "--data-dir", dir, "--from", &from, "--context", "softirq:NETRX"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not a softirq") && !err.contains("panicked"), "{err}");

    // CPU x time: the receiver's softirq share is part of its busy (and kernel) share.
    let out = profiler(&["cputime", "--data-dir", dir, "--from", &from, "--to", "now", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = String::from_utf8_lossy(&out.stdout);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("start_ns,cpu,busy_share,kernel_share,softirq_share"));
    let mut soft_sum = 0.0;
    for line in lines {
        let v: Vec<&str> = line.split(',').collect();
        let (busy, kernel, soft): (f64, f64, f64) =
            (v[2].parse().unwrap(), v[3].parse().unwrap(), v[4].parse().unwrap());
        assert!(soft <= kernel + 1e-3 && kernel <= busy + 1e-3, "softirq <= kernel <= busy: {line}");
        if v[1] == rx_arg {
            soft_sum += soft;
        }
    }
    assert!(soft_sum > 0.0, "CPU {rx} shows softirq time:\n{csv}");

    // The point of the fix: NET_RX that interrupted the idle task is busy, with its stack
    // (before it, every sample of pid 0 was idle and had none). That needs ticks that land on
    // the receiver's idle task, which other work on a shared machine may prevent (it never idles),
    // and which some VMs rarely deliver (a halted vCPU gets no cpu-clock ticks: README, Defaults).
    // Waited for with a deadline; if no tick reached its idle task meanwhile (no idle
    // sample either), this part cannot be checked here and says so (under CI=true, a failure).
    let idle_before = cpu_idle_ticks(rx);
    let Some(softirq) = wait_for_or(Duration::from_secs(100), || net_rx().filter(|lines| with_work(lines, true) >= 1))
    else {
        let idled = cpu_idle_ticks(rx).saturating_sub(idle_before);
        let idle_samples = status_json(&data).and_then(|s| s["summary"]["cpus"][&rx_arg]["idle"].as_u64()).unwrap_or(0);
        // Ticks did reach the idle task (idle samples), yet none in NET_RX: that is the bug.
        assert!(
            idle_samples < 30,
            "no NET_RX samples of the idle task on CPU {rx} in 100 s, though {idle_samples} ticks found it idle \
             ({idled} idle ticks of /proc/stat)"
        );
        skip(&format!(
            "net_rx_on_an_idle_cpu_is_busy_softirq_time: no tick reached CPU {rx}'s idle task ({idle_samples} idle samples, \
             {idled} idle ticks of /proc/stat in 100 s: other work on it, or a VM without idle ticks), so softirq \
             work on the idle task could not be observed"
        ));
        return;
    };
    let idle_task: Vec<&(String, u64)> = softirq.iter().filter(|(l, _)| on_idle(l)).collect();
    let n: u64 = idle_task.iter().map(|(_, n)| n).sum();
    eprintln!("CPU {rx}: {n} NET_RX samples on the idle task");
    for (line, _) in &idle_task {
        assert!(
            line.starts_with(&format!("{swapper}[softirq:NET_RX]_[k];")),
            "no user frames on the idle task: {line}"
        );
    }
    assert!(
        idle_task.iter().any(|(l, _)| names.iter().any(|f| l.contains(&k(f)))),
        "the backlog's work on the idle task: {idle_task:?}"
    );
    daemon.stop();
}
