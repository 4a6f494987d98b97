//! What a request asks for: its query parameters ([`Params`]), read into a window, a filter and
//! the kind of counts; and how a refusal reads ([`Failure`]: a status and one sentence).

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;

use super::{limits, source};
use crate::{
    budget,
    fleet::reader::ReadError,
    model::SampleKind,
    query::{self, Filter, Window},
    timespec,
};

/// Query parameters every endpoint understands.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
    /// Comma-separated CPU ids.
    pub(super) cpu: Option<String>,
    pub(super) pid: Option<u32>,
    pub(super) comm: Option<String>,
    pub(super) pod: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) container: Option<String>,
    pub(super) unit: Option<String>,
    /// Which node: the daemon's own (any other is refused), or one that shipped to ClickHouse.
    pub(super) node: Option<String>,
    /// `task`, `softirq` or `softirq:NAME`.
    pub(super) context: Option<String>,
    /// Only stacks through a frame of this exact name.
    pub(super) function: Option<String>,
    /// `1`: Python frames keep the line they ran (flamegraphs).
    pub(super) lines: Option<String>,
    pub(super) rows: Option<u32>,
    pub(super) bucket: Option<String>,
    pub(super) format: Option<String>,
    /// What the flamegraph and heatmap count: `cpu` (the default), `cuda-launches`,
    /// `cuda-sync` or `cuda-copies` ([`SampleKind`]). Never a path: only
    /// [`SampleKind::store_dir`] turns the parsed kind into one.
    pub(super) samples: Option<String>,
}

/// A 4xx/5xx with one sentence (and, for 429/503, when to come back).
pub(super) struct Failure(pub(super) StatusCode, pub(super) String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let retry = matches!(self.0, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS);
        let mut r = (self.0, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.1 + "\n").into_response();
        if retry {
            r.headers_mut().insert(header::RETRY_AFTER, limits::RETRY_AFTER_SECS.into());
        }
        r
    }
}

/// The status of a query's refusal: nothing there, a budget, a broken store, a bad request.
fn query_status(e: &query::QueryError) -> StatusCode {
    match e {
        query::QueryError::NoData { .. } | query::QueryError::NoMatch { .. } => StatusCode::NOT_FOUND,
        query::QueryError::Store(_) | query::QueryError::Budget(budget::BudgetError::Store(_)) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        query::QueryError::Budget(_) => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl From<query::QueryError> for Failure {
    fn from(e: query::QueryError) -> Self {
        Failure(query_status(&e), e.to_string())
    }
}

impl From<source::SourceError> for Failure {
    fn from(e: source::SourceError) -> Self {
        use crate::fleet::FleetError;
        let code = match &e {
            source::SourceError::OtherNode { .. } | source::SourceError::WhichNode(..) => StatusCode::BAD_REQUEST,
            source::SourceError::NotRecorded(kind) => return Failure(StatusCode::NOT_FOUND, not_recorded(*kind)),
            source::SourceError::Query(q) => query_status(q),
            source::SourceError::Read(ReadError::TooManyPoints { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            source::SourceError::Read(_) => StatusCode::INTERNAL_SERVER_ERROR,
            // The server's answer said it of the window or the filters: as a store says it.
            source::SourceError::Fleet(FleetError::Query(q)) => query_status(q),
            source::SourceError::Fleet(f) => match f {
                FleetError::UnknownNode { .. } | FleetError::NoNodes(_) | FleetError::NoSamples { .. } => {
                    StatusCode::NOT_FOUND
                }
                FleetError::Down { .. }
                | FleetError::ClickHouse(_)
                | FleetError::Decode(_)
                | FleetError::ShardDown { .. }
                | FleetError::Login { .. }
                | FleetError::Refused { .. } => StatusCode::BAD_GATEWAY,
                FleetError::Timeout { .. } | FleetError::NoAnswerIn { .. } => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        };
        Failure(code, e.to_string())
    }
}

pub(super) fn bad(msg: impl ToString) -> Failure {
    Failure(StatusCode::BAD_REQUEST, msg.to_string())
}

pub(super) fn internal(msg: impl ToString) -> Failure {
    Failure(StatusCode::INTERNAL_SERVER_ERROR, msg.to_string())
}

impl Params {
    pub(super) fn window(&self, default_from: &str) -> Result<Window, Failure> {
        let now = timespec::now_ns();
        let from = timespec::parse(self.from.as_deref().unwrap_or(default_from), now).map_err(bad)?;
        let to = timespec::parse(self.to.as_deref().unwrap_or("now"), now).map_err(bad)?;
        Ok(Window::new(from, to)?)
    }

    /// The kind of counts asked for; anything but the four names is refused with a sentence.
    pub(super) fn kind(&self) -> Result<SampleKind, Failure> {
        match self.samples.as_deref().filter(|s| !s.is_empty()) {
            None => Ok(SampleKind::Cpu),
            Some(s) => SampleKind::parse(s).ok_or_else(|| {
                let names: Vec<_> = SampleKind::ALL.iter().map(|k| k.name()).collect();
                bad(format!("samples '{s}' is not one of {}", names.join(", ")))
            }),
        }
    }

    pub(super) fn filter(&self) -> Result<Filter, Failure> {
        let cpus = match self.cpu.as_deref().filter(|c| !c.is_empty()) {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|c| c.trim().parse::<u32>().map_err(|_| bad(format!("cpu '{c}' is not a CPU number"))))
                .collect::<Result<_, _>>()?,
        };
        // An empty parameter (a form's blank input) filters nothing.
        let given = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let workload = crate::identity::Filter {
            pod: given(&self.pod),
            namespace: given(&self.namespace),
            container: given(&self.container),
            unit: given(&self.unit),
        };
        let context = given(&self.context).map(|c| c.parse().map_err(bad)).transpose()?;
        Ok(Filter {
            cpus,
            pid: self.pid,
            comm: self.comm.clone(),
            workload,
            context,
            function: given(&self.function),
            include_idle: false,
            lines: self.lines.as_deref().is_some_and(|l| l == "1" || l == "true"),
        })
    }
}

/// Why a CUDA kind has no store: the daemon makes one at the first count it records.
pub(super) fn not_recorded(kind: SampleKind) -> String {
    let (what, counts) = match kind {
        SampleKind::Cpu => ("CPU samples", "counts them"),
        SampleKind::CudaLaunches => ("GPU launches", "counts them"),
        SampleKind::CudaSync => ("time waiting on the GPU", "measures it"),
        SampleKind::CudaCopies => ("GPU copies", "counts them"),
        SampleKind::OffCpu => {
            return "no off-CPU time recorded: the daemon records it unless started with --off-cpu-threshold-ms 0"
                .to_string();
        }
    };
    format!("no {what} recorded: the daemon {counts} only for processes that map libcuda.so.1")
}
