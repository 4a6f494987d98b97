//! A read ClickHouse did not answer, as a sentence a user can act on: never the server's error
//! passed through. Each read carries a time limit of its own (`max_execution_time`), unless the
//! user may not set one (`readonly=1` refuses every setting in a request, code 164: its
//! profile's own limit applies, and the request's timeout bounds the wait).
//!
//! The messages parsed are 18.16's (`Code: 279, e.displayText() = DB::NetException: ...`) and
//! current servers' (`Code: 279. DB::NetException: ... (ALL_CONNECTION_TRIES_FAILED)`).

use super::FleetError;
use crate::ship::clickhouse::{ShipError, http};

/// The time limit a read asks for, seconds: under the request's own timeout
/// ([`http::TIMEOUT`]), so that a read too big for it ends with the server's "timeout" (a
/// sentence here) and stops using the server, rather than with a closed connection while the
/// server works on.
pub const READ_SECS: u64 = 25;

/// The settings each read asks for.
pub(super) fn settings() -> [(&'static str, String); 1] {
    [("max_execution_time", READ_SECS.to_string())]
}

// The server's error codes that have a sentence of their own.
const UNKNOWN_TABLE: u32 = 60;
const UNKNOWN_DATABASE: u32 = 81;
const TIMEOUT_EXCEEDED: u32 = 159;
const READONLY: u32 = 164;
const UNKNOWN_USER: u32 = 192;
const WRONG_PASSWORD: u32 = 193;
const SOCKET_TIMEOUT: u32 = 209;
const NETWORK_ERROR: u32 = 210;
const ALL_CONNECTION_TRIES_FAILED: u32 = 279;
const AUTHENTICATION_FAILED: u32 = 516;

/// The user may not set settings in a request (`readonly=1`): ask again without them.
pub(super) fn refused_settings(e: &ShipError) -> bool {
    matches!(e, ShipError::Server { message, .. } if code(message) == Some(READONLY))
}

/// What a failed read means. `addr` is the server asked (`host:port`), `database` the one read.
pub(super) fn explain(addr: &str, database: &str, e: ShipError) -> FleetError {
    let addr = addr.to_string();
    let message = match e {
        ShipError::Http(reason) if reason.starts_with("timeout") => {
            return FleetError::NoAnswerIn { addr, secs: http::TIMEOUT.as_secs() };
        }
        ShipError::Http(reason) => return FleetError::Down { addr, reason },
        ShipError::Server { message, .. } => message,
        e => return FleetError::ClickHouse(e),
    };
    let Some(code) = code(&message) else {
        // Not ClickHouse's own error (a proxy's page, say).
        return FleetError::Refused { addr, code: 0, message: text(&message) };
    };
    match code {
        // Nothing was ever shipped here (or not to this database).
        UNKNOWN_DATABASE | UNKNOWN_TABLE => FleetError::NoNodes(database.to_string()),
        TIMEOUT_EXCEEDED => FleetError::Timeout { addr },
        UNKNOWN_USER | WRONG_PASSWORD | AUTHENTICATION_FAILED => FleetError::Login { addr },
        SOCKET_TIMEOUT | NETWORK_ERROR | ALL_CONNECTION_TRIES_FAILED => {
            let shards = shards(&message, &addr);
            FleetError::ShardDown {
                addr,
                shards: if shards.is_empty() { "a shard".into() } else { format!("shard {}", shards.join(", ")) },
                reason: reason(&message),
            }
        }
        code => FleetError::Refused { addr, code, message: text(&message) },
    }
}

/// The error code the message starts with (`Code: 164, ...` or `Code: 164. ...`).
fn code(message: &str) -> Option<u32> {
    let rest = &message[message.find("Code: ")? + "Code: ".len()..];
    rest[..rest.find(|c: char| !c.is_ascii_digit())?].parse().ok()
}

/// The `host:port` addresses in parentheses that are not the server asked: the shards it could
/// not reach (`Connection refused (10.0.0.2:9000)`).
fn shards(message: &str, asked: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in message.split('(').skip(1) {
        // `(10.0.0.2:9000)`, or `(10.0.0.2:9000, 300000 ms)` from a timeout.
        let Some(inside) = part.split([')', ',']).next() else { continue };
        let is_addr = inside.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains(' ') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        });
        if is_addr && inside != asked && !out.iter().any(|s| s == inside) {
            out.push(inside.to_string());
        }
    }
    out
}

/// Why a shard was not reached: the last network error's words (`connection refused`).
fn reason(message: &str) -> String {
    let last = message
        .rsplit("NetException: ")
        .next()
        .filter(|r| !r.starts_with("All connection tries failed"))
        .unwrap_or("network error");
    let words = last.split(['(', ',', '\n']).next().unwrap_or(last).trim();
    if words.is_empty() { "network error".into() } else { words.to_lowercase() }
}

/// The message's own words: its first line without the code and the exception's class, at
/// most 200 characters.
fn text(message: &str) -> String {
    let line = message.trim().lines().next().unwrap_or("");
    let line = line.split_once("Exception: ").map_or(line, |(_, rest)| rest);
    let line = line.split(", e.what()").next().unwrap_or(line).trim();
    let mut out: String = line.chars().take(200).collect();
    if out.len() < line.len() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(message: &str) -> ShipError {
        ShipError::Server { status: 500, message: message.into() }
    }

    /// 18.16's answer to a read through a Distributed table while the second shard is down.
    const SHARD_DOWN_18: &str = "Code: 279, e.displayText() = DB::NetException: All connection tries failed. Log: \n\n\
        Code: 210, e.displayText() = DB::NetException: Connection refused (127.0.0.1:19102), e.what() = DB::NetException\n\n\
        , e.what() = DB::NetException";

    #[test]
    fn codes_of_old_and_new_servers() {
        assert_eq!(code(SHARD_DOWN_18), Some(279));
        assert_eq!(
            code(
                "Code: 164. DB::Exception: reader: Cannot modify 'max_execution_time' setting in readonly mode. (READONLY)"
            ),
            Some(164)
        );
        assert_eq!(
            code("Code: 159, e.displayText() = DB::Exception: Timeout exceeded: elapsed 25.0 seconds"),
            Some(159)
        );
        assert_eq!(code("502 Bad Gateway"), None);
        assert_eq!(code("Code: x"), None);
    }

    #[test]
    fn a_shard_down_is_named() {
        let e = explain("127.0.0.1:19101", "profiler", server(SHARD_DOWN_18)).to_string();
        assert_eq!(
            e,
            "ClickHouse at 127.0.0.1:19101 cannot reach shard 127.0.0.1:19102 of its cluster (connection refused): \
             the nodes stored there would be missing from the answer, so none is given; read again once it is back"
        );
        assert!(!e.contains("e.what") && !e.contains("Code:"));
        let new = "Code: 279. DB::NetException: All connection tries failed. Log: \n\nCode: 210. DB::NetException: \
                   Connection refused (10.0.0.2:9000). (NETWORK_ERROR)\n\n. (ALL_CONNECTION_TRIES_FAILED)";
        let e = explain("10.0.0.1:8123", "p", server(new)).to_string();
        assert!(e.contains("cannot reach shard 10.0.0.2:9000 of its cluster (connection refused)"), "{e}");
        // Two shards down, each named once; no address at all still says a shard.
        let two = format!("{SHARD_DOWN_18} Connection refused (127.0.0.1:19103) (127.0.0.1:19102)");
        assert_eq!(shards(&two, "127.0.0.1:19101"), ["127.0.0.1:19102", "127.0.0.1:19103"]);
        assert_eq!(
            shards("Timeout exceeded while reading from socket (10.0.0.3:9000, 300000 ms)", "h:1"),
            ["10.0.0.3:9000"]
        );
        let e = explain(
            "h:1",
            "p",
            server("Code: 209, e.displayText() = DB::NetException: Timeout exceeded while reading from socket"),
        )
        .to_string();
        assert!(e.contains("cannot reach a shard of its cluster (timeout exceeded while reading from socket)"), "{e}");
    }

    #[test]
    fn limits_logins_and_the_rest_are_sentences() {
        let e = explain("h:1", "p", server("Code: 159, e.displayText() = DB::Exception: Timeout exceeded: elapsed 25.000 seconds, maximum: 25, e.what() = DB::Exception")).to_string();
        assert!(e.starts_with("ClickHouse at h:1 stopped this read at its time limit"), "{e}");
        let e = explain("h:1", "p", ShipError::Http("timeout: global".into())).to_string();
        assert!(e.starts_with("ClickHouse at h:1 did not answer within 30 s"), "{e}");
        let e = explain("h:1", "p", ShipError::Http("io: Connection refused".into())).to_string();
        assert!(e.contains("does not answer (io: Connection refused)"), "{e}");
        let e = explain(
            "h:1",
            "p",
            server(
                "Code: 193, e.displayText() = DB::Exception: Wrong password for user reader, e.what() = DB::Exception",
            ),
        )
        .to_string();
        assert!(e.contains("refused the user and password"), "{e}");
        let e =
            explain("h:1", "nope", server("Code: 81, e.displayText() = DB::Exception: Database nope doesn't exist"))
                .to_string();
        assert!(e.contains("no node in database `nope`"), "{e}");
        let e = explain("h:1", "p", server("Code: 62, e.displayText() = DB::Exception: Syntax error: failed at position 8, e.what() = DB::Exception")).to_string();
        assert_eq!(
            e,
            "ClickHouse at h:1 refused this read (code 62: Syntax error: failed at position 8): \
             a database written by another profiler version, or a bug: please report it"
        );
        let long = format!("Code: 1, e.displayText() = DB::Exception: {}", "x".repeat(500));
        assert!(explain("h:1", "p", server(&long)).to_string().contains(&format!("{}...)", "x".repeat(200))));
        assert!(refused_settings(&server(
            "Code: 164, e.displayText() = DB::Exception: Cannot override setting (max_execution_time) in readonly mode"
        )));
        assert!(!refused_settings(&server("Code: 1640, whatever")) && !refused_settings(&ShipError::Http("x".into())));
        assert!(READ_SECS < http::TIMEOUT.as_secs(), "the server's limit comes first");
    }
}
