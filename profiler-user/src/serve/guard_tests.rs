//! What the guard must keep refusing (issue 14 E13): requests straight into the router.

use axum::{body::Body, http::Request};
use tower::ServiceExt as _;

use super::*;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn app(metrics_from_any_host: bool) -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().unwrap();
    let state = AppState {
        source: Arc::new(source::Source::Store(dir.path().to_path_buf())),
        live: Default::default(),
        token: TOKEN.into(),
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        metrics_from_any_host,
    };
    (dir, router(state))
}

/// The status of `GET path` with `Host: host` and these extra headers.
async fn status(app: &Router, path: &str, host: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::get(path).header("host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap().status().as_u16()
}

#[tokio::test]
async fn the_token_is_required_in_its_header_and_nowhere_else() {
    let (_dir, app) = app(false);
    let host = "127.0.0.1:7070";
    let with = |t: &'static str| [("x-profiler-token", t)];
    assert_eq!(status(&app, "/api/findings", host, &[]).await, 401);
    assert_eq!(status(&app, &format!("/api/findings?token={TOKEN}"), host, &[]).await, 401);
    let cookie = format!("X-Profiler-Token={TOKEN}");
    assert_eq!(status(&app, "/api/findings", host, &[("cookie", &cookie)]).await, 401);
    assert_eq!(status(&app, "/api/findings", host, &with("0123456789abcdef")).await, 401, "a prefix");
    assert_eq!(status(&app, "/api/findings", host, &with("0123456789abcdef0123456789abcdeX")).await, 401);
    let ok = status(&app, "/api/findings", host, &with(TOKEN)).await;
    assert!(ok != 401 && ok != 403, "the right token passes: {ok}");
}

#[tokio::test]
async fn path_tricks_and_rebound_names_do_not_pass() {
    let (_dir, app) = app(false);
    for path in ["//api/findings", "/%61pi/findings", "/x/../api/findings", "/api/./findings", "/API/findings"] {
        let code = status(&app, path, "localhost", &[]).await;
        assert!(code != 200, "{path} answered 200 without a token");
    }
    assert_eq!(status(&app, "/", "attacker.example", &[]).await, 403);
    assert_eq!(status(&app, "/metrics", "attacker.example:7070", &[]).await, 403, "loopback: metrics too");
    assert_eq!(status(&app, "/metrics", "localhost:7070", &[]).await, 200);
}

#[tokio::test]
async fn beyond_loopback_metrics_answer_any_host_and_the_api_does_not() {
    let (_dir, app) = app(true);
    assert_eq!(status(&app, "/metrics", "10.1.2.3:7070", &[]).await, 200);
    assert_eq!(status(&app, "/api/findings", "10.1.2.3:7070", &[("x-profiler-token", TOKEN)]).await, 403);
    assert_eq!(status(&app, "/", "10.1.2.3:7070", &[]).await, 403);
}

#[test]
fn the_context_parameter_filters_or_is_refused_with_a_sentence() {
    let p = |c: &str| Params { context: Some(c.into()), ..Default::default() }.filter();
    let f = p("softirq:net_rx").ok().unwrap();
    assert_eq!(f.context, Some(crate::exec_context::ContextFilter::Softirq(Some(3))));
    assert_eq!(p("").ok().unwrap().context, None, "a blank form field filters nothing");
    let Err(Failure(code, msg)) = p("hardirq") else { panic!("hardirq accepted") };
    assert_eq!(
        (code, msg.as_str()),
        (StatusCode::BAD_REQUEST, "context 'hardirq' is not one of task, softirq, softirq:NAME")
    );
}

#[tokio::test]
async fn an_absolute_target_naming_another_host_is_refused_and_a_token_marks_the_connection() {
    let (_dir, app) = app(false);
    let host = "127.0.0.1:7070";
    let with = [("x-profiler-token", TOKEN)];
    assert_eq!(status(&app, "http://attacker.example/api/findings", host, &with).await, 403);
    assert_eq!(status(&app, "http://attacker.example/metrics", host, &[]).await, 403);
    let ok = status(&app, "http://127.0.0.1:7070/api/findings", host, &with).await;
    assert!(ok != 401 && ok != 403, "this host, absolute: {ok}");
    // The connection's mark: trusted after a request with the token, not after one without.
    let mark = Arc::new(listener::ConnMark::default());
    let req = |token: Option<&str>| {
        let mut r = Request::get("/api/findings").header("host", host);
        if let Some(t) = token {
            r = r.header("x-profiler-token", t);
        }
        let mut r = r.body(Body::empty()).unwrap();
        r.extensions_mut().insert(mark.clone());
        r
    };
    app.clone().oneshot(req(Some("wrong"))).await.unwrap();
    assert!(!mark.is_trusted());
    app.clone().oneshot(req(Some(TOKEN))).await.unwrap();
    assert!(mark.is_trusted());
}
