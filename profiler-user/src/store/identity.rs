//! How a run of blocks was recorded: the sampling frequency, the CPUs online, the boot and the
//! host. A daemon writes one identity block before its first block in each segment, and again
//! when the online CPUs change; every block after it (until the next identity block) was
//! recorded that way. So a window that spans a restart at another frequency reads each part
//! with its own frequency, and a copied segment still says where and how it was recorded.
//!
//! An identity block is an ordinary block (magic, CRC, three sections) with `FLAG_IDENTITY`
//! set, no samples, a 1 ns span, and the [`Identity`] in its dictionary section. Segments
//! written before format 4 have none: readers fall back to `meta.json`.

use serde::{Deserialize, Serialize};

use super::format::{BlockHeader, FLAG_IDENTITY, FormatError, SampleColumns, Summary, encode_block, pack, unpack};

/// Most CPU ids an online list may name (the kernel's NR_CPUS ceiling is 8192).
const MAX_CPUS: u32 = 8192;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub frequency_hz: u64,
    /// Online CPUs in the kernel's list format (`0-3,5`).
    pub online_cpus: String,
    /// `/proc/sys/kernel/random/boot_id`: tells two boots of one host apart.
    pub boot_id: String,
    /// Host name, and `/etc/machine-id` when there is one (`name/id`).
    pub host: String,
}

impl Identity {
    /// This machine now, sampled at `frequency_hz`.
    pub fn current(frequency_hz: u64) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
        let name = read("/proc/sys/kernel/hostname");
        let machine = read("/etc/machine-id");
        Self {
            frequency_hz,
            online_cpus: read("/sys/devices/system/cpu/online"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            host: if machine.is_empty() { name } else { format!("{name}/{machine}") },
        }
    }

    /// The online CPU ids.
    pub fn cpus(&self) -> Vec<u32> {
        parse_cpu_list(&self.online_cpus)
    }

    /// The identity block, placed at `start_ns`.
    pub fn encode_block(&self, start_ns: u64) -> Vec<u8> {
        let header = BlockHeader { flags: FLAG_IDENTITY, start_ns, end_ns: start_ns + 1, ..Default::default() };
        encode_block(&header, &pack(self), &pack(&Summary::default()), &pack(&SampleColumns::default()))
    }

    /// Decodes an identity block's dictionary section.
    pub fn decode(section: &[u8]) -> Result<Self, FormatError> {
        let id: Self = unpack(section)?;
        if id.frequency_hz == 0 || id.online_cpus.len() > 4096 || id.host.len() > 4096 || id.boot_id.len() > 64 {
            return Err(FormatError::Section("identity out of range".into()));
        }
        Ok(id)
    }
}

/// Parses the kernel's CPU list format (`0-3,5,7-8`); malformed parts are skipped, ids are
/// capped at [`MAX_CPUS`].
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) else { continue };
        out.extend((a..=b.min(MAX_CPUS - 1)).take(MAX_CPUS as usize));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The kernel's CPU list format of `cpus` (sorted or not).
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(parse_cpu_list("0-3,5,7-8\n"), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(format_cpu_list(&[8, 0, 1, 2, 3, 5, 7]), "0-3,5,7-8");
        assert_eq!(parse_cpu_list("x,2,3-y"), vec![2]);
        assert_eq!(parse_cpu_list("0-4294967295").len(), MAX_CPUS as usize);
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn identity_blocks_round_trip() {
        let id = Identity { frequency_hz: 999, online_cpus: "0-1".into(), boot_id: "b".into(), host: "h".into() };
        let block = id.encode_block(5_000);
        let mut file = super::super::format::SegmentHeader { version: 4, start_ns: 0 }.encode().to_vec();
        file.extend(block);
        let (h, s) = super::super::format::Blocks::new(&file).next().expect("a valid block");
        assert_eq!(h.flags & FLAG_IDENTITY, FLAG_IDENTITY);
        assert_eq!(Identity::decode(s.dict).unwrap(), id);
        assert!(Identity::decode(&pack(&Identity::default())).is_err(), "frequency 0 is refused");
    }
}
