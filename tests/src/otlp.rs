//! A loopback OTLP/HTTP receiver for tests: it takes profiles (`/v1development/profiles`) and
//! logs (`/v1/logs`), gunzipped, and can refuse (503) or drop requests to make the daemon retry.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

#[derive(Default)]
pub struct Receiver {
    /// Requests still to answer 503.
    pub refuse: usize,
    pub refused: usize,
    /// Closed: requests are dropped unanswered (the daemon retries them).
    pub gate_closed: bool,
    pub dropped: usize,
    /// Bodies answered 200, gunzipped.
    pub accepted: Vec<Vec<u8>>,
    /// Log requests (`/v1/logs`: findings), gunzipped; always taken.
    pub logs: Vec<Vec<u8>>,
}

/// A loopback OTLP/HTTP receiver, one thread per connection (it may hold one).
pub fn receiver(refuse: usize) -> (String, Arc<Mutex<Receiver>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Mutex::new(Receiver { refuse, ..Default::default() }));
    let shared = state.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let state = shared.clone();
            std::thread::spawn(move || answer(conn, &state));
        }
    });
    (url, state)
}

fn answer(mut conn: TcpStream, state: &Mutex<Receiver>) {
    let Some((head, body)) = read_request(&mut conn) else { return };
    assert!(head.contains("content-type: application/x-protobuf") && head.contains("content-encoding: gzip"));
    let gunzip = |body: &[u8]| {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(body).read_to_end(&mut raw).unwrap();
        raw
    };
    if head.starts_with("post /v1/logs http/1.1") {
        state.lock().unwrap().logs.push(gunzip(&body));
        let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    assert!(head.starts_with("post /v1development/profiles http/1.1"), "{head}");
    let status = {
        let mut s = state.lock().unwrap();
        if s.refuse > 0 {
            s.refuse -= 1;
            s.refused += 1;
            "503 Service Unavailable"
        } else if s.gate_closed {
            s.dropped += 1;
            return; // closed unanswered
        } else {
            s.accepted.push(gunzip(&body));
            "200 OK"
        }
    };
    let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

pub fn read_request(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let (mut raw, mut buf) = (Vec::new(), [0; 65536]);
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
    Some((head, raw[split..split + len].to_vec()))
}
