//! Headless Chromium for the page's tests (Debian's chromium and chromium-driver): chromedriver on
//! a free port, killed with the returned guard, and a WebDriver session with the options every
//! browser test uses.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::Kill;

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether this machine has both.
pub fn installed() -> bool {
    std::path::Path::new(CHROMIUM).exists() && std::path::Path::new(CHROMEDRIVER).exists()
}

/// A session in a `width,height` window; the driver lives as long as the guard.
pub async fn open(window: &str) -> (Kill, fantoccini::Client) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let driver = Kill(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
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
