//! What can go wrong reading the fleet from ClickHouse, each a sentence that says what to do.

use crate::ship::clickhouse::ShipError;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    ClickHouse(#[from] ShipError),
    #[error("ClickHouse URL '{0}' is not http://[USER[:PASSWORD]@]HOST:PORT")]
    Url(String),
    #[error("ClickHouse holds no node in database `{0}`: is a daemon shipping to it (profiler run --clickhouse URL)?")]
    NoNodes(String),
    #[error("node '{node}' has shipped nothing to this ClickHouse; it holds {known}")]
    UnknownNode { node: String, known: String },
    #[error("this ClickHouse holds {0} nodes ({1}): name one with --node, or ask them all with `profiler fleet`")]
    WhichNode(usize, String),
    #[error("ClickHouse answered rows that do not decode ({0}): is the database written by another version?")]
    Decode(String),
    #[error(
        "node {node} has {rows} samples between {from} and {to}, more than the {limit} one read copies: ask for a shorter window"
    )]
    TooMany { node: String, rows: u64, limit: u64, from: String, to: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot create a private directory for the copy: {0}")]
    Temp(#[source] std::io::Error),
    #[error("ClickHouse at {addr} does not answer ({reason}): is it running, and is --clickhouse right?")]
    Down { addr: String, reason: String },
    #[error("no {what} between {from} and {to} in what {nodes} shipped to ClickHouse")]
    NoSamples { what: String, from: String, to: String, nodes: String },
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error("--event '{pattern}' is not a regular expression: {reason}")]
    Pattern { pattern: String, reason: String },
}
