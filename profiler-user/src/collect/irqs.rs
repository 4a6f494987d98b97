//! Which CPUs serve the interrupts of the NICs and GPUs (issue 16, part 1).
//!
//! An ENA reset began on the CPU that took a NIC queue's interrupts while `kubelet` held it at
//! 100 %: a saturated or hot CPU matters most when it is one of those. The placement comes from
//! sysfs and procfs, no `/proc/interrupts` (its size grows with CPUs x IRQs): a device's MSI
//! vectors are listed in `msi_irqs` of its PCI device, an IRQ's name is the directory
//! `/proc/irq/N/` holds for its handler, and the CPU it is delivered to is its
//! `smp_affinity_list` when that is one CPU, else `effective_affinity_list`.
//! irqbalance moves IRQs every 10 s or so: the daemon reads this again on that scale.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// What a device is, for the sentence a finding says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Nic,
    Gpu,
}

/// One interrupt line of a NIC or GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Irq {
    pub number: u32,
    /// The handler's name (`ena-Tx-Rx-3`, `virtio2-input.0`, `nvidia`), empty if unknown.
    pub name: String,
    /// The interface (`eth0`) or the GPU's PCI address.
    pub device: String,
    pub kind: DeviceKind,
    /// CPUs it is delivered to.
    pub cpus: Vec<u32>,
}

/// The NIC and GPU interrupts of this machine and where they go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub irqs: Vec<Irq>,
}

impl Placement {
    /// Reads the placement of this machine (empty where sysfs or procfs say nothing).
    pub fn read() -> Self {
        Self::read_from(Path::new("/sys"), Path::new("/proc"))
    }

    pub fn read_from(sys: &Path, proc: &Path) -> Self {
        let mut irqs = Vec::new();
        for (device, kind, pci) in devices(sys) {
            for number in msi_irqs(&pci) {
                let dir = proc.join("irq").join(number.to_string());
                let list = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|s| parse_cpu_list(&s));
                // Pinned to one CPU (irqbalance, an admin): there, from its next interrupt on;
                // else where the kernel delivers it now.
                let cpus = list("smp_affinity_list")
                    .filter(|c| c.len() == 1)
                    .or_else(|| list("effective_affinity_list"))
                    .or_else(|| list("smp_affinity_list"))
                    .unwrap_or_default();
                irqs.push(Irq { number, name: handler_name(&dir), device: device.clone(), kind, cpus });
            }
        }
        irqs.sort_by_key(|i| i.number);
        irqs.dedup_by_key(|i| i.number);
        Self { irqs }
    }

    /// The device interrupts delivered to `cpu`.
    pub fn serving(&self, cpu: u32) -> Vec<&Irq> {
        self.irqs.iter().filter(|i| i.cpus.contains(&cpu)).collect()
    }

    /// "eth0's interrupts (virtio2-input.0, virtio2-output.0)" for what `cpu` serves, per device.
    pub fn describe(&self, cpu: u32) -> Option<String> {
        let served = self.serving(cpu);
        if served.is_empty() {
            return None;
        }
        let mut devices: Vec<(&str, Vec<&str>)> = Vec::new();
        for irq in served {
            let name = if irq.name.is_empty() { "?" } else { irq.name.as_str() };
            match devices.iter_mut().find(|(d, _)| *d == irq.device) {
                Some((_, names)) => names.push(name),
                None => devices.push((&irq.device, vec![name])),
            }
        }
        let parts: Vec<String> = devices
            .iter()
            .map(|(device, names)| {
                let shown: Vec<&str> = names.iter().take(4).copied().collect();
                let more = if names.len() > 4 { format!(", {} more", names.len() - 4) } else { String::new() };
                format!("{device}'s interrupts ({}{more})", shown.join(", "))
            })
            .collect();
        Some(crate::untrusted::visible(&parts.join(" and ")).into_owned())
    }
}

impl fmt::Display for Placement {
    /// One line per device: `eth0 (nic): CPU 0 virtio2-input.0, virtio2-output.0; CPU 1 ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut devices: Vec<&str> = Vec::new();
        for irq in &self.irqs {
            if !devices.contains(&irq.device.as_str()) {
                devices.push(&irq.device);
            }
        }
        for device in devices {
            let irqs: Vec<&Irq> = self.irqs.iter().filter(|i| i.device == device).collect();
            let kind = if irqs[0].kind == DeviceKind::Nic { "nic" } else { "gpu" };
            let mut cpus: Vec<u32> = irqs.iter().flat_map(|i| i.cpus.iter().copied()).collect();
            cpus.sort_unstable();
            cpus.dedup();
            let per_cpu: Vec<String> = cpus
                .iter()
                .map(|cpu| {
                    let names: Vec<&str> =
                        irqs.iter().filter(|i| i.cpus.contains(cpu)).map(|i| i.name.as_str()).collect();
                    format!("CPU {cpu} {}", names.join(", "))
                })
                .collect();
            writeln!(
                f,
                "{} ({kind}): {}",
                crate::untrusted::visible(device),
                crate::untrusted::visible(&per_cpu.join("; "))
            )?;
        }
        Ok(())
    }
}

/// NICs (`/sys/class/net/*` with a device) and GPUs (PCI display controllers), with the PCI
/// directory whose `msi_irqs` lists their vectors (a virtio NIC's device is a virtio device
/// whose parent is the PCI function).
fn devices(sys: &Path) -> Vec<(String, DeviceKind, PathBuf)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(sys.join("class/net")) {
        for e in entries.flatten() {
            let Ok(device) = std::fs::canonicalize(e.path().join("device")) else { continue };
            let pci = if device.join("msi_irqs").is_dir() {
                device
            } else {
                device.parent().map(Path::to_path_buf).unwrap_or(device)
            };
            out.push((e.file_name().to_string_lossy().into_owned(), DeviceKind::Nic, pci));
        }
    }
    if let Ok(entries) = std::fs::read_dir(sys.join("bus/pci/devices")) {
        for e in entries.flatten() {
            // PCI class 0x03xxxx: display controllers (NVIDIA GPUs are 0x0302 or 0x0300).
            let class = std::fs::read_to_string(e.path().join("class")).unwrap_or_default();
            if class.trim().starts_with("0x03") {
                out.push((e.file_name().to_string_lossy().into_owned(), DeviceKind::Gpu, e.path()));
            }
        }
    }
    out.sort();
    out
}

fn msi_irqs(pci: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(pci.join("msi_irqs")) else { return Vec::new() };
    let mut v: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    v.sort_unstable();
    v
}

/// The handler's name: the one directory in `/proc/irq/N/` (its files are the affinity ones).
fn handler_name(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else { return String::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.join(",")
}

/// `0-3,8,10-11` → CPUs.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A virtio NIC (device → virtio2 → PCI function with msi_irqs) and a GPU.
    fn machine() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let (sys, proc) = (t.path().join("sys"), t.path().join("proc"));
        let pci = sys.join("devices/pci0000:00/0000:00:03.0");
        for n in [37, 38, 39] {
            write(&pci.join("msi_irqs").join(n.to_string()), "msix");
        }
        std::fs::create_dir_all(pci.join("virtio2")).unwrap();
        std::fs::create_dir_all(sys.join("class/net/eth0")).unwrap();
        std::os::unix::fs::symlink(pci.join("virtio2"), sys.join("class/net/eth0/device")).unwrap();
        let gpu = sys.join("bus/pci/devices/0000:00:1e.0");
        write(&gpu.join("class"), "0x030200\n");
        write(&gpu.join("msi_irqs/90"), "msix");
        for (n, name, cpus) in [
            (37, "virtio2-config", "0"),
            (38, "virtio2-input.0", "1"),
            (39, "virtio2-output.0", "1"),
            (90, "nvidia", "0"),
        ] {
            let dir = proc.join("irq").join(n.to_string());
            std::fs::create_dir_all(dir.join(name)).unwrap();
            write(&dir.join("effective_affinity_list"), &format!("{cpus}\n"));
            write(&dir.join("smp_affinity_list"), "0-1\n");
        }
        t
    }

    #[test]
    fn a_nic_queue_and_a_gpu_are_placed_on_their_cpus() {
        let t = machine();
        let p = Placement::read_from(&t.path().join("sys"), &t.path().join("proc"));
        assert_eq!(p.irqs.len(), 4, "{p:?}");
        assert_eq!(
            p.describe(1).as_deref(),
            Some("eth0's interrupts (virtio2-input.0, virtio2-output.0)"),
            "CPU 1 gets the queue's vectors"
        );
        assert_eq!(
            p.describe(0).as_deref(),
            Some("eth0's interrupts (virtio2-config) and 0000:00:1e.0's interrupts (nvidia)"),
            "in IRQ order"
        );
        assert_eq!(p.describe(2), None);
        let text = p.to_string();
        assert!(text.contains("eth0 (nic): CPU 0 virtio2-config; CPU 1 virtio2-input.0, virtio2-output.0"), "{text}");
        assert!(text.contains("0000:00:1e.0 (gpu): CPU 0 nvidia"), "{text}");
    }

    #[test]
    fn cpu_lists_parse_and_nonsense_does_not() {
        assert_eq!(parse_cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }
}
