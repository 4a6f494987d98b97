//! One OTLP export request, over HTTP/1.1 (`application/x-protobuf`) or gRPC (HTTP/2 without
//! TLS), and what its answer means by the OTLP specification (opentelemetry-proto,
//! docs/specification.md): retry on a connection failure, 429, 502, 503 or 504 (HTTP) or on
//! CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS, and
//! RESOURCE_EXHAUSTED with a retry delay (gRPC), after the receiver's `Retry-After` or
//! `RetryInfo` when it gives one; any other refusal is final.

use std::time::Duration;

use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

use super::config::{Otlp, OtlpProtocol};
use crate::export::otlp::proto::ExportProfilesServiceResponse;

/// Largest answer read: an export response is a few bytes, an error a sentence.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Delivered; the receiver may still say it dropped `rejected` profiles (and why).
    Accepted { rejected: i64, message: String },
    /// Worth another try, after `after` when the receiver said how long to wait.
    Retry { why: String, after: Option<Duration> },
    /// Refused for good: sending the same request again would not help.
    Rejected { why: String },
}

/// The request body: the encoded message, gzipped if asked; framed for gRPC.
pub fn body(config: &Otlp, message: &[u8]) -> Bytes {
    let payload = if config.gzip {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(message).and_then(|_| gz.finish()).expect("gzip into memory")
    } else {
        message.to_vec()
    };
    match config.protocol {
        OtlpProtocol::HttpProtobuf => Bytes::from(payload),
        // A gRPC message: a compressed flag, the length (big-endian u32), the message.
        OtlpProtocol::Grpc => {
            let mut framed = Vec::with_capacity(payload.len() + 5);
            framed.push(u8::from(config.gzip));
            framed.extend((payload.len() as u32).to_be_bytes());
            framed.extend(payload);
            Bytes::from(framed)
        }
    }
}

/// Sends `body` (from [`body`]) once. The caller bounds the time it may take.
pub async fn send(config: &Otlp, body: Bytes) -> Outcome {
    let authority = config.url.authority().expect("checked by config::otlp");
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let stream = match tokio::net::TcpStream::connect((host, authority.port_u16().unwrap_or(80))).await {
        Ok(s) => s,
        Err(e) => return Outcome::Retry { why: format!("cannot connect to {authority}: {e}"), after: None },
    };
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(stream);
    let mut request = Request::post(&config.url);
    for (name, value) in &config.headers {
        request = request.header(name, value);
    }
    let result = match config.protocol {
        OtlpProtocol::HttpProtobuf => {
            // Origin-form, as servers expect from a client that is not a proxy.
            let path = config.url.path_and_query().map_or("/", |p| p.as_str());
            let mut request = request
                .uri(path)
                .header(header::HOST, authority.as_str())
                .header(header::CONTENT_TYPE, "application/x-protobuf");
            if config.gzip {
                request = request.header(header::CONTENT_ENCODING, "gzip");
            }
            http1(io, request.body(Full::new(body)).expect("valid request")).await
        }
        OtlpProtocol::Grpc => {
            let mut request = request
                .header(header::CONTENT_TYPE, "application/grpc")
                .header(header::TE, "trailers")
                .header("grpc-timeout", format!("{}m", config.timeout.as_millis().max(1)));
            if config.gzip {
                request = request.header("grpc-encoding", "gzip");
            }
            http2(io, request.body(Full::new(body)).expect("valid request")).await
        }
    };
    match result {
        Ok((status, headers, trailers, data)) => match config.protocol {
            OtlpProtocol::HttpProtobuf => http_outcome(status, &headers, &data),
            OtlpProtocol::Grpc if status != StatusCode::OK => http_outcome(status, &headers, &data),
            OtlpProtocol::Grpc => {
                grpc_outcome(trailers.as_ref().filter(|t| t.contains_key("grpc-status")).unwrap_or(&headers), &data)
            }
        },
        Err(e) => Outcome::Retry { why: format!("the request to {authority} failed: {e}"), after: None },
    }
}

type Answer = (StatusCode, http::HeaderMap, Option<http::HeaderMap>, Bytes);

async fn http1(io: TokioIo<tokio::net::TcpStream>, request: Request<Full<Bytes>>) -> Result<Answer, hyper::Error> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    let conn = tokio::spawn(conn);
    let answer = read(sender.send_request(request).await?).await;
    conn.abort();
    answer
}

async fn http2(io: TokioIo<tokio::net::TcpStream>, request: Request<Full<Bytes>>) -> Result<Answer, hyper::Error> {
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
    let conn = tokio::spawn(conn);
    let answer = read(sender.send_request(request).await?).await;
    conn.abort();
    answer
}

async fn read(response: hyper::Response<hyper::body::Incoming>) -> Result<Answer, hyper::Error> {
    let (parts, body) = response.into_parts();
    // A longer answer is cut: it only ever feeds a log line.
    let collected = match Limited::new(body, MAX_RESPONSE_BYTES).collect().await {
        Ok(c) => c,
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => return Err(*e),
            Err(_) => return Ok((parts.status, parts.headers, None, Bytes::new())),
        },
    };
    let trailers = collected.trailers().cloned();
    Ok((parts.status, parts.headers, trailers, collected.to_bytes()))
}

fn http_outcome(status: StatusCode, headers: &http::HeaderMap, body: &[u8]) -> Outcome {
    if status.is_success() {
        return accepted(body);
    }
    let message = Status::decode(body).map(|s| s.message).unwrap_or_default();
    let why = if message.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {message}") };
    match status.as_u16() {
        429 | 502 | 503 | 504 => {
            let after = headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(retry_after);
            Outcome::Retry { why, after }
        }
        _ => Outcome::Rejected { why },
    }
}

fn grpc_outcome(meta: &http::HeaderMap, data: &[u8]) -> Outcome {
    let text = |k: &str| meta.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let Ok(code) = text("grpc-status").parse::<u32>() else {
        return Outcome::Retry { why: "the gRPC answer has no status".into(), after: None };
    };
    // Status details (google.rpc.Status, base64) may say how long to wait.
    let details = meta.get("grpc-status-details-bin").and_then(|v| {
        use base64::{Engine as _, engine};
        // gRPC sends it padded or not; both must be read.
        let config =
            engine::GeneralPurposeConfig::new().with_decode_padding_mode(engine::DecodePaddingMode::Indifferent);
        engine::GeneralPurpose::new(&base64::alphabet::STANDARD, config).decode(v.as_bytes()).ok()
    });
    let delay = details.as_deref().and_then(|d| Status::decode(d).ok()).and_then(|s| s.retry_delay());
    let why = format!("gRPC status {code}: {}", text("grpc-message"));
    match code {
        // The message after the 5-byte gRPC prefix (uncompressed: we do not offer compression back).
        0 => accepted(data.get(5..).filter(|_| data.first() == Some(&0)).unwrap_or_default()),
        1 | 4 | 10 | 11 | 14 | 15 => Outcome::Retry { why, after: delay },
        8 if delay.is_some() => Outcome::Retry { why, after: delay },
        _ => Outcome::Rejected { why },
    }
}

fn accepted(body: &[u8]) -> Outcome {
    let partial = ExportProfilesServiceResponse::decode(body).ok().and_then(|r| r.partial_success).unwrap_or_default();
    Outcome::Accepted { rejected: partial.rejected_profiles, message: partial.error_message }
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(v: &str) -> Option<Duration> {
    if let Ok(secs) = v.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(v.trim()).ok()?;
    let wait = at.duration_since(jiff::Timestamp::now());
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// `google.rpc.Status`, the body of OTLP/HTTP errors and gRPC status details.
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`: its `retry_delay`, a `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

impl Status {
    fn retry_delay(&self) -> Option<Duration> {
        let info = self.details.iter().find(|a| a.type_url.ends_with("/google.rpc.RetryInfo"))?;
        let d = RetryInfo::decode(&info.value[..]).ok()?.retry_delay?;
        Some(Duration::new(d.seconds.max(0) as u64, d.nanos.clamp(0, 999_999_999) as u32))
    }
}
