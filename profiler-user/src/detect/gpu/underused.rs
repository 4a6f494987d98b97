//! `gpu-underused`: a GPU that NVML calls busy (utilisation at least `gpu_busy_above`) while
//! GPM, where the GPU has it (Hopper and later), says its SMs were mostly idle (SM activity below
//! `gpu_sm_active_below`) for `gpu_secs`. NVML's utilisation is the share of time *a* kernel ran:
//! a loop of tiny kernels, each occupying a few SMs for microseconds, reads 100 %. The finding
//! names the launching process, its launch rate and the Python line that launches most (from
//! the CUDA probes), so that the answer is in it: larger batches, fused kernels, CUDA graphs.
//!
//! A GPU without GPM never has a `GpuSecond::gpm`: nothing is said of it (its missing GPM is
//! said once by the poller, in the log and `profiler status`).

use std::collections::HashMap;

use serde_json::json;

use super::{GpuDetect, LaunchFigures, Run, Told};
use crate::{
    detect::{Kind, Second, Thresholds, percent},
    gpu_readings::GpuSecond,
};

/// Sums of a run's GPM figures.
#[derive(Debug, Default)]
pub(super) struct GpmSums {
    sm_active: (f64, u64),
    occupancy: (f64, u64),
    tensor: (f64, u64),
}

impl GpmSums {
    fn add(sum: &mut (f64, u64), v: Option<f64>) {
        if let Some(v) = v {
            sum.0 += v;
            sum.1 += 1;
        }
    }

    /// Seconds that had SM activity.
    pub(super) fn seconds(&self) -> u64 {
        self.sm_active.1
    }

    fn mean(sum: (f64, u64)) -> Option<f64> {
        (sum.1 > 0).then(|| sum.0 / sum.1 as f64)
    }
}

impl GpuDetect {
    /// Adds this second to the GPU's underused run when it was one; returns whether it was.
    pub(super) fn underused(
        &mut self,
        now: &Second,
        g: &GpuSecond,
        util: f64,
        launches: &HashMap<u32, LaunchFigures>,
        t: &Thresholds,
    ) -> bool {
        let Some(active) = g.gpm.and_then(|m| m.sm_active) else { return false };
        // Nothing is said of a GPU nobody holds.
        if g.holders.is_empty() || util < t.gpu_busy_above * 100.0 || active >= t.gpu_sm_active_below * 100.0 {
            return false;
        }
        let run = self.runs.entry((g.index, Kind::GpuUnderused)).or_default();
        run.add_second(now.start_ns, util, g);
        run.add_launches(&g.holders, launches);
        let m = g.gpm.unwrap_or_default();
        GpmSums::add(&mut run.gpm.sm_active, m.sm_active);
        GpmSums::add(&mut run.gpm.occupancy, m.sm_occupancy);
        GpmSums::add(&mut run.gpm.tensor, m.tensor_active);
        // Whose kernels: the holders' own ticks, as for a launch-bound GPU.
        for c in &now.cpus {
            for k in c.busy.iter().filter(|k| g.holders.contains(&k.pid)) {
                run.add_tick(k);
            }
        }
        true
    }
}

impl Told<'_> {
    pub(super) fn underused(&self) -> String {
        let run: &Run = self.run;
        let pct = |v: Option<f64>| v.map_or("unknown".to_string(), |v| format!("{v:.0} %"));
        let active = pct(GpmSums::mean(run.gpm.sm_active));
        let occupancy = pct(GpmSums::mean(run.gpm.occupancy));
        let tensor = pct(GpmSums::mean(run.gpm.tensor));
        let launch_text = match (run.launch_rate(), &run.launch_line) {
            (Some(r), Some((line, share))) if r > 0.0 => {
                format!(", {r:.0} launches/s (one every {:.0} µs), {} of them from {line}", 1e6 / r, percent(*share))
            }
            (Some(r), None) if r > 0.0 => format!(", {r:.0} launches/s (one every {:.0} µs)", 1e6 / r),
            _ => String::new(),
        };
        format!(
            "{} but its SMs were active only {active} of the time (occupancy {occupancy}, tensor cores \
             {tensor}) while {} launched its kernels{}{launch_text}{}: the kernels are too small to fill the \
             GPU; look next: larger batches, fused kernels (torch.compile), CUDA graphs{}",
            self.name,
            self.first("the process holding it"),
            self.lead,
            run.kernels_text(),
            self.shared(),
        )
    }

    /// The GPM figures of the evidence.
    pub(super) fn gpm_evidence(&self) -> serde_json::Value {
        let g = &self.run.gpm;
        json!({
            "sm_active_percent": GpmSums::mean(g.sm_active),
            "sm_occupancy_percent": GpmSums::mean(g.occupancy),
            "tensor_active_percent": GpmSums::mean(g.tensor),
        })
    }
}
