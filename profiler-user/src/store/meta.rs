//! `DATA_DIR/meta.json`: facts about the machine and the daemon that queries need (which CPUs
//! exist, the sampling frequency), written by the daemon when it starts.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::StoreError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub format_version: u32,
    pub hostname: String,
    /// The node's name in exports and fleet stores (`--node`); the host name by default.
    #[serde(default)]
    pub node: String,
    /// Number of possible CPUs: valid CPU ids are `0..cpus`.
    pub cpus: u32,
    pub frequency_hz: u64,
    pub started_ns: u64,
}

impl Meta {
    const FILE: &'static str = "meta.json";

    /// Written to a temporary file and renamed, so a reader never sees half of it.
    pub fn write(&self, data_dir: &Path) -> Result<(), StoreError> {
        let json = serde_json::to_vec_pretty(self).expect("meta serialises");
        super::files::write_private(&data_dir.join(Self::FILE), &json)
    }

    /// Number of CPUs and sampling frequency of the profiled machine (1 CPU at 99 Hz when no
    /// daemon has said).
    pub fn cpus_and_frequency(data_dir: &Path) -> (u32, u64) {
        Self::read(data_dir).map_or((1, 99), |m| (m.cpus, m.frequency_hz))
    }

    /// `None` when no daemon has written one (or it is unreadable): callers then skip the
    /// checks it enables.
    pub fn read(data_dir: &Path) -> Option<Self> {
        let bytes = std::fs::read(data_dir.join(Self::FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}
