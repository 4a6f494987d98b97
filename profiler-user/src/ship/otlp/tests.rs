//! The transport against real HTTP/1.1 and HTTP/2 (gRPC) servers on loopback, and
//! the shipper against a receiver that fails first, over a store written here.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prost::Message;

use super::{
    Shipper,
    config::{self, OtlpFile},
    transport::{self, Outcome},
};
use crate::{
    export::otlp::proto::{ExportProfilesServiceRequest, ExportProfilesServiceResponse},
    model::{Sample, Stack},
    ship::Cursor,
    store::{StoreWriter, format::NS_PER_SEC, segments_dir},
};

fn settings(toml: &str, endpoint: &str) -> config::Otlp {
    let file: OtlpFile = toml::from_str(toml).unwrap();
    config::otlp(&file, Some(endpoint)).unwrap().unwrap()
}

/// One request as a loopback HTTP/1.1 receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    head: String,
    body: Vec<u8>,
}

/// A receiver that answers each request with the next of `answers` (status line and extra
/// headers, body), the last one forever after; it records every request.
fn http_receiver(answers: Vec<(&'static str, Vec<u8>)>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { continue };
            let Some(req) = read_request(&mut conn) else { continue };
            log.lock().unwrap().push(req);
            let (status, body) = &answers[i.min(answers.len() - 1)];
            let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(body));
        }
    });
    (url, seen)
}

fn read_request(conn: &mut std::net::TcpStream) -> Option<Received> {
    let mut raw = Vec::new();
    let mut buf = [0; 65536];
    let split = loop {
        let n = conn.read(&mut buf).ok().filter(|&n| n > 0)?;
        raw.extend_from_slice(&buf[..n]);
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length:"))?.trim().parse().ok()?;
    while raw.len() < split + len {
        let n = conn.read(&mut buf).ok().filter(|&n| n > 0)?;
        raw.extend_from_slice(&buf[..n]);
    }
    Some(Received { head, body: raw[split..split + len].to_vec() })
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).unwrap();
    out
}

/// `google.rpc.Status` with only a message: what an OTLP/HTTP error body holds.
fn status_body(message: &str) -> Vec<u8> {
    let mut b = vec![0x12, message.len() as u8];
    b.extend(message.as_bytes());
    b
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn http_answers_mean_retry_wait_refuse_or_taken() {
    let partial = ExportProfilesServiceResponse {
        partial_success: Some(crate::export::otlp::proto::ExportProfilesPartialSuccess {
            rejected_profiles: 2,
            error_message: "too old".into(),
        }),
    };
    let (url, seen) = http_receiver(vec![
        ("503 Service Unavailable\r\nRetry-After: 7", vec![]),
        ("500 Internal Server Error", status_body("broken")),
        ("400 Bad Request", status_body("no samples")),
        ("429 Too Many Requests", vec![]),
        ("200 OK", partial.encode_to_vec()),
    ]);
    let s = settings("[headers]\nauthorization = \"Bearer t\"", &url);
    let body = transport::body(&s, b"\x0a\x00");
    let rt = runtime();
    let outcomes: Vec<Outcome> = (0..5).map(|_| rt.block_on(transport::send(&s, body.clone()))).collect();
    assert_eq!(
        outcomes[0],
        Outcome::Retry { why: "HTTP 503 Service Unavailable".into(), after: Some(Duration::from_secs(7)) }
    );
    // The specification retries 429, 502, 503 and 504 only.
    assert_eq!(outcomes[1], Outcome::Rejected { why: "HTTP 500 Internal Server Error: broken".into() });
    assert_eq!(outcomes[2], Outcome::Rejected { why: "HTTP 400 Bad Request: no samples".into() });
    assert!(matches!(outcomes[3], Outcome::Retry { after: None, .. }));
    assert_eq!(outcomes[4], Outcome::Accepted { rejected: 2, message: "too old".into() });
    let r = seen.lock().unwrap()[0].clone();
    assert!(r.head.starts_with("post /v1development/profiles http/1.1\r\n"), "{}", r.head);
    for h in ["content-type: application/x-protobuf", "content-encoding: gzip", "authorization: bearer t"] {
        assert!(r.head.contains(h), "{h} in {}", r.head);
    }
    assert_eq!(gunzip(&r.body), b"\x0a\x00");
    // Nobody listening: worth another try.
    let closed = settings("", &format!("http://{}", TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()));
    assert!(matches!(rt.block_on(transport::send(&closed, body)), Outcome::Retry { .. }));
}

#[test]
fn grpc_statuses_mean_retry_wait_refuse_or_taken() {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    // google.rpc.Status{code 8, details [Any{RetryInfo{retry_delay 2.5 s}}]}, base64, built by hand.
    let delay = {
        let field = |tag: u8, bytes: &[u8]| [&[tag, bytes.len() as u8][..], bytes].concat();
        let duration = [&[0x08, 2, 0x10][..], &varint(500_000_000)].concat();
        let info = field(0x0a, &duration);
        let any = [field(0x0a, b"type.googleapis.com/google.rpc.RetryInfo"), field(0x12, &info)].concat();
        let status = [&[0x08, 8][..], &field(0x1a, &any)].concat();
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(status)
    };
    let requests = Arc::new(Mutex::new(Vec::<(http::request::Parts, Bytes)>::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log = requests.clone();
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let listener = tokio::net::TcpListener::from_std({
                listener.set_nonblocking(true).unwrap();
                listener
            })
            .unwrap();
            for i in 0.. {
                let (stream, _) = listener.accept().await.unwrap();
                let (log, delay) = (log.clone(), delay.clone());
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (log, delay) = (log.clone(), delay.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes();
                        log.lock().unwrap().push((parts, body));
                        let ok = ExportProfilesServiceResponse::default().encode_to_vec();
                        let framed = [&[0u8, 0, 0, 0, ok.len() as u8][..], &ok].concat();
                        let (code, details, body) = match i {
                            0 => ("14", None, vec![]),
                            1 => ("8", Some(delay), vec![]),
                            2 => ("8", None, vec![]),
                            3 => ("3", None, vec![]),
                            _ => ("0", None, framed),
                        };
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", code.parse().unwrap());
                        if let Some(d) = details {
                            trailers.insert("grpc-status-details-bin", d.parse().unwrap());
                        }
                        let body = Full::new(Bytes::from(body))
                            .with_trailers(async move { Some(Ok::<_, std::convert::Infallible>(trailers)) });
                        let response =
                            http::Response::builder().header("content-type", "application/grpc").body(body).unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        })
    });
    let s = settings("protocol = \"grpc\"", &url);
    let message = ExportProfilesServiceRequest::default().encode_to_vec();
    let body = transport::body(&s, &message);
    let rt = runtime();
    let outcomes: Vec<Outcome> = (0..5).map(|_| rt.block_on(transport::send(&s, body.clone()))).collect();
    assert!(matches!(outcomes[0], Outcome::Retry { after: None, .. }), "UNAVAILABLE: {:?}", outcomes[0]);
    assert!(
        matches!(outcomes[1], Outcome::Retry { after: Some(d), .. } if d == Duration::from_millis(2500)),
        "RESOURCE_EXHAUSTED with RetryInfo: {:?}",
        outcomes[1]
    );
    assert!(matches!(outcomes[2], Outcome::Rejected { .. }), "RESOURCE_EXHAUSTED alone: {:?}", outcomes[2]);
    assert!(matches!(outcomes[3], Outcome::Rejected { .. }), "INVALID_ARGUMENT: {:?}", outcomes[3]);
    assert_eq!(outcomes[4], Outcome::Accepted { rejected: 0, message: String::new() });
    let requests = requests.lock().unwrap();
    let (parts, body) = &requests[0];
    assert_eq!(parts.uri.path(), "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export");
    assert_eq!(parts.headers["content-type"], "application/grpc");
    assert_eq!(parts.headers["grpc-encoding"], "gzip");
    assert_eq!(parts.headers["te"], "trailers");
    // A gRPC message: compressed flag, length, the gzipped request.
    assert_eq!(body[0], 1);
    assert_eq!(u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize, body.len() - 5);
    assert_eq!(gunzip(&body[5..]), message);
}

const T0: u64 = 1_795_000_000 * NS_PER_SEC; // on a minute boundary

/// 45 s of samples from T0, several blocks per second; returns them.
fn write_store(dir: &Path) -> Vec<Sample> {
    crate::store::create_and_lock(dir).unwrap();
    let stack = Arc::new(Stack::new(vec![Arc::from("main"), Arc::from("spin")], 2));
    let samples: Vec<Sample> = (0..4500u64)
        .map(|i| Sample {
            ts_ns: T0 + i * 10_000_000,
            cpu: (i % 2) as u32,
            pid: 7,
            tid: 7 + (i % 3) as u32,
            cgroup_id: 0,
            comm: Arc::from("spin"),
            stack: stack.clone(),
            workload: Arc::from(""),
        })
        .collect();
    let mut w = StoreWriter::new(&segments_dir(dir));
    for (i, s) in samples.iter().enumerate() {
        w.push(s);
        if i % 250 == 0 {
            w.flush(s.ts_ns).unwrap();
        }
    }
    w.flush(T0).unwrap();
    samples
}

/// The shipper catches up from a saved cursor through a receiver that fails twice, then refuses
/// one batch for good: every other sample arrives once, in 10 s batches, the refused batch is
/// skipped (and counted), and the cursor ends past them.
#[test]
fn the_shipper_retries_then_delivers_each_sample_once_and_moves_its_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let stored = write_store(dir.path());
    Cursor::open(dir.path(), "otlp").unwrap().save(T0).unwrap();
    // Refused twice for a while, then taken; the second batch is refused for good.
    let (url, seen) = http_receiver(vec![
        ("503 Service Unavailable", vec![]),
        ("502 Bad Gateway", vec![]),
        ("200 OK", vec![]),
        ("400 Bad Request", status_body("bad batch")),
        ("200 OK", vec![]),
    ]);
    let figures = crate::ship::SharedStats::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let shipper = crate::ship::spawn(Shipper {
        data_dir: dir.path().to_path_buf(),
        config: settings("", &url),
        host: "node-3".into(),
        frequency_hz: 99,
        settle: Duration::from_secs(3),
        stats: figures.clone(),
        ring_to_disk_max: Arc::new(|| None),
        stop: stop_rx,
    })
    .unwrap();
    let cursor = Cursor::open(dir.path(), "otlp").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Past the data: the empty rest of the store is skipped in one step, to about now.
    while cursor.load().is_none_or(|c| c < T0 + 3600 * NS_PER_SEC) {
        assert!(
            Instant::now() < deadline,
            "the cursor stays at {:?}; received {}",
            cursor.load(),
            seen.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.send(true).unwrap();
    shipper.join().unwrap();
    let seen = seen.lock().unwrap();
    // Two refusals, the same first batch again, then 10 s batches: 10-20 (refused), 20-30, 30-40, 40-50.
    assert_eq!(seen.len(), 2 + 5, "{:?}", seen.iter().map(|r| r.body.len()).collect::<Vec<_>>());
    assert_eq!(seen[0].body, seen[2].body, "a retry sends the same batch");
    let mut observations = HashMap::new();
    let mut windows = Vec::new();
    for (i, r) in seen.iter().enumerate().skip(2) {
        let req = ExportProfilesServiceRequest::decode(&gunzip(&r.body)[..]).unwrap();
        let rp = &req.resource_profiles[0];
        assert_eq!(rp.resource.as_ref().unwrap().attributes[0].key, "host.name");
        let p = &rp.scope_profiles[0].profiles[0];
        windows.push((p.time_unix_nano - T0, p.duration_nano));
        if i == 3 {
            continue; // refused
        }
        for s in &p.samples {
            for &t in &s.timestamps_unix_nano {
                *observations.entry((t, s.attribute_indices.clone())).or_insert(0) += 1;
            }
        }
    }
    let s10 = 10 * NS_PER_SEC;
    assert_eq!(windows, [(0, s10), (s10, s10), (2 * s10, s10), (3 * s10, s10), (4 * s10, s10)]);
    let taken: Vec<&Sample> = stored.iter().filter(|s| !(T0 + s10..T0 + 2 * s10).contains(&s.ts_ns)).collect();
    assert_eq!(observations.len(), taken.len(), "every sample of the batches taken, once");
    assert!(observations.values().all(|&n| n == 1));
    assert!(observations.keys().all(|(t, _)| taken.iter().any(|s| s.ts_ns == *t)));
    let stats = figures.lock().unwrap().clone();
    assert_eq!((stats.batches, stats.samples, stats.retries), (4, taken.len() as u64, 2));
    assert_eq!(stats.errors.get("rejected"), Some(&1), "{stats:?}");
    assert!(stats.lag_seconds < 30.0, "caught up: {stats:?}");
}
