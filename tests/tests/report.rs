//! `profiler report` is the live page with its data inside (issue 15): opened from a file in
//! headless Chromium, with no daemon to ask, it draws the heatmap on its time axis, says it is a
//! report, marks the finding, opens the finding's flamegraph from its mark, and says in a
//! sentence that another range's flamegraph needs the live page.

mod browser;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{Daemon, helper_bin, now_secs, privileged, profiler, skip};

#[test]
fn a_report_opened_from_a_file_is_the_page_with_its_window() {
    if !privileged("a_report_opened_from_a_file_is_the_page_with_its_window") {
        return;
    }
    if !browser::installed() {
        skip("the browser test needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let (tmp, data, mut daemon) = Daemon::ready_in_tempdir(&[]);
    let start = now_secs();
    let st = Command::new(helper_bin()).args(["1", "4"]).stdout(Stdio::null()).status().unwrap();
    assert!(st.success());
    let end = now_secs();
    // A finding inside the spinner's run, on CPU 1 (the detectors have scenario tests of their own).
    let (f_start, f_end) = (((start + 1.0) * 1e3) as u64 * 1_000_000, ((start + 2.0) * 1e3) as u64 * 1_000_000);
    profiler::detect::journal::record_finding(
        &data,
        &profiler::detect::Finding {
            id: "report-test-1".into(),
            kind: profiler::detect::Kind::SaturatedCore,
            start_ns: f_start,
            end_ns: Some(f_end),
            cpu: Some(1),
            severity: profiler::detect::Severity::Warning,
            summary: "CPU 1 saturated by the report test".into(),
            evidence: serde_json::Value::Null,
        },
    )
    .unwrap();
    let file = tmp.path().join("report.html");
    let (from, to) = (format!("{:.3}", start.floor() - 2.0), format!("{:.3}", end.ceil() + 1.0));
    report_after(&data, end, &from, &to, &file, Duration::from_secs(10));
    assert!(daemon.stop().success());
    let bytes = std::fs::metadata(&file).unwrap().len();
    eprintln!("report of {:.0} s: {bytes} bytes", end.ceil() + 1.0 - (start.floor() - 2.0));

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let url = format!("file://{}", file.display());
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        let until = |what: &'static str, script: &'static str| {
            let client = client.clone();
            async move {
                let t0 = now_secs();
                loop {
                    let v = client.execute(script, vec![]).await.unwrap();
                    if !v.is_null() {
                        return v;
                    }
                    assert!(now_secs() < t0 + 20.0, "the report never showed {what}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        client.goto(&url).await.unwrap();
        let shown = until(
            "its heatmap and header",
            "const S = window.profilerUI && window.profilerUI.state; \
             return S && S.grid && document.getElementById('h-health').textContent.includes('report') \
             ? [document.getElementById('h-health').textContent, document.querySelectorAll('#hm-x span[data-t]').length, \
                document.querySelectorAll('#hm-marks > *').length, document.getElementById('from').value] : null",
        )
        .await;
        assert!(shown[1].as_u64() >= Some(2), "the time axis has labels: {shown}");
        assert!(shown[2].as_u64() >= Some(1), "the finding is marked: {shown}");
        // It opens on the whole window's flamegraph (not "Select a range on the heatmap.").
        let whole = until(
            "the whole window's flamegraph",
            "const f = document.getElementById('flamegraph'); \
             return f.querySelector('[data-name=profiler_test_hot_loop]') ? document.getElementById('matched').textContent : null",
        )
        .await;
        assert!(whole.as_str().unwrap().contains("from this report: the whole window, all CPUs"), "{whole}");
        // The finding's mark opens its window and its flamegraph, from the report.
        client.execute("document.querySelector('#hm-marks > *').click()", vec![]).await.unwrap();
        let opened = until(
            "the finding's flamegraph",
            "const f = document.getElementById('flamegraph'); \
             return f.querySelector('[data-name=profiler_test_hot_loop]') ? document.getElementById('matched').textContent : null",
        )
        .await;
        assert!(opened.as_str().unwrap().contains("from this report: report-test-1"), "{opened}");
        // Another range: a sentence, not a wrong flamegraph.
        client
            .execute(
                "document.getElementById('cpu').value = ''; const S = window.profilerUI.state; \
                 window.profilerUI.select(S.dom.t0 + 0.1, S.dom.t0 + 0.2)",
                vec![],
            )
            .await
            .unwrap();
        until(
            "the sentence for a range it does not hold",
            "const t = document.getElementById('flamegraph').textContent; \
             return t.includes('a report holds the flamegraphs of its whole window') ? t : null",
        )
        .await;
        client.close().await.unwrap();
    });
}

/// A GPU node's report (issue 26) carries the GPU as the live page shows it: the GPU strip
/// (`gpu.0.util`, first of the tracks) with the GPU's fault marked on it, the GPU findings
/// marked, the GPU list under the header,
/// and the CPU the GPU is local to marked in CPU x time (the NVML stand-in's affinity: CPU 1
/// only), the other not.
#[test]
fn a_gpu_nodes_report_carries_the_gpu_strip_list_findings_and_local_cpus() {
    let test = "a_gpu_nodes_report_carries_the_gpu_strip_list_findings_and_local_cpus";
    if !privileged(test) {
        return;
    }
    if !browser::installed() {
        skip("the browser test needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(nvml) = integration_tests::nvml::StandIn::build_or_skip(tmp.path(), false, test) else { return };
    nvml.say(&integration_tests::nvml::h100(23, &[], 0).replace("0 affinity 3", "0 affinity 2"));
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--nvml-library", nvml.lib_str()]);
    daemon.wait_ready();
    let start = now_secs();
    integration_tests::wait_for("the GPU list", Duration::from_secs(10), || {
        integration_tests::status_json(&data)?["gpus"]["gpus"][0]["local_cpus"][0].as_u64()
    });
    // A GPU finding in the window (the detectors have tests of their own).
    let at = ((start + 1.0) * 1e3) as u64 * 1_000_000;
    profiler::detect::journal::record_finding(
        &data,
        &profiler::detect::Finding {
            id: "report-gpu-1".into(),
            kind: profiler::detect::Kind::GpuStarved,
            start_ns: at,
            end_ns: Some(at + 2_000_000_000),
            cpu: None,
            severity: profiler::detect::Severity::Warning,
            summary: "GPU 0 (NVIDIA H100 80GB HBM3) 23 % busy for 2 s in the report test".into(),
            evidence: serde_json::json!({"gpu": 0}),
        },
    )
    .unwrap();
    // A fault of the GPU (as NVML's Xid event reads), marked on its strip.
    let fault_ns = ((start + 2.5) * 1e3) as u64 * 1_000_000;
    profiler::detect::journal::record_event(
        &data,
        &profiler::collect::kmsg::Event {
            id: "event-report-gpu-xid".into(),
            ts_ns: fault_ns,
            pattern: "nvml-xid".into(),
            message: "NVML: Xid 79 on GPU 0 [GPU 0 (NVIDIA H100 80GB HBM3): Xid 79, GPU has fallen off the bus]".into(),
        },
    )
    .unwrap();
    let end = start + 4.0;
    integration_tests::wait_for("the store past the run", Duration::from_secs(15), || {
        let span = integration_tests::status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (span > end + 1.0).then_some(())
    });
    let file = tmp.path().join("gpu-report.html");
    let (from, to) = (format!("{:.3}", start.floor() - 1.0), format!("{:.3}", end.ceil()));
    let out = profiler(&[
        "report",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        &from,
        "--to",
        &to,
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(daemon.stop().success());
    let html = std::fs::read_to_string(&file).unwrap();
    for what in ["gpu.0.util", "GPU-8e3c1f0a-stand-in", "report-gpu-1"] {
        assert!(html.contains(what), "the report holds {what}");
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let url = format!("file://{}", file.display());
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&url).await.unwrap();
        let shown = browser::until(
            &client,
            "the GPU strip, list, mark and local CPU",
            "const U = window.profilerUI, S = U && U.state; \
             const first = document.querySelector('#counters .track .name'); \
             if (!S || !S.ct || !S.gpus || !first || !document.querySelector('#hm-marks [data-id=report-gpu-1]')) return null; \
             const cv = document.getElementById('ct'), k = cv.width / cv.clientWidth, rh = cv.clientHeight / S.ct.cpus.length; \
             const px = (cpu) => cv.getContext('2d').getImageData(Math.floor((70 - 3) * k), \
               Math.floor((S.ct.cpus.indexOf(cpu) + 0.5) * rh * k), 1, 1).data[3]; \
             return [first.textContent, document.getElementById('gpus').textContent, px(0), px(1), \
               document.getElementById('ct-legend').textContent];",
        )
        .await;
        assert_eq!(shown[0], "gpu.0.util", "the GPU strip first: {shown}");
        let list = shown[1].as_str().unwrap();
        assert!(
            list.starts_with("GPU 0 NVIDIA H100 80GB HBM3 (GPU-8e3c1f0a-stand-in, bus 00000000:3B:00.0): local CPUs 1,"),
            "{list}"
        );
        assert_eq!((shown[2].as_u64(), shown[3].as_u64()), (Some(0), Some(255)), "CPU 1 marked, CPU 0 not: {shown}");
        assert!(shown[4].as_str().unwrap().contains("local to GPU 0: CPUs 1"), "{shown}");
        // The fault's red line on the GPU strip, between its label and its utilisation line;
        // 20 px later the strip's background.
        let script = format!(
            "const cv = document.querySelector('#counters .track canvas'), k = cv.width / cv.clientWidth; \
             const x = window.profilerUI.X({}); \
             const at = (px) => Array.from(cv.getContext('2d').getImageData(Math.round(px * k), Math.round(12 * k), 1, 1).data); \
             return [at(x), at(x + 20)];",
            fault_ns as f64 / 1e9
        );
        let px = client.execute(&script, vec![]).await.unwrap();
        let rgb = |v: &serde_json::Value| -> Vec<u64> { v.as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect() };
        let (mark, beside) = (rgb(&px[0]), rgb(&px[1]));
        assert!(mark[0] > 150 && mark[1] < 80 && mark[2] < 80, "the fault's mark is red: {px}");
        assert!(!(beside[0] > 150 && beside[1] < 80), "only at the fault: {px}");
        client.close().await.unwrap();
    });
}

/// A CUDA node's report (issue 41, part 7): the live page's count selector, with the counts the
/// node recorded in the window (CPU samples, GPU launches, ...), each its whole window's
/// flamegraph; and the process's CUDA tracks say which process the pid is (its name).
#[test]
fn a_cuda_nodes_report_chooses_the_count_and_names_the_launcher() {
    let test = "a_cuda_nodes_report_chooses_the_count_and_names_the_launcher";
    if !privileged(test) {
        return;
    }
    if !browser::installed() {
        skip("the browser test needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = integration_tests::cuda::build_or_skip(&tmp.path().join("lib"), test) else { return };
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, &["--listen", "off"]);
    daemon.wait_ready();
    let start = now_secs();
    let mut app = integration_tests::cuda::App::start(&lib, &[], 2000);
    integration_tests::cuda::wait_probed(&data, 1);
    let pid = app.pid();
    app.go();
    integration_tests::cuda::settled(&data, "cuda-launches", pid, "launch_direct", 3000);
    // The process's track, said to be of python3.
    let track = format!("cuda.{pid}.launches");
    integration_tests::wait_for("the launcher's CUDA track and its process", Duration::from_secs(15), || {
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
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["about"][&track] == "python3").then_some(())
    });
    let end = now_secs();
    app.finish();
    let file = tmp.path().join("cuda-report.html");
    let (from, to) = (format!("{:.3}", start.floor() - 1.0), format!("{:.3}", end.ceil() + 1.0));
    report_after(&data, end, &from, &to, &file, Duration::from_secs(15));
    assert!(daemon.stop().success());

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let url = format!("file://{}", file.display());
    rt.block_on(async move {
        let (_driver, client) = browser::open("1400,1000").await;
        client.goto(&url).await.unwrap();
        // The selector offers what the report holds; the CUDA track names its process.
        let shown = browser::until(
            &client,
            "the count selector and the CUDA track",
            &format!(
                "const f = document.getElementById('matched').textContent; \
                 const mine = (window.PROFILER_REPORT.counters.about || {{}})['{track}']; \
                 return f.includes('from this report') \
                   ? [[...document.getElementById('samples').options].map((o) => o.value), \
                      document.getElementById('samples-pick').hidden, mine] : null"
            ),
        )
        .await;
        let kinds: Vec<&str> = shown[0].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        assert_eq!(&kinds[..2], ["cpu", "cuda-launches"], "{shown}");
        assert!(kinds.contains(&"cuda-sync") && kinds.contains(&"cuda-copies"), "{shown}");
        assert_eq!(shown[1], false, "the selector shows: {shown}");
        // (One burst draws a flat track, counted, not drawn: the label's own test is ui.rs's.)
        assert_eq!(shown[2], "python3", "the report says what the track is of: {shown}");
        // GPU launches: the whole window's, counted in launches, under the launching function.
        client
            .execute(
                "const s = document.getElementById('samples'); s.value = 'cuda-launches'; \
                 s.dispatchEvent(new Event('change'))",
                vec![],
            )
            .await
            .unwrap();
        let launches = browser::until(
            &client,
            "the GPU launches flamegraph",
            "const m = document.getElementById('matched').textContent; \
             return m.includes('GPU launches') && document.querySelector('#flamegraph [data-name]') \
               ? [m, document.getElementById('top-unit').textContent, \
                  [...document.querySelectorAll('#flamegraph [data-name]')].some((e) => e.dataset.name.startsWith('launch_direct'))] : null",
        )
        .await;
        assert!(launches[0].as_str().unwrap().contains("from this report: the whole window, all CPUs, GPU launches"), "{launches}");
        assert_eq!(launches[1], "launches", "{launches}");
        assert_eq!(launches[2], true, "the launching function in it: {launches}");
        // A finding's window or another range of another count: a sentence, not the CPU's.
        client
            .execute("const S = window.profilerUI.state; window.profilerUI.select(S.dom.t0 + 0.1, S.dom.t0 + 0.2)", vec![])
            .await
            .unwrap();
        browser::until(
            &client,
            "the sentence for a range it does not hold",
            "const t = document.getElementById('flamegraph').textContent; \
             return t.includes('flamegraph of its whole window (all CPUs) only') ? t : null",
        )
        .await;
        client.close().await.unwrap();
    });
}

/// Writes the report of `[from, to]` into `file` once the store holds a block past `end` (the
/// store has the whole run then).
fn report_after(data: &std::path::Path, end: f64, from: &str, to: &str, file: &std::path::Path, wait: Duration) {
    integration_tests::wait_for("the store past the run", wait, || {
        let span = integration_tests::status_json(data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (span > end + 1.0).then_some(())
    });
    let out = profiler(&[
        "report",
        "--data-dir",
        data.to_str().unwrap(),
        "--from",
        from,
        "--to",
        to,
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
