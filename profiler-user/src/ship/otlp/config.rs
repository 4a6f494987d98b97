//! The `[otlp]` table and `--otlp-endpoint`: where and how the daemon pushes OpenTelemetry
//! profiles (`ship::otlp`), checked before the daemon starts. Nothing secret reaches a sentence:
//! credentials in a URL are refused and hidden, header values never shown. The config file's
//! reader (`config`) holds the table and calls [`otlp`]; it lives here, beside the shipper that
//! uses it, so that shipping imports nothing from the config above it.

use std::time::Duration;

use serde::Deserialize;

use crate::timespec::parse_duration_ns;

/// A setting of `[otlp]` (or `--otlp-endpoint`) that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("otlp.{key} = '{value}': {why}")]
pub struct ConfigError {
    pub key: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// The `[otlp]` table: where and how the daemon pushes OpenTelemetry profiles (`ship::otlp`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpFile {
    /// `http://HOST:PORT`, the collector's base URL (or the full `/v1development/profiles` URL).
    pub endpoint: Option<String>,
    /// "http/protobuf" (default) or "grpc".
    pub protocol: Option<String>,
    /// How much time one batch covers, and so how often one goes (default 10s).
    pub interval: Option<String>,
    /// Longest wait for one attempt's answer (default 10s).
    pub timeout: Option<String>,
    /// "gzip" (default) or "none".
    pub compression: Option<String>,
    /// Sent with every request (authentication).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    HttpProtobuf,
    Grpc,
}

impl std::fmt::Display for OtlpProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        })
    }
}

/// `[otlp]`, checked: the shipper's settings.
#[derive(Debug, Clone)]
pub struct Otlp {
    /// Where requests go: for HTTP the full URL (`.../v1development/profiles`), for gRPC the
    /// service's method path on the endpoint.
    pub url: http::Uri,
    pub protocol: OtlpProtocol,
    pub interval: Duration,
    pub timeout: Duration,
    pub gzip: bool,
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// The OTLP/HTTP path of profiles (the collector's default).
pub const OTLP_HTTP_PATH: &str = "/v1development/profiles";
/// The gRPC method of the profiles service.
pub const OTLP_GRPC_PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
/// Where findings go as log records: the logs signal's path beside the profiles'.
pub const OTLP_LOGS_HTTP_PATH: &str = "/v1/logs";
pub const OTLP_LOGS_GRPC_PATH: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";

impl Otlp {
    /// The same endpoint, for the logs signal: `.../v1development/profiles` becomes
    /// `.../v1/logs` (a prefix kept), the gRPC method that of the logs service.
    pub fn for_logs(&self) -> Otlp {
        let path = match self.protocol {
            OtlpProtocol::HttpProtobuf => {
                let base = self.url.path().strip_suffix(OTLP_HTTP_PATH).unwrap_or("");
                format!("{base}{OTLP_LOGS_HTTP_PATH}")
            }
            OtlpProtocol::Grpc => OTLP_LOGS_GRPC_PATH.to_string(),
        };
        let mut parts = self.url.clone().into_parts();
        parts.path_and_query = path.parse().ok();
        Otlp { url: http::Uri::from_parts(parts).unwrap_or_else(|_| self.url.clone()), ..self.clone() }
    }
}

/// Batch intervals accepted: at least a second (the store's unit); at most five minutes, which
/// bounds a batch's memory with the per-batch sample cap.
pub const OTLP_INTERVAL: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(300);

/// `endpoint` with any `user:password@` part hidden, for sentences and logs.
fn redacted(endpoint: &str) -> String {
    let Some((scheme, rest)) = endpoint.split_once("://") else { return endpoint.to_string() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => endpoint.to_string(),
    }
}

/// Headers the protocol needs as the shipper sets them.
const RESERVED_HEADERS: [&str; 8] = [
    "host",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "te",
    "grpc-encoding",
];

/// The `[otlp]` table (with `--otlp-endpoint`, which wins), checked; `None` when no endpoint is
/// set: nothing is pushed.
pub fn otlp(file: &OtlpFile, endpoint_flag: Option<&str>) -> Result<Option<Otlp>, ConfigError> {
    let Some(endpoint) = endpoint_flag.or(file.endpoint.as_deref()) else {
        let set = [&file.protocol, &file.interval, &file.timeout, &file.compression].iter().any(|v| v.is_some());
        if set || !file.headers.is_empty() {
            return Err(ConfigError {
                key: "endpoint",
                value: String::new(),
                why: "the [otlp] table needs an endpoint (or pass --otlp-endpoint)",
            });
        }
        return Ok(None);
    };
    let bad = |key, value: &str, why| ConfigError { key, value: value.to_string(), why };
    let shown = redacted(endpoint);
    let endpoint = endpoint.trim();
    let protocol = match file.protocol.as_deref().unwrap_or("http/protobuf") {
        "http/protobuf" => OtlpProtocol::HttpProtobuf,
        "grpc" => OtlpProtocol::Grpc,
        other => return Err(bad("protocol", other, "use \"http/protobuf\" or \"grpc\"")),
    };
    let uri: http::Uri = endpoint.parse().map_err(|_| bad("endpoint", &shown, "not a URL: use http://HOST:PORT"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "endpoint",
                &shown,
                "https is not supported: send to a collector on this host or network over http (its own \
                 exporter can use TLS)",
            ));
        }
        _ => return Err(bad("endpoint", &shown, "not an http:// URL: use http://HOST:PORT")),
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(bad("endpoint", &shown, "no host: use http://HOST:PORT"));
    };
    if authority.as_str().contains('@') {
        return Err(bad("endpoint", &shown, "credentials in the URL would be logged: put them in [otlp.headers]"));
    }
    if uri.query().is_some() {
        return Err(bad("endpoint", &shown, "a query string is not supported"));
    }
    // As OTLP exporters read OTEL_EXPORTER_OTLP_ENDPOINT: a base URL gets the signal's path; a URL
    // that already ends with it is used as is. gRPC calls the service's method on the endpoint.
    let base = uri.path().trim_end_matches('/');
    let path = match protocol {
        OtlpProtocol::HttpProtobuf if base.ends_with(OTLP_HTTP_PATH) => base.to_string(),
        OtlpProtocol::HttpProtobuf => format!("{base}{OTLP_HTTP_PATH}"),
        OtlpProtocol::Grpc => OTLP_GRPC_PATH.to_string(),
    };
    let url = http::Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|_| bad("endpoint", &shown, "not a URL: use http://HOST:PORT"))?;
    let pick = |key: &'static str, v: &Option<String>, default: &str| -> Result<Duration, ConfigError> {
        let text = v.as_deref().unwrap_or(default);
        parse_duration_ns(text)
            .filter(|&ns| ns > 0)
            .map(Duration::from_nanos)
            .ok_or_else(|| bad(key, text, "not a duration: use a number with a unit, such as 10s"))
    };
    let interval = pick("interval", &file.interval, "10s")?;
    if !OTLP_INTERVAL.contains(&interval) || interval.subsec_nanos() != 0 {
        return Err(bad("interval", file.interval.as_deref().unwrap_or(""), "use whole seconds from 1s to 5m"));
    }
    let timeout = pick("timeout", &file.timeout, "10s")?;
    if !(Duration::from_millis(100)..=Duration::from_secs(300)).contains(&timeout) {
        return Err(bad("timeout", file.timeout.as_deref().unwrap_or(""), "use 100ms to 5m"));
    }
    let gzip = match file.compression.as_deref().unwrap_or("gzip") {
        "gzip" => true,
        "none" => false,
        other => return Err(bad("compression", other, "use \"gzip\" or \"none\"")),
    };
    let mut headers = Vec::new();
    for (name, value) in &file.headers {
        let n = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad("headers", name, "not a valid header name"))?;
        if RESERVED_HEADERS.contains(&n.as_str()) {
            return Err(bad("headers", name, "the shipper sets this header itself"));
        }
        // The value is not echoed: it is usually a secret.
        let mut v = http::HeaderValue::from_str(value)
            .map_err(|_| bad("headers", name, "its value holds characters a header cannot carry"))?;
        v.set_sensitive(true);
        headers.push((n, v));
    }
    Ok(Some(Otlp { url, protocol, interval, timeout, gzip, headers }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str, endpoint: &str) -> Otlp {
        let file: OtlpFile = toml::from_str(toml).unwrap();
        otlp(&file, Some(endpoint)).unwrap().unwrap()
    }

    #[test]
    fn otlp_settings_are_checked_and_the_signal_path_added() {
        let s = settings("", "http://collector:4318");
        assert_eq!(s.url.to_string(), "http://collector:4318/v1development/profiles");
        assert_eq!(
            (s.protocol, s.interval, s.timeout, s.gzip),
            (OtlpProtocol::HttpProtobuf, Duration::from_secs(10), Duration::from_secs(10), true)
        );
        assert_eq!(settings("", "http://c:4318/v1development/profiles").url.path(), "/v1development/profiles");
        assert_eq!(settings("", "http://c:4318/prefix/").url.path(), "/prefix/v1development/profiles");
        let g = settings("protocol = \"grpc\"\ninterval = \"2s\"\ncompression = \"none\"", "http://c:4317");
        assert_eq!(g.url.path(), "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export");
        assert_eq!(g.for_logs().url.path(), "/opentelemetry.proto.collector.logs.v1.LogsService/Export");
        assert_eq!(settings("", "http://c:4318/prefix/").for_logs().url.to_string(), "http://c:4318/prefix/v1/logs");
        assert_eq!(settings("", "http://c:4318").for_logs().url.to_string(), "http://c:4318/v1/logs");
        assert_eq!((g.interval, g.gzip), (Duration::from_secs(2), false));
        let h = settings("[headers]\nauthorization = \"Bearer s3cret\"", "http://c:4318");
        assert_eq!(h.headers[0].0, "authorization");
        for (toml, endpoint, wanted) in [
            ("", "https://c:4318", "https is not supported"),
            ("", "https://user:pw@c:4318", "https is not supported"),
            ("", "http://user:pw@c:4318", "credentials in the URL"),
            ("", "c:4318", "not an http:// URL"),
            ("", "http://c:4318/?x=1", "query string"),
            ("protocol = \"http/json\"", "http://c", "otlp.protocol = 'http/json'"),
            ("interval = \"500ms\"", "http://c", "whole seconds"),
            ("interval = \"1h\"", "http://c", "whole seconds"),
            ("interval = \"soon\"", "http://c", "not a duration"),
            ("timeout = \"1ms\"", "http://c", "use 100ms to 5m"),
            ("compression = \"zstd\"", "http://c", "\"gzip\" or \"none\""),
            ("[headers]\ncontent-type = \"text/plain\"", "http://c", "sets this header itself"),
            ("[headers]\n\"bad header\" = \"x\"", "http://c", "not a valid header name"),
            ("[headers]\nx-token = \"line\\nbreak\"", "http://c", "cannot carry"),
        ] {
            let file: OtlpFile = toml::from_str(toml).unwrap();
            let e = otlp(&file, Some(endpoint)).unwrap_err().to_string();
            assert!(e.contains(wanted), "{toml} {endpoint}: {e}");
            assert!(!e.contains("line\nbreak") && !e.contains("pw@"), "no secret in the sentence: {e}");
        }
        assert!(otlp(&OtlpFile::default(), None).unwrap().is_none(), "no endpoint: no push");
        let orphan: OtlpFile = toml::from_str("interval = \"5s\"").unwrap();
        assert!(otlp(&orphan, None).unwrap_err().to_string().contains("needs an endpoint"));
        let file: OtlpFile = toml::from_str("endpoint = \"http://file:1\"").unwrap();
        assert_eq!(otlp(&file, Some("http://flag:2")).unwrap().unwrap().url.host(), Some("flag"));
    }
}
