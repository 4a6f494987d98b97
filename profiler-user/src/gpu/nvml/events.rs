//! NVML's Xid events, where the library offers them (`nvmlEventTypeXidCriticalError`): the
//! same faults the driver writes to the kernel log (`xid`), for nodes where the daemon cannot
//! read that log (a container without `/dev/kmsg`) or where the line is lost. Each becomes an
//! event (`profiler events`, pattern [`PATTERN`]) naming the GPU and the Xid's meaning, and a
//! fatal one a `gpu-fault` finding, unless the kernel log's line raised that finding already
//! (both sources see one fault: [`already_raised`] keeps it to one finding).
//!
//! Read by the poller at every poll without waiting (a zero timeout), at most [`MAX_PER_POLL`]
//! at a time; a GPU whose driver does not offer the event type is left out, said once.

use std::path::Path;

use nvml_wrapper::{EventSet, Nvml, bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError};

use crate::{collect::kmsg::Event, detect, gpu::xid, gpu_readings::Inventory};

/// The pattern NVML's Xid events are recorded under (the kernel log's are `xid::PATTERN`).
pub const PATTERN: &str = "nvml-xid";
/// Events taken per poll at most (a storm of them waits for the next polls).
pub const MAX_PER_POLL: usize = 16;
/// A fault seen by both sources within this long is one finding.
const SAME_FAULT_NS: u64 = 30_000_000_000;

/// The event set every GPU offering Xid events is registered in.
pub struct XidEvents {
    set: EventSet<'static>,
    /// Events recorded since the start (the event ids' sequence number).
    seq: u64,
}

impl XidEvents {
    /// Registers the GPUs `0..count` that offer Xid events; `None` when none does.
    pub fn register(nvml: &'static Nvml, count: u32) -> Option<Self> {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(error = %e, "no NVML Xid events (the kernel log's Xid lines still are events)");
                return None;
            }
        };
        let mut registered = 0;
        for index in 0..count {
            let Ok(d) = nvml.device_by_index(index) else { continue };
            match d.supported_event_types() {
                Ok(t) if t.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                other => {
                    let why = other.err().map_or("not offered".to_string(), |e| e.to_string());
                    tracing::info!(gpu = index, why, "no NVML Xid events for this GPU");
                    continue;
                }
            }
            // A failed registration frees the set (nvml-wrapper): start a new one.
            set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    registered += 1;
                    s
                }
                Err(e) => {
                    tracing::info!(gpu = index, error = %e.error, "no NVML Xid events for this GPU");
                    nvml.create_event_set().ok()?
                }
            };
        }
        (registered > 0).then_some(Self { set, seq: 0 })
    }

    /// The Xids waiting now, as (GPU index, Xid number); a number NVML does not know is 999.
    pub fn take(&mut self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        while out.len() < MAX_PER_POLL {
            match self.set.wait(0) {
                Ok(e) => {
                    let Ok(index) = e.device.index() else { continue };
                    let code = match e.event_data {
                        Some(XidError::Value(v)) => v,
                        Some(XidError::Unknown) | None => 999,
                    };
                    out.push((index, code));
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "NVML Xid events: wait failed");
                    break;
                }
            }
        }
        out
    }

    /// Records one Xid of GPU `index` at `ts_ns`: the event, and for a fatal one the finding
    /// (unless the kernel log raised it). Returns whether it was fatal.
    pub fn record(&mut self, data_dir: &Path, inv: &Inventory, index: u32, code: u64, ts_ns: u64) -> bool {
        self.seq += 1;
        let gpu = inv.gpus.iter().find(|g| g.index == index);
        let x = xid::Xid {
            bus: gpu.map_or_else(String::new, |g| g.bus_id.clone()),
            code: u32::try_from(code).unwrap_or(u32::MAX),
            pid: None,
            process: None,
            text: String::new(),
        };
        let mut e = Event {
            id: format!("event-{}-nvml{}", detect::finding_id_time(ts_ns), self.seq),
            ts_ns,
            pattern: PATTERN.into(),
            message: format!("NVML: Xid {code} on GPU {index}"),
        };
        let (text, finding) = xid::describe(&x, inv, &e);
        e.message = format!("{} [{text}]", e.message);
        tracing::warn!(event = %e.id, "NVML event: {}", e.message);
        if let Err(err) = detect::journal::record_event(data_dir, &e) {
            tracing::error!(event = %e.id, error = %err, "cannot record an event");
        }
        let fatal = finding.is_some();
        if let Some(f) = finding.filter(|f| !already_raised(data_dir, f)) {
            tracing::warn!(finding = %f.id, "{}", f.summary);
            if let Err(err) = detect::journal::record_finding(data_dir, &f) {
                tracing::error!(finding = %f.id, error = %err, "cannot record a finding");
            }
        }
        fatal
    }
}

/// Whether a `gpu-fault` finding for the same GPU and Xid was recorded within
/// [`SAME_FAULT_NS`] of `f` (by the kernel log's line or NVML's event, whichever came first).
pub fn already_raised(data_dir: &Path, f: &detect::Finding) -> bool {
    let from = f.start_ns.saturating_sub(SAME_FAULT_NS);
    let Ok(found) = detect::journal::findings_in(data_dir, from, f.start_ns + SAME_FAULT_NS) else { return false };
    found.iter().any(|o| {
        o.kind == detect::Kind::GpuFault
            && o.evidence["xid"] == f.evidence["xid"]
            && (o.evidence["gpu"] == f.evidence["gpu"] && !f.evidence["gpu"].is_null()
                || o.evidence["bus_id"] == f.evidence["bus_id"])
    })
}
