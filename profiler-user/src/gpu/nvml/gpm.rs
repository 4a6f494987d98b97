//! GPM, NVIDIA's GPU performance monitoring (Hopper and later): what the SMs did, where NVML's
//! utilisation only says that a kernel was running (a loop of tiny kernels reads 100 %). Two
//! samples a second apart give the second's SM activity, occupancy, tensor-core activity, DRAM
//! bandwidth and NVLink throughput; the poller reads them once a second (about as costly as the
//! per-process read beside it).
//!
//! A GPU without GPM (before Hopper, a driver without the calls) is said once, in the log and in
//! `profiler status`'s unsupported calls, and read no more: its `gpm` is `None`, and no
//! `gpu-underused` finding is made for it.

use nvml_wrapper::{Device, GpmSample, Nvml, enums::gpm::GpmMetricId, error::NvmlError};

use crate::gpu_readings::Gpm;

/// What is asked of each pair of samples, in [`Gpm`]'s order.
const METRICS: [GpmMetricId; 6] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::NvlinkTotalRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
];

const MIB_IN_MB: f64 = 1.048_576;

/// The previous sample of each GPU, to compare the next one with.
pub struct Sampler {
    previous: Vec<Option<GpmSample<'static>>>,
}

impl Sampler {
    pub fn new(gpus: u32) -> Self {
        Self { previous: (0..gpus).map(|_| None).collect() }
    }

    /// Takes GPU `index`'s sample and gives the metrics since the one before (`None` at the first
    /// sample). A GPU without GPM is `NotSupported`, which the caller remembers for good.
    pub fn read(&mut self, nvml: &'static Nvml, d: &Device<'static>, index: u32) -> Result<Option<Gpm>, NvmlError> {
        if self.previous.get(index as usize).is_some_and(Option::is_none) && !d.gpm_support()? {
            return Err(NvmlError::NotSupported);
        }
        let sample = d.gpm_sample()?;
        let Some(slot) = self.previous.get_mut(index as usize) else { return Ok(None) };
        let Some(before) = slot.replace(sample) else { return Ok(None) };
        let Some(now) = slot.as_ref() else { return Ok(None) };
        let results = nvml_wrapper::gpm::gpm_metrics_get(nvml, &before, now, &METRICS)?;
        // A metric this GPU lacks is left out; the others stand.
        let value = |i: usize| results.get(i).and_then(|r| r.as_ref().ok()).map(|r| r.value);
        Ok(Some(figures(std::array::from_fn(value))))
    }
}

/// GPM's values, in [`METRICS`]' order and NVML's units, as the tracks keep them.
fn figures(values: [Option<f64>; METRICS.len()]) -> Gpm {
    let value = |i: usize| values[i].filter(|v| v.is_finite());
    Gpm {
        sm_active: value(0),
        sm_occupancy: value(1),
        tensor_active: value(2),
        dram_bw_util: value(3),
        // MiB a second in nvml.h (`NVML_GPM_METRIC_NVLINK_TOTAL_*_PER_SEC`; nvml-wrapper's
        // comment says bytes: `cargo xtask gpu-check` compares with `nvidia-smi dmon`); MB/s
        // (10^6 bytes) here, as PCIe's tracks.
        nvlink_rx_mbps: value(4).map(|m| m * MIB_IN_MB),
        nvlink_tx_mbps: value(5).map(|m| m * MIB_IN_MB),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stand-in's `gpm 12,30,0,5,100,200` (tests/nvml/standin.c): shares stay percent, NVLink's
    /// MiB/s become MB/s whose bytes a second are the MiB's.
    #[test]
    fn nvlink_throughput_is_kept_in_megabytes_of_the_bytes_nvml_counted() {
        let g = figures([Some(12.0), Some(30.0), Some(0.0), Some(5.0), Some(100.0), Some(200.0)]);
        assert_eq!(
            (g.sm_active, g.sm_occupancy, g.tensor_active, g.dram_bw_util),
            (Some(12.0), Some(30.0), Some(0.0), Some(5.0))
        );
        let bytes_per_sec = |mbps: Option<f64>| (mbps.unwrap() * 1e6).round() as u64;
        assert_eq!(bytes_per_sec(g.nvlink_rx_mbps), 100 * 1024 * 1024);
        assert_eq!(bytes_per_sec(g.nvlink_tx_mbps), 200 * 1024 * 1024);
        // A metric the GPU lacks, or a value NVML could not compute, is no figure.
        let g = figures([Some(f64::NAN), None, Some(1.0), Some(f64::INFINITY), None, Some(0.0)]);
        assert_eq!((g.sm_active, g.sm_occupancy, g.dram_bw_util, g.nvlink_rx_mbps), (None, None, None, None));
        assert_eq!((g.tensor_active, g.nvlink_tx_mbps), (Some(1.0), Some(0.0)));
    }
}
