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
    let lib = |l: &crate::gpu::cuda::status::Library| format!("{{library=\"{}\"}}", escape_label(&l.path));
    write_family(
        &mut out,
        "profiler_cuda_probe_attached_ratio",
        "gauge",
        "The least share of the time any process of a CUDA driver library is counted (below 1: the rate guard cut that process, whose counts are estimates).",
        s.libraries.iter().filter(|l| l.error.is_none()).map(|l| (lib(l), l.fraction)).collect(),
    );
    write_family(
        &mut out,
        "profiler_cuda_calls_per_second",
        "gauge",
        "The busiest process's CUDA calls a second through a library, last measured with its probes on.",
        s.libraries.iter().filter(|l| l.error.is_none()).map(|l| (lib(l), l.calls_per_sec)).collect(),
    );
    out
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
    let gauges: [(&str, &str, Get); 17] = [
        ("profiler_gpu_utilization_percent", "Share of the last sample period a kernel ran on the GPU.", |r| r.util),
        (
            "profiler_gpu_memory_utilization_percent",
            "Share of the last sample period memory was read or written.",
            |r| r.mem_util,
        ),
        ("profiler_gpu_sm_clock_mhz", "SM clock.", |r| r.sm_clock_mhz),
        ("profiler_gpu_memory_clock_mhz", "Memory clock.", |r| r.mem_clock_mhz),
        ("profiler_gpu_clock_event_reasons", "Why the clocks are held down (NVML's bitmask).", |r| {
            r.clock_events.map(|b| b as f64)
        }),
        ("profiler_gpu_power_watts", "Power draw.", |r| r.power_w),
        ("profiler_gpu_temperature_celsius", "GPU temperature.", |r| r.temp_c),
        ("profiler_gpu_memory_used_bytes", "GPU memory in use.", |r| r.mem_used_mib.map(|m| m * 1048576.0)),
        ("profiler_gpu_memory_total_bytes", "GPU memory.", |r| r.mem_total_mib.map(|m| m * 1048576.0)),
        ("profiler_gpu_pcie_rx_bytes_per_second", "PCIe traffic into the GPU.", |r| r.pcie_rx_mbps.map(|m| m * 1e6)),
        ("profiler_gpu_pcie_tx_bytes_per_second", "PCIe traffic out of the GPU.", |r| r.pcie_tx_mbps.map(|m| m * 1e6)),
        ("profiler_gpu_ecc_errors", "Volatile uncorrected ECC errors.", |r| r.ecc_uncorrected),
        ("profiler_gpu_ecc_corrected_errors", "Volatile corrected ECC errors.", |r| r.ecc_corrected),
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
    // Per process holding a GPU, with its pod and container (`gpu::nvml`'s holders): at most 64
    // series a GPU (`gpu::nvml::MAX_HOLDERS`), gone when the process lets go.
    type GetHolder = fn(&Holder) -> Option<f64>;
    let per_process: [(&str, &str, GetHolder); 2] = [
        ("profiler_gpu_process_sm_utilization_percent", "SM utilisation of a process on the GPU.", |h| h.sm_util),
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
                "profiler_gpu_utilization_percent{gpu=\"0\",uuid=\"GPU-1\",model=\"NVIDIA \\\"H100\\\"\"} 31\n"
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
        assert!(!text.contains("profiler_gpu_process_sm_utilization_percent"), "not read: {text}");
    }
}
