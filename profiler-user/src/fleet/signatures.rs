//! The fleet's findings grouped by signature and ranked by what they cost: "hot-kernel-function
//! mem_cgroup_nr_lru_pages on 37 nodes since Tuesday, all in ecs-agent", summed by the server.
//!
//! A signature is the finding's kind and what its evidence names first (the detectors'
//! `evidence`, serialised with sorted keys, searched by `visitParamExtractString`, which takes
//! a key's first occurrence at any depth):
//! - `function`: the hot function (hot-kernel-function), the top caller into a spinning lock
//!   (lock-spinning: `callers` sorts before `function`), the top function of a GPU's run or a
//!   throttled cgroup; empty for kinds that name none;
//! - `comm`: the first process the evidence lists (the top one: `top_processes`, `processes`,
//!   `held_by`, `makers`, the CUDA waiter);
//! - `unit`: the first systemd unit it names (a process's, or a zombie maker's).
//!
//! The cost, over the part of each finding inside the window (an open one runs to the window's
//! end): GPU-hours for `gpu-*` kinds (each is about one GPU, idle or held back all along by the
//! detector's own rule), core-seconds for the others: the duration times the cores held, the
//! share the evidence gives for one CPU (hot-kernel-function's `share`, saturated-core's
//! `busy_share`), the CPUs a lock holds (lock-spinning), one core otherwise. GPU-hours rank
//! first (a GPU-hour costs far more than a core-hour), then by cost, then by nodes.

use serde::Serialize;

use super::{Fleet, FleetError};
use crate::{
    query::Window,
    ship::clickhouse::schema::{self, col::*},
};

const SEC: u64 = 1_000_000_000;
/// How long before the window a finding may have started and still be read (the table is
/// partitioned by start day: a finding open longer than this is left out).
pub const LOOKBACK_NS: u64 = 86_400 * SEC;
/// Signatures in an answer.
pub const MAX_SIGNATURES: usize = 50;
/// Node names given per signature (the count says how many there are).
pub const NODE_NAMES: usize = 5;

/// One signature's findings across the fleet.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Signature {
    pub kind: String,
    pub function: String,
    pub comm: String,
    pub unit: String,
    /// Nodes with such a finding in the window.
    pub nodes: u64,
    pub findings: u64,
    pub since_ns: u64,
    pub until_ns: u64,
    pub cost: f64,
    /// `GPU-hours` or `core-seconds`.
    pub cost_unit: &'static str,
    /// Up to [`NODE_NAMES`] of the nodes.
    pub node_names: Vec<String>,
    /// One finding's summary, as an example.
    pub example: String,
}

/// Whether findings of `kind` cost GPU-hours.
pub fn is_gpu(kind: &str) -> bool {
    kind.starts_with("gpu-")
}

/// `(node, id)`'s latest version of each finding that overlaps `window`, as `nd, kd, t0, t1
/// (its end, or the window's while open), cp, ev, sm`. `nodes`: a `WHERE` part (` AND ...`).
pub fn latest(fleet: &Fleet, window: Window, nodes: &str) -> String {
    let (f, t) = (window.from_ns, window.to_ns);
    format!(
        "SELECT nd, kd, t0, least(if(te = 0, {t}, te), {t}) AS t1, cp, ev, sm FROM (SELECT {NODE} AS nd, \
         argMax({KIND}, {VERSION}) AS kd, argMax({TS}, {VERSION}) AS t0, argMax({END_TS}, {VERSION}) AS te, \
         argMax({CPU}, {VERSION}) AS cp, argMax({EVIDENCE}, {VERSION}) AS ev, argMax({SUMMARY}, {VERSION}) AS sm \
         FROM {} WHERE {TS} >= {} AND {TS} < {t}{nodes} GROUP BY {NODE}, {ID}) WHERE t1 > {f}",
        fleet.table(schema::FINDINGS),
        f.saturating_sub(LOOKBACK_NS),
    )
}

/// The signatures' SQL (see the module doc), most costly first.
pub fn sql(fleet: &Fleet, window: Window, nodes: &str) -> String {
    let f = window.from_ns;
    let cores = "multiIf(kd LIKE 'gpu-%', 1.0 / 3600, kd = 'hot-kernel-function', visitParamExtractFloat(ev, 'share'), \
                 kd = 'saturated-core', visitParamExtractFloat(ev, 'busy_share'), kd = 'lock-spinning', \
                 toFloat64(length(extractAll(ev, '\"cpu\":'))), 1.0)";
    format!(
        "SELECT kd, fn, cm, un, toUInt64(uniqExact(nd)), toUInt64(count()), toUInt64(min(t0)), toUInt64(max(t1)), \
         toFloat64(sum(cost)) AS total, arraySlice(arraySort(groupUniqArray(nd)), 1, {NODE_NAMES}), any(sm) FROM \
         (SELECT nd, kd, t0, t1, sm, visitParamExtractString(ev, 'function') AS fn, \
         visitParamExtractString(ev, 'comm') AS cm, visitParamExtractString(ev, 'unit') AS un, \
         greatest(toFloat64(t1) - toFloat64(greatest(t0, {f})), 0) / {SEC} * {cores} AS cost FROM ({})) \
         GROUP BY kd, fn, cm, un ORDER BY kd LIKE 'gpu-%' DESC, total DESC, kd, fn, cm, un LIMIT {MAX_SIGNATURES}",
        latest(fleet, window, nodes)
    )
}

/// The signatures of `window`'s findings on the nodes `nodes` (a `WHERE` part) chooses.
pub fn signatures(fleet: &Fleet, window: Window, nodes: &str) -> Result<Vec<Signature>, FleetError> {
    let mut out = fleet.rows(&sql(fleet, window, nodes), |r| {
        let kind = r.string()?.to_string();
        Ok(Signature {
            cost_unit: if is_gpu(&kind) { "GPU-hours" } else { "core-seconds" },
            kind,
            function: r.string()?.to_string(),
            comm: r.string()?.to_string(),
            unit: r.string()?.to_string(),
            nodes: r.u64()?,
            findings: r.u64()?,
            since_ns: r.u64()?,
            until_ns: r.u64()?,
            cost: r.f64()?,
            node_names: r.strings()?.into_iter().map(String::from).collect(),
            example: r.string()?.to_string(),
        })
    })?;
    rank(&mut out);
    Ok(out)
}

/// GPU-hours first, then the most costly, the most nodes; ties in a stable order.
pub fn rank(s: &mut [Signature]) {
    s.sort_by(|a, b| {
        is_gpu(&b.kind)
            .cmp(&is_gpu(&a.kind))
            .then(b.cost.total_cmp(&a.cost))
            .then(b.nodes.cmp(&a.nodes))
            .then_with(|| (&a.kind, &a.function, &a.comm, &a.unit).cmp(&(&b.kind, &b.function, &b.comm, &b.unit)))
    });
}

/// `evidence`'s first string value of `key` at any depth, as the server's
/// `visitParamExtractString` reads it (for tests of what detectors write).
pub fn first_string(evidence: &str, key: &str) -> String {
    let needle = format!("\"{key}\":\"");
    evidence
        .find(&needle)
        .map(|i| {
            let rest = &evidence[i + needle.len()..];
            rest[..rest.find('"').unwrap_or(rest.len())].to_string()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sig(kind: &str, cost: f64, nodes: u64) -> Signature {
        Signature {
            kind: kind.into(),
            function: String::new(),
            comm: String::new(),
            unit: String::new(),
            nodes,
            findings: nodes,
            since_ns: 0,
            until_ns: 0,
            cost,
            cost_unit: if is_gpu(kind) { "GPU-hours" } else { "core-seconds" },
            node_names: vec![],
            example: String::new(),
        }
    }

    #[test]
    fn gpu_hours_rank_first_then_cost_then_nodes() {
        let mut v = vec![
            sig("saturated-core", 9000.0, 3),
            sig("gpu-starved", 0.5, 1),
            sig("hot-kernel-function", 9000.0, 37),
            sig("gpu-launch-bound", 2.0, 1),
            sig("netrx-starvation", 10.0, 50),
        ];
        rank(&mut v);
        let order: Vec<&str> = v.iter().map(|s| s.kind.as_str()).collect();
        assert_eq!(
            order,
            ["gpu-launch-bound", "gpu-starved", "hot-kernel-function", "saturated-core", "netrx-starvation"]
        );
    }

    /// What the detectors write (their `json!` shapes, serialised as the journal does) names
    /// the signature's fields first where the module doc says.
    #[test]
    fn the_evidence_names_the_signature_first() {
        let top = json!({"comm": "ecs-agent", "pid": 7, "samples": 90, "unit": "ecs.service"});
        let hot = json!({"function": "mem_cgroup_nr_lru_pages", "share": 0.9, "window_secs": 10, "watchlist": true,
                         "processes": [top.clone(), {"comm": "other", "pid": 8, "samples": 1}]});
        let lock = json!({"function": "_raw_spin_lock", "window_secs": 5, "cpus": [{"cpu": 1, "share": 0.5}],
                          "callers": [{"function": "do_epoll_ctl", "samples": 9, "share": 0.9}], "processes": [top.clone()]});
        let gpu = json!({"gpu": 0, "model": "H100", "processes": [{"comm": "python3", "pid": 9, "samples": 5}],
                         "top_functions": [{"function": "augment", "samples": 5}], "top_python": [], "utilization_percent": 3.0});
        let saturated =
            json!({"busy_share": 0.99, "kernel_share": 0.1, "mode": "user", "top_processes": [top.clone()]});
        let zombies = json!({"dying": 9000, "makers": [{"comm": "runc", "pid": 3, "unit": "containerd.service"}]});
        let s = |v: &serde_json::Value| serde_json::to_string(v).unwrap();
        assert_eq!(first_string(&s(&hot), "function"), "mem_cgroup_nr_lru_pages");
        assert_eq!(first_string(&s(&hot), "comm"), "ecs-agent");
        assert_eq!(first_string(&s(&lock), "function"), "do_epoll_ctl", "the top caller (sorted keys)");
        assert_eq!(
            (first_string(&s(&gpu), "function"), first_string(&s(&gpu), "comm")),
            ("augment".into(), "python3".into())
        );
        assert_eq!(
            (first_string(&s(&saturated), "function"), first_string(&s(&saturated), "comm")),
            ("".into(), "ecs-agent".into())
        );
        assert_eq!(
            (first_string(&s(&zombies), "comm"), first_string(&s(&zombies), "unit")),
            ("runc".into(), "containerd.service".into())
        );
        assert_eq!(first_string(&s(&hot), "unit"), "ecs.service");
    }

    #[test]
    fn the_sql_reads_each_findings_latest_version_in_the_window() {
        let fleet = Fleet::new("http://h:1", "p").unwrap();
        let w = Window::new(100 * 86_400 * SEC, 101 * 86_400 * SEC).unwrap();
        let q = sql(&fleet, w, " AND node IN ('a')");
        assert!(q.contains("FROM `p`.`findings` WHERE ts >= 8553600000000000 AND ts < 8726400000000000 AND node IN ('a') GROUP BY node, id) WHERE t1 > 8640000000000000"), "{q}");
        assert!(q.contains("least(if(te = 0, 8726400000000000, te), 8726400000000000) AS t1"), "{q}");
        assert!(q.ends_with(&format!("LIMIT {MAX_SIGNATURES}")), "{q}");
    }
}
