//! `samples=`: the flamegraph (and heatmap) of a CUDA store, straight into the router.

use axum::{body::Body, http::Request};
use tower::ServiceExt as _;

use super::*;
use crate::{
    model::{Sample, Stack},
    store::StoreWriter,
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
/// 2023-11-14T22:13:20Z: the test's counts are in the second after it.
const T0: u64 = 1_700_000_000;

fn state(source: source::Source) -> AppState {
    AppState {
        source: Arc::new(source),
        live: Default::default(),
        token: TOKEN.into(),
        hosts: vec!["localhost".into()],
        metrics_from_any_host: false,
    }
}

fn sample(ts_ns: u64, frames: &[&str]) -> Sample {
    Sample {
        ts_ns,
        cpu: 1,
        pid: 42,
        tid: 42,
        cgroup_id: 0,
        comm: "train.py".into(),
        stack: Arc::new(Stack::new(frames.iter().map(|&f| f.into()).collect(), frames.len())),
        workload: "".into(),
    }
}

/// A data directory whose launches store holds 1,000 launches through `step;launch` and 234
/// through `step;copy_in`, and whose CPU store holds one sample.
fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |store: &std::path::Path, rows: &[(&[&str], u32)]| {
        let segments = crate::store::segments_dir(store);
        std::fs::create_dir_all(&segments).unwrap();
        let mut w = StoreWriter::new(&segments);
        for (i, (frames, count)) in rows.iter().enumerate() {
            w.push_weighted(&sample(T0 * 1_000_000_000 + 100_000_000 * (i as u64 + 1), frames), u64::from(*count));
        }
        w.flush((T0 + 10) * 1_000_000_000).unwrap();
    };
    write(&SampleKind::CudaLaunches.store_dir(dir.path()), &[(&["step", "launch"], 1000), (&["step", "copy_in"], 234)]);
    write(dir.path(), &[(&["main", "spin"], 1)]);
    dir
}

/// Status and body of `GET path` with the token.
async fn get(app: &Router, path: &str) -> (u16, String) {
    let req = Request::get(path).header("host", "localhost").header("x-profiler-token", TOKEN);
    let r = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let code = r.status().as_u16();
    let body = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
    (code, String::from_utf8(body.to_vec()).unwrap())
}

fn window() -> String {
    format!("from={T0}&to={}", T0 + 2)
}

#[tokio::test]
async fn a_cuda_flamegraph_counts_the_stores_weights_and_names_its_unit() {
    let dir = data_dir();
    let app = router(state(source::Source::Store(dir.path().to_path_buf())));
    let (code, body) = get(&app, &format!("/api/flamegraph?{}&format=json&samples=cuda-launches", window())).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["unit"].as_str(), v["name"].as_str(), v["value"].as_u64()),
        (Some("launches"), Some("all"), Some(1234))
    );
    let process = &v["children"][0];
    assert_eq!((process["name"].as_str(), process["value"].as_u64()), (Some("train.py"), Some(1234)));
    let step = &process["children"][0];
    let kids: Vec<_> =
        step["children"].as_array().unwrap().iter().map(|c| (c["name"].clone(), c["value"].clone())).collect();
    assert_eq!(kids, [("copy_in".into(), 234.into()), ("launch".into(), 1000.into())]);
    // The default is the CPU samples, in their unit; `samples=cpu` is the same.
    for q in ["", "&samples=cpu", "&samples="] {
        let (code, body) = get(&app, &format!("/api/flamegraph?{}&format=json{q}", window())).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!((code, v["unit"].as_str(), v["value"].as_u64()), (200, Some("samples"), Some(1)), "{q}");
    }
    let (code, folded) = get(&app, &format!("/api/flamegraph?{}&format=folded&samples=cuda-launches", window())).await;
    assert_eq!(code, 200);
    assert!(folded.contains("step;launch 1000") && folded.contains("step;copy_in 234"), "{folded}");
    let (code, svg) = get(&app, &format!("/api/flamegraph?{}&samples=cuda-launches", window())).await;
    assert_eq!(code, 200);
    assert!(svg.contains("GPU launches flamegraph") && svg.contains("1234 launches"), "the SVG's title and total");
    // The heatmap of the launches counts them too (the page keeps its heatmap CPU).
    let (code, body) = get(&app, &format!("/api/heatmap?{}&samples=cuda-launches", window())).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["maxvalue"].as_u64(), Some(1000), "{body}");
}

#[tokio::test]
async fn an_unknown_kind_is_refused_before_any_file_is_read() {
    // No data directory at all: a kind that reached the disk would answer 404 or 500.
    let gone = tempfile::tempdir().unwrap().path().join("gone");
    let app = router(state(source::Source::Store(gone)));
    for bad in ["gpu", "../../etc", "cuda/launches", "%2e%2e%2f%2e%2e%2fetc", "CPU"] {
        for path in ["/api/flamegraph", "/api/heatmap"] {
            let (code, body) = get(&app, &format!("{path}?{}&samples={bad}", window())).await;
            assert_eq!(code, 400, "{path} samples={bad}: {body}");
            assert!(body.contains("is not one of cpu, cuda-launches, cuda-sync, cuda-copies"), "{body}");
        }
    }
    let (code, body) = get(&app, &format!("/api/cputime?{}&samples=cuda-sync", window())).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("CPU samples only"), "{body}");
}

#[tokio::test]
async fn a_kind_never_recorded_answers_404_with_why() {
    let dir = data_dir();
    let app = router(state(source::Source::Store(dir.path().to_path_buf())));
    let (code, body) = get(&app, &format!("/api/flamegraph?{}&format=json&samples=cuda-sync", window())).await;
    assert_eq!(code, 404);
    assert_eq!(
        body.trim(),
        "no time waiting on the GPU recorded: the daemon measures it only for processes that map libcuda.so.1"
    );
    let (code, body) = get(&app, &format!("/api/flamegraph?{}&samples=cuda-copies", window())).await;
    assert_eq!(code, 404);
    assert!(body.starts_with("no GPU copies recorded"), "{body}");
    std::fs::remove_dir_all(dir.path().join("cuda")).unwrap();
    let (code, body) = get(&app, &format!("/api/flamegraph?{}&samples=cuda-launches", window())).await;
    assert_eq!(code, 404);
    assert_eq!(
        body.trim(),
        "no GPU launches recorded: the daemon counts them only for processes that map libcuda.so.1"
    );
    // A window the store holds nothing of: the usual 404.
    let (code, _) = get(&app, &format!("/api/flamegraph?from={}&to={}", T0 + 100, T0 + 101)).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_fleet_reads_cuda_kinds_from_clickhouse() {
    // Nothing listens there: the request reaches for ClickHouse and says it is not there.
    let fleet = crate::fleet::Fleet::new("http://127.0.0.1:1", "profiler").unwrap();
    let app = router(state(source::Source::fleet(fleet, Some("gpu-7".into()))));
    for kind in SampleKind::CUDA {
        let (code, body) = get(&app, &format!("/api/flamegraph?{}&samples={}", window(), kind.name())).await;
        assert_eq!(code, 502, "{body}");
        assert!(body.contains("ClickHouse"), "{body}");
    }
}

#[test]
fn the_tree_keeps_its_shape_with_the_unit_first() {
    let mut f = Folded::default();
    f.stacks.insert("app;main".into(), 3);
    let out = tree_with_unit(&f, SampleKind::CudaCopies).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with(r#"{"unit":"bytes","name":"all","value":3,"#), "{text}");
    let mut plain = Vec::new();
    tree::write(&f, &mut plain).unwrap();
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&text).unwrap(), serde_json::from_slice(&plain).unwrap());
    assert_eq!(a["children"], b["children"]);
}
