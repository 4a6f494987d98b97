//! Materialized views whose definition changed reach servers that already have them.
//!
//! Every view is created `IF NOT EXISTS`, so a changed `SELECT` (a new formula, a new key)
//! would never replace the one a server already runs, and 18.16 has neither `ALTER ... MODIFY
//! QUERY` nor an atomic swap; its `system.tables.create_table_query` is the server's own
//! formatting of the text, not ours, so it cannot be compared. Instead each view has a version
//! ([`VERSIONS`]), and each server records the version it last created in `schema_views` (a
//! table of its own, never `Distributed`: each shard runs its own views). A shipper, on start:
//! - creates a view that is missing (recording its version first, so that another node's
//!   shipper starting at the same moment sees a record and leaves the view alone);
//! - replaces a view (drop, record, create) whose recorded version is older than its own, or
//!   that has no record at all (made before the record existed: its text is unknown);
//! - leaves a view whose recorded version is its own or newer: an older daemon in a rolling
//!   upgrade never reverts a newer view.
//!
//! The cost, said in docs/clickhouse.md: an insert that arrives in the milliseconds between the
//! drop and the create is missing from that rollup, and rows rolled up before keep the old
//! formula. Schemas made by hand from `schema::statements` record their views as made (`at` 0,
//! so that any shipper's later record is newer). Only a view's `SELECT` is upgraded: a rollup
//! table whose columns change would need an `ALTER TABLE` of its own, which nothing here makes.

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{error::ShipError, http::Client, schema::quote_ident, schema::quote_str};

/// The table of versions, per server.
pub const RECORD: &str = "schema_views";

const PREFIX: &str = "CREATE MATERIALIZED VIEW IF NOT EXISTS ";

/// Each view's version and the XXH3-64 of its statement for the layout the unit test pins
/// (`p`, no cluster). **Changing a view's text means raising its version**: the test
/// `every_views_text_is_pinned_to_its_version` fails until the pin is updated with it.
const VERSIONS: &[(&str, u32, u64)] = &[
    ("samples_1m_mv", 1, 0x98372bbfb6a6180f),
    ("samples_1h_mv", 1, 0xcb7916f5544190e6),
    ("samples_fleet_1m_mv", 1, 0x4d8f7c29915d1cb9),
    ("samples_fleet_10m_mv", 1, 0xfbc69ba0233ea383),
    ("samples_1d_mv", 1, 0xc553ab4fac4b9201),
    ("samples_fleet_1s_mv", 1, 0xa0cb8dfbe77e7c5),
    ("stack_nodes_1h_mv", 1, 0x27322156bd825aa),
    ("cpu_1m_mv", 2, 0x6ff6b8a38a8df4ce),
    ("gpu_util_1m_mv", 1, 0x4fe2cf2d5aa37e77),
    ("cpu_1h_mv", 2, 0x302169524e2a27fb),
    ("gpu_util_1h_mv", 1, 0x46bf74656b3f07fd),
    ("cpu_node_1m_mv", 2, 0x9ba58c5d472d652e),
    ("cpu_5m_mv", 2, 0xbd64b745eb015973),
];

/// A view's version (1 for one not listed: the first recorded version).
pub fn version(view: &str) -> u32 {
    VERSIONS.iter().find(|(v, _, _)| *v == view).map_or(1, |&(_, n, _)| n)
}

/// The statement that creates view `view` (a bare name) into `table` (quoted), both in `db`
/// (quoted).
pub fn create(db: &str, view: &str, table: &str, select: &str) -> String {
    format!("{PREFIX}{db}.{} TO {db}.{table} AS {select}", quote_ident(view))
}

/// The view a statement of [`create`] in `db` (quoted) creates, or `None` for any other
/// statement. View names are ours, without back quotes.
pub fn name_in<'a>(db: &str, statement: &'a str) -> Option<&'a str> {
    let rest = statement.strip_prefix(PREFIX)?.strip_prefix(db)?.strip_prefix(".`")?;
    Some(&rest[..rest.find("` TO ")?])
}

/// The table of versions.
pub fn record_table(db: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {db}.{} (view String, version UInt32, at UInt64) \
         ENGINE = ReplacingMergeTree(at) ORDER BY view",
        quote_ident(RECORD)
    )
}

/// Records that `view` was created at `version` (`at`: ns since the epoch; the latest wins).
pub fn record(db: &str, view: &str, version: u32, at: u64) -> String {
    format!(
        "INSERT INTO {db}.{} (view, version, at) VALUES ({}, {version}, {at})",
        quote_ident(RECORD),
        quote_str(view)
    )
}

/// `statements` followed by the table of versions and a record (`at` 0) for each view they
/// create: for a schema made by hand, so that shippers take those views as current.
pub fn by_hand(db: &str, mut statements: Vec<String>) -> Vec<String> {
    let records: Vec<String> =
        statements.iter().filter_map(|s| name_in(db, s)).map(|v| record(db, v, version(v), 0)).collect();
    if !records.is_empty() {
        statements.push(record_table(db));
        statements.extend(records);
    }
    statements
}

/// Each view's last recorded version, as `view<TAB>version` lines (`db` quoted).
pub fn recorded_sql(db: &str) -> String {
    format!("SELECT view, argMax(version, at) FROM {db}.{} GROUP BY view FORMAT TabSeparated", quote_ident(RECORD))
}

/// The views the server has in `database` (a bare name), a name a line.
pub fn existing_sql(database: &str) -> String {
    format!(
        "SELECT name FROM system.tables WHERE database = {} AND engine = 'MaterializedView' FORMAT TabSeparated",
        quote_str(database)
    )
}

/// What a shipper does with one view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Keep,
    Create,
    Replace,
}

/// `exists`: the server has the view; `recorded`: the version it last recorded for it.
pub fn plan(exists: bool, recorded: Option<u32>, ours: u32) -> Plan {
    match (exists, recorded) {
        (true, Some(r)) if r >= ours => Plan::Keep,
        (true, _) => Plan::Replace,
        // A view missing, whatever the record says (dropped by hand, or a shipper stopped
        // between its record and its create): ours is better than none.
        (false, _) => Plan::Create,
    }
}

/// Runs `statements` (tables, then views as [`plan`]s them) on `client`, in database `database`
/// (bare name). Returns the views replaced.
pub fn ensure(client: &Client, database: &str, statements: Vec<String>) -> Result<Vec<String>, ShipError> {
    let db = quote_ident(database);
    let (views, tables): (Vec<String>, Vec<String>) = statements.into_iter().partition(|s| name_in(&db, s).is_some());
    for statement in tables {
        client.query(&statement)?;
    }
    client.query(&record_table(&db))?;
    let recorded: HashMap<String, u32> = client
        .query(&recorded_sql(&db))?
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter_map(|(v, n)| Some((v.to_string(), n.trim().parse().ok()?)))
        .collect();
    let existing: HashSet<String> = client.query(&existing_sql(database))?.lines().map(str::to_string).collect();
    let mut replaced = Vec::new();
    for statement in views {
        let view = name_in(&db, &statement).unwrap_or_default().to_string();
        let ours = version(&view);
        let recorded = recorded.get(&view).copied();
        match plan(existing.contains(&view), recorded, ours) {
            Plan::Keep => continue,
            Plan::Create => {}
            // Dropped before the record: a shipper stopping between the two leaves no view,
            // which the next start creates.
            Plan::Replace => {
                tracing::info!(view, recorded, version = ours, "replacing a ClickHouse view whose definition changed");
                client.query(&format!("DROP TABLE IF EXISTS {db}.{}", quote_ident(&view)))?;
                replaced.push(view.clone());
            }
        }
        client.query(&record(&db, &view, ours, now_ns()))?;
        client.query(&statement)?;
    }
    Ok(replaced)
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ship::clickhouse::{schema, track_rollups};

    fn views_of(statements: &[String]) -> Vec<(String, String)> {
        statements.iter().filter_map(|s| Some((name_in("`p`", s)?.to_string(), s.clone()))).collect()
    }

    #[test]
    fn every_views_text_is_pinned_to_its_version() {
        let l = schema::Layout { database: "p", cluster: None, ttl_secs: None, codecs: false };
        let mut all = schema::statements_with(&l, schema::RollupKeep::DEFAULT, false);
        all.extend(track_rollups::definitions(&l, 86_400));
        let views = views_of(&all);
        assert_eq!(
            views.len(),
            VERSIONS.len(),
            "every view has a version: {:?}",
            views.iter().map(|v| &v.0).collect::<Vec<_>>()
        );
        let mut wrong = Vec::new();
        for (view, statement) in &views {
            let pinned = VERSIONS.iter().find(|(v, _, _)| v == view);
            let hash = xxhash_rust::xxh3::xxh3_64(statement.as_bytes());
            match pinned {
                Some(&(_, _, h)) if h == hash => {}
                _ => wrong.push(format!("(\"{view}\", {}, {hash:#x})", version(view))),
            }
        }
        assert!(
            wrong.is_empty(),
            "a view's text changed: raise its version in VERSIONS (servers replace it only then) and pin the new text:\n{}",
            wrong.join(",\n")
        );
    }

    #[test]
    fn names_come_back_from_the_statements_that_create_them() {
        let db = quote_ident("a` TO b");
        let s = create(&db, "cpu_5m_mv", "`cpu_5m`", "SELECT 1 AS ` TO `");
        assert_eq!(name_in(&db, &s), Some("cpu_5m_mv"));
        assert_eq!(name_in(&db, "CREATE TABLE IF NOT EXISTS `p`.`samples` (node String)"), None);
        let s = create("`p`", "cpu_5m_mv", "`cpu_5m`", "SELECT 1");
        let hand = by_hand("`p`", vec!["CREATE DATABASE IF NOT EXISTS `p`".into(), s]);
        assert_eq!(hand.len(), 4);
        assert!(hand[2].starts_with("CREATE TABLE IF NOT EXISTS `p`.`schema_views`"), "{}", hand[2]);
        assert_eq!(hand[3], "INSERT INTO `p`.`schema_views` (view, version, at) VALUES ('cpu_5m_mv', 2, 0)");
        assert_eq!(by_hand("`p`", vec!["SELECT 1".into()]).len(), 1, "no views, no record");
    }

    #[test]
    fn newer_or_unrecorded_views_are_replaced_and_newer_ones_never_reverted() {
        assert_eq!(plan(false, None, 2), Plan::Create);
        assert_eq!(plan(false, Some(5), 2), Plan::Create, "missing: ours beats none");
        assert_eq!(plan(true, None, 1), Plan::Replace, "made before the record: text unknown");
        assert_eq!(plan(true, Some(1), 2), Plan::Replace);
        assert_eq!(plan(true, Some(2), 2), Plan::Keep);
        assert_eq!(plan(true, Some(3), 2), Plan::Keep, "an older daemon leaves a newer view");
    }
}
