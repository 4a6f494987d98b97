//! What can go wrong talking to ClickHouse, shipping to it or reading the fleet from it.

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("ClickHouse did not answer: {0}")]
    Http(String),
    #[error("ClickHouse refused (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    #[error("ClickHouse answered {0:?} where a number was expected")]
    Answer(String),
    #[error(transparent)]
    Cursor(#[from] crate::ship::CursorError),
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error("{key} = {value} is out of range: use {allowed}")]
    Range { key: &'static str, value: String, allowed: &'static str },
    #[error("ClickHouse URL '{0}' is not http://HOST:PORT (HTTPS is not built in: put a local TLS proxy in front)")]
    Url(String),
}
