//! Which GPUs this node has, or why it shows none: `DATA_DIR/gpus.json`, written by the daemon
//! when the poller starts, read by `profiler status` and by the kernel log reader (a `NVRM: Xid`
//! line names a PCI address, not a GPU index).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::identity::Identity;

const FILE: &str = "gpus.json";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub model: String,
    pub uuid: String,
    /// As NVML writes it (`00000000:3B:00.0`).
    pub bus_id: String,
    /// CPUs close to the GPU (its NUMA node's; sysfs `local_cpulist`, else NVML's affinity).
    pub local_cpus: Vec<u32>,
    /// CPUs that take its interrupts now (`collect::irqs`).
    pub irq_cpus: Vec<u32>,
    /// The processes holding it as of the poller's last change of them, with pod and container.
    #[serde(default)]
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// The library asked for.
    pub library: String,
    /// Why there are no GPU tracks (no library, no GPU, GPU tracks off); `None` when there are.
    pub unavailable: Option<String>,
    pub driver: Option<String>,
    pub gpus: Vec<GpuInfo>,
    /// Calls the library lacks or the GPUs do not support: their tracks are missing.
    #[serde(default)]
    pub unsupported: Vec<String>,
    /// How utilisation is read (NVML's own samples, or polled where the driver has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot write {0}: {1}")]
    Write(std::path::PathBuf, String),
}

/// One process holding a GPU, as `profiler status` lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// `/proc/PID/comm`; empty once it exited.
    pub comm: String,
    /// Its pod and container (or systemd unit); empty for a host process nothing is known of.
    #[serde(default, skip_serializing_if = "is_default")]
    pub identity: Identity,
}

fn is_default(i: &Identity) -> bool {
    *i == Identity::default()
}

impl Process {
    /// `812 python3 (pod ml/trainer-7 container main)`.
    pub fn describe(&self) -> String {
        let who = self.identity.describe();
        let comm = if self.comm.is_empty() { "(exited)" } else { &self.comm };
        if who.is_empty() { format!("{} {comm}", self.pid) } else { format!("{} {comm} ({who})", self.pid) }
    }
}

impl Inventory {
    pub fn write(&self, data_dir: &Path) -> Result<(), InventoryError> {
        let json = serde_json::to_vec_pretty(self).expect("inventory serialises");
        let path = data_dir.join(FILE);
        crate::store::files::write_private(&path, &json).map_err(|e| InventoryError::Write(path, e.to_string()))
    }

    /// `None` when no daemon wrote one (an older daemon, or none ran here).
    pub fn read(data_dir: &Path) -> Option<Self> {
        let bytes = std::fs::read(data_dir.join(FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The GPU at a PCI address in any of its spellings (`0000:3b:00`, `00000000:3B:00.0`).
    pub fn by_bus(&self, bus: &str) -> Option<&GpuInfo> {
        let want = short_bus_id(bus)?;
        self.gpus.iter().find(|g| short_bus_id(&g.bus_id).as_deref() == Some(want.as_str()))
    }

    /// Lines for `profiler status`.
    pub fn describe(&self) -> Vec<String> {
        if let Some(why) = &self.unavailable {
            return vec![format!("none: {why}")];
        }
        let driver = self.driver.as_deref().unwrap_or("unknown");
        let mut lines = Vec::new();
        for g in &self.gpus {
            lines.push(format!(
                "{} {} {} bus {} driver {driver}, local CPUs {}, interrupts on CPUs {}",
                g.index,
                g.model,
                g.uuid,
                g.bus_id,
                cpu_list(&g.local_cpus),
                cpu_list(&g.irq_cpus)
            ));
            if !g.processes.is_empty() {
                let procs: Vec<String> = g.processes.iter().map(|p| p.describe()).collect();
                lines.push(format!("{} held by {}", g.index, procs.join(", ")));
            }
        }
        if !self.unsupported.is_empty() {
            lines.push(format!("not supported here (no track): {}", self.unsupported.join(", ")));
        }
        if let Some(how) = &self.utilisation {
            lines.push(format!("utilisation from {how}"));
        }
        lines
    }
}

/// `0-5,14,15`; `unknown` for none.
pub fn cpu_list(cpus: &[u32]) -> String {
    if cpus.is_empty() {
        return "unknown".into();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

/// A PCI address as `dddd:bb:dd` in lower case (domain, bus, device; the function dropped):
/// NVML writes `00000000:3B:00.0`, the driver's log `PCI:0000:3b:00`, sysfs `0000:3b:00.0`.
pub fn short_bus_id(s: &str) -> Option<String> {
    let s = s.trim().trim_start_matches("PCI:").to_ascii_lowercase();
    let s = s.split('.').next()?;
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, dev) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0", *b, *v),
        _ => return None,
    };
    let hex = |x: &str| u32::from_str_radix(x, 16).ok();
    Some(format!("{:04x}:{:02x}:{:02x}", hex(domain)?, hex(bus)?, hex(dev)?))
}

/// The CPUs sysfs says are local to a PCI device, if it says.
pub fn local_cpus(bus_id: &str) -> Option<Vec<u32>> {
    let short = short_bus_id(bus_id)?;
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{short}.0/local_cpulist")).ok()?;
    crate::collect::irqs::parse_cpu_list(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_every_spelling_meet() {
        assert_eq!(short_bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00"));
        assert_eq!(short_bus_id("PCI:0000:3b:00").as_deref(), Some("0000:3b:00"));
        assert_eq!(short_bus_id("0000:3b:00.0").as_deref(), Some("0000:3b:00"));
        assert_eq!(short_bus_id("zz:yy"), None);
        assert_eq!(short_bus_id(""), None);
        let inv = Inventory {
            gpus: vec![GpuInfo { index: 3, bus_id: "00000000:3B:00.0".into(), ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(inv.by_bus("PCI:0000:3b:00").map(|g| g.index), Some(3));
        assert!(inv.by_bus("PCI:0000:3c:00").is_none());
    }

    #[test]
    fn cpu_lists_fold_runs() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 4, 5, 14, 15]), "0-5,14-15");
        assert_eq!(cpu_list(&[7]), "7");
        assert_eq!(cpu_list(&[]), "unknown");
    }
}
