//! The NVIDIA driver's error reports in the kernel log:
//! `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`
//! The number says what happened (NVIDIA's "Xid Errors" table); the PCI address says which GPU.
//! Some mean the GPU needs a reset or the node a drain: those are fatal, and also a finding.

/// One parsed Xid line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// As the driver wrote it (`0000:3b:00`).
    pub bus: String,
    pub code: u32,
    /// `pid=` when the driver names the process.
    pub pid: Option<u32>,
    /// `name=` when the driver names the process.
    pub process: Option<String>,
    /// The rest of the driver's words.
    pub text: String,
}

/// The kernel log pattern that selects Xid lines (an event pattern like the ENA resets').
pub const PATTERN: &str = r"NVRM: Xid \(";

/// Parses `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text`; `None` for anything else.
pub fn parse(line: &str) -> Option<Xid> {
    let rest = &line[line.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (bus, rest) = rest.split_once("):")?;
    let bus = bus.trim().trim_start_matches("PCI:").to_string();
    if bus.is_empty() || bus.len() > 32 {
        return None;
    }
    let rest = rest.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: u32 = rest.get(..digits)?.parse().ok()?;
    let mut tail = rest[digits..].trim_start_matches([',', ' ']);
    let (mut pid, mut process) = (None, None);
    // `pid=1234, name=python3, ` (the order the driver writes; either may be absent or `<unknown>`).
    loop {
        if let Some(after) = tail.strip_prefix("pid=") {
            let (v, more) = after.split_once(',').unwrap_or((after, ""));
            pid = v.trim().parse().ok();
            tail = more.trim_start();
        } else if let Some(after) = tail.strip_prefix("name=") {
            let (v, more) = after.split_once(',').unwrap_or((after, ""));
            process = Some(v.trim().to_string()).filter(|v| !v.is_empty() && v != "<unknown>");
            tail = more.trim_start();
        } else {
            break;
        }
    }
    Some(Xid { bus, code, pid, process, text: tail.trim().to_string() })
}

/// What an Xid number means, in a few words, and whether the GPU is lost until a reset
/// (NVIDIA's Xid table; the common ones on data-centre GPUs).
pub fn meaning(code: u32) -> (&'static str, bool) {
    match code {
        13 => ("graphics engine exception (an application fault, or a driver or hardware error)", false),
        31 => ("GPU memory page fault (an application's illegal address, usually)", false),
        43 => ("GPU stopped processing (an application hit a fault; the GPU itself is fine)", false),
        45 => ("preemptive cleanup: a process was killed or ended with work on the GPU", false),
        48 => ("double-bit ECC error: uncorrectable memory error; the GPU needs a reset", true),
        61 => ("internal micro-controller breakpoint/warning (firmware)", false),
        62 => ("internal micro-controller halt (firmware)", false),
        63 => ("ECC page retirement or row remapping recorded", false),
        64 => ("ECC page retirement or row remapping failed", false),
        68 => ("video processor exception", false),
        69 => ("graphics engine class error", false),
        74 => ("NVLink error", false),
        79 => ("GPU has fallen off the bus: it no longer answers; drain the node", true),
        92 => ("high single-bit ECC error rate", false),
        94 => ("contained ECC error: the affected application must restart", true),
        95 => ("uncontained ECC error: every application on the GPU is affected; reset the GPU", true),
        119 => ("GSP RPC timeout: the GPU's system processor stopped answering; reset the GPU", true),
        120 => ("GSP error: the GPU's system processor failed; reset the GPU", true),
        _ => ("see NVIDIA's Xid table", false),
    }
}

/// What an Xid event adds to its kernel log line (`GPU 0 (NVIDIA H100): Xid 79, GPU has
/// fallen off the bus: ...`), and for a fatal one the finding (closed at once: the fault is a
/// moment; the GPU stays broken until a reset, which `nvidia-smi` shows).
pub fn describe(
    x: &Xid,
    inv: &crate::gpu_readings::Inventory,
    event: &crate::collect::kmsg::Event,
) -> (String, Option<crate::detect::Finding>) {
    use crate::detect::{Finding, Kind, Severity, finding_id_of};
    let (meaning, fatal) = meaning(x.code);
    let gpu = inv.by_bus(&x.bus);
    let who = match gpu {
        Some(g) => format!("GPU {} ({})", g.index, g.model),
        None => format!("the GPU at PCI {}", x.bus),
    };
    let text = format!("{who}: Xid {}, {meaning}", x.code);
    let process = match (x.pid, &x.process) {
        (Some(pid), Some(name)) => format!("; the driver names {name} (pid {pid})"),
        (Some(pid), None) => format!("; the driver names pid {pid}"),
        _ => String::new(),
    };
    let finding = fatal.then(|| {
        let subject = gpu.map_or_else(|| format!("pci{}", x.bus.replace(':', "")), |g| format!("gpu{}", g.index));
        Finding {
            id: finding_id_of(Kind::GpuFault, None, Some(&subject), event.ts_ns),
            kind: Kind::GpuFault,
            start_ns: event.ts_ns,
            end_ns: Some(event.ts_ns),
            cpu: None,
            severity: Severity::Critical,
            summary: format!(
                "{text}{process}; look next: nvidia-smi -q on the node, drain it if the GPU does not come back"
            ),
            evidence: serde_json::json!({
                "gpu": gpu.map(|g| g.index),
                "model": gpu.map(|g| g.model.clone()),
                "uuid": gpu.map(|g| g.uuid.clone()),
                "bus_id": x.bus,
                "local_cpus": gpu.map(|g| crate::gpu_readings::inventory::cpu_list(&g.local_cpus)),
                "xid": x.code,
                "meaning": meaning,
                "pid": x.pid,
                "process": x.process,
                "event": event.id,
                "message": event.message,
            }),
        }
    });
    (text, finding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_lines_parse() {
        let x = parse("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.").unwrap();
        assert_eq!(x.bus, "0000:3b:00");
        assert_eq!((x.code, x.pid), (79, Some(1234)));
        assert_eq!(x.process.as_deref(), Some("python3"));
        assert_eq!(x.text, "GPU has fallen off the bus.");
        let x = parse("NVRM: Xid (PCI:0000:65:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)").unwrap();
        assert_eq!((x.code, x.pid, x.process), (13, None, None));
        assert_eq!(x.text, "Graphics SM Warp Exception on (GPC 0, TPC 1)");
        let x = parse("NVRM: Xid (PCI:0000:01:00): 31, pid=<unknown>, name=<unknown>, Ch 0000000c").unwrap();
        assert_eq!((x.code, x.pid, x.process), (31, None, None));
        assert_eq!(x.text, "Ch 0000000c");
    }

    #[test]
    fn other_lines_and_garbage_are_not_xids() {
        for line in [
            "",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module 580.159",
            "NVRM: Xid (PCI:0000:3b:00): , no number",
            "NVRM: Xid (PCI:0000:3b:00) 79 no colon",
            "NVRM: Xid (): 79, empty bus",
            "NVRM: Xid (PCI:0000:3b:00): 99999999999999999999, overflow",
            "ena 0000:00:06.0 eth0: Device reset completed",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    #[test]
    fn a_fatal_xid_names_its_gpu_and_becomes_a_finding_a_benign_one_does_not() {
        let inv = crate::gpu::Inventory {
            gpus: vec![crate::gpu::GpuInfo {
                index: 2,
                model: "NVIDIA H100".into(),
                bus_id: "00000000:3B:00.0".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.";
        let e = crate::collect::kmsg::Event {
            id: "event-20261126T100000-7".into(),
            ts_ns: 1_795_000_000_000_000_000,
            pattern: PATTERN.into(),
            message: line.into(),
        };
        let (text, f) = describe(&parse(line).unwrap(), &inv, &e);
        assert_eq!(
            text,
            "GPU 2 (NVIDIA H100): Xid 79, GPU has fallen off the bus: it no longer answers; drain the node"
        );
        let f = f.expect("79 is fatal");
        assert_eq!(f.kind, crate::detect::Kind::GpuFault);
        assert_eq!(f.id, "gpu-fault-gpu2-20261118T110640");
        assert!(f.summary.contains("python3 (pid 1234)"), "{}", f.summary);
        assert_eq!(f.evidence["xid"], 79);
        let (text, f) = describe(&parse("NVRM: Xid (PCI:0000:65:00): 13, Graphics Exception").unwrap(), &inv, &e);
        assert!(text.starts_with("the GPU at PCI 0000:65:00: Xid 13, graphics engine exception"), "{text}");
        assert!(f.is_none());
    }

    #[test]
    fn the_common_numbers_have_meanings_and_the_fatal_ones_say_so() {
        for code in [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120] {
            assert_ne!(meaning(code).0, "see NVIDIA's Xid table", "{code}");
        }
        let fatal: Vec<u32> = (0..200).filter(|&c| meaning(c).1).collect();
        assert_eq!(fatal, [48, 79, 94, 95, 119, 120]);
    }
}
