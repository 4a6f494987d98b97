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
    #[error("ClickHouse at {addr} does not answer ({reason}): is it running, and is --clickhouse right?")]
    Down { addr: String, reason: String },
    #[error("no {what} between {from} and {to} in what {nodes} shipped to ClickHouse")]
    NoSamples { what: String, from: String, to: String, nodes: String },
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error("--event '{pattern}' is not a regular expression: {reason}")]
    Pattern { pattern: String, reason: String },
    #[error(
        "ClickHouse at {addr} cannot reach {shards} of its cluster ({reason}): the nodes stored there would be \
         missing from the answer, so none is given; read again once it is back"
    )]
    ShardDown { addr: String, shards: String, reason: String },
    #[error(
        "ClickHouse at {addr} stopped this read at its time limit ({secs} s asked, or the user's profile's): ask for \
         a shorter window or fewer nodes",
        secs = super::refusal::READ_SECS
    )]
    Timeout { addr: String },
    #[error(
        "ClickHouse at {addr} did not answer within {secs} s: ask for a shorter window or fewer nodes (a shard of its \
         cluster that is stopped, not down, also holds reads, until the server's receive_timeout)"
    )]
    NoAnswerIn { addr: String, secs: u64 },
    #[error(
        "ClickHouse at {addr} refused the user and password: check them in --clickhouse http://USER:PASSWORD@HOST:PORT"
    )]
    Login { addr: String },
    #[error(
        "ClickHouse at {addr} refused this read (code {code}: {message}): a database written by another profiler \
         version, or a bug: please report it"
    )]
    Refused { addr: String, code: u32, message: String },
}
