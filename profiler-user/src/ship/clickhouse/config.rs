//! The `[clickhouse]` table of the config file (read with the rest of the file by `config`) and
//! `--clickhouse URL`, checked and completed into the shipper's settings.

use std::path::PathBuf;

use serde::Deserialize;

use super::{error::ShipError, pace, schema::RollupKeep};

/// The `[clickhouse]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub url: Option<String>,
    pub database: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub batch_rows: Option<usize>,
    pub cluster: Option<String>,
    /// Days `samples_1m` keeps (default 30).
    pub rollup_1m_days: Option<u64>,
    /// Days `samples_1h` keeps (default 365).
    pub rollup_1h_days: Option<u64>,
    /// The most rows sent per second, however far behind the node is (`pace`).
    pub max_rows_per_sec: Option<u64>,
}

/// Rows one insert may carry. At most half of ClickHouse's `max_insert_block_size` (1 M rows),
/// with room for one read step beyond it, so that an insert is one block, hence one part per
/// partition, and lands whole or not at all.
pub const BATCH_ROWS: std::ops::RangeInclusive<usize> = 1_000..=500_000;

/// Days a rollup table may keep rows: a day to ten years.
pub const ROLLUP_DAYS: std::ops::RangeInclusive<u64> = 1..=3650;

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub database: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub batch_rows: usize,
    pub cluster: Option<String>,
    pub node: String,
    pub data_dir: PathBuf,
    /// The store's age limit: rows get the same TTL where the server supports it.
    pub max_age_secs: u64,
    /// How long the rollup tables keep rows (TTL, or partitions dropped on older servers).
    pub rollups: RollupKeep,
    /// The most rows sent per second, catching up included (`pace`).
    pub max_rows_per_sec: u64,
}

impl Config {
    /// The settings from `--clickhouse URL` (which wins) and the file's table; `None` when
    /// neither names a URL.
    pub fn resolve(
        flag_url: Option<String>,
        file: Option<&FileConfig>,
        node: &str,
        data_dir: PathBuf,
        max_age_secs: u64,
    ) -> Result<Option<Self>, ShipError> {
        let file = file.cloned().unwrap_or_default();
        let Some(url) = flag_url.or(file.url) else { return Ok(None) };
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(ShipError::Url(url));
        }
        let batch_rows = file.batch_rows.unwrap_or(50_000);
        if !BATCH_ROWS.contains(&batch_rows) {
            return Err(ShipError::Range {
                key: "clickhouse.batch_rows",
                value: batch_rows.to_string(),
                allowed: "1000 to 500000 rows",
            });
        }
        let days = |key: &'static str, value: Option<u64>, default: u64| match value.unwrap_or(default / 86_400) {
            d if ROLLUP_DAYS.contains(&d) => Ok(d),
            d => Err(ShipError::Range { key, value: d.to_string(), allowed: "1 to 3650 days" }),
        };
        let minutes = days("clickhouse.rollup_1m_days", file.rollup_1m_days, RollupKeep::DEFAULT.minutes_secs)?;
        let hours = days("clickhouse.rollup_1h_days", file.rollup_1h_days, RollupKeep::DEFAULT.hours_secs)?;
        if hours < minutes {
            return Err(ShipError::Range {
                key: "clickhouse.rollup_1h_days",
                value: hours.to_string(),
                allowed: "at least rollup_1m_days: hours are the coarser, longer kept rollup",
            });
        }
        let max_rows_per_sec = file.max_rows_per_sec.unwrap_or(pace::DEFAULT_ROWS_PER_SEC);
        if !pace::ROWS_PER_SEC.contains(&max_rows_per_sec) {
            return Err(ShipError::Range {
                key: "clickhouse.max_rows_per_sec",
                value: max_rows_per_sec.to_string(),
                allowed: "1000 to 100000000 rows a second",
            });
        }
        Ok(Some(Self {
            url,
            database: file.database.unwrap_or_else(|| "profiler".into()),
            user: file.user,
            password: file.password,
            batch_rows,
            cluster: file.cluster,
            node: node.to_string(),
            data_dir,
            max_age_secs,
            rollups: RollupKeep { minutes_secs: minutes * 86_400, hours_secs: hours * 86_400 },
            max_rows_per_sec,
        }))
    }

    /// What a cursor is valid for. Credentials in the URL (`http://user:pass@host`) are left
    /// out: `profiler status` shows the target.
    pub(super) fn target(&self) -> String {
        let rest = &self.url["http://".len()..];
        let host = rest.split_once('@').filter(|(auth, _)| !auth.contains('/')).map_or(rest, |(_, host)| host);
        format!("http://{host} {}", self.database)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wins_and_limits_are_checked() {
        let file = FileConfig { url: Some("http://a:8123".into()), batch_rows: Some(2000), ..Default::default() };
        let c = Config::resolve(Some("http://b:8123".into()), Some(&file), "n", "/d".into(), 60).unwrap().unwrap();
        assert_eq!((c.url.as_str(), c.database.as_str(), c.batch_rows), ("http://b:8123", "profiler", 2000));
        assert!(Config::resolve(None, None, "n", "/d".into(), 60).unwrap().is_none());
        let big = FileConfig { batch_rows: Some(2_000_000), ..file.clone() };
        let e = Config::resolve(None, Some(&big), "n", "/d".into(), 60).unwrap_err().to_string();
        assert!(e.contains("clickhouse.batch_rows"), "{e}");
        let secret = Config::resolve(Some("http://u:pw@h:1/".into()), None, "n", "/d".into(), 60).unwrap().unwrap();
        assert_eq!(secret.target(), "http://h:1/ profiler");
        let e = Config::resolve(Some("https://x".into()), None, "n", "/d".into(), 60).unwrap_err().to_string();
        assert!(e.contains("TLS proxy"), "{e}");
        assert_eq!(c.max_rows_per_sec, 200_000, "the default catch-up bound");
        let slow = FileConfig { max_rows_per_sec: Some(500), ..file.clone() };
        let e = Config::resolve(None, Some(&slow), "n", "/d".into(), 60).unwrap_err().to_string();
        assert!(e.contains("clickhouse.max_rows_per_sec = 500 is out of range: use 1000 to"), "{e}");
        let file: FileConfig = toml::from_str("max_rows_per_sec = 5000\n").unwrap();
        assert_eq!(file.max_rows_per_sec, Some(5000));
    }

    #[test]
    fn rollups_keep_30_days_of_minutes_and_a_year_of_hours_unless_told() {
        let url = Some("http://a:8123".to_string());
        let resolve = |minutes, hours| {
            let file = FileConfig { rollup_1m_days: minutes, rollup_1h_days: hours, ..Default::default() };
            Config::resolve(url.clone(), Some(&file), "n", "/d".into(), 60).map(|c| c.unwrap().rollups)
        };
        let keep = resolve(None, None).unwrap();
        assert_eq!(keep, RollupKeep { minutes_secs: 30 * 86_400, hours_secs: 365 * 86_400 });
        assert_eq!(
            resolve(Some(2), Some(90)).unwrap(),
            RollupKeep { minutes_secs: 2 * 86_400, hours_secs: 90 * 86_400 }
        );
        let e = resolve(Some(0), None).unwrap_err().to_string();
        assert!(e.contains("clickhouse.rollup_1m_days = 0 is out of range: use 1 to 3650 days"), "{e}");
        let e = resolve(None, Some(5000)).unwrap_err().to_string();
        assert!(e.contains("clickhouse.rollup_1h_days = 5000"), "{e}");
        let e = resolve(Some(60), Some(40)).unwrap_err().to_string();
        assert!(e.contains("rollup_1h_days = 40 is out of range: use at least rollup_1m_days"), "{e}");
        let file: FileConfig = toml::from_str("rollup_1m_days = 7\nrollup_1h_days = 730\n").unwrap();
        assert_eq!((file.rollup_1m_days, file.rollup_1h_days), (Some(7), Some(730)));
    }
}
