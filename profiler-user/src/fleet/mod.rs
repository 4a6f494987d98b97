//! Reads the fleet store, ClickHouse (docs/clickhouse.md), that daemons ship to with
//! `profiler run --clickhouse URL`: the read commands' and the node page's `--clickhouse URL
//! --node N` ([`reader`]: one read interface, answered by SQL that sums in the server) and the
//! questions only the fleet answers ([`overview`]: `profiler fleet`; [`board`]: the fleet page).

pub mod board;
pub mod board_sql;
pub mod counters;
mod error;
pub mod kind_grid;
pub mod minutes;
pub mod node_minutes;
pub mod notes;
pub mod overview;
pub mod overview_text;
pub mod pushdown;
pub mod reader;
mod refusal;
pub mod rollup;
mod rowbinary;
pub mod samples;
pub mod select;
pub mod signatures;
pub mod stack_text;

pub use error::FleetError;
use rowbinary::Reader;
pub use select::Selection;

/// Frame of a sample whose stack is missing from `stack_frames` and `stacks`.
pub(crate) const MISSING_STACK: &str = "[stack not in ClickHouse]";

use crate::ship::clickhouse::{
    ShipError,
    http::Client,
    schema::{self, col::*, quote_ident, quote_str},
};

/// A node as `nodes` describes it (its latest row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub cpus: u32,
    pub hz: u32,
    /// Online CPUs in the kernel's list format.
    pub online: String,
    pub host: String,
}

/// A ClickHouse database that daemons ship to.
pub struct Fleet {
    client: Client,
    database: String,
    /// `host:port`, without credentials: for messages.
    addr: String,
    /// The user may not set a read's time limit (`readonly=1`): reads go without it.
    readonly: std::sync::atomic::AtomicBool,
    /// The server has the frames dictionary's tables (`stack_text`; remembered once seen).
    dictionary: std::sync::atomic::AtomicBool,
}

impl Fleet {
    /// `url` may carry credentials (`http://user:password@host:8123`).
    pub fn new(url: &str, database: &str) -> Result<Self, FleetError> {
        let rest = url.strip_prefix("http://").filter(|r| !r.is_empty()).ok_or_else(|| FleetError::Url(url.into()))?;
        let (auth, host) = match rest.split_once('@') {
            Some((auth, host)) if !auth.contains('/') => (Some(auth), host),
            _ => (None, rest),
        };
        let (user, password) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
            Some((u, p)) => (Some(u), Some(p)),
            None => (None, None),
        };
        Ok(Self {
            client: Client::new(&format!("http://{host}"), user, password),
            database: database.to_string(),
            addr: host.to_string(),
            readonly: false.into(),
            dictionary: false.into(),
        })
    }

    /// `db.name`, quoted: the plain name is the table itself, or the `Distributed` table over
    /// the shards.
    pub fn table(&self, name: &str) -> String {
        format!("{}.{}", quote_ident(&self.database), quote_ident(name))
    }

    /// Runs `sql` (without its `FORMAT`) and decodes each `RowBinary` row with `row`.
    pub fn rows<T>(
        &self,
        sql: &str,
        mut row: impl FnMut(&mut Reader<'_>) -> Result<T, FleetError>,
    ) -> Result<Vec<T>, FleetError> {
        let bytes = self.row_binary(sql)?;
        let mut r = Reader::new(&bytes);
        let mut out = Vec::new();
        while !r.at_end() {
            out.push(row(&mut r)?);
        }
        Ok(out)
    }

    /// The `RowBinary` answer to `sql` (without its `FORMAT`), to decode in place; with its time
    /// limit ([`refusal::READ_SECS`]), unless the user may not set it.
    fn row_binary(&self, sql: &str) -> Result<Vec<u8>, FleetError> {
        use std::sync::atomic::Ordering::Relaxed;
        let sql = format!("{sql} FORMAT RowBinary");
        if !self.readonly.load(Relaxed) {
            let limit = refusal::settings();
            let settings: Vec<(&str, &str)> = limit.iter().map(|(k, v)| (*k, v.as_str())).collect();
            match self.client.query_bytes_with(&sql, &settings) {
                // `readonly=1`: its profile's limit applies; asked again without ours.
                Err(e) if refusal::refused_settings(&e) => self.readonly.store(true, Relaxed),
                answer => return answer.map_err(|e| self.explain(e)),
            }
        }
        self.client.query_bytes(&sql).map_err(|e| self.explain(e))
    }

    /// A failed request as the sentence a user can act on (`refusal`).
    fn explain(&self, e: ShipError) -> FleetError {
        refusal::explain(&self.addr, &self.database, e)
    }

    /// Every node that shipped, by name.
    pub fn nodes(&self) -> Result<Vec<Node>, FleetError> {
        let sql = format!(
            "SELECT {NODE}, argMax({CPUS}, {VERSION}), argMax({HZ}, {VERSION}), argMax({ONLINE}, {VERSION}), \
             argMax({HOST}, {VERSION}) FROM {} GROUP BY {NODE} ORDER BY {NODE}",
            self.table(schema::NODES)
        );
        self.rows(&sql, |r| {
            Ok(Node {
                name: r.string()?.to_string(),
                cpus: r.u32()?,
                hz: r.u32()?,
                online: r.string()?.to_string(),
                host: r.string()?.to_string(),
            })
        })
    }

    /// The node asked for, or the only one there is.
    pub fn node(&self, asked: Option<&str>) -> Result<Node, FleetError> {
        let mut nodes = self.nodes()?;
        let names = || {
            let mut s = nodes.iter().take(10).map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ");
            if nodes.len() > 10 {
                s.push_str(&format!(" and {} more", nodes.len() - 10));
            }
            s
        };
        match asked {
            _ if nodes.is_empty() => Err(FleetError::NoNodes(self.database.clone())),
            Some(name) => match nodes.iter().position(|n| n.name == name) {
                Some(i) => Ok(nodes.swap_remove(i)),
                None => Err(FleetError::UnknownNode { node: name.into(), known: names() }),
            },
            None if nodes.len() == 1 => Ok(nodes.remove(0)),
            None => Err(FleetError::WhichNode(nodes.len(), names())),
        }
    }

    /// What ClickHouse holds of `node`, as the store's summary says it of a data directory:
    /// its first and last time and, per CPU, the busy, idle and lost samples.
    pub fn summary(&self, node: &str) -> Result<crate::store::StoreSummary, FleetError> {
        // A retried batch sends a block's row again: one per (ts, cpu), as every read takes them.
        let sql = format!(
            "SELECT {CPU}, toUInt64(min({TS})), toUInt64(max({TS} + sp)), toUInt64(sum(b)), toUInt64(sum(i)), \
             toUInt64(sum(l)) FROM (SELECT {TS}, {CPU}, max({SPAN}) AS sp, max({BUSY}) AS b, max({IDLE}) AS i, \
             max({LOST}) AS l FROM {} WHERE {NODE} = {} GROUP BY {TS}, {CPU}) GROUP BY {CPU} ORDER BY {CPU}",
            self.table(schema::CPU_SECONDS),
            quote_str(node)
        );
        let rows = self.rows(&sql, |r| Ok((r.u16()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?)))?;
        let mut out = crate::store::StoreSummary::default();
        for (cpu, first, last, samples, idle, lost) in rows {
            let (a, b) = out.span.unwrap_or((first, last));
            out.span = Some((a.min(first), b.max(last)));
            out.cpus.insert(u32::from(cpu), crate::store::CpuSummary { samples, idle, lost });
        }
        Ok(out)
    }

    /// Where the fleet is read, without credentials: `ClickHouse at HOST:PORT, database D`.
    pub fn describe(&self) -> String {
        format!("ClickHouse at {}, database {}", self.addr, self.database)
    }

    /// `node = '...' AND` a time range on `ts`, for a `WHERE`.
    fn node_range(node: &str, from_ns: u64, to_ns: u64) -> String {
        format!("{NODE} = {} AND {TS} >= {from_ns} AND {TS} < {to_ns}", quote_str(node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_out_of_the_url() {
        assert!(Fleet::new("http://u:p@h:8123", "db").is_ok());
        for bad in ["https://h:8123", "http://", "h:8123"] {
            let e = Fleet::new(bad, "db").err().expect(bad).to_string();
            assert!(e.contains("is not http://"), "{e}");
        }
        assert_eq!(Fleet::node_range("a'b", 1, 2), "node = 'a\\'b' AND ts >= 1 AND ts < 2");
    }
}
