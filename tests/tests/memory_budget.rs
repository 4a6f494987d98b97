//! The daemon under its unit's memory limit while an unprivileged user attacks it (issue 25):
//! it runs in a memory cgroup of 256 MiB, joined before exec (its BPF maps are charged there, as
//! under systemd), while user `nobody` runs files and processes built to make it grow: an
//! executable whose `.eh_frame` claims 1,000 MB of a sparse file, a compressed `.debug_frame`
//! that inflates to 63 MiB of rows, a 2.4 GB symbol table, five perf maps of 30 MB with
//! 500-character names, and 1,100 sleeping processes that fill the kernel's process table. The
//! daemon must stay up, never be OOM-killed, lose no sample, keep its anonymous memory under
//! 160 MiB, and still give a root program without frame pointers complete stacks. A second
//! round floods what grows with names and stacks: 24 files of 999,999 symbols each spun in at
//! once, JIT code called in ever new 126-frame chains named by a perf map of 500-character
//! names, and a Python program whose every call runs code objects never seen before, each with
//! a line table of 63 KB.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    Daemon, Kill, bin, folded_window,
    memcg::{MEMCG_V1, Memcg, NOBODY, UNIT_LIMIT},
    now_secs, privileged, skip, status_json, wait_for,
};

const LIMIT: u64 = UNIT_LIMIT;
/// `exe ARGS` as user nobody, at nice 10: the attacks are on memory, and spinning attackers at
/// the daemon's priority on two CPUs would only measure how far its pipeline falls behind.
fn as_nobody(exe: &Path, args: &[&str]) -> Kill {
    let child = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--", "nice", "-n", "10"])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv");
    Kill(child)
}

/// A figure of `/proc/PID/status` (`VmHWM`, `RssAnon`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn lost(data: &Path) -> u64 {
    let status = status_json(data).expect("status");
    let cpus = status["summary"]["cpus"].as_object().cloned().unwrap_or_default();
    cpus.values().map(|c| c["lost"].as_u64().unwrap_or(0)).sum()
}

/// A C program without frame pointers, run by root for `secs`: its samples must reach `main`.
fn build_no_fp(dir: &Path) -> PathBuf {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/libc_callback.c");
    let out = dir.join("budget-nofp");
    let st = Command::new("gcc").args(["-O2", "-fomit-frame-pointer", src, "-o"]).arg(&out).status().expect("gcc");
    assert!(st.success(), "gcc failed");
    out
}

#[test]
fn an_unprivileged_user_cannot_push_the_daemon_out_of_its_memory_budget() {
    if !privileged("an_unprivileged_user_cannot_push_the_daemon_out_of_its_memory_budget") {
        return;
    }
    if !Path::new(MEMCG_V1).join("memory.limit_in_bytes").exists() {
        skip(
            "an_unprivileged_user_cannot_push_the_daemon_out_of_its_memory_budget: no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory",
        );
        return;
    }
    let memcg = Memcg::new(LIMIT).expect("a memory cgroup of 256 MiB");
    let tmp = tempfile::tempdir().unwrap();
    // Nobody writes its files here and runs the helper from here.
    let play = tmp.path().join("play");
    std::fs::create_dir(&play).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&play, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = play.join("hostile-proc");
    std::fs::copy(bin("hostile-proc"), &exe).unwrap();
    let nofp = build_no_fp(tmp.path());

    let data = tmp.path().join("data");
    let join = memcg.join_command();
    let mut daemon = Daemon::start_wrapped(&["sh", "-c", &join, "sh"], &data, &["--listen", "off"], 200);
    daemon.wait_ready();
    let pid = daemon.child.as_ref().unwrap().id();
    let log = daemon.log_text();
    assert!(log.contains("memory budget 256 MiB (cgroup)"), "the budget is sized from the cgroup:\n{log}");
    let started = now_secs();

    let play_dir = play.to_str().unwrap();
    let mut attacks = vec![
        as_nobody(&exe, &["ehframe", play_dir]),
        as_nobody(&exe, &["debugframe", play_dir]),
        as_nobody(&exe, &["bigsym", play_dir]),
    ];
    for _ in 0..5 {
        // 60,000 lines of 500 characters: 30 MB each.
        attacks.push(as_nobody(&exe, &["perfmap", "60000", "500"]));
    }

    // The hostile unwind sections are refused by the budget, with a sentence each (the
    // 1 GB file is built last: the builder takes the smallest files first).
    let mut peak_anon = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        if let Ok(Some(st)) = daemon.child.as_mut().unwrap().try_wait() {
            panic!("the daemon died ({st}); OOM kills in its cgroup: {}\n{}", memcg.oom_kills(), daemon.log_text());
        }
        peak_anon = peak_anon.max(status_bytes(pid, "RssAnon"));
        let log = daemon.log_text();
        // (The 2.4 GB symbol table is refused earlier, by the file checks, with no sentence.)
        if log.matches("an unwind table was not built").count() >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the two hostile unwind sections to be refused:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // 1,100 sleepers, each described to the unwinder at its exec: the kernel's process table
    // (1,024) fills.
    let mut sleepers = Vec::new();
    for _ in 0..1_100 {
        sleepers.push(as_nobody(Path::new("/bin/sleep"), &["600"]));
    }
    wait_for("the process table full", Duration::from_secs(120), || {
        daemon.log_text().contains("the kernel's table of processes with unwind tables is full").then_some(())
    });
    // Root's program without frame pointers, run after the user filled the process table.
    let before_root = now_secs();
    let st = Command::new(&nofp).arg("6").status().unwrap();
    assert!(st.success());
    let after_root = now_secs();
    let dir = data.to_str().unwrap();
    // Every sample of its run is on disk once the daemon has flushed past its end.
    wait_for("the daemon's store past the root program's end", Duration::from_secs(120), || {
        let end = status_json(&data)?["summary"]["span"][1].as_u64()?;
        (end as f64 / 1e9 > after_root + 1.0).then_some(())
    });
    let stacks = folded_window(dir, before_root - 1.0, after_root + 1.0, &["--comm", "budget-nofp"]).unwrap();
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let complete: u64 = stacks.iter().filter(|(s, _)| s.split(';').any(|f| f == "main")).map(|(_, n)| n).sum();
    let share = complete as f64 / total as f64;
    // Where the incomplete samples are, by second of the run and by stack: a failure says
    // whether they are the program's first moments (its table not yet built) or all along.
    let mut by_second = Vec::new();
    let mut t = before_root.floor();
    while t < after_root + 1.0 {
        let s = folded_window(dir, t, t + 1.0, &["--comm", "budget-nofp"]).unwrap_or_default();
        let n: u64 = s.iter().map(|(_, n)| n).sum();
        let c: u64 = s.iter().filter(|(s, _)| s.split(';').any(|f| f == "main")).map(|(_, n)| n).sum();
        by_second.push(format!("{c}/{n}"));
        t += 1.0;
    }
    let mut incomplete: Vec<&(String, u64)> =
        stacks.iter().filter(|(s, _)| !s.split(';').any(|f| f == "main")).collect();
    incomplete.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    eprintln!("complete/all by second of root's run: {}", by_second.join(" "));
    for (s, n) in incomplete.iter().take(8) {
        eprintln!("  incomplete: {n} {s}");
    }

    peak_anon = peak_anon.max(status_bytes(pid, "RssAnon"));
    let alive = daemon.child.as_mut().unwrap().try_wait().unwrap().is_none();
    let (oom, peak, peak_cgroup) = (
        memcg.oom_kills(),
        status_bytes(pid, "VmHWM"),
        memcg.read("memory.max_usage_in_bytes").trim().parse::<u64>().unwrap_or(0),
    );
    let lost = lost(&data);
    eprintln!(
        "under attack for {:.0} s: peak anonymous memory {:.1} MiB (sampled), peak RSS {:.1} MiB (with mapped files), cgroup peak {:.1} MiB, OOM kills {oom}, lost {lost}, root's no-FP program {:.1} % of {total} samples reach main",
        now_secs() - started,
        peak_anon as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64,
        peak_cgroup as f64 / (1 << 20) as f64,
        share * 100.0
    );
    // The perf maps are the attackers' files in /tmp (their pid: setpriv and nice exec).
    let maps: Vec<String> = attacks.iter().map(|k| format!("/tmp/perf-{}.map", k.0.id())).collect();
    drop(attacks);
    drop(sleepers);
    for m in maps {
        let _ = std::fs::remove_file(m);
    }
    assert!(alive, "the daemon died:\n{}", daemon.log_text());
    assert_eq!(oom, 0, "the kernel OOM-killed in the daemon's cgroup");
    // What a user's files make the daemon hold: anonymous memory. Mapped files (blazesym maps
    // the ELF files it names; the debug binary's own text) are pages the kernel reclaims
    // under the cgroup's limit rather than kill: reported, not bounded here.
    assert!(peak_anon <= 160 << 20, "peak anonymous memory {peak_anon} bytes over 160 MiB");
    assert_eq!(lost, 0, "samples were lost");
    assert!(total >= 50, "only {total} samples of root's program");
    assert!(share >= 0.9, "only {:.1} % of root's samples reach main after the user filled the tables", share * 100.0);
    assert!(daemon.stop().success());
}

/// One keep-alive request on `c`: the status, or 0 when the daemon closed the connection.
fn keep_alive_get(c: &mut std::net::TcpStream, path: &str) -> u16 {
    use std::io::{Read, Write};
    if write!(c, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return 0;
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    // The head, then the body's length of bytes.
    loop {
        let Ok(n) = c.read(&mut buf) else { return 0 };
        if n == 0 {
            return 0;
        }
        raw.extend_from_slice(&buf[..n]);
        let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if raw.len() >= split + 4 + len {
            return head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        }
    }
}

#[test]
fn keep_alive_connections_holding_every_slot_do_not_keep_the_owner_out() {
    if !privileged("keep_alive_connections_holding_every_slot_do_not_keep_the_owner_out") {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let (tmp, data, _daemon) = Daemon::ready_in_tempdir(&["--listen", &addr]);
    let _ = tmp;
    let out = integration_tests::profiler(&["ui", "--data-dir", data.to_str().unwrap()]);
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let token = url.split_once("#token=").expect("token in the UI address").1.to_string();
    // 140 connections (the cap is 128), each asking for /metrics every 5 s (within the server's
    // idle timeout, and under its /metrics rate): every slot held.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holders: Vec<_> = (0..4)
        .map(|_| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut conns: Vec<std::net::TcpStream> = (0..35)
                    .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
                    .inspect(|c| c.set_read_timeout(Some(Duration::from_secs(5))).unwrap())
                    .collect();
                let mut answered = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for c in conns.iter_mut() {
                        if keep_alive_get(c, "/metrics") == 200 {
                            answered += 1;
                        } else if let Ok(new) = std::net::TcpStream::connect(&addr) {
                            // Closed for someone else: the attacker comes back at once.
                            new.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                            *c = new;
                        }
                    }
                    std::thread::sleep(Duration::from_secs(5));
                }
                answered
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    // The owner: 20 tries of the API with its token, and 20 scrapes, each on a new connection.
    let (mut api_ok, mut metrics_ok) = (0, 0);
    for _ in 0..20 {
        let (code, _) = integration_tests::http_get(&addr, "/api/status", "127.0.0.1", Some(&token));
        api_ok += u32::from(code == 200);
        let (code, _) = integration_tests::http_get(&addr, "/metrics", "127.0.0.1", None);
        metrics_ok += u32::from(code == 200);
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let attackers: u64 = holders.into_iter().map(|h| h.join().unwrap()).sum();
    eprintln!("owner: API {api_ok}/20, /metrics {metrics_ok}/20; the 140 holders' answers: {attackers}");
    assert_eq!(api_ok, 20, "the API with its token was kept out");
    assert_eq!(metrics_ok, 20, "the owner's scrape was kept out");
}

/// A figure of the daemon's `/metrics` (the first sample of `family` whose labels hold
/// `labels`; 0 when the daemon does not answer: the caller sees whether it died).
fn metric(addr: &str, family: &str, labels: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return 0.0 };
    let mut text = String::new();
    if write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_err()
        || s.read_to_string(&mut text).is_err()
    {
        return 0.0;
    }
    text.lines()
        .find(|l| l.starts_with(family) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn symbol_stack_and_code_object_floods_stay_within_the_budget() {
    if !privileged("symbol_stack_and_code_object_floods_stay_within_the_budget") {
        return;
    }
    if !Path::new(MEMCG_V1).join("memory.limit_in_bytes").exists() {
        skip(
            "symbol_stack_and_code_object_floods_stay_within_the_budget: no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory",
        );
        return;
    }
    let memcg = Memcg::new(LIMIT).expect("a memory cgroup of 256 MiB");
    let tmp = tempfile::tempdir().unwrap();
    let play = tmp.path().join("play");
    std::fs::create_dir(&play).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&play, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe = play.join("hostile-proc");
    std::fs::copy(bin("hostile-proc"), &exe).unwrap();
    let script = play.join("code_flood.py");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/code_flood.py"), &script).unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let data = tmp.path().join("data");
    let join = memcg.join_command();
    let mut daemon = Daemon::start_wrapped(&["sh", "-c", &join, "sh"], &data, &["--listen", &addr], 200);
    daemon.wait_ready();
    let pid = daemon.child.as_ref().unwrap().id();
    let started = now_secs();

    let play_dir = play.to_str().unwrap();
    let attacks = [
        as_nobody(&exe, &["symflood", "24", "999999", play_dir]),
        as_nobody(&exe, &["jitchain", "4096", "500"]),
        as_nobody(Path::new("/usr/bin/python3"), &[script.to_str().unwrap()]),
    ];
    // Until each flood has hit its pool (the symbol files are written first: seconds), then
    // 30 s more of floods.
    let mut peak_anon = 0;
    let mut hit_at = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        if let Ok(Some(st)) = daemon.child.as_mut().unwrap().try_wait() {
            panic!("the daemon died ({st}); OOM kills in its cgroup: {}\n{}", memcg.oom_kills(), daemon.log_text());
        }
        peak_anon = peak_anon.max(status_bytes(pid, "RssAnon"));
        if hit_at.is_none() {
            let refused = metric(&addr, "profiler_memory_refused_total", "pool=\"symbols\"");
            let used = |pool: &str| metric(&addr, "profiler_memory_pool_peak_bytes", &format!("pool=\"{pool}\""));
            if refused > 0.0 && used("stacks") > 0.0 && used("python") > 0.0 && used("perf_maps") > 0.0 {
                hit_at = Some(std::time::Instant::now());
            }
        }
        if hit_at.is_some_and(|t| t.elapsed() > Duration::from_secs(30)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the floods to reach the symbols', stacks', Python and perf-map pools:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let pools: Vec<String> = ["symbols", "stacks", "python", "perf_maps"]
        .iter()
        .map(|p| {
            let peak = metric(&addr, "profiler_memory_pool_peak_bytes", &format!("pool=\"{p}\""));
            let limit = metric(&addr, "profiler_memory_pool_limit_bytes", &format!("pool=\"{p}\""));
            assert!(peak <= limit, "pool {p}: peak {peak} over its limit {limit}");
            format!("{p} {:.1}/{:.1} MiB", peak / f64::from(1 << 20), limit / f64::from(1 << 20))
        })
        .collect();
    let (alive, oom) = (daemon.child.as_mut().unwrap().try_wait().unwrap().is_none(), memcg.oom_kills());
    let cgroup_peak = memcg.read("memory.max_usage_in_bytes").trim().parse::<u64>().unwrap_or(0);
    let lost = lost(&data);
    eprintln!(
        "flooded for {:.0} s: peak anonymous memory {:.1} MiB (sampled), cgroup peak {:.1} MiB, OOM kills {oom}, lost {lost}; pools (peak/limit): {}",
        now_secs() - started,
        peak_anon as f64 / (1 << 20) as f64,
        cgroup_peak as f64 / (1 << 20) as f64,
        pools.join(", ")
    );
    let map = format!("/tmp/perf-{}.map", attacks[1].0.id());
    drop(attacks);
    let _ = std::fs::remove_file(map);
    assert!(alive, "the daemon died:\n{}", daemon.log_text());
    assert_eq!(oom, 0, "the kernel OOM-killed in the daemon's cgroup");
    assert!(peak_anon <= 160 << 20, "peak anonymous memory {peak_anon} bytes over 160 MiB");
    assert_eq!(lost, 0, "samples were lost");
    assert!(daemon.stop().success());
}
