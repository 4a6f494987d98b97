//! CUDA launches, synchronisations and copies attributed to stacks (issue 27), on a machine
//! without a GPU: a stand-in `libcuda.so.1` (tests/cuda/standin.c; launches return at once,
//! synchronisations sleep) loaded by a Python program with ctypes. Only NVIDIA's library is
//! replaced: the uprobes, the kernel, the unwinder and the Python frame reader are real.

#[path = "shared/otlp_total.rs"]
mod otlp_total;

use std::{path::Path, time::Duration};

use integration_tests::{
    Daemon,
    cuda::{self, check_exact, check_totals, settled, status, wait_probed},
    folded,
    nvml::{StandIn, h100},
    privileged, profiler, wait_for_every,
};

/// Root, the stand-in built, a daemon started with `extra` and ready: (its directory, the
/// library, the data directory, the daemon), or `None` where the test cannot run (a failure
/// under CI=true).
fn ready(extra: &[&str]) -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, Daemon)> {
    if !privileged("cuda") {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = cuda::build_or_skip(&tmp.path().join("lib"), "cuda")?;
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &[&["--listen", "off"], extra].concat());
    daemon.wait_ready();
    Some((tmp, lib, data, daemon))
}

#[test]
fn launches_copies_and_waits_are_counted_per_python_function_exactly() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let mut app = cuda::App::start(&lib, &[], 2000);
    wait_probed(&data, 1);
    check_exact(&data, &mut app);
    // Launches a second per process, as a counter track beside the GPUs'.
    let track = format!("cuda.{}.launches", app.pid());
    let out = profiler(&[
        "counters",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        "-5m",
        "--name",
        "cuda*",
        "--format",
        "json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&track), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    // The page's selector and the exports read the same stores.
    let out = profiler(&[
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        "-5m",
        "--to",
        "now",
        "--samples",
        "cuda-sync",
        "--format",
        "pprof",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    app.finish();
    daemon.stop();
}

#[test]
fn a_process_that_mapped_the_library_before_the_daemon_started_is_probed() {
    if !privileged("cuda") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = cuda::build_or_skip(&tmp.path().join("lib"), "cuda") else { return };
    let mut app = cuda::App::start(&lib, &[], 1000);
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off"]);
    daemon.wait_ready();
    wait_probed(&data, 1);
    check_totals(&data, &mut app);
    app.finish();
    daemon.stop();
}

#[test]
fn a_library_loaded_later_is_probed_within_a_second() {
    // On a node with GPUs (NVML's stand-in says 8) the probes' programs are verified at start:
    // a library mapped later is probed within the tick, not after a second of the verifier.
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, "cuda") else { return };
    nvml.say(&h100(8, &[], 0));
    let Some((_tmp, lib, data, mut daemon)) = ready(&["--nvml-library", nvml.lib_str()]) else { return };
    wait_for_every("the probes' programs verified", Duration::from_secs(30), Duration::from_millis(100), || {
        daemon.log_text().contains("CUDA probe programs verified").then_some(())
    });
    let mut app = cuda::App::start(&lib, &["--late", "--rate", "2000"], 1000);
    let pid = app.pid();
    let report = app.go();
    let made = report["launches"].as_u64().unwrap();
    // Launches made more than a second after the dlopen: every one of them must be counted.
    let tenths = report["after_tenths"].as_array().unwrap();
    let start = report["start"].as_f64().unwrap();
    let loaded = report["loaded_at"].as_f64().unwrap();
    let second = (((loaded + 1.0 - start) * 10.0).ceil().max(0.0) as usize).min(tenths.len() - 1);
    let after_a_second = made - tenths[second].as_u64().unwrap();
    let counted = settled(&data, "cuda-launches", pid, "launch_steady", after_a_second);
    assert!(counted <= made, "{counted} counted, {made} made");
    eprintln!("dlopen then {made} launches in 4 s; {after_a_second} made a second or more after it; {counted} counted");
    app.finish();
    daemon.stop();
}

/// Issue 41: a count belongs to the second its call was made in, not to the drain that read
/// it (one to two seconds later). A launcher at 1,000 a second for 4 s, ending mid-second: each
/// wall-clock second of the store holds that second's launches, and a window ending when the
/// launcher stopped holds all of them.
#[test]
fn launches_are_counted_in_the_second_they_were_made() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let mut app = cuda::App::start(&lib, &["--rate", "1000"], 1000);
    wait_probed(&data, 1);
    let pid = app.pid();
    let report = app.go();
    let made = report["launches"].as_u64().unwrap();
    assert_eq!(settled(&data, "cuda-launches", pid, "launch_steady", made), made, "every launch counted");
    let dir = data.to_str().unwrap();
    let count = |from: &str, to: &str| -> u64 {
        let pid = pid.to_string();
        cuda_folded(dir, &["--samples", "cuda-launches", "--from", from, "--to", to, "--pid", &pid])
    };
    // The launcher's end, to the millisecond: mid-second but for a 1-in-1000 chance.
    let end = report["end"].as_f64().unwrap();
    let end_arg = format!("{end:.3}");
    assert_eq!(
        count("-5m", &end_arg),
        made,
        "a window ending when the launcher stopped ({end_arg}) holds every launch"
    );
    let per_second = report["per_second"].as_object().unwrap();
    let mut worst = 0i64;
    for (second, n) in per_second {
        let (s, n) = (second.parse::<u64>().unwrap(), n.as_u64().unwrap());
        let counted = count(&s.to_string(), &(s + 1).to_string());
        // The program reads the clock just after each launch, the probe just before it: a
        // launch within microseconds of a second's end may be counted in the next one.
        let off = counted as i64 - n as i64;
        worst = worst.max(off.abs());
        assert!(off.abs() <= 3, "second {s}: {n} launches made, {counted} counted in it ({per_second:?})");
    }
    eprintln!(
        "{made} launches over {} seconds, ending at {end_arg}; each second's count within {worst} of the launches made in it",
        per_second.len()
    );
    app.finish();
    daemon.stop();
}

/// Issue 41, part 7: a count belongs to the CPU that made the call (a stack's counts were stored
/// on the CPU its first call was made on: CPU 0 for a launcher started there). The launcher
/// starts on CPU 0 and is moved to CPU 1 once its first counts are stored: each CPU holds its
/// own launches, and together all of them.
#[test]
fn launches_are_counted_on_the_cpu_that_made_them() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let mut app = cuda::App::start(&lib, &["--rate", "1000"], 1000);
    wait_probed(&data, 1);
    let pid = app.pid();
    let dir = data.to_str().unwrap();
    let on = |cpu: &str| {
        let pid = pid.to_string();
        cuda_folded(dir, &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid, "--cpu", cpu])
    };
    let pin = |cpu: &str| {
        let out = std::process::Command::new("taskset").args(["-a", "-c", "-p", cpu, &pid.to_string()]).output();
        assert!(out.as_ref().is_ok_and(|o| o.status.success()), "taskset: {out:?}");
    };
    pin("0");
    app.start_work();
    // Stored within a drain or two; the launcher runs 4 s, so the move comes while it launches.
    wait_for_every("launches stored on CPU 0", Duration::from_secs(20), Duration::from_millis(50), || {
        (on("0") > 0).then_some(())
    });
    pin("1");
    let made = app.report()["launches"].as_u64().unwrap();
    assert_eq!(settled(&data, "cuda-launches", pid, "launch_steady", made), made, "every launch counted");
    let (cpu0, cpu1) = (on("0"), on("1"));
    eprintln!("{made} launches made, on CPU 0 then CPU 1; the store has {cpu0} on CPU 0, {cpu1} on CPU 1");
    assert!(cpu1 > 0, "the launches made on CPU 1 are stored on CPU 0 ({cpu0} of {made})");
    assert_eq!(cpu0 + cpu1, made, "{cpu0} + {cpu1} launches stored, {made} made");
    app.finish();
    daemon.stop();
}

/// The total of a flamegraph's folded counts for the arguments (no count: 0).
fn cuda_folded(dir: &str, args: &[&str]) -> u64 {
    integration_tests::folded(dir, args).unwrap_or_default().iter().map(|(_, n)| n).sum()
}

#[test]
fn probes_go_when_the_last_process_exits_and_come_back_with_the_next() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let app = cuda::App::start(&lib, &[], 1000);
    wait_probed(&data, 1);
    app.finish();
    wait_for_every("the probes removed", Duration::from_secs(20), Duration::from_millis(100), || {
        let gone = status(&data)["libraries"].as_array().is_some_and(|l| l.is_empty());
        (gone && daemon.log_text().contains("no process maps the CUDA library any more: probes removed")).then_some(())
    });
    let mut again = cuda::App::start(&lib, &[], 1000);
    wait_probed(&data, 1);
    check_exact(&data, &mut again);
    again.finish();
    daemon.stop();
}

#[test]
fn two_processes_with_two_copies_of_the_library_are_both_probed() {
    if !privileged("cuda") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(a) = cuda::build_or_skip(&tmp.path().join("a"), "cuda") else { return };
    let Some(b) = cuda::build_or_skip(&tmp.path().join("b"), "cuda") else { return };
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off"]);
    daemon.wait_ready();
    let mut first = cuda::App::start(&a, &[], 1000);
    let mut second = cuda::App::start(&b, &[], 1000);
    wait_probed(&data, 2);
    check_exact(&data, &mut first);
    check_exact(&data, &mut second);
    first.finish();
    second.finish();
    daemon.stop();
}

#[test]
fn the_rate_guard_engages_past_its_limit_and_says_so() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&["--cuda-max-calls-per-sec", "500"]) else { return };
    let mut app = cuda::App::start(&lib, &["--rate", "3000"], 1000);
    wait_probed(&data, 1);
    let pid = app.pid();
    app.go();
    let log = wait_for_every("the guard's warning", Duration::from_secs(20), Duration::from_millis(100), || {
        let log = daemon.log_text();
        log.contains("CUDA calls faster than the probes' budget").then_some(log)
    });
    assert!(log.contains("attached_percent"), "{log}");
    wait_for_every("the guard's share in the status", Duration::from_secs(20), Duration::from_millis(200), || {
        status(&data)["libraries"][0]["fraction"].as_f64().filter(|f| *f < 1.0)
    });
    let dir = data.to_str().unwrap();
    // Counts made while duty-cycled come a drain or two after the cut: marked as estimates.
    wait_for_every("estimates in the store", Duration::from_secs(20), Duration::from_millis(250), || {
        let lines = folded(dir, &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid.to_string()]).ok()?;
        lines.iter().any(|(stack, _)| stack.contains("[estimate: probes on")).then_some(())
    });
    let text = String::from_utf8_lossy(&profiler(&["status", "--data-dir", dir]).stdout).into_owned();
    assert!(text.contains("counts are estimates"), "{text}");
    app.finish();
    daemon.stop();
}

/// The findings of `kind` as JSON, once one exists (30 s at most).
fn wait_finding(data: &Path, kind: &str, daemon: &Daemon) -> serde_json::Value {
    let dir = data.to_str().unwrap();
    let found = std::cell::RefCell::new(None);
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for_every(&format!("a {kind} finding"), Duration::from_secs(40), Duration::from_millis(500), || {
            let out = profiler(&["findings", "--data-dir", dir, "--from", "-10m", "--format", "json"]);
            let all: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let f = all.into_iter().find(|f| f["kind"] == kind)?;
            *found.borrow_mut() = Some(f);
            Some(())
        })
    }));
    if ok.is_err() {
        let all = profiler(&["findings", "--data-dir", dir, "--from", "-10m"]);
        panic!("no {kind} finding; findings:\n{}\nlog:\n{}", String::from_utf8_lossy(&all.stdout), daemon.log_text());
    }
    found.into_inner().expect("found")
}

#[test]
fn a_thread_waiting_on_an_idle_gpu_is_a_sync_stall_naming_the_line_that_waits() {
    if !privileged("cuda") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = cuda::build_or_skip(&tmp.path().join("lib"), "cuda") else { return };
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, "cuda") else { return };
    // Each wait 20 ms after 1 ms of work: the thread waits about 95 % of its time.
    let mut app = cuda::App::start(&lib, &["--stall", "40"], 20_000);
    nvml.say(&h100(8, &[app.pid()], 0));
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off", "--nvml-library", nvml.lib_str()]);
    daemon.wait_ready();
    wait_probed(&data, 1);
    app.start_work();
    let f = wait_finding(&data, "gpu-sync-stall", &daemon);
    let summary = f["summary"].as_str().unwrap();
    assert!(summary.contains("waited on GPU 0"), "{summary}");
    assert!(summary.contains("log_loss (") && summary.contains("cuda_app.py:"), "names the Python line: {summary}");
    assert_eq!(f["evidence"]["pid"], app.pid(), "{f}");
    assert!(f["evidence"]["blocked_share"].as_f64().unwrap() >= 0.5, "{f}");
    drop(app);
    daemon.stop();
}

#[test]
fn a_launch_bound_finding_gives_the_launch_rate_and_the_line_that_launches() {
    if !privileged("cuda") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = cuda::build_or_skip(&tmp.path().join("lib"), "cuda") else { return };
    let Some(nvml) = StandIn::build_or_skip(tmp.path(), false, "cuda") else { return };
    let mut app = cuda::App::start(&lib, &["--launch-bound", "40"], 1000);
    nvml.say(&h100(8, &[app.pid()], 0));
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(
        &data,
        &["--listen", "off", "--nvml-library", nvml.lib_str(), "--cuda-max-calls-per-sec", "10000000"],
    );
    daemon.wait_ready();
    wait_probed(&data, 1);
    app.start_work();
    // The figures come with the finding's updates: wait for a summary that has them.
    let f =
        wait_for_every("launch figures in the finding", Duration::from_secs(60), Duration::from_millis(500), || {
            let f = wait_finding(&data, "gpu-launch-bound", &daemon);
            f["summary"].as_str()?.contains("launches/s").then_some(f)
        });
    let summary = f["summary"].as_str().unwrap();
    eprintln!("{summary}");
    // The scheduler's statistics name the launching thread (Python's main thread) and say it
    // asked for a whole core: ran plus waited for one, however much a loaded machine gave it.
    let e = &f["evidence"];
    assert_eq!(e["launcher_tid"], app.pid(), "{f}");
    let asked = e["launcher_ran_share"].as_f64().unwrap() + e["launcher_waited_share"].as_f64().unwrap();
    assert!(asked >= 0.9, "the launcher asked {asked:.2} of a core: {f}");
    assert!(
        summary.contains("train_step (") && summary.contains("cuda_app.py:"),
        "names the launching line: {summary}"
    );
    assert!(summary.contains("one every"), "{summary}");
    drop(app);
    daemon.stop();
}

#[test]
fn a_library_a_user_could_rewrite_is_not_probed() {
    use std::os::unix::fs::PermissionsExt;
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    // Anyone may write it: the daemon (root) must not parse it or plant probes from it.
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    let app = cuda::App::start(&lib, &[], 1000);
    let error = wait_for_every("the library refused", Duration::from_secs(20), Duration::from_millis(100), || {
        status(&data)["libraries"][0]["error"].as_str().map(str::to_string)
    });
    assert!(error.contains("only a library root owns and no one else can write is probed"), "{error}");
    assert_eq!(status(&data)["libraries"][0]["probes"], 0, "{}", status(&data));
    app.finish();
    daemon.stop();
}

/// The sum of one CUDA kind's values for `pid` in the OTLP requests the receiver took.
/// CUDA counts go where the samples go: into ClickHouse, where `--clickhouse` reads them back as
/// the node's store has them, and to an OTLP receiver as profiles of their own sample types.
#[test]
fn cuda_counts_reach_clickhouse_and_an_otlp_receiver_as_the_store_has_them() {
    if !privileged("cuda") {
        return;
    }
    let servers = tempfile::tempdir().unwrap();
    let Some(ch) = integration_tests::clickhouse::ClickHouse::start(&servers.path().join("clickhouse")) else {
        return;
    };
    let (otlp_url, received) = integration_tests::otlp::receiver(0);
    let config = servers.path().join("profiler.toml");
    std::fs::write(&config, "[otlp]\ninterval = \"1s\"\n").unwrap();
    let (url, config) = (ch.url(), config.to_str().unwrap().to_string());
    let extra = ["--node", "gpu-a", "--clickhouse", &url, "--otlp-endpoint", &otlp_url, "--config", &config];
    let Some((_tmp, lib, data, mut daemon)) = ready(&extra) else { return };
    let from = integration_tests::now_secs().floor() as u64;
    let mut app = cuda::App::start(&lib, &[], 2000);
    wait_probed(&data, 1);
    check_exact(&data, &mut app);
    let pid = app.pid();
    app.finish();
    let to = integration_tests::now_secs().ceil() as u64 + 1;
    integration_tests::clickhouse::wait_shipped(&data, to * 1_000_000_000);
    let (from, to, pid_arg) = (from.to_string(), to.to_string(), pid.to_string());
    let dir = data.to_str().unwrap();
    for kind in ["cuda-launches", "cuda-sync", "cuda-copies"] {
        let args =
            ["flamegraph", "--format", "folded", "--samples", kind, "--from", &from, "--to", &to, "--pid", &pid_arg];
        let local = profiler(&[&args[..], &["--data-dir", dir]].concat());
        let fleet = profiler(&[&args[..], &["--clickhouse", &url, "--node", "gpu-a"]].concat());
        assert!(local.status.success(), "{}", String::from_utf8_lossy(&local.stderr));
        assert!(fleet.status.success(), "{}", String::from_utf8_lossy(&fleet.stderr));
        let (local, fleet) = (String::from_utf8(local.stdout).unwrap(), String::from_utf8(fleet.stdout).unwrap());
        assert!(local.contains("wait_gpu") || kind != "cuda-sync", "{kind}: the app's waits in the store:\n{local}");
        assert_eq!(local, fleet, "{kind}: the store and ClickHouse differ");
    }
    // The page reads them from ClickHouse too (`profiler ui --clickhouse`).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(integration_tests::profiler_bin())
        .args(["ui", "--clickhouse", &url, "--listen", &listen])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _ui = integration_tests::Kill(child);
    let token = line.trim().split_once("/#token=").map(|(_, t)| t.to_string()).expect("the page's address");
    let path = format!("/api/flamegraph?format=folded&samples=cuda-launches&node=gpu-a&from={from}&to={to}");
    let (code, body) = integration_tests::http_get(&listen, &path, "127.0.0.1", Some(&token));
    assert_eq!(code, 200, "{body}");
    let page: u64 = integration_tests::parse_folded(&body).iter().map(|(_, n)| n).sum();
    assert_eq!(page, 5000, "launches on the page read from ClickHouse:\n{body}");
    let launches = ch.number(&format!(
        "SELECT sum(value) FROM profiler.cuda_samples FINAL WHERE node = 'gpu-a' AND kind = 'cuda-launches' AND pid = {pid}"
    ));
    assert_eq!(launches, 5000, "launches in ClickHouse");
    // The OTLP receiver: every launch once, in profiles of type cuda_launches.
    let got = wait_for_every(
        "the launches at the OTLP receiver",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let total = otlp_total::total(&received.lock().unwrap().accepted, "cuda_launches", i64::from(pid));
            (total >= 5000).then_some(total)
        },
    );
    assert_eq!(got, 5000, "launches pushed over OTLP");
    daemon.stop();
}

/// Issue 41: each launch is counted under its kernel's name as the leaf of its stack, from the
/// runtime's host stub (`cudaLaunchKernel`, and CUDA 13's `__cudaGetKernel` handle) or from
/// the driver's look-ups (`cuModuleGetFunction`, `cuLibraryGetKernel` + `cuKernelGetFunction`),
/// a graph launch as `[gpu] graph`; a launch through the runtime and the driver counted once.
#[test]
fn launches_are_counted_under_their_kernels_name_once() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let mut app = cuda::App::start(&lib, &["--names"], 1000);
    // The driver and the runtime.
    wait_probed(&data, 2);
    let pid = app.pid();
    let report = app.go();
    let made: u64 = report.as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(settled(&data, "cuda-launches", pid, "", made), made, "every launch counted once: {report}");
    let named = [
        ("launch_runtime", "[gpu] vecAdd(float*, float*, float*, int)", "runtime"),
        ("launch_cuda13", "[gpu] transpose(float*, float const*, int, int)", "cuda13"),
        ("launch_looked_up", "[gpu] triton_poi_fused_add_0", "looked_up"),
        ("launch_library", "[gpu] ampere_sgemm_128x64_tn", "library"),
        ("launch_graph", "[gpu] graph", "graph"),
        // cudaGraphLaunch passes through cuGraphLaunch: one graph launch.
        ("launch_graph_runtime", "[gpu] graph", "graph_runtime"),
    ];
    for (function, leaf, what) in named {
        let want = report[what].as_u64().unwrap();
        assert_eq!(cuda::settled_leaf(&data, pid, function, leaf, want), want, "{function}: {leaf}");
    }
    // Looked up at the program's start, within a second of its mapping the driver: named if
    // the probes saw the look-up, else by the library that launched it; never another name.
    let early = report["early"].as_u64().unwrap();
    let right = cuda::by_leaf(&data, pid, "launch_early", "[gpu] early_kernel_do_not_name");
    let unnamed: u64 = integration_tests::folded(
        data.to_str().unwrap(),
        &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid.to_string()],
    )
    .unwrap()
    .iter()
    .filter(|(s, _)| s.contains("launch_early (") && s.rsplit(';').next().unwrap().starts_with("[gpu] kernel in "))
    .map(|(_, n)| n)
    .sum();
    assert_eq!(right + unnamed, early, "launch_early: {right} named, {unnamed} by library");
    app.finish();
    daemon.stop();
}

/// PyTorch maps the runtime at `import torch` and the driver only when CUDA starts, right before
/// its first launches, whose kernels it looks up then (CUDA 13's `__cudaGetKernel`). Probed only
/// once the driver was seen, the runtime missed every such look-up: on an H200 none of a PyTorch
/// loop's eager kernels was named. The runtime is probed from the moment it is mapped.
#[test]
fn a_runtime_mapped_before_the_driver_is_probed_at_once_and_its_kernels_named() {
    let Some((_tmp, lib, data, mut daemon)) = ready(&[]) else { return };
    let mut app = cuda::App::start(&lib, &["--runtime-first"], 1000);
    let pid = app.pid();
    let runtime_probed = |s: &serde_json::Value| {
        s["libraries"].as_array().is_some_and(|l| {
            l.iter().any(|l| l["path"].as_str().is_some_and(|p| p.ends_with("libcudart.so.12")) && l["processes"] == 1)
        })
    };
    // The runtime alone, no driver mapped yet.
    let alone = wait_for_every("the runtime probed alone", Duration::from_secs(20), Duration::from_millis(100), || {
        let s = status(&data);
        runtime_probed(&s).then_some(s)
    });
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libcuda.so.1"), "the driver is not mapped yet: {alone}");
    assert_eq!(app.go()["started"], true);
    wait_probed(&data, 2);
    app.tell("launch");
    assert_eq!(app.report()["launches"], 600);
    let named = cuda::settled_leaf(&data, pid, "launch_first", "[gpu] transpose(float*, float const*, int, int)", 600);
    assert_eq!(named, 600, "{}", daemon.log_text());
    app.finish();
    // Gone, its runtime's probes go too.
    wait_for_every("the runtime unlisted", Duration::from_secs(20), Duration::from_millis(250), || {
        (!runtime_probed(&status(&data))).then_some(())
    });
    daemon.stop();
}

/// A kernel looked up before the daemon started is counted under the library that launched
/// it, never under a name it was not looked up as; one looked up since is named.
#[test]
fn a_kernel_looked_up_before_the_daemon_started_is_counted_under_its_library() {
    if !privileged("cuda") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = cuda::build_or_skip(&tmp.path().join("lib"), "cuda") else { return };
    let mut app = cuda::App::start(&lib, &["--names"], 1000);
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off"]);
    daemon.wait_ready();
    wait_probed(&data, 2);
    let pid = app.pid();
    let report = app.go();
    let early = report["early"].as_u64().unwrap();
    // ctypes calls the driver through libffi: the library that launched it.
    let lines = wait_for_every("the early launches", Duration::from_secs(20), Duration::from_millis(250), || {
        let lines =
            folded(data.to_str().unwrap(), &["--samples", "cuda-launches", "--from", "-5m", "--pid", &pid.to_string()])
                .ok()?;
        let n: u64 = lines.iter().filter(|(s, _)| s.contains("launch_early (")).map(|(_, n)| n).sum();
        (n >= early).then_some(lines)
    });
    let early_stacks: Vec<_> = lines.iter().filter(|(s, _)| s.contains("launch_early (")).collect();
    for (stack, _) in &early_stacks {
        let leaf = stack.rsplit(';').next().unwrap();
        assert!(leaf.starts_with("[gpu] kernel in lib"), "a handle looked up unseen: {stack}");
    }
    assert!(lines.iter().all(|(s, _)| !s.contains("early_kernel_do_not_name")), "{lines:#?}");
    assert_eq!(early_stacks.iter().map(|(_, n)| n).sum::<u64>(), early);
    let looked_up = report["looked_up"].as_u64().unwrap();
    assert_eq!(
        cuda::settled_leaf(&data, pid, "launch_looked_up", "[gpu] triton_poi_fused_add_0", looked_up),
        looked_up
    );
    app.finish();
    daemon.stop();
}
