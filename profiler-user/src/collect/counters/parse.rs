//! Parsers of the kernel's counter files, pure (text in, numbers out) so that each is tested on
//! captured text of several kernel versions. Lines they cannot read are left out, never a panic.

/// One CPU's row of `/proc/net/softnet_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softnet {
    pub cpu: u32,
    pub processed: u64,
    pub dropped: u64,
    pub time_squeeze: u64,
}

/// `/proc/net/softnet_stat`: one row per online CPU, hexadecimal columns. The first three are
/// processed, dropped and time_squeeze on every kernel; since 5.10 the 13th column is the CPU
/// (rows skip offline CPUs, so the row number is not the CPU); before it, the row number is the
/// best there is.
pub fn softnet(text: &str) -> Vec<Softnet> {
    text.lines()
        .enumerate()
        .filter_map(|(row, line)| {
            let cols: Vec<u64> =
                line.split_whitespace().map(|c| u64::from_str_radix(c, 16)).collect::<Result<_, _>>().ok()?;
            if cols.len() < 3 {
                return None;
            }
            let cpu = if cols.len() >= 13 { cols[12] as u32 } else { row as u32 };
            Some(Softnet { cpu, processed: cols[0], dropped: cols[1], time_squeeze: cols[2] })
        })
        .collect()
}

/// The CPU ids of a `CPU0 CPU1 ...` header (`/proc/interrupts`, `/proc/softirqs`): possible CPUs
/// only under some kernels, so the ids are read, not assumed to be 0..n.
fn cpu_header(line: &str) -> Vec<u32> {
    line.split_whitespace().filter_map(|c| c.strip_prefix("CPU")?.parse().ok()).collect()
}

/// `/proc/softirqs`: per softirq (NET_RX, TIMER, ...) its count on each CPU, as (name, cpu, count).
pub fn softirqs(text: &str) -> Vec<(String, u32, u64)> {
    let mut lines = text.lines();
    let Some(cpus) = lines.next().map(cpu_header) else { return Vec::new() };
    let mut out = Vec::new();
    for line in lines {
        let Some((name, counts)) = line.split_once(':') else { continue };
        for (cpu, count) in cpus.iter().zip(counts.split_whitespace()) {
            if let Ok(n) = count.parse() {
                out.push((name.trim().to_string(), *cpu, n));
            }
        }
    }
    out
}

/// What `/proc/interrupts` says that matters here.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Interrupts {
    /// Every interrupt each CPU took (the rows with a count per CPU), as (cpu, count).
    pub per_cpu: Vec<(u32, u64)>,
    /// NIC queues (by the name their driver gives the vector) and their count on all CPUs.
    pub queues: Vec<(String, u64)>,
}

/// Whether an interrupt's name is a NIC queue's: virtio-net `virtio2-input.0` / `-output.0`,
/// ENA `eth0-Tx-Rx-3`, Intel `eth0-TxRx-3`, mlx5 `mlx5_comp3@pci:...`, and `-rx-N`/`-tx-N`.
pub fn is_nic_queue(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["-input.", "-output.", "-tx-rx-", "-txrx-", "mlx5_comp", "-rx-", "-tx-"].iter().any(|p| n.contains(p))
}

/// `/proc/interrupts`: a header of CPUs, then per vector `N:` or `NMI:`, a count per CPU, then
/// the controller and the name (the last word). Rows with one count (ERR, MIS) are left out.
pub fn interrupts(text: &str) -> Interrupts {
    let mut lines = text.lines();
    let Some(cpus) = lines.next().map(cpu_header) else { return Interrupts::default() };
    let mut per_cpu = vec![0u64; cpus.len()];
    let mut queues = Vec::new();
    for line in lines {
        let Some((_, rest)) = line.split_once(':') else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() < cpus.len() {
            continue;
        }
        let counts: Option<Vec<u64>> = words[..cpus.len()].iter().map(|w| w.parse().ok()).collect();
        let Some(counts) = counts else { continue };
        for (total, c) in per_cpu.iter_mut().zip(&counts) {
            *total += c;
        }
        if let Some(name) = words[cpus.len()..].last().filter(|n| is_nic_queue(n)) {
            queues.push((name.to_string(), counts.iter().sum()));
        }
    }
    Interrupts { per_cpu: cpus.into_iter().zip(per_cpu).collect(), queues }
}

/// One line of a `/proc/pressure/*` file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// `some` or `full`.
    pub kind: &'static str,
    /// Percent of the last 10 s.
    pub avg10: f64,
    /// Microseconds stalled since boot.
    pub total_us: u64,
}

/// `/proc/pressure/{cpu,memory,io}`: `some avg10=0.00 avg60=0.00 avg300=0.00 total=123`, and a
/// `full` line (for cpu since 5.13, all zero at the system level).
pub fn pressure(text: &str) -> Vec<Pressure> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let kind = match words.next()? {
                "some" => "some",
                "full" => "full",
                _ => return None,
            };
            let (mut avg10, mut total_us) = (None, None);
            for w in words {
                match w.split_once('=') {
                    Some(("avg10", v)) => avg10 = v.parse().ok(),
                    Some(("total", v)) => total_us = v.parse().ok(),
                    _ => {}
                }
            }
            Some(Pressure { kind, avg10: avg10?, total_us: total_us? })
        })
        .collect()
}

/// CFS bandwidth throttling in one `cpu.stat`: (times throttled, nanoseconds throttled). Under
/// v1 `throttled_time` is in ns, under v2 `throttled_usec` in µs.
pub fn cpu_stat(text: &str) -> Option<(u64, u64)> {
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse::<u64>().ok())?
        })
    };
    let times = get("nr_throttled")?;
    let ns = get("throttled_time").or_else(|| get("throttled_usec").map(|us| us * 1000)).unwrap_or(0);
    Some((times, ns))
}

/// `/proc/net/dev`: per interface (rx_packets, tx_packets, rx_dropped, tx_dropped, rx_errors,
/// tx_errors). One read for every interface: reading `/sys/class/net/*/statistics/*` took
/// 25 µs per file here (each read gathers the driver's per-queue figures again).
pub fn net_dev(text: &str) -> Vec<(String, [u64; 6])> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let v: Vec<u64> = rest.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
            if v.len() < 16 || name.contains('|') {
                return None;
            }
            Some((name.trim().to_string(), [v[1], v[9], v[3], v[11], v[2], v[10]]))
        })
        .collect()
}

/// The names [`net_dev`]'s figures are stored under, in its order.
pub const NET_DEV_NAMES: [&str; 6] = ["rx_packets", "tx_packets", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors"];

#[cfg(test)]
mod tests {
    use super::*;

    // This machine (6.18, 2 CPUs): 15 columns, the CPU in the 13th.
    const SOFTNET_6_18: &str = "\
008cc02f 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 000fcbad 00000000 00000000 00000000 00000000 00000000
03ec7894 00000000 00000005 00000000 00000000 00000000 00000000 00000000 00000000 004c51a0 00000000 00000000 00000001 00000000 00000000
";
    // 4.19 (11 columns, no CPU column).
    const SOFTNET_4_19: &str = "\
0000a1b2 00000003 000000ff 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
0000000a 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
";

    #[test]
    fn softnet_reads_the_cpu_column_when_there_is_one() {
        let rows = softnet(SOFTNET_6_18);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0], Softnet { cpu: 0, processed: 0x008cc02f, dropped: 0, time_squeeze: 1 });
        assert_eq!(rows[1], Softnet { cpu: 1, processed: 0x03ec7894, dropped: 0, time_squeeze: 5 });
        // CPU 1 offline: the second row is CPU 2, which only the CPU column says.
        let offline =
            SOFTNET_6_18.replace("00000000 00000001 00000000 00000000\n", "00000000 00000002 00000000 00000000\n");
        assert_eq!(softnet(&offline)[1].cpu, 2);
    }

    #[test]
    fn softnet_of_old_kernels_uses_the_row() {
        let rows = softnet(SOFTNET_4_19);
        assert_eq!(rows[0], Softnet { cpu: 0, processed: 0xa1b2, dropped: 3, time_squeeze: 255 });
        assert_eq!(rows[1].cpu, 1);
        assert!(softnet("zz 00\n\n").is_empty(), "garbage is left out");
    }

    const SOFTIRQS: &str = "                    CPU0       CPU1       
          HI:         22          0
       TIMER:    1666395    1160410
      NET_TX:        104         40
      NET_RX:    6812438    6668135
       SCHED:    1881458    1452893
";

    #[test]
    fn softirqs_per_name_and_cpu() {
        let s = softirqs(SOFTIRQS);
        assert_eq!(s.len(), 10);
        assert!(s.contains(&("NET_RX".to_string(), 1, 6668135)));
        assert!(s.contains(&("TIMER".to_string(), 0, 1666395)));
        assert!(softirqs("").is_empty());
    }

    const INTERRUPTS: &str = "           CPU0       CPU1       
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 36:    2325984     120877 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 38:      13424       5005 PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 39:      13752          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0
 41:      17964          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx
 60:          5         70  PCI-MSI 81921-edge      eth0-Tx-Rx-0
NMI:          0          0   Non-maskable interrupts
LOC:    1000000    2000000   Local timer interrupts
ERR:          0
MIS:          0
";

    #[test]
    fn interrupts_totals_and_nic_queues() {
        let i = interrupts(INTERRUPTS);
        assert_eq!(
            i.per_cpu,
            vec![(0, 1 + 2325984 + 13424 + 13752 + 17964 + 5 + 1000000), (1, 120877 + 5005 + 70 + 2000000)]
        );
        assert_eq!(
            i.queues,
            vec![("virtio2-input.0".into(), 18429), ("virtio2-output.0".into(), 13752), ("eth0-Tx-Rx-0".into(), 75)]
        );
    }

    #[test]
    fn nic_queue_names() {
        for q in ["virtio0-input.3", "eth0-Tx-Rx-7", "ens5-TxRx-0", "mlx5_comp2@pci:0000:00:05.0", "eth1-rx-0"] {
            assert!(is_nic_queue(q), "{q}");
        }
        for q in ["virtio1-req.0", "virtio3-rx", "ACPI:Ged", "ena-mgmnt@pci:0000:00:05.0", "interrupts"] {
            assert!(!is_nic_queue(q), "{q}");
        }
    }

    #[test]
    fn pressure_lines() {
        let p = pressure(
            "some avg10=29.37 avg60=10.31 avg300=4.28 total=12119977505\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        assert_eq!(
            p,
            vec![
                Pressure { kind: "some", avg10: 29.37, total_us: 12119977505 },
                Pressure { kind: "full", avg10: 0.0, total_us: 0 }
            ]
        );
        // 4.20's cpu file had no full line; a truncated line is left out.
        assert_eq!(pressure("some avg10=1.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=").len(), 1);
    }

    #[test]
    fn net_dev_per_interface() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  123456     789    0    0    0     0          0         0   123456     789    0    0    0     0       0          0
  eth0:99999999  100000    1    2    0     0          0         0 55555555   90000    3    4    0     0       0          0
eth1:5 6 7 8 0 0 0 0 9 10 11 12 0 0 0 0
";
        let d = net_dev(text);
        assert_eq!(d.len(), 3);
        assert_eq!(d[1], ("eth0".to_string(), [100000, 90000, 2, 4, 1, 3]));
        assert_eq!(d[2], ("eth1".to_string(), [6, 10, 8, 12, 7, 11]), "no space after the colon (old kernels)");
    }

    #[test]
    fn cpu_stat_v1_and_v2() {
        assert_eq!(cpu_stat("nr_periods 10\nnr_throttled 4\nthrottled_time 123456\n"), Some((4, 123456)));
        assert_eq!(
            cpu_stat("usage_usec 5\nuser_usec 3\nsystem_usec 2\nnr_periods 9\nnr_throttled 2\nthrottled_usec 7\n"),
            Some((2, 7000))
        );
        assert_eq!(cpu_stat("usage_usec 5\nuser_usec 3\n"), None, "a v2 root has no bandwidth figures");
    }
}
