//! Views whose definition changed reach a server that already has them (`views`): a real
//! shipper replaces a view made before the record of versions (its text unknown) or recorded
//! at an older version, and leaves one a newer daemon recorded; on ClickHouse 18.16, the
//! rollups' sums say which formula ran. The record's statements also run on today's
//! ClickHouse (chdb).

#[path = "shared/ch_store.rs"]
mod ch_store;

use ch_store::{ship_with, synthetic_store};
use integration_tests::clickhouse::{self, ClickHouse, wait_shipped};
use profiler::ship::clickhouse::{
    FileConfig,
    schema::{self, Layout, RollupKeep},
    track_rollups, views,
};

/// What the shipper makes on 18.16 (its layout there: no TTL, no codecs).
fn layout() -> Layout<'static> {
    Layout { database: "profiler", cluster: None, ttl_secs: None, codecs: false }
}

#[test]
fn a_changed_view_is_replaced_once_and_a_newer_daemons_view_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(ch) = ClickHouse::start(&tmp.path().join("clickhouse")) else { return };
    let answer = |sql: &str| ch.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    // A server from before the record: every view made without one, `samples_1m_mv` with an old
    // formula (each sample counted twice). `samples_fleet_1m_mv` was made by a newer daemon
    // (recorded at version 1000) with a formula this daemon does not know (three times).
    let mut made = schema::statements_with(&layout(), RollupKeep::DEFAULT, false);
    made.extend(track_rollups::definitions(&layout(), 86_400));
    for statement in &mut made {
        match views::name_in("`profiler`", statement) {
            Some("samples_1m_mv") => {
                *statement = statement.replace("sum(s.count) AS count", "sum(s.count) * 2 AS count")
            }
            Some("samples_fleet_1m_mv") => {
                *statement = statement.replace("sum(s.count) AS count", "sum(s.count) * 3 AS count")
            }
            _ => {}
        }
    }
    assert_eq!(made.iter().filter(|s| s.contains("* 2 AS count") || s.contains("* 3 AS count")).count(), 2);
    made.push(views::record_table("`profiler`"));
    made.push(views::record("`profiler`", "samples_fleet_1m_mv", 1000, 1));
    for statement in &made {
        answer(statement);
    }

    let data = tmp.path().join("a");
    let (_, end) = synthetic_store(&data, 3, 90);
    let file = FileConfig { batch_rows: Some(1000), ..Default::default() };
    ship_with(&ch.url(), "views-a", &data, &file, 86_400, || wait_shipped(&data, end));
    let raw = 90 * 50 * 3;
    assert_eq!(ch.number("SELECT sum(count) FROM profiler.samples"), raw);
    assert_eq!(
        ch.number("SELECT sum(count) FROM profiler.samples_1m"),
        raw,
        "the old formula replaced: each sample once in the minutes"
    );
    assert_eq!(
        ch.number("SELECT sum(count) FROM profiler.samples_fleet_1m"),
        3 * raw,
        "the newer daemon's view kept (its formula, three times)"
    );
    let recorded = answer(&views::recorded_sql("`profiler`"));
    let version_of = |view: &str| -> u32 {
        let line =
            recorded.lines().find(|l| l.starts_with(&format!("{view}\t"))).unwrap_or_else(|| panic!("{recorded}"));
        line.split('\t').nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(version_of("samples_1m_mv"), views::version("samples_1m_mv"));
    assert_eq!(version_of("cpu_5m_mv"), views::version("cpu_5m_mv"));
    assert_eq!(version_of("samples_fleet_1m_mv"), 1000);

    // Another node's shipper starts: every view is current, none is replaced again.
    let records = ch.number("SELECT count() FROM profiler.schema_views");
    let later = tmp.path().join("b");
    let (_, end) = synthetic_store(&later, 2, 20);
    ship_with(&ch.url(), "views-b", &later, &file, 86_400, || wait_shipped(&later, end));
    assert_eq!(ch.number("SELECT count() FROM profiler.schema_views"), records, "no view replaced twice");
    assert_eq!(ch.number("SELECT sum(count) FROM profiler.samples_1m"), raw + 20 * 50 * 2);
    eprintln!("18.16: {records} view records; the changed view replaced once, the newer one kept");
}

/// The record's statements, and a schema made by hand, on today's ClickHouse.
#[test]
fn the_record_of_views_runs_on_current_clickhouse() {
    let l = Layout { database: "p", cluster: None, ttl_secs: Some(604_800), codecs: true };
    let mut statements = schema::statements(&l);
    statements.extend(track_rollups::statements(&l, 86_400));
    let asked = statements.len();
    statements.extend([
        views::recorded_sql("`p`"),
        views::existing_sql("p"),
        views::record("`p`", "cpu_5m_mv", 7, 5),
        "DROP TABLE IF EXISTS `p`.`cpu_5m_mv`".to_string(),
        views::recorded_sql("`p`"),
        views::existing_sql("p"),
    ]);
    let Some(answers) = clickhouse::chdb(&statements) else { return };
    let (recorded, existing) = (&answers[asked], &answers[asked + 1]);
    let views_made = statements[..asked].iter().filter(|s| views::name_in("`p`", s).is_some()).count();
    assert_eq!(recorded.lines().count(), views_made, "chdb: {recorded}");
    let at_own_version = |l: &str| l.split_once('\t').is_some_and(|(v, n)| n == views::version(v).to_string());
    assert!(recorded.lines().all(at_own_version), "made by hand, each at its version: {recorded}");
    assert_eq!(existing.lines().count(), views_made, "chdb: {existing}");
    let (recorded, existing) = (&answers[asked + 4], &answers[asked + 5]);
    assert!(recorded.lines().any(|l| l == "cpu_5m_mv\t7"), "the latest record wins: {recorded}");
    assert_eq!(existing.lines().count(), views_made - 1);
    assert!(!existing.lines().any(|l| l == "cpu_5m_mv"), "dropped: {existing}");
}

/// What each rollup view on `samples` costs a current engine per sample (BENCHMARKS.md,
/// "Ingest on a current engine"): the schema a server from 25.1 gets, measured by
/// `xtask/src/bench/clickhouse_views.py` on chdb. A benchmark, not a test: `--ignored`.
#[test]
#[ignore]
fn views_ingest_benchmark() {
    let l = Layout { database: "p", cluster: None, ttl_secs: None, codecs: true };
    let sql: String =
        schema::statements_with(&l, RollupKeep::DEFAULT, true).iter().map(|s| s.replace('\n', " ") + "\n").collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("schema.sql");
    std::fs::write(&file, sql).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../xtask/src/bench/clickhouse_views.py");
    let status = std::process::Command::new("python3").arg(script).arg(&file).status().expect("python3 runs");
    assert!(status.success(), "{script} failed");
}
