//! The `[clickhouse]` table of the config file, read here with the rest of the file; the
//! shipper (`ship::clickhouse::Config::resolve`) checks and completes it.

use serde::Deserialize;

/// The `[clickhouse]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseFile {
    pub url: Option<String>,
    pub database: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub batch_rows: Option<usize>,
    pub cluster: Option<String>,
}
