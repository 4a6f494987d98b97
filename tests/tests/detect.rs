//! The detectors on real scenarios reproduced on this kernel (issue 4): a kernel hog on one
//! CPU (S1), zombie memory cgroups (S2), starved NAPI work (S3), a reset in the kernel log
//! (S4), and a healthy busy machine that must stay quiet. Each scenario cleans up after itself,
//! also when it fails (guards below).

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, Kill, folded, helper_bin, now_secs, privileged, profiler, skip, status_json, wait_for, wait_for_every,
};
use serde_json::Value;

fn bin(name: &str) -> PathBuf {
    helper_bin().with_file_name(name)
}

fn spawn(cmd: &mut Command) -> Kill {
    Kill(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn"))
}

fn findings(dir: &str) -> Vec<Value> {
    let out = profiler(&["findings", "--data-dir", dir, "--from", "-15m", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("findings json")
}

/// Waits for a finding of `kind` (on `cpu`, if given); returns it and when it was seen.
/// Polls every 250 ms: each poll runs a query, and the saturation detector weighs how busy the
/// whole (2-CPU) machine is.
fn wait_finding(dir: &str, kind: &str, cpu: Option<u64>, timeout: Duration) -> (Value, f64) {
    wait_for_every(&format!("a {kind} finding"), timeout, Duration::from_millis(250), || {
        findings(dir)
            .into_iter()
            .find(|f| f["kind"] == kind && cpu.is_none_or(|c| f["cpu"] == c))
            .map(|f| (f, now_secs()))
    })
}

/// End of the newest samples in the store, unix seconds.
fn store_end(data: &std::path::Path) -> Option<f64> {
    Some(status_json(data)?["summary"]["span"][1].as_u64()? as f64 / 1e9)
}

fn summary(f: &Value) -> &str {
    f["summary"].as_str().unwrap_or_default()
}

#[test]
fn s1_kernel_hog_and_s4_reset_event() {
    if !privileged("s1_kernel_hog_and_s4_reset_event") {
        return;
    }
    // One saturated core is already half of this 2-CPU machine; the other carries this debug
    // build's daemon and the test's queries (~15 % measured). A fleet node's aggregate would
    // hardly move; here "the machine looks fine" has to allow for them.
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[detect]\nmachine_busy_max = 0.75\n").unwrap();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&["--config", config.path().to_str().unwrap()]);
    let dir = data.to_str().unwrap();

    // S1: CPU 1 spends its time in the kernel (zeroing buffers for read(2) of /dev/zero).
    let start = now_secs();
    // taskset execs dd, so the guard kills dd itself.
    let _hog = spawn(Command::new("taskset").args(["-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M"]));
    let (sat, sat_at) = wait_finding(dir, "saturated-core", Some(1), Duration::from_secs(20));
    let (hot, hot_at) = wait_finding(dir, "hot-kernel-function", Some(1), Duration::from_secs(20));
    eprintln!("S1 detector 1 after {:.1} s: {}", sat_at - start, summary(&sat));
    eprintln!("S1 detector 2 after {:.1} s: {}", hot_at - start, summary(&hot));
    assert!(summary(&sat).contains("CPU 1 saturated") && summary(&sat).contains("dd (pid"), "{sat}");
    assert_eq!(sat["evidence"]["mode"], "kernel", "{sat}");
    let function = hot["evidence"]["function"].as_str().unwrap().to_string();
    assert!(
        ["read_zero", "iov_iter_zero", "clear_user", "__clear_user", "clear_user_erms", "rep_stos_alternative"]
            .contains(&function.as_str()),
        "dd's kernel time is zeroing user buffers, not {function}: {hot}"
    );
    assert!(summary(&hot).contains("of CPU 1") && summary(&hot).contains("dd (pid"), "{hot}");

    // S4: a reset-like line in the kernel log becomes an event...
    let nonce = format!("{}", std::process::id());
    let line = format!("<3>ena 0000:00:06.0 eth0: Device reset completed successfully (profiler test {nonce})\n");
    std::fs::write("/dev/kmsg", line).expect("write /dev/kmsg");
    let written = now_secs();
    let (event, event_at) = wait_for("the reset event", Duration::from_secs(10), || {
        let out = profiler(&["events", "--data-dir", dir, "--from", "-5m", "--format", "json"]);
        let events: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        events.into_iter().find(|e| e["message"].as_str().is_some_and(|m| m.contains(&nonce))).map(|e| (e, now_secs()))
    });
    eprintln!("S4 event after {:.1} s: {}", event_at - written, event["message"]);
    // Kernel-log times (printk's clock) land on the samples' time axis: the line is stamped
    // when it was written, not seconds off.
    let stamped = event["ts_ns"].as_f64().unwrap() / 1e9;
    assert!((stamped - written).abs() < 0.5, "written at {written:.3}, stamped {stamped:.3}");
    // ...and the flamegraph around it shows the S1 hog on CPU 1.
    let id = event["id"].as_str().unwrap();
    wait_for("the store to hold samples a second past the event", Duration::from_secs(10), || {
        (store_end(&data)? > written + 1.5).then_some(())
    });
    let stacks = folded(dir, &["--around", id, "--before", "5s", "--after", "1s", "--cpu", "1"]).unwrap();
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    let hog: u64 = stacks
        .iter()
        .filter(|(s, _)| s.starts_with("dd;") && s.contains(&format!("{function}_[k]")))
        .map(|(_, c)| c)
        .sum();
    assert!(hog * 2 > total, "around {id}: dd in {function} has {hog} of {total} samples");
    // --around a finding defaults to its CPU.
    let hot_id = hot["id"].as_str().unwrap();
    let out = profiler(&["flamegraph", "--data-dir", dir, "--around", hot_id, "--format", "folded"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).lines().all(|l| !l.starts_with("busy-helper")));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&function));
    let bad = profiler(&["flamegraph", "--data-dir", dir, "--around", "no-such-id"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("no finding or event has the id"));
    assert!(daemon.stop().success());
}

/// A daemon killed while a finding is open: the next one closes it at the end of the data the
/// killed one wrote (not "open forever", not at the restart), and says so in its evidence.
#[test]
fn a_finding_left_open_by_a_killed_daemon_is_closed_at_restart() {
    if !privileged("a_finding_left_open_by_a_killed_daemon_is_closed_at_restart") {
        return;
    }
    // Any finding left open will do: a saturated core, whether or not the rest of the machine
    // has room (another build on both CPUs of this 2-CPU machine takes that room, and then the
    // detector rightly stays quiet: 2 of 2 runs failed so).
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[detect]\nmachine_busy_max = 1.0\n").unwrap();
    let config = ["--config", config.path().to_str().unwrap()];
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&config);
    let dir = data.to_str().unwrap();
    let hog = spawn(Command::new("taskset").args(["-c", "1", "dd", "if=/dev/zero", "of=/dev/null", "bs=1M"]));
    let (open, _) = wait_finding(dir, "saturated-core", Some(1), Duration::from_secs(20));
    assert!(open["end_ns"].is_null(), "{open}");
    daemon.kill9();
    let killed_at = now_secs();
    drop(hog);
    let id = open["id"].as_str().unwrap().to_string();
    assert!(findings(dir).iter().any(|f| f["id"] == id.as_str() && f["end_ns"].is_null()), "still open while down");
    let mut again = Daemon::start(&data, &config);
    again.wait_ready_since(killed_at);
    let closed = wait_for("the abandoned finding closed", Duration::from_secs(10), || {
        findings(dir).into_iter().find(|f| f["id"] == id.as_str() && !f["end_ns"].is_null())
    });
    let end = closed["end_ns"].as_u64().unwrap() as f64 / 1e9;
    let start = closed["start_ns"].as_u64().unwrap() as f64 / 1e9;
    assert!(start <= end && end <= killed_at + 0.5, "closed at {end}, killed at {killed_at}: {closed}");
    assert!(closed["evidence"]["closed_by"].as_str().is_some_and(|s| s.starts_with("restart")), "{closed}");
    assert!(again.log_text().contains("closed at the end of its data"), "{}", again.log_text());
    assert!(again.stop().success());
}

/// Zombie memcgs' parent cgroup and page-cache files, removed (and the zombies freed) on drop.
struct MemcgLab {
    parent: PathBuf,
    files: PathBuf,
}

impl Drop for MemcgLab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.files);
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
        let _ = std::fs::remove_dir(&self.parent);
    }
}

#[test]
fn s2_zombie_memcgs_are_counted_and_their_maker_named() {
    if !privileged("s2_zombie_memcgs_are_counted_and_their_maker_named") {
        return;
    }
    // Dying memory cgroups are made here through the v1 memory hierarchy (the v2 reading is a
    // unit test of `detect::zombies`: on this machine the memory controller is bound to v1).
    let root = PathBuf::from("/sys/fs/cgroup/memory");
    if !root.join("cgroup.procs").exists() {
        skip(&format!("the cgroup v1 memory hierarchy is not mounted at {}", root.display()));
        return;
    }
    let lab = MemcgLab {
        parent: root.join(format!("profiler-test-{}", std::process::id())),
        files: PathBuf::from(format!("/var/tmp/profiler-test-{}", std::process::id())),
    };
    std::fs::create_dir_all(&lab.parent).unwrap();
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();

    let start = now_secs();
    let st = Command::new(bin("memcg-maker")).arg(&lab.parent).arg(&lab.files).arg("3000").status().unwrap();
    assert!(st.success(), "memcg-maker failed");
    // A monitoring agent polling memory.stat, pinned to CPU 1.
    let _reader = spawn(Command::new(bin("memstat-reader")).arg(lab.parent.join("memory.stat")).args(["1", "15"]));
    // The finding may open while the maker is still at work; its figures follow the count.
    let (z, z_at) = wait_for("a zombie-memcgs finding counting 3000 dying cgroups", Duration::from_secs(30), || {
        findings(dir)
            .into_iter()
            .find(|f| f["kind"] == "zombie-memcgs" && f["evidence"]["dying"].as_u64().is_some_and(|d| d >= 3000))
            .map(|f| (f, now_secs()))
    });
    eprintln!("S2 detector 4 after {:.1} s: {}", z_at - start, summary(&z));
    assert!(z["evidence"]["dying"].as_u64().unwrap() >= 3000, "{z}");
    assert_eq!(z["evidence"]["makers"][0]["comm"], "memcg-maker", "{z}");
    assert!(z["evidence"]["makers"][0]["zombies"].as_u64().unwrap() >= 2900, "{z}");
    assert!(summary(&z).contains("made by memcg-maker (pid"), "{z}");
    // Detector 2 is not asserted here: newer kernels no longer walk dying memcgs in memory.stat,
    // so the reader's kernel time may spread over several functions. S1 tests detector 2.
    assert!(daemon.stop().success());
}

use integration_tests::netlab::{NetLab, ip};

#[test]
fn s3_starved_napi_work_is_found_with_its_cause() {
    if !privileged("s3_starved_napi_work_is_found_with_its_cause") {
        return;
    }
    let id = std::process::id() % 100_000;
    let lab = NetLab { a: format!("prof-a-{id}"), b: format!("prof-b-{id}") };
    let (va, vb) = (format!("pva{id}"), format!("pvb{id}"));
    ip(&["netns", "add", &lab.a]);
    ip(&["netns", "add", &lab.b]);
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
    ip(&["link", "set", &va, "netns", &lab.a]);
    ip(&["link", "set", &vb, "netns", &lab.b]);
    ip(&["-n", &lab.a, "addr", "add", "10.77.0.1/24", "dev", &va]);
    ip(&["-n", &lab.b, "addr", "add", "10.77.0.2/24", "dev", &vb]);
    ip(&["-n", &lab.a, "link", "set", &va, "up"]);
    ip(&["-n", &lab.b, "link", "set", &vb, "up"]);
    // The receiving veth polls with NAPI in its own thread (GRO on, threaded), and the sender
    // keeps TSO off so its datagrams take that path; the NAPI thread lives on CPU 1.
    let netlab = bin("netrx-lab");
    let nsexec = |ns: &str, args: &[&str]| {
        let st = Command::new("ip").args(["netns", "exec", ns]).args(args).status().expect("ip netns exec");
        assert!(st.success(), "in {ns}: {}", args.join(" "));
    };
    nsexec(&lab.b, &[netlab.to_str().unwrap(), "features", &vb, "1", "1"]);
    nsexec(&lab.a, &[netlab.to_str().unwrap(), "features", &va, "0", "0"]);
    nsexec(&lab.b, &["sh", "-c", &format!("echo 1 > /sys/class/net/{vb}/threaded")]);
    let napi = wait_for("the NAPI thread", Duration::from_secs(5), || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.trim().starts_with(&format!("napi/{vb}")).then(|| e.file_name().to_string_lossy().into_owned())
        })
    });
    let st = Command::new("taskset").args(["-pc", "1", &napi]).stdout(Stdio::null()).status().unwrap();
    assert!(st.success(), "pin the NAPI thread");

    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    let _blast = spawn(Command::new("ip").args(["netns", "exec", &lab.a, "taskset", "-c", "0"]).arg(&netlab).args([
        "blast",
        "10.77.0.2:9",
        "20",
    ]));
    let rx_packets = || {
        let out = Command::new("ip")
            .args(["netns", "exec", &lab.b, "cat"])
            .arg(format!("/sys/class/net/{vb}/statistics/rx_packets"))
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().ok()
    };
    let before = rx_packets().unwrap_or(0);
    wait_for("datagrams arriving on the veth", Duration::from_secs(5), || {
        rx_packets().filter(|&n| n > before + 1000).map(|_| ())
    });
    // A real-time task takes CPU 1 for 5 s: the NAPI thread (a normal task) cannot run, but
    // for the 5 % of each second that real-time throttling leaves to others.
    let start = now_secs();
    let mut hog = spawn(Command::new("chrt").args(["-f", "50"]).arg(helper_bin()).args(["1", "5"]));
    let (f, at) = wait_finding(dir, "netrx-starvation", Some(1), Duration::from_secs(15));
    assert!(hog.0.wait().unwrap().success(), "chrt -f 50 busy-helper");
    eprintln!("S3 detector 3 after {:.1} s: {}", at - start, summary(&f));
    assert!(summary(&f).contains("busy-helper (pid") && summary(&f).contains("SCHED_FIFO 50"), "{f}");
    let worst =
        f["evidence"]["poll_gap_max_ms"].as_f64().unwrap().max(f["evidence"]["latency_max_ms"].as_f64().unwrap());
    assert!(worst >= 100.0, "{f}");
    assert!(daemon.stop().success());
}

#[test]
fn a_healthy_busy_machine_raises_no_cpu_findings() {
    if !privileged("a_healthy_busy_machine_raises_no_cpu_findings") {
        return;
    }
    let (_tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let dir = data.to_str().unwrap();
    let start = now_secs();
    // Every CPU busy, however many there are: the machine is busy, no core stands out.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut spinners: Vec<Kill> =
        (0..cpus).map(|cpu| spawn(Command::new(helper_bin()).args([&cpu.to_string(), "60"]))).collect();
    assert!(spinners.iter_mut().all(|k| k.0.wait().unwrap().success()));
    // The detectors evaluate a second once it is in the store.
    let end = now_secs();
    wait_for("the store to pass the end of the run", Duration::from_secs(10), || {
        (store_end(&data)? > end + 3.0).then_some(())
    });
    let noisy: Vec<Value> = findings(dir)
        .into_iter()
        .filter(|f| {
            ["saturated-core", "hot-kernel-function", "runq-starvation"].contains(&f["kind"].as_str().unwrap_or(""))
        })
        .filter(|f| f["start_ns"].as_f64().unwrap() / 1e9 >= start - 1.0)
        .collect();
    assert!(noisy.is_empty(), "a healthy busy machine raised: {noisy:#?}");
    assert!(daemon.stop().success());
}
