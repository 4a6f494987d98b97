//! `/api/fleet` (the fleet page's grid and ranked findings, `fleet::board`) and the fleet page
//! itself (fleet.html, fleet.js), served by `profiler ui --clickhouse URL` when no node is
//! chosen. Every answer is read from ClickHouse when asked (nothing is cached here, and the
//! response says `no-store`): a sample shipped shows at the next request.

use axum::{
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use super::{
    Shared, heavy,
    request::{Failure, bad},
};
use crate::{
    fleet::board::{self, Group, MAX_ROWS, Measure},
    query::Window,
    timespec,
};

/// Rows shown unless asked otherwise.
const DEFAULT_ROWS: usize = 40;

#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct FleetParams {
    from: Option<String>,
    to: Option<String>,
    /// `peak-cpu` (the default), `busy`, `gpu-util`, `gpu-idle`.
    measure: Option<String>,
    /// `node` (the default), `namespace`, `pool`.
    group: Option<String>,
    rows: Option<usize>,
    /// Node names or globs, comma-separated; none: the whole fleet. (Not `node`: an address
    /// naming a node is that node's page.)
    nodes: Option<String>,
}

impl FleetParams {
    fn request(&self) -> Result<board::Request, Failure> {
        let now = timespec::now_ns();
        let from = timespec::parse(self.from.as_deref().unwrap_or("-1h"), now).map_err(bad)?;
        let to = timespec::parse(self.to.as_deref().unwrap_or("now"), now).map_err(bad)?;
        let window = Window::new(from, to)?;
        fn pick(v: &Option<String>) -> Option<&str> {
            v.as_deref().filter(|s| !s.is_empty())
        }
        let measure = match pick(&self.measure) {
            None => Measure::PeakCpu,
            Some(m) => Measure::parse(m).ok_or_else(|| {
                let all: Vec<&str> = Measure::ALL.iter().map(|m| m.name()).collect();
                bad(format!("measure '{m}' is not one of {}", all.join(", ")))
            })?,
        };
        let group = match pick(&self.group) {
            None => Group::Node,
            Some(g) => Group::parse(g).ok_or_else(|| {
                let all: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                bad(format!("group '{g}' is not one of {}", all.join(", ")))
            })?,
        };
        let rows = self.rows.unwrap_or(DEFAULT_ROWS);
        if !(1..=MAX_ROWS).contains(&rows) {
            return Err(bad(format!("rows={rows} is out of range: the fleet page shows 1 to {MAX_ROWS} rows")));
        }
        let nodes = super::source::node_patterns(pick(&self.nodes).unwrap_or(""));
        Ok(board::Request { window, nodes, measure, group, rows })
    }
}

pub(super) async fn fleet_api(State(s): State<Shared>, Query(p): Query<FleetParams>) -> Result<Response, Failure> {
    let app = s.app.clone();
    heavy(&s, move || {
        let Some(fleet) = app.source.as_fleet() else {
            return Err(Failure(
                StatusCode::NOT_FOUND,
                "the fleet page reads ClickHouse: run `profiler ui --clickhouse URL` where the nodes ship".into(),
            ));
        };
        let req = p.request()?;
        let board = board::board(fleet, &req).map_err(|e| Failure::from(super::source::SourceError::from(e)))?;
        let body = serde_json::to_vec(&board).map_err(super::request::internal)?;
        // Fresh every time: the page refreshes to show what the nodes shipped seconds ago.
        Ok(([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body).into_response())
    })
    .await
}

/// The fleet page: its style (the node page's) and script in one answer.
pub fn page() -> String {
    include_str!("fleet.html")
        .replace("/*STYLE*/", concat!(include_str!("page.css"), include_str!("fleet.css")))
        .replace("/*SCRIPT*/", include_str!("fleet.js"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked_with_a_sentence() {
        let p = |q: &str| {
            let uri: axum::http::Uri = format!("/api/fleet?{q}").parse().unwrap();
            Query::<FleetParams>::try_from_uri(&uri).unwrap().0.request()
        };
        let r = p("from=-10m&measure=gpu-idle&group=pool&rows=5&nodes=gpu-*,cpu-1").ok().unwrap();
        assert_eq!((r.measure, r.group, r.rows), (Measure::GpuIdle, Group::Pool, 5));
        assert_eq!(r.nodes, ["gpu-*", "cpu-1"]);
        let d = p("").ok().unwrap();
        assert_eq!((d.measure, d.group, d.rows, d.nodes.len()), (Measure::PeakCpu, Group::Node, DEFAULT_ROWS, 0));
        let e = |q: &str| p(q).err().unwrap().1;
        assert!(e("measure=cpu").starts_with("measure 'cpu' is not one of peak-cpu, busy, gpu-util, gpu-idle"));
        assert!(e("group=rack").starts_with("group 'rack' is not one of node, namespace, pool"));
        assert!(e("rows=0").contains("1 to 200 rows"));
        assert!(e("from=now&to=-1h").contains("after"), "{}", e("from=now&to=-1h"));
    }

    #[test]
    fn the_fleet_page_is_one_self_contained_answer() {
        let p = page();
        assert!(!p.contains("/*STYLE*/") && !p.contains("/*SCRIPT*/"));
        assert!(p.contains("window.fleetUI") && p.contains("/api/fleet"));
        for external in ["http://", "https://", "src=\"//", "@import"] {
            assert!(!p.contains(external), "the page refers to '{external}'");
        }
    }
}
