//! The live UI and its JSON API, served by the daemon (loopback only unless told otherwise),
//! or by `profiler ui --clickhouse` for any node of a fleet. Every request is answered through
//! the read interface the CLI uses (`fleet::reader`, chosen by [`source`]): the daemon's store,
//! or ClickHouse by SQL that sums in the server, so the CLI and the UI always agree. No request
//! parameter ever becomes a path: the data directory is fixed when the server starts.

mod fleet_api;
pub mod limits;
mod listener;
pub mod metrics;
mod request;
pub mod source;
mod threads;
pub mod tree;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use request::{Failure, Params, bad, internal};

use crate::{
    budget,
    export::{cputime, flamegraph, heatmap},
    model::SampleKind,
    query::Folded,
    store::{Meta, Store},
    timespec,
};

#[derive(Clone)]
pub struct AppState {
    pub source: Arc<source::Source>,
    pub live: metrics::Live,
    /// Required (header `X-Profiler-Token`) by every `/api/` request: the data is root-only,
    /// and the token lives in a root-only file, so a local user or a web page that reaches the
    /// port still cannot read it.
    pub token: String,
    /// Host names a request may carry (defeats DNS rebinding).
    pub hosts: Vec<String>,
    /// `/metrics` answers whatever the Host: the server listens beyond loopback, where a
    /// scraper names the node's address. (On loopback the Host check stays: it is what keeps a
    /// web page from reading even the metrics through a rebound name.)
    pub metrics_from_any_host: bool,
}

/// A fresh random token (128 bits from the kernel's RNG), as hex.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where the daemon writes the UI's address with its token (root-only), for `profiler ui`.
pub const URL_FILE: &str = "ui-url";

/// The daemon's state plus what the server itself limits.
#[derive(Clone)]
struct Shared {
    app: AppState,
    heavy: Arc<limits::Heavy>,
    metrics_rate: Arc<limits::Rate>,
    metrics_text: Arc<limits::Cached>,
}

async fn guard(State(s): State<Shared>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let s = &s.app;
    // The metrics name no secret and the token-protected API keeps its Host check.
    if s.metrics_from_any_host && req.uri().path() == "/metrics" {
        return next.run(req).await;
    }
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let name =
        host.rsplit_once(':').map_or(host, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { host });
    if !s.hosts.iter().any(|h| h == name) {
        return Failure(StatusCode::FORBIDDEN, format!("host '{host}' is not this profiler's address")).into_response();
    }
    // An absolute-form target (`GET http://other/...`) names its host too: it must be this one.
    if let Some(authority) = req.uri().authority()
        && !s.hosts.iter().any(|h| h == authority.host())
    {
        return Failure(
            StatusCode::FORBIDDEN,
            format!("the request names host '{}', not this profiler's address", authority.host()),
        )
        .into_response();
    }
    let mark = req.extensions().get::<Arc<listener::ConnMark>>().cloned();
    let _busy = mark.as_ref().map(|m| m.busy());
    if req.uri().path().starts_with("/api/") {
        let given = req.headers().get("x-profiler-token").and_then(|t| t.to_str().ok()).unwrap_or("");
        // Compared in full whatever the input, so timing says nothing about the token.
        let ok =
            given.len() == s.token.len() && given.bytes().zip(s.token.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
        if !ok {
            return Failure(
                StatusCode::UNAUTHORIZED,
                "missing or wrong X-Profiler-Token: open the address `profiler ui` prints (as root)".to_string(),
            )
            .into_response();
        }
        if let Some(m) = &mark {
            m.trust();
        }
    }
    next.run(req).await
}

/// The flamegraph's tree with the unit of its counts as the root's first field:
/// `{"unit":"launches","name":"all","value":...}`, written in one pass (trees can be megabytes).
fn tree_with_unit(folded: &Folded, kind: SampleKind) -> std::io::Result<Vec<u8>> {
    /// Passes the tree's bytes on, less its opening brace (the prefix opened the object).
    struct AfterBrace<'a>(&'a mut Vec<u8>, bool);
    impl std::io::Write for AfterBrace<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut rest = buf;
            if !self.1 && !rest.is_empty() {
                if rest[0] != b'{' {
                    return Err(std::io::Error::other("the tree does not start with an object"));
                }
                rest = &rest[1..];
                self.1 = true;
            }
            self.0.extend_from_slice(rest);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = format!("{{\"unit\":{},", serde_json::to_string(kind.unit())?).into_bytes();
    tree::write(folded, AfterBrace(&mut out, false))?;
    Ok(out)
}

/// Runs `f` on the blocking pool once a heavy request's turn comes (see [`limits::Heavy`]),
/// then hands the memory it freed back to the kernel.
async fn heavy<T: Send + 'static>(
    s: &Shared,
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let turn = s.heavy.enter().await.map_err(|_| {
        Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} heavy requests are already running (as many as the daemon's memory budget allows) and others waiting: retry in {} s",
                limits::heavy_at_once(),
                limits::RETRY_AFTER_SECS
            ),
        )
    })?;
    let r = tokio::task::spawn_blocking(move || {
        let r = f();
        budget::give_back_memory();
        drop(turn);
        r
    })
    .await
    .map_err(|e| internal(format!("query failed: {e}")))?;
    // Once more when the answer has been written and freed (it can be megabytes).
    tokio::spawn(async {
        tokio::time::sleep(TRIM_AFTER).await;
        let _ = tokio::task::spawn_blocking(budget::give_back_memory).await;
    });
    r
}

/// When the memory of an answer is handed back: by then a loopback client has read it.
const TRIM_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

fn json(value: impl serde::Serialize) -> Result<Response, Failure> {
    json_bytes(serde_json::to_vec(&value).map_err(internal)?)
}

fn json_bytes(body: Vec<u8>) -> Result<Response, Failure> {
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Says on the response that it was coarsened or truncated (the body says it too).
fn with_note(mut r: Response, name: &'static str, note: Option<String>) -> Response {
    if let Some(v) = note.and_then(|n| header::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert(name, v);
    }
    r
}

async fn heatmap_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-5m")?;
        let filter = p.filter()?;
        let kind = p.kind()?;
        let rows = p.rows.unwrap_or(50);
        if !(1..=1000).contains(&rows) {
            return Err(bad(format!("rows={rows} is out of range: a heatmap has 1 to 1000 rows")));
        }
        let grid = app.source.read(p.node.as_deref(), kind, |r| r.grid(w, rows as usize, &filter))?;
        let mut body = Vec::with_capacity(grid.counts.len() * 2 + 4096);
        heatmap::write_json_with(&grid, true, &mut body).map_err(internal)?;
        let note = grid.coarsened().then(|| heatmap::coarsened_reason(&grid));
        Ok(with_note(json_bytes(body)?, "x-profiler-coarsened", note))
    })
    .await
}

async fn cputime_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-5m")?;
        if p.kind()? != SampleKind::Cpu {
            return Err(bad(
                "CPU x time counts CPU samples only: samples= applies to /api/flamegraph and /api/heatmap",
            ));
        }
        let bucket = p.bucket.as_deref().unwrap_or("1s");
        let bucket_ns = timespec::parse_duration_ns(bucket)
            .filter(|&b| b >= 10_000_000)
            .ok_or_else(|| bad(format!("bucket '{bucket}' must be a duration of 10ms or more")))?;
        let (grid, findings) =
            app.source.read(p.node.as_deref(), SampleKind::Cpu, |r| Ok((r.cpu_time(w, bucket_ns)?, r.findings(w)?)))?;
        let note = cputime::coarsened(&grid).map(|c| c.reason);
        Ok(with_note(json(cputime::json(&grid, &findings))?, "x-profiler-coarsened", note))
    })
    .await
}

async fn flamegraph_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-1m")?;
        let filter = p.filter()?;
        let format = p.format.as_deref().unwrap_or("svg");
        if !["svg", "json", "folded"].contains(&format) {
            return Err(bad(format!("format '{format}' is not one of svg, json, folded")));
        }
        let kind = p.kind()?;
        let fold = app.source.read(p.node.as_deref(), kind, |r| r.fold(w, &filter, Default::default()))?;
        let (folded, read_from) = (fold.folded, fold.read_from);
        let cut = (folded.truncated_stacks > 0).then(|| {
            format!(
                "{} rare stacks folded into their parents ([… N more]): a flamegraph keeps at most {} distinct stacks",
                folded.truncated_stacks,
                budget::MAX_STACKS
            )
        });
        // From ClickHouse: the rows the server did not send, summed as one line.
        let note = match (cut, fold.note) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        let r = match format {
            "json" => json_bytes(tree_with_unit(&folded, kind).map_err(internal)?)?,
            "folded" => {
                let mut out = Vec::new();
                flamegraph::write_folded(&folded, &mut out).map_err(internal)?;
                ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
            }
            _ => {
                let mut out = Vec::new();
                let mut subtitle = format!(
                    "{} to {}, {} {}",
                    timespec::format(w.from_ns),
                    timespec::format(w.to_ns),
                    folded.total(),
                    kind.unit()
                );
                if let Some(n) = &note {
                    subtitle = format!("{subtitle} ({n})");
                }
                let title = kind.flamegraph_title(false);
                flamegraph::write_svg(&folded, &title, &subtitle, &mut out).map_err(internal)?;
                ([(header::CONTENT_TYPE, "image/svg+xml")], out).into_response()
            }
        };
        // Which ClickHouse tables answered (raw rows, the minute or hour rollups).
        Ok(with_note(with_note(r, "x-profiler-truncated", note), "x-profiler-read-from", read_from))
    })
    .await
}

async fn findings_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-1h")?;
        json(app.source.read(p.node.as_deref(), SampleKind::Cpu, |r| r.findings(w))?)
    })
    .await
}

async fn events_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-1h")?;
        json(app.source.read(p.node.as_deref(), SampleKind::Cpu, |r| r.events(w))?)
    })
    .await
}

/// Points one `/api/counters` answer may carry (an hour of ~500 tracks); more is refused with
/// a sentence rather than built in memory.
const MAX_COUNTER_POINTS: u64 = 2_000_000;

/// `{"tracks":[{"name","cpu","unit","points":[[unix_ms,value],...]}]}`: the UI's counter tracks.
async fn counters_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let w = p.window("-1h")?;
        // From ClickHouse: the `counters` rows the node's shipper sent (counted there first).
        let t = app.source.read(p.node.as_deref(), SampleKind::Cpu, |r| r.counters(w, MAX_COUNTER_POINTS))?;
        let note = (t.skipped_lines > 0 || !t.skipped_files.is_empty())
            .then(|| format!("{} lines and {} files unreadable, skipped", t.skipped_lines, t.skipped_files.len()));
        Ok(with_note(json(&t)?, "x-profiler-skipped", note))
    })
    .await
}

async fn status_api(State(s): State<Shared>, Query(p): Query<Params>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let nodes = app.source.nodes()?;
        if let Some(fleet) = app.source.fleet_status(p.node.as_deref()) {
            // A fleet: the node's description and what ClickHouse holds of it, or (several
            // nodes, none chosen) the sentence that asks for one.
            let (meta, summary, problem) = match fleet.summary {
                Ok(summary) => {
                    (app.source.read(p.node.as_deref(), SampleKind::Cpu, |r| r.meta())?, Some(summary), None)
                }
                Err(e) => (None, None, Some(Failure::from(e).1)),
            };
            return json(serde_json::json!({
                "meta": meta, "summary": summary, "nodes": nodes, "source": fleet.source, "problem": problem,
                // What the page cannot show from ClickHouse, said on it.
                "missing": FLEET_MISSING,
            }));
        }
        let Some(dir) = app.source.daemon_dir(p.node.as_deref())? else { return Err(internal("no data directory")) };
        let summary = Store::open(dir).and_then(|mut s| s.summary()).map_err(|e| internal(e.to_string()))?;
        json(serde_json::json!({
            "meta": Meta::read(dir),
            "summary": summary,
            "nodes": nodes,
            "interrupts": crate::collect::irqs::Placement::read(),
            // The GPUs the daemon's poller found (`gpu_readings::inventory`): the page lists them and
            // marks the CPUs local to each.
            "gpus": crate::gpu::Inventory::read(dir),
            // What the page's header shows beside the store: the kernel and the daemon's health.
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|k| k.trim().to_string()).ok(),
            "health": health(&app.live),
        }))
    })
    .await
}

/// What a node's page read from ClickHouse lacks: what daemons do not ship.
pub const FLEET_MISSING: &str = "not in ClickHouse: the daemon's health, the GPUs' models and \
     local CPUs, and which CPUs take the NIC and GPU interrupts (on the node: `profiler status`)";

/// The few live figures an engineer checks first: is the sampler attached to every CPU, is it
/// keeping up (pending samples, ring-to-disk latency), and is anything being dropped.
fn health(l: &metrics::Live) -> serde_json::Value {
    let (s, p) = (l.sampling.get(), l.pipeline.get());
    serde_json::json!({
        "sampled_cpus": s.sampled_cpus,
        // Possible CPUs (meta) can outnumber online ones on a cloud VM: compare with these.
        "online_cpus": std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| crate::collect::irqs::parse_cpu_list(&s))
            .map(|c| c.len()),
        "pending_samples": p.pending_samples,
        "ring_to_disk_seconds": p.ring_to_disk_seconds.map(|(p50, max)| [p50, max]),
        "events_lost": s.events_lost + s.events_dropped,
        "lost_samples": p.per_cpu.values().map(|c| c.2).sum::<u64>(),
        "rss_bytes": l.upkeep.read(|u| u.rss_bytes),
        "open_findings": p.detectors.open_findings,
    })
}

/// Needs no token (Prometheus has none), so it is the cheapest route: rendered at most once
/// per [`limits::METRICS_CACHE`], answered at most [`limits::METRICS_PER_SEC`] times a second.
async fn metrics_api(State(s): State<Shared>) -> Result<Response, Failure> {
    if !s.metrics_rate.allow() {
        // Slowly: a client that floods on keep-alive connections waits between its requests,
        // so it cannot make the server answer 429s as fast as it sends.
        tokio::time::sleep(limits::REFUSAL_DELAY).await;
        return Err(Failure(
            StatusCode::TOO_MANY_REQUESTS,
            format!("/metrics answers at most {} requests a second", limits::METRICS_PER_SEC),
        ));
    }
    let text = s.metrics_text.get(limits::METRICS_CACHE, || metrics::render(&s.app.live));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text.to_string()).into_response())
}

/// The page, its style and its script (in files by what each draws, to keep each readable): one
/// answer, so the page stays self-contained (no second request, nothing external). `/*DATA*/`
/// stays, before the script: `profiler report` puts its data there (`export::report`); the
/// daemon's page has none (the placeholder is a comment).
pub fn page() -> String {
    include_str!("page.html").replace("/*STYLE*/", include_str!("page.css")).replace(
        "/*SCRIPT*/",
        concat!(
            include_str!("page.js"),
            include_str!("heatmap.js"),
            include_str!("flame.js"),
            include_str!("gpu.js"),
            include_str!("report.js"),
            include_str!("timeline.js")
        ),
    )
}

/// The node page, or (a fleet, no node chosen by `--node` nor in the address) the fleet page.
async fn index(State(s): State<Shared>, uri: axum::http::Uri) -> Response {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static FLEET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let names_node = uri.query().unwrap_or("").split('&').any(|kv| kv.split('=').next() == Some("node"));
    let page = if s.app.source.fleet_page() && !names_node {
        FLEET.get_or_init(fleet_api::page)
    } else {
        PAGE.get_or_init(page)
    };
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page.as_str()).into_response()
}

pub fn router(state: AppState) -> Router {
    let daemon = matches!(*state.source, source::Source::Store(_));
    let shared = Shared {
        app: state,
        heavy: Arc::new(limits::Heavy::new(limits::heavy_at_once(), limits::HEAVY_WAIT)),
        metrics_rate: Arc::new(limits::Rate::new(limits::METRICS_PER_SEC)),
        metrics_text: Arc::new(limits::Cached::default()),
    };
    let router = Router::new()
        .route("/", get(index))
        .route("/api/heatmap", get(heatmap_api))
        .route("/api/cputime", get(cputime_api))
        .route("/api/flamegraph", get(flamegraph_api))
        .route("/api/findings", get(findings_api))
        .route("/api/events", get(events_api))
        .route("/api/status", get(status_api))
        .route("/api/counters", get(counters_api))
        .route("/api/threads", get(threads::threads_api))
        .route("/api/fleet", get(fleet_api::fleet_api));
    // The daemon's live figures; a fleet's are each daemon's own /metrics.
    let router = if daemon { router.route("/metrics", get(metrics_api)) } else { router };
    router.layer(axum::middleware::from_fn_with_state(shared.clone(), guard)).with_state(shared)
}

/// Binds `addr` and serves on a thread of its own, at low CPU priority, with its own runtime
/// (see [`listener`]), until the process ends. Raises the daemon's soft RLIMIT_NOFILE to the
/// hard limit first: the connection cap is computed from it.
pub fn spawn(addr: SocketAddr, state: AppState) -> std::io::Result<SocketAddr> {
    listener::spawn(addr, router(state))
}

/// The host names a request to a server on `addr` may carry: loopback's, and the address
/// itself (anything else is a rebound DNS name, [`AppState::hosts`]).
pub fn hosts(addr: SocketAddr) -> Vec<String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "[::1]".to_string()];
    hosts.push(match addr.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    });
    hosts
}

#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod page_tests;
#[cfg(test)]
mod samples_tests;
