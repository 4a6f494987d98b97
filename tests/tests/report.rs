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
    profiler::detect::log::record_finding(
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
    // The store has the whole run once it holds a block past its end.
    integration_tests::wait_for("the store past the run", Duration::from_secs(10), || {
        let span = integration_tests::status_json(&data)?["summary"]["span"][1].as_u64()? as f64 / 1e9;
        (span > end + 1.0).then_some(())
    });
    let file = tmp.path().join("report.html");
    let (from, to) = (format!("{:.3}", start.floor() - 2.0), format!("{:.3}", end.ceil() + 1.0));
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
