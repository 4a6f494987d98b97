//! The daemon's settings: a TOML file (`profiler run --config FILE`), overridden by flags,
//! over built-in defaults that suit an always-on node.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{store::retention::Retention, timespec::parse_duration_ns};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("config file {0}: {1}")]
    Parse(PathBuf, String),
    #[error("{what} '{value}' is not a size: use a number with a unit, such as 512MiB, 1GiB or 2GB")]
    Size { what: &'static str, value: String },
    #[error("{what} '{value}' is not a duration: use a number with a unit, such as 30m, 24h or 7d")]
    Duration { what: &'static str, value: String },
}

/// The `[store]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    pub max_size: Option<String>,
    pub max_age: Option<String>,
    /// A duration, or "off".
    pub rollup_after: Option<String>,
    pub dict_cap: Option<usize>,
}

/// The config file. Every key is optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub data_dir: Option<PathBuf>,
    pub frequency: Option<u64>,
    pub flush_ms: Option<u64>,
    pub ring_buffer_kib: Option<u32>,
    pub report_secs: Option<u64>,
    /// `IP:PORT` of the UI and API, or "off".
    pub listen: Option<String>,
    #[serde(default)]
    pub store: StoreFile,
    /// Detector thresholds (every key optional; see `detect::Thresholds`).
    #[serde(default)]
    pub detect: crate::detect::Thresholds,
    #[serde(default)]
    pub events: EventsFile,
}

/// The `[events]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsFile {
    /// Regular expressions; kernel log lines that match one become events. Replaces the
    /// defaults when given.
    pub patterns: Option<Vec<String>>,
}

impl ConfigFile {
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_path_buf(), e.message().to_string()))
    }
}

/// `1GiB`, `512MiB`, `2GB`, `100k`, `4096`: binary units for `Ki/Mi/Gi/Ti` and bare `K/M/G/T`,
/// decimal for `KB/MB/GB/TB`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let value: f64 = s[..split].parse().ok()?;
    let scale: f64 = match s[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && (1.0..1.8e19).contains(&bytes)).then_some(bytes as u64)
}

pub fn size(what: &'static str, value: &str) -> Result<u64, ConfigError> {
    parse_size(value).ok_or_else(|| ConfigError::Size { what, value: value.to_string() })
}

pub fn duration(what: &'static str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration_ns(value)
        .filter(|&ns| ns > 0)
        .map(Duration::from_nanos)
        .ok_or_else(|| ConfigError::Duration { what, value: value.to_string() })
}

/// `off` (no tiering) or a duration.
pub fn rollup_after(value: &str) -> Result<Option<Duration>, ConfigError> {
    if value.eq_ignore_ascii_case("off") { Ok(None) } else { duration("rollup_after", value).map(Some) }
}

/// The settings SIGHUP reloads without a restart: detector thresholds and store bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Reloadable {
    pub thresholds: crate::detect::Thresholds,
    pub retention: Retention,
    /// `None`: no tiering.
    pub rollup_after: Option<Duration>,
}

/// Store flags given on the command line; they win over the file at every (re)load.
#[derive(Debug, Clone, Default)]
pub struct StoreFlags {
    pub max_size: Option<String>,
    pub max_age: Option<String>,
    pub rollup_after: Option<String>,
}

impl Reloadable {
    pub fn from(file: &ConfigFile, flags: &StoreFlags) -> Result<Self, ConfigError> {
        let pick = |flag: &Option<String>, file: &Option<String>, default: &str| {
            flag.clone().or_else(|| file.clone()).unwrap_or_else(|| default.to_string())
        };
        Ok(Self {
            thresholds: file.detect.clone(),
            retention: retention(
                &pick(&flags.max_size, &file.store.max_size, "1GiB"),
                &pick(&flags.max_age, &file.store.max_age, "7d"),
            )?,
            rollup_after: rollup_after(&pick(&flags.rollup_after, &file.store.rollup_after, "24h"))?,
        })
    }
}

/// Store bounds from their textual forms.
pub fn retention(max_size: &str, max_age: &str) -> Result<Retention, ConfigError> {
    Ok(Retention {
        max_bytes: size("max_size", max_size)?,
        max_age_ns: duration("max_age", max_age)?.as_nanos() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1.5k"), Some(1536));
        for bad in ["", "GB", "1 parsec", "-1G", "0"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn flags_win_over_the_file_at_every_reload() {
        let file: ConfigFile =
            toml::from_str("[store]\nmax_size = \"64MiB\"\nmax_age = \"1d\"\n[detect]\nhot_share = 0.7\n").unwrap();
        let flags = StoreFlags { max_size: Some("1GiB".into()), ..Default::default() };
        let r = Reloadable::from(&file, &flags).unwrap();
        assert_eq!(r.retention.max_bytes, 1 << 30);
        assert_eq!(r.retention.max_age_ns, 86_400_000_000_000);
        assert_eq!(r.thresholds.hot_share, 0.7);
        assert_eq!(r.rollup_after, Some(Duration::from_secs(86_400)));
        let bad: ConfigFile = toml::from_str("[store]\nmax_age = \"forever\"\n").unwrap();
        assert!(Reloadable::from(&bad, &StoreFlags::default()).is_err());
    }

    #[test]
    fn config_file_and_errors() {
        let c: ConfigFile =
            toml::from_str("frequency = 49\n[store]\nmax_size = \"64MiB\"\nrollup_after = \"off\"\n").unwrap();
        assert_eq!(c.frequency, Some(49));
        assert_eq!(rollup_after(c.store.rollup_after.as_deref().unwrap()).unwrap(), None);
        assert!(toml::from_str::<ConfigFile>("frequncy = 49").is_err(), "typos are refused");
        let r = retention("64MiB", "7d").unwrap();
        assert_eq!(r.max_bytes, 64 << 20);
        assert_eq!(r.max_age_ns, 7 * 86_400_000_000_000);
        assert!(retention("big", "7d").unwrap_err().to_string().contains("'big' is not a size"));
        assert!(duration("max_age", "soon").unwrap_err().to_string().contains("not a duration"));
    }
}
