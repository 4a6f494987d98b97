//! A process's thread timeline on the page (issue 42, part 2), with the real daemon and a real
//! headless Chromium: a reader blocked on a slow pipe (tests/src/bin/slow-pipe.rs) shows as its
//! process's threads, its main thread blocked (interruptible sleep) most of each second, drawn in
//! the "blocked otherwise" colour where the heatmap's time axis puts that second; and
//! `/api/threads` refuses what it cannot answer with a sentence.

use std::{process::Command, time::Duration};

use integration_tests::{Daemon, bin, free_port, now_secs, privileged, profiler, skip, wait_for};

mod browser;

fn token(data: &std::path::Path) -> String {
    let out = profiler(&["ui", "--data-dir", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    url.split_once("#token=").expect("token in the UI address").1.to_string()
}

#[test]
fn a_process_s_threads_show_where_they_waited_on_the_heatmap_s_time_axis() {
    if !privileged("a_process_s_threads_show_where_they_waited_on_the_heatmap_s_time_axis") {
        return;
    }
    if !browser::installed() {
        skip("the browser test needs Debian's chromium and chromium-driver (cargo xtask test installs them)");
        return;
    }
    let port = free_port();
    let (_tmp, data, _daemon) = Daemon::ready_in_tempdir(&["--listen", &format!("127.0.0.1:{port}")]);
    let token = token(&data);
    let get = |path: &str| integration_tests::http_get(&format!("127.0.0.1:{port}"), path, "127.0.0.1", Some(&token));

    // Refusals, each a sentence.
    for (query, says) in [
        ("", "pid= is required"),
        ("pid=0", "idle task"),
        ("pid=1&bucket=10ms", "1s or more"),
        ("pid=1&from=now&to=-1m", "is after"),
    ] {
        let (code, body) = get(&format!("/api/threads?{query}"));
        assert_eq!(code, 400, "{query}: {body}");
        assert!(body.to_lowercase().contains(says), "{query}: {body}");
    }

    // 10 warm-up reads, a pause, then 100 reads of a byte written every 20 ms: 2 s blocked.
    let start = now_secs();
    let mut child = Command::new(bin("slow-pipe"))
        .args(["10", "100", "20", "500"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("slow-pipe");
    let pid = child.id();
    assert!(child.wait().expect("slow-pipe ends").success());
    let end = now_secs();
    let (from, to) = (start.floor() - 1.0, end.ceil() + 1.0);
    // Drained once a second, read a drain late: wait until its main thread's waits are there.
    let answer = wait_for("the reader's waits in /api/threads", Duration::from_secs(30), || {
        let (code, body) = get(&format!("/api/threads?pid={pid}&from={from:.3}&to={to:.3}"));
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let main = v["threads"].as_array()?.iter().find(|t| t["tid"] == pid)?.clone();
        (main["totals_ms"][3].as_f64()? >= 1800.0).then_some((v, main))
    });
    let (v, main) = answer;
    assert_eq!(v["states"], serde_json::json!(["running", "runnable", "io", "sleep"]));
    assert_eq!(v["bucket_ns"], 1_000_000_000u64);
    assert!(v["threads"].as_array().unwrap().len() >= 2, "the reader and its writer: {v}");
    // The second the reader was blocked in most.
    let best = main["cells"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| a[4].as_f64().unwrap().total_cmp(&b[4].as_f64().unwrap()))
        .unwrap()
        .clone();
    assert!(best[4].as_f64().unwrap() >= 500.0, "blocked most of a second: {main}");
    let below: f64 = (1..4).map(|i| best[i].as_f64().unwrap()).sum();
    let sleep = best[4].as_f64().unwrap();
    let t_best = v["first_ns"].as_u64().unwrap() as f64 / 1e9 + best[0].as_f64().unwrap() + 0.5;

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (driver, client) = browser::open("1400,1000").await;
        client
            .goto(&format!("http://127.0.0.1:{port}/?from={from:.3}&to={to:.3}&threads={pid}#token={token}"))
            .await
            .unwrap();
        let drawn = browser::until(&client,
            "the thread strips",
            &format!(
                "const t = window.profilerUI.threads(); const rows = document.querySelectorAll('#tl-rows .track'); \
                 return t && t.pid === {pid} && rows.length === t.threads.length && document.getElementById('tl-pid').value === '{pid}' \
                   ? [rows.length, document.querySelector('#tl-rows .track[data-tid=\"{pid}\"] .name').textContent] : null"
            ),
        )
        .await;
        assert!(drawn[0].as_u64().unwrap() >= 2, "{drawn}");
        assert!(drawn[1].as_str().unwrap().contains(&pid.to_string()), "the row names its thread: {drawn}");
        // The page's words for that second, and its colour where the heatmap's axis puts it.
        let text = browser::until(&client,
            "the reader's cell text",
            &format!("return window.profilerUI.threadCellText({pid}, {t_best})"),
        )
        .await;
        let text = text.as_str().unwrap();
        assert!(text.contains(&format!("thread {pid} ")) && text.contains("blocked otherwise: "), "{text}");
        let seen = client
            .execute(
                &format!(
                    "const row = document.querySelector('#tl-rows .track[data-tid=\"{pid}\"] canvas'), \
                       ct = document.getElementById('ct'), LEFT = 70; \
                     const x = window.profilerUI.X({t_best}), r = window.devicePixelRatio || 1; \
                     const below = ({below}) * 16 / 1000, y = 16 - below - ({sleep}) * 16 / 2000; \
                     const px = row.getContext('2d').getImageData(Math.round(x * r), Math.floor(y * r), 1, 1).data; \
                     const want = getComputedStyle(document.documentElement).getPropertyValue('--tl-sleep').trim(); \
                     return [Array.from(px.slice(0, 3)), want, row.getBoundingClientRect().left - (ct.getBoundingClientRect().left + LEFT), \
                             row.getBoundingClientRect().width - (ct.getBoundingClientRect().width - LEFT)]"
                ),
                vec![],
            )
            .await
            .unwrap();
        let hex = seen[1].as_str().unwrap().trim_start_matches('#');
        let want: Vec<u64> = (0..3).map(|i| u64::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
        assert_eq!(seen[0], serde_json::json!(want), "the blocked second is drawn blocked, on the shared axis: {seen}");
        assert!(seen[2].as_f64().unwrap().abs() <= 1.0, "the strip starts where CPU x time's plot does: {seen}");
        assert!(seen[3].as_f64().unwrap().abs() <= 1.0, "and is as wide: {seen}");
        // A pid that is not a number is said on the page, and nothing is drawn.
        client.execute("document.getElementById('tl-pid').value = 'abc'; document.querySelector('#tl-form button').click(); return null", vec![]).await.unwrap();
        let said = browser::until(&client,
            "the refusal of a bad pid",
            "const s = document.getElementById('tl-status'); \
             return s.className === 'err' && !document.querySelector('#tl-rows .track') ? s.textContent : null",
        )
        .await;
        assert!(said.as_str().unwrap().contains("process id"), "{said}");
        // The driver's guard takes its Chromium with it (killed alone, it left 11 processes).
        let group = driver.0.id();
        drop(driver);
        integration_tests::wait_for("the driver's Chromium to be gone", Duration::from_secs(10), || {
            integration_tests::group_members(group).is_empty().then_some(())
        });
    });
}
