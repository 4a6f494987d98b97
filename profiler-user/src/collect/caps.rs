//! Which capabilities the daemon has, and what it needs: CAP_BPF and CAP_PERFMON to load and
//! attach its programs; CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG to name what it samples
//! (other processes' mappings and files, kernel symbol addresses, the kernel log).

/// A capability the daemon uses, and what it is for.
pub struct Cap {
    pub bit: u32,
    pub name: &'static str,
    pub needed_for: &'static str,
    /// Without it the daemon cannot run at all.
    pub required: bool,
}

pub const CAPS: &[Cap] = &[
    Cap { bit: 39, name: "CAP_BPF", needed_for: "loading the BPF programs", required: true },
    Cap { bit: 38, name: "CAP_PERFMON", needed_for: "attaching to perf events and tracepoints", required: true },
    Cap {
        bit: 19,
        name: "CAP_SYS_PTRACE",
        needed_for: "reading other processes' memory maps (user symbols)",
        required: false,
    },
    Cap {
        bit: 2,
        name: "CAP_DAC_READ_SEARCH",
        needed_for: "reading other users' binaries (user symbols)",
        required: false,
    },
    Cap {
        bit: 34,
        name: "CAP_SYSLOG",
        needed_for: "kernel symbol addresses in /proc/kallsyms and the kernel log",
        required: false,
    },
];

/// The effective capability set of this process, from /proc/self/status.
pub fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Capabilities of [`CAPS`] missing from `effective`.
pub fn missing(effective: u64) -> Vec<&'static Cap> {
    CAPS.iter().filter(|c| effective & (1 << c.bit) == 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        let all: u64 = CAPS.iter().map(|c| 1u64 << c.bit).sum();
        assert!(missing(all).is_empty());
        let no_bpf = all & !(1 << 39);
        let m = missing(no_bpf);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].name, "CAP_BPF");
        assert!(m[0].required);
        assert_eq!(missing(0).len(), CAPS.len());
    }
}
