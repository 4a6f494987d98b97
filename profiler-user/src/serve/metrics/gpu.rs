//! `/metrics` for the GPUs: the poller's latest reading as gauges labelled `gpu`, `uuid` and
//! `model`, and what the polling costs (like the kernel counters' own CPU track).

use super::exposition::{escape_label, write_family};
use crate::gpu::{Holder, Reading, State};

/// The Xids seen since the start, by number and fatality: the kernel log's lines and NVML's
/// events each count (one fault both report counts twice; `increase(...) > 0` alerts either way).
/// Always written, GPU tracks on or off: the kernel log reader runs without NVML.
pub fn xids(counts: &std::collections::BTreeMap<(u32, bool), u64>) -> String {
    let mut out = String::new();
    write_family(
        &mut out,
        "profiler_gpu_xid_total",
        "counter",
        "NVIDIA Xids (kernel log lines, NVML events) since the start, by Xid and whether it is fatal.",
        counts.iter().map(|((xid, fatal), n)| (format!("{{xid=\"{xid}\",fatal=\"{fatal}\"}}"), *n as f64)).collect(),
    );
    out
}

/// The CUDA probes: calls counted by kind, the libraries probed and the rate guard's share.
pub fn cuda(s: &crate::gpu::cuda::status::Status) -> String {
    let mut out = String::new();
    write_family(
        &mut out,
        "profiler_cuda_calls_total",
        "counter",
        "CUDA driver calls the probes counted since the start, by kind (launch, sync, copy).",
        vec![
            ("{kind=\"launch\"}".into(), s.launches as f64),
            ("{kind=\"sync\"}".into(), s.syncs as f64),
            ("{kind=\"copy\"}".into(), s.copies as f64),
        ],
    );
    write_family(
        &mut out,
        "profiler_cuda_stacks_lost_total",
        "counter",
        "CUDA counts stored without their stack: more distinct stacks in a second than the kernel map holds.",
        vec![(String::new(), s.stacks_lost as f64)],
    );
    write_family(
        &mut out,
        "profiler_cuda_libraries",
        "gauge",
        "CUDA driver libraries some process maps, by state: probed, refused (a file a user could change, or not a CUDA driver), waiting (every slot taken).",
        vec![
            ("{state=\"probed\"}".into(), s.libraries.iter().filter(|l| l.error.is_none()).count() as f64),
            ("{state=\"refused\"}".into(), s.unprobed.refused as f64),
            ("{state=\"waiting\"}".into(), s.unprobed.waiting as f64),
        ],
    );
    write_family(
        &mut out,
        "profiler_cuda_estimated_processes",
        "gauge",
        "Processes calling CUDA faster than the rate guard's limit: counted part of the time, their counts estimates.",
        vec![(String::new(), s.guarded.len() as f64)],
    );
    write_family(
        &mut out,
        "profiler_cuda_owner_dropped_total",
        "counter",
        "CUDA calls not counted since the start, by the calling user: its share of the kernel's count and stack maps was used (uid 4294967295: users past the first 16).",
        s.dropped.iter().map(|d| (format!("{{uid=\"{}\"}}", d.uid), d.dropped as f64)).collect(),
    );
    write_family(
        &mut out,
        "profiler_cuda_sync_seconds_total",
        "counter",
        "Seconds threads spent blocked in CUDA synchronisations the probes counted, since the start.",
        vec![(String::new(), s.sync_ns as f64 / 1e9)],
    );
    write_family(
        &mut out,
        "profiler_cuda_copy_bytes_total",
        "counter",
        "Bytes the CUDA copies the probes counted moved, since the start.",
        vec![(String::new(), s.copy_bytes as f64)],
    );
    let libraries = by_library(&s.libraries);
    write_family(
        &mut out,
        "profiler_cuda_probe_attached_ratio",
        "gauge",
        "The least share of the time any process of a CUDA driver library is counted (below 1: the rate guard cut that process, whose counts are estimates).",
        libraries.iter().map(|(l, (fraction, _))| (lib_label(l), *fraction)).collect(),
    );
    write_family(
        &mut out,
        "profiler_cuda_calls_per_second",
        "gauge",
        "The busiest process's CUDA calls a second through a library, last measured with its probes on.",
        libraries.iter().map(|(l, (_, calls))| (lib_label(l), *calls)).collect(),
    );
    out
}

fn lib_label(path: &str) -> String {
    format!("{{library=\"{}\"}}", escape_label(path))
}

/// The probed libraries by their path inside the processes' root, with the least share of the
/// time counted and the most calls a second among the files of that path. The daemon opens a
/// library through the first process that mapped it (`/proc/PID/root/...`): that pid in the label
/// would make a new series each time another process happens to be first.
fn by_library(libs: &[crate::gpu::cuda::status::Library]) -> std::collections::BTreeMap<String, (f64, f64)> {
    let mut out = std::collections::BTreeMap::new();
    for l in libs.iter().filter(|l| l.error.is_none()) {
        let e = out.entry(in_root(&l.path).to_string()).or_insert((f64::INFINITY, 0.0_f64));
        e.0 = e.0.min(l.fraction);
        e.1 = e.1.max(l.calls_per_sec);
    }
    out
}

/// `/proc/812/root/usr/lib/libcuda.so.1` -> `/usr/lib/libcuda.so.1`; another path as it is.
fn in_root(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/proc/") else { return path };
    match rest.split_once('/') {
        Some((pid, tail)) if pid.bytes().all(|b| b.is_ascii_digit()) => {
            tail.strip_prefix("root").filter(|t| t.starts_with('/')).unwrap_or(path)
        }
        _ => path,
    }
}

pub fn render(s: &State) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, values: Vec<(String, f64)>| {
        write_family(&mut out, name, kind, help, values)
    };
    let up = s.inventory.unavailable.is_none() && !s.inventory.gpus.is_empty();
    family(
        "profiler_gpus",
        "gauge",
        "GPUs NVIDIA's management library lists (0: no library, no GPU, or not yet read).",
        vec![(String::new(), if up { s.inventory.gpus.len() as f64 } else { 0.0 })],
    );
    family(
        "profiler_gpu_polls_total",
        "counter",
        "Reads of every GPU since the start.",
        vec![(String::new(), s.polls as f64)],
    );
    family(
        "profiler_gpu_poll_cpu_seconds_total",
        "counter",
        "CPU time the GPU poller spent reading NVML and writing the GPU tracks.",
        vec![(String::new(), s.poll_cpu_seconds)],
    );
    let labels = |r: &Reading| {
        let g = s.inventory.gpus.iter().find(|g| g.index == r.index);
        let (uuid, model) = g.map_or(("", ""), |g| (g.uuid.as_str(), g.model.as_str()));
        format!("{{gpu=\"{}\",uuid=\"{}\",model=\"{}\"}}", r.index, escape_label(uuid), escape_label(model))
    };
    type Get = fn(&Reading) -> Option<f64>;
    // Prometheus's base units: shares as ratios (0-1), clocks in hertz.
    let gauges: [(&str, &str, Get); 15] = [
        ("profiler_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (0-1).", |r| {
            r.util.map(|u| u / 100.0)
        }),
        (
            "profiler_gpu_memory_utilization_ratio",
            "Share of the last sample period memory was read or written (0-1).",
            |r| r.mem_util.map(|u| u / 100.0),
        ),
        ("profiler_gpu_sm_clock_hertz", "SM clock.", |r| r.sm_clock_mhz.map(|m| m * 1e6)),
        ("profiler_gpu_memory_clock_hertz", "Memory clock.", |r| r.mem_clock_mhz.map(|m| m * 1e6)),
        ("profiler_gpu_clock_event_reasons", "Why the clocks are held down (NVML's bitmask).", |r| {
            r.clock_events.map(|b| b as f64)
        }),
        ("profiler_gpu_power_watts", "Power draw.", |r| r.power_w),
        ("profiler_gpu_temperature_celsius", "GPU temperature.", |r| r.temp_c),
        ("profiler_gpu_memory_used_bytes", "GPU memory in use.", |r| r.mem_used_mib.map(|m| m * 1048576.0)),
        ("profiler_gpu_memory_total_bytes", "GPU memory.", |r| r.mem_total_mib.map(|m| m * 1048576.0)),
        ("profiler_gpu_pcie_rx_bytes_per_second", "PCIe traffic into the GPU.", |r| r.pcie_rx_mbps.map(|m| m * 1e6)),
        ("profiler_gpu_pcie_tx_bytes_per_second", "PCIe traffic out of the GPU.", |r| r.pcie_tx_mbps.map(|m| m * 1e6)),
        ("profiler_gpu_remapped_rows", "Memory rows remapped to spares (correctable and uncorrectable causes).", |r| {
            r.remap.map(|m| f64::from(m.corrected) + f64::from(m.uncorrected))
        }),
        ("profiler_gpu_row_remap_pending", "1: a row remap waits for a GPU reset.", |r| {
            r.remap.map(|m| f64::from(u8::from(m.pending)))
        }),
        ("profiler_gpu_row_remap_failed", "1: a row remap failed (no spare rows left).", |r| {
            r.remap.map(|m| f64::from(u8::from(m.failed)))
        }),
        ("profiler_gpu_processes", "Processes holding a compute context on the GPU.", |r| {
            r.holders.as_ref().map(|h| h.len() as f64)
        }),
    ];
    for (name, help, get) in gauges {
        let values: Vec<(String, f64)> = s.latest.iter().filter_map(|r| Some((labels(r), get(r)?))).collect();
        if !values.is_empty() {
            family(name, "gauge", help, values);
        }
    }
    // NVML's volatile ECC counts only grow (until the driver reloads, which a counter's reset
    // covers): counters, so that `increase()` reads them.
    let counters: [(&str, &str, Get); 2] = [
        (
            "profiler_gpu_ecc_uncorrected_errors_total",
            "Volatile uncorrected ECC errors (since the driver loaded).",
            |r| r.ecc_uncorrected,
        ),
        ("profiler_gpu_ecc_corrected_errors_total", "Volatile corrected ECC errors (since the driver loaded).", |r| {
            r.ecc_corrected
        }),
    ];
    for (name, help, get) in counters {
        let values: Vec<(String, f64)> = s.latest.iter().filter_map(|r| Some((labels(r), get(r)?))).collect();
        if !values.is_empty() {
            family(name, "counter", help, values);
        }
    }
    // Per process holding a GPU, with its pod and container (`gpu::nvml`'s holders): at most 64
    // series a GPU (`gpu::nvml::MAX_HOLDERS`), gone when the process lets go.
    type GetHolder = fn(&Holder) -> Option<f64>;
    let per_process: [(&str, &str, GetHolder); 2] = [
        ("profiler_gpu_process_sm_utilization_ratio", "SM utilisation of a process on the GPU (0-1).", |h| {
            h.sm_util.map(|u| u / 100.0)
        }),
        ("profiler_gpu_process_memory_bytes", "GPU memory a process holds.", |h| h.mem_mib.map(|m| m * 1048576.0)),
    ];
    for (name, help, get) in per_process {
        let values: Vec<(String, f64)> = s
            .latest
            .iter()
            .flat_map(|r| r.holders.iter().flatten().map(move |h| (r, h)))
            .filter_map(|(r, h)| Some((process_labels(&labels(r), h), get(h)?)))
            .collect();
        if !values.is_empty() {
            family(name, "gauge", help, values);
        }
    }
    out
}

/// The GPU's labels with the process's added: pid, comm, namespace, pod, container (empty when
/// not known).
fn process_labels(gpu: &str, h: &Holder) -> String {
    let id = h.identity.clone().unwrap_or_default();
    let field = |v: Option<&str>| escape_label(v.unwrap_or_default());
    format!(
        "{},pid=\"{}\",comm=\"{}\",namespace=\"{}\",pod=\"{}\",container=\"{}\"}}",
        gpu.trim_end_matches('}'),
        h.pid,
        field(h.comm.as_deref()),
        field(id.pod_namespace.as_deref()),
        field(id.pod_name.as_deref()),
        field(id.container_name.as_deref()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuInfo, Inventory};

    #[test]
    fn gauges_carry_gpu_uuid_and_model_and_skip_what_was_not_read() {
        let s = State {
            inventory: Inventory {
                gpus: vec![GpuInfo {
                    index: 0,
                    model: "NVIDIA \"H100\"".into(),
                    uuid: "GPU-1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            latest: vec![Reading {
                index: 0,
                util: Some(31.0),
                holders: Some(vec![Holder {
                    pid: 812,
                    mem_mib: Some(1.0),
                    sm_util: None,
                    comm: Some("python3".into()),
                    identity: Some(crate::identity::Identity {
                        pod_namespace: Some("ml".into()),
                        pod_name: Some("trainer-7".into()),
                        container_name: Some("main".into()),
                        ..Default::default()
                    }),
                }]),
                ..Default::default()
            }],
            polls: 7,
            ..Default::default()
        };
        let text = render(&s);
        assert!(text.contains("profiler_gpus 1\n"), "{text}");
        assert!(text.contains("profiler_gpu_polls_total 7\n"));
        assert!(
            text.contains(
                "profiler_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-1\",model=\"NVIDIA \\\"H100\\\"\"} 0.31\n"
            )
        );
        assert!(!text.contains("profiler_gpu_power_watts"), "{text}");
        assert!(
            text.contains(
                "profiler_gpu_process_memory_bytes{gpu=\"0\",uuid=\"GPU-1\",model=\"NVIDIA \\\"H100\\\"\",pid=\"812\",\
                 comm=\"python3\",namespace=\"ml\",pod=\"trainer-7\",container=\"main\"} 1048576\n"
            ),
            "{text}"
        );
        assert!(!text.contains("profiler_gpu_process_sm_utilization_ratio"), "not read: {text}");
    }

    #[test]
    fn units_are_prometheus_base_units_and_ecc_counts_are_counters() {
        let s = State {
            inventory: Inventory { gpus: vec![GpuInfo { index: 0, ..Default::default() }], ..Default::default() },
            latest: vec![Reading {
                index: 0,
                mem_util: Some(50.0),
                sm_clock_mhz: Some(1980.0),
                ecc_uncorrected: Some(2.0),
                ecc_corrected: Some(7.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&s);
        assert!(text.contains("profiler_gpu_memory_utilization_ratio{gpu=\"0\",uuid=\"\",model=\"\"} 0.5\n"), "{text}");
        assert!(text.contains("profiler_gpu_sm_clock_hertz{gpu=\"0\",uuid=\"\",model=\"\"} 1980000000\n"), "{text}");
        assert!(text.contains("# TYPE profiler_gpu_ecc_uncorrected_errors_total counter\n"), "{text}");
        assert!(text.contains("profiler_gpu_ecc_corrected_errors_total{gpu=\"0\",uuid=\"\",model=\"\"} 7\n"), "{text}");
        assert!(!text.contains("_percent") && !text.contains("_mhz"), "{text}");
    }

    #[test]
    fn a_library_is_labelled_by_its_path_whichever_process_mapped_it_first() {
        use crate::gpu::cuda::status::{Library, Status};
        let lib = |path: &str, fraction, calls_per_sec| Library {
            path: path.into(),
            probes: 9,
            processes: 1,
            fraction,
            calls_per_sec,
            error: None,
        };
        let s = Status {
            libraries: vec![
                lib("/proc/812/root/usr/lib/x86_64-linux-gnu/libcuda.so.1", 1.0, 1200.0),
                lib("/proc/9001/root/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0.5, 90_000.0),
                lib("/opt/nvidia/libcuda.so.1", 1.0, 3.0),
            ],
            sync_ns: 1_500_000_000,
            copy_bytes: 4096,
            ..Default::default()
        };
        let text = cuda(&s);
        assert!(
            text.contains(
                "profiler_cuda_probe_attached_ratio{library=\"/usr/lib/x86_64-linux-gnu/libcuda.so.1\"} 0.5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("profiler_cuda_calls_per_second{library=\"/usr/lib/x86_64-linux-gnu/libcuda.so.1\"} 90000\n"),
            "{text}"
        );
        assert!(text.contains("profiler_cuda_calls_per_second{library=\"/opt/nvidia/libcuda.so.1\"} 3\n"), "{text}");
        assert!(!text.contains("/proc/"), "{text}");
        assert!(text.contains("profiler_cuda_sync_seconds_total 1.5\n"), "{text}");
        assert!(text.contains("profiler_cuda_copy_bytes_total 4096\n"), "{text}");
    }
}
