//! Headless Chromium for the page's tests (Debian's chromium and chromium-driver): chromedriver on
//! a free port, killed with the returned guard, and a WebDriver session with the options every
//! browser test uses.

// Each test crate that includes this module uses some of it.
#![allow(dead_code)]

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{KillGroup, spawn_group};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether this machine has both.
pub fn installed() -> bool {
    std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists()
}

/// A session in a `width,height` window; the driver lives as long as the guard.
pub async fn open(window: &str) -> (KillGroup, fantoccini::Client) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let driver = spawn_group(
        Command::new(CHROMEDRIVER).arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()),
    );
    let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
        "goog:chromeOptions": {"binary": CHROMIUM, "args": ["--headless", "--no-sandbox", "--disable-gpu", format!("--window-size={window}")]}
    }))
    .unwrap();
    // The driver takes a moment to listen.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => return (driver, client),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("cannot reach chromedriver: {e}"),
        }
    }
}

/// Runs `script` until it returns something other than null, for up to 20 s; the value. On
/// timeout, panics with what the page shows (address, status line, last queries).
pub async fn until(client: &fantoccini::Client, what: &str, script: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = client.execute(script, vec![]).await.unwrap();
        if !v.is_null() {
            return v;
        }
        if Instant::now() > deadline {
            let seen = client
                .execute(
                    "const q = (id) => { const e = document.getElementById(id); return e && [e.dataset.query, e.textContent.slice(0, 300)]; }; \
                     return [location.href, q('status'), q('h-node'), q('heatmap'), q('flamegraph')]",
                    vec![],
                )
                .await
                .unwrap();
            panic!("the page never showed {what}: {seen}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
