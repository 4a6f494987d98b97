//! The live UI and its JSON API, served by the daemon (loopback only unless told otherwise).
//! Every request is answered from the store on disk, so the CLI and the UI always agree. No
//! request parameter ever becomes a path: the data directory is fixed when the daemon starts.

pub mod metrics;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::Deserialize;

use crate::{
    detect,
    export::{flamegraph, heatmap},
    query::{self, Filter, Folded, Window},
    store::{Meta, Store},
    timespec,
};

#[derive(Clone)]
pub struct AppState {
    pub data_dir: PathBuf,
    pub live: Arc<Mutex<metrics::Live>>,
    /// Required (header `X-Profiler-Token`) by every `/api/` request: the data is root-only,
    /// and the token lives in a root-only file, so a local user or a web page that reaches the
    /// port still cannot read it.
    pub token: String,
    /// Host names a request may carry (defeats DNS rebinding).
    pub hosts: Vec<String>,
}

/// A fresh random token (128 bits from the kernel's RNG), as hex.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where the daemon writes the UI's address with its token (root-only), for `profiler ui`.
pub const URL_FILE: &str = "ui-url";

async fn guard(State(s): State<AppState>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let name =
        host.rsplit_once(':').map_or(host, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { host });
    if !s.hosts.iter().any(|h| h == name) {
        return Failure(StatusCode::FORBIDDEN, format!("host '{host}' is not this profiler's address")).into_response();
    }
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
    }
    next.run(req).await
}

/// Query parameters every endpoint understands.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    from: Option<String>,
    to: Option<String>,
    /// Comma-separated CPU ids.
    cpu: Option<String>,
    pid: Option<u32>,
    comm: Option<String>,
    rows: Option<u32>,
    bucket: Option<String>,
    format: Option<String>,
}

/// A 400 (bad request) or 404 (nothing there) with one sentence.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.1 + "\n").into_response()
    }
}

impl From<query::QueryError> for Failure {
    fn from(e: query::QueryError) -> Self {
        let code = match e {
            query::QueryError::NoData { .. } | query::QueryError::NoMatch { .. } => StatusCode::NOT_FOUND,
            query::QueryError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        Failure(code, e.to_string())
    }
}

fn bad(msg: impl ToString) -> Failure {
    Failure(StatusCode::BAD_REQUEST, msg.to_string())
}

fn internal(msg: impl ToString) -> Failure {
    Failure(StatusCode::INTERNAL_SERVER_ERROR, msg.to_string())
}

impl Params {
    fn window(&self, default_from: &str) -> Result<Window, Failure> {
        let now = timespec::now_ns();
        let from = timespec::parse(self.from.as_deref().unwrap_or(default_from), now).map_err(bad)?;
        let to = timespec::parse(self.to.as_deref().unwrap_or("now"), now).map_err(bad)?;
        Ok(Window::new(from, to)?)
    }

    fn filter(&self) -> Result<Filter, Failure> {
        let cpus = match self.cpu.as_deref().filter(|c| !c.is_empty()) {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|c| c.trim().parse::<u32>().map_err(|_| bad(format!("cpu '{c}' is not a CPU number"))))
                .collect::<Result<_, _>>()?,
        };
        Ok(Filter { cpus, pid: self.pid, comm: self.comm.clone(), include_idle: false })
    }
}

/// Runs `f` on the blocking pool (queries read files and decompress).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Failure> + Send + 'static) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f).await.map_err(|e| internal(format!("query failed: {e}")))?
}

fn open(state: &AppState) -> Result<Store, Failure> {
    Store::open(&state.data_dir).map_err(|e| internal(e.to_string()))
}

fn json(value: impl serde::Serialize) -> Response {
    axum::Json(value).into_response()
}

async fn heatmap_api(State(s): State<AppState>, Query(p): Query<Params>) -> Result<Response, Failure> {
    blocking(move || {
        let w = p.window("-5m")?;
        let filter = p.filter()?;
        query::check_filter(&filter, Meta::read(&s.data_dir).as_ref())?;
        let rows = p.rows.unwrap_or(50).clamp(1, 1000) as usize;
        let grid = query::subsecond_grid(&mut open(&s)?, w, rows, &filter)?;
        let mut fs = serde_json::to_value(heatmap::flamescope(&grid)).map_err(internal)?;
        fs["first_second"] = grid.first_second.into();
        Ok(json(fs))
    })
    .await
}

async fn cputime_api(State(s): State<AppState>, Query(p): Query<Params>) -> Result<Response, Failure> {
    blocking(move || {
        let w = p.window("-5m")?;
        let bucket = p.bucket.as_deref().unwrap_or("1s");
        let bucket_ns = timespec::parse_duration_ns(bucket)
            .filter(|&b| b >= 10_000_000)
            .ok_or_else(|| bad(format!("bucket '{bucket}' must be a duration of 10ms or more")))?;
        let (cpus, hz) = Meta::cpus_and_frequency(&s.data_dir);
        let grid = query::cpu_time(&mut open(&s)?, w, bucket_ns, cpus, hz)?;
        let findings = detect::log::findings_in(&s.data_dir, w.from_ns, w.to_ns).map_err(internal)?;
        Ok(json(serde_json::json!({
            "first_ns": grid.first_ns, "bucket_ns": grid.bucket_ns, "cpus": grid.cpus,
            "busy": grid.busy, "kernel": grid.kernel, "findings": findings,
        })))
    })
    .await
}

/// d3-flame-graph's tree: `{name, value, children}`.
fn tree(folded: &Folded) -> serde_json::Value {
    #[derive(Default)]
    struct Node {
        value: u64,
        children: std::collections::BTreeMap<String, Node>,
    }
    fn to_json(name: &str, n: &Node) -> serde_json::Value {
        serde_json::json!({
            "name": name,
            "value": n.value,
            "children": n.children.iter().map(|(k, v)| to_json(k, v)).collect::<Vec<_>>(),
        })
    }
    let mut root = Node::default();
    for (line, &count) in &folded.stacks {
        root.value += count;
        let mut node = &mut root;
        for frame in line.split(';') {
            node = node.children.entry(frame.to_string()).or_default();
            node.value += count;
        }
    }
    to_json("all", &root)
}

async fn flamegraph_api(State(s): State<AppState>, Query(p): Query<Params>) -> Result<Response, Failure> {
    blocking(move || {
        let w = p.window("-1m")?;
        let filter = p.filter()?;
        let folded = query::fold(&mut open(&s)?, w, &filter)?;
        match p.format.as_deref().unwrap_or("svg") {
            "json" => Ok(json(tree(&folded))),
            "folded" => {
                let mut out = Vec::new();
                flamegraph::write_folded(&folded, &mut out).map_err(internal)?;
                Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response())
            }
            "svg" => {
                let mut out = Vec::new();
                let subtitle = format!(
                    "{} to {}, {} samples",
                    timespec::format(w.from_ns),
                    timespec::format(w.to_ns),
                    folded.total()
                );
                flamegraph::write_svg(&folded, "CPU flamegraph", &subtitle, &mut out).map_err(internal)?;
                Ok(([(header::CONTENT_TYPE, "image/svg+xml")], out).into_response())
            }
            other => Err(bad(format!("format '{other}' is not one of svg, json, folded"))),
        }
    })
    .await
}

async fn findings_api(State(s): State<AppState>, Query(p): Query<Params>) -> Result<Response, Failure> {
    blocking(move || {
        let w = p.window("-1h")?;
        Ok(json(detect::log::findings_in(&s.data_dir, w.from_ns, w.to_ns).map_err(internal)?))
    })
    .await
}

async fn events_api(State(s): State<AppState>, Query(p): Query<Params>) -> Result<Response, Failure> {
    blocking(move || {
        let w = p.window("-1h")?;
        Ok(json(detect::log::events_in(&s.data_dir, w.from_ns, w.to_ns).map_err(internal)?))
    })
    .await
}

async fn status_api(State(s): State<AppState>) -> Result<Response, Failure> {
    blocking(move || {
        let summary = open(&s)?.summary().map_err(internal)?;
        Ok(json(serde_json::json!({ "meta": Meta::read(&s.data_dir), "summary": summary })))
    })
    .await
}

async fn metrics_api(State(s): State<AppState>) -> Response {
    let live = s.live.lock().map(|l| l.clone()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render(&live)).into_response()
}

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("page.html")).into_response()
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/heatmap", get(heatmap_api))
        .route("/api/cputime", get(cputime_api))
        .route("/api/flamegraph", get(flamegraph_api))
        .route("/api/findings", get(findings_api))
        .route("/api/events", get(events_api))
        .route("/api/status", get(status_api))
        .route("/metrics", get(metrics_api))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Binds `addr` and serves until the runtime ends.
pub async fn spawn(addr: SocketAddr, state: AppState) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(state)).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    Ok(bound)
}
